"""``continuum fleet``: three real workers behind a real HAProxy, sharing a real Redis.

The shipped configurations are the ones the fleet runs (deploy/haproxy.cfg, redis.conf)
and HAProxy accepts them. Then the fleet itself: 24 sessions of 10 turns each through the
router, one worker SIGKILLed mid-run; every session ends with all its turns, in order, its own.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from continuum.server.fleet import REDIS_SETTINGS, haproxy_config
from continuum.store.redis_client import RedisTarget
from continuum.store.redis_graph import RedisGraphStore
from tests.redis_server import free_port

pytestmark = pytest.mark.slow  # end to end: CI runs it, the default loop does not (pyproject.toml)

ROOT = Path(__file__).resolve().parents[2]
SESSIONS, TURNS = 24, 10


def test_the_shipped_haproxy_config_is_the_fleets_and_haproxy_accepts_it() -> None:
    shipped = (ROOT / "deploy" / "haproxy.cfg").read_text()
    assert shipped == haproxy_config([8001, 8002, 8003], 8000)
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(haproxy).exists():
        pytest.fail("haproxy is not installed: apt-get install -y haproxy")
    checked = subprocess.run(
        [haproxy, "-c", "-f", str(ROOT / "deploy" / "haproxy.cfg")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_shipped_redis_conf_is_the_fleets() -> None:
    lines = (ROOT / "deploy" / "redis.conf").read_text().splitlines()
    directives = [ln.split(None, 1) for ln in lines if ln.strip() and not ln.startswith("#")]
    assert [(k, v.strip('"')) for k, v in directives] == list(REDIS_SETTINGS)


class Client:
    """One agent's sessions, turn by turn through the router. A turn whose worker died under
    it (502/503/reset) is sent again only if the history says it was not committed."""

    def __init__(self, base: str) -> None:
        self.http = httpx.Client(base_url=base, timeout=180)
        self.retried = 0
        self.resets: Counter[str] = Counter()

    def turn(self, sid: str, n: int) -> None:
        text = f"Session {sid[:6]}, turn {n}: say OK."
        for _ in range(20):
            try:
                r = self.http.post(
                    f"/v1/sessions/{sid}/messages",
                    json={"messages": [{"role": "user", "content": text}], "max_tokens": 3},
                )
                if r.status_code == 200:
                    for reset in r.json()["usage"]["continuum"]["resets"]:
                        self.resets[_kind(reset)] += 1
                    return
            except httpx.HTTPError:
                pass
            self.retried += 1
            time.sleep(0.5)
            if self.committed(sid) > n:  # it landed before the worker died
                return
        raise AssertionError(f"turn {n} of {sid} never went through")

    def committed(self, sid: str) -> int:
        try:
            r = self.http.get(f"/v1/sessions/{sid}")
            return len(r.json()["turns"]) if r.status_code == 200 else -1
        except httpx.HTTPError:
            return -1


def _kind(reset: dict[str, Any]) -> str:
    if reset["reason"] == "evicted" and "restored" in reset["detail"]:
        return "restored"
    return "rebuilt" if reset["reason"] in ("evicted", "restore_failed") else reset["reason"]


def _start_fleet(tmp: Path, port: int) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    exe = Path(sys.executable).parent / "continuum"
    args = [str(exe), "fleet", "up", "--workers", "3", "--port", str(port), "--dir", str(tmp)]
    args += ["--model", "gemma3-270m", "--threads", "1", "--n-ctx", "2048", "--parallel", "2"]
    args += ["--graph"]  # one memory graph in the fleet's Redis
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the router's URL, once everything answers
    assert line.strip() == f"http://127.0.0.1:{port}/v1", (proc.poll(), proc.stderr.read())  # type: ignore[union-attr]
    return proc, json.loads((tmp / "fleet.json").read_text())


def test_a_fleet_keeps_every_session_through_a_worker_killed_mid_run(tmp_path: Path) -> None:
    port = free_port()
    proc, info = _start_fleet(tmp_path / "fleet", port)
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=120) as h:
            sids = [
                h.post("/v1/sessions", json={"system": "Be brief."}).json()["id"]
                for _ in range(SESSIONS)
            ]
        clients = [Client(base) for _ in range(6)]
        done = Counter[str]()
        lock = threading.Lock()

        def agent(c: Client, mine: list[str]) -> None:
            for n in range(TURNS):
                for sid in mine:
                    c.turn(sid, n)
                    with lock:
                        done["turns"] += 1

        threads = [
            threading.Thread(target=agent, args=(c, sids[i::6])) for i, c in enumerate(clients)
        ]
        for t in threads:
            t.start()
        while done["turns"] < SESSIONS * TURNS // 3:
            time.sleep(0.1)
        victim = random.Random(7).choice(info["workers"])
        os.kill(victim["pid"], signal.SIGKILL)  # mid-run, turns in flight
        for t in threads:
            t.join(600)
        assert done["turns"] == SESSIONS * TURNS
        with httpx.Client(base_url=base, timeout=120) as h:
            for sid in sids:
                got = h.get(f"/v1/sessions/{sid}").json()
                users = [m["content"] for m in got["history"] if m["role"] == "user"]
                assert users == [f"Session {sid[:6]}, turn {n}: say OK." for n in range(TURNS)]
                assert len(got["turns"]) == TURNS  # no committed turn lost, none twice
        kinds = sum((c.resets for c in clients), Counter[str]())
        retried = sum(c.retried for c in clients)
        print(f"\nfleet: {dict(kinds)} resets, {retried} turns sent again after the kill")
        assert kinds["rebuilt"] + kinds["restored"] >= 1  # the victim's sessions moved
        graph = RedisGraphStore(RedisTarget(info["store"]))
        try:  # every worker recorded its turns in the one shared graph
            assert graph.counts().get("op", 0) >= SESSIONS
        finally:
            graph.target.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode == 0


@pytest.mark.parametrize(
    "args",
    [
        ["config", "--workers", "0"],
        ["config", "--workers", "three"],
        ["config", "--port", "70000"],
        ["up", "--workers", "0"],
        ["up", "--threads", "0"],
        ["up", "--parallel", "33"],
    ],
)
def test_bad_fleet_options_are_usage_errors_naming_the_option(args: list[str]) -> None:
    from click.testing import CliRunner

    from continuum.cli.main import main

    result = CliRunner().invoke(main, ["fleet", *args])
    assert result.exit_code == 2 and args[1] in result.output, result.output
