#!/usr/bin/env bash
# Two llama-server instances behind `continuum fleet config`'s HAProxy, continuum serve's
# openai_http in front: each conversation's requests land on one llama-server (HAProxy hashes
# the X-Session-ID affinity key openai_http sends), and llama-server's own cached_tokens come
# back as tokens_saved. Output: docs/results/llama-server-fleet.txt
#
#   LLAMA_SERVER=/path/to/llama-server bash docs/results/llama-server-fleet.sh
set -euo pipefail
LLAMA_SERVER=${LLAMA_SERVER:-llama-server}
WORK=$(mktemp -d)
exec 2>&1  # one transcript: the commands (on stderr) between their output
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
run() { echo "\$ $*" >&2; "$@"; }
free_port() { python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for() { for _ in $(seq 1 240); do curl -sf "$1" >/dev/null && return 0; sleep 0.5; done; echo "no answer from $1"; exit 1; }

GGUF=$(python -c "from continuum import resolve_model; print(resolve_model('gemma3-270m').path)")
HAP=$(free_port); A=$(free_port); B=$(free_port); FRONT=$(free_port)
while [ "$B" -ne $((A + 1)) ]; do A=$(free_port); B=$((A + 1)); done  # fleet config: consecutive
echo "# $(date -u +%FT%TZ) on $(nproc) cores; $("$LLAMA_SERVER" --version 2>&1 | head -1)"
echo "# model: $GGUF"

for PORT in $A $B; do
  echo "\$ $LLAMA_SERVER -m \$GGUF --host 127.0.0.1 --port $PORT -c 4096 -t 1 -tb 1 -np 1 -sps 0 &"
  "$LLAMA_SERVER" -m "$GGUF" --host 127.0.0.1 --port "$PORT" -c 4096 -t 1 -tb 1 -np 1 -sps 0 \
    >"$WORK/llama-$PORT.log" 2>&1 &
  PIDS+=($!)
done
wait_for "http://127.0.0.1:$A/health"; wait_for "http://127.0.0.1:$B/health"

run continuum fleet config --workers 2 --port "$HAP" --first-worker-port "$A" >"$WORK/haproxy.cfg"
sed 's/^/    /' "$WORK/haproxy.cfg" | grep -E 'balance|hash-type|x-session-id|server w'
echo "\$ haproxy -f haproxy.cfg -db &"
haproxy -f "$WORK/haproxy.cfg" -db >"$WORK/haproxy.log" 2>&1 &
PIDS+=($!)
wait_for "http://127.0.0.1:$HAP/health"

KEY_A=alpha-$(python -c 'import secrets; print(secrets.token_hex(16))')
KEY_B=beta-$(python -c 'import secrets; print(secrets.token_hex(16))')
# two fronts on the same HAProxy: the default affinity header, and none (the A/B baseline)
for MODE in X-Session-ID none; do
  PORT=$(free_port)
  echo "\$ continuum serve --backend openai_http --upstream http://127.0.0.1:$HAP/v1 --upstream-model gemma --upstream-affinity-header $MODE --port $PORT --api-key alpha=… --api-key beta=… &"
  continuum serve --backend openai_http --upstream "http://127.0.0.1:$HAP/v1" --upstream-model gemma \
    --upstream-affinity-header "$MODE" --port "$PORT" --api-key "alpha=$KEY_A" \
    --api-key "beta=$KEY_B" >"$WORK/front-$MODE.log" 2>&1 &
  PIDS+=($!)
  wait_for "http://127.0.0.1:$PORT/health"
  if [ "$MODE" = none ]; then FRONT_NONE=$PORT; else FRONT=$PORT; fi
done

echo "\$ python driver (3 conversations x 4 turns, interleaved, through each front)"
FRONT=$FRONT FRONT_NONE=$FRONT_NONE A=$A B=$B WORK=$WORK KEY_A=$KEY_A KEY_B=$KEY_B python - <<'PY'
import os, time, httpx
from continuum import UpstreamRouting
from continuum.backends.base import RequestRoute

work = os.environ["WORK"]
servers = {"A": os.environ["A"], "B": os.environ["B"]}
keys = {"alpha": os.environ["KEY_A"], "beta": os.environ["KEY_B"]}
SYSTEM = ("You are a terse assistant for a hardware shop. " * 24).strip()

def tasks(port):  # completions llama-server has run (one log line each)
    return open(f"{work}/llama-{port}.log").read().count("processing task")

def ask(front, tenant, conv, history):
    before = {s: tasks(p) for s, p in servers.items()}
    headers = {"Authorization": f"Bearer {keys[tenant]}"}
    if conv:
        headers["X-Session-ID"] = conv
    r = httpx.post(f"http://127.0.0.1:{front}/v1/chat/completions", headers=headers,
                   timeout=300, json={"model": "gemma", "max_tokens": 12, "temperature": 0,
                   "messages": [{"role": "system", "content": SYSTEM}, *history]})
    r.raise_for_status()
    body = r.json()
    for _ in range(50):  # the log line may trail the answer by a moment
        served = [s for s, p in servers.items() if tasks(p) > before[s]]
        if served:
            break
        time.sleep(0.05)
    return body, served

def conversations(front, label, routing):
    convs = [("alpha", f"{label}-1"), ("alpha", f"{label}-2"), ("beta", f"{label}-1")]
    history = {c: [] for c in convs}
    placed = {c: set() for c in convs}
    saved = 0
    print(f"{'tenant':6} {'conversation':12} {'turn':>4} {'server':>6} {'prompt':>6} "
          f"{'tokens_saved':>12}  affinity key sent upstream")
    for turn in range(1, 5):
        for c in convs:
            tenant, conv = c
            history[c].append({"role": "user", "content": f"{tenant} {conv} q{turn}: a tool?"})
            body, served = ask(front, tenant, conv, history[c])
            history[c].append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
            u = body["usage"]
            placed[c].update(served)
            saved += u["continuum"]["tokens_saved"] if turn > 1 else 0
            key = routing.affinity(RequestRoute(tenant, conv)) if routing.affinity_header else "-"
            print(f"{tenant:6} {conv:12} {turn:>4} {','.join(served):>6} "
                  f"{u['prompt_tokens']:>6} {u['continuum']['tokens_saved']!s:>12}  {key}")
    for c, where in placed.items():
        print(f"{c[0]}/{c[1]}: served by llama-server {sorted(where)}")
    print(f"tokens_saved over turns 2-4: {saved}")
    return placed

print("== front 1: --upstream-affinity-header X-Session-ID (the default)")
placed = conversations(os.environ["FRONT"], "conv", UpstreamRouting())
assert all(len(w) == 1 for w in placed.values()), "a conversation moved between servers"
print("one-offs with no session hint (no affinity key): HAProxy balances them round robin")
for i in range(4):
    body, served = ask(os.environ["FRONT"], "alpha", None,
                       [{"role": "user", "content": f"one-off {i}: name a colour."}])
    print(f"  one-off {i}: server {','.join(served)}, prompt {body['usage']['prompt_tokens']}, "
          f"tokens_saved {body['usage']['continuum']['tokens_saved']}")
print("== front 2: --upstream-affinity-header none (baseline: nothing for HAProxy to hash)")
conversations(os.environ["FRONT_NONE"], "base", UpstreamRouting(affinity_header=None))
PY
echo "# per-server completions: A $(grep -c 'processing task' "$WORK/llama-$A.log"), B $(grep -c 'processing task' "$WORK/llama-$B.log")"
