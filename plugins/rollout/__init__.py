"""Built-in rollout engines."""
