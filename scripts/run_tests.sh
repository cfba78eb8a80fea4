#!/usr/bin/env bash
# The test suite on a fresh machine: set up (system packages as root, venv, extras), then
# pytest on VLA_TEST_WORKERS processes (default 2; 0 runs in this process; tests/conftest.py
# keeps each module on one worker, and runs the franky-sim tests first and alone). Extra
# arguments go to pytest, e.g. `bash scripts/run_tests.sh -m "not slow"`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" maniskill,libero,dev,robot,ros,ros-build
cd "$ROOT"
export HF_HUB_OFFLINE=1 PYTHONHASHSEED=0
exec .venv/bin/python -m pytest -n "${VLA_TEST_WORKERS:-2}" --dist loadscope "$@"
