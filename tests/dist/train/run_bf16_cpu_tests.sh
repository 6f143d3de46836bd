#!/usr/bin/env bash
# --precision bf16 on the CPU from the outside (Note [bf16 on the CPU]). Usage: run_bf16_cpu_tests.sh CASE APP MPIEXEC
#   refused         a CPU without AVX512_BF16 and AMX (hidden by CZ_CPU_DISABLE): one line naming the CPU and a
#                   non-zero exit, on 1 rank and on 2 under mpirun; fp16 on the CPU refused with its own line
#   close_to_fp32   40 steps of bf16 against fp32 from the same seed: the header says what bf16 is and what runs
#                   it, the losses stay within 2% step by step and are not fp32's to the bit; the same with
#                   AVX512_BF16 alone (AMX hidden), emulated (CZ_CPU_BF16_EMULATE=1), and on 2 ranks at stage 3
#   ranks_match     2 ranks x micro-batch 8 at ZeRO stages 2 and 3 against 1 rank x 16, both bf16, on each bf16
#                   ISA of this CPU and emulated: with --cpu-row-split rows:8 the same losses and gradient norms
#                   to the bit; with the default cut within 1e-3 (below); a resumed bf16 run continues bit for bit
# The ISAs this CPU lacks are left out; emulated bf16 (fp32 GEMMs of bf16-rounded operands) runs everywhere.
set -uo pipefail
case_name=$1 app=$2 mpiexec=$3
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
tiny=(--depths 1,1,1,1 --dims 16,32,48,64 --num-classes 4 --image-size 32 --loader-threads 1 --no-progress
      --data synthetic:n=512,eval_n=64,classes=4)

# The bf16 ISAs to run: this CPU's (AMX-BF16, AVX512_BF16 with AMX hidden), and emulated on any CPU.
bf16_isas=()
grep -qw amx_bf16 /proc/cpuinfo && bf16_isas+=(AMX-BF16)
grep -qw avx512_bf16 /proc/cpuinfo && bf16_isas+=(AVX512_BF16)
bf16_isas+=(emulated)
# use_isa ISA: the environment that selects it (exported, and passed on by mpirun through $isa_env).
use_isa() {
  unset CZ_CPU_DISABLE CZ_CPU_BF16_EMULATE
  isa_env=()
  case $1 in
  AVX512_BF16) export CZ_CPU_DISABLE=amx_bf16 && isa_env=(-x CZ_CPU_DISABLE) ;;
  emulated) export CZ_CPU_BF16_EMULATE=1 && isa_env=(-x CZ_CPU_BF16_EMULATE) ;;
  esac
}

case $case_name in
refused)
  export CZ_CPU_DISABLE=avx512_bf16,amx_bf16
  refused "--precision bf16 on the CPU needs AVX512_BF16 or AMX; this CPU (" "${tiny[@]}" --steps 2 --precision bf16
  grep -qE "this CPU \(.+\) has neither" "$work/out" || fail "the refusal does not name the CPU"
  timeout 120 "${mpirun[@]}" -np 2 "$app" "${tiny[@]}" --steps 2 --precision bf16 --stage 2 > "$work/np2" 2>&1
  rc=$?
  [[ $rc -ne 0 && $rc -ne 124 ]] || { cat "$work/np2"; fail "2 ranks without bf16 exited with $rc"; }
  grep -qF "needs AVX512_BF16 or AMX" "$work/np2" || { cat "$work/np2"; fail "2 ranks: no refusal line"; }
  unset CZ_CPU_DISABLE
  refused "--precision fp16 needs --device cuda" "${tiny[@]}" --steps 2 --precision fp16
  echo "refused: OK"
  ;;
close_to_fp32)
  common=("${tiny[@]}" --steps 40 --micro-batch 16 --seed 4 --lr 2e-3 --warmup-steps 0)
  "$app" "${common[@]}" --precision fp32 --log "$work/fp32.jsonl" > "$work/fp32.out" 2>&1 ||
    { cat "$work/fp32.out"; fail "the fp32 run failed"; }
  # Each ISA of this CPU and emulated, then 2 ranks x 8 at stage 3 (the same global batch as the 1-rank fp32
  # run) on the first of them.
  for isa in "${bf16_isas[@]}" np2_stage3; do
    extra=() np=1
    if [[ $isa == np2_stage3 ]]; then isa=${bf16_isas[0]} np=2 extra=(--stage 3 --micro-batch 8); fi
    use_isa "$isa"
    run=("$app")
    [[ $np -eq 2 ]] && run=("${mpirun[@]}" -np 2 "${isa_env[@]}" "$app")
    rm -f "$work/bf16.jsonl"
    "${run[@]}" "${common[@]}" "${extra[@]}" --precision bf16 --log "$work/bf16.jsonl" > "$work/bf16.out" 2>&1 ||
      { cat "$work/bf16.out"; fail "the bf16 run (${run[*]}, $isa) failed"; }
    grep -F -- "--precision bf16 on the CPU: GEMMs multiply bf16-rounded operands on $isa" "$work/bf16.out" ||
      { cat "$work/bf16.out"; fail "the header does not say what bf16 is on the CPU and that $isa runs it"; }
    grep -qF '"precision":"bf16"' "$work/bf16.jsonl" || fail "the log's start record lacks the precision"
    paste -d' ' <(steps_of "$work/fp32.jsonl") <(steps_of "$work/bf16.jsonl") > "$work/both"
    [[ $(wc -l < "$work/both") -eq 40 ]] || fail "expected 40 step records in each log"
    # Columns: step loss grad_norm (fp32), step loss grad_norm (bf16).
    awk '{ d = $2 - $5; if (d < 0) d = -d; r = d / $2; if (r > worst) worst = r; if (r > 0.02) bad = 1 }
         END { printf "largest relative loss difference over 40 steps: %.2e\n", worst;
               if (worst < 1e-6) { print "bf16 gave fp32 losses to the bit: were the GEMMs rounded?"; exit 1 }
               exit bad }' "$work/both" || { cat "$work/both"; fail "bf16 ($isa) strays from fp32"; }
  done
  echo "close_to_fp32: OK"
  ;;
ranks_match)
  # With --cpu-row-split rows:8 (8 rows divide every rank's share of every layer: 8 images of 1 pixel at the
  # last stage) each rank's rows go through the same GEMM calls and sum blocks as in the one-rank run, so the
  # runs are equal to the bit (Note [Cutting the rows]). With the default cut a rank's share of a late stage is
  # one call of another shape, whose rows differ from the one-rank run's in their last fp32 bits; in bf16 such
  # a difference can round a later GEMM operand to the other bf16 neighbour, 2^-8 of it away, so the runs agree
  # to a fraction of bf16's spacing rather than to fp32's rounding: within 1e-3 (a quarter of 2^-8) over 3
  # steps. (Measured on an AMD EPYC of family 26 before the cuts existed: 8e-5 at step 3.)
  common=("${tiny[@]}" --steps 3 --seed 3 --grad-accum 2 --clip-grad 1 --bucket-mb 0.01 --precision bf16)
  for isa in "${bf16_isas[@]}"; do
    use_isa "$isa"
    for split in rows:8 fast; do
      "$app" "${common[@]}" --cpu-row-split $split --micro-batch 16 --log "$work/np1.jsonl" \
        --export-weights "$work/np1.h5" > "$work/np1.out" 2>&1 ||
        { cat "$work/np1.out"; fail "1-rank bf16 run ($isa, $split) failed"; }
      for stage in 2 3; do
        rm -f "$work/np2.jsonl"
        "${mpirun[@]}" -np 2 "${isa_env[@]}" "$app" "${common[@]}" --cpu-row-split $split --micro-batch 8 \
          --stage $stage --log "$work/np2.jsonl" --export-weights "$work/np2.h5" > "$work/np2.out" 2>&1 ||
          { cat "$work/np2.out"; fail "2 ranks at stage $stage ($isa, $split) failed"; }
        what="bf16 on $isa, --cpu-row-split $split: 2 ranks at stage $stage against 1 rank"
        if [[ $split == fast ]]; then
          compare "$work/np1.jsonl" "$work/np2.jsonl" 3 "$what" 1e-3
        else
          # The weights to the bit. The logged loss and gradient norm are reports, summed per rank and then
          # across the ranks in another order than one rank's: the loss (an f32 mean of 16 per-sample losses)
          # to 1e-6, the gradient norm (squares summed in f64) to 1e-12.
          "$py" "$(dirname "${BASH_SOURCE[0]}")/compare_weights.py" "$work/np1.h5" "$work/np2.h5" 0 "$what" ||
            fail "$what: the weights differ"
          paste -d' ' <(steps_of "$work/np1.jsonl") <(steps_of "$work/np2.jsonl") > "$work/both"
          awk '{ if ($1 != $4) bad = 1; d = $2 - $5; if (d < 0) d = -d; if (d > 1e-6 * $2) bad = 1
                 d = $3 - $6; if (d < 0) d = -d; if (d > 1e-12 * $3) bad = 1 }
               END { exit bad || NR != 3 }' "$work/both" || { cat "$work/both"; fail "$what: the logs differ"; }
        fi
      done
    done
  done
  use_isa "${bf16_isas[0]}"
  # Resume: 6 steps straight (saving at step 3), and steps 4-6 again from the step-3 checkpoint.
  ck=("${tiny[@]}" --micro-batch 8 --seed 5 --precision bf16 --steps 6 --checkpoint-every 3)
  "$app" "${ck[@]}" --checkpoint-dir "$work/ck_a" --log "$work/straight.jsonl" > "$work/a.out" 2>&1 ||
    { cat "$work/a.out"; fail "the straight run failed"; }
  "$app" "${ck[@]}" --checkpoint-dir "$work/ck_b" --resume "$work/ck_a/step_3" --log "$work/resumed.jsonl" \
    > "$work/b.out" 2>&1 || { cat "$work/b.out"; fail "the resume failed"; }
  steps_of "$work/straight.jsonl" | tail -n 3 > "$work/tail"
  diff "$work/tail" <(steps_of "$work/resumed.jsonl") || fail "bf16: the resumed steps 4-6 differ from the straight run's"
  echo "bf16: steps 4-6 resumed from step 3 equal the straight run's to the bit"
  echo "ranks_match: OK"
  ;;
*) fail "unknown case $case_name" ;;
esac
