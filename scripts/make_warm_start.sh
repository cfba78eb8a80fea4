#!/usr/bin/env bash
# A supervised warm start made on this CPU from its recipe (vla_trainer/recipes/warm_start/RECIPE.yaml, every
# setting documented in vla_trainer/config/warm_start.py): scripted-expert demos, vision pretraining of a new
# model or a checkpoint to continue, then the SFT stages.
#
#   bash scripts/make_warm_start.sh [RECIPE] [--out DIR] [--publish] [key=value ...]
#
# RECIPE   tiny_put_on_plate (default): the full task's warm start from random weights, about 2 h on 2 cores
#            (the shipped warm_start/tiny-openvla-oft-put-on-plate)
#          tiny_put_on_plate_easy: the curriculum variant's, the shipped one continued on the variant's own demos,
#            about 20 min (the shipped warm_start/tiny-openvla-oft-put-on-plate-easy)
#          or a .yaml path
# --out    the run folder (default runs/warm_start/RECIPE); a run started again goes on from its last whole stage
# --publish  also refreshes the shipped checkpoint the recipe names (publish_to): float16, with made_by.json
# key=value  recipe overrides, e.g. stages.0.sft.steps=50 (the keys: .venv/bin/vla-train warm-start --config RECIPE
#            --print-config)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
usage() {
  echo "error: $1: usage: bash scripts/make_warm_start.sh [RECIPE] [--out DIR] [--publish] [key=value ...]" >&2
  exit 2
}
RECIPE=tiny_put_on_plate
if [ $# -gt 0 ] && [[ "$1" != -* ]] && [[ "$1" != *=* ]]; then RECIPE="$1"; shift; fi
# Checked before setup, so a typo does not surface after the install.
if [[ "$RECIPE" == *.yaml || "$RECIPE" == *.yml ]]; then
  [ -f "$RECIPE" ] || { echo "error: recipe file $RECIPE does not exist" >&2; exit 2; }
elif [ ! -f "vla_trainer/recipes/warm_start/$RECIPE.yaml" ]; then
  echo "error: warm-start recipe '$RECIPE': shipped ones:" \
       "$(cd vla_trainer/recipes/warm_start && ls *.yaml | sed 's/\.yaml$//' | tr '\n' ' ')(or a .yaml path)" >&2
  exit 2
fi
OUT="runs/warm_start/$(basename "$RECIPE" .yaml)"
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] && [[ "$2" != -* ]] || usage "--out needs a folder"; OUT="$2"; shift 2 ;;
    --publish) ARGS+=(--publish); shift ;;
    *=*) ARGS+=("$1"); shift ;;
    *) usage "argument '$1'" ;;
  esac
done
bash scripts/setup.sh maniskill
export HF_HUB_OFFLINE=1
.venv/bin/vla-train warm-start --config "$RECIPE" --out "$OUT" "${ARGS[@]}"
