"""The tools built on the plugrl core: the command line, ``plugrl convert verl``, the
quickstart, ``plugrl compare`` and ``plugrl plot``, and the smoke harness of the accelerator
plugins. They import the core (``plugrl``); the core never imports them."""
