#!/usr/bin/env bash
# A build that can move (issue 41 item 5, Note [Helpers beside the program] in src/io/h5/helper_programs.h):
# `cmake --install` into a temporary prefix, the prefix then moved to another folder, and the installed
# programs run from a third folder with a PATH that holds no build folder: a training run that saves a
# checkpoint, a resume that reads it (the HDF5 probe checks the file first), cz_weights exporting it. Where a
# mount namespace can be made (root), those programs run with an empty file system mounted over the build and
# source folders, so that anything reaching into them fails; elsewhere the checks run without that, and say so.
# The lookup order: a stand-in probe on PATH is not used while the installed one sits beside the program, is
# used once that one is gone, and with neither the error names where the program looked.
# Usage: run_install_test.sh CMAKE BUILD_DIR SOURCE_DIR
set -uo pipefail
cmake=$1 build=$(cd "$2" && pwd) src=$(cd "$3" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/../lib/preamble.sh"

"$cmake" --install "$build" --prefix "$work/prefix" > "$work/install.log" 2>&1 ||
  { cat "$work/install.log"; fail "cmake --install $build --prefix $work/prefix"; }
for p in convnext_zero cz_weights czrun commbench cz_h5_probe; do
  [[ -x $work/prefix/bin/$p ]] || fail "bin/$p was not installed"
done
[[ -x $work/prefix/share/convnext_zero/plot_run.py && -f $work/prefix/share/convnext_zero/trace_lanes.py ]] ||
  fail "share/convnext_zero/plot_run.py and trace_lanes.py were not installed"
echo "ok: installed: $(cd "$work/prefix" && find . -type f | sort | paste -sd' ')"
# Nothing may depend on the prefix it was installed to either.
mv "$work/prefix" "$work/moved"
bin=$work/moved/bin
mkdir "$work/run"
cd "$work/run" || fail "cd"

# hidden CMD...: CMD with empty folders in place of the build and source folders (tmpfs mounts in a mount
# namespace of its own: other processes still see them), PATH without them, no LD_LIBRARY_PATH.
hide=0
if unshare --mount --propagation private true 2> /dev/null; then hide=1; fi
clean_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
hidden() {
  local path=$clean_path
  [[ $1 == --path ]] && { path=$2; shift 2; }
  if ((hide)); then
    env -u LD_LIBRARY_PATH PATH="$path" unshare --mount --propagation private -- bash -c '
      mount -t tmpfs -o size=1m,mode=000 cz-hidden "$1" && mount -t tmpfs -o size=1m,mode=000 cz-hidden "$2" ||
        { echo "cannot hide $1 and $2"; exit 90; }
      shift 2
      exec "$@"' _ "$build" "$src" "$@"
  else
    env -u LD_LIBRARY_PATH PATH="$path" "$@"
  fi
}
if ((hide)); then
  hidden ls "$build/apps" > /dev/null 2>&1 && fail "the build folder is still visible inside the namespace"
  echo "ok: the programs below run with $build and $src hidden (empty tmpfs mounts)"
else
  echo "note: no mount namespace here (unshare needs root): $build stays visible, only PATH leaves it out"
fi

tiny=(--depths 1,1,1,1 --dims 8,16,24,32 --num-classes 5 --data synthetic:n=64,eval_n=16,classes=5
  --image-size 32 --micro-batch 8 --loader-threads 1 --no-progress --checkpoint-dir ck --log run.jsonl)
hidden "$bin/convnext_zero" "${tiny[@]}" --steps 2 > save.out 2>&1 || { cat save.out; fail "the installed program's run"; }
[[ -d ck/step_2 ]] || { cat save.out; ls -R ck; fail "no checkpoint ck/step_2"; }
# The closing line names the installed plot script.
grep -qF "plot: $work/moved/share/convnext_zero/plot_run.py run.jsonl" save.out ||
  { cat save.out; fail "the closing line does not name the installed plot_run.py"; }
echo "ok: saved ck/step_2; the closing line names $work/moved/share/convnext_zero/plot_run.py"

# A stand-in probe first on PATH: the one beside the program is taken, the stand-in never runs.
mkdir "$work/spy"
printf '#!/bin/sh\necho "$0" >> %s/spy.log\nexit 9\n' "$work" > "$work/spy/cz_h5_probe"
chmod +x "$work/spy/cz_h5_probe"
hidden --path "$work/spy:$clean_path" "$bin/convnext_zero" "${tiny[@]}" --steps 4 --resume ck > resume.out 2>&1 ||
  { cat resume.out; fail "the resume from ck"; }
grep -q '"resumed_step":2' run.jsonl || { cat resume.out run.jsonl; fail "the log does not say it resumed from step 2"; }
[[ $(grep -c '"split":"train"' run.jsonl) -eq 4 ]] || { cat run.jsonl; fail "the log does not hold 4 steps"; }
[[ ! -e $work/spy.log ]] || fail "the probe on PATH ran although one was beside the program: $(cat "$work/spy.log")"
echo "ok: resumed from ck/step_2 to step 4; the probe beside the program was used, not the one on PATH"
hidden "$bin/cz_weights" ck exported.h5 > weights.out 2>&1 || { cat weights.out; fail "cz_weights ck exported.h5"; }
[[ -s exported.h5 ]] || fail "cz_weights wrote no exported.h5"
echo "ok: cz_weights exported the checkpoint"

# Without the probe beside the programs: the one on PATH, then (none anywhere) an error naming both places.
cp -a "$work/moved" "$work/bare"
rm "$work/bare/bin/cz_h5_probe"
hidden --path "$work/spy:$clean_path" "$work/bare/bin/convnext_zero" "${tiny[@]}" --steps 5 --resume ck > spy.out 2>&1 &&
  fail "the resume passed with a stand-in probe that fails"
grep -qF "the HDF5 probe $work/spy/cz_h5_probe ended with exit status 9" spy.out ||
  { cat spy.out; fail "the probe on PATH was not the one started"; }
[[ -s $work/spy.log ]] || fail "the stand-in probe did not run"
echo "ok: without one beside it, the program started the probe on PATH"
hidden "$work/bare/bin/convnext_zero" "${tiny[@]}" --steps 5 --resume ck > none.out 2>&1 &&
  fail "the resume passed with no probe anywhere"
grep -qF "cannot find the HDF5 probe (cz_h5_probe): not beside this program ($work/bare/bin) nor on PATH" none.out ||
  { cat none.out; fail "no message naming where the probe was looked for"; }
echo "ok: with no probe anywhere: $(grep -F "cannot find the HDF5 probe" none.out | head -1)"
echo PASS
