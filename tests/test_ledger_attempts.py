"""A true ledger (issue 29, item 5): a usage row names the deployment and model the answer's last
bytes came from (and, for a continued stream, where it started), lists every upstream attempt
with how it ended, counts them all, and costs what each attempt that produced tokens cost.

Real sockets: the gateway in front of two fake Venices; the rows read from Postgres and through
the admin API.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import Gateway
from tests.fake_openai import providers_settings
from tests.fake_venice import FAKE_VENICE_KEY, Behaviour, FakeVenice
from tests.test_stream_continuation import MESSAGES, MODEL, REPLY, ledger_row, provider

OTHER = "llama-3.3-70b"  # the second deployment's model: its answers name it
ADMIN_TOKEN = "ledger-attempts-admin-token-0123456789"


@pytest.fixture
async def second() -> AsyncIterator[FakeVenice]:
    """The deployment after the first: it continues a prefill, as a prefill model does."""
    async with FakeVenice(reply=REPLY, chunks=60) as fake:
        fake.continues_prefill = True
        yield fake


@pytest.fixture
async def gateway(
    start_gateway: Any, tmp_path: Path, fake_venice: FakeVenice, second: FakeVenice
) -> Gateway:
    fake_venice.reply, fake_venice.chunks = REPLY, 60
    # The first is priced by the operator (it breaks before reporting a cost); the second reports
    # its own.
    toml = provider("first", fake_venice, prefill=False).rstrip() + "\n"
    toml += "input_usd_per_mtok = 1.0\noutput_usd_per_mtok = 2.0\n\n"
    toml += provider("prefill", second, prefill=True)
    toml += f'[[models]]\nalias = "mixed"\ndeployments = ["first:{MODEL}", "prefill:{OTHER}"]\n\n'
    settings = providers_settings(tmp_path, toml, VENICE_API_KEY=FAKE_VENICE_KEY)
    started: Gateway = await start_gateway(admin_token=ADMIN_TOKEN, **settings)
    return started


@pytest.fixture
async def key(gateway: Gateway) -> str:
    return await gateway.create_key(name="ledger")


async def post(gateway: Gateway, key: str, **body: Any) -> tuple[str, bytes]:
    """The request id the gateway gave the request, and the answer's body."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url("/v1/chat/completions"),
            json={"model": "mixed", "messages": MESSAGES, **body},
            headers={"Authorization": f"Bearer {key}"},
        ) as response,
    ):
        assert response.status == 200
        return response.headers["X-Request-Id"], await response.read()


async def admin_view(gateway: Gateway, request_id: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            gateway.url(f"/admin/v1/usage/requests/{request_id}"),
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as response,
    ):
        assert response.status == 200, await response.text()
        shown: dict[str, Any] = await response.json()
    return shown


async def test_a_continued_stream_s_row_names_the_deployment_and_model_that_finished_it(
    gateway: Gateway, key: str, fake_venice: FakeVenice, second: FakeVenice
) -> None:
    fake_venice.enqueue(Behaviour(drop_after_chunks=40))
    request_id, body = await post(gateway, key, stream=True)
    assert body.endswith(b"data: [DONE]\n\n")
    row = await ledger_row(gateway)
    assert row["deployment"] == f"prefill:{OTHER}"
    assert row["response_model"] == OTHER, "the model of the answer's last bytes"
    assert row["started_deployment"] == f"first:{MODEL}"
    assert row["attempts"] == 2
    broke, finished = orjson.loads(row["attempt_log"])
    assert (broke["deployment"], broke["ended"], broke["error"]) == (
        f"first:{MODEL}",
        "broke",
        "upstream_stream_interrupted",
    )
    assert broke["response_model"] == MODEL
    assert broke["estimated"] is True, "it broke before reporting its usage"
    assert (finished["deployment"], finished["ended"], finished["status"]) == (
        f"prefill:{OTHER}",
        "completed",
        200,
    )
    assert finished["estimated"] is False
    # The row counts what every attempt produced, and costs what each cost.
    assert row["output_tokens"] == broke["output_tokens"] + finished["output_tokens"]
    assert row["input_tokens"] == broke["input_tokens"] + finished["input_tokens"]
    priced = (broke["input_tokens"] * 1.0 + broke["output_tokens"] * 2.0) / 1e6
    assert broke["cost_usd"] == pytest.approx(priced), "at its own deployment's price"
    assert finished["cost_usd"] > 0, "as its provider reported it"
    assert float(row["cost_usd"]) == pytest.approx(broke["cost_usd"] + finished["cost_usd"])
    # The providers' extras are what they reported: the broken attempt reported none.
    extras = orjson.loads(row["provider_extras"])
    assert extras == {"venice.cost.usd": finished["cost_usd"], "venice.cost.diem": 0}
    shown = await admin_view(gateway, request_id)
    [seen] = shown["data"]
    assert seen["attempt_log"] == [broke, finished]
    assert seen["provider_extras"] == extras
    assert (seen["deployment"], seen["started_deployment"]) == (
        f"prefill:{OTHER}",
        f"first:{MODEL}",
    )


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_failed_over_request_s_row_lists_the_attempt_that_failed(
    gateway: Gateway, key: str, fake_venice: FakeVenice, second: FakeVenice, stream: bool
) -> None:
    fake_venice.enqueue(Behaviour(status=503))
    request_id, _ = await post(gateway, key, stream=stream)
    row = await ledger_row(gateway)
    assert (row["deployment"], row["response_model"], row["started_deployment"]) == (
        f"prefill:{OTHER}",
        OTHER,
        None,
    )
    assert row["attempts"] == 2
    failed, answered = orjson.loads(row["attempt_log"])
    assert (failed["deployment"], failed["ended"], failed["status"], failed["error"]) == (
        f"first:{MODEL}",
        "failed",
        503,
        "503",
    )
    assert failed["output_tokens"] is None and failed["cost_usd"] is None, "it produced nothing"
    assert (answered["deployment"], answered["ended"], answered["status"]) == (
        f"prefill:{OTHER}",
        "completed",
        200,
    )
    assert answered["output_tokens"] == row["output_tokens"]
    assert float(row["cost_usd"]) == pytest.approx(answered["cost_usd"])
    [seen] = (await admin_view(gateway, request_id))["data"]
    assert seen["attempt_log"] == [failed, answered]
    assert seen["attempts"] == 2


async def test_a_request_answered_at_once_lists_its_one_attempt(gateway: Gateway, key: str) -> None:
    await post(gateway, key)
    row = await ledger_row(gateway)
    [answered] = orjson.loads(row["attempt_log"])
    assert (answered["deployment"], answered["ended"], row["attempts"]) == (
        f"first:{MODEL}",
        "completed",
        1,
    )
    assert row["response_model"] == MODEL


async def test_the_usage_of_an_unknown_request_is_a_404(gateway: Gateway) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            gateway.url("/admin/v1/usage/requests/no-such-request"),
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as response,
    ):
        assert response.status == 404
        assert (await response.json())["error"]["type"]
