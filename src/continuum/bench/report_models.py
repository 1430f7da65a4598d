"""Which model each benchmark result ran on, named as users name it (the bundled aliases)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from continuum.backends.models import CHUNKED, DEFAULT_ALIAS


def alias_of(file_name: str) -> str:
    """The alias a bundled model file goes by (results written before the default changed
    name no alias), else the file name."""
    for alias, m in CHUNKED.items():
        if m.file_name == file_name:
            return alias
    return "gemma3-270m" if file_name == "gemma-3-270m-q4_k_m.gguf" else file_name


GEMMA = "sha256:a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def model_named(d: dict[str, Any], seed: str | None) -> str:
    """The model a result ran on, next to the seed's (``seed``: "Qwen3-4B", "Azure OpenAI";
    None where the seed states no figure for it)."""
    m = (d.get("machine") or {}).get("model_path") or d.get("model") or d.get("model_digest")
    if not isinstance(m, str):
        m = "not recorded"
    name = m if m == "not recorded" else "gemma3-270m" if m == GEMMA else alias_of(Path(m).name)
    return f"Model: `{name}`" + (f" (the seed ran {seed})." if seed else " (no seed figure).")


def models_by_file(results: Path) -> list[str]:
    """Which model each result ran on (its JSON names the file or its digest), and how to
    repeat one on a model that is no longer the default."""
    by: dict[str, list[str]] = {}
    for f in sorted(results.glob("*.json")):
        d = json.loads(f.read_text())
        m = (d.get("machine") or {}).get("model_path") or d.get("model_digest")
        if isinstance(m, str):
            name = "gemma3-270m" if m == GEMMA else alias_of(Path(m).name)
            by.setdefault(name, []).append(f.stem)
    if not by:
        return []
    lines = [f"- `{name}`: {', '.join(stems)}" for name, stems in sorted(by.items())]
    return [
        "Models, by result file (a command below run without `--model` uses the default, "
        f"`{DEFAULT_ALIAS}`; add `--model ALIAS` to repeat a result made on another):",
        "",
        *lines,
        "",
    ]
