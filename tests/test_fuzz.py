"""Abuse and bad input against a real gateway process: a schema fuzzer over every route in
``/openapi.json``, property-based bodies and headers, malformed HTTP, and authentication timing.

Whatever comes in, the gateway answers in time, with no 500, no traceback, and — for every error it
answers itself — OpenAI's error shape. Errors Venice answers with keep Venice's body by design; the
fake Venice behind this gateway is healthy, so the only 5xx allowed are the 502s it provokes itself
by hanging up on model names it cannot echo in a header.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import timedelta, timezone
from typing import Any

import aiohttp
import asyncpg
import attrs
import pytest
import requests
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import positive_data_acceptance

from llmgw.api.openapi import build_document
from llmgw.app import create_app
from llmgw.config import Settings, venice_provider
from llmgw.key_format import PREFIX_LENGTH
from llmgw.routes import PUBLIC_PATHS
from llmgw.storage import api_keys
from tests.conftest import GatewayProcess, gateway_env, spawn_gateway
from tests.processes import REPO_ROOT, free_port, listening, running, wait_until
from tests.test_routes import served_routes

# Minutes of schemathesis and hypothesis against a gateway process: pytest -m slow.
pytestmark = pytest.mark.slow

REQUEST_TIMEOUT = 5.0
ADMIN_TOKEN = "fuzz-admin-token-3c9e1b7a"
BODY_LIMIT = 65_536
MAX_ANSWER_BYTES = 1 << 20  # nothing the gateway answers here comes near this
SCHEMA_FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@attrs.frozen
class Target:
    gateway: GatewayProcess
    key: str
    key_id: str
    database_url: str

    @property
    def url(self) -> str:
        return self.gateway.url

    def auth(self, path: str = "/v1/") -> dict[str, str]:
        token = ADMIN_TOKEN if path.startswith("/admin/") else self.key
        return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def target(
    database_url: str, tmp_path_factory: pytest.TempPathFactory, secret_scanner: Any
) -> Iterator[Target]:
    venice_port = free_port()
    venice = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "tests" / "fake_venice.py"), "--port", str(venice_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    async def mint() -> api_keys.IssuedKey:
        connection = await asyncpg.connect(database_url)
        try:
            return await api_keys.create_key(
                connection, api_keys.KeySettings(name="fuzz", rate_limit_requests=1_000_000)
            )
        finally:
            await connection.close()

    secret_scanner.register(ADMIN_TOKEN, "the admin token")
    try:
        wait_until(
            lambda: running(venice, "the fake Venice") and listening(venice_port),
            within=20,
            what="the fake Venice listens",
        )
        issued = asyncio.run(mint())
        env = gateway_env(
            database_url,
            f"http://127.0.0.1:{venice_port}/api/v1",
            REQUEST_TIMEOUT_SECONDS=str(REQUEST_TIMEOUT),
            REQUEST_BODY_LIMIT_BYTES=str(BODY_LIMIT),
            LLMGW_PROMETHEUS="true",
            VENICE_MAX_RETRIES="0",  # retries are not what is fuzzed here; keep answers quick
            LLMGW_ADMIN_TOKEN=ADMIN_TOKEN,  # so the admin API's routes are served and fuzzed too
            # The schema fuzzer stands for many clients behind a proxy (see fuzz() below): from
            # one address its wrong-token probes would be throttled after ten (429, not 401).
            TRUST_FORWARDED_HEADERS="true",
        )
        log = tmp_path_factory.mktemp("fuzz") / "gateway.log"
        gateway = spawn_gateway(env, log, free_port())
        try:
            gateway.wait_ready()
            yield Target(gateway, issued.plaintext, str(issued.record.id), database_url)
            # aiohttp's HTTP parser logs the malformed requests of test_malformed_http_*.
            assert gateway.problems("Error handling request") == []
        finally:
            assert gateway.stop() == 0
            secret_scanner.scan_text(gateway.log_text(), "the fuzzed gateway's log")
    finally:
        venice.terminate()
        venice.wait(timeout=10)


@pytest.fixture(scope="module")
def http(target: Target) -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


# Routes whose provider errors reach the client as the provider sent them (Responses wraps them).
_PASSED_THROUGH_ERRORS = (
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/images/generations",
    "/v1/audio/speech",
    "/v1/audio/transcriptions",
)


def check_answer(
    status: int, headers: Mapping[str, Any], body: bytes, elapsed: float, *, path: str = ""
) -> None:
    """What every answer must satisfy, whatever was sent."""
    assert elapsed < REQUEST_TIMEOUT + 2, f"{path}: answered after {elapsed:.1f}s"
    assert len(body) <= MAX_ANSWER_BYTES
    assert b"Traceback" not in body and b'File "' not in body, body[:500]
    anthropic_route = path == "/v1/messages" or path.startswith("/v1/messages/")
    if status >= 500:
        # Only what the fake Venice caused: it cannot put some fuzzed model names into its own
        # headers and hangs up, which the gateway reports (after its retries) as a 502.
        error = json.loads(body)["error"]
        kind = error["type"] if anthropic_route else error["code"]
        expected = ("api_error", "timeout_error") if anthropic_route else ("upstream_",)
        assert status in (502, 504) and kind.startswith(expected), (status, body[:500])
    lowered = {k.lower(): v[0] if isinstance(v, list) else v for k, v in headers.items()}
    assert lowered.get("x-request-id"), "every answer carries a request id"
    if status < 400:
        return
    document = json.loads(body)
    if anthropic_route:
        # Anthropic's shape for every error there, the provider's included.
        assert document["type"] == "error" and set(document["error"]) == {"type", "message"}
        assert isinstance(document["error"]["message"], str) and document["error"]["message"]
        return
    error = document["error"]
    if isinstance(error, dict):
        # The gateway's own error: OpenAI's shape.
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["type"], str)
        assert error["code"] is None or isinstance(error["code"], str)
    else:
        # Venice's own error, passed through as Venice sent it (a 4xx from the provider).
        assert path in _PASSED_THROUGH_ERRORS, (path, document)


# ---------------------------------------------------------------------------------------------
# The OpenAPI document and the schema fuzzer


def test_openapi_document_lists_every_route(target: Target, http: requests.Session) -> None:
    response = http.get(f"{target.url}/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.")
    described = {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method in operations
    }
    settings = Settings(environment_provider=venice_provider("unused"), admin_token=ADMIN_TOKEN)
    app = create_app(settings, database_url="postgresql://unused")
    assert described == {(method, path) for method, path, _ in served_routes(app)}
    assert ("POST", "/admin/v1/keys") in described
    for path, operations in document["paths"].items():
        for operation in operations.values():
            assert (operation["security"] == []) == (path in PUBLIC_PATHS)
            assert operation["responses"]


def test_openapi_document_includes_sub_applications() -> None:
    app = web.Application()
    admin = web.Application()

    async def revoke(request: web.Request) -> web.Response:
        return web.Response()

    admin.router.add_post("/keys/{key_id}/revoke", revoke)
    app.add_subapp("/admin/v1", admin)
    document = build_document(app)
    operation = document["paths"]["/admin/v1/keys/{key_id}/revoke"]["post"]
    assert operation["security"] == [{"bearer": []}]
    assert {p["name"] for p in operation["parameters"]} == {"X-Request-Id", "key_id"}


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_every_route_survives_the_schema_fuzzer(target: Target, mode: GenerationMode) -> None:
    """schemathesis generates requests for every operation in /openapi.json, valid ones and
    (negative mode) ones that break the schema, and checks the answers against the document."""
    api = schemathesis.openapi.from_url(f"{target.url}/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]
    document = requests.get(f"{target.url}/openapi.json", timeout=5).json()
    every = {f"{m.upper()} {p}" for p, ops in document["paths"].items() for m in ops}
    # schemathesis leaves out the operation that serves the document it was loaded from.
    assert {operation.label for operation in operations} == every - {"GET /openapi.json"}
    for operation in operations:
        method, path = operation.label.split(" ", 1)
        if (
            mode is GenerationMode.NEGATIVE
            and "requestBody" not in (document["paths"][path][method.lower()])
        ):
            continue  # only a body can be made invalid (X-Request-Id takes any string)

        @SCHEMA_FUZZ
        @given(case=operation.as_strategy(mode))
        def fuzz(case: Any) -> None:
            started = time.monotonic()
            # A client address of its own per case, in the case itself: the auth probes
            # schemathesis derives from it (no token, a wrong one) keep it, so two failures an
            # address, under the sign-in throttle's burst.
            address = f"198.18.{secrets.randbelow(256)}.{secrets.randbelow(256)}"
            case.headers = {**(case.headers or {}), "X-Forwarded-For": address}
            response = case.call(headers=target.auth(case.path), timeout=REQUEST_TIMEOUT + 5)
            elapsed = time.monotonic() - started
            check_answer(
                response.status_code, response.headers, response.content, elapsed, path=case.path
            )
            # check_answer() above already judged the status: no 500 and no 503 at all, and a
            # 502/504 only as the gateway's own upstream error. The provider, not the gateway,
            # judges the fields the gateway forwards, and its 4xx pass through by design: a
            # schema-valid body may still be refused. Every other built-in check applies.
            case.validate_response(
                response, excluded_checks=[not_a_server_error, positive_data_acceptance]
            )

        fuzz()


# ---------------------------------------------------------------------------------------------
# Property-based bodies and headers

# Text without lone surrogates encodes to valid UTF-8; with them (sometimes) it cannot.
_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text
    | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=16,
)
# The fake Venice echoes the model in a response header and hangs up on line breaks (a 502).
models = st.sampled_from(["qwen3-5-9b", "venice/qwen3-5-9b", "venice/x"]) | _text.filter(
    lambda text: text.strip() and "\n" not in text and "\r" not in text
)
# What the gateway checks is well formed; everything else is any JSON at all.
well_formed_chat = st.fixed_dictionaries(
    {
        "model": models,
        "messages": st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "system", "assistant", "tool"]) | _text},
                optional={"content": _text | json_values, "name": json_values},
            ),
            min_size=1,
            max_size=3,
        ),
    },
    optional={
        "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({"include_usage": json_values}) | json_values,
        "max_tokens": json_values,
        "temperature": json_values,
        "n": st.integers(min_value=-(10**30), max_value=10**30),
        "tools": json_values,
        "venice_parameters": json_values,
    },
)
any_chat = st.fixed_dictionaries(
    {},
    optional={
        "model": json_values,
        "messages": json_values | st.lists(json_values, max_size=3),
        "stream": json_values,
    },
)
well_formed_embeddings = st.fixed_dictionaries(
    {"model": models, "input": _text | st.lists(_text, min_size=1, max_size=3) | json_values},
    # Not any value here: the fake Venice would build an embedding of 10**40 numbers.
    optional={"dimensions": st.integers(min_value=-2, max_value=64) | st.sampled_from(["8", None])},
)


def encode(value: Any, ascii_only: bool) -> bytes:
    # Lone surrogates either go out escaped (\ud800) or as the bytes they would be: both invalid.
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def post(http: requests.Session, target: Target, path: str, body: bytes, **headers: str) -> None:
    started = time.monotonic()
    response = http.post(
        f"{target.url}{path}",
        data=body,
        headers={"Content-Type": "application/json", **target.auth(), **headers},
        timeout=REQUEST_TIMEOUT + 5,
    )
    elapsed = time.monotonic() - started
    check_answer(response.status_code, response.headers, response.content, elapsed, path=path)


@FUZZ
@given(body=well_formed_chat)
def test_well_formed_chat_bodies_with_any_other_values(
    target: Target, http: requests.Session, body: Any
) -> None:
    post(http, target, "/v1/chat/completions", encode(body, ascii_only=False))


@FUZZ
@given(body=any_chat | json_values, ascii_only=st.booleans())
def test_chat_bodies_of_any_shape(
    target: Target, http: requests.Session, body: Any, ascii_only: bool
) -> None:
    post(http, target, "/v1/chat/completions", encode(body, ascii_only))


@FUZZ
@given(body=well_formed_embeddings | json_values)
def test_embeddings_bodies_of_any_shape(target: Target, http: requests.Session, body: Any) -> None:
    post(http, target, "/v1/embeddings", encode(body, ascii_only=False))


well_formed_messages = st.fixed_dictionaries(
    {
        "model": models,
        "max_tokens": st.integers(min_value=0, max_value=10**6),
        "messages": st.lists(
            st.fixed_dictionaries(
                {
                    "role": st.sampled_from(["user", "assistant", "system"]) | _text,
                    "content": _text
                    | st.lists(
                        st.fixed_dictionaries(
                            {
                                "type": st.sampled_from(
                                    ["text", "image", "document", "tool_use", "tool_result"]
                                )
                                | _text
                            },
                            optional={
                                "text": json_values,
                                "source": json_values,
                                "id": json_values,
                                "input": json_values,
                                "tool_use_id": json_values,
                                "content": json_values,
                                "is_error": json_values,
                            },
                        ),
                        max_size=3,
                    )
                    | json_values,
                }
            ),
            min_size=1,
            max_size=3,
        ),
    },
    optional={
        "stream": st.booleans(),
        "system": _text | json_values,
        "tools": json_values,
        "tool_choice": json_values,
        "thinking": json_values,
        "stop_sequences": json_values,
    },
)


@FUZZ
@given(body=well_formed_messages | json_values, path=st.sampled_from(["", "/count_tokens"]))
def test_messages_bodies_of_any_shape(
    target: Target, http: requests.Session, body: Any, path: str
) -> None:
    post(http, target, "/v1/messages" + path, encode(body, ascii_only=False))


@FUZZ
@given(body=st.binary(max_size=300))
def test_bodies_that_are_not_json(target: Target, http: requests.Session, body: bytes) -> None:
    post(http, target, "/v1/chat/completions", body)


# ---------------------------------------------------------------------------------------------
# Admin fields, out of what the database can hold included

_edge_ints = st.integers() | st.sampled_from([0, -1, 2**31 - 1, 2**31, 2**63, 10**20])
_edge_numbers = (
    _edge_ints
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([1e-9, 4e-9, 1e-8, 1e10, 1e12, 1e300])
)
_zones = st.integers(-23 * 60, 23 * 60).map(lambda minutes: timezone(timedelta(minutes=minutes)))
_edge_times = st.datetimes(timezones=_zones).map(
    lambda moment: moment.isoformat()
) | st.sampled_from(
    ["9999-12-31T23:59:59-23:00", "0001-01-01T00:00:00+14:00", "1969-12-31T23:59:59Z"]
)
admin_key_bodies = st.fixed_dictionaries(
    {"name": st.just("fuzz-admin")},
    optional={
        "rate_limit_requests": _edge_ints,
        "rate_limit_window_seconds": _edge_ints,
        "tokens_per_minute": _edge_ints,
        "expires_at": _edge_times,
    },
)


def admin_call(
    http: requests.Session, target: Target, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    started = time.monotonic()
    response = http.request(
        method,
        f"{target.url}/admin/v1{path}",
        data=None if body is None else json.dumps(body),
        headers={"Content-Type": "application/json", **target.auth("/admin/")},
        timeout=REQUEST_TIMEOUT + 5,
    )
    check_answer(
        response.status_code,
        response.headers,
        response.content,
        time.monotonic() - started,
        path=path,
    )
    return response.status_code, response.json()


@FUZZ
@given(body=admin_key_bodies)
def test_admin_key_fields_of_any_size(target: Target, http: requests.Session, body: Any) -> None:
    assert admin_call(http, target, "POST", "/keys", body)[0] in (201, 400)


@FUZZ
@given(budget=_edge_numbers, grace=_edge_numbers)
def test_admin_budgets_and_grace_of_any_size(
    target: Target, http: requests.Session, budget: Any, grace: Any
) -> None:
    subject = f"/subjects/{uuid.uuid4()}"
    status, _ = admin_call(http, target, "PUT", subject, {"monthly_budget_usd": budget})
    assert status in (200, 400)
    status, created = admin_call(http, target, "POST", "/keys", {"name": "fuzz-rotated"})
    assert status == 201
    path = f"/keys/{created['id']}/rotate"
    assert admin_call(http, target, "POST", path, {"grace_seconds": grace})[0] in (201, 400)


@FUZZ
@given(limit=_edge_ints, offset=_edge_ints, moment=_edge_times)
def test_admin_queries_of_any_size(
    target: Target, http: requests.Session, limit: int, offset: int, moment: str
) -> None:
    page = f"/keys?limit={limit}&offset={offset}"
    assert admin_call(http, target, "GET", page)[0] in (200, 400)
    query = requests.utils.quote(moment)
    assert admin_call(http, target, "GET", f"/usage?from={query}&to={query}")[0] in (200, 400)


# Field values as RFC 9110 allows them: visible ASCII, space and tab inside, and obs-text.
_field_bytes = st.sampled_from([b"\t", *(bytes([c]) for c in range(0x20, 0x7F))]) | st.binary(
    min_size=1, max_size=1
).filter(lambda b: b[0] >= 0x80)
field_values = st.lists(_field_bytes, max_size=60).map(b"".join).map(bytes.strip)


@FUZZ
@given(
    authorization=field_values
    | field_values.map(lambda v: b"Bearer " + v)
    | st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", max_size=60).map(
        lambda v: ("Bearer llmg_" + v).encode()
    ),
    request_id=field_values,
)
def test_odd_authorization_and_request_id_headers(
    target: Target, http: requests.Session, authorization: bytes, request_id: bytes
) -> None:
    started = time.monotonic()
    response = http.post(
        f"{target.url}/v1/chat/completions",
        json={"model": "qwen3-5-9b", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": authorization, "X-Request-Id": request_id},
        timeout=REQUEST_TIMEOUT + 5,
    )
    elapsed = time.monotonic() - started
    check_answer(response.status_code, response.headers, response.content, elapsed)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    echoed = response.headers["X-Request-Id"].encode("latin-1")
    assert echoed == request_id or len(echoed) == 32


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Request-Id: a\x00b\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Content-Length: 6\r\n\r\nhello",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"zz\r\nhello\r\n",
        b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello on the plain port
    ],
    ids=["nul-in-header", "two-lengths", "bad-chunk", "huge-line", "tls"],
)
def test_malformed_http_gets_a_4xx_and_a_closed_connection(target: Target, raw: bytes) -> None:
    with socket.create_connection(("127.0.0.1", target.gateway.port), timeout=5) as sock:
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line = answer.partition(b"\r\n")[0]
    assert status_line.startswith(b"HTTP/1.") and status_line[9:10] == b"4", answer[:300]
    assert b"Traceback" not in answer
    body = answer.partition(b"\r\n\r\n")[2]
    assert json.loads(body)["error"]["code"] == "invalid_http", answer[:300]  # OpenAI's shape


# ---------------------------------------------------------------------------------------------
# Authentication timing


async def test_rejection_time_does_not_reveal_whether_a_prefix_exists(target: Target) -> None:
    """Median time to reject a wrong secret behind a real prefix vs. behind an unknown prefix.

    Measured twice: with the prefix's row in the replica's cache (a prefix that was just used) and
    without (the row evicted through the same NOTIFY a key change sends, against a fresh unknown
    prefix each time, so both sides query the database).
    """
    real_prefix = target.key[:PREFIX_LENGTH]
    secret_length = len(target.key) - PREFIX_LENGTH

    def wrong_secret_behind(prefix: str) -> str:
        return prefix + secrets.token_urlsafe(secret_length)[:secret_length]

    def unknown_prefix() -> str:
        return "llmg_" + secrets.token_urlsafe(8)[: PREFIX_LENGTH - 5]

    url = f"{target.url}/v1/models"

    async def reject(session: aiohttp.ClientSession, key: str) -> float:
        started = time.perf_counter()
        async with session.get(url, headers={"Authorization": f"Bearer {key}"}) as response:
            await response.read()
        assert response.status == 401
        return (time.perf_counter() - started) * 1000

    results: dict[str, tuple[float, float]] = {}
    connection = await asyncpg.connect(target.database_url)
    try:
        async with aiohttp.ClientSession() as session:
            fixed_unknown = unknown_prefix()
            for _ in range(50):  # warm up: connections, caches, the event loops
                await reject(session, wrong_secret_behind(real_prefix))
                await reject(session, wrong_secret_behind(fixed_unknown))
            real, unknown = [], []
            for _ in range(300):
                real.append(await reject(session, wrong_secret_behind(real_prefix)))
                unknown.append(await reject(session, wrong_secret_behind(fixed_unknown)))
            results["cached"] = (statistics.median(real), statistics.median(unknown))
            real, unknown = [], []
            for round_number in range(200):
                # Any change to the key's row NOTIFYs every replica, which drops its cache entry.
                await connection.execute(
                    "UPDATE api_keys SET rate_limit_requests = rate_limit_requests WHERE id = $1",
                    target.key_id,
                )
                await asyncio.sleep(0.005)
                async with session.get(f"{target.url}/healthz") as response:
                    await response.read()  # both probes below find the connection equally warm
                probes = [(real, real_prefix), (unknown, unknown_prefix())]
                if round_number % 2:
                    probes.reverse()
                for samples, prefix in probes:
                    samples.append(await reject(session, wrong_secret_behind(prefix)))
            results["uncached"] = (statistics.median(real), statistics.median(unknown))
    finally:
        await connection.close()
    for mode, (real_ms, unknown_ms) in results.items():
        print(
            f"auth timing ({mode}): wrong secret, real prefix {real_ms:.3f} ms; "
            f"unknown prefix {unknown_ms:.3f} ms; difference {abs(real_ms - unknown_ms):.3f} ms"
        )
        allowed = max(0.2 * max(real_ms, unknown_ms), 0.3)
        assert abs(real_ms - unknown_ms) <= allowed, (mode, real_ms, unknown_ms)


def test_no_secret_in_the_fuzzed_gateways_log_or_metrics(
    target: Target, secret_scanner: Any
) -> None:
    secret_scanner.scan_text(requests.get(f"{target.url}/metrics", timeout=5).text, "/metrics")
    secret_scanner.scan_text(target.gateway.log_text(), "the fuzzed gateway's log")
