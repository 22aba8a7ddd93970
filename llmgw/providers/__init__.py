"""Provider adapters: one module per upstream API, all behind the ``Provider`` protocol."""

from llmgw.providers.base import (
    ChatStream,
    Provider,
    UpstreamCall,
    UpstreamHTTPError,
    UpstreamResponse,
)

__all__ = ["ChatStream", "Provider", "UpstreamCall", "UpstreamHTTPError", "UpstreamResponse"]
