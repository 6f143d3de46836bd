#!/usr/bin/env bash
# --precision bf16 on the CPU from the outside (Note [bf16 on the CPU]). Usage: run_bf16_cpu_tests.sh CASE APP MPIEXEC
#   refused         a CPU without AVX512_BF16 and AMX (hidden by CZ_CPU_DISABLE): one line naming the CPU and a
#                   non-zero exit, on 1 rank and on 2 under mpirun; fp16 on the CPU refused with its own line
#   close_to_fp32   40 steps of bf16 against fp32 from the same seed: the header says what bf16 is and what runs
#                   it, the losses stay within 2% step by step and are not fp32's to the bit; the same with
#                   AVX512_BF16 alone (AMX hidden), and on 2 ranks at ZeRO stage 3
#   ranks_match     2 ranks x micro-batch 8 at ZeRO stages 2 and 3 against 1 rank x 16, both bf16: the same
#                   losses and gradient norms up to the order of float sums; a resumed bf16 run continues bit
#                   for bit
# The cases that train exit 77 (skipped) where this CPU has neither AVX512_BF16 nor AMX.
set -uo pipefail
case_name=$1 app=$2 mpiexec=$3
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
tiny=(--depths 1,1,1,1 --dims 16,32,48,64 --num-classes 4 --image-size 32 --loader-threads 1 --no-progress
      --data synthetic:n=512,eval_n=64,classes=4)

has_bf16() { grep -qw avx512_bf16 /proc/cpuinfo; }

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
  has_bf16 || { echo "SKIP: this CPU has no AVX512_BF16"; exit 77; }
  common=("${tiny[@]}" --steps 40 --micro-batch 16 --seed 4 --lr 2e-3 --warmup-steps 0)
  "$app" "${common[@]}" --precision fp32 --log "$work/fp32.jsonl" > "$work/fp32.out" 2>&1 ||
    { cat "$work/fp32.out"; fail "the fp32 run failed"; }
  # The default ISA (AMX where there is one), AVX512_BF16 alone, and 2 ranks x 8 at stage 3 (the same global
  # batch as the 1-rank fp32 run).
  for isa in AMX-BF16 AVX512_BF16 np2_stage3; do
    run=("$app") extra=()
    if [[ $isa == AVX512_BF16 ]]; then export CZ_CPU_DISABLE=amx_bf16; fi
    if [[ $isa == np2_stage3 ]]; then
      unset CZ_CPU_DISABLE
      run=("${mpirun[@]}" -np 2 "$app") extra=(--stage 3 --micro-batch 8)
      isa=$(grep -qw amx_bf16 /proc/cpuinfo && echo AMX-BF16 || echo AVX512_BF16)
    elif [[ $isa == AMX-BF16 ]] && ! grep -qw amx_bf16 /proc/cpuinfo; then
      continue
    fi
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
  has_bf16 || { echo "SKIP: this CPU has no AVX512_BF16"; exit 77; }
  common=("${tiny[@]}" --steps 3 --seed 3 --grad-accum 2 --clip-grad 1 --bucket-mb 0.01 --precision bf16)
  "$app" "${common[@]}" --micro-batch 16 --log "$work/np1.jsonl" > "$work/np1.out" 2>&1 ||
    { cat "$work/np1.out"; fail "1-rank bf16 run failed"; }
  for stage in 2 3; do
    rm -f "$work/np2.jsonl"
    "${mpirun[@]}" -np 2 "$app" "${common[@]}" --micro-batch 8 --stage $stage --log "$work/np2.jsonl" \
      > "$work/np2.out" 2>&1 || { cat "$work/np2.out"; fail "2 ranks at stage $stage failed"; }
    compare "$work/np1.jsonl" "$work/np2.jsonl" 3 "bf16, 2 ranks at stage $stage against 1 rank"
  done
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
