#!/usr/bin/env bash
# The main job on a fresh machine: set up, then roll out a ManiSkill task on CPU through the
# env contract and write a tiled video with per-env reward/success overlays.
# Output: runs/demo/rollout.mp4 and runs/demo/rollout.json.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" maniskill
cd "$ROOT"
exec .venv/bin/vla-envs rollout "${VLA_DEMO_ENV:-vla/PickCube-v1}" --num-envs 2 --steps 60 --chunk 4 \
  --video runs/demo/rollout.mp4 "$@"
