"""The ``continuum`` command as a user runs it: data on stdout, one clear error line on stderr."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DEFAULT_DIGEST = "sha256:1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"  # Qwen


def continuum_exe() -> str:
    beside_python = Path(sys.executable).parent / "continuum"
    found = str(beside_python) if beside_python.exists() else shutil.which("continuum")
    assert found, "the continuum console script is not installed"
    return found


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The caller's environment minus any model override, with a private history home.
    CONTINUUM_CACHE is left alone: an empty cache would re-assemble the default model."""
    e = {k: v for k, v in os.environ.items() if k != "CONTINUUM_MODEL"}
    e["CONTINUUM_HOME"] = str(tmp_path / "home")
    return e


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [continuum_exe(), *args],
        env=env,
        input="",
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def assert_one_error_line(proc: subprocess.CompletedProcess[str], *expected: str) -> None:
    report = f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 2, report
    assert "Traceback" not in proc.stderr, report
    assert proc.stdout == "", report
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, report
    assert lines[0].startswith("error: "), report
    for text in expected:
        assert text in lines[0], report


def test_info_missing_model(env: dict[str, str]) -> None:
    proc = run(env, "info", "--model", "/nonexistent.gguf")
    assert_one_error_line(proc, "/nonexistent.gguf", "does not exist", "--model")


def test_info_model_from_env_var(env: dict[str, str]) -> None:
    env["CONTINUUM_MODEL"] = "/nonexistent-from-env.gguf"
    proc = run(env, "info")
    assert_one_error_line(proc, "/nonexistent-from-env.gguf", "does not exist")


def test_info_not_a_gguf_file(env: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "notes.gguf"
    path.write_text("these are my notes, not a model\n" * 5)
    proc = run(env, "info", "--model", str(path))
    assert_one_error_line(proc, str(path), "is not a GGUF file", "--model")


def test_info_json_on_default_model(env: dict[str, str]) -> None:
    proc = run(env, "info", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["digest"] == DEFAULT_DIGEST
    assert data["chat_format"] == "gguf"  # the template inside the file, tools section and all
    assert data["chat_template_in_gguf"] is True
    assert data["architecture"] == "qwen2" and data["n_ctx_train"] == 32768
    assert data["n_threads"] == data["cores_visible"] >= 1
    assert data["n_threads_batch"] == data["n_threads"]


def test_info_json_honours_threads_and_chat_format(env: dict[str, str]) -> None:
    proc = run(env, "info", "--json", "--threads", "1", "--chat-format", "chatml")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert (data["n_threads"], data["n_threads_batch"]) == (1, 1)
    assert data["chat_format"] == "chatml"


def test_info_unknown_chat_format(env: dict[str, str]) -> None:
    proc = run(env, "info", "--chat-format", "vicuna")
    assert_one_error_line(proc, "unknown chat format 'vicuna'", "gemma, chatml, llama3")


def test_bench_eva_bogus_mode(env: dict[str, str]) -> None:
    proc = run(env, "bench", "eva", "--modes", "bogus")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "unknown mode(s) ['bogus']" in proc.stderr
    assert "choose from stateful, prefix, cold, raw" in proc.stderr
    assert proc.stdout == ""


def test_bench_eva_raw_needs_stateful(env: dict[str, str]) -> None:
    proc = run(env, "bench", "eva", "--modes", "raw")
    assert proc.returncode == 2, proc.stderr
    assert "include stateful" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_chat_unknown_session(env: dict[str, str], tmp_path: Path) -> None:
    store = tmp_path / "history.db"
    proc = run(env, "chat", "--session", "doesnotexist", "--store", str(store))
    assert_one_error_line(proc, "no session 'doesnotexist'")


def test_chat_store_is_a_directory(env: dict[str, str], tmp_path: Path) -> None:
    proc = run(env, "chat", "--store", str(tmp_path))
    assert_one_error_line(proc, "history store", str(tmp_path), "cannot open")


def test_serve_unknown_backend(env: dict[str, str]) -> None:
    r = run(env, "serve", "--backend", "vllm-typo", "--port", "0")
    assert r.returncode == 2 and r.stdout == ""
    assert "vllm-typo" in r.stderr and "llamacpp" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("bad", ["-1", "seven", "1.5"])
def test_serve_with_a_bad_seed_is_refused_before_the_model_loads(
    env: dict[str, str], bad: str
) -> None:
    r = run(env, "serve", "--seed", bad, "--port", "0")
    assert r.returncode == 2 and "--seed" in r.stderr and "Traceback" not in r.stderr
    assert "loading the model" not in r.stderr


def test_serve_remote_backend_needs_an_upstream(env: dict[str, str]) -> None:
    r = run(env, "serve", "--backend", "openai_http", "--port", "0")
    assert r.returncode == 2 and "--upstream" in r.stderr and "Traceback" not in r.stderr


def assert_ends_in_one_error(proc: subprocess.CompletedProcess[str], *expected: str) -> None:
    """serve's progress lines, then one error line (no traceback), exit status 2."""
    report = f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, report
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and all(t in last for t in expected), report


def test_serve_on_an_unreachable_redis_is_one_error_line(env: dict[str, str]) -> None:
    from tests.redis_server import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    proc = run(env, "serve", "--model", "gemma3-270m", "--port", "0", "--store", url)
    assert_ends_in_one_error(proc, "unreachable", "start Redis")


def test_serve_with_a_bad_redis_url_is_one_error_line(env: dict[str, str]) -> None:
    proc = run(env, "serve", "--model", "gemma3-270m", "--store", "redis://127.0.0.1:1/x")
    assert_ends_in_one_error(proc, "is not a number")


@pytest.mark.slow  # over 4 s alone: the full run's (see pyproject's markers)
def test_serve_with_a_bad_or_unreachable_redis_graph_is_one_error_line(
    env: dict[str, str],
) -> None:
    from tests.redis_server import free_port

    proc = run(env, "serve", "--model", "gemma3-270m", "--graph", "redis://127.0.0.1:1/x")
    assert_ends_in_one_error(proc, "is not a number")
    url = f"redis://127.0.0.1:{free_port()}/0"
    proc = run(env, "serve", "--model", "gemma3-270m", "--port", "0", "--graph", url)
    assert_ends_in_one_error(proc, "unreachable", "start Redis")
