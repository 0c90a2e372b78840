#!/usr/bin/env bash
# The prefix cache's benchmark (README): the same shared-prefix load (documents asked
# several questions each, Poisson arrivals) against pruneserve with --prefix-cache on,
# then off, one server at a time on free loopback ports; prints TTFT p50 / p99 and the
# cached prompt tokens of both runs, and writes their JSON. Needs a build (cmake
# --build build) and the model.
# Usage: bench/prefix_cache.sh [OUT_DIR]          (default: a temporary folder)
# Env: PS_MODEL (models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf: scripts/fetch_model.sh --eval),
#      PS_PC_DOCUMENTS (4), PS_PC_QUESTIONS (4), PS_PC_DOC_LEN (2048), PS_PC_QUESTION_LEN (32),
#      PS_PC_OUTPUT_LEN (16), PS_PC_RATE (0.1 req/s), PS_PC_SEED (1)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${PS_MODEL:-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
[ -f "$MODEL" ] || { echo "prefix_cache.sh: $MODEL not found (scripts/fetch_model.sh --eval)" >&2; exit 1; }
tmp=$(mktemp -d)
OUT=${1:-$tmp}
mkdir -p "$OUT"
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
run() {  # on | off
  rm -f "$tmp/ports"
  build/pruneserve --model "$MODEL" --host 127.0.0.1 --port 0 --metrics-port -1 --port-file "$tmp/ports" \
    --log-level warn --prefix-cache "$1" > "$tmp/server-$1.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do [ -s "$tmp/ports" ] && break; sleep 0.1; done
  build/pruneserve-loadtest --addr "127.0.0.1:$(sed -n 's/^grpc=//p' "$tmp/ports")" --connect-timeout 300 \
    --dataset shared-prefix --documents "${PS_PC_DOCUMENTS:-4}" --questions "${PS_PC_QUESTIONS:-4}" \
    --input-len "${PS_PC_DOC_LEN:-2048}" --question-len "${PS_PC_QUESTION_LEN:-32}" \
    --output-len "${PS_PC_OUTPUT_LEN:-16}" --num-requests $(( ${PS_PC_DOCUMENTS:-4} * ${PS_PC_QUESTIONS:-4} )) \
    --request-rate "${PS_PC_RATE:-0.1}" --seed "${PS_PC_SEED:-1}" --result-file "$OUT/prefix-cache-$1.json" >&2
  kill $pid
  wait $pid 2>/dev/null || true
  pid=
}
run on
run off
/usr/bin/python3 - "$OUT/prefix-cache-on.json" "$OUT/prefix-cache-off.json" "$MODEL" "$(nproc)" <<'PY'
import json, sys
on, off = (json.load(open(p))["runs"][0] for p in sys.argv[1:3])
c = json.load(open(sys.argv[1]))["config"]
print(f"{sys.argv[3]}, {c['documents']} documents x {c['questions']} questions, {c['input_len']}-token documents, "
      f"{c['question_len']}-token questions, Poisson {on['request_rate']} req/s, {sys.argv[4]} cores")
print("| prefix cache | completed | cached / prompt tokens | p50 TTFT (s) | p99 TTFT (s) | mean TTFT (s) |")
print("|---|---|---|---|---|---|")
for name, r in (("on", on), ("off", off)):
    print(f"| {name} | {r['completed']}/{r['sent']} | {r['total_cached_tokens']} / {r['total_input_tokens']} | "
          f"{r['median_ttft_ms'] / 1e3:.2f} | {r['p99_ttft_ms'] / 1e3:.2f} | {r['mean_ttft_ms'] / 1e3:.2f} |")
print(f"p50 TTFT off / on: {off['median_ttft_ms'] / max(on['median_ttft_ms'], 1e-9):.1f}x, "
      f"p99: {off['p99_ttft_ms'] / max(on['p99_ttft_ms'], 1e-9):.1f}x")
PY
