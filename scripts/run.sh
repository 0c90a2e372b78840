#!/usr/bin/env bash
# The main job: installs what is needed, builds, fetches the default model and
# generates one chat answer, streamed to the terminal.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/fetch_model.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPS_BUILD_TESTS=OFF >/dev/null
cmake --build build -j "$(nproc)" --target pruneserve-run
PROMPT=${1:-"What is the capital of France? Answer in one sentence."}
echo "> $PROMPT"
build/pruneserve-run --model models/SmolLM2-135M-Instruct.Q4_1.gguf --chat --prompt "$PROMPT" --max-new-tokens 128 --stats
