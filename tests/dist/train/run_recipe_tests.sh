#!/usr/bin/env bash
# Issue 31's layer decay, evaluation and recipes from the outside. Usage: run_recipe_tests.sh CASE APP MPIEXEC FIXTURE
#   layer_decay_ranks   --layer-decay at 2 ranks, ZeRO stages 0-3 and offload, logs what 1 rank logs (and not
#                       what a run without it logs)
#   layer_decay_resume  a layer-decay run saved at 4 ranks resumes at 2 and at 1 (offload) with the same losses;
#                       a resume without the saved --layer-decay is refused
#   param_groups        --print-param-groups --json against the official code's numbering (the fixture), and
#                       the table; a recipe's layer decay shows there too
#   eval_top5           every eval record has top1 and top5 (and the EMA's); below 5 classes top5 is null
#   keep_best           --keep-best keeps DIR/best and DIR/best_ema at the log's best top-1s beside a rotation of 1,
#                       each resumable; a resumed run replaces them only with better ones
#   recipe              --recipe convnext-in1k: the header's values, --lr scaled to the global batch (the log's lr),
#                       explicit flags win, a warmup longer than the run and a fine-tune without weights refused
set -uo pipefail
case_name=$1 app=$2 mpiexec=$3 fixture=${4:-}
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
# Stage 2 holds 4 blocks, so the layers 0-4, 12 and 13 all have parameters.
model=(--depths 1,1,4,1 --dims 8,16,24,32 --image-size 32 --loader-threads 1 --no-progress)
tiny=("${model[@]}" --num-classes 4 --data synthetic:n=256,eval_n=64,classes=4)

# run RANKS LOG ARGS...: 16 images per micro-step in total. With one_rank_accum=N one rank takes them as N
# micro-batches of 16/N (Mixup pairs images within a rank's micro-batch: docs/data.md).
one_rank_accum=1
run() {
  local np=$1 log=$2; shift 2
  if ((np == 1)); then
    local accum=()
    ((one_rank_accum > 1)) && accum=(--grad-accum "$one_rank_accum")
    "$app" "${common[@]}" --micro-batch $((16 / one_rank_accum)) "${accum[@]}" --log "$log" "$@" > "$work/out" 2>&1
  else
    "${mpirun[@]}" -np "$np" "$app" "${common[@]}" --micro-batch $((16 / np)) --log "$log" "$@" > "$work/out" 2>&1
  fi || { cat "$work/out"; fail "$np ranks: $* failed"; }
}

case $case_name in
layer_decay_ranks)
  common=("${tiny[@]}" --drop-path 0.1 --eval-batches 1 --seed 3 --grad-accum 2 --clip-grad 1 --bucket-mb 0.005
          --lr 4e-3 --layer-decay 0.7)
  run 1 "$work/np1.jsonl" --steps 4
  for flags in "--stage 0" "--stage 1" "--stage 2" "--stage 3" "--stage 2 --offload-optimizer"; do
    # shellcheck disable=SC2086
    run 2 "$work/np2.jsonl" --steps 4 $flags
    compare "$work/np1.jsonl" "$work/np2.jsonl" 4 "1 rank vs 2 ranks $flags, --layer-decay 0.7"
  done
  # The decay is applied: without it the same run takes other steps from step 2 on.
  common=("${common[@]:0:${#common[@]}-2}")
  run 1 "$work/plain.jsonl" --steps 4
  paste -d' ' <(steps_of "$work/np1.jsonl") <(steps_of "$work/plain.jsonl") |
    awk 'NR >= 2 && $2 != $5 { differs = 1 } END { exit !differs }' || fail "--layer-decay 0.7 changed nothing"
  echo "layer_decay_ranks: OK"
  ;;
layer_decay_resume)
  common=("${tiny[@]}" --steps 8 --drop-path 0.1 --ema-decay 0.99 --clip-grad 1 --eval-batches 1 --lr 4e-3
          --layer-decay 0.7)
  run 4 "$work/straight.jsonl" --stage 3 --checkpoint-dir "$work/ck" --checkpoint-every 4
  [[ -d "$work/ck/step_4" ]] || { ls -la "$work/ck"; fail "no step_4"; }
  grep '"split":"train"' "$work/straight.jsonl" | tail -n 4 > "$work/tail.jsonl"
  run 2 "$work/resumed.jsonl" --stage 1 --resume "$work/ck/step_4"
  compare "$work/tail.jsonl" "$work/resumed.jsonl" 4 "4 ranks stage 3 -> 2 ranks stage 1, --layer-decay 0.7"
  run 1 "$work/resumed1.jsonl" --stage 2 --offload-optimizer --resume "$work/ck/step_4"
  compare "$work/tail.jsonl" "$work/resumed1.jsonl" 4 "4 ranks stage 3 -> 1 rank stage 2 offloaded"
  common=("${common[@]:0:${#common[@]}-2}")
  refused "the checkpoint was saved with --layer-decay 0.7 but this run has --layer-decay 1" "${common[@]}" \
    --micro-batch 16 --resume "$work/ck/step_4"
  refused "--layer-decay 0.8" "${common[@]}" --micro-batch 16 --layer-decay 0.8 --resume "$work/ck/step_4"
  echo "layer_decay_resume: OK"
  ;;
param_groups)
  for m in tiny small base; do
    for d in 0.7 0.8; do
      "$app" --model $m --num-classes 1000 --layer-decay $d --weight-decay 0.05 --print-param-groups --json \
        > "$work/$m.json" 2> "$work/err" || { cat "$work/err"; fail "--print-param-groups --model $m"; }
      "$py" - "$work/$m.json" "$fixture" $m $d <<'PY' || fail "--model $m --layer-decay $d: groups differ"
import json, sys
got, fixture, model, decay = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3], sys.argv[4]
scales = fixture["lr_scales"][decay]
where = {p: g for g in got["groups"] for p in g["params"]}
want = fixture["models"][model]["params"]
assert len(where) == len(want), (len(where), len(want))
for name, official, layer, decays in want:
    g = where[name]
    assert g["layer"] == layer and g["lr_scale"] == scales[layer], (name, official, g["layer"], layer)
    assert g["weight_decay"] == (0.05 if decays else 0.0), name
    assert g["name"] == f"layer_{layer}_{'decay' if decays else 'no_decay'}", g["name"]
print(f"{model} at {decay}: {len(want)} parameters in {len(got['groups'])} groups, as the official code")
PY
    done
  done
  "$app" --model tiny --layer-decay 0.8 --print-param-groups > "$work/table" 2>&1 || fail "the table"
  cat "$work/table"
  grep -qE '^layer_0_decay +0\.054975581 +0\.05 +1 +4608  stem\.0\.weight$' "$work/table" || fail "no stem row"
  grep -qE '^layer_13_no_decay +1 +0 +3 ' "$work/table" || fail "no head row"
  "$app" --recipe convnext-finetune --init-weights w.h5 --model base --print-param-groups > "$work/table" 2>&1 ||
    { cat "$work/table"; fail "a recipe's groups"; }
  grep -q "layer_decay 0.8\|--layer-decay 0.8" "$work/table" && grep -q "^layer_12_decay" "$work/table" ||
    { cat "$work/table"; fail "the fine-tuning recipe's layer decay is not in its groups"; }
  refused "--json goes with --plan or --print-param-groups" "${tiny[@]}" --steps 1 --json
  refused "--layer-decay numbers ConvNeXt's four stages" --depths 1,1,1 --dims 8,16,24 --layer-decay 0.8 \
    --print-param-groups
  echo "param_groups: OK"
  ;;
eval_top5)
  # 10 classes: top5 is a fraction >= top1, for the EMA too; 4 classes: null, and the lines say n/a.
  "$app" "${model[@]}" --num-classes 10 --data synthetic:n=256,eval_n=64,classes=10 --steps 4 --eval-every 2 \
    --micro-batch 16 --ema-decay 0.9 --log "$work/log.jsonl" > "$work/out" 2>&1 || { cat "$work/out"; fail "run"; }
  cat "$work/out"
  grep '"split":"eval"' "$work/log.jsonl" > "$work/evals"
  [[ $(wc -l < "$work/evals") -eq 2 ]] || fail "expected 2 eval records"
  "$py" - "$work/evals" <<'PY' || fail "bad eval records"
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    for pre in ("", "ema_"):
        t1, t5 = r[pre + "top1"], r[pre + "top5"]
        assert 0 <= t1 <= t5 <= 1 and t5 > 0, r
        assert abs(t5 * r["examples"] - round(t5 * r["examples"])) < 1e-9, r  # a count of examples
print("eval records carry top1 <= top5 for the weights and the EMA")
PY
  grep -qE 'eval @ step 2: loss [0-9.]+  top1 [0-9.]+%  top5 [0-9.]+%  \(EMA: loss [0-9.]+  top1 [0-9.]+%  top5 [0-9.]+%\)' \
    "$work/out" || fail "no top5 in the eval line"
  grep -qE '^done: .* eval loss [0-9.]+ top1 [0-9.]+% top5 [0-9.]+% \(EMA top1 [0-9.]+% top5 [0-9.]+%\)' "$work/out" ||
    fail "no top5 in the summary"
  "$app" "${tiny[@]}" --steps 2 --micro-batch 16 --log "$work/four.jsonl" > "$work/out" 2>&1 || fail "4 classes"
  grep '"split":"eval"' "$work/four.jsonl" | grep -q '"top5":null' || { cat "$work/four.jsonl"; fail "top5 not null"; }
  grep -q 'top5 n/a' "$work/out" || { cat "$work/out"; fail "no 'top5 n/a' below 5 classes"; }
  echo "eval_top5: OK"
  ;;
keep_best)
  common=("${model[@]}" --num-classes 10 --data synthetic:n=256,eval_n=64,classes=10 --micro-batch 16 --lr 4e-3
          --eval-every 2 --ema-decay 0.8 --checkpoint-dir "$work/ck" --checkpoint-every 2 --keep-checkpoints 1
          --keep-best)
  "$app" "${common[@]}" --steps 12 --log "$work/log.jsonl" > "$work/out" 2>&1 || { cat "$work/out"; fail "run"; }
  # The first step with the highest top-1 (a tie keeps the earlier), of the weights and of the EMA.
  best_of() { grep '"split":"eval"' "$1" | "$py" -c "
import json, sys
best = (-1, 0)
for line in sys.stdin:
    r = json.loads(line)
    if r['$2'] > best[0]: best = (r['$2'], r['step'])
print(best[1], repr(best[0]))"; }
  read -r wstep wtop1 < <(best_of "$work/log.jsonl" top1)
  read -r estep etop1 < <(best_of "$work/log.jsonl" ema_top1)
  echo "best weights: step $wstep top1 $wtop1; best EMA: step $estep top1 $etop1"
  ls "$work/ck" "$work/ck/best" "$work/ck/best_ema"
  [[ $(ls -d "$work/ck"/step_* | wc -l) -eq 1 && -d "$work/ck/step_12" ]] || fail "the rotation should keep step_12 only"
  [[ $(cat "$work/ck/best/latest") == "step_$wstep" && $(ls -d "$work/ck/best"/step_* | wc -l) -eq 1 ]] ||
    fail "DIR/best is not step_$wstep alone"
  [[ $(cat "$work/ck/best_ema/latest") == "step_$estep" && $(ls -d "$work/ck/best_ema"/step_* | wc -l) -eq 1 ]] ||
    fail "DIR/best_ema is not step_$estep alone"
  attr() { h5dump -a "/$2" "$1/checkpoint.h5" | sed -nE 's/^ *\(0\): (.*)$/\1/p'; }
  "$py" -c "import sys; assert abs(float('$(attr "$work/ck/best/step_$wstep" eval_top1)') - $wtop1) < 1e-12" ||
    fail "DIR/best's eval_top1 is not the log's"
  [[ $(attr "$work/ck/best_ema/step_$estep" best_of) == '"ema"' ]] || fail "DIR/best_ema does not say ema"
  grep -qE "best top1 [0-9.]+% at step $wstep \(EMA [0-9.]+% at step $estep\)" "$work/out" ||
    { cat "$work/out"; fail "no best in the summary"; }
  # The best checkpoints resume like any other.
  "$app" "${common[@]:0:${#common[@]}-1}" --steps 12 --resume "$work/ck/best" --log "$work/from_best.jsonl" \
    > "$work/out" 2>&1 || { cat "$work/out"; fail "resuming from DIR/best"; }
  [[ $(steps_of "$work/from_best.jsonl" | head -1 | cut -d' ' -f1) == $((wstep + 1)) ]] || fail "not resumed at $wstep"
  # A resumed, longer run keeps its best checkpoints unless it evaluates better.
  "$app" "${common[@]}" --steps 16 --resume "$work/ck" --log "$work/more.jsonl" > "$work/out" 2>&1 ||
    { cat "$work/out"; fail "resuming the run"; }
  cat "$work/log.jsonl" "$work/more.jsonl" > "$work/all.jsonl"
  read -r wstep2 _ < <(best_of "$work/all.jsonl" top1)
  [[ $(cat "$work/ck/best/latest") == "step_$wstep2" && $(ls -d "$work/ck/best"/step_* | wc -l) -eq 1 ]] ||
    fail "after the resumed run DIR/best should be step_$wstep2"
  refused "--keep-best needs --checkpoint-dir" "${tiny[@]}" --steps 1 --keep-best
  echo "keep_best: OK"
  ;;
recipe)
  common=("${tiny[@]}" --recipe convnext-in1k --steps 3 --eval-batches 1)
  one_rank_accum=2  # the recipe mixes (--mixup 0.8 --cutmix 1.0)
  refused "--warmup-epochs 20 is 320 steps at 16 steps per epoch, more than the run's 3 steps" "${common[@]}" \
    --micro-batch 16
  for np in 1 2; do
    run $np "$work/np$np.jsonl" --warmup-steps 1
    cat "$work/out"
    grep -qF "recipe convnext-in1k: --lr 1.5625e-05 (0.004 at global batch 4096, scaled to 16)" "$work/out" ||
      fail "$np ranks: no scaled --lr in the header"
    grep -qF -- "--weight-decay 0.05 --epochs 300" "$work/out" && grep -qF -- "--ema-decay 0.9999" "$work/out" ||
      fail "$np ranks: the recipe's values are not in the header"
    grep -qF "given instead: --image-size 32 (recipe: --image-size 224), --warmup-steps 1 (recipe: --warmup-epochs 20)" \
      "$work/out" || fail "$np ranks: the given flags are not listed"
    # The schedule of the scaled lr: warmup 1 step from 0, then cosine to 1e-6 over 3 steps (timm's indexing).
    grep '"split":"train"' "$work/np$np.jsonl" | sed -E 's/.*"lr":([^,}]+).*"step":([0-9]+).*/\2 \1/' |
      awk 'function want(t) { return t < 1 ? 0 : 1e-6 + 0.5 * (1.5625e-05 - 1e-6) * (1 + cos(3.141592653589793 * t / 3)) }
           { w = want($1 - 1); d = $2 - w; if (d < 0) d = -d; if (d > 1e-12) { print "step " $1 ": lr " $2 ", expected " w; bad = 1 } }
           END { exit bad || NR != 3 }' || fail "$np ranks: the log's lr is not the recipe's schedule"
    grep '"split":"eval"' "$work/np$np.jsonl" | grep -q '"ema_top1"' || fail "$np ranks: the recipe's EMA is not evaluated"
  done
  compare "$work/np1.jsonl" "$work/np2.jsonl" 3 "--recipe convnext-in1k, 1 rank (2 micro-batches of 8) vs 2"
  one_rank_accum=1
  run 1 "$work/lr.jsonl" --warmup-steps 1 --lr 1e-3
  grep -qF "recipe convnext-in1k: --lr 0.001 given (convnext-in1k 0.004 at global batch 4096)" "$work/out" ||
    { cat "$work/out"; fail "an explicit --lr is not kept"; }
  refused "--recipe convnext-finetune fine-tunes trained weights: give --init-weights FILE" "${tiny[@]}" \
    --recipe convnext-finetune --steps 1
  refused "--recipe must be one of convnext-in1k | convnext-finetune | convnextv2-finetune, got 'imagenet'" "${tiny[@]}" --recipe imagenet
  echo "recipe: OK"
  ;;
*) fail "unknown case $case_name" ;;
esac
