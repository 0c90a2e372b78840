#!/usr/bin/env bash
# Builds the libFuzzer targets and fuzzes each parser (and the KV owner's operations) for
# 5 s (scripts/fuzz.sh), then builds and runs the whole test suite twice: a normal
# Release build and an AddressSanitizer + UndefinedBehaviorSanitizer build. Every build
# treats warnings as errors (PS_WERROR). Installs what it needs.
# Usage: scripts/test.sh                        (fuzz normal asan)
#        PS_TEST_BUILDS=tsan scripts/test.sh    (ThreadSanitizer: thread pool, scheduler, swap engine, server tests)
#        PS_TEST_BUILDS=container scripts/test.sh   (the container image: built with mmdebstrap + buildah
#                                                and started; needs root and Debian's mirror; ~3 minutes)
#        PS_TEST_BUILDS="normal tsan" ...       (any subset of: fuzz normal asan tsan container)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/fetch_model.sh
scripts/fetch_model.sh --templates
JOBS=$(nproc)
RUNNER=""  # a command prefix for the build and the tests
run_suite() {  # name, build dir, ctest label regex ('' = all), extra cmake args...; EXCLUDE_LABELS: labels left out
  local name=$1 dir=$2 labels=$3
  shift 3
  echo "=== $name build ($dir) ==="
  local t0=$SECONDS
  cmake -S . -B "$dir" -G Ninja -DPS_BUILD_TESTS=ON -DPS_WERROR=ON "$@" >/dev/null
  $RUNNER cmake --build "$dir" -j "$JOBS"
  echo "=== $name tests (built in $((SECONDS - t0)) s) ==="
  t0=$SECONDS
  $RUNNER ctest --test-dir "$dir" --output-on-failure -j "$JOBS" --timeout 900 ${labels:+-L "$labels"} \
    ${EXCLUDE_LABELS:+-LE "$EXCLUDE_LABELS"}
  echo "=== $name tests took $((SECONDS - t0)) s ==="
}
for b in ${PS_TEST_BUILDS:-fuzz normal asan}; do
  case $b in
    normal) run_suite normal build "" -DCMAKE_BUILD_TYPE=Release ;;
    asan) ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 EXCLUDE_LABELS=soak \
            run_suite "ASan+UBSan" build-asan "" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPS_SANITIZE=address -DPS_BUILD_BENCH=OFF \
            "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" ;;  # -O1 and line tables only: file:line traces, a build in half the time
    # TSan's runtime in this GCC can crash at start-up under high-entropy ASLR: run without it.
    # tsan_slow: tests whose single-threaded work takes many minutes under TSan.
    tsan) RUNNER="setarch $(uname -m) -R" TSAN_OPTIONS="halt_on_error=1 suppressions=$PWD/tests/tsan.supp" EXCLUDE_LABELS=tsan_slow \
            run_suite ThreadSanitizer build-tsan "threads|scheduler|server|swap" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
            -DPS_SANITIZE=thread -DPS_CUDA=OFF -DPS_BUILD_BENCH=OFF ;;
    fuzz) echo "=== fuzz (build-fuzz) ==="; scripts/fuzz.sh --seconds "${PS_FUZZ_SECONDS:-5}" ;;
    container)
      command -v buildah >/dev/null && command -v mmdebstrap >/dev/null && command -v podman >/dev/null ||
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap buildah podman >/dev/null
      cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
      cmake --build build -j "$JOBS" --target pruneserve-cli pruneserve-run
      tests/deploy/container_test.sh ;;
    *) echo "unknown build '$b'" >&2; exit 2 ;;
  esac
done
