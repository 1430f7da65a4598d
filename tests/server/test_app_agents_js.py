"""A second language's client: the OpenAI Agents SDK for JavaScript (``@openai/agents``, run by
``node``) drives a two-tool agent against a real ``continuum serve`` (in-process, 127.0.0.1, the
default model Qwen2.5-Coder-0.5B-Instruct, no mocks), over the Responses API with the SDK's
default ``OpenAIResponsesModel`` and over Chat Completions with ``OpenAIChatCompletionsModel``,
each given an ``OpenAI`` client whose ``baseURL`` is this server, plain and streamed.

The agent (``tests/server/js/agents_two_tools.mjs``) makes the choices the Python Agents SDK
tests make (``tests/server/test_responses_frameworks.py``): ``required`` tool choice with one call
per turn, the next turn naming the tool that has not run, a tool-use behaviour that ends the
run once both ran, and a turn cap. It prints one JSON line: the tools that ran and with what,
the final output, the usage the SDK saw, and what it sent.

The packages are installed, pinned, from the npm registry into a temporary prefix once per
module: a registry that cannot be reached fails the module (this is a client the server claims
to serve, not an optional extra). Nothing may leave the machine: the script disables the SDK's
tracing (which exports to api.openai.com) and refuses, and reports, every fetch or socket to a
host other than loopback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.frameworks import BOTH, MODEL, TIME, WEATHER
from tests.server.test_app import Running, _serve

pytestmark = pytest.mark.slow  # end to end: CI runs it, the default loop does not (pyproject.toml)

SCRIPT = Path(__file__).parent / "js" / "agents_two_tools.mjs"
# openai is the SDK's own dependency (^7.2.0) and zod its peer: pinned too, so the run is
# reproducible; openai 7 declares node >= 22 but runs on the node 20 installed here
PACKAGES = {"@openai/agents": "0.20.0", "openai": "7.60.0", "zod": "4.6.7"}
ENDPOINT = {"responses": "/v1/responses", "chat": "/v1/chat/completions"}


def _tool(name: str, api: str) -> dict[str, Any]:
    """A named ``tool_choice`` as each API spells it."""
    if api == "chat":
        return {"type": "function", "function": {"name": name}}
    return {"type": "function", "name": name}


@pytest.fixture(scope="module")
def agents_js(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The script, copied next to a ``node_modules`` holding the pinned packages (ESM resolves
    bare imports from the importing file's directory up; ``NODE_PATH`` is not consulted)."""
    npm = shutil.which("npm")
    assert npm is not None and shutil.which("node") is not None, "node and npm are required"
    prefix = tmp_path_factory.mktemp("agents_js")
    specs = [f"{name}@{version}" for name, version in PACKAGES.items()]
    install = [npm, "install", "--no-save", "--no-audit", "--no-fund", "--ignore-scripts"]
    done = subprocess.run(
        [*install, "--prefix", str(prefix), *specs],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"npm install {' '.join(specs)} failed:\n{done.stderr}"
    for name, version in PACKAGES.items():
        manifest = json.loads((prefix / "node_modules" / name / "package.json").read_text())
        assert manifest["version"] == version, (name, manifest["version"])
    # one copy of openai: the SDK's model classes take the client the script built from it
    assert not list(prefix.glob("node_modules/**/node_modules/openai")), "a second openai"
    script = prefix / SCRIPT.name
    shutil.copyfile(SCRIPT, script)
    return script


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    yield from _serve(tmp_path_factory.mktemp("agents_js_srv"), model=MODEL, default_max_tokens=32)


def _run_agent(script: Path, srv: Running, api: str, stream: bool) -> dict[str, Any]:
    env = {
        **os.environ,
        "OPENAI_AGENTS_DISABLE_TRACING": "1",
        "OPENAI_API_KEY": "x",  # never a real key: every request goes to this server
    }
    env.pop("OPENAI_BASE_URL", None)
    args = ["--base-url", srv.url + "/v1", "--model", srv.state.model_id, "--api", api]
    args += ["--stream"] if stream else []
    done = subprocess.run(
        ["node", str(script), *args],
        cwd=script.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # a hung run fails instead of blocking the suite; not a speed assertion
        check=False,
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 1, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    out: dict[str, Any] = json.loads(lines[0])
    assert done.returncode == 0 and "error" not in out, (
        f"{json.dumps(out, indent=1)}\nstderr:\n{done.stderr}"
    )
    return out


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("api", ["responses", "chat"])
def test_js_agents_sdk_runs_both_tools_and_finishes(
    agents_js: Path, srv: Running, api: str, stream: bool
) -> None:
    out = _run_agent(agents_js, srv, api, stream)
    assert out["offline"] == [], "something tried to reach the network"

    # both tools ran, once each, on the city asked about, and the stop rule ended the run
    ran = sorted(out["ran"], key=lambda r: r["name"])
    assert [r["name"] for r in ran] == ["get_time", "get_weather"], out["ran"]
    assert [r["args"] for r in ran] == [{"city": "Paris"}] * 2, out["ran"]
    assert [r["output"] for r in ran] == [TIME, WEATHER]
    assert out["completed"] is True and out["final_output"] == BOTH
    assert out["new_items"].count("tool_call_item") == 2, out["new_items"]
    assert out["new_items"].count("tool_call_output_item") == 2, out["new_items"]

    # two model turns, each one forced call: the first any tool, the second the other one
    first, second = out["requests"]
    assert [r["path"] for r in out["requests"]] == [ENDPOINT[api]] * 2
    assert [r["status"] for r in out["requests"]] == [200, 200]
    assert [r["stream"] for r in out["requests"]] == [stream, stream]
    assert first["tool_choice"] == "required"
    assert second["tool_choice"] == _tool(out["ran"][1]["name"], api)
    assert len(out["responses"]) == 2
    if stream:  # the SDK parsed each turn's events to the end of its stream
        assert out["events"].count("response_done") == 2, out["events"]
        assert out["events"].count("tool_call_item") == 2, out["events"]

    # the usage the server reported reached the SDK, per response and summed over the run
    per = [r["usage"] for r in out["responses"]]
    assert all(u["input_tokens"] > 0 and u["output_tokens"] > 0 for u in per), per
    # the second prompt extends the first (same instructions and tools): the reuse is reported
    assert per[1]["input_tokens_details"][0]["cached_tokens"] > 0, per
    total = out["usage"]
    assert total["requests"] == 2
    assert total["input_tokens"] == sum(u["input_tokens"] for u in per)
    assert total["output_tokens"] == sum(u["output_tokens"] for u in per)
    assert total["total_tokens"] == total["input_tokens"] + total["output_tokens"]
