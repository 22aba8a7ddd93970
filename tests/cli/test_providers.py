"""``llmgw providers`` lists every installed kind with where it comes from and its default
capabilities; a plugin that cannot be loaded is listed with the reason, not a traceback."""

from __future__ import annotations

from pathlib import Path

from tests.processes import clean_env, run_llmgw
from tests.providers.installed import install


def test_the_installed_kinds_are_listed_with_a_broken_one_s_reason(tmp_path: Path) -> None:
    install(
        tmp_path,
        "llmgw-half-done",
        {"half": "llmgw_half_done:PLUGIN"},
        {"llmgw_half_done": "raise RuntimeError('not finished')\n"},
    )
    run = run_llmgw("providers", env=clean_env(PYTHONPATH=str(tmp_path)))
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    rows = [line.split(maxsplit=3) for line in run.stdout.splitlines()]
    assert rows[0] == ["KIND", "FROM", "DEFAULT", "CAPABILITIES"]
    assert [row[0] for row in rows[1:]] == [
        "anthropic",
        "azure-openai",
        "bedrock",
        "gemini",
        "half",
        "openai-compatible",
        "venice",
        "vertex",
    ]
    assert rows[5][1:3] == ["llmgw-half-done", "1.2"]
    assert "failed to load: RuntimeError: not finished" in rows[5][3]
    [venice] = [row for row in rows if row[0] == "venice"]
    assert venice[1] == "llmgw" and venice[3].startswith("reasoning ")
