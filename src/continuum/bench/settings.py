"""What the benchmarks share in their settings: the model, its threads, the runs per mode, and
the llama-server binary compared against.

A benchmark's config extends these (:class:`continuum.bench.agent.AgentConfig`...), and its
command is generated from the config (:mod:`continuum.cli.settings_options`), so a knob is
declared once, with its default, bounds and help, for both the command line and the code that
runs it.
"""

from __future__ import annotations

from continuum.backends.models import MODEL_HELP
from continuum.settings import Settings, setting

LLAMA_SERVER_HELP = (
    "A llama-server binary to compare against as well (same model file and threads)."
)


class BenchModel(Settings):
    """The model a benchmark runs (the CLI's ``--model``)."""

    model: str | None = setting(None, MODEL_HELP, flags=("--model", "-m"), envvar="CONTINUUM_MODEL")


class BenchSettings(BenchModel):
    """The model, its threads, and how many runs of each mode a benchmark times."""

    threads: int | None = setting(
        None,
        "Threads for decode and prompt processing (default: all visible cores).",
        flags=("--threads", "-t"),
        ge=1,
    )
    reps: int = setting(3, "Runs per mode.", ge=1)


class PeerSettings(BenchSettings):
    """A benchmark that can run llama-server beside continuum."""

    llama_server: str | None = setting(None, LLAMA_SERVER_HELP, exists=True)


__all__ = ["LLAMA_SERVER_HELP", "BenchModel", "BenchSettings", "PeerSettings"]
