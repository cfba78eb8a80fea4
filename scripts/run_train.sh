#!/usr/bin/env bash
# The main job on a fresh machine: a real RL fine-tuning run on this CPU.
#   1. set up (scripts/setup.sh maniskill)
#   2. record scripted-expert demos on PutOnPlateInScene25Main-v3 (procedural assets, low-poly Panda,
#      the camera cropped to the workspace, 64 px)
#   3. supervised warm start of the tiny OpenVLA-OFT preset on them (vla-train sft)
#   4. PPO from that warm start (vla-train --config cpu_ppo_tiny_put_on_plate), evaluating on
#      held-out initial states every 10 iterations; writes the success curve
#   5. vla-eval of the warm start and of the PPO policy on the same held-out initial states
# Everything lands in runs/main/ (demos/, sft/, ppo/ with metrics.jsonl, tensorboard/,
# checkpoints/, success_curve.png; eval_sft/ and eval_ppo/). A step whose output exists is
# skipped, and PPO resumes from its latest checkpoint, so an interrupted run continues.
# Budget (env vars): VLA_DEMO_EPISODES (300), VLA_SFT_STEPS (800), VLA_PPO_MINUTES (25),
# VLA_EVAL_EPISODES (32). Extra arguments are recipe overrides for the PPO stage.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" maniskill
cd "$ROOT"
export HF_HUB_OFFLINE=1
OUT="${VLA_RUN_DIR:-runs/main}"
ENV_KWARGS='{"low_poly": true, "assets": "procedural", "camera_crop": [190, 80, 460, 350]}'
mkdir -p "$OUT"

if [ ! -f "$OUT/demos/index.json" ]; then
  echo "== 1/4 scripted-expert demos -> $OUT/demos"
  .venv/bin/vla-envs collect-demos PutOnPlateInScene25Main-v3 --num-envs 2 --steps 100000 \
    --episodes "${VLA_DEMO_EPISODES:-300}" --image-size 64 --seed 100 --env-kwargs "$ENV_KWARGS" \
    --out "$OUT/demos.partial"
  rm -rf "$OUT/demos" && mv "$OUT/demos.partial" "$OUT/demos"
fi
if [ ! -f "$OUT/sft/config.json" ]; then
  echo "== 2/4 supervised warm start -> $OUT/sft"
  .venv/bin/vla-train sft --demos "$OUT/demos" --preset tiny-openvla-oft --slot-embeddings learned \
    --steps "${VLA_SFT_STEPS:-800}" --batch-size 32 --lr 1e-3 --warmup-steps 100 --lr-schedule cosine \
    --eval-every 100 --out "$OUT/sft" --seed 0 --log-every 50
fi
echo "== 3/4 PPO from the warm start -> $OUT/ppo"
RESUME=()
if [ -f "$OUT/ppo/checkpoints/latest" ]; then RESUME=(runner.resume_dir=auto); fi
.venv/bin/vla-train --config cpu_ppo_tiny_put_on_plate --run-dir "$OUT/ppo" \
  actor.model.model_path="$OUT/sft" runner.max_epochs=100000 \
  runner.max_wall_minutes="${VLA_PPO_MINUTES:-25}" "${RESUME[@]}" "$@"
echo "== 4/4 held-out evaluation of the warm start and the PPO policy"
for stage in sft ppo; do
  .venv/bin/vla-eval --checkpoint "$OUT/$stage" --num-envs 4 --num-episodes "${VLA_EVAL_EPISODES:-32}" \
    --seed 7 --env-kwargs "$ENV_KWARGS" --out "$OUT/eval_$stage"
done
.venv/bin/python - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
rows = {s: json.load(open(f"{out}/eval_{s}/eval.json"))["rows"][0] for s in ("sft", "ppo")}
for key in ("success_once", "success_at_end"):
    a, b = rows["sft"][key], rows["ppo"][key]
    print(f"{key:15s} warm start {100 * a:5.1f}%  ->  PPO {100 * b:5.1f}%  ({100 * (b - a):+.1f} points)")
print(f"success curve: {out}/ppo/success_curve.png   TensorBoard: .venv/bin/tensorboard --logdir {out}/ppo/tensorboard")
PY
