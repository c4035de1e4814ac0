"""Built-in schedulers (the training loop) and the part-building they share."""
