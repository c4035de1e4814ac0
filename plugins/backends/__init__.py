"""Built-in training backends."""
