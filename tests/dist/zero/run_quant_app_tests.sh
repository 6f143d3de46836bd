#!/usr/bin/env bash
# convnext_zero with --gather-dtype int8 from the outside (Note [Quantized gathers]). Usage:
# run_quant_app_tests.sh APP MPIEXEC
#   * 2 and 4 ranks at stages 1-3 log the losses and gradient norms of 1 rank at stage 3 with the same global
#     batch (the gathered weights are a function of the master alone, whatever the world size), to 2e-5;
#   * a checkpoint of 4 quantized ranks resumes at 2 ranks (another layout) and follows the 4 ranks' own steps,
#     and unquantized at stage 2 near the quantized run; it holds no 8-bit integers (h5dump, where installed).
set -uo pipefail
app=$1 mpiexec=$2
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
common=(--depths 1,1,1,1 --dims 8,16,24,32 --num-classes 4 --image-size 32 --loader-threads 1 --no-progress
        --data synthetic:n=256,eval_n=64,classes=4 --drop-path 0.2 --eval-batches 1 --seed 3 --grad-accum 2
        --clip-grad 1 --bucket-mb 0.01)
run() {  # run RANKS LOG ARGS...: 16 images per micro-step in total
  local np=$1 log=$2; shift 2
  if ((np == 1)); then "$app" "${common[@]}" --micro-batch 16 --log "$log" "$@" > "$work/out" 2>&1; else
    "${mpirun[@]}" -np "$np" "$app" "${common[@]}" --micro-batch $((16 / np)) --log "$log" "$@" > "$work/out" 2>&1
  fi || { cat "$work/out"; fail "$np ranks: $* failed"; }
}
run 1 "$work/np1.jsonl" --steps 3 --stage 3 --gather-dtype int8
for np in 2 4; do
  for stage in 1 2 3; do
    run $np "$work/np$np.jsonl" --steps 3 --stage $stage --gather-dtype int8
    compare "$work/np1.jsonl" "$work/np$np.jsonl" 3 "1 rank vs $np ranks, stage $stage, int8 gathers"
  done
done
# Checkpoints: 4 ranks at stage 3, int8 -> 2 ranks at stage 3 (int8) and at stage 2 (fp32 gathers).
run 4 "$work/first.jsonl" --steps 8 --stage 3 --gather-dtype int8 --checkpoint-dir "$work/ck" --checkpoint-every 4
[[ -d "$work/ck/step_4" ]] || { ls -la "$work/ck"; fail "no step_4"; }
if command -v h5dump > /dev/null; then  # every state tensor in fp32 (the manifest is bytes)
  h5dump -H "$work/ck/step_4"/rank_*.h5 > "$work/h5" 2>&1 || fail "h5dump failed"
  awk '/DATASET "/ { want = $2 != "\"manifest\""; next }
       want && /DATATYPE/ { n++; want = 0; if ($2 != "H5T_IEEE_F32LE") { print; bad = 1 } }
       END { print n " state datasets"; exit bad || n == 0 }' "$work/h5" || fail "a state tensor is not fp32"
fi
# The 2 resumed ranks start from the master the 4 ranks went on from, so they follow the 4 ranks' steps 5-8
# as the first comparisons' ranks follow 1 rank. (Not a straight run at 2 ranks: its master after step 4 differs
# from the 4 ranks' in the last bits (another summation order), and a value that then rounds to another INT8
# code moves a gradient norm by ~1e-4.)
grep '"split":"train"' "$work/first.jsonl" | tail -n 4 > "$work/first_tail.jsonl"
run 2 "$work/resumed.jsonl" --steps 8 --stage 3 --gather-dtype int8 --resume "$work/ck/step_4"
compare "$work/first_tail.jsonl" "$work/resumed.jsonl" 4 "4 ranks stage 3 int8 -> 2 ranks stage 3 int8"
# Unquantized from the quantized run's fp32 master: no longer the same run (its weights are not rounded), so
# only near it.
run 2 "$work/resumed.jsonl" --steps 8 --stage 2 --resume "$work/ck/step_4"
compare "$work/first_tail.jsonl" "$work/resumed.jsonl" 4 "4 ranks stage 3 int8 -> 2 ranks stage 2 fp32" 2e-2
echo "quant app: OK"
