#!/usr/bin/env bash
# The long-context evaluation: every strategy on a model through the real server.
# Builds what it needs, starts pruneserve on a free loopback port with every prompt
# taken in one engine step (the same for `full` and the strategies), runs
# pruneserve-eval and stops the server. Results are appended one row per request (files
# below), and a rerun resumes where the last one stopped; the table is printed from
# every row there. Extra arguments go to
# pruneserve-eval, e.g. `scripts/eval.sh --lengths 4096 --phases accuracy --limit 100`
# (`--help` lists them). Without them: lengths 4k..32k (up to the context), all
# seven tasks, 20/10/3/2 prompts per task at 4k/8k/16k/32k, then the timing repeats:
# hours on 2 cores, resumable.
# PS_EVAL_MODEL=FILE serves another model, e.g. the 0.5B evaluation model
# (models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf, fetched by `scripts/fetch_model.sh --eval`).
# The server finds the model's calibration (FILE.calibration.json from
# build/pruneserve-calibrate, or its own cache) or measures it at start-up over the
# essays (PoD needs it; GemFilter and LazyLLM take their layers from it);
# PS_EVAL_SERVER_ARGS adds server flags.
# Files (PS_EVAL_DIR, default docs/eval): MODEL.results.csv (one row per request; a rerun
# resumes), MODEL.summary.csv (the table), MODEL.auto.json (the `auto` strategy's table:
# the server is given it when it is there, so `auto` runs from the second run on) and,
# with matplotlib, one accuracy-vs-speedup plot per length (scripts/eval_plots.py).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
model=${PS_EVAL_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
if [ -z "${PS_EVAL_MODEL:-}" ]; then
  scripts/fetch_model.sh
elif [ ! -f "$model" ]; then
  echo "eval.sh: $model not found (the evaluation model: scripts/fetch_model.sh --eval)" >&2
  exit 1
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target pruneserve pruneserve-cli pruneserve-eval
tmp=$(mktemp -d)
dir=${PS_EVAL_DIR:-docs/eval}
name=$(basename "$model")
mkdir -p "$dir"
server_args=(--calibrate-text ../shared/testdata/haystack/paul_graham_essays ${PS_EVAL_SERVER_ARGS:-})
[ -f "$dir/$name.auto.json" ] && server_args+=(--auto-table "$dir/$name.auto.json")
# No prefix cache: the timing phase repeats prompts, and every request is measured cold.
build/pruneserve --model "$model" --host 127.0.0.1 --port 0 --port-file "$tmp/ports" \
  --metrics-port -1 --log-level warn --prefill-chunk 65536 --max-batch-tokens 65536 --prefix-cache off \
  "${server_args[@]}" > "$tmp/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 600); do
  [ -s "$tmp/ports" ] && break
  kill -0 $server 2>/dev/null || { cat "$tmp/server.log" >&2; exit 1; }
  sleep 0.1
done
port=$(sed -n 's/^grpc=//p' "$tmp/ports")
for _ in $(seq 3000); do  # a first start may calibrate the model (a minute or two)
  [ "$(build/pruneserve-cli --addr "127.0.0.1:$port" health --timeout 1 2>/dev/null)" = "SERVING" ] && break
  kill -0 $server 2>/dev/null || { cat "$tmp/server.log" >&2; exit 1; }
  sleep 0.1
done
build/pruneserve-eval --addr "127.0.0.1:$port" --haystack ../shared/testdata/haystack/paul_graham_essays \
  --csv "$dir/$name.results.csv" --summary "$dir/$name.summary.csv" --auto-table "$dir/$name.auto.json" "$@"
python3 scripts/eval_plots.py "$dir/$name.summary.csv" "$dir" || echo "eval.sh: no plots (scripts/eval_plots.py)" >&2
