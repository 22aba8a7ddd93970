"""The operator console: web pages at /console over the admin API, signed in with the admin token."""
