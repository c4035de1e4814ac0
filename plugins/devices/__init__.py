"""Built-in devices."""
