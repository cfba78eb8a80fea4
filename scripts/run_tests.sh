#!/usr/bin/env bash
# The test suite on a fresh machine: set up (system packages as root, venv, extras), then
# pytest on VLA_TEST_WORKERS processes (default 2; 0 runs in this process; tests/conftest.py
# keeps each module on one worker, and runs the franky-sim tests first: beside the others at a
# higher priority where this user may raise one, else alone). Extra
# arguments go to pytest, e.g. `bash scripts/run_tests.sh -m "not slow"`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORKERS="${VLA_TEST_WORKERS:-2}"
if ! [[ "$WORKERS" =~ ^[0-9]+$ ]]; then  # checked before setup, not by pytest after it
  echo "error: VLA_TEST_WORKERS=$WORKERS: a number of pytest worker processes (0: the tests run in one process)" >&2
  exit 2
fi
bash "$ROOT/scripts/setup.sh" maniskill,libero,dev,robot,ros,ros-build
cd "$ROOT"
export HF_HUB_OFFLINE=1 PYTHONHASHSEED=0
exec .venv/bin/python -m pytest -n "$WORKERS" --dist loadscope "$@"
