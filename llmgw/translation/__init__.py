"""Translations between foreign APIs and OpenAI chat completions, one module per foreign API."""
