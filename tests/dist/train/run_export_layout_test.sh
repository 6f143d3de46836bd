#!/usr/bin/env bash
# One MLP layout for both weight exports (issue 30; Note [One MLP layout for both exports] in
# apps/cz_weights.cpp): a run's --export-weights file and `cz_weights CKPT OUT.h5` of the same run's final
# checkpoint are the same file, in the layout timm gives the model (atto: fc1 (160, 40, 1, 1); a custom
# ConvNeXt: Linear (out, in)), and cz_weights reads it back and writes it again unchanged.
#   run_export_layout_test.sh CONVNEXT_ZERO CZ_WEIGHTS
set -u
app=$1 cz_weights=$2
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
command -v h5diff >/dev/null && command -v h5ls >/dev/null || { echo "SKIP: h5diff/h5ls (hdf5-tools) missing"; exit 77; }
shape() { h5ls "$1/$2" | sed -n 's/.*Dataset {\(.*\)}.*/\1/p'; }  # shape FILE DATASET: "160, 40, 1, 1"

check() {  # check NAME FC1_SHAPE LAYOUT_WORDS MODEL_FLAGS...
  local name=$1 want=$2 words=$3
  shift 3
  local d=$work/$name
  out=$(timeout 300 "$app" "$@" --image-size 32 --micro-batch 2 --steps 2 --no-progress \
    --checkpoint-dir "$d/ck" --export-weights "$d/run.h5" 2>&1) || fail "$name: training exited $?: $out"
  out=$("$cz_weights" "$d/ck" "$d/ck.h5" 2>&1) || fail "$name: cz_weights CKPT exited $?: $out"
  echo "$out"
  [[ $(shape "$d/run.h5" stages.0.blocks.0.mlp.fc1.weight) == "$want" ]] ||
    fail "$name: --export-weights wrote fc1 as ($(shape "$d/run.h5" stages.0.blocks.0.mlp.fc1.weight)), not ($want)"
  [[ $(shape "$d/ck.h5" stages.0.blocks.0.mlp.fc1.weight) == "$want" ]] ||
    fail "$name: cz_weights CKPT wrote fc1 as ($(shape "$d/ck.h5" stages.0.blocks.0.mlp.fc1.weight)), not ($want)"
  diff=$(h5diff "$d/run.h5" "$d/ck.h5" 2>&1) || fail "$name: the two exports differ: $diff"
  grep -q "MLP weights as $words" <<<"$out" || fail "$name: cz_weights did not say '$words': $out"
  # Round trip: imported as --init-weights would read it, exported again: the same file.
  out=$("$cz_weights" "$d/ck.h5" "$d/again.h5" 2>&1) || fail "$name: cz_weights re-export exited $?: $out"
  diff=$(h5diff "$d/run.h5" "$d/again.h5" 2>&1) || fail "$name: the re-export differs: $diff"
  echo "ok: $name: both exports write fc1 as ($want), equal, and equal after a round trip"
}
check atto "160, 40, 1, 1" "timm's 1x1 convolutions" --model atto --num-classes 10
check custom "32, 8" "Linear" --depths 1,1,1,1 --dims 8,16,24,32 --num-classes 10
echo PASS
