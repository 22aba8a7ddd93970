"""Venice AI: an OpenAI-compatible API that also reports each request's cost (``cost.usd/diem``)."""

from __future__ import annotations

from llmgw.providers.openai_compatible import OpenAICompatibleProvider

__all__ = ["VeniceProvider"]


class VeniceProvider(OpenAICompatibleProvider):
    reports_cost = True
