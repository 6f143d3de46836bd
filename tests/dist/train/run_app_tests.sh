#!/usr/bin/env bash
# convnext_zero from the outside. Usage: run_app_tests.sh CASE APP MPIEXEC
#   ranks_match_one_process  2 and 4 ranks at ZeRO stages 0-3 log the same losses and gradient norms as 1 rank
#   bad_input                each bad flag or file: non-zero exit, a message naming it, no crash
#   multi_rank_error         a bad data path under mpirun: every rank exits non-zero, nobody hangs
#   comm_backend             --comm-backend: CPU ranks say MPI; a communicator of one trains as none at stages 0-3
#   export_initial           --steps 0 --export-weights: the initial weights, from which a run starts identically;
#                            its summary says what it did; --init-weights says what it loaded
#   mesh                     --shard-group and --hpz on 2 simulated hosts x 2 ranks: the losses of 1 rank, checkpoints
#                            between HSDP and flat runs at other world sizes, and their bad values
#   resume_eta               a run resumed at step 150 of 450 estimates the time left from its own steps
#   cli                      --help in sections and wrapped to the terminal; a flag given twice takes its last value;
#                            the log's start record (every flag, world, device, build, time), "t" and "split"
set -uo pipefail
case_name=$1 app=$2 mpiexec=$3
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
tiny_model 4


case $case_name in
ranks_match_one_process)
  # N ranks x micro-batch 16/N at every ZeRO stage against 1 rank x 16: the same global batch, so the same
  # losses and gradient norms up to the order of float sums (grad-accum, clipping and drop-path on).
  common=("${tiny[@]}" --steps 3 --drop-path 0.2 --eval-batches 1 --seed 3 --grad-accum 2 --clip-grad 1
          --bucket-mb 0.01)
  "$app" "${common[@]}" --micro-batch 16 --log "$work/np1.jsonl" > "$work/np1.out" 2>&1 ||
    { cat "$work/np1.out"; fail "1-rank run failed"; }
  for np in 2 4; do
    for stage in 0 1 2 3; do
      "${mpirun[@]}" -np $np "$app" "${common[@]}" --micro-batch $((16 / np)) --stage $stage \
        --log "$work/np$np.jsonl" > "$work/np$np.out" 2>&1 || { cat "$work/np$np.out"; fail "$np ranks at stage $stage failed"; }
      compare "$work/np1.jsonl" "$work/np$np.jsonl" 3 "$np ranks, stage $stage, against 1 rank"
    done
  done
  echo "ranks_match_one_process: OK"
  ;;
bad_input)
  mkdir -p "$work/cifar" "$work/empty_folder"
  head -c 5000 /dev/urandom > "$work/cifar/data_batch_1.bin"  # not a multiple of 3073 bytes
  echo "not hdf5" > "$work/junk.h5"
  check() {  # check EXPECTED-SUBSTRING ARGS...
    local want=$1; shift
    "$app" "$@" > "$work/out" 2>&1
    local rc=$?
    if [[ $rc -eq 0 || $rc -ge 128 ]]; then cat "$work/out"; fail "'$*' exited with $rc"; fi
    grep -qF -- "$want" "$work/out" || { cat "$work/out"; fail "'$*': message lacks '$want'"; }
    ! grep -qiE 'terminate called|segmentation|core dumped|abort' "$work/out" ||
      { cat "$work/out"; fail "'$*' crashed"; }
    echo "ok ($rc): $* -> $(grep -F -- "$want" "$work/out" | head -1)"
  }
  check "--model must be one of atto, femto, pico, nano, tiny, small, base, large, xlarge, convnextv2_atto, convnextv2_femto, convnextv2_pico, convnextv2_nano, convnextv2_tiny, convnextv2_small, convnextv2_base, convnextv2_large, convnextv2_huge, got 'tinyy'" --model tinyy \
    --steps 1
  check "--micro-batch" "${tiny[@]}" --steps 1 --micro-batch 0
  check "--image-size" "${tiny[@]}" --steps 1 --image-size -3
  check "--steps" "${tiny[@]}" --steps -1
  check "--bogus" "${tiny[@]}" --steps 1 --bogus
  check "unknown flag --stpes (did you mean --steps?)" "${tiny[@]}" --stpes 1
  check "give the run's length with --epochs N or --steps N" "${model[@]}" --data "h5:$work/junk.h5"
  check "--precision" "${tiny[@]}" --steps 1 --precision fp8
  check "--precision fp16" "${tiny[@]}" --steps 1 --precision fp16
  check "--initial-loss-scale" "${tiny[@]}" --steps 1 --initial-loss-scale nan
  check "$work/nothing" "${model[@]}" --steps 1 --data "folder:$work/nothing"
  check "$work/empty_folder" "${model[@]}" --steps 1 --data "folder:$work/empty_folder"
  check "data_batch_1.bin" "${model[@]}" --steps 1 --data "cifar10:$work/cifar"
  check "$work/junk.h5" "${model[@]}" --steps 1 --data "h5:$work/junk.h5"
  check "$work/junk.h5" "${tiny[@]}" --steps 1 --init-weights "$work/junk.h5"
  check "nosuchkind" "${model[@]}" --steps 1 --data nosuchkind:x
  check "--device" "${tiny[@]}" --steps 1 --device tpu
  check "--stage" "${tiny[@]}" --steps 1 --stage 4
  check "--cuda-graphs on needs --device cuda" "${tiny[@]}" --steps 1 --cuda-graphs on
  check "--cuda-graphs must be auto, on or off, got 'maybe'" "${tiny[@]}" --steps 1 --cuda-graphs maybe
  check "--checkpoint-every" "${tiny[@]}" --steps 1 --checkpoint-every 5
  check "$work/no_checkpoints" "${tiny[@]}" --steps 1 --resume "$work/no_checkpoints"
  "$app" "${tiny[@]}" --steps 2 --checkpoint-dir "$work/ck_small" > /dev/null 2>&1 || fail "saving failed"
  check "saved with --dims 8,16,24,32" --depths 1,1,1,1 --dims 8,16,24,40 --num-classes 4 --image-size 32 \
    --loader-threads 1 --no-progress --data synthetic:n=256,eval_n=64,classes=4 --steps 3 --resume "$work/ck_small"
  check "past this run" "${tiny[@]}" --steps 1 --resume "$work/ck_small"
  echo junk > "$work/ck_small/step_2/rank_00000.h5"
  check "rank_00000.h5" "${tiny[@]}" --steps 3 --resume "$work/ck_small/step_2"
  check "--bucket-mb" "${tiny[@]}" --steps 1 --bucket-mb 0
  check "--prefetch" "${tiny[@]}" --steps 1 --prefetch -1
  check "--reduce-dtype" "${tiny[@]}" --steps 1 --reduce-dtype fp8
  check "--comm-backend must be nccl, mpi or auto, got 'ucx'" "${tiny[@]}" --steps 1 --comm-backend ucx
  check "--comm-backend nccl needs --device cuda" "${tiny[@]}" --steps 1 --comm-backend nccl
  echo "bad_input: OK"
  ;;
export_initial)
  # --steps 0 --export-weights writes the initial weights; a run started from them (--init-weights, another
  # --seed) computes what the run with the original seed computes, to the bit.
  plain=("${tiny[@]}" --no-shuffle --eval-batches 1 --micro-batch 16)
  "$app" "${plain[@]}" --seed 7 --steps 3 --log "$work/a.jsonl" > "$work/out" 2>&1 || { cat "$work/out"; fail "run a"; }
  "$app" "${plain[@]}" --seed 7 --steps 0 --export-weights "$work/init.h5" > "$work/out" 2>&1 ||
    { cat "$work/out"; fail "--steps 0 --export-weights failed"; }
  [[ -s "$work/init.h5" ]] || fail "no export after zero steps"
  ! grep -q '^step ' "$work/out" || fail "progress lines despite --no-progress"
  cat "$work/out"
  # A run of no step says what it did, not a loss and a peak memory of zero.
  grep -qxE "done: no training step \(--steps 0\); eval loss [0-9.]+ top1 [0-9.]+% top5 n/a; weights exported to $work/init.h5" \
    "$work/out" || fail "the --steps 0 summary"
  ! grep -qE "final train loss|peak memory 0.0" "$work/out" || fail "the --steps 0 summary has a loss or a zero peak"
  "$app" "${plain[@]}" --seed 99 --steps 3 --init-weights "$work/init.h5" --log "$work/c.jsonl" > "$work/out" 2>&1 ||
    { cat "$work/out"; fail "run from the exported init"; }
  # --init-weights says what it loaded: every tensor of this model (its parameter count), with timm keys.
  grep -F -- "--init-weights $work/init.h5: " "$work/out" || fail "--init-weights printed nothing"
  grep -qE -- "--init-weights .*: [0-9]+ tensors \(0\.03M values\) with timm keys; the head loaded with the rest$" "$work/out" ||
    fail "--init-weights: not the tensors, key style and head"
  "$app" "${plain[@]}" --seed 99 --steps 1 --init-weights "$work/init.h5" --reset-head --num-classes 6 > "$work/out" 2>&1 ||
    { cat "$work/out"; fail "--reset-head"; }
  grep -qF "the head (head.fc.*) was not loaded (--reset-head): a new one for 6 classes" "$work/out" ||
    { cat "$work/out"; fail "--reset-head is not reported"; }
  paste -d' ' <(steps_of "$work/a.jsonl") <(steps_of "$work/c.jsonl")
  [[ $(steps_of "$work/a.jsonl" | wc -l) -eq 3 ]] || fail "expected 3 steps"
  diff <(steps_of "$work/a.jsonl") <(steps_of "$work/c.jsonl") || fail "the run from the exported init differs"
  echo "export_initial: OK"
  ;;
multi_rank_error)
  start=$SECONDS
  timeout 120 "${mpirun[@]}" -np 2 "$app" "${model[@]}" --steps 1 --data "folder:$work/nothing" > "$work/out" 2>&1
  rc=$?
  cat "$work/out"
  [[ $rc -ne 0 && $rc -ne 124 ]] || fail "mpirun exited with $rc (124: hung)"
  grep -qF "$work/nothing" "$work/out" || fail "no message naming the path"
  echo "multi_rank_error: OK in $((SECONDS - start)) s"
  ;;
checkpoint_reshard)
  # Saved at N ranks and stage s, resumed at M ranks and stage t with the same global batch (16): the resumed
  # steps' losses and gradient norms follow the uninterrupted run's to float tolerance.
  common=("${tiny[@]}" --steps 8 --drop-path 0.1 --augment --ema-decay 0.99 --clip-grad 1 --eval-batches 1)
  run_np() {  # run_np RANKS ARGS...: one run, 16 images per step in total
    local np=$1; shift
    if ((np == 1)); then "$app" "${common[@]}" --micro-batch 16 "$@"; else
      "${mpirun[@]}" -np "$np" "$app" "${common[@]}" --micro-batch $((16 / np)) "$@"; fi
  }
  for hop in "4 3 2 1" "2 2 1 0" "1 0 4 3"; do
    read -r n s m t <<< "$hop"
    rm -rf "$work/ck"
    run_np "$n" --stage "$s" --checkpoint-dir "$work/ck" --checkpoint-every 4 --log "$work/straight.jsonl" \
      > "$work/out" 2>&1 || { cat "$work/out"; fail "$n ranks at stage $s failed"; }
    [[ -d "$work/ck/step_4" && -d "$work/ck/step_8" ]] || { ls -la "$work/ck"; fail "no step_4 and step_8"; }
    run_np "$m" --stage "$t" --resume "$work/ck/step_4" --log "$work/resumed.jsonl" > "$work/out" 2>&1 ||
      { cat "$work/out"; fail "resuming at $m ranks, stage $t failed"; }
    paste -d' ' <(steps_of "$work/straight.jsonl" | tail -n 4) <(steps_of "$work/resumed.jsonl") > "$work/both"
    echo "$n ranks stage $s -> $m ranks stage $t:"; cat "$work/both"
    [[ $(wc -l < "$work/both") -eq 4 && $(steps_of "$work/resumed.jsonl" | head -1 | cut -d' ' -f1) == 5 ]] ||
      fail "expected the resumed run to log steps 5-8"
    awk '{ for (c = 2; c <= 3; ++c) { a = $c; b = $(c + 3); d = a - b; if (d < 0) d = -d;
           if (d > 1e-5 * (a < 0 ? -a : a) + 1e-7) { print "step " $1 ": " a " vs " b; bad = 1 } } }
         END { exit bad }' "$work/both" || fail "$n -> $m ranks: resumed run disagrees"
  done
  echo "checkpoint_reshard: OK"
  ;;
mesh)
  # The 2-D mesh (Note [2-D mesh]) on two simulated hosts of two ranks ($CZ_SIMULATE_HOSTS=2).
  common=("${tiny[@]}" --drop-path 0.2 --eval-batches 1 --seed 3 --grad-accum 2 --clip-grad 1 --bucket-mb 0.01)
  compare() {  # compare A.jsonl B.jsonl LINES WHAT: step, loss and gradient norm to 1e-5 relative
    paste -d' ' <(steps_of "$1") <(steps_of "$2") > "$work/both"
    echo "$4:"; cat "$work/both"
    [[ $(wc -l < "$work/both") -eq $3 ]] || fail "$4: expected $3 step records in each log"
    awk '{ if ($1 != $4) { print "step " $1 " vs " $4; bad = 1 }
           for (c = 2; c <= 3; ++c) { a = $c; b = $(c + 3); d = a - b; if (d < 0) d = -d;
             if (d > 1e-5 * (a < 0 ? -a : a) + 1e-7) { print "step " $1 ": " a " vs " b; bad = 1 } } }
         END { exit bad }' "$work/both" || fail "$4: the losses differ"
  }
  mesh_run() {  # mesh_run RANKS LOG ARGS...: 16 images per micro-step in total
    local np=$1 log=$2; shift 2
    if ((np == 1)); then "$app" "${common[@]}" --micro-batch 16 --log "$log" "$@" > "$work/out" 2>&1; else
      CZ_SIMULATE_HOSTS=2 "${mpirun[@]}" -x CZ_SIMULATE_HOSTS -np "$np" "$app" "${common[@]}" \
        --micro-batch $((16 / np)) --log "$log" "$@" > "$work/out" 2>&1; fi || { cat "$work/out"; fail "$np ranks: $* failed"; }
  }
  mesh_run 1 "$work/np1.jsonl" --steps 3
  for flags in "--stage 1 --shard-group host" "--stage 2 --shard-group 2" "--stage 3 --shard-group host" \
               "--stage 3 --hpz" "--stage 3 --shard-group host --offload-optimizer"; do
    # shellcheck disable=SC2086
    mesh_run 4 "$work/np4.jsonl" --steps 3 $flags
    compare "$work/np1.jsonl" "$work/np4.jsonl" 3 "1 rank vs 2 hosts x 2 ranks $flags"
    grep -q '"comm_cross_bytes":[1-9]' "$work/np4.jsonl" || fail "$flags: no cross-host bytes logged"
  done
  # Checkpoints between meshes and world sizes: HSDP at 4 ranks -> flat stage 3 at 2, flat at 2 -> HSDP at 4.
  for hop in "4:--stage 3 --shard-group host:2:--stage 3" "2:--stage 3:4:--stage 2 --shard-group 2" \
             "4:--stage 3 --hpz:1:--stage 1"; do
    IFS=: read -r n from m to <<< "$hop"
    rm -rf "$work/ck"
    # shellcheck disable=SC2086
    mesh_run "$m" "$work/straight.jsonl" --steps 8 $to
    # shellcheck disable=SC2086
    mesh_run "$n" "$work/first.jsonl" --steps 8 $from --checkpoint-dir "$work/ck" --checkpoint-every 4
    [[ -d "$work/ck/step_4" ]] || { ls -la "$work/ck"; fail "no step_4"; }
    # shellcheck disable=SC2086
    mesh_run "$m" "$work/resumed.jsonl" --steps 8 $to --resume "$work/ck/step_4"
    grep '"split":"train"' "$work/straight.jsonl" | tail -n 4 > "$work/straight_tail.jsonl"
    compare "$work/straight_tail.jsonl" \
      "$work/resumed.jsonl" 4 "$n ranks $from -> $m ranks $to"
  done
  # Bad values: non-zero exit and a message naming the flag, on every launch.
  bad() {  # bad EXPECTED RANKS SIMULATED-HOSTS ARGS...
    local want=$1 np=$2 sim=$3; shift 3
    if ((np == 1)); then "$app" "${tiny[@]}" --steps 1 --micro-batch 4 "$@" > "$work/out" 2>&1; else
      CZ_SIMULATE_HOSTS=$sim "${mpirun[@]}" -x CZ_SIMULATE_HOSTS -np "$np" "$app" "${tiny[@]}" --steps 1 \
        --micro-batch 4 "$@" > "$work/out" 2>&1; fi
    local rc=$?
    if [[ $rc -eq 0 || $rc -ge 128 ]]; then cat "$work/out"; fail "'$*' on $np ranks exited with $rc"; fi
    grep -qF -- "$want" "$work/out" || { cat "$work/out"; fail "'$*': message lacks '$want'"; }
    echo "ok ($rc): $np ranks $* -> $(grep -F -- "$want" "$work/out" | head -1)"
  }
  bad "--shard-group 3 does not divide the 4 ranks" 4 "" --stage 3 --shard-group 3
  bad "--shard-group must be world, host or a number" 1 "" --stage 3 --shard-group two
  bad "--hpz is for --stage 3" 1 "" --stage 2 --hpz
  bad "--hpz needs more than one host" 4 "" --stage 3 --hpz
  bad "--hpz needs more than one host" 1 "" --stage 3 --hpz
  bad "--hpz shards over the world" 4 2 --stage 3 --hpz --shard-group host
  echo "mesh: OK"
  ;;
comm_backend)
  # --comm-backend (Note [Choosing the comm backend]): CPU ranks use MPI and say so; at one rank a named
  # backend runs the collectives over a communicator of one, which must train as the run without one.
  common=("${tiny[@]}" --drop-path 0.2 --eval-batches 1 --seed 3 --grad-accum 2 --clip-grad 1 --bucket-mb 0.01)
  "${mpirun[@]}" -np 2 "$app" "${common[@]}" --steps 1 --micro-batch 8 > "$work/out" 2>&1 ||
    { cat "$work/out"; fail "2 ranks failed"; }
  grep -q "collectives over mpi (CPU ranks)" "$work/out" || { cat "$work/out"; fail "no backend in the header"; }
  for stage in 0 1 2 3; do
    "$app" "${common[@]}" --steps 3 --micro-batch 16 --stage $stage --log "$work/auto.jsonl" > "$work/out" 2>&1 ||
      { cat "$work/out"; fail "stage $stage failed"; }
    ! grep -q "collectives over" "$work/out" || { cat "$work/out"; fail "one rank with auto has no communicator"; }
    "$app" "${common[@]}" --steps 3 --micro-batch 16 --stage $stage --comm-backend mpi --log "$work/one.jsonl" \
      > "$work/out" 2>&1 || { cat "$work/out"; fail "stage $stage over a communicator of one failed"; }
    grep -q "collectives over mpi (CPU ranks)" "$work/out" || { cat "$work/out"; fail "no communicator of one"; }
    compare "$work/auto.jsonl" "$work/one.jsonl" 3 "stage $stage, no communicator vs one of one"
  done
  echo "comm_backend: OK"
  ;;
scaling_study_quick)
  # The study's smallest grid end to end: one CSV row per configuration, each with a non-zero throughput and,
  # at 2 ranks, a hidden fraction in [0, 1] (Note [Exposed communication]; it was -1056% and -25%).
  build=$(dirname "$(dirname "$app")")
  root=$(cd "$(dirname "$0")/../../.." && pwd)
  # With python3-matplotlib installed, start the study under an interpreter that cannot see it (-S: no
  # site-packages, like a pyenv python3): it must re-run itself under /usr/bin/python3 and draw the plots.
  plots=0
  flags=()
  if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then plots=1 flags=(-S); fi
  "$py" "${flags[@]}" "$root/scripts/scaling_study.py" --quick --build "$build" --out "$work/study" \
    --mpirun "$mpiexec" > "$work/study.out" 2>&1 || { cat "$work/study.out"; fail "the study failed"; }
  cat "$work/study.out"
  if ((plots)); then
    grep -q "running under /usr/bin/python3" "$work/study.out" && ls "$work/study"/throughput.png > /dev/null ||
      fail "started without matplotlib, the study did not re-run under /usr/bin/python3 and plot"
  fi
  "$py" - "$work/study/results.csv" <<'PY' || fail "bad results.csv"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
want = {(r, s) for r in ("1", "2") for s in ("0", "3")}
got = {(r["ranks"], r["stage"]) for r in rows}
assert len(rows) == len(want) and got == want, f"configurations {sorted(got)}, expected {sorted(want)}"
for r in rows:
    assert float(r["img_per_s"]) > 0 and int(float(r["model_state_bytes"])) > 0, r
    assert r["ranks"] == "1" or int(float(r["comm_bytes"])) > 0, r
    assert r["ranks"] == "1" or 0 <= float(r["hidden_fraction"]) <= 1, r
print(f"{len(rows)} rows, all with throughput")
PY
  [[ -s "$work/study/summary.md" ]] || fail "no summary.md"
  echo "scaling_study_quick: OK"
  ;;
resume_eta)
  # Resumed at step 150 of 450, the ETA must follow the pace of the steps this process runs, not spread the
  # elapsed time over 150 steps it never ran (which printed "ETA 0:00" with seconds to go). Checked against
  # the time the run then really took (`elapsed` of the last progress line less that of the line checked),
  # within a factor of 4 either way for a loaded machine: the old ETA was 1/16 of it at step 160.
  # 64 px: steps slow enough on an idle machine that whole seconds can judge the estimate (32 px ran in 2 s).
  eta_run=(--depths 1,1,1,1 --dims 8,16,24,32 --num-classes 4 --image-size 64 --loader-threads 1 --micro-batch 64
           --data synthetic:n=256,eval_n=64,classes=4 --checkpoint-dir "$work/ck")
  "$app" "${eta_run[@]}" --steps 150 --no-progress > "$work/out" 2>&1 || { cat "$work/out"; fail "the first run failed"; }
  "$app" "${eta_run[@]}" --steps 450 --resume "$work/ck" --progress-interval 0 > "$work/out" 2>&1 ||
    { cat "$work/out"; fail "the resumed run failed"; }
  secs() { awk -F: '{ print $1 * 60 + $2 }' <<< "$1"; }
  line=$(grep -E '^step 16[0-9]/450 ' "$work/out" | head -1)
  last=$(grep -E '^step 450/450 ' "$work/out")
  [[ -n $line && -n $last ]] || { tail "$work/out"; fail "no progress lines for steps 160-169 and 450"; }
  eta=$(secs "$(sed -E 's/.*ETA ([0-9:]+).*/\1/' <<< "$line")")
  left=$(($(secs "$(sed -E 's/.*elapsed ([0-9:]+).*/\1/' <<< "$last")") - $(secs "$(sed -E 's/.*elapsed ([0-9:]+).*/\1/' <<< "$line")")))
  echo "$line"
  echo "$last"
  echo "== ETA ${eta} s at ${line%%  loss*}; the run took ${left} s more"
  ((left >= 3)) || fail "the run was too quick to judge the ETA (${left} s)"
  ((4 * eta + 2 >= left && eta <= 4 * left + 2)) || fail "ETA ${eta} s, but ${left} s were left"
  echo "resume_eta: OK"
  ;;
cli)
  # --help: grouped into sections, wrapped at 80 columns when stdout is not a terminal, at $COLUMNS when set,
  # and at a terminal's width (script(1) gives one, stty sets its width).
  "$app" --help > "$work/help" || fail "--help failed"
  awk 'length > 80 { print "too long (" length "): " $0; bad = 1 } END { exit bad }' "$work/help" ||
    fail "--help has lines over 80 columns"
  for section in "Model and weights:" "Data and evaluation:" "Augmentation and regularisation:" \
    "Optimizer and schedule:" "Device and precision:" "Distributed and ZeRO:" "Checkpoints, logs and progress:" \
    "Planning (--plan: no training):"; do
    grep -qxF "$section" "$work/help" || fail "no '$section' section in --help"
  done
  tr '\n' ' ' < "$work/help" | grep -qE -- '--device TEXT=cpu +cpu \| cuda\[:N\]' || fail "--device help lacks cuda[:N]"
  COLUMNS=120 "$app" --help > "$work/help120"
  awk 'length > 120 { bad = 1 } length > 80 { wide = 1 } END { exit bad || !wide }' "$work/help120" ||
    fail "COLUMNS=120: lines over 120 columns, or none over 80"
  if command -v script > /dev/null; then
    script -qec "stty cols 100; $(printf '%q' "$app") --help" /dev/null | tr -d '\r' > "$work/help100"
    awk 'length > 100 { bad = 1 } length > 80 { wide = 1 } END { exit bad || !wide }' "$work/help100" ||
      fail "on a 100-column terminal: lines over 100 columns, or none over 80"
  fi
  echo "--help: $(wc -l < "$work/help") lines, at most 80 columns; 120 with COLUMNS=120, 100 on a 100-column terminal"
  # A flag given twice takes its last value (argparse does): a resume command extended by --steps N.
  "$app" "${tiny[@]}" --steps 5 --micro-batch 16 --eval-every 2 --steps 3 --log "$work/run.jsonl" > "$work/out" 2>&1 ||
    { cat "$work/out"; fail "--steps given twice was refused"; }
  [[ $(steps_of "$work/run.jsonl" | wc -l) -eq 3 ]] || fail "--steps 5 ... --steps 3 did not run 3 steps"
  # The log: a start record with every flag's value, the world, device, build and time; "t" on every record;
  # "split" on every step and evaluation record.
  "$py" - "$work/run.jsonl" "$work/help" 1 <<'PY' || fail "the log's records"
import json, re, sys
records = [json.loads(l) for l in open(sys.argv[1])]
start = records[0]
assert start["event"] == "start", start
assert start["world_size"] == int(sys.argv[3]) and start["device"] == "cpu", start
assert re.match(r"\d+\.\d+\.\d+", start["version"]), start["version"]
assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", start["time"]), start["time"]
# The run's flags: those of every section of --help but the first (-h,--help), the planner's and --loader-only's.
sections = re.split(r"^(\S.*):$", open(sys.argv[2]).read(), flags=re.M)
run_flags = {f for title, body in zip(sections[1::2], sections[2::2]) if title not in ("Options", "Planning (--plan: no training)", "Loader benchmark (--loader-only: no training)")
             for f in re.findall(r"^  --([a-z0-9-]+)", body, re.M)}
assert len(run_flags) > 50, run_flags
assert set(start["flags"]) == run_flags, sorted(set(start["flags"]) ^ run_flags)
assert start["flags"]["steps"] == 3 and start["flags"]["micro-batch"] == 16 and start["flags"]["no-progress"] is True
for r in records:
    assert isinstance(r["t"], float) and r["t"] >= start["t"] - 1, r
steps = [r for r in records if r.get("split") == "train"]
evals = [r for r in records if r.get("split") == "eval"]
assert [r["step"] for r in steps] == [1, 2, 3], steps
assert [r["step"] for r in evals] == [2, 3], evals
assert len(records) == 1 + len(steps) + len(evals), records
print(f"log: a start record with {len(start['flags'])} flags, {start['version']}, {start['time']}; "
      f"{len(steps)} train and {len(evals)} eval records, each with t")
PY
  "${mpirun[@]}" -np 2 "$app" "${tiny[@]}" --steps 3 --micro-batch 8 --eval-every 2 --log "$work/run2.jsonl" > "$work/out" 2>&1 ||
    { cat "$work/out"; fail "2 ranks failed"; }
  "$py" - "$work/run2.jsonl" "$work/help" 2 <<'PY' || fail "the log's records at 2 ranks"
import json, sys
records = [json.loads(l) for l in open(sys.argv[1])]
assert records[0]["event"] == "start" and records[0]["world_size"] == 2, records[0]
assert [r["step"] for r in records if r.get("split") == "train"] == [1, 2, 3]
print("2 ranks: world_size 2 in the start record")
PY
  # Ranks given different values (the last one counting) still stop, naming the flag.
  "${mpirun[@]}" -np 1 "$app" "${tiny[@]}" --steps 3 --micro-batch 8 : -np 1 "$app" "${tiny[@]}" --steps 3 \
    --micro-batch 8 --steps 4 > "$work/out" 2>&1
  rc=$?
  ((rc != 0)) && grep -q "ranks were started with different --steps" "$work/out" ||
    { cat "$work/out"; fail "ranks whose last --steps differ were not stopped (exit $rc)"; }
  echo "cli: OK"
  ;;
*) fail "unknown case $case_name" ;;
esac
