"""CLI fields beyond what the database holds are refused by argparse: exit 2, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.processes import clean_env

OUT_OF_RANGE = [
    ("keys", "create", "--name", "x", "--rate-limit-requests", str(2**31)),
    ("keys", "create", "--name", "x", "--rate-limit-window-seconds", str(10**20)),
    ("keys", "create", "--name", "x", "--tokens-per-minute", str(2**31)),
    ("keys", "create", "--name", "x", "--expires-at", "9999-12-31T23:59:59-23:00"),
    ("keys", "rotate", "llmg_abcdefg", "--grace-seconds", "1e12"),
    ("keys", "rotate", "llmg_abcdefg", "--grace-seconds", "nan"),
    ("keys", "rotate", "llmg_abcdefg", "--grace-seconds", "-1"),
    ("usage", "prune", "--older-than-days", str(10**9)),
]


@pytest.mark.parametrize("args", OUT_OF_RANGE, ids=lambda args: " ".join(args[:2] + args[-2:]))
def test_out_of_range_fields_exit_2_naming_the_field(args: tuple[str, ...]) -> None:
    # No database is needed: argparse refuses the value before anything connects.
    result = subprocess.run(
        [sys.executable, "-m", "llmgw", *args],
        env=clean_env(DATABASE_URL="postgresql://nobody@127.0.0.1:1/none"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert args[-2] in result.stderr


@pytest.mark.parametrize(
    "args", [("--to", "0001-01-01"), ("--from", "0001-01-01", "--to", "0001-01-02")]
)
def test_report_days_out_of_range_exit_2(args: tuple[str, ...]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "llmgw", "usage", "report", *args],
        env=clean_env(DATABASE_URL="postgresql://nobody@127.0.0.1:1/none"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "must be between 1970-01-01 and 9999-12-30" in result.stderr
