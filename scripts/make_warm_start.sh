#!/usr/bin/env bash
# The supervised warm start for the main job, made from scratch on this CPU (about 1.5 h on 2 cores):
#   1. scripted-expert demos on PutOnPlateInScene25Main-v3 (procedural assets, low-poly Panda,
#      the camera cropped to the workspace, 64 px)                              -> DIR/demos
#   2. SFT of the tiny OpenVLA-OFT preset from random init: VLA_SFT_STEPS (800) steps of 32,
#      lr 1e-3, 100 warm-up steps, cosine                                       -> DIR/sft_0
#   3. VLA_SFT_STAGES (2) continuation stages of VLA_SFT_STAGE_STEPS (600) steps of 32 at lr 5e-4, each
#      --init-from the previous one                                             -> DIR/sft_1 ...
# DIR/sft is the last stage. A stage whose output exists is skipped, so an interrupted run continues.
#
#   bash scripts/make_warm_start.sh [DIR]             DIR defaults to runs/warm_start
#   bash scripts/make_warm_start.sh DIR --publish     also refreshes the shipped checkpoint,
#                                                     warm_start/tiny-openvla-oft-put-on-plate (float16)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" maniskill
cd "$ROOT"
export HF_HUB_OFFLINE=1
source scripts/main_job_env.sh
DIR="${1:-runs/warm_start}"
EPISODES="${VLA_DEMO_EPISODES:-300}"
STEPS0="${VLA_SFT_STEPS:-800}"
STAGES="${VLA_SFT_STAGES:-2}"
STAGE_STEPS="${VLA_SFT_STAGE_STEPS:-600}"
mkdir -p "$DIR"

if [ ! -f "$DIR/demos/index.json" ]; then
  echo "== scripted-expert demos -> $DIR/demos"
  .venv/bin/vla-envs collect-demos PutOnPlateInScene25Main-v3 --num-envs 2 --steps 100000 \
    --episodes "$EPISODES" --image-size 64 --seed 100 --env-kwargs "$ENV_KWARGS" --out "$DIR/demos.partial"
  rm -rf "$DIR/demos" && mv "$DIR/demos.partial" "$DIR/demos"
fi
if [ ! -f "$DIR/sft_0/config.json" ]; then
  echo "== SFT from random init -> $DIR/sft_0"
  .venv/bin/vla-train sft --demos "$DIR/demos" --preset tiny-openvla-oft --slot-embeddings learned \
    --steps "$STEPS0" --batch-size 32 --lr 1e-3 --warmup-steps 100 --lr-schedule cosine \
    --eval-every 100 --out "$DIR/sft_0" --seed 0 --log-every 50
fi
for stage in $(seq 1 "$STAGES"); do
  if [ ! -f "$DIR/sft_$stage/config.json" ]; then
    echo "== SFT stage $stage of $STAGES, from sft_$((stage - 1)) -> $DIR/sft_$stage"
    .venv/bin/vla-train sft --demos "$DIR/demos" --init-from "$DIR/sft_$((stage - 1))" --steps "$STAGE_STEPS" \
      --batch-size 32 --lr 5e-4 --warmup-steps 20 --eval-every 200 --out "$DIR/sft_$stage" \
      --seed "$stage" --log-every 100
  fi
done
rm -rf "$DIR/sft" && cp -r "$DIR/sft_$STAGES" "$DIR/sft"
echo "warm start: $DIR/sft"

if [ "${2:-}" = "--publish" ]; then
  .venv/bin/python - "$DIR" "$STAGES" "$EPISODES" "$ENV_KWARGS" <<'PY'
import json, sys
from vla_trainer.checkpoint import publish_half_precision
from vla_trainer.metrics_log import sft_curve
run, stages, episodes, env_kwargs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
keep = ("initial_loss", "final_loss", "final_token_accuracy", "final_action_l1", "action_l1_of_zero", "steps", "curve")
def settings(stage):
    if stage == 0:
        return {"init": "random (preset tiny-openvla-oft, learned slot embeddings)", "batch_size": 32, "lr": 1e-3,
                "warmup_steps": 100, "lr_schedule": "cosine", "seed": 0}
    return {"init": f"stage {stage - 1}", "batch_size": 32, "lr": 5e-4, "warmup_steps": 20,
            "lr_schedule": "constant", "seed": stage}
index = json.load(open(f"{run}/demos/index.json"))
made_by = {
    "script": "scripts/make_warm_start.sh",
    "demos": {"env_id": index["env_id"], "asset_pack": index["asset_pack"], "episodes_recorded": episodes,
              "episodes_kept": len(index["episodes"]), "seed": 100, "image_size": 64,
              "env_kwargs": json.loads(env_kwargs)},
    "stages": [{"settings": settings(i), **{k: v for k, v in json.load(open(f"{run}/sft_{i}/sft_metrics.json")).items()
                                            if k in keep}}
               for i in range(stages + 1)],
    "weights": "float16 (loads as float32)",
}
out = publish_half_precision(f"{run}/sft", "warm_start/tiny-openvla-oft-put-on-plate", made_by)
# one curve over all stages (each stage's own curve counts its steps from 0)
curve, offset = [], 0
for stage in made_by["stages"]:
    curve += [{**point, "step": point["step"] + offset} for point in stage["curve"]]
    offset += stage["steps"]
sft_curve(curve, out / "sft_curve.png")
print(f"published {out}")
PY
fi
