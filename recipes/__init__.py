"""Ready recipes. They are installed with plugrl, so ``plugrl run quickstart`` finds
``quickstart.yaml`` here when no file of that name is in the working folder."""
