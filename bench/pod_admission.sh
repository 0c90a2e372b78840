#!/usr/bin/env bash
# What PoD is for, measured: how many sequences a fixed device KV tier holds at once,
# PoD against full. PoD stores the keys of distant tokens once per layer group (it frees
# the upper layers' copies), so a long sequence needs fewer device blocks once prefilled.
# Starts pruneserve on free loopback ports with --kv-device-bytes fixed and each prompt
# taken in one step, as the evaluation does (so a running request holds its whole
# prompt's KV: the scheduler admits a request when its whole prompt fits beside them;
# the model's calibration from --calibrate-text, cached), then for each strategy sends
# every request at once (the load generator's max-concurrency mode) and samples the
# server's gauges every 0.2 s: the requests whose KV is on the device
# (pruneserve_num_requests_running - _swapped) at most, with the preemptions and the
# run's time. Needs a build (cmake --build build).
# Usage: bench/pod_admission.sh [OUT_DIR]       (the load generator's JSON; default: a temp dir)
# Env: PS_MODEL (the 0.5B evaluation model), PS_ADMIT_KV_BYTES (480000000: 4.9 of that
#      model's 8k-token sequences in BF16), PS_ADMIT_INPUT_LEN (8192), PS_ADMIT_OUTPUT_LEN
#      (128), PS_ADMIT_REQUESTS (8), PS_ADMIT_STRATEGIES (full,pod).
# PoD's defaults attend to the newest n_ctx/8 tokens with their own keys: prompts longer
# than that (4k tokens for a 32k-context model) have distant keys to share.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${PS_MODEL:-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
KV_BYTES=${PS_ADMIT_KV_BYTES:-480000000}
REQUESTS=${PS_ADMIT_REQUESTS:-8}
INPUT=${PS_ADMIT_INPUT_LEN:-8192}
OUTPUT=${PS_ADMIT_OUTPUT_LEN:-128}
tmp=$(mktemp -d)
OUT=${1:-$tmp}
mkdir -p "$OUT"
build/pruneserve --model "$MODEL" --host 127.0.0.1 --port 0 --metrics-port 0 --port-file "$tmp/ports" \
  --kv-device-bytes "$KV_BYTES" --prefill-chunk 65536 --max-batch-tokens 65536 \
  --calibrate-text ../shared/testdata/haystack/paul_graham_essays --log-level warn &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 300); do [ -s "$tmp/ports" ] && break; sleep 0.1; done
addr=127.0.0.1:$(sed -n 's/^grpc=//p' "$tmp/ports")
metrics=http://127.0.0.1:$(sed -n 's/^metrics=//p' "$tmp/ports")/metrics
echo "pod_admission: $(basename "$MODEL"), --kv-device-bytes $KV_BYTES, $REQUESTS requests at once of" \
  "$INPUT tokens, $OUTPUT out, $(nproc) cores ($(lscpu | sed -n 's/^Model name: *//p'))"
echo "| strategy | requests on the device at most | preemptions | completed | run (s) | median TTFT (s) |"
echo "|---|---|---|---|---|---|"
IFS=, read -ra strategies <<< "${PS_ADMIT_STRATEGIES:-full,pod}"
for s in "${strategies[@]}"; do
  # The sampler runs until the load generator's result file appears.
  rm -f "$OUT/admission-$s.json"
  /usr/bin/python3 - "$metrics" "$OUT/admission-$s.json" > "$tmp/sampled" <<'PY' &
import os, sys, time, urllib.request
url, done = sys.argv[1:]
def gauges():
    text = urllib.request.urlopen(url).read().decode()
    value = lambda name: sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name))
    return value("pruneserve_num_requests_running "), value("pruneserve_num_requests_swapped "), \
        value("pruneserve_preemptions_total")
first_preemptions = gauges()[2]
peak = 0
while not os.path.exists(done):
    running, swapped, _ = gauges()
    peak = max(peak, running - swapped)
    time.sleep(0.2)
print(f"{peak:.0f} {gauges()[2] - first_preemptions:.0f}")
PY
  sampler=$!
  # --connect-timeout: a first start calibrates the model (a minute or two).
  build/pruneserve-loadtest --addr "$addr" --connect-timeout 600 --num-requests "$REQUESTS" \
    --max-concurrency "$REQUESTS" --input-len "$INPUT" --output-len "$OUTPUT" --strategy-mix "$s" --seed 1 \
    --progress off --result-file "$OUT/admission-$s.json" > /dev/null
  wait $sampler
  read -r peak preempted < "$tmp/sampled"
  /usr/bin/python3 - "$OUT/admission-$s.json" "$s" "$peak" "$preempted" <<'PY'
import json, sys
path, s, peak, preempted = sys.argv[1:]
r = json.load(open(path))["runs"][0]
print(f"| {s} | {peak} | {preempted} | {r['completed']}/{r['sent']} | {r['duration']:.0f} | "
      f"{r['median_ttft_ms'] / 1e3:.1f} |")
PY
done
