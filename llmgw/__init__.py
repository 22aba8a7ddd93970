"""llmgw: a small, exact, self-hosted LLM gateway with an OpenAI-compatible API."""

__version__ = "0.1.0"
__all__ = ["__version__"]
