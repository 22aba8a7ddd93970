"""How ``serve`` runs: one process or a supervisor of workers, signals, reload, graceful stop."""
