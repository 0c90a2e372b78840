#!/usr/bin/env bash
# Added latency of the gRPC path: starts pruneserve on a free loopback port with
# the default model, runs ps_bench_server_latency against it, stops it.
# Needs a build (cmake --build build) and the model (scripts/fetch_model.sh).
# PS_SERVER_ARGS: more server flags (e.g. "--kv-dtype q8_0"; pass the bench the same
# --kv-dtype for its offline engine).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${PS_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
tmp=$(mktemp -d)
build/pruneserve --model "$MODEL" --host 127.0.0.1 --port 0 --metrics-port -1 --threads 2 \
  --port-file "$tmp/ports" --log-level warn ${PS_SERVER_ARGS:-} &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 300); do [ -f "$tmp/ports" ] && break; sleep 0.1; done
port=$(sed -n 's/^grpc=//p' "$tmp/ports")
for _ in $(seq 300); do [ "$(build/pruneserve-cli --addr 127.0.0.1:$port health 2>/dev/null)" = SERVING ] && break; sleep 0.1; done
build/ps_bench_server_latency --model "$MODEL" --addr "127.0.0.1:$port" --threads 2 "$@"
