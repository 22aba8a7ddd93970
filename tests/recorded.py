"""Recorded Venice traffic in ../shared/venice/recorded (read in place: it may not be copied here)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import yaml

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
RECORDED = SHARED / "venice" / "recorded"


def recorded_exchanges(relative: str) -> list[dict[str, Any]]:
    """Every request/answer pair of one cassette; skips the test when the recordings are absent."""
    if not SHARED.is_dir():
        pytest.skip(f"recorded Venice traffic not available at {SHARED}")
    return list(yaml.safe_load_all((RECORDED / relative).read_text()))


def recorded_answer(relative: str) -> tuple[int, str]:
    """Status and body of a cassette's (first) answer."""
    then = recorded_exchanges(relative)[0]["then"]
    return then["status"], then["body"]


@functools.cache
def recorded_streams() -> dict[str, bytes]:
    """Every recorded 200 event stream by ``file#n``; empty when the recordings are absent."""
    streams: dict[str, bytes] = {}
    if not RECORDED.is_dir():
        return streams
    for path in sorted(RECORDED.rglob("*.yaml")):
        for index, exchange in enumerate(yaml.safe_load_all(path.read_text())):
            then = exchange["then"]
            headers = {h["name"].lower(): h["value"] for h in then.get("header") or []}
            if then["status"] == 200 and "event-stream" in headers.get("content-type", ""):
                streams[f"{path.relative_to(RECORDED)}#{index}"] = then["body"].encode()
    return streams
