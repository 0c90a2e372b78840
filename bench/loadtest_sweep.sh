#!/usr/bin/env bash
# The README's load-test sweep: starts pruneserve with the default model on free
# loopback ports, runs pruneserve-loadtest's rate sweep twice against it (every
# request `full`, then a strategy mix), writes both JSON files and draws them with
# loadtest/plot.py. Needs a build (cmake --build build) and the model.
# Usage: bench/loadtest_sweep.sh [OUT_DIR]        (default: docs/, as in the README)
# Env: PS_MODEL, PS_SWEEP_RATES (0.1,0.2,0.3,0.4,0.5), PS_SWEEP_REQUESTS (24),
#      PS_SWEEP_INPUT_LEN (1024), PS_SWEEP_OUTPUT_LEN (64), PS_SWEEP_MIX (full=0.4,lazyllm=0.3,gemfilter=0.3)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${PS_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=${1:-docs}
RATES=${PS_SWEEP_RATES:-0.1,0.2,0.3,0.4,0.5}
MIX=${PS_SWEEP_MIX:-full=0.4,lazyllm=0.3,gemfilter=0.3}
mkdir -p "$OUT"
tmp=$(mktemp -d)
# GemFilter keeps 256 tokens: its default (1024) would leave 1k-token prompts whole.
build/pruneserve --model "$MODEL" --host 127.0.0.1 --port 0 --metrics-port -1 --port-file "$tmp/ports" \
  --strategy-arg gemfilter.top_k=256 --log-level warn &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 300); do [ -f "$tmp/ports" ] && break; sleep 0.1; done
addr=127.0.0.1:$(sed -n 's/^grpc=//p' "$tmp/ports")
sweep() {  # name, strategy mix
  build/pruneserve-loadtest --addr "$addr" --sweep-rates "$RATES" --num-requests "${PS_SWEEP_REQUESTS:-24}" \
    --input-len "${PS_SWEEP_INPUT_LEN:-1024}" --output-len "${PS_SWEEP_OUTPUT_LEN:-64}" --range-ratio 0.25 \
    --strategy-mix "$2" --seed 1 --slo-ttft-ms 10000 --slo-tpot-ms 500 --result-file "$OUT/sweep-$1.json"
}
sweep full full
sweep mix "$MIX"
/usr/bin/python3 loadtest/plot.py "$OUT/sweep-full.json:full" "$OUT/sweep-mix.json:$MIX" -o "$OUT/latency-throughput.png" \
  --title "pruneserve: $(basename "$MODEL"), ${PS_SWEEP_INPUT_LEN:-1024}-token prompts, ${PS_SWEEP_OUTPUT_LEN:-64} tokens out, $(nproc) cores"
/usr/bin/python3 - "$OUT/sweep-full.json" "$OUT/sweep-mix.json" <<'PY'
import json, sys
for path in sys.argv[1:]:
    doc = json.load(open(path))
    print(f"\n{doc['config']['strategy_mix']}")
    print("| rate (req/s) | completed | req/s | output tok/s | p50 TTFT (s) | p99 TTFT (s) | p50 TPOT (ms) | goodput (req/s) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in doc["runs"]:
        print(f"| {r['request_rate']} | {r['completed']}/{r['sent']} | {r['request_throughput']:.3f} | "
              f"{r['output_throughput']:.1f} | {r['median_ttft_ms'] / 1e3:.2f} | {r['p99_ttft_ms'] / 1e3:.2f} | "
              f"{r['median_tpot_ms']:.0f} | {r['request_goodput']:.3f} |")
PY
