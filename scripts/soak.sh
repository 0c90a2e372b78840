#!/usr/bin/env bash
# Soak test: the server under constant preemption, 64 streams with cancels, deadlines,
# Aborts, priorities and every strategy, sampled for leaks; ends with a verdict.
# Usage: scripts/soak.sh [--minutes 30] [--out soak-out] [--build build] [...]
#        (scripts/soak.py --help lists every option; the binaries must be built)
set -euo pipefail
cd "$(dirname "$0")/.."
exec /usr/bin/python3 scripts/soak.py "$@"
