"""Gateway keys: their format, and authenticating a request's bearer token."""
