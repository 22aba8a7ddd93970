"""Venice AI: an OpenAI-compatible API that also reports each request's cost (``cost.usd/diem``:
provider-reported extras ``venice.cost.usd`` and ``venice.cost.diem``) and publishes its models'
prices in its ``/models`` listing."""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from llmgw.accounting.price import Price
from llmgw.accounting.prices import parse_venice_models
from llmgw.accounting.usage import CostReport
from llmgw.providers.openai_compatible import OpenAICompatibleProvider
from llmgw.providers.plugin import Capabilities, NoOptions, ProviderPlugin

__all__ = ["PLUGIN", "VeniceProvider"]


class VeniceProvider(OpenAICompatibleProvider):
    cost_report: CostReport | None = CostReport("venice.cost")
    publishes_prices = True

    async def published_prices(self, deadline: float) -> Mapping[str, Price]:
        answer = await self.list_models(deadline)
        return parse_venice_models(orjson.loads(answer.body))


# Venice documents reasoning_effort on every chat model (non-reasoning ones ignore it); it does not
# document prefill.
PLUGIN: ProviderPlugin[NoOptions] = ProviderPlugin(
    factory=VeniceProvider.from_setup,
    capabilities=Capabilities(reasoning=True, prefill=False),
    summary="Venice AI (reports each answer's cost, publishes its models' prices)",
)
