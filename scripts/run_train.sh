#!/usr/bin/env bash
# The main job on a fresh machine: a real RL fine-tuning run on this CPU.
#   1. set up (scripts/setup.sh maniskill)
#   2. the warm start: by default the shipped one, warm_start/tiny-openvla-oft-put-on-plate (the tiny
#      OpenVLA-OFT preset trained by scripts/make_warm_start.sh on scripted-expert demos; its
#      made_by.json says how). VLA_WARM_START=train makes it here instead (about 70 min more);
#      VLA_WARM_START=<checkpoint folder> uses that one.
#   3. PPO from the warm start (vla-train --config cpu_ppo_tiny_put_on_plate) on
#      PutOnPlateInScene25Main-v3 (procedural assets, low-poly Panda, camera cropped to the workspace,
#      64 px), evaluating on held-out initial states every 10 iterations; writes the success curve
#   4. vla-eval of the warm start and of the PPO policy on the same held-out initial states
# Everything lands in runs/main/ (ppo/ with metrics.jsonl, tensorboard/, checkpoints/,
# success_curve.png; eval_warm_start/ and eval_ppo/; warm_start/ when trained here). PPO resumes
# from its latest checkpoint, so an interrupted run continues.
# Budget (env vars): VLA_PPO_MINUTES (50), VLA_EVAL_EPISODES (32). Extra arguments are recipe
# overrides for the PPO stage.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" maniskill
cd "$ROOT"
export HF_HUB_OFFLINE=1
source scripts/main_job_env.sh
OUT="${VLA_RUN_DIR:-runs/main}"
WARM="${VLA_WARM_START:-shipped}"
mkdir -p "$OUT"

case "$WARM" in
  shipped) MODEL=warm_start/tiny-openvla-oft-put-on-plate ;;
  train)
    echo "== 1/3 the warm start, trained here -> $OUT/warm_start"
    bash scripts/make_warm_start.sh "$OUT/warm_start"
    MODEL="$OUT/warm_start/sft" ;;
  *) MODEL="$WARM" ;;
esac
if [ ! -f "$MODEL/config.json" ]; then
  echo "error: VLA_WARM_START=$WARM: $MODEL is not a checkpoint folder (no config.json); use shipped, train," \
       "or the folder of a vla-train sft / vla-train checkpoint" >&2
  exit 2
fi
echo "== 2/3 PPO from the warm start $MODEL -> $OUT/ppo"
RESUME=()
if [ -f "$OUT/ppo/checkpoints/latest" ]; then RESUME=(runner.resume_dir=auto); fi
.venv/bin/vla-train --config cpu_ppo_tiny_put_on_plate --run-dir "$OUT/ppo" \
  actor.model.model_path="$MODEL" runner.max_epochs=100000 \
  runner.max_wall_minutes="${VLA_PPO_MINUTES:-50}" "${RESUME[@]}" "$@"
echo "== 3/3 held-out evaluation of the warm start and the PPO policy"
.venv/bin/vla-eval --checkpoint "$MODEL" --num-envs 4 --num-episodes "${VLA_EVAL_EPISODES:-32}" \
  --seed 7 --env-kwargs "$ENV_KWARGS" --out "$OUT/eval_warm_start"
.venv/bin/vla-eval --checkpoint "$OUT/ppo" --num-envs 4 --num-episodes "${VLA_EVAL_EPISODES:-32}" \
  --seed 7 --env-kwargs "$ENV_KWARGS" --out "$OUT/eval_ppo"
.venv/bin/python - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
rows = {s: json.load(open(f"{out}/eval_{s}/eval.json"))["rows"][0] for s in ("warm_start", "ppo")}
for key in ("success_once", "success_at_end", "grasped_once", "return"):
    if key not in rows["ppo"]:
        continue
    a, b = rows["warm_start"][key], rows["ppo"][key]
    scale, unit = (100, "%") if key != "return" else (1, "")
    print(f"{key:15s} warm start {scale * a:6.2f}{unit}  ->  PPO {scale * b:6.2f}{unit}  ({scale * (b - a):+.2f})")
print(f"success curve: {out}/ppo/success_curve.png   TensorBoard: .venv/bin/tensorboard --logdir {out}/ppo/tensorboard")
PY
