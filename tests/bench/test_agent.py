"""``continuum bench agent`` on the real fast model (Gemma 3 270M; the bench's default is Qwen):
the loop runs its steps, a session evaluates only what is new, and the table names every mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from continuum.bench.agent import (
    NAMES,
    AgentConfig,
    _next_messages,
    format_table,
    run_agent,
    tool_result,
)
from continuum.bench.plots import plot_all
from continuum.bench.report import render_report

pytestmark = pytest.mark.slow  # end to end: CI runs it, the default loop does not (pyproject.toml)


def test_a_session_evaluates_only_the_new_messages_of_each_step(tmp_path: Path) -> None:
    modes = ("session", "chat", "responses", "resend")
    r = run_agent(AgentConfig(model="gemma3-270m", reps=1, steps=4, max_tokens=8, modes=modes))
    rows = {row["mode"]: row for row in r["rows"]}
    assert list(rows) == list(modes)
    session, chat = rows["session"], rows["chat"]
    assert len(session["evaluated"]) == 4 and session["evaluated"][0] == session["prompt"][0]
    for step in (1, 2, 3):
        # the prompt grew by the last reply and a tool result; the reply's tokens were
        # resident already (all but its last), so less than that growth was decoded
        grew = session["prompt"][step] - session["prompt"][step - 1]
        assert session["evaluated"][step] < grew
        assert chat["evaluated"][step] < chat["prompt"][step]  # the prefix tier reused some
        for mode in ("responses", "resend"):  # a chain, or a full resend on a hinted session
            row = rows[mode]
            assert row["evaluated"][step] < row["prompt"][step] - row["prompt"][step - 1]
    # after previous_response_id only the new items (and the tools) go over the wire: the
    # request does not grow with the conversation, the full resend does
    wire, full = rows["responses"]["wire_bytes"], rows["resend"]["wire_bytes"]
    assert wire[2] < full[2] and full[2] - full[1] > 1000 > abs(wire[2] - wire[1])
    # a branch from step 3's reply, then the main line again: neither prefills what it shares
    for mode in ("chat", "responses"):
        fork, back = rows[mode]["fork"], rows[mode]["back"]
        assert fork["evaluated"] < 40 < fork["prompt"]
        assert back["evaluated"] < back["prompt"] - rows[mode]["prompt"][-1]
    assert "fork" not in rows["session"] and "fork" not in rows["resend"]
    table = format_table(r)
    assert "| step | prompt tokens | session evaluated |" in table and "chat TTFT" in table
    assert "responses: fork from step 3:" in table
    assert "gemma-3-270m" in table.splitlines()[0]  # the model is named on the table
    results = tmp_path / "results"
    results.mkdir()
    (results / "agent.json").write_text(json.dumps(r))
    page = render_report(results)
    assert "## Agent tool loop" in page and "continuum bench agent --reps 1 --steps 4" in page
    assert "`gemma3-270m`: agent" in page  # the model it ran on is named
    (png,) = plot_all(results, tmp_path / "docs")
    assert png.name == "agent.png" and png.read_bytes()[:4] == b"\x89PNG"


def test_a_call_written_as_text_is_sent_back_as_a_tool_call() -> None:
    call = {"name": "run_tests", "arguments": {"package": "billing"}}
    added, called = _next_messages({"role": "assistant", "content": json.dumps(call)}, 1)
    assistant, result = added
    assert called and assistant["tool_calls"][0]["function"]["name"] == "run_tests"
    assert result["role"] == "tool" and result["tool_call_id"] == assistant["tool_calls"][0]["id"]
    added, called = _next_messages({"role": "assistant", "content": "I am done."}, 2)
    assert not called and added[1]["role"] == "user" and tool_result(2) in added[1]["content"]
    assert {"read_file", "run_tests"} == NAMES


@pytest.mark.parametrize("kwargs", [{"modes": ("session", "vllm")}, {"modes": ("llama-server",)}])
def test_bad_modes_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="modes must be among"):
        run_agent(AgentConfig(model="gemma3-270m", reps=1, steps=2, **kwargs))  # type: ignore[arg-type]
