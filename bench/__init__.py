"""Performance benchmark of llmgw against a direct baseline and a minimal proxy; see bench/run.py."""
