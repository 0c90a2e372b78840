#!/usr/bin/env bash
# Builds and runs the whole test suite twice: a normal Release build and an
# AddressSanitizer + UndefinedBehaviorSanitizer build. Installs what it needs.
# Usage: scripts/test.sh            (both builds)
#        PS_TEST_BUILDS=normal scripts/test.sh   (only one of: normal asan)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/fetch_model.sh
JOBS=$(nproc)
run_suite() {  # name, build dir, extra cmake args...
  local name=$1 dir=$2
  shift 2
  echo "=== $name build ($dir) ==="
  cmake -S . -B "$dir" -G Ninja -DPS_BUILD_TESTS=ON "$@" >/dev/null
  cmake --build "$dir" -j "$JOBS"
  echo "=== $name tests ==="
  ctest --test-dir "$dir" --output-on-failure -j "$JOBS" --timeout 900
}
for b in ${PS_TEST_BUILDS:-normal asan}; do
  case $b in
    normal) run_suite normal build -DCMAKE_BUILD_TYPE=Release ;;
    asan) ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
            run_suite "ASan+UBSan" build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPS_SANITIZE=address ;;
    *) echo "unknown build '$b'" >&2; exit 2 ;;
  esac
done
