#!/usr/bin/env bash
# Bounded smoke test of a real llama-server with one model: start it on 127.0.0.1 on a free port, wait for
# /health, ask /completion for 16 tokens, print load time and tokens/s, and always stop the server.
#
#   lab/llama/smoke.sh MODEL.gguf
#
# Env: LLAMA_SERVER (default: the binary cached by build_server.sh), SMOKE_TIMEOUT (seconds to wait for
#      the model to load, default 120), SMOKE_THREADS (default 1: on a shared 2-core machine a second
#      thread that loses its core stalls every ggml barrier, and tokens/s swings 100x between runs).
# Needs curl and python3. Exit 0 only if 16 tokens came back.
set -euo pipefail

N_PREDICT=16

die() { echo "smoke: $*" >&2; exit 1; }

[[ $# -eq 1 ]] || die "usage: $0 MODEL.gguf"
MODEL="$(readlink -f "$1")"
[[ -f "$MODEL" ]] || die "model $1 not found; make one with lab/llama/make_model.py --size-mb N"

if [[ -z "${LLAMA_SERVER:-}" ]]; then
    LLAMA_SERVER="$("$(dirname "$(readlink -f "$0")")/build_server.sh")/bin/llama-server"
fi
[[ -x "$LLAMA_SERVER" ]] || die "$LLAMA_SERVER is not executable; run lab/llama/build_server.sh"

# Bind to port 0 and release it: the kernel picks a port nobody else holds right now.
PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
URL="http://127.0.0.1:$PORT"
WORK="$(mktemp -d)"
SERVER_PID=""

stop_server() {
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID"
        # Give it 10 s to exit cleanly, then force it: the smoke test must never leave a server behind.
        for _ in $(seq 1 100); do
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap stop_server EXIT

now() { date +%s.%N; }

start="$(now)"
"$LLAMA_SERVER" -m "$MODEL" --host 127.0.0.1 --port "$PORT" -c 512 -np 1 \
    -t "${SMOKE_THREADS:-1}" --no-ui >"$WORK/server.log" 2>&1 &
SERVER_PID=$!

deadline=$(( $(date +%s) + ${SMOKE_TIMEOUT:-120} ))
until curl -fsS --max-time 2 "$URL/health" >/dev/null 2>&1; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        tail -n 20 "$WORK/server.log" >&2
        die "llama-server exited while loading $MODEL (log above)"
    fi
    if (( $(date +%s) >= deadline )); then
        tail -n 20 "$WORK/server.log" >&2
        die "llama-server not healthy after ${SMOKE_TIMEOUT:-120}s; raise SMOKE_TIMEOUT for big models or slow guests"
    fi
    sleep 0.1
done
load_s="$(python3 -c "print('%.2f' % ($(now) - $start))")"

# ignore_eos: random weights may pick </s> early, and the test wants exactly N_PREDICT tokens.
curl -fsS --max-time 120 "$URL/completion" -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"Hello, NUMA\", \"n_predict\": $N_PREDICT, \"ignore_eos\": true, \"temperature\": 0}" \
    >"$WORK/completion.json" || die "/completion failed; server log: $(tail -n 5 "$WORK/server.log")"

python3 - "$WORK/completion.json" "$N_PREDICT" "$load_s" "$MODEL" "$SERVER_PID" <<'EOF'
import json
import os
import sys

path, want, load_s, model, pid = sys.argv[1:]
reply = json.load(open(path))
got = reply.get("tokens_predicted")
timings = reply.get("timings", {})
print("smoke: model=%s size_mb=%.1f pid=%s load_s=%s tokens=%s gen_tok_s=%.1f prompt_tok_s=%.1f" % (
    os.path.basename(model), os.path.getsize(model) / 2**20, pid, load_s, got,
    timings.get("predicted_per_second", 0.0), timings.get("prompt_per_second", 0.0)))
if got != int(want):
    sys.exit("smoke: expected %s tokens, got %r; reply: %s" % (want, got, json.dumps(reply)[:500]))
EOF
