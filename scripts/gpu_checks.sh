#!/usr/bin/env bash
# The CUDA backend's checks on the lent GPU machine (issues 14 and 34), run from the bundle
# scripts/gpu_bundle.sh makes (this file is its run.sh; it unpacks bundle.tar.gz into
# /tmp/ps-gpu first). Every phase ends well inside the device tool's 10 minutes per command
# (its steps' limits add up to under 9); logs and a summary line per step go to $OUT (else
# /tmp/gpu-out), and the exit status is the number of failed steps.
#   bash .gpu/run.sh smoke      the machine and the bundle: OS, driver, where libcuda and cuBLAS
#                               were found (a step fails naming the path when one cannot be opened),
#                               the programs' help, the scheduler tests on the CPU (no GPU needed)
#   bash .gpu/run.sh parity     the GPU checks only: CUDA kernels = CPU kernels; stories260K =
#                               llama.cpp's golden; the scheduler tests with PS_TEST_DEVICE=cuda;
#                               the server on --device cuda streams an answer to pruneserve-cli
#   bash .gpu/run.sh memcheck | racecheck | initcheck | synccheck
#                               that compute-sanitizer tool on cuda_test and the forward test's
#                               stories260K cases
#   bash .gpu/run.sh bench [ARGS]   ps_bench_engine --device cuda --synthetic llama3-8b --kv-dtype bf16
#                               (ARGS replace the default figures: prefill 4k/16k, decode at batch 1
#                               and 32; e.g. --prefill 32768 --strategy gemfilter,sliminfer for the
#                               strategies' TTFTs)
#   bash .gpu/run.sh with COMMAND...   COMMAND in the bundle's environment ($BIN, $STORIES,
#                               $SANITIZER, the library path): an experiment the phases do not cover
set -uo pipefail
case ${1:-} in
  smoke | parity | memcheck | racecheck | initcheck | synccheck | bench | with) ;;
  *) sed -n '2,/^set /{/^#/p}' "$0"; exit 2 ;;
esac
BUNDLE="$(cd "$(dirname "$0")" && pwd)/bundle.tar.gz"
HERE=/tmp/ps-gpu
if ! cmp -s "$BUNDLE" "$HERE/bundle.tar.gz" 2>/dev/null; then
  rm -rf "$HERE" && mkdir -p "$HERE" && tar -C "$HERE" -xzf "$BUNDLE" && cp "$BUNDLE" "$HERE/" || exit 2
fi
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
PHASE=${1:-}
shift || true
LOG="$OUT/$PHASE.log"
SUMMARY="$OUT/summary.txt"
failed=0

# The bundle's libraries come first; the machine's own path is kept after them (its driver may
# be visible only through it). cuBLAS is the machine's (too large to carry): the CUDA toolkit's,
# or PyTorch's CUDA 13 wheels' (site-packages/nvidia/cu13/lib). libstdc++ too unless it is too old.
cublas_dir=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
  $(python3 -c 'import nvidia, os; [print(os.path.join(p, s, "lib")) for p in nvidia.__path__ for s in ("cu13", "cublas")]' 2>/dev/null) \
  $(find /usr/local /opt /usr/lib -name libcublas.so.13 -printf '%h\n' 2>/dev/null | head -1); do
  if [ -e "$d/libcublas.so.13" ]; then cublas_dir=$d; break; fi
done
driver_dir=""
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu; do
  if [ -e "$d/libcuda.so.1" ]; then driver_dir=$d; break; fi
done
LD_LIBRARY_PATH="$HERE/bin:$HERE/lib${cublas_dir:+:$cublas_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}${driver_dir:+:$driver_dir}"
if ldd "$HERE"/bin/* 2>&1 | grep -q 'GLIBCXX.*not found\|libstdc++.*not found'; then
  LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$HERE/lib-std"
fi
export LD_LIBRARY_PATH
export PS_TESTDATA="$HERE/testdata" PS_CUDA_PLUGIN="$HERE/bin/libps_cuda.so"
export BIN="$HERE/bin" STORIES="$HERE/testdata/stories260K/stories260K.gguf" OUT
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
  /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
export SANITIZER

# step NAME SECONDS COMMAND...: runs COMMAND (a program or a function of this script)
# under a time limit, logs it and records the verdict. A skipped test fails the step:
# on the GPU machine a skip means the device was not usable.
step() {
  local name=$1 limit=$2 t0=$SECONDS rc part
  shift 2
  part=$(mktemp)
  echo "=== $name ($(date -u +%T), limit ${limit}s): $*" | tee -a "$LOG"
  if declare -F "$1" > /dev/null; then
    timeout --kill-after=10 "$limit" bash -c "$(declare -f "$1"); $*" > "$part" 2>&1
  else
    timeout --kill-after=10 "$limit" "$@" > "$part" 2>&1
  fi
  rc=$?
  cat "$part" >> "$LOG"
  local verdict=PASS
  if [ $rc -ne 0 ]; then
    verdict="FAIL (exit $rc$([ $rc -eq 124 ] && echo ', timed out'))"
  elif grep -q '^\[  SKIPPED \]' "$part"; then
    verdict="FAIL (tests skipped)"
    rc=1
  fi
  [ $rc -eq 0 ] || failed=$((failed + 1))
  echo "$PHASE/$name: $verdict in $((SECONDS - t0)) s" | tee -a "$SUMMARY" "$LOG"
  [ $rc -eq 0 ] || tail -n 40 "$part"
  rm -f "$part"
}

# can_open LIB DIR: LIB loads with this LD_LIBRARY_PATH; else says which folder was searched.
can_open() {
  if python3 -c "import ctypes, sys; ctypes.CDLL(sys.argv[1])" "$1" 2>/dev/null; then
    echo "$1 opens (found in ${2:-the default search path})"
  else
    echo "$1 cannot be opened: searched ${2:-nowhere that has it} and LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    return 1
  fi
}

# What the machine is, and whether the driver and cuBLAS open.
probe() {
  { echo "bundle of $(cat "$HERE/commit" 2>/dev/null)"; uname -a; grep PRETTY_NAME /etc/os-release
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
    echo "libcuda.so.1 from ${driver_dir:-the default search path}; cuBLAS from ${cublas_dir:-nowhere (not found)}"
  } | tee -a "$LOG"
  step driver_libraries 30 bash -c "$(declare -f can_open); can_open libcuda.so.1 '$driver_dir' && can_open libcublas.so.13 '$cublas_dir'"
}

smoke() {
  probe
  ldd "$BIN"/* | grep -v "$HERE" | awk '$2 == "=>" {print "  from the machine:", $1, $3}' | sort -u | tee -a "$LOG"
  step libraries 30 bash -c "! ldd $BIN/* | grep 'not found'"
  step programs 30 bash -c "for p in pruneserve pruneserve-cli ps_bench_engine; do $BIN/\$p --help > /dev/null || exit 1; done"
  step scheduler_cpu 240 env PS_TEST_DEVICE=cpu "$BIN/scheduler_test"
}

# The server on --device cuda streams a greedy answer to the CLI, then drains on SIGTERM.
server_streams() {
  local port=50551 log="$OUT/server.log" pid i
  "$BIN/pruneserve" --model "$STORIES" --device cuda --port $port --metrics-port -1 > "$log" 2>&1 &
  pid=$!
  for i in $(seq 60); do  # the model loads in well under a second; wait up to 30 s for SERVING
    "$BIN/pruneserve-cli" --addr 127.0.0.1:$port health 2>/dev/null | grep -qx SERVING && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.5
  done
  "$BIN/pruneserve-cli" --addr 127.0.0.1:$port generate --prompt "Once upon a time" --max-new-tokens 48 \
    --temperature 0 --stats
  local rc=$?
  kill -TERM $pid
  wait $pid
  local server_rc=$?
  echo "--- server log"; cat "$log"
  grep -q 'cuda' "$log" || { echo "the server did not say it runs on cuda"; return 1; }
  [ $rc -eq 0 ] && [ $server_rc -eq 0 ]
}

case $PHASE in
  smoke) smoke ;;
  parity)  # GPU steps only; the limits add up to 9 minutes
    probe
    step cuda_test 90 "$BIN/cuda_test"
    step cuda_forward_test 120 "$BIN/cuda_forward_test"
    # FailingSwapsFallBackToRecompute injects through the CPU swap engine's copy hook
    # (it skips on cuda, and a skip fails a step here).
    for t in scheduler_test preemption_test pruning_scheduler_test; do
      step "${t}_cuda" 90 env PS_TEST_DEVICE=cuda "$BIN/$t" --gtest_filter=-*FailingSwapsFallBackToRecompute
    done
    # HostHitTest times and fails copies through the CPU swap engine's copy hook.
    step prefix_cache_scheduler_test_cuda 60 env PS_TEST_DEVICE=cuda "$BIN/prefix_cache_scheduler_test" \
      --gtest_filter=-HostHitTest.*
    step server_streams 45 server_streams
    ;;
  memcheck | racecheck | initcheck | synccheck)
    [ -n "$SANITIZER" ] || { echo "$PHASE: compute-sanitizer not found" | tee -a "$SUMMARY"; exit 1; }
    # initcheck does not see cuBLAS's Hopper BF16 GEMMs' stores: their outputs zeroed first
    # (kernels/cuda/cuda_kernels.cu)
    [ "$PHASE" = initcheck ] && export PS_CUDA_ZERO_GEMM_OUTPUT=1
    step "${PHASE}_cuda_test" 240 "$SANITIZER" --tool "$PHASE" --error-exitcode 99 "$BIN/cuda_test"
    step "${PHASE}_forward" 240 "$SANITIZER" --tool "$PHASE" --error-exitcode 99 "$BIN/cuda_forward_test" \
      --gtest_filter='*StoriesGreedy*:*Logits*'
    ;;
  bench)
    args=("$@")
    [ ${#args[@]} -gt 0 ] || args=(--prefill 4096,16384 --decode 64 --streams 32 --repeats 1)
    step bench 570 "$BIN/ps_bench_engine" --device cuda --synthetic llama3-8b --kv-dtype bf16 --threads "$(nproc)" \
      "${args[@]}"
    cat "$LOG"
    ;;
  with) "$@" || failed=1 ;;
esac
echo "$PHASE: $failed failed step(s); logs in $OUT"
exit $failed
