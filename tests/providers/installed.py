"""Provider kinds installed for a test: what pip leaves in a site-packages directory, written
directly (no build), for importlib.metadata to find on sys.path or PYTHONPATH."""

from __future__ import annotations

from pathlib import Path

__all__ = ["install"]


def install(site: Path, distribution: str, kinds: dict[str, str], modules: dict[str, str]) -> None:
    """What ``pip install`` leaves in site-packages: the modules and a dist-info with the entry
    points, which importlib.metadata reads from sys.path."""
    info = site / f"{distribution.replace('-', '_')}-1.2.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.2\n")
    lines = "".join(f"{kind} = {target}\n" for kind, target in kinds.items())
    (info / "entry_points.txt").write_text(f"[llmgw.providers]\n{lines}")
    for name, source in modules.items():
        (site / f"{name}.py").write_text(source)
