#!/usr/bin/env bash
# Builds the libFuzzer targets (clang; ASan + UBSan) and fuzzes each parser (and the KV
# owner's operation sequences) for a time or a number of executions. Each target's
# corpus: build-fuzz/corpus/TARGET (new inputs land there), seeded from
# tests/fuzz/corpus/TARGET (small real-shaped text files: the shared tokenizer.json files
# are megabytes, too slow to mutate), for GGUF the models of ../shared/testdata, read in
# place, and for safetensors two images written at run time. A crash leaves its input in
# build-fuzz/ and the script exits non-zero: fix it and add the input to
# tests/fuzz/corpus/TARGET.
# Usage: scripts/fuzz.sh [--seconds N] [--runs N] [--max-len BYTES] [TARGET...]
#        (default: every target, 60 s each; with both, whichever comes first; TARGET is e.g.
#        openai_request or fuzz_openai_request; --max-len caps an input's size, default 64 KiB,
#        GGUF 1.3 MB: whole models, ~300 executions/s; 65536 fuzzes their headers ~10x faster)
set -euo pipefail
cd "$(dirname "$0")/.."
TESTDATA=../shared/testdata
ALL=(gguf safetensors hf_config tokenizer_json generate_request openai_request pod_groups kv_owner jinja grammar json_schema regex)
limit=()
targets=()
max_len_arg=
while (($#)); do
  case $1 in
    --seconds) limit+=(-max_total_time="$2"); shift 2 ;;
    --runs) limit+=(-runs="$2"); shift 2 ;;
    --max-len) max_len_arg=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/{/^#/p}' "$0"; exit 0 ;;
    *) targets+=("${1#fuzz_}"); shift ;;
  esac
done
((${#targets[@]})) || targets=("${ALL[@]}")
((${#limit[@]})) || limit=(-max_total_time=60)
for t in "${targets[@]}"; do
  [[ " ${ALL[*]} " == *" $t "* ]] || { echo "fuzz: unknown target '$t' (known: ${ALL[*]})" >&2; exit 2; }
done
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPS_FUZZ=ON -DPS_WERROR=ON \
  -DPS_BUILD_TESTS=OFF -DPS_BUILD_BENCH=OFF -DPS_CUDA=OFF "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]/#/fuzz_}"
# Safetensors seeds are binary: written here at run time rather than kept in the repository.
make_safetensors_seeds() {  # folder
  mkdir -p "$1"
  python3 - "$1" <<'PY'
import json, struct, sys
def write(path, tensors):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape, nbytes in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    h = json.dumps(header).encode()
    with open(f"{sys.argv[1]}/{path}", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + bytes(offset))
write("two_f32.safetensors", [("model.embed_tokens.weight", "F32", [4, 2], 32), ("lm_head.weight", "F32", [2, 2], 16)])
write("half.safetensors", [("a", "F16", [3], 6), ("b", "BF16", [1, 2, 2], 8), ("c", "F32", [], 4)])
PY
}
seeds() {  # the read-only seed folders of a target, besides tests/fuzz/corpus/TARGET
  case $1 in
    gguf) echo "$TESTDATA/stories260K $TESTDATA/tokenizers/vectors" ;;
    safetensors) make_safetensors_seeds build-fuzz/seeds/safetensors; echo build-fuzz/seeds/safetensors ;;
    jinja) echo models/templates ;;  # llama.cpp's chat templates (scripts/fetch_model.sh --templates)
  esac
}
max_len() {  # GGUF seeds are whole models (stories260K: 1.2 MB); the rest stay small
  [ -n "$max_len_arg" ] && { echo "$max_len_arg"; return; }
  case $1 in
    gguf) echo 1300000 ;;
    kv_owner) echo 3000 ;;  # 1,000 operations
    *) echo 65536 ;;
  esac
}
status=0
for t in "${targets[@]}"; do
  corpus=build-fuzz/corpus/$t
  mkdir -p "$corpus"
  dirs=("$corpus")
  for d in tests/fuzz/corpus/"$t" $(seeds "$t"); do [ -d "$d" ] && dirs+=("$d"); done
  if build-fuzz/fuzz_"$t" "${dirs[@]}" "${limit[@]}" -max_len="$(max_len "$t")" \
       -timeout=30 -rss_limit_mb=4096 -artifact_prefix=build-fuzz/"$t"- -print_final_stats=1 \
       >build-fuzz/"$t".log 2>&1; then
    echo "fuzz_$t: $(grep -oP 'stat::number_of_executed_units: \K[0-9]+' build-fuzz/"$t".log) executions, no crash" \
      "(corpus $(ls "$corpus" | wc -l) inputs)"
  else
    tail -40 build-fuzz/"$t".log
    echo "fuzz_$t failed: a crash leaves its input as build-fuzz/$t-* (log: build-fuzz/$t.log)" >&2
    status=1
  fi
done
exit $status
