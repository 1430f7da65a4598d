"""A local fleet: several ``continuum serve`` workers behind HAProxy, sharing one Redis.

Nothing home-made routes or stores: Debian's ``redis-server`` holds the history, memo results
and KV snapshots (``deploy/redis.conf``), and Debian's ``haproxy`` routes by consistent hashing
on the session key (``deploy/haproxy.cfg`` is :func:`haproxy_config` for three workers, and a
test keeps the two equal). The key, first found wins:

    X-Session-ID header                   a client's own name for its conversation
    /v1/sessions/<id>/...                 the sessions API
    prompt_cache_key, then user           in the JSON body (Codex sends prompt_cache_key)
    previous_response_id's chain root     resp_<root>_<n>: every response of a chain
                                          carries its first response's root

A request with none goes round robin. HAProxy checks ``/health`` every 500 ms: a worker that
dies or drains (``POST /admin/drain``: 503) leaves the ring, its keys move to the others, and a
request whose worker refuses the connection is sent to the next one (``retry-on``). The
next worker restores a session from its shared snapshot or rebuilds it from the shared history,
and reports it (``resets``).

``continuum fleet up`` starts Redis (unless ``--store`` names one), the workers and HAProxy, writes
``fleet.json`` (ports and pids) in its directory, and on SIGINT/SIGTERM stops the workers with
SIGTERM (each parks its sessions in Redis), then HAProxy and Redis. ``continuum bench fleet``
starts and stops its fleets through the same :class:`Fleet` (:func:`running_fleet`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from continuum.errors import ContinuumError


class FleetError(ContinuumError):
    """A process of the fleet (Redis, a worker, HAProxy) is missing, exited or never answered;
    the message says which and shows its log's tail."""


HAPROXY_TEMPLATE = """\
# HAProxy in front of {n} continuum workers, as `continuum fleet up` runs it
# (`continuum fleet config --workers {n}` prints this file; a test keeps the two equal).
global
    maxconn 4096

defaults
    mode http
    timeout connect 2s
    timeout client 600s
    timeout server 600s
    timeout check 2s
    # the routing key may be in the JSON body
    option http-buffer-request
    # a worker that refuses the connection (dead): the next one. Never a request a worker
    # has started: a session turn is not idempotent (it may have committed)
    retries 3
    option redispatch 1
    retry-on conn-failure

frontend continuum
    bind {host}:{port}
    default_backend workers

backend workers
    # the session key (the first found wins); a request with none goes round robin
    acl keyed var(txn.key) -m found
    http-request set-var(txn.key) req.hdr(x-session-id) if {{ req.hdr(x-session-id) -m found }}
    http-request set-var(txn.key) path,field(4,/) if !keyed {{ path_beg /v1/sessions/ }}
    http-request set-var(txn.key) req.body,json_query('$.prompt_cache_key') if !keyed
    http-request set-var(txn.key) req.body,json_query('$.user') if !keyed
    http-request set-var(txn.key) req.body,json_query('$.previous_response_id'),field(2,_) if !keyed
    balance hash var(txn.key)
    hash-type consistent
    # a dead or draining worker (503) leaves the ring within a second
    option httpchk
    http-check send meth GET uri /health ver HTTP/1.1 hdr Host 127.0.0.1
    http-check expect status 200
    default-server check inter 500ms fall 2 rise 2
{servers}
"""


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def haproxy_config(worker_ports: list[int], port: int, host: str = "127.0.0.1") -> str:
    servers = "\n".join(f"    server w{i} 127.0.0.1:{p}" for i, p in enumerate(worker_ports, 1))
    return HAPROXY_TEMPLATE.format(n=len(worker_ports), host=host, port=port, servers=servers)


@dataclass
class Fleet:
    """The processes of one local fleet, started in order (:meth:`start`) and stopped in
    reverse (:meth:`stop`, which also stops a fleet whose start failed half way)."""

    directory: Path
    redis: subprocess.Popen[bytes] | None = None
    workers: list[tuple[int, subprocess.Popen[bytes]]] = field(default_factory=list)
    router: subprocess.Popen[bytes] | None = None
    port: int = 0
    store: str = ""

    @property
    def url(self) -> str:
        """The router's base URL (no ``/v1``)."""
        return f"http://127.0.0.1:{self.port}"

    def describe(self) -> dict[str, object]:
        return {
            "router": self.url,
            "store": self.store,
            "redis_pid": self.redis.pid if self.redis else None,
            "router_pid": self.router.pid if self.router else None,
            "workers": [{"port": p, "pid": w.pid} for p, w in self.workers],
        }

    def start(
        self,
        *,
        workers: int,
        port: int,
        store: str | None,
        serve_args: list[str],
        say: Callable[[str], None] = _say,
        shared_graph: bool = False,
    ) -> None:
        """Start Redis (unless ``store`` names one), ``workers`` ``continuum serve`` workers
        on free ports sharing it (and, with ``shared_graph``, one memory graph in it), and
        HAProxy on ``port``; return once every one answers, with ``fleet.json`` written. The
        caller stops the fleet, also when this raises."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = port
        self.store = store or _start_redis(self)
        exe = [_continuum(), "serve"]
        if shared_graph:
            serve_args = [*serve_args, "--graph", self.store]
        for i in range(workers):
            wport = _free_port()
            log = self.directory / f"worker{i + 1}.log"
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    [*exe, "--port", str(wport), "--store", self.store, *serve_args],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=os.environ.copy(),
                )
            self.workers.append((wport, proc))
        for i, (wport, proc) in enumerate(self.workers):
            say(f"waiting for worker {i + 1} (port {wport})")
            log = self.directory / f"worker{i + 1}.log"
            _wait_healthy(f"http://127.0.0.1:{wport}/health", proc, f"worker {i + 1}", log)
        cfg = self.directory / "haproxy.cfg"
        cfg.write_text(haproxy_config([p for p, _ in self.workers], port))
        hlog = self.directory / "haproxy.log"
        with open(hlog, "wb") as out:
            self.router = subprocess.Popen(
                [_binary("haproxy"), "-db", "-f", str(cfg)], stdout=out, stderr=subprocess.STDOUT
            )
        _wait_healthy(f"{self.url}/health", self.router, "haproxy", hlog)
        (self.directory / "fleet.json").write_text(json.dumps(self.describe()))

    def stop(self) -> None:
        for _, w in self.workers:  # each parks its sessions in Redis as it stops
            _signal(w, signal.SIGTERM)
        for _, w in self.workers:
            _wait(w, 60)
        for proc in (self.router, self.redis):
            if proc is not None:
                _signal(proc, signal.SIGTERM)
                _wait(proc, 20)


@contextmanager
def running_fleet(
    directory: Path,
    *,
    workers: int,
    port: int,
    serve_args: list[str],
    store: str | None = None,
    say: Callable[[str], None] = _say,
) -> Iterator[Fleet]:
    """A started fleet for the ``with`` block, stopped after it (what ``continuum bench
    fleet`` runs each worker count on)."""
    fleet = Fleet(directory)
    try:
        fleet.start(workers=workers, port=port, store=store, serve_args=serve_args, say=say)
        yield fleet
    finally:
        say("stopping the fleet (workers park their sessions in Redis)")
        fleet.stop()


def worker_args(
    *,
    workers: int,
    threads: int | None,
    n_ctx: int,
    parallel: int,
    model: str | None,
    admin_key: str | None = None,
    semantic: bool = False,
) -> list[str]:
    """The ``continuum serve`` options every worker of a fleet gets (threads: the cores shared
    out when not given)."""
    per = threads or max(1, (os.cpu_count() or 1) // workers)
    args = ["--threads", str(per), "--n-ctx", str(n_ctx), "--parallel", str(parallel)]
    if model:
        args += ["--model", model]
    if admin_key:
        args += ["--admin-key", admin_key]
    if semantic:
        args.append("--semantic")
    return args


def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _binary(name: str) -> str:
    found = shutil.which(name) or (
        f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None
    )
    if found is None:
        raise FleetError(f"{name} is not installed: apt-get install -y {name}")
    return found


def _continuum() -> str:
    """The ``continuum`` console script of this interpreter's environment."""
    beside = Path(sys.executable).parent / "continuum"
    return str(beside) if beside.exists() else _binary("continuum")


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            raise FleetError(f"{what} exited with {proc.returncode}:\n{tail}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise FleetError(f"{what} did not answer {url} within 300 s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# deploy/redis.conf, as arguments (a test keeps the two equal): AOF with every write fsynced
# before Redis answers, nothing evicted behind continuum's back, no RDB forks, loopback only
REDIS_SETTINGS = (
    ("appendonly", "yes"),
    ("appendfsync", "always"),
    ("maxmemory-policy", "noeviction"),
    ("save", ""),
    ("bind", "127.0.0.1"),
    ("protected-mode", "yes"),
)


def _start_redis(fleet: Fleet) -> str:
    port = _free_port()
    data = fleet.directory / "redis"
    data.mkdir(parents=True, exist_ok=True)
    args = [_binary("redis-server"), "--port", str(port), "--dir", str(data)]
    args += [a for name, value in REDIS_SETTINGS for a in (f"--{name}", value)]
    log = fleet.directory / "redis.log"
    fleet.redis = subprocess.Popen([*args, "--logfile", str(log)], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    raise FleetError(f"redis-server did not start; see {log}")


__all__ = [
    "HAPROXY_TEMPLATE",
    "REDIS_SETTINGS",
    "Fleet",
    "FleetError",
    "haproxy_config",
    "running_fleet",
    "worker_args",
]
