"""What is generated from the chart is current: docs/kubernetes.md's values table, and the Kustomize
base, which `kubectl kustomize` builds with the example overlay into valid objects."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.deploy.chart import validate
from tests.deploy.generate import DOC, KUSTOMIZE_BASE, docs_with_table, kustomize_base
from tests.processes import REPO_ROOT

OVERLAY = REPO_ROOT / "deploy" / "kustomize" / "overlays" / "example"


def test_the_values_table_in_the_docs_is_the_generated_one() -> None:
    text = DOC.read_text()
    assert text == docs_with_table(text), "run: python -m tests.deploy.generate"


def test_the_values_table_has_a_row_per_value_with_its_default() -> None:
    text = DOC.read_text()
    assert "| `secrets.existingSecret` | string |" in text
    assert "| `shutdown.graceSeconds` | integer | `120` |" in text
    assert '| `rateLimit.backend` | string: `postgres`, `redis` | `"postgres"` |' in text


def test_the_kustomize_base_is_the_chart_rendered() -> None:
    assert KUSTOMIZE_BASE.read_text() == kustomize_base(), "run: python -m tests.deploy.generate"
    objects = [o for o in yaml.safe_load_all(KUSTOMIZE_BASE.read_text()) if o]
    assert not [o for o in objects if o["kind"] == "Secret"], "secrets come from llmgw-secrets"
    assert list(validate(objects)) == []


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed here")
def test_the_example_overlay_builds_valid_objects() -> None:
    built = subprocess.run(
        ["kubectl", "kustomize", str(OVERLAY)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    objects = [o for o in yaml.safe_load_all(built.stdout) if o]
    assert list(validate(objects)) == []
    assert {o["metadata"].get("namespace") for o in objects} == {"llm"}
    by_kind = {o["kind"]: o for o in objects}
    deployment = by_kind["Deployment"]
    assert deployment["spec"]["replicas"] == 3
    for kind in ("Deployment", "Job"):
        container = by_kind[kind]["spec"]["template"]["spec"]["containers"][0]
        assert container["image"] == "registry.example.com/llmgw:0.1.0"
    limits = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["memory"] == "2Gi"
