"""Built-in scoring functions, one module per answer format. Each ``compute_score`` has verl's
signature and returns a dict with ``score``, ``acc`` (bool) and ``pred`` (the parsed answer)."""
