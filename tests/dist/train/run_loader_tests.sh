#!/usr/bin/env bash
# The loader seen from the outside (issue 32): real JPEG folders, real runs, real mpirun.
# Usage: run_loader_tests.sh CASE APP MPIEXEC MAKE_IMAGE_FOLDER
#   data_wait        every train record has data_wait_s (Note [Data wait]); a slow loader (one thread decoding
#                    1536 px JPEGs for a tiny model) waits most of each step, and the progress line and the
#                    summary say the loader is the bottleneck, and after 10 steps the rank warns with the loader
#                    threads that would keep up; a fast one (32 px synthetic images for a model
#                    several times their cost) waits under the threshold and neither says so
#   loader_threads   --loader-threads' default is the cores a rank has: nproc alone, nproc / 2 each of 2 unbound
#                    ranks under mpirun, 1 each bound to a core, 1 under taskset -c 0, as the start record shows;
#                    a negative value is refused
#   loader_only      --loader-only runs the input pipeline alone with the run's data and augmentation flags and
#                    reports img/s in all and per thread, and the steady state after the first batch; bad input
#                    is refused by name
set -uo pipefail
case_name=$1 app=$2 mpiexec=$3 make_folder=$4
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
model=(--depths 1,1,1,1 --dims 8,16,24,32 --image-size 32 --micro-batch 8 --seed 1)
# For the data wait: a model that takes several times longer than the synthetic loader's 8 images (200 img/s
# on this project's 2 cores, 3% waiting; the one above runs at 2200 img/s and waits for synthetic data half
# the time).
wait_model=(--depths 1,1,3,1 --dims 48,96,192,384 --image-size 32 --micro-batch 8 --seed 1)
# ok OUT ARGS...: a run that must succeed; stdout+stderr in OUT.
ok() {
  local out=$1; shift
  "$@" > "$out" 2>&1
  local rc=$?
  [[ $rc -eq 0 ]] || { cat "$out"; fail "'$*' exited with $rc"; }
}
# wait_fraction LOG: of the train steps after the first, the summed data_wait_s over the summed step_time_s;
# fails unless every train record has a data_wait_s within [0, step_time_s].
wait_fraction() {
  "$py" - "$1" <<'PY'
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r.get("split") == "train"]
assert steps, "no train records"
for r in steps:
    assert "data_wait_s" in r, f"step {r['step']} has no data_wait_s: {r}"
    assert 0 <= r["data_wait_s"] <= r["step_time_s"], f"step {r['step']}: {r['data_wait_s']} > {r['step_time_s']}"
rest = steps[1:]
print(f"{sum(r['data_wait_s'] for r in rest) / sum(r['step_time_s'] for r in rest):.4f}")
PY
}

case $case_name in
data_wait)
  "$make_folder" "$work/big" 1536 12 1 a=0 b=120 c=240 || fail "make_image_folder"
  # --progress-interval 0: a plain progress line after every step (stderr is not a terminal here).
  # The tiny model: even decoding only each crop, DCT-scaled (Note [Decoding the crop]), one thread takes
  # longer over 8 of these files than the model over 8 images.
  ok "$work/slow.out" "$app" "${model[@]}" --data "folder:$work/big" --num-classes 3 --steps 11 \
    --loader-threads 1 --progress-interval 0 --log "$work/slow.jsonl"
  slow=$(wait_fraction "$work/slow.jsonl") || fail "slow run's log"
  ok "$work/fast.out" "$app" "${wait_model[@]}" --data synthetic --steps 30 --loader-threads 2 \
    --progress-interval 0 --log "$work/fast.jsonl"
  fast=$(wait_fraction "$work/fast.jsonl") || fail "fast run's log"
  echo "data wait over step time after the first step: slow loader $slow, fast loader $fast"
  grep -E "^done:" "$work/slow.out"; grep -E "^done:" "$work/fast.out"
  awk -v s="$slow" 'BEGIN { exit !(s > 0.3) }' || fail "one thread decoding 1536 px JPEGs for a tiny model waited only $slow of its steps"
  awk -v f="$fast" 'BEGIN { exit !(f < 0.10) }' || fail "synthetic 32 px images waited $fast of the steps"
  grep -qE "loader-bound: [0-9]+% of step time waiting for data" "$work/slow.out" ||
    { cat "$work/slow.out"; fail "the slow run's progress lines do not say it is loader-bound"; }
  grep -qE "^done: .*data wait [0-9.]+ s \([0-9.]+% of step time after the first step; the loader is the bottleneck at --loader-threads 1" \
    "$work/slow.out" || { cat "$work/slow.out"; fail "the slow run's summary does not name the bottleneck"; }
  # After 10 steps the rank says what holds it back and the loader threads that would keep up (issue 51).
  grep -qE "^warning: the loader holds this rank back: data wait [0-9]+% of its steps 2-10 with 1 loader thread on [0-9]+ CPUs? \([0-9,-]+ on .*\); keeping up would take about [0-9]+ loader threads" \
    "$work/slow.out" || { cat "$work/slow.out"; fail "the slow run does not say what its loader would need"; }
  ! grep -q "loader-bound\|bottleneck\|holds this rank back" "$work/fast.out" ||
    { cat "$work/fast.out"; fail "the fast run was called loader-bound"; }
  grep -qE "^done: .*data wait [0-9.]+ s \([0-9.]+% of step time after the first step\)" "$work/fast.out" ||
    { cat "$work/fast.out"; fail "the fast run's summary lacks its data wait"; }
  echo "data_wait: OK"
  ;;
loader_threads)
  # The loader_threads the start record shows ("flags" holds every flag's value).
  threads_of() {
    "$py" -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); f=r["flags"]; print(f["loader-threads"])' "$1"
  }
  cores=$(nproc)
  ok "$work/one.out" "$app" "${model[@]}" --steps 1 --no-progress --log "$work/one.jsonl"
  got=$(threads_of "$work/one.jsonl"); [[ "$got" == "$cores" ]] || fail "one rank on $cores cores: --loader-threads $got"
  ok "$work/pin.out" taskset -c 0 "$app" "${model[@]}" --steps 1 --no-progress --log "$work/pin.jsonl"
  got=$(threads_of "$work/pin.jsonl"); [[ "$got" == 1 ]] || fail "pinned to one core: --loader-threads $got"
  # Two unbound ranks split the cores; bound to a core each (mpirun's default for 2), one each (issue 51).
  ok "$work/two.out" "${mpirun[@]}" --bind-to none -np 2 "$app" "${model[@]}" --steps 1 --no-progress --log "$work/two.jsonl"
  want=$((cores / 2 > 0 ? cores / 2 : 1))
  got=$(threads_of "$work/two.jsonl"); [[ "$got" == "$want" ]] || fail "2 ranks on $cores cores: --loader-threads $got, expected $want"
  if ((cores >= 2)); then
    ok "$work/bound.out" "${mpirun[@]}" --bind-to core -np 2 "$app" "${model[@]}" --steps 1 --no-progress --log "$work/bound.jsonl"
    got=$(threads_of "$work/bound.jsonl"); [[ "$got" == 1 ]] || fail "2 ranks bound to a core each: --loader-threads $got"
  fi
  ok "$work/given.out" "$app" "${model[@]}" --steps 1 --no-progress --loader-threads 3 --log "$work/given.jsonl"
  got=$(threads_of "$work/given.jsonl"); [[ "$got" == 3 ]] || fail "--loader-threads 3 recorded as $got"
  refused_exit "1 2" "--loader-threads must be >= 0, got -2" "${model[@]}" --steps 1 --loader-threads -2
  echo "loader_threads: OK ($cores cores: 1 rank $cores threads, 2 ranks $want each, taskset 1)"
  ;;
loader_only)
  "$make_folder" "$work/imgs" 256 16 1 a=0 b=120 c=240 || fail "make_image_folder"
  # check OUT BATCHES RANKS IMAGES THREADS: the report line's figures, and per thread = all / (ranks x threads).
  check() {
    local line
    line=$(grep -E "^loader only: " "$1") || { cat "$1"; fail "no report line"; }
    echo "$line"
    [[ "$line" =~ ^loader\ only:\ ([0-9]+)\ batches\ of\ [0-9]+\ x\ ([0-9]+)\ rank\(s\),\ ([0-9]+)\ images\ in\ ([0-9.]+)\ s:\ ([0-9.]+)\ img/s,\ ([0-9.]+)\ img/s\ per\ thread\ \(([0-9]+)\ loader ]] ||
      fail "report line not understood"
    local b=${BASH_REMATCH[1]} r=${BASH_REMATCH[2]} n=${BASH_REMATCH[3]} s=${BASH_REMATCH[4]} all=${BASH_REMATCH[5]}
    local per=${BASH_REMATCH[6]} t=${BASH_REMATCH[7]}
    [[ $b == "$2" && $r == "$3" && $n == "$4" && $t == "$5" ]] ||
      fail "expected $2 batches, $3 ranks, $4 images, $5 threads; got $b, $r, $n, $t"
    awk -v n="$n" -v s="$s" -v all="$all" -v per="$per" -v r="$r" -v t="$5" 'BEGIN {
      tt = t > 0 ? t : 1
      exit !(all > 0 && (all - n / s) ^ 2 <= ((0.001 / s + 0.01) * all + 0.2) ^ 2 && (per - all / (r * tt)) ^ 2 <= 0.01 + (0.01 * per) ^ 2) }' ||
      fail "img/s $all or per thread $per does not follow from $n images in $s s"
    ! grep -q "^done:\|^step " "$1" || fail "--loader-only trained"
    # The steady state (issue 40): the batches after the first, their images and rate.
    line=$(grep -E "^loader only, steady state: " "$1") || fail "no steady-state line"
    echo "$line"
    [[ "$line" =~ ^loader\ only,\ steady\ state:\ ([0-9]+)\ images\ of\ the\ ([0-9]+)\ batches\ after\ the\ first\ \(the\ fill,\ ([0-9.]+)\ s\)\ in\ ([0-9.]+)\ s:\ ([0-9.]+)\ img/s ]] ||
      fail "steady-state line not understood"
    local si=${BASH_REMATCH[1]} sb=${BASH_REMATCH[2]} fill=${BASH_REMATCH[3]} ss=${BASH_REMATCH[4]} sr=${BASH_REMATCH[5]}
    [[ $sb == $((b - 1)) && $si == $((n - n / b)) ]] ||
      fail "steady state: expected $((b - 1)) batches and $((n - n / b)) images, got $sb and $si"
    awk -v si="$si" -v ss="$ss" -v sr="$sr" -v fill="$fill" -v s="$s" 'BEGIN {
      exit !(sr > 0 && (sr - si / ss) ^ 2 <= ((0.001 / ss + 0.01) * sr + 0.2) ^ 2 && fill <= s + 0.001 && ss <= s + 0.001) }' ||
      fail "steady state: $sr img/s does not follow from $si images in $ss s, or fill $fill s or steady $ss s is longer than the whole $s s"
  }
  aug=(--augment --aa rand-m9-mstd0.5-inc1 --reprob 0.25 --image-size 64 --micro-batch 8)
  ok "$work/one.out" "$app" --loader-only --data "folder:$work/imgs" "${aug[@]}" --steps 5 --loader-threads 2
  check "$work/one.out" 5 1 40 2
  grep -qF -- "--augment --aa rand-m9-mstd0.5-inc1 --reprob 0.25" "$work/one.out" || fail "the report does not name the augmentation"
  ok "$work/zero.out" "$app" --loader-only --data "folder:$work/imgs" "${aug[@]}" --steps 3 --loader-threads 0
  check "$work/zero.out" 3 1 24 0
  # An epoch of 48 images is 6 batches of 8: 10 batches cross into the second epoch.
  ok "$work/two.out" "${mpirun[@]}" -np 2 "$app" --loader-only --data "folder:$work/imgs" "${aug[@]}" \
    --micro-batch 4 --steps 10 --loader-threads 1
  check "$work/two.out" 10 2 80 1
  ok "$work/default.out" "$app" --loader-only --data synthetic --image-size 32 --micro-batch 4 --loader-threads 1
  check "$work/default.out" 50 1 200 1
  refused_exit "1 2" "folder:$work/none" --loader-only --data "folder:$work/none"
  refused_exit "1 2" "--loader-only and --plan go separately" --loader-only --plan
  refused_exit "1 2" "fewer than one micro-batch" --loader-only --data "folder:$work/imgs" --micro-batch 64
  echo "loader_only: OK"
  ;;
*) fail "unknown case $case_name" ;;
esac
