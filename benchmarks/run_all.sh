#!/usr/bin/env bash
# Runs the whole tfring benchmark suite and writes benchmarks/RESULTS.md.
#   bash benchmarks/run_all.sh            # full run (about 8-12 minutes on 2 idle cores)
#   bash benchmarks/run_all.sh --quick    # smoke run
# All options are run_all.py's (python benchmarks/run_all.py --help).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/.."
exec "${PYTHON:-python}" "$here/run_all.py" "$@"
