#!/usr/bin/env bash
# The main job on a fresh machine: a real RL fine-tuning run on this CPU.
#   1. set up (scripts/setup.sh maniskill)
#   2. the warm start: by default the shipped one, warm_start/tiny-openvla-oft-put-on-plate (the tiny
#      OpenVLA-OFT preset trained by scripts/make_warm_start.sh on scripted-expert demos of the full task; its
#      made_by.json says how). VLA_WARM_START=train makes it here instead (about 2 h more);
#      VLA_WARM_START=<checkpoint folder> uses that one.
#   3. RL from the warm start (procedural assets, low-poly Panda, camera cropped to the workspace, 64 px) on
#      VLA_TASK=easy (default): the curriculum variant PutOnPlateInScene25Easy-v3 (the plate on one cell, the
#        object on 4 cells, one yaw), GRPO for 26 iterations (vla-train --config cpu_grpo_tiny_put_on_plate_easy,
#        16 envs in groups of 4), about 15 min here; held out: PutOnPlateInScene25EasyHeldOut-v3, the other half
#        of its checkerboard of initial states, never trained on
#      VLA_TASK=full: PutOnPlateInScene25Main-v3 itself, VLA_ALGORITHM grpo (cpu_grpo_tiny_put_on_plate) or ppo
#        (cpu_ppo_tiny_put_on_plate) for VLA_RL_MINUTES (40) of wall time; held out: other initial states of it
#      evaluating on held-out initial states every 10 or 20 iterations; writes the success curve
#   4. vla-eval of the warm start and of the RL policy on the same 128 held-out episodes (initial states drawn
#      from the held-out set by one seed, so some repeat; checked to be the same for both), with the change
#      of each metric, a Fisher exact test of the success counts and the paired (McNemar) test state by state
# Everything lands in runs/main/ (grpo/ or ppo/ with metrics.jsonl, tensorboard/, checkpoints/,
# success_curve.png; eval_warm_start/ and eval_grpo/ or eval_ppo/; warm_start/ when trained here). RL
# resumes from its latest checkpoint, so an interrupted run continues.
# Budget (env vars): VLA_RL_MINUTES (a wall-time cap; 40 for full, none for easy), VLA_EVAL_EPISODES (128 each, a multiple of 4).
# Extra arguments are recipe overrides for the RL stage.
set -euo pipefail
ALG="${VLA_ALGORITHM:-grpo}"
case "$ALG" in
  grpo|ppo) ;;
  *) echo "error: VLA_ALGORITHM=$ALG: use grpo or ppo" >&2; exit 2 ;;
esac
TASK="${VLA_TASK:-easy}"
case "$TASK" in
  easy) if [ "$ALG" != grpo ]; then
          echo "error: VLA_ALGORITHM=$ALG: the easy task has a GRPO recipe only; use VLA_TASK=full for PPO" >&2; exit 2
        fi
        RECIPE="cpu_grpo_tiny_put_on_plate_easy" ;;
  full) RECIPE="cpu_${ALG}_tiny_put_on_plate" ;;
  *) echo "error: VLA_TASK=$TASK: use easy (the curriculum variant, the default) or full (PutOnPlateInScene25Main-v3)" >&2
     exit 2 ;;
esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${VLA_RUN_DIR:-runs/main}"
WARM="${VLA_WARM_START:-shipped}"
RL_MINUTES="${VLA_RL_MINUTES:-$([ "$TASK" = full ] && echo 40 || echo 600)}"  # easy: its 26 iterations decide
EVAL_EPISODES="${VLA_EVAL_EPISODES:-128}"
# Checked before setup, so a typo does not surface after the RL run.
if ! [[ "$RL_MINUTES" =~ ^[0-9]+(\.[0-9]+)?$ ]] || [[ "$RL_MINUTES" =~ ^0+(\.0+)?$ ]]; then
  echo "error: VLA_RL_MINUTES=$RL_MINUTES: minutes of RL wall time, a number above 0" >&2; exit 2
fi
if ! [[ "$EVAL_EPISODES" =~ ^[0-9]+$ ]] || [ "$EVAL_EPISODES" -lt 1 ] || [ $((10#$EVAL_EPISODES % 4)) -ne 0 ]; then
  echo "error: VLA_EVAL_EPISODES=$EVAL_EPISODES: a number of held-out episodes, a positive multiple of 4 (the eval's envs)" >&2; exit 2
fi
case "$WARM" in
  shipped) MODEL=warm_start/tiny-openvla-oft-put-on-plate ;;
  train) MODEL="$OUT/warm_start/sft" ;;
  *) MODEL="$WARM"
     if [ ! -f "$MODEL/config.json" ]; then
       echo "error: VLA_WARM_START=$WARM: $MODEL is not a checkpoint folder (no config.json); use shipped, train," \
            "or the folder of a vla-train sft / vla-train checkpoint" >&2
       exit 2
     fi ;;
esac
bash scripts/setup.sh maniskill
export HF_HUB_OFFLINE=1
# the overrides, checked against the recipe before any work (a typo would otherwise surface after the warm start)
if ! .venv/bin/vla-train rl --config "$RECIPE" "$@" --print-config >/dev/null; then
  echo "error: the arguments ($*) are recipe overrides (key=value) of $RECIPE; see above" >&2; exit 2
fi
# the held-out task and the scene options (low-poly Panda, procedural assets, the camera's crop) are the
# recipe's env.eval: vla-eval reads them from it (--env-from), as the RL run did
EVAL_TASK="$(.venv/bin/vla-train rl --config "$RECIPE" --print-config env.eval.task | tr -d '"')"
mkdir -p "$OUT"

if [ "$WARM" = train ]; then
  echo "== 1/3 the warm start, trained here -> $OUT/warm_start"
  bash scripts/make_warm_start.sh tiny_put_on_plate --out "$OUT/warm_start"
fi
echo "== 2/3 ${ALG^^} on $([ "$TASK" = easy ] && echo "the curriculum variant PutOnPlateInScene25Easy-v3" \
  || echo PutOnPlateInScene25Main-v3) from the warm start $MODEL -> $OUT/$ALG"
RESUME=()
if [ -f "$OUT/$ALG/checkpoints/latest" ]; then RESUME=(runner.resume_dir=auto); fi
EPOCHS=()
if [ "$TASK" = full ]; then EPOCHS=(runner.max_epochs=100000); fi  # full: the wall time decides
.venv/bin/vla-train --config "$RECIPE" --run-dir "$OUT/$ALG" \
  actor.model.model_path="$MODEL" "${EPOCHS[@]}" \
  runner.max_wall_minutes="$RL_MINUTES" "${RESUME[@]}" "$@"
echo "== 3/3 held-out evaluation on $EVAL_TASK of the warm start and the ${ALG^^} policy (the same initial states)"
.venv/bin/vla-eval --checkpoint "$MODEL" --env-from "$RECIPE" --num-envs 4 --num-episodes "$EVAL_EPISODES" \
  --seed 7 --out "$OUT/eval_warm_start"
.venv/bin/vla-eval --checkpoint "$OUT/$ALG" --env-from "$RECIPE" --num-envs 4 --num-episodes "$EVAL_EPISODES" \
  --seed 7 --out "$OUT/eval_$ALG" --baseline "$OUT/eval_warm_start"
echo "success curve: $OUT/$ALG/success_curve.png   TensorBoard: .venv/bin/tensorboard --logdir $OUT/$ALG/tensorboard"
