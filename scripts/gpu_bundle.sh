#!/usr/bin/env bash
# Packs the CUDA backend's GPU checks (issue 14) for the lent GPU machine into .gpu/,
# which .git/info/exclude keeps out of git. That machine's image is not Debian and
# has no network, so .gpu/bundle.tar.gz holds the programs, libps_cuda.so, the shared
# libraries they load apart from glibc's (ldd; libstdc++ and libgcc_s apart, used only
# when the machine's own are too old) and stories260K; .gpu/run.sh (scripts/gpu_checks.sh)
# unpacks it there. cuBLAS (570 MB with cuBLASLt) stays behind: run.sh takes the
# machine's. The whole must stay under the device tool's 64 MiB (about 30 MB packed: oneDNN
# is 40 MB of the ~80 unpacked).
# Usage: scripts/gpu_bundle.sh [BUILD_DIR]   (default: build, a Release build with nvcc)
# Then, with the device tool: run(command="bash .gpu/run.sh parity", carry=[".gpu"]),
# then "sanitize", then "bench" (run.sh --help).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
TESTDATA=${PS_TESTDATA:-../shared/testdata}
PROGRAMS=(tests/cuda_test tests/cuda_forward_test tests/scheduler_test tests/preemption_test
  tests/pruning_scheduler_test tests/prefix_cache_scheduler_test pruneserve pruneserve-cli ps_bench_engine)
LIMIT_MIB=60

[ -f "$BUILD/CMakeCache.txt" ] || { echo "gpu_bundle: no build in $BUILD (scripts/test.sh makes one)" >&2; exit 1; }
grep -q '^PS_CUDA:BOOL=ON' "$BUILD/CMakeCache.txt" || { echo "gpu_bundle: $BUILD was configured without CUDA" >&2; exit 1; }
cmake --build "$BUILD" --target ps_cuda "${PROGRAMS[@]##*/}"

exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
rm -rf .gpu
S=.gpu/stage
mkdir -p $S/bin $S/lib $S/lib-std $S/testdata
for p in "${PROGRAMS[@]}" libps_cuda.so; do
  strip --strip-unneeded -o "$S/bin/${p##*/}" "$BUILD/$p"
done
# The shared libraries the programs load, glibc's own and the plug-in aside.
ldd $S/bin/* | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  name=${lib##*/}
  case $name in
    libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux* | libps_cuda.so) continue ;;
    libstdc++.so.* | libgcc_s.so.*) dest=$S/lib-std ;;
    *) dest=$S/lib ;;
  esac
  cp -L "$lib" "$dest/$name"
  chmod u+w "$dest/$name"
  strip --strip-unneeded "$dest/$name" 2>/dev/null || true
done
if ldd $S/bin/* | grep -q 'not found'; then
  echo "gpu_bundle: a library is missing here:" >&2
  ldd $S/bin/* | grep 'not found' >&2
  exit 1
fi
cp -r "$TESTDATA/stories260K" $S/testdata/
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!.gpu' || echo ' with uncommitted changes')" > $S/commit
tar -C $S -czf .gpu/bundle.tar.gz .
rm -rf $S
cp scripts/gpu_checks.sh .gpu/run.sh
mib=$(du -sm .gpu | cut -f1)
echo "gpu_bundle: .gpu/ holds ${mib} MiB: bundle.tar.gz (${#PROGRAMS[@]} programs, libps_cuda.so, their libraries, stories260K) and run.sh"
if [ "$mib" -gt "$LIMIT_MIB" ]; then
  echo "gpu_bundle: over ${LIMIT_MIB} MiB: the device tool carries 64 MiB with the working tree" >&2
  exit 1
fi
