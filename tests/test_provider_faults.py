"""A route of two deployments against fakes that break on purpose, through a real gateway process.

One fault per test: what the caller received, and what each provider saw (its attempts, their
spacing, the model asked). The gateway reads a providers file with small timeouts on ``primary``
(so no test waits for long), and ``backup`` answers whatever ``primary`` fails; each fake runs on
its own loop in a thread so the gateway process and the fakes outlive each test's loop.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from tests.conftest import GatewayProcess, gateway_env, serving
from tests.fake_venice import Behaviour, ReceivedRequest, ThreadedFakeVenice
from tests.test_faults import billing_record, mint_key

MESSAGES = [{"role": "user", "content": "hi"}]
PRIMARY_TEXT = "Hello from primary!"
BACKUP_TEXT = "Hello from backup!"
REQUEST_TIMEOUT = 5.0
FIRST_TOKEN_TIMEOUT = 1.0
STALL_TIMEOUT = 1.0
CONNECT_TIMEOUT = 0.3
# What the providers file gives primary: the first retry 0.1-0.2 s later, the second 0.2-0.4 s.
FIRST_BACKOFF, SECOND_BACKOFF = 0.1, 0.2
CONTEXT_TOO_LONG = orjson.dumps(
    {
        "error": {
            "message": "This model's maximum context length is 8192 tokens. However, your "
            "messages resulted in 8227 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
)
POLICY = "Your prompt violates the content policy of Venice.ai or the model provider"


@pytest.fixture(scope="module")
def fakes() -> Iterator[tuple[ThreadedFakeVenice, ThreadedFakeVenice]]:
    primary = ThreadedFakeVenice(reply=PRIMARY_TEXT)
    backup = ThreadedFakeVenice(reply=BACKUP_TEXT)
    yield primary, backup
    primary.close()
    backup.close()


@pytest.fixture(scope="module")
def no_connection() -> Iterator[int]:
    """A port whose host takes no connection: its accept queue is full, so the kernel drops
    every SYN, as a firewall or a dead host does (a connect that is never refused, only silent)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    queued = []
    for _ in range(3):
        client = socket.socket()
        client.setblocking(False)
        client.connect_ex(("127.0.0.1", port))
        queued.append(client)
    yield port
    for client in queued:
        client.close()
    listener.close()


# One gateway serves every test, and each test's fault is its own: a breaker opened by the faults
# of the tests before must not decide where this one's requests go (tests/routing covers breakers).
NO_BREAKER = "circuit_cooldown_seconds = 0.001"


def providers_file(primary: str, backup: str, no_connection: int) -> str:
    return f"""
[[providers]]
name = "primary"
kind = "venice"
base_url = "{primary}"
api_key_env = "VENICE_API_KEY"
max_retries = 2
connect_timeout_seconds = {CONNECT_TIMEOUT}
first_token_timeout_seconds = {FIRST_TOKEN_TIMEOUT}
stall_timeout_seconds = {STALL_TIMEOUT}
{NO_BREAKER}

[[providers]]
name = "patient"   # primary's server, with the production defaults
kind = "venice"
base_url = "{primary}"
api_key_env = "VENICE_API_KEY"
{NO_BREAKER}

[[providers]]
name = "limited"   # primary's server, for the 429 whose Retry-After opens its breaker
kind = "venice"
base_url = "{primary}"
api_key_env = "VENICE_API_KEY"

[[providers]]
name = "backup"
kind = "venice"
base_url = "{backup}"
api_key_env = "VENICE_API_KEY"

[[providers]]
name = "nowhere"
kind = "openai-compatible"
base_url = "http://127.0.0.1:{no_connection}/v1"
connect_timeout_seconds = {CONNECT_TIMEOUT}
{NO_BREAKER}

[[models]]
alias = "fast"
deployments = ["primary:qwen3-5-9b", "backup:llama-3.3-70b"]

[[models]]
alias = "alone"   # primary is the last deployment: the only one retried (issue 29 item 6)
deployments = ["primary:qwen3-5-9b"]

[[models]]
alias = "twice"
deployments = ["primary:qwen3-5-9b", "primary:llama-3.3-70b", "backup:llama-3.3-70b"]

[[models]]
alias = "window"
deployments = ["primary:qwen3-5-9b", "backup:qwen3-5-9b", "backup:llama-3.3-70b"]

[[models]]
alias = "far"
deployments = ["nowhere:gpt-4o-mini", "backup:llama-3.3-70b"]

[[models]]
alias = "limited"
deployments = ["limited:qwen3-5-9b", "backup:llama-3.3-70b"]

[[models]]
alias = "shared"
deployments = ["patient:qwen3-5-9b", "backup:llama-3.3-70b"]
"""


@pytest.fixture(scope="module")
def served(
    fakes: tuple[ThreadedFakeVenice, ThreadedFakeVenice],
    no_connection: int,
    database_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[GatewayProcess, str]]:
    primary, backup = fakes
    folder: Path = tmp_path_factory.mktemp("provider-faults")
    config = folder / "llmgw.toml"
    config.write_text(providers_file(primary.base_url, backup.base_url, no_connection))
    key = asyncio.run(mint_key(database_url, "provider-faults", 10_000))
    env = gateway_env(
        database_url,
        primary.base_url,
        LLMGW_CONFIG=str(config),
        REQUEST_TIMEOUT_SECONDS=str(REQUEST_TIMEOUT),
    )
    with serving(env, folder / "gateway.log") as gateway:
        yield gateway, key


@pytest.fixture
def gateway(served: tuple[GatewayProcess, str], secret_scanner: Any) -> Iterator[GatewayProcess]:
    """The shared gateway; after each test its log has no traceback and no error line."""
    yield from served[0].watched(secret_scanner, "the provider faults gateway's log")


@pytest.fixture
def primary(fakes: tuple[ThreadedFakeVenice, ThreadedFakeVenice]) -> Iterator[ThreadedFakeVenice]:
    fakes[0].reset()
    yield fakes[0]
    fakes[0].reset()


@pytest.fixture
def backup(fakes: tuple[ThreadedFakeVenice, ThreadedFakeVenice]) -> Iterator[ThreadedFakeVenice]:
    fakes[1].reset()
    yield fakes[1]
    fakes[1].reset()


@pytest.fixture
async def client(
    served: tuple[GatewayProcess, str], gateway: GatewayProcess
) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=f"{gateway.url}/v1", api_key=served[1], max_retries=0, timeout=15
    ) as client:
        yield client


async def ask(
    client: openai.AsyncOpenAI, model: str, *, stream: bool = False
) -> tuple[str, str, float]:
    """The answer's text, the request id and the seconds it took."""
    request_id = uuid.uuid4().hex
    headers = {"X-Request-Id": request_id}
    started = time.monotonic()
    if stream:
        chunks = await client.chat.completions.create(
            model=model, messages=MESSAGES, stream=True, extra_headers=headers
        )
        text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
    else:
        completion = await client.chat.completions.create(
            model=model, messages=MESSAGES, extra_headers=headers
        )
        text = completion.choices[0].message.content or ""
    return text, request_id, time.monotonic() - started


def chats(fake: ThreadedFakeVenice) -> list[ReceivedRequest]:
    return [r for r in fake.received() if r.path.endswith("/chat/completions")]


def gaps(received: list[ReceivedRequest]) -> list[float]:
    return [later.at - earlier.at for earlier, later in itertools.pairwise(received)]


async def answered_by(gateway: GatewayProcess, request_id: str) -> str:
    return str((await billing_record(gateway, request_id))["deployment"])


# Rate limits -------------------------------------------------------------------------------------


async def test_a_429_retry_after_is_waited_for_then_the_same_deployment_answers(
    gateway: GatewayProcess,
    client: openai.AsyncOpenAI,
    primary: ThreadedFakeVenice,
    backup: ThreadedFakeVenice,
) -> None:
    primary.enqueue(Behaviour(status=429, retry_after="1"))
    text, request_id, _ = await ask(client, "alone")
    assert text == PRIMARY_TEXT
    (gap,) = gaps(chats(primary))
    assert gap >= 1.0, "the provider's Retry-After was honoured"
    assert chats(backup) == []
    assert await answered_by(gateway, request_id) == "primary:qwen3-5-9b"


@pytest.mark.parametrize(
    "refusal",
    [Behaviour(status=429, retry_after="30"), Behaviour(status=429)],
    ids=["retry-after", "reset-window"],
)
async def test_a_429_wait_longer_than_the_budget_moves_on_at_once(
    gateway: GatewayProcess,
    client: openai.AsyncOpenAI,
    primary: ThreadedFakeVenice,
    backup: ThreadedFakeVenice,
    refusal: Behaviour,
) -> None:
    # Without Retry-After, Venice's 429 still says when its window resets (60 s here).
    primary.enqueue(refusal)
    # A Retry-After opens the deployment's breaker for that long: on a route no other test uses.
    alias = "fast" if refusal.retry_after is None else "limited"
    text, request_id, took = await ask(client, alias)
    assert text == BACKUP_TEXT
    assert took < 1.5, "no wait that the budget could not afford"
    assert len(chats(primary)) == 1
    assert [r.json["model"] for r in chats(backup)] == ["llama-3.3-70b"]
    assert await answered_by(gateway, request_id) == "backup:llama-3.3-70b"
    if refusal.retry_after is not None:
        # Its Retry-After opened the deployment's breaker for 30 s: not asked again meanwhile.
        assert (await ask(client, alias))[0] == BACKUP_TEXT
        assert len(chats(primary)) == 1


async def test_a_429_without_any_hint_is_retried_after_a_backoff(
    gateway: GatewayProcess, client: openai.AsyncOpenAI, primary: ThreadedFakeVenice
) -> None:
    primary.enqueue(Behaviour(status=429, rate_limit_headers=False))
    text, _, _ = await ask(client, "alone")
    assert text == PRIMARY_TEXT
    (gap,) = gaps(chats(primary))
    assert gap >= FIRST_BACKOFF


# Transient failures --------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_500_once_is_retried_on_the_last_deployment(
    gateway: GatewayProcess, client: openai.AsyncOpenAI, primary: ThreadedFakeVenice, stream: bool
) -> None:
    primary.enqueue(Behaviour(status=500))
    text, request_id, _ = await ask(client, "alone", stream=stream)
    assert text == PRIMARY_TEXT
    (gap,) = gaps(chats(primary))
    assert gap >= FIRST_BACKOFF
    assert await answered_by(gateway, request_id) == "primary:qwen3-5-9b"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_500_moves_on_at_once_when_another_deployment_is_left(
    gateway: GatewayProcess,
    client: openai.AsyncOpenAI,
    primary: ThreadedFakeVenice,
    backup: ThreadedFakeVenice,
    stream: bool,
) -> None:
    primary.enqueue(Behaviour(status=500))
    text, request_id, _ = await ask(client, "fast", stream=stream)
    assert text == BACKUP_TEXT
    assert len(chats(primary)) == 1, "a failing deployment is not retried while another is left"
    assert await answered_by(gateway, request_id) == "backup:llama-3.3-70b"


async def test_an_overload_on_the_last_deployment_is_retried_after_a_growing_backoff(
    gateway: GatewayProcess, client: openai.AsyncOpenAI, primary: ThreadedFakeVenice
) -> None:
    primary.behave(Behaviour(status=503))
    with pytest.raises(openai.InternalServerError):
        await ask(client, "alone")
    first, second = gaps(chats(primary))  # three attempts: max_retries = 2
    assert first >= FIRST_BACKOFF
    assert second >= SECOND_BACKOFF
    # Its breaker opened: the next request is its probe, which closes it for the tests after.
    primary.behave(Behaviour())
    assert (await ask(client, "alone"))[0] == PRIMARY_TEXT


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_reset_before_the_headers_is_retried(
    gateway: GatewayProcess,
    client: openai.AsyncOpenAI,
    primary: ThreadedFakeVenice,
    backup: ThreadedFakeVenice,
    stream: bool,
) -> None:
    primary.enqueue(Behaviour(reset_before_headers=True))
    text, _, _ = await ask(client, "alone", stream=stream)
    assert text == PRIMARY_TEXT
    (gap,) = gaps(chats(primary))
    assert gap >= FIRST_BACKOFF
    assert chats(backup) == []


# Silence ---------------------------------------------------------------------------------------------


async def test_a_host_that_takes_no_connection_is_left_after_the_connect_timeout(
    gateway: GatewayProcess, client: openai.AsyncOpenAI, backup: ThreadedFakeVenice
) -> None:
    text, request_id, took = await ask(client, "far")
    assert text == BACKUP_TEXT
    assert CONNECT_TIMEOUT <= took < CONNECT_TIMEOUT + 1.0, "one connect timeout, no retry"
    assert await answered_by(gateway, request_id) == "backup:llama-3.3-70b"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_no_answer_at_all_moves_on_and_the_silent_provider_is_not_asked_again(
    gateway: GatewayProcess,
    client: openai.AsyncOpenAI,
    primary: ThreadedFakeVenice,
    backup: ThreadedFakeVenice,
    stream: bool,
) -> None:
    primary.behave(Behaviour(delay_before_headers=10))
    text, request_id, took = await ask(client, "twice", stream=stream)
    assert text == BACKUP_TEXT
    assert FIRST_TOKEN_TIMEOUT <= took < FIRST_TOKEN_TIMEOUT + 1.0
    assert len(chats(primary)) == 1, "neither retried nor asked for its second model"
    assert [r.json["model"] for r in chats(backup)] == ["llama-3.3-70b"]
    assert await answered_by(gateway, request_id) == "backup:llama-3.3-70b"


async def test_a_first_token_later_than_its_timeout_moves_on(
    gateway: GatewayProcess,
    client: openai.AsyncOpenAI,
    primary: ThreadedFakeVenice,
    backup: ThreadedFakeVenice,
) -> None:
    primary.enqueue(Behaviour(first_event_delay=3))  # headers at once, then nothing for 3 s
    text, request_id, took = await ask(client, "fast", stream=True)
    assert text == BACKUP_TEXT
    assert FIRST_TOKEN_TIMEOUT <= took < FIRST_TOKEN_TIMEOUT + 1.0
    assert len(chats(primary)) == 1
    assert await answered_by(gateway, request_id) == "backup:llama-3.3-70b"


async def test_a_first_token_within_its_timeout_is_waited_for(
    gateway: GatewayProcess,
    client: openai.AsyncOpenAI,
    primary: ThreadedFakeVenice,
    backup: ThreadedFakeVenice,
) -> None:
    primary.enqueue(Behaviour(first_event_delay=FIRST_TOKEN_TIMEOUT / 3))
    text, _, _ = await ask(client, "fast", stream=True)
    assert text == PRIMARY_TEXT
    assert chats(backup) == []


async def test_a_silent_deployment_leaves_the_next_one_its_share_of_the_budget(
    gateway: GatewayProcess,
    client: openai.AsyncOpenAI,
    primary: ThreadedFakeVenice,
    backup: ThreadedFakeVenice,
) -> None:
    # "patient" has the production timeouts (a minute to the first byte), yet with two
    # deployments it may only use half of the request's budget.
    primary.behave(Behaviour(delay_before_headers=10))
    text, _, took = await ask(client, "shared")
    assert text == BACKUP_TEXT
    assert REQUEST_TIMEOUT / 2 - 0.2 <= took < REQUEST_TIMEOUT / 2 + 1.0
    assert len(chats(primary)) == 1


async def test_a_stall_mid_stream_is_detected_within_the_stall_timeout_and_the_answer_finished(
    gateway: GatewayProcess, client: openai.AsyncOpenAI, primary: ThreadedFakeVenice
) -> None:
    primary.enqueue(Behaviour(stall_after_chunks=2))
    text, _, took = await ask(client, "primary/qwen3-5-9b", stream=True)
    # The only deployment is asked again once the stall is noticed (not after the whole request
    # timeout), and the caller gets the one whole answer (streaming.continuation).
    assert text == PRIMARY_TEXT
    assert took < STALL_TIMEOUT + 1.0, "not the whole request timeout"
    asked = chats(primary)
    assert len(asked) == 2
    assert STALL_TIMEOUT - 0.2 <= gaps(asked)[0] < STALL_TIMEOUT + 1.0


# Answers another deployment may not give, or no deployment should ---------------------------------


async def test_context_length_exceeded_moves_on_to_a_larger_model_never_the_same_one(
    gateway: GatewayProcess,
    client: openai.AsyncOpenAI,
    primary: ThreadedFakeVenice,
    backup: ThreadedFakeVenice,
) -> None:
    primary.enqueue(Behaviour(status=400, error_body=CONTEXT_TOO_LONG))
    text, request_id, _ = await ask(client, "window")
    assert text == BACKUP_TEXT
    assert len(chats(primary)) == 1
    # "backup:qwen3-5-9b" is the same model, with the same window: skipped.
    assert [r.json["model"] for r in chats(backup)] == ["llama-3.3-70b"]
    assert await answered_by(gateway, request_id) == "backup:llama-3.3-70b"


async def test_a_content_policy_refusal_reaches_the_caller_with_its_reason_and_is_not_retried(
    gateway: GatewayProcess,
    client: openai.AsyncOpenAI,
    primary: ThreadedFakeVenice,
    backup: ThreadedFakeVenice,
) -> None:
    primary.enqueue(Behaviour(status=422, error_body=orjson.dumps({"error": POLICY})))
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        await ask(client, "fast")
    assert caught.value.response.json() == {"error": POLICY}
    assert len(chats(primary)) == 1
    assert chats(backup) == []


async def test_a_primary_down_for_a_while_then_healthy(
    gateway: GatewayProcess,
    client: openai.AsyncOpenAI,
    primary: ThreadedFakeVenice,
    backup: ThreadedFakeVenice,
) -> None:
    primary.stop_serving()
    try:
        for _ in range(2):
            text, request_id, took = await ask(client, "fast")
            assert text == BACKUP_TEXT
            assert took < 1.5, "refused connections: two short backoffs, then the backup"
            assert await answered_by(gateway, request_id) == "backup:llama-3.3-70b"
    finally:
        primary.start_serving()
    text, request_id, _ = await ask(client, "fast")
    assert text == PRIMARY_TEXT
    assert len(chats(primary)) == 1
    assert await answered_by(gateway, request_id) == "primary:qwen3-5-9b"
