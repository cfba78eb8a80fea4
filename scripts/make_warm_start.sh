#!/usr/bin/env bash
# The supervised warm start for the main job, made from scratch on this CPU (about 2 h on 2 cores):
#   1. VLA_DEMO_EPISODES (900) scripted-expert episodes on PutOnPlateInScene25Main-v3 (procedural
#      assets, low-poly Panda, the camera cropped to the workspace, 64 px), with the expert's
#      privileged poses; the expert moves at most VLA_EXPERT_MAX_SPEED (1.0) of the controller's
#      10 cm per step and axis                                                 -> DIR/demos
#   2. vision pretraining of a new tiny OpenVLA-OFT (learned slot embeddings): VLA_VISION_STEPS (400)
#      steps of 64 frames, lr 3e-4; the towers learn to locate the TCP, object and plate -> DIR/vision
#   3. SFT of the whole policy from it: VLA_SFT_STEPS (700) steps of 32, lr 5e-4, 50 warm-up steps,
#      cosine. VLA_PATCH_POSITIONS (sincos; none: off) adds a trained place code to the projected
#      patches; VLA_LAYOUT_TOKEN (linear; none: off) adds a token that maps all patches flattened;
#      VLA_SCENE_LOSS_WEIGHT (1; 0: off) co-trains grounding (the scene poses regressed from the
#      action slots); VLA_FIRST_FRAME_REPEATS (8) draws each episode's first frame, where the
#      reach is decided, that many times per epoch; VLA_RELEASE_FRAME_REPEATS (1) does the same
#      for the frames whose action chunk holds the release over the plate       -> DIR/sft_0
#   4. VLA_SFT_STAGES (1) continuation stages of VLA_SFT_STAGE_STEPS (1000) steps of 32 at lr 3e-4,
#      20 warm-up steps, cosine, each --init-from the previous one, with the same scene-loss weight
#      and first- and release-frame repeats
#                                                                               -> DIR/sft_1 ...
#   5. the robot-state stage: VLA_STATE_STAGE_STEPS (500; 0: none) more steps like a continuation
#      stage, with `vla-train sft --proprio`: the model gains a projected token of the robot's
#      joint state, z-scored with statistics taken from the demos      -> DIR/sft_<VLA_SFT_STAGES + 1>
# DIR/sft is the last stage. A stage whose output exists is skipped, so an interrupted run continues.
#
#   bash scripts/make_warm_start.sh [DIR]             DIR defaults to runs/warm_start
#   bash scripts/make_warm_start.sh DIR --publish     also refreshes the shipped checkpoint,
#                                                     warm_start/tiny-openvla-oft-put-on-plate (float16)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DIR="${1:-runs/warm_start}"
if [ $# -gt 2 ] || [[ "${2:---publish}" != --publish ]] || [[ "$DIR" == -* ]]; then
  echo "error: arguments '$*': usage: bash scripts/make_warm_start.sh [DIR] [--publish]" >&2; exit 2
fi
EPISODES="${VLA_DEMO_EPISODES:-900}"
DEMO_SEED=300
EXPERT_MAX_SPEED="${VLA_EXPERT_MAX_SPEED:-1.0}"
VISION_STEPS="${VLA_VISION_STEPS:-400}"
PATCH_POSITIONS="${VLA_PATCH_POSITIONS:-sincos}"
LAYOUT_TOKEN="${VLA_LAYOUT_TOKEN:-linear}"
STEPS0="${VLA_SFT_STEPS:-700}"
SCENE_WEIGHT="${VLA_SCENE_LOSS_WEIGHT:-1}"
FIRST_FRAME_REPEATS="${VLA_FIRST_FRAME_REPEATS:-8}"
RELEASE_FRAME_REPEATS="${VLA_RELEASE_FRAME_REPEATS:-1}"
STAGES="${VLA_SFT_STAGES:-1}"
STAGE_STEPS="${VLA_SFT_STAGE_STEPS:-1000}"
STATE_STEPS="${VLA_STATE_STAGE_STEPS:-500}"
# Settings are checked before anything runs, so a typo does not surface an hour in.
whole() {  # NAME VALUE MIN WHAT
  case "$2" in
    ""|*[!0-9]*) ;;
    *) [ "$2" -ge "$3" ] && return 0 ;;
  esac
  echo "error: $1=$2: $4" >&2; exit 2
}
decimal() {  # NAME VALUE WHAT
  [[ "$2" =~ ^[0-9]+(\.[0-9]+)?$ ]] && return 0
  echo "error: $1=$2: $3" >&2; exit 2
}
whole VLA_DEMO_EPISODES "$EPISODES" 1 "a number of episodes, at least 1"
decimal VLA_EXPERT_MAX_SPEED "$EXPERT_MAX_SPEED" "a fraction of the controller's step, such as 1.0 or 0.3"
whole VLA_VISION_STEPS "$VISION_STEPS" 1 "a number of steps, at least 1"
whole VLA_SFT_STEPS "$STEPS0" 1 "a number of steps, at least 1"
decimal VLA_SCENE_LOSS_WEIGHT "$SCENE_WEIGHT" "a weight, 0 for no grounding co-training"
whole VLA_FIRST_FRAME_REPEATS "$FIRST_FRAME_REPEATS" 1 "how often each first frame is drawn per epoch, at least 1"
whole VLA_RELEASE_FRAME_REPEATS "$RELEASE_FRAME_REPEATS" 1 "how often each release frame is drawn per epoch, at least 1"
whole VLA_SFT_STAGES "$STAGES" 0 "a number of continuation stages, 0 for none"
whole VLA_SFT_STAGE_STEPS "$STAGE_STEPS" 1 "a number of steps, at least 1"
whole VLA_STATE_STAGE_STEPS "$STATE_STEPS" 0 "a number of steps, 0 for no robot-state stage"
case "$PATCH_POSITIONS" in sincos|none) ;; *) echo "error: VLA_PATCH_POSITIONS=$PATCH_POSITIONS: use sincos or none" >&2; exit 2 ;; esac
case "$LAYOUT_TOKEN" in linear|none) ;; *) echo "error: VLA_LAYOUT_TOKEN=$LAYOUT_TOKEN: use linear or none" >&2; exit 2 ;; esac
bash scripts/setup.sh maniskill
export HF_HUB_OFFLINE=1
# the scene the main job's RL and evaluation see (its recipe's env.train.env_kwargs): the demos are recorded in it
ENV_KWARGS="$(.venv/bin/vla-train rl --config cpu_ppo_tiny_put_on_plate --print-config env.train.env_kwargs)"
LAST="$STAGES"; [ "$STATE_STEPS" -eq 0 ] || LAST=$((STAGES + 1))
mkdir -p "$DIR"

if [ ! -f "$DIR/demos/index.json" ]; then
  echo "== scripted-expert demos -> $DIR/demos"
  .venv/bin/vla-envs collect-demos PutOnPlateInScene25Main-v3 --num-envs 2 --steps 1000000 \
    --episodes "$EPISODES" --image-size 64 --seed "$DEMO_SEED" --env-kwargs "$ENV_KWARGS" \
    --expert-kwargs "{\"max_speed\": $EXPERT_MAX_SPEED}" --out "$DIR/demos.partial"
  rm -rf "$DIR/demos" && mv "$DIR/demos.partial" "$DIR/demos"
fi
if [ ! -f "$DIR/vision/config.json" ]; then
  echo "== vision pretraining of a new model -> $DIR/vision"
  .venv/bin/vla-train pretrain-vision --demos "$DIR/demos" --preset tiny-openvla-oft --slot-embeddings learned \
    --steps "$VISION_STEPS" --batch-size 64 --lr 3e-4 --eval-every 100 --out "$DIR/vision" --seed 0
fi
if [ ! -f "$DIR/sft_0/config.json" ]; then
  echo "== SFT from the pretrained vision -> $DIR/sft_0"
  .venv/bin/vla-train sft --demos "$DIR/demos" --init-from "$DIR/vision" --patch-positions "$PATCH_POSITIONS" \
    --layout-token "$LAYOUT_TOKEN" \
    --steps "$STEPS0" --batch-size 32 --lr 5e-4 --warmup-steps 50 --lr-schedule cosine \
    --eval-every 100 --out "$DIR/sft_0" --seed 0 --log-every 50 --scene-loss-weight "$SCENE_WEIGHT" \
    --first-frame-repeats "$FIRST_FRAME_REPEATS" --release-frame-repeats "$RELEASE_FRAME_REPEATS"
fi
for stage in $(seq 1 "$LAST"); do
  STEPS="$STAGE_STEPS"; STATE=(); WHAT="SFT stage $stage of $LAST"
  if [ "$stage" -gt "$STAGES" ]; then STEPS="$STATE_STEPS"; STATE=(--proprio); WHAT="$WHAT, with the robot state"; fi
  if [ ! -f "$DIR/sft_$stage/config.json" ]; then
    echo "== $WHAT, from sft_$((stage - 1)) -> $DIR/sft_$stage"
    .venv/bin/vla-train sft --demos "$DIR/demos" --init-from "$DIR/sft_$((stage - 1))" "${STATE[@]}" \
      --steps "$STEPS" --batch-size 32 --lr 3e-4 --warmup-steps 20 --lr-schedule cosine --eval-every 250 \
      --out "$DIR/sft_$stage" --seed "$stage" --log-every 100 --scene-loss-weight "$SCENE_WEIGHT" \
      --first-frame-repeats "$FIRST_FRAME_REPEATS" --release-frame-repeats "$RELEASE_FRAME_REPEATS"
  fi
done
if [ "$STATE_STEPS" -gt 0 ] && ! grep -q '"proprio_dim": [1-9]' "$DIR/sft_$LAST/config.json"; then
  echo "error: $DIR/sft_$LAST exists but does not read the robot state (made with other settings);" \
       "remove it or use another DIR" >&2
  exit 2
fi
rm -rf "$DIR/sft" && cp -r "$DIR/sft_$LAST" "$DIR/sft"
echo "warm start: $DIR/sft"

if [ "${2:-}" = "--publish" ]; then
  .venv/bin/vla-train publish-warm-start --run "$DIR" --to warm_start/tiny-openvla-oft-put-on-plate \
    --demo-episodes "$EPISODES" --demo-seed "$DEMO_SEED" --env-kwargs "$ENV_KWARGS"
fi
