#!/usr/bin/env bash
# The main job: installs what is needed, builds, fetches the default model, starts
# the server in the background, waits until it is SERVING and streams one chat
# answer through pruneserve-cli. The server keeps running; the last line says how
# to stop it. Re-running restarts it. Ports: PS_PORT (50051), PS_METRICS_PORT (9090).
# The first start also calibrates the model for the strategies that need it (about
# half a minute, over the shared essays when they are there; cached for later starts).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/fetch_model.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target pruneserve pruneserve-cli
PORT=${PS_PORT:-50051}
METRICS_PORT=${PS_METRICS_PORT:-9090}
PIDFILE=build/pruneserve.pid
if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
  echo "stopping the previous server (pid $(cat "$PIDFILE"))"
  kill -TERM "$(cat "$PIDFILE")"
  for _ in $(seq 100); do kill -0 "$(cat "$PIDFILE")" 2>/dev/null || break; sleep 0.1; done
fi
CALIBRATE=()
ESSAYS=../shared/testdata/haystack/paul_graham_essays
[ -d "$ESSAYS" ] && CALIBRATE=(--calibrate-text "$ESSAYS")
nohup build/pruneserve --model models/SmolLM2-135M-Instruct.Q4_1.gguf --host 127.0.0.1 --port "$PORT" \
  --metrics-port "$METRICS_PORT" "${CALIBRATE[@]}" > build/pruneserve.log 2>&1 &
echo $! > "$PIDFILE"
ADDR=127.0.0.1:$PORT
for _ in $(seq 3000); do
  if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    echo "the server exited; its log (build/pruneserve.log):" >&2
    cat build/pruneserve.log >&2
    exit 1
  fi
  [ "$(build/pruneserve-cli --addr "$ADDR" health --timeout 1 2>/dev/null)" = "SERVING" ] && break
  sleep 0.1
done
PROMPT=${1:-"What is the capital of France? Answer in one sentence."}
echo "> $PROMPT"
build/pruneserve-cli --addr "$ADDR" chat --prompt "$PROMPT" --temperature 0 --max-new-tokens 128 --stats
echo "pruneserve is running (pid $(cat "$PIDFILE")) on $ADDR, metrics on http://127.0.0.1:$METRICS_PORT/metrics," \
     "log in build/pruneserve.log. Stop it with: kill $(cat "$PIDFILE")"
