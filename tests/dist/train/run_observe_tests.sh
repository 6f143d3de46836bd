#!/usr/bin/env bash
# Seeing a run from the outside: --tensorboard, --comms-table, the rank statistics, plot_run.py and --trace's
# timeline. Usage: run_observe_tests.sh CASE APP MPIEXEC
#   tensorboard      2 ranks at stage 2 with --tensorboard: rank 0 alone writes one event file, which TensorBoard's
#                    reader (and check_tensorboard.py's own) decodes to the JSON log's values; a resumed run adds
#                    a second file and the two read as one run
#   tensorboard_bad  --tensorboard on a file, or under a file: a message naming the flag and the path, exit 1
#   comms_table      2 ranks, --comms-table: at stage 0 the table's rows add up to the log's comm_s and comm_bytes
#                    (bytes x nccl-tests' bus factor = what a ring sends), its bandwidths follow from its times;
#                    at stage 2 it has reduce-scatters and all-gathers; one rank has none
#   slow_rank        2 ranks bound to a core each, two busy loops sharing rank 1's core: the log's "ranks" records
#                    (every --rank-stats-every steps) name rank 1 as the slowest, in compute, in most intervals,
#                    with every rank's figures; TensorBoard gets them as ranks/*; --rank-stats-every 0 writes none
#   plot             scripts/plot_run.py on one and on two real logs: a PNG of the six panels, named in the
#                    closing line; a missing or non-log file is refused by name
#   trace_stage2     2 ranks at stage 2, --trace-steps 2:3 of 5 steps with a checkpoint inside: check_trace.py
#                    finds the Trace Event format, nesting per lane, steps 2-3 only, each step's span = the log's
#                    step_time_s within 2%, and reduce-scatters overlapping backward
#   trace_bad        --trace-steps 5:2, 0:1 and x, and an unwritable --trace FILE: a message naming the flag, exit 1
#   trace_plot       2 ranks at stage 3, then scripts/plot_run.py --trace draws the traced step's lanes into a PNG
#   trace_offload    2 ranks at stage 2 with --offload-optimizer: the offload worker's jobs on a lane of their own
set -uo pipefail
case_name=$1 app=$2 mpiexec=$3
here=$(cd "$(dirname "$0")" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
tiny_model 5
tiny+=(--micro-batch 8 --bucket-mb 0.01)
# check_tensorboard.py reads with TensorBoard's reader where $py has the tensorboard package, else with its own.

case $case_name in
tensorboard)
  "${mpirun[@]}" -np 2 "$app" "${tiny[@]}" --stage 2 --steps 6 --eval-every 3 --log "$work/run.jsonl" \
    --tensorboard "$work/tb" > "$work/out" 2>&1 || { cat "$work/out"; fail "2-rank run failed"; }
  "$py" "$here/check_tensorboard.py" "$work/tb" "$work/run.jsonl" 1 train/loss train/lr train/grad_norm \
    train/img_per_s train/peak_mem_bytes train/model_state_bytes train/comm_hidden eval/top1 eval/top5 eval/loss ||
    fail "the event file does not hold the log's values"
  # Stopped at step 3 and resumed: the log continues, TensorBoard gets a second file of steps 4-6.
  rm -rf "$work/tb"
  "${mpirun[@]}" -np 2 "$app" "${tiny[@]}" --stage 2 --steps 3 --log "$work/res.jsonl" --tensorboard "$work/tb" \
    --checkpoint-dir "$work/ck" --checkpoint-every 3 > "$work/out" 2>&1 || { cat "$work/out"; fail "first half failed"; }
  "${mpirun[@]}" -np 2 "$app" "${tiny[@]}" --stage 2 --steps 6 --log "$work/res.jsonl" --tensorboard "$work/tb" \
    --resume "$work/ck" > "$work/out" 2>&1 || { cat "$work/out"; fail "resumed half failed"; }
  [[ $(grep -c '"split":"train"' "$work/res.jsonl") -eq 6 ]] || fail "the resumed log does not hold 6 steps"
  "$py" "$here/check_tensorboard.py" "$work/tb" "$work/res.jsonl" 2 train/loss || fail "resumed run's files"
  echo "tensorboard: OK"
  ;;
tensorboard_bad)
  echo "a file" > "$work/file"
  for dir in "$work/file" "$work/file/sub"; do
    "$app" "${tiny[@]}" --steps 1 --tensorboard "$dir" > "$work/out" 2>&1
    rc=$?
    [[ $rc -eq 1 ]] || { cat "$work/out"; fail "--tensorboard $dir exited with $rc, expected 1"; }
    grep -qF -- "--tensorboard $dir" "$work/out" || { cat "$work/out"; fail "the message does not name the flag and $dir"; }
  done
  echo "tensorboard_bad: OK"
  ;;
comms_table)
  for stage in 0 2; do
    "${mpirun[@]}" -np 2 "$app" "${tiny[@]}" --stage $stage --steps 4 --comms-table --log "$work/s$stage.jsonl" \
      > "$work/out$stage" 2>&1 || { cat "$work/out$stage"; fail "2 ranks at stage $stage failed"; }
    cat "$work/out$stage"
    grep -q "^# comms: rank 0's collectives in the 4 steps of this run" "$work/out$stage" || fail "no table printed"
  done
  "$py" - "$work/s0.jsonl" "$work/s2.jsonl" <<'PY' || fail "the comms table disagrees with the log"
import json, math, sys
def load(path):
    recs = [json.loads(l) for l in open(path)]
    tables = [r for r in recs if r.get("event") == "comms_table"]
    assert len(tables) == 1, f"{path}: {len(tables)} comms_table records"
    return [r for r in recs if r.get("split") == "train"], tables[0]
steps, table = load(sys.argv[1])
rows = table["rows"]
assert table["steps"] == 4 and rows, table
assert {r["op"] for r in rows} == {"all_reduce"}, rows
factor = {"all_reduce": 2 * (2 - 1) / 2, "reduce_scatter": 0.5, "all_gather": 0.5}
total_s = sum(r["total_s"] for r in rows)
comm_s = sum(s["comm_s"] for s in steps)
assert math.isclose(total_s, comm_s, rel_tol=1e-9), f"table {total_s} s, log {comm_s} s"
sent = sum(r["count"] * r["size_bytes"] * factor[r["op"]] for r in rows)
assert sent == sum(s["comm_bytes"] for s in steps), f"table {sent} B, log {sum(s['comm_bytes'] for s in steps)} B"
assert sum(r["exposed_s"] for r in rows) <= total_s + 1e-12
for r in rows:
    assert r["ranks"] == 2 and r["count"] % 4 == 0, r  # each bucket once a step
    algbw = r["count"] * r["size_bytes"] / r["total_s"] / 1e9
    assert math.isclose(r["algbw_gbs"], algbw, rel_tol=1e-9) and math.isclose(r["busbw_gbs"], algbw * factor[r["op"]], rel_tol=1e-9), r
    assert math.isclose(r["mean_us"], 1e6 * r["total_s"] / r["count"], rel_tol=1e-9), r
steps2, table2 = load(sys.argv[2])
ops = {r["op"] for r in table2["rows"]}
assert {"reduce_scatter", "all_gather"} <= ops, ops
print(f"comms_table: {len(rows)} rows, {total_s:.4f} s and {sent:.0f} B as the log's; stage 2: {sorted(ops)}")
PY
  "$app" "${tiny[@]}" --steps 2 --comms-table --log "$work/one.jsonl" > "$work/out1" 2>&1 || { cat "$work/out1"; fail "1 rank failed"; }
  grep -q "no collective ran" "$work/out1" || { cat "$work/out1"; fail "one rank: no 'no collective' line"; }
  echo "comms_table: OK"
  ;;
slow_rank)
  (($(nproc) >= 2)) || { echo "SKIP: one CPU"; exit 77; }
  # Two busy loops on rank 1's core: it gets a third of it.
  busy=()
  for _ in 1 2; do
    taskset -c 1 bash -c 'while :; do :; done' &
    busy+=($!)
  done
  on_exit 'kill "${busy[@]}" 2>/dev/null; wait "${busy[@]}" 2>/dev/null' 
  "${mpirun[@]}" -np 2 --bind-to core "$app" "${model[@]}" --data synthetic:n=4096,classes=5 --micro-batch 8 \
    --steps 40 --rank-stats-every 10 --log "$work/run.jsonl" --tensorboard "$work/tb" > "$work/out" 2>&1 ||
    { cat "$work/out"; fail "2-rank run failed"; }
  kill "${busy[@]}"
  "$py" - "$work/run.jsonl" <<'PY' || fail "the ranks records do not name rank 1"
import json, sys
recs = [r for r in map(json.loads, open(sys.argv[1])) if r.get("split") == "ranks"]
assert [r["step"] for r in recs] == [10, 20, 30, 40], [r["step"] for r in recs]
for r in recs:
    assert [x["rank"] for x in r["ranks"]] == [0, 1] and all(x["steps"] == 10 for x in r["ranks"]), r
    for x in r["ranks"]:
        parts = x["compute_s"] + x["data_wait_s"] + x["input_s"] + x["comm_wait_s"]
        assert abs(parts - x["step_s"]) < 1e-9 or x["compute_s"] == 0, x
named = [(r["slowest_rank"], r["slowest_phase"]) for r in recs]
print("slowest per interval:", named, "own ratios:", [round(r["slowest_own_ratio"], 2) for r in recs])
assert sum(n == (1, "compute") for n in named) >= 3, named
PY
  "$py" "$here/check_tensorboard.py" "$work/tb" "$work/run.jsonl" 1 train/loss ranks/slowest_rank ranks/rank1_own_s ||
    fail "TensorBoard lacks the ranks' figures"
  "${mpirun[@]}" -np 2 "$app" "${tiny[@]}" --steps 4 --rank-stats-every 0 --log "$work/off.jsonl" > "$work/out" 2>&1 ||
    { cat "$work/out"; fail "--rank-stats-every 0 failed"; }
  ! grep -q '"split":"ranks"' "$work/off.jsonl" || fail "--rank-stats-every 0 wrote ranks records"
  echo "slow_rank: OK"
  ;;
plot)
  plot=$here/../../../scripts/plot_run.py
  "$app" "${tiny[@]}" --steps 6 --eval-every 3 --log "$work/a.jsonl" > "$work/out" 2>&1 || { cat "$work/out"; fail "run a"; }
  cat "$work/out"
  # The closing line names the command; run as printed, it writes a.png beside the log.
  cmd=$(grep -o '; plot: .*' "$work/out" | sed 's/^; plot: //')
  [[ -n $cmd ]] || fail "the closing line names no plot command"
  eval "$cmd" || fail "the printed command failed: $cmd"
  [[ -s $work/a.png ]] || fail "no $work/a.png"
  "${mpirun[@]}" -np 2 "$app" "${tiny[@]}" --stage 3 --steps 6 --eval-every 3 --log "$work/b.jsonl" > "$work/out" 2>&1 ||
    { cat "$work/out"; fail "run b"; }
  "$py" "$plot" "$work/a.jsonl" "$work/b.jsonl" -o "$work/ab.png" > "$work/plot.out" 2>&1 || { cat "$work/plot.out"; fail "two runs"; }
  cat "$work/plot.out"
  # 2 runs x the 6 panels (loss, eval top-1, lr, img/s, data wait, memory): 12 lines.
  grep -q "ab.png: 12 lines of 2 runs" "$work/plot.out" || fail "expected 12 lines of 2 runs"
  "$py" -c "
import matplotlib.image as m, sys
a = m.imread(sys.argv[1])
assert a.shape[0] == 800 and a.shape[1] == 1500, a.shape
assert a[..., :3].std() > 0.05, 'blank picture'
" "$work/ab.png" || fail "ab.png is not a 1500x800 picture with something drawn"
  "$py" "$plot" "$work/nothere.jsonl" > "$work/plot.out" 2>&1 && fail "a missing log was accepted"
  grep -q "nothere.jsonl" "$work/plot.out" || { cat "$work/plot.out"; fail "the message does not name the file"; }
  echo '{"event": "start"}' > "$work/start_only.jsonl"
  "$py" "$plot" "$work/start_only.jsonl" > "$work/plot.out" 2>&1 && fail "a log without steps was accepted"
  grep -q "start_only.jsonl: no training step records" "$work/plot.out" || { cat "$work/plot.out"; fail "message"; }
  echo "plot: OK"
  ;;
trace_stage2)
  "${mpirun[@]}" -np 2 "$app" "${tiny[@]}" --stage 2 --steps 5 --log "$work/run.jsonl" --trace "$work/t.json" \
    --trace-steps 2:3 --checkpoint-dir "$work/ck" --checkpoint-every 2 > "$work/out" 2>&1 ||
    { cat "$work/out"; fail "2-rank run failed"; }
  "$py" "$here/check_trace.py" "$work/t.json" "$work/run.jsonl" 2 3 2 --overlap || fail "trace"
  grep -q '"checkpoint save' "$work/t.json" || fail "the save at step 2 is not on the timeline"
  ls "$work" | grep -q 'rank' && fail "the ranks' parts were left behind: $(ls "$work")"
  echo "trace_stage2: OK"
  ;;
trace_bad)
  for steps in 5:2 0:1 x 3; do
    "$app" "${tiny[@]}" --steps 1 --trace "$work/t.json" --trace-steps "$steps" > "$work/out" 2>&1
    rc=$?
    [[ $rc -eq 1 ]] || { cat "$work/out"; fail "--trace-steps $steps exited with $rc, expected 1"; }
    grep -qF -- "--trace-steps" "$work/out" && grep -qF -- "'$steps'" "$work/out" ||
      { cat "$work/out"; fail "the message does not name --trace-steps and '$steps'"; }
  done
  "${mpirun[@]}" -np 2 "$app" "${tiny[@]}" --steps 1 --trace "$work/no/such/dir/t.json" > "$work/out" 2>&1
  rc=$?
  [[ $rc -ne 0 ]] || { cat "$work/out"; fail "an unwritable --trace was accepted"; }
  grep -qF -- "--trace $work/no/such/dir/t.json: rank 0 cannot write" "$work/out" ||
    { cat "$work/out"; fail "the message does not name --trace, the rank and the file"; }
  echo "trace_bad: OK"
  ;;
trace_plot)
  "${mpirun[@]}" -np 2 "$app" "${tiny[@]}" --stage 3 --steps 3 --log "$work/run.jsonl" --trace "$work/t.json" \
    --trace-steps 2:2 > "$work/out" 2>&1 || { cat "$work/out"; fail "2-rank stage-3 run failed"; }
  "$py" "$here/check_trace.py" "$work/t.json" "$work/run.jsonl" 2 2 2 --stage3 || fail "trace"
  "$py" "$here/../../../scripts/plot_run.py" --trace "$work/t.json" -o "$work/t.png" > "$work/plot.out" 2>&1 ||
    { cat "$work/plot.out"; fail "plot_run.py --trace"; }
  cat "$work/plot.out"
  grep -q "t.png: step 2, 2 ranks" "$work/plot.out" || fail "the closing line does not say step 2, 2 ranks"
  "$py" -c "
import matplotlib.image as m, sys
a = m.imread(sys.argv[1])
assert a.shape[1] == 1500, a.shape
assert a[..., :3].std() > 0.05, 'blank picture'
" "$work/t.png" || fail "t.png is not a 1500-pixel-wide picture with something drawn"
  "$py" "$here/../../../scripts/plot_run.py" --trace "$work/run.jsonl" -o "$work/x.png" > "$work/plot.out" 2>&1 &&
    fail "a log was accepted as a trace"
  grep -q "run.jsonl: not a trace" "$work/plot.out" || { cat "$work/plot.out"; fail "message"; }
  echo "trace_plot: OK"
  ;;
trace_offload)
  "${mpirun[@]}" -np 2 "$app" "${tiny[@]}" --stage 2 --offload-optimizer --steps 3 --log "$work/run.jsonl" \
    --trace "$work/t.json" --trace-steps 2:3 > "$work/out" 2>&1 || { cat "$work/out"; fail "offload run failed"; }
  "$py" "$here/check_trace.py" "$work/t.json" "$work/run.jsonl" 2 3 2 || fail "trace"
  "$py" - "$work/t.json" <<'PY' || fail "offload lane"
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
for rank in (0, 1):
    jobs = [e for e in ev if e["pid"] == rank and e["name"] == "offload job"]
    assert jobs, f"rank {rank}: no offload job on the timeline"
    assert all(lanes[(rank, e["tid"])] == "offload worker" for e in jobs), "offload jobs off their lane"
print("offload: jobs per rank", [sum(e["pid"] == r and e["name"] == "offload job" for e in ev) for r in (0, 1)])
PY
  echo "trace_offload: OK"
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
