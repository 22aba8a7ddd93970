"""Per-key and per-subject policy beyond authentication: model allowlists, budgets, token limits."""
