"""Golden files of the translations: each JSON file under ``data/`` holds a case's input and its
``expected`` output. ``LLMGW_UPDATE_GOLDEN=1 pytest tests/translation`` rewrites ``expected`` from
the code; the diff is then reviewed like any other change."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"
UPDATE = os.environ.get("LLMGW_UPDATE_GOLDEN") == "1"


def cases(kind: str) -> list[Path]:
    """The case files of ``data/<kind>``."""
    return sorted((DATA / kind).glob("*.json"))


def check_golden(path: Path, actual: Any) -> None:
    document = json.loads(path.read_text())
    if UPDATE:
        document["expected"] = actual
        path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    assert "expected" in document, f"{path.name} has no expected output yet"
    assert actual == document["expected"]


def load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document
