"""Every error the gateway itself answers with, and how it renders.

    GatewayError                      (status, OpenAI ``type``, ``code``)
    ├── InvalidRequest                400 invalid_request_error   (param names the field)
    ├── AuthenticationFailed          401 invalid_request_error / invalid_api_key
    ├── ModelNotAllowed               403 permission_error / model_not_allowed
    ├── Forbidden                     403 permission_error / forbidden
    ├── PriceUnknown                  403 permission_error / price_unknown
    ├── NotFound                      404 invalid_request_error / not_found
    ├── MethodNotAllowed              405 invalid_request_error / method_not_allowed
    ├── RequestTimeout                408 invalid_request_error / request_timeout
    ├── Conflict                      409 invalid_request_error / conflict
    ├── PayloadTooLarge               413 invalid_request_error / request_too_large
    ├── UnsupportedMediaType          415 invalid_request_error / unsupported_media_type
    ├── Unprocessable                 422 invalid_request_error / unprocessable
    ├── RateLimited                   429 rate_limit_error / rate_limit_exceeded (+ Retry-After)
    ├── InternalError                 500 server_error (never carries a traceback)
    ├── UpstreamUnavailable           502 upstream_error / upstream_unavailable
    │   ├── UpstreamAuthFailed        502 upstream_error / upstream_auth_failed
    │   └── UpstreamBusy              503 upstream_error / upstream_busy (+ Retry-After)
    ├── ServiceUnavailable            503 service_unavailable / database_unavailable
    ├── UpstreamTimeout               504 upstream_error / upstream_timeout
    └── ProviderError                 the provider's status / upstream_error / provider_error

Errors a provider answers with are not GatewayErrors: they pass through with the provider's own
status and body (see ``providers.base.UpstreamHTTPError``), except on routes of an API whose error
shape is not the provider's: there they become a ProviderError, rendered in that API's shape.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

__all__ = [
    "AuthenticationFailed",
    "Conflict",
    "Forbidden",
    "GatewayError",
    "InternalError",
    "InvalidRequest",
    "MethodNotAllowed",
    "ModelNotAllowed",
    "NotFound",
    "PayloadTooLarge",
    "PriceUnknown",
    "ProviderError",
    "RateLimited",
    "RequestTimeout",
    "ServiceUnavailable",
    "Unprocessable",
    "UnsupportedMediaType",
    "UpstreamAuthFailed",
    "UpstreamBusy",
    "UpstreamTimeout",
    "UpstreamUnavailable",
]


class GatewayError(Exception):
    status: int = 500
    error_type: str = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers: Mapping[str, str] = headers or {}

    @property
    def error_kind(self) -> str:
        """Low-cardinality label for telemetry (`error.type`)."""
        return self.code or self.error_type

    def body(self) -> dict[str, object]:
        error: dict[str, object] = {
            "message": self.message,
            "type": self.error_type,
            "code": self.code,
        }
        if self.param is not None:
            error["param"] = self.param
        return {"error": error}

    def body_bytes(self) -> bytes:
        return orjson.dumps(self.body())


class InvalidRequest(GatewayError):
    status = 400
    error_type = "invalid_request_error"
    code = "invalid_request"


class AuthenticationFailed(GatewayError):
    status = 401
    error_type = "invalid_request_error"
    code = "invalid_api_key"

    def __init__(self) -> None:
        # One message for every cause: the response never says which part of the key failed.
        super().__init__(
            "Invalid API key. Send 'Authorization: Bearer <your llmgw key>'.",
            headers={"WWW-Authenticate": "Bearer"},
        )


class ModelNotAllowed(GatewayError):
    status = 403
    error_type = "permission_error"
    code = "model_not_allowed"


class PriceUnknown(GatewayError):
    """A budget applies but the model has no price, so the request cannot be metered."""

    status = 403
    error_type = "permission_error"
    code = "price_unknown"


class Forbidden(GatewayError):
    """The caller is known but its role does not allow the action (docs/teams.md)."""

    status = 403
    error_type = "permission_error"
    code = "forbidden"


class NotFound(GatewayError):
    status = 404
    error_type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    error_type = "invalid_request_error"
    code = "method_not_allowed"


class RequestTimeout(GatewayError):
    status = 408
    error_type = "invalid_request_error"
    code = "request_timeout"


class Conflict(GatewayError):
    """The change contradicts the state: e.g. deleting a team that still has active keys."""

    status = 409
    error_type = "invalid_request_error"
    code = "conflict"


class Unprocessable(GatewayError):
    """A well-formed body the current state makes impossible: e.g. a key naming a model its team
    does not allow."""

    status = 422
    error_type = "invalid_request_error"
    code = "unprocessable"


class PayloadTooLarge(GatewayError):
    status = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class UnsupportedMediaType(GatewayError):
    status = 415
    error_type = "invalid_request_error"
    code = "unsupported_media_type"


class RateLimited(GatewayError):
    status = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"


class InternalError(GatewayError):
    status = 500
    error_type = "server_error"
    code = "internal_error"


class UpstreamUnavailable(GatewayError):
    status = 502
    error_type = "upstream_error"
    code = "upstream_unavailable"


class UpstreamAuthFailed(UpstreamUnavailable):
    """The provider refused the gateway's own credentials: the operator's problem, not the caller's."""

    code = "upstream_auth_failed"

    @classmethod
    def gateway_credentials(cls, provider: str, problem: str) -> UpstreamAuthFailed:
        """``provider`` ``problem`` (refused or could not get the gateway's credentials), said
        so that the caller knows it is not their key."""
        return cls(
            f"The provider {provider} {problem}. This is the gateway's configuration, "
            "not your key; tell the gateway's operator."
        )


class UpstreamBusy(UpstreamUnavailable):
    """Every connection the gateway may open to the provider is in use (its max_connections):
    the request was not sent, so a route's next deployment may take it, or the caller later."""

    status = 503
    code = "upstream_busy"


class ServiceUnavailable(GatewayError):
    status = 503
    error_type = "service_unavailable"
    code = "database_unavailable"


class UpstreamTimeout(GatewayError):
    status = 504
    error_type = "upstream_error"
    code = "upstream_timeout"


class ProviderError(GatewayError):
    """A provider's error answer re-rendered in another API's shape: its status and message kept."""

    error_type = "upstream_error"
    code = "provider_error"

    def __init__(self, status: int, message: str, *, headers: Mapping[str, str]) -> None:
        super().__init__(message, headers=headers)
        self.status = status

    @classmethod
    def from_answer(cls, status: int, body: bytes, *, retry_after: str | None) -> ProviderError:
        """The provider's message: Venice's ``error`` (+ its validation ``issues``), OpenAI's
        ``error.message``; a body without one gets a generic sentence."""
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError:
            document = None
        document = document if isinstance(document, dict) else {}
        error = document.get("error")
        if isinstance(error, dict):
            error = error.get("message")
        message = error if isinstance(error, str) and error else f"The provider answered {status}."
        issues = document.get("issues")
        details = [
            issue["message"]
            for issue in (issues if isinstance(issues, list) else [])
            if isinstance(issue, dict) and isinstance(issue.get("message"), str)
        ]
        if details:
            message = f"{message}: {'; '.join(details)}"
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        return cls(status, message, headers=headers)

    @property
    def error_kind(self) -> str:
        return str(self.status)  # the label a passed-through provider error gets
