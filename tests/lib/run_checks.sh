# Shared by the test scripts that run the programs from the outside (source it after setting `app`, `work`
# and `fail`): reading a run's JSON-lines log, comparing two runs step by step, and refusals of bad input.

# Prints "<step> <loss> <grad_norm>" for each training step record of a JSON-lines log.
steps_of() {
  grep -F '"split":"train"' "$1" | sed -E 's/.*"grad_norm":([^,}]+).*"loss":([^,}]+).*"step":([^,}]+).*/\3 \2 \1/'
}

# compare A.jsonl B.jsonl LINES WHAT [RELATIVE-TOLERANCE, default 2e-5]: both logs have LINES step records, of
# the same steps, whose losses and gradient norms agree to the tolerance (float sums differ in order only).
compare() {
  paste -d' ' <(steps_of "$1") <(steps_of "$2") > "$work/both"
  echo "$4:"; cat "$work/both"
  [[ $(wc -l < "$work/both") -eq $3 ]] || fail "$4: expected $3 step records in each log"
  awk -v tol="${5:-2e-5}" '{ if ($1 != $4) { print "step " $1 " vs " $4; bad = 1 }
         for (c = 2; c <= 3; ++c) { a = $c; b = $(c + 3); d = a - b; if (d < 0) d = -d;
           if (d > tol * (a < 0 ? -a : a) + 1e-7) { print "step " $1 ": " a " vs " b; bad = 1 } } }
       END { exit bad }' "$work/both" || fail "$4: the runs differ"
}

# tiny_model CLASSES [TRAIN EVAL]: `model`, a ConvNeXt of depths 1,1,1,1 and dims 8,16,24,32 at 32 px with
# CLASSES classes, one loader thread and no progress bar, and `tiny`, that model on synthetic data of CLASSES
# classes, TRAIN training and EVAL eval images (default 256 and 64).
tiny_model() {
  model=(--depths 1,1,1,1 --dims 8,16,24,32 --num-classes "$1" --image-size 32 --loader-threads 1 --no-progress)
  tiny=("${model[@]}" --data "synthetic:n=${2:-256},eval_n=${3:-64},classes=$1")
}

# refused EXPECTED ARGS...: "$app" ARGS exits non-zero without a crash or a signal, and says EXPECTED.
refused() {
  local want=$1; shift
  "$app" "$@" > "$work/out" 2>&1
  local rc=$?
  refused_rc=$rc
  if [[ $rc -eq 0 || $rc -ge 128 ]]; then cat "$work/out"; fail "'$*' exited with $rc"; fi
  grep -qF -- "$want" "$work/out" || { cat "$work/out"; fail "'$*': message lacks '$want'"; }
  ! grep -qiE 'terminate called|segmentation|core dumped|abort' "$work/out" || { cat "$work/out"; fail "'$*' crashed"; }
  echo "ok ($rc): $* -> $(grep -F -- "$want" "$work/out" | head -1)"
}

# refused_exit CODES EXPECTED ARGS...: as refused, and the exit code is one of CODES ("1", or "1 2").
refused_exit() {
  local codes=$1; shift
  refused "$@"
  [[ " $codes " == *" $refused_rc "* ]] || { cat "$work/out"; fail "'${*:2}' exited with $refused_rc, expected $codes"; }
}
