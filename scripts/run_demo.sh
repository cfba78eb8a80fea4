#!/usr/bin/env bash
# The main job on a fresh machine: set up, then run the scripted expert on
# PutOnPlateInScene25Main-v3 (ManiSkill on CPU, the procedural asset pack unless the official
# one is installed) through the env contract, writing a tiled video with per-env
# reward/success overlays and a JSON summary (success_once, success_at_end, return).
# Output: runs/demo/rollout.mp4 and runs/demo/rollout.json. Extra arguments go to
# `vla-envs rollout` (e.g. --num-envs 4 --steps 160).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" maniskill
cd "$ROOT"
exec .venv/bin/vla-envs rollout "${VLA_DEMO_ENV:-PutOnPlateInScene25Main-v3}" --policy expert \
  --num-envs 2 --steps 80 --image-size 160 --video runs/demo/rollout.mp4 "$@"
