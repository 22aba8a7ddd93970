"""A fake AWS Bedrock runtime that speaks the real protocol, checked against the official SDK.

A real aiohttp server on 127.0.0.1 (``endpoint_url`` is its root):

- Every request must carry a SigV4 signature (service ``bedrock``, the fake's region) that
  botocore, recomputing it from the request as received with the secret this fake knows for the
  access key, finds equal; and a session token when the credentials have one. An unknown key is
  ``UnrecognizedClientException``, a bad signature ``InvalidSignatureException``, an expired
  credential ``ExpiredTokenException`` (all 403).
- ``POST /model/{modelId}/converse`` and ``/converse-stream``: the Converse API. Text, split in
  ``chunks`` deltas; with ``toolConfig``, unless the last turn holds a ``toolResult``, a
  ``toolUse`` of the first tool; with ``additionalModelRequestFields.thinking`` a reasoning block
  with a signature comes first, and one sent back in history must carry the signature this fake
  issued for its text. A request with a ``cachePoint`` reports cache reads and writes. The stream
  is ``application/vnd.amazon.eventstream`` (binary frames with CRCs, written one by one).
- ``POST /model/{modelId}/invoke`` and ``/invoke-with-response-stream``: Claude's Messages body
  (``anthropic_version: bedrock-2023-05-31``, no ``model`` or ``stream``) answered in Messages'
  shape, streamed as ``chunk`` events of base64 Messages events; Titan's and Cohere's embedding
  bodies. ``POST /model/{modelId}/count-tokens``.
- ``GET /credentials``: a container credentials endpoint (``AWS_CONTAINER_CREDENTIALS_FULL_URI``),
  and ``POST /`` STS's ``AssumeRoleWithWebIdentity`` (``AWS_ENDPOINT_URL_STS``, IRSA), each
  issuing a new temporary credential each time, expiring in ``credential_lifetime``.

Errors are Bedrock's: the type in ``x-amzn-ErrorType``, ``{"message": ...}`` in the body. Tests
script them with :meth:`FakeBedrock.fail_next`, streams cut with :meth:`cut_next` and exception
frames with :meth:`exception_mid_stream`, and read what it got in ``received``.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import datetime
import hashlib
import hmac
import re
import secrets
import struct
import zlib
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote

import attrs
import orjson
from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.fake_venice import split_reply
from tests.processes import ServedHere

REGION = "us-east-1"
ACCESS_KEY = "AKIAFAKEBEDROCK00001"
SECRET_KEY = "fake/bedrock/secret/0b6e1c9d2f4a8e7b3c5d"
CONTAINER_TOKEN = "fake-container-authorization-token-7d1e"
ROLE_ARN = "arn:aws:iam::123456789012:role/llmgw-bedrock"
WEB_IDENTITY_TOKEN = "eyJhbGciOiJSUzI1NiJ9.fake-projected-service-account-token"
CACHE_READ = 1200
CACHE_WRITE = 300
THINKING = "The user wants a greeting; I should answer briefly."
_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<day>\d{8})/(?P<region>[^/]+)/"
    r"(?P<service>[^/]+)/aws4_request, SignedHeaders=(?P<signed>[^,]+), "
    r"Signature=(?P<signature>[0-9a-f]{64})"
)
_ERROR_STATUSES = {
    "ValidationException": 400,
    "AccessDeniedException": 403,
    "ResourceNotFoundException": 404,
    "ModelTimeoutException": 408,
    "ModelErrorException": 424,
    "ThrottlingException": 429,
    "ServiceQuotaExceededException": 429,
    "ModelNotReadyException": 429,
    "InternalServerException": 500,
    "ServiceUnavailableException": 503,
}


@attrs.frozen
class Received:
    operation: str  # converse, converse-stream, invoke, invoke-with-response-stream, count-tokens
    model: str
    raw_path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    access_key: str

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)


@attrs.define
class Credential:
    secret: str
    token: str | None
    expired: bool = False


@attrs.frozen
class Failure:
    kind: str  # the exception's name, e.g. ThrottlingException
    message: str = "Rate exceeded"
    retry_after: str | None = None


def signature_for(thinking: str) -> str:
    """The signature this fake gives a reasoning text (opaque to everyone else)."""
    return "Bdrk" + hashlib.sha256(b"fake-bedrock:" + thinking.encode()).hexdigest()


def frame(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One frame of AWS's event stream: prelude (lengths), its CRC, string headers, payload, CRC."""
    encoded = b"".join(
        bytes([len(name)])
        + name.encode()
        + b"\x07"
        + struct.pack(">H", len(value))
        + value.encode()
        for name, value in headers.items()
    )
    prelude = struct.pack(">II", 12 + len(encoded) + len(payload) + 4, len(encoded))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + encoded + payload
    return message + struct.pack(">I", zlib.crc32(message))


def event(kind: str, payload: dict[str, Any]) -> bytes:
    headers = {":event-type": kind, ":content-type": "application/json", ":message-type": "event"}
    return frame(headers, orjson.dumps(payload))


def exception_frame(kind: str, message: str) -> bytes:
    headers = {
        ":exception-type": kind,
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    return frame(headers, orjson.dumps({"message": message}))


def input_tokens(*parts: Any) -> int:
    """This fake's exact count: 1 per 4 bytes of what the request asks about, at least 1."""
    return max(1, len(orjson.dumps(parts)) // 4)


def _error(kind: str, message: str, retry_after: str | None = None) -> web.Response:
    headers = {"x-amzn-ErrorType": f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/"}
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    return web.json_response(
        {"message": message}, status=_ERROR_STATUSES.get(kind, 400), headers=headers
    )


class FakeBedrock(ServedHere):
    def __init__(self, *, reply: str = "Hello from fake Bedrock!", chunks: int = 3) -> None:
        self.reply = reply
        self.chunks = chunks
        self.region = REGION
        self.credentials: dict[str, Credential] = {ACCESS_KEY: Credential(SECRET_KEY, None)}
        self.credential_lifetime = datetime.timedelta(minutes=5)
        self.issued: list[str] = []  # access keys the credentials endpoint issued, in order
        self.on_secret: Callable[[str], None] = lambda secret: None  # told each secret it issues
        self.received: list[Received] = []
        self.refused: list[str] = []  # the exception name of each request refused for its auth
        self._failures: collections.deque[Failure] = collections.deque()
        self._cuts: collections.deque[int] = collections.deque()
        self._exceptions: collections.deque[str] = collections.deque()
        # A stream waits here after ``hold_after`` frames until the test sets it.
        self.hold: asyncio.Event | None = None
        self.hold_after = 2

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def credentials_url(self) -> str:
        return f"{self.endpoint_url}/credentials"

    def fail_next(self, *failures: Failure) -> None:
        """The next model requests answer these errors, one each, in order."""
        self._failures.extend(failures)

    def cut_next(self, after_frames: int) -> None:
        """The next stream hangs up after this many event frames."""
        self._cuts.append(after_frames)

    def exception_mid_stream(self, kind: str = "modelStreamErrorException") -> None:
        """The next stream sends its first text, then an exception frame, and ends."""
        self._exceptions.append(kind)

    def expire(self, access_key: str) -> None:
        self.credentials[access_key].expired = True

    def calls(self, operation: str) -> list[Received]:
        return [r for r in self.received if r.operation == operation]

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post(
            "/model/{model:.+}/{operation:converse|converse-stream|invoke|"
            "invoke-with-response-stream|count-tokens}",
            self._model,
        )
        app.router.add_get("/credentials", self._issue_credentials)
        app.router.add_post("/", self._sts)  # AWS_ENDPOINT_URL_STS
        return app

    # -- credentials and signatures -----------------------------------------------------------

    async def _issue_credentials(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != CONTAINER_TOKEN:
            return web.json_response({"message": "unauthorized"}, status=401)
        key, credential, expiration = self._new_credential()
        return web.json_response(
            {
                "AccessKeyId": key,
                "SecretAccessKey": credential.secret,
                "Token": credential.token,
                "Expiration": expiration,
            }
        )

    async def _sts(self, request: web.Request) -> web.Response:
        """STS's AssumeRoleWithWebIdentity (IRSA): the projected token for the role, a credential."""
        form = await request.post()
        if form.get("Action") != "AssumeRoleWithWebIdentity":
            return web.Response(status=400, text="unsupported action")
        if form.get("WebIdentityToken") != WEB_IDENTITY_TOKEN or form.get("RoleArn") != ROLE_ARN:
            return web.Response(
                status=403,
                text="<ErrorResponse><Error><Code>AccessDenied</Code></Error></ErrorResponse>",
            )
        key, credential, expiration = self._new_credential()
        return web.Response(
            content_type="text/xml",
            text=(
                '<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
                "<AssumeRoleWithWebIdentityResult><Credentials>"
                f"<AccessKeyId>{key}</AccessKeyId><SecretAccessKey>{credential.secret}</SecretAccessKey>"
                f"<SessionToken>{credential.token}</SessionToken><Expiration>{expiration}</Expiration>"
                "</Credentials><SubjectFromWebIdentityToken>system:serviceaccount:llm:llmgw"
                "</SubjectFromWebIdentityToken><AssumedRoleUser>"
                f"<Arn>{ROLE_ARN.replace(':role/', ':assumed-role/')}/s</Arn><AssumedRoleId>AROAFAKE:s</AssumedRoleId>"
                "</AssumedRoleUser></AssumeRoleWithWebIdentityResult>"
                "<ResponseMetadata><RequestId>0</RequestId></ResponseMetadata>"
                "</AssumeRoleWithWebIdentityResponse>"
            ),
        )

    def _new_credential(self) -> tuple[str, Credential, str]:
        key = "ASIAFAKE" + secrets.token_hex(6).upper()
        credential = Credential(secrets.token_urlsafe(30), "FwoFakeSession" + secrets.token_hex(16))
        self.credentials[key] = credential
        self.issued.append(key)
        self.on_secret(credential.secret)
        self.on_secret(str(credential.token))
        expiration = datetime.datetime.now(datetime.UTC) + self.credential_lifetime
        return key, credential, expiration.strftime("%Y-%m-%dT%H:%M:%SZ")

    def _verify(self, request: web.Request, body: bytes) -> tuple[str, str | None]:
        """The access key that signed ``request``, or the exception refusing it."""
        match = _AUTHORIZATION.fullmatch(request.headers.get("Authorization", ""))
        if match is None:
            return "", "MissingAuthenticationTokenException"
        key = match["key"]
        credential = self.credentials.get(key)
        if credential is None:
            return key, "UnrecognizedClientException"
        if credential.expired:
            return key, "ExpiredTokenException"
        if match["region"] != self.region or match["service"] != "bedrock":
            return key, "InvalidSignatureException"
        if request.headers.get("X-Amz-Security-Token") != credential.token:
            return key, "UnrecognizedClientException"
        signed = match["signed"].split(";")
        if "host" not in signed or "x-amz-date" not in signed:
            return key, "InvalidSignatureException"
        # botocore recomputes the signature from the request as it arrived: the raw path, the
        # signed headers, the body and the date the signer put in X-Amz-Date.
        aws = AWSRequest(
            method=request.method,
            url=f"http://{request.headers['Host']}{request.raw_path}",
            data=body,
            headers={name: request.headers.get(name, "") for name in signed},
        )
        aws.context["timestamp"] = request.headers["X-Amz-Date"]
        signer = SigV4Auth(
            Credentials(key, credential.secret, credential.token), "bedrock", self.region
        )
        canonical = signer.canonical_request(aws)
        expected = signer.signature(signer.string_to_sign(aws, canonical), aws)
        if not hmac.compare_digest(expected, match["signature"]):
            return key, "InvalidSignatureException"
        return key, None

    # -- the model operations ---------------------------------------------------------------

    async def _model(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        key, refusal = self._verify(request, body)
        if refusal is not None:
            self.refused.append(refusal)
            headers = {"x-amzn-ErrorType": refusal}
            return web.json_response(
                {"message": f"The security token or signature was refused ({refusal})."},
                status=403,
                headers=headers,
            )
        operation = request.match_info["operation"]
        model = unquote(request.match_info["model"])
        self.received.append(
            Received(
                operation,
                model,
                request.raw_path,
                {k.lower(): v for k, v in request.headers.items()},
                body,
                key,
            )
        )
        if self._failures:
            failure = self._failures.popleft()
            return _error(failure.kind, failure.message, failure.retry_after)
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError:
            return _error("ValidationException", "The body is not JSON.")
        if operation == "count-tokens":
            return self._count_tokens(document)
        if operation in ("converse", "converse-stream"):
            problem = _converse_problem(document)
            if problem is not None:
                return _error("ValidationException", problem)
            if operation == "converse":
                return web.json_response(self._converse_answer(document))
            return await self._stream(request, self._converse_events(document))
        if "titan-embed" in model:
            vector = [round(0.001 * i, 3) for i in range(document.get("dimensions", 8))]
            return web.json_response(
                {"embedding": vector, "inputTextTokenCount": input_tokens(document["inputText"])}
            )
        if "cohere.embed" in model:
            texts = document["texts"]
            vectors = [[0.5, -0.25, float(i)] for i in range(len(texts))]
            headers = {"X-Amzn-Bedrock-Input-Token-Count": str(input_tokens(texts))}
            return web.json_response(
                {
                    "embeddings": vectors,
                    "id": "emb-1",
                    "response_type": "embeddings_floats",
                    "texts": texts,
                },
                headers=headers,
            )
        problem = _invoke_problem(document)
        if problem is not None:
            return _error("ValidationException", problem)
        events = self._messages_events(document)
        if operation == "invoke":
            return web.json_response(_message_of(events))
        return await self._stream(request, [_chunk(e) for e in events])

    def _count_tokens(self, document: dict[str, Any]) -> web.Response:
        given = document.get("input", {})
        if "invokeModel" in given:
            asked = orjson.loads(base64.b64decode(given["invokeModel"]["body"]))
            if asked.get("anthropic_version") != "bedrock-2023-05-31":
                return _error("ValidationException", "anthropic_version is required.")
            parts = (asked.get("system"), asked.get("messages"), asked.get("tools"))
        else:
            converse = given.get("converse", {})
            parts = (converse.get("system"), converse.get("messages"), converse.get("toolConfig"))
        return web.json_response({"inputTokens": input_tokens(*parts)})

    async def _stream(self, request: web.Request, frames: list[bytes]) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "application/vnd.amazon.eventstream"}
        )
        response.enable_chunked_encoding()
        await response.prepare(request)
        cut = self._cuts.popleft() if self._cuts else None
        exception = self._exceptions.popleft() if self._exceptions else None
        for sent, data in enumerate(frames):
            if self.hold is not None and sent == self.hold_after:
                await self.hold.wait()
            if cut is not None and sent == cut:
                if request.transport is not None:
                    request.transport.close()  # what was written arrives; the end does not
                return response
            if exception is not None and sent == 3:
                await response.write(exception_frame(exception, "The model stream failed."))
                break
            await response.write(data)
        await response.write_eof()
        return response

    # -- Converse ---------------------------------------------------------------------------

    def _converse_parts(
        self, document: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], str, dict[str, int]]:
        """The answer's content blocks, stop reason and usage."""
        blocks: list[dict[str, Any]] = []
        thinking = document.get("additionalModelRequestFields", {}).get("thinking")
        if isinstance(thinking, dict) and thinking.get("type") == "enabled":
            blocks.append(
                {
                    "reasoningContent": {
                        "reasoningText": {"text": THINKING, "signature": signature_for(THINKING)}
                    }
                }
            )
        tools = document.get("toolConfig", {}).get("tools", [])
        specs = [t["toolSpec"] for t in tools if "toolSpec" in t]
        last = document["messages"][-1]["content"]
        if specs and not any("toolResult" in block for block in last):
            use = {
                "toolUseId": "tooluse_" + secrets.token_hex(8),
                "name": specs[0]["name"],
                "input": {"city": "Paris"},
            }
            blocks.append({"toolUse": use})
            reason = "tool_use"
        else:
            blocks.append({"text": _continued(self.reply, document["messages"][-1])})
            reason = "end_turn"
        usage = {
            "inputTokens": input_tokens(document.get("system"), document["messages"], specs),
            "outputTokens": self.chunks,
        }
        if b"cachePoint" in orjson.dumps(document):
            usage["cacheReadInputTokens"] = CACHE_READ
            usage["cacheWriteInputTokens"] = CACHE_WRITE
        usage["totalTokens"] = sum(usage.values())
        return blocks, reason, usage

    def _converse_answer(self, document: dict[str, Any]) -> dict[str, Any]:
        blocks, reason, usage = self._converse_parts(document)
        return {
            "output": {"message": {"role": "assistant", "content": blocks}},
            "stopReason": reason,
            "usage": usage,
            "metrics": {"latencyMs": 12},
        }

    def _converse_events(self, document: dict[str, Any]) -> list[bytes]:
        blocks, reason, usage = self._converse_parts(document)
        frames = [event("messageStart", {"role": "assistant"})]
        for index, block in enumerate(blocks):
            if "reasoningContent" in block:
                text = block["reasoningContent"]["reasoningText"]
                for piece in split_reply(text["text"], 2):
                    frames.append(_delta(index, {"reasoningContent": {"text": piece}}))
                frames.append(_delta(index, {"reasoningContent": {"signature": text["signature"]}}))
            elif "toolUse" in block:
                use = block["toolUse"]
                start = {"toolUse": {"toolUseId": use["toolUseId"], "name": use["name"]}}
                frames.append(
                    event("contentBlockStart", {"start": start, "contentBlockIndex": index})
                )
                arguments = orjson.dumps(use["input"]).decode()
                for piece in (arguments[:5], arguments[5:]):
                    frames.append(_delta(index, {"toolUse": {"input": piece}}))
            else:
                for piece in split_reply(block["text"], self.chunks):
                    frames.append(_delta(index, {"text": piece}))
            frames.append(event("contentBlockStop", {"contentBlockIndex": index}))
        frames.append(event("messageStop", {"stopReason": reason}))
        frames.append(event("metadata", {"usage": usage, "metrics": {"latencyMs": 12}}))
        return frames

    # -- Claude's Messages through InvokeModel -------------------------------------------

    def _messages_events(self, document: dict[str, Any]) -> list[dict[str, Any]]:
        usage = {
            "input_tokens": input_tokens(
                document.get("system"), document["messages"], document.get("tools")
            ),
            "output_tokens": 1,
            "cache_read_input_tokens": CACHE_READ,
            "cache_creation_input_tokens": CACHE_WRITE,
        }
        message = {
            "id": "msg_bdrk_" + secrets.token_hex(8),
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5-20250929",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        events: list[dict[str, Any]] = [{"type": "message_start", "message": message}]
        events.append(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            }
        )
        for piece in split_reply(self.reply, self.chunks):
            events.append(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": piece},
                }
            )
        events.append({"type": "content_block_stop", "index": 0})
        events.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": self.chunks},
            }
        )
        events.append(
            {
                "type": "message_stop",
                "amazon-bedrock-invocationMetrics": {
                    "inputTokenCount": usage["input_tokens"],
                    "outputTokenCount": self.chunks,
                    "invocationLatency": 12,
                    "firstByteLatency": 5,
                },
            }
        )
        return events


def _continued(reply: str, last: dict[str, Any]) -> str:
    """A trailing assistant turn is continued (prefill), as Claude on Bedrock does."""
    if last["role"] != "assistant":
        return reply
    prefill = "".join(block.get("text", "") for block in last["content"])
    return reply[len(prefill) :] if reply.startswith(prefill) else reply


def _delta(index: int, delta: dict[str, Any]) -> bytes:
    return event("contentBlockDelta", {"delta": delta, "contentBlockIndex": index})


def _chunk(message_event: dict[str, Any]) -> bytes:
    return event("chunk", {"bytes": base64.b64encode(orjson.dumps(message_event)).decode()})


def _message_of(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The whole answer the stream ``events`` make up."""
    message = dict(events[0]["message"])
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    message["content"] = [{"type": "text", "text": text}]
    message["stop_reason"] = "end_turn"
    message["usage"] = {**message["usage"], "output_tokens": events[-2]["usage"]["output_tokens"]}
    return message


_CONTENT_KEYS = frozenset(
    {"text", "image", "document", "toolUse", "toolResult", "reasoningContent", "cachePoint"}
)


def _converse_problem(document: dict[str, Any]) -> str | None:
    """What Bedrock would refuse in a Converse request, in its words; None when it is valid."""
    messages = document.get("messages")
    if not isinstance(messages, list) or not messages:
        return "The model requires at least one message."
    if "model" in document or "max_tokens" in document:
        return "Malformed input request: extraneous key [model] is not permitted."
    uses_tools = False
    for message in messages:
        if message.get("role") not in ("user", "assistant"):
            return "Malformed input request: role is not valid."
        for block in message.get("content", []):
            if len(block) != 1 or next(iter(block)) not in _CONTENT_KEYS:
                return f"Malformed input request: content block {sorted(block)} is not valid."
            if "image" in block:
                image = block["image"]
                if image.get("format") not in ("png", "jpeg", "gif", "webp"):
                    return "The image format is not valid."
                base64.b64decode(image["source"]["bytes"], validate=True)
            if "toolUse" in block or "toolResult" in block:
                uses_tools = True
            reasoning = block.get("reasoningContent", {}).get("reasoningText")
            if reasoning is not None and reasoning.get("signature") != signature_for(
                reasoning["text"]
            ):
                return "The reasoning signature is not valid."
    if uses_tools and "toolConfig" not in document:
        return (
            "The toolConfig field must be defined when using toolUse and toolResult content blocks."
        )
    text = orjson.dumps(messages)
    if b"TOO LONG" in text:
        return "Input is too long for requested model."
    return None


def _invoke_problem(document: dict[str, Any]) -> str | None:
    if document.get("anthropic_version") != "bedrock-2023-05-31":
        return "Malformed input request: anthropic_version is required."
    for key in ("model", "stream"):
        if key in document:
            return f"Malformed input request: extraneous key [{key}] is not permitted."
    if not isinstance(document.get("max_tokens"), int) or not document.get("messages"):
        return "Malformed input request: max_tokens and messages are required."
    return None
