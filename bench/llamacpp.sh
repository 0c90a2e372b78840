#!/usr/bin/env bash
# llama.cpp's llama-bench: built once from the llama.cpp sources PyPI ships inside
# llama-cpp-python (vendor/llama.cpp), with GGML_NATIVE (this CPU's instruction set),
# into .cache/llamacpp/VERSION-CPU; then run with the arguments given.
# `ps_bench_engine --llamacpp` runs it; so can you:
#   bench/llamacpp.sh -m models/SmolLM2-135M-Instruct.Q4_1.gguf -t 2 -p 512 -n 64
# LLAMA_CPP_PYTHON_VERSION picks another release (default 0.3.36).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
CPU=$(grep -m1 '^flags' /proc/cpuinfo | md5sum | cut -c1-8)  # a native build runs only where it was built
DIR=.cache/llamacpp/$VERSION-$CPU
BIN=$DIR/build/bin/llama-bench
if [ ! -x "$BIN" ]; then
  echo "llamacpp.sh: building llama-bench from llama-cpp-python $VERSION's sources (PyPI; a few minutes)" >&2
  mkdir -p "$DIR"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" -d "$DIR" >&2
  tar xzf "$DIR/llama_cpp_python-$VERSION.tar.gz" -C "$DIR"
  cmake -S "$DIR/llama_cpp_python-$VERSION/vendor/llama.cpp" -B "$DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >&2
  cmake --build "$DIR/build" --target llama-bench -j "$(nproc)" >&2
fi
exec "$BIN" "$@"
