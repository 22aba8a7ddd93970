"""The Helm chart rendered by Helm's own engine (helm-python-sdk binds Helm's Go SDK; no helm
binary), as objects, and checked against the Kubernetes API's schemas."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import yaml

from tests.processes import REPO_ROOT

__all__ = [
    "CHART",
    "CRD_KINDS",
    "DATABASE_VALUES",
    "KUBERNETES_VERSION",
    "Rendered",
    "render",
    "validate",
]

CHART = REPO_ROOT / "deploy" / "helm" / "llmgw"
# The oldest Kubernetes the chart supports (Chart.yaml's kubeVersion): every built-in object is
# validated against its API schemas, strictly (an unknown field is an error).
KUBERNETES_VERSION = "1.30.0"
# Kinds of custom resources: kubernetes-validate has no schemas of those, the tests check them.
CRD_KINDS = frozenset({"HTTPRoute", "ServiceMonitor"})
DATABASE_VALUES: dict[str, Any] = {
    "secrets": {"databaseUrl": "postgresql://llmgw:s3cret-db-password@postgres:5432/llmgw"}
}


def _merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


class Rendered:
    """One release's objects, by kind and name."""

    def __init__(self, manifests: Mapping[str, str]) -> None:
        self.manifests = dict(manifests)
        self.objects: list[dict[str, Any]] = [
            document
            for path, text in sorted(manifests.items())
            if path.endswith((".yaml", ".yml"))
            for document in yaml.safe_load_all(text)
            if document
        ]

    @property
    def notes(self) -> str:
        return self.manifests.get("llmgw/templates/NOTES.txt", "")

    def kinds(self) -> list[str]:
        return sorted(o["kind"] for o in self.objects)

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.all(kind)
        assert len(found) == 1, f"{len(found)} {kind} objects"
        return found[0]

    @property
    def deployment(self) -> dict[str, Any]:
        return self.one("Deployment")

    @property
    def gateway(self) -> dict[str, Any]:
        """The gateway's container."""
        containers: list[dict[str, Any]] = self.deployment["spec"]["template"]["spec"]["containers"]
        return containers[0]

    @property
    def job(self) -> dict[str, Any]:
        return self.one("Job")

    def text(self) -> str:
        return "\n".join(self.manifests.values())


def render(values: Mapping[str, Any] | None = None, *, database: bool = True) -> Rendered:
    """The chart rendered for an install with ``values`` (and a database URL, unless not)."""
    given = _merge(DATABASE_VALUES, values or {}) if database else dict(values or {})
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(given, name="demo", namespace="llm", is_install=True)
    return Rendered(manifests)


def validate(objects: list[dict[str, Any]]) -> Iterator[str]:
    """Each object's problems against the Kubernetes API schemas (none: nothing yielded)."""
    for obj in objects:
        if obj["kind"] in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            yield f"{obj['kind']}/{obj['metadata']['name']}: {exc.message} at {list(exc.path)}"


def chart_metadata(path: Path = CHART) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((path / "Chart.yaml").read_text())
    return loaded
