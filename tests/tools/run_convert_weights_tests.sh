#!/usr/bin/env bash
# tools/convert_weights.py under an interpreter without its packages (issue 30, item 10): `python3 -S` hides
# site-packages, as a pyenv or venv python3 without h5py and torch would. --help must work; a command whose
# packages are missing must re-run under /usr/bin/python3 when that one has them, and otherwise print one line
# naming what to install and exit 1, never a traceback.
#   run_convert_weights_tests.sh PYTHON SCRIPT FIXTURE.h5
set -u
python=$1 script=$2 fixture=$3
source "$(dirname "${BASH_SOURCE[0]}")/../lib/preamble.sh"
bare() { "$python" -S "$script" "$@"; }  # the script under an interpreter that sees no site-packages

for cmd in "" to-h5 to-torch show; do
  out=$(bare $cmd --help 2>&1) || fail "'$cmd --help' exited $?: $out"
  grep -q "^usage: " <<<"$out" || fail "'$cmd --help' printed no usage: $out"
done
echo "ok: --help of every command without the packages"

# No interpreter to fall back on (the re-run's own mark set): one line naming what to install, exit 1.
expect_one_line() {  # expect_one_line WORD... -- ARGS...: the command fails with one line naming each WORD
  local words=()
  while [[ $1 != -- ]]; do words+=("$1"); shift; done
  shift
  out=$(CZ_CONVERT_WEIGHTS_REEXEC=1 bare "$@" 2>&1)
  rc=$?
  ((rc == 1)) || fail "'$*' exited $rc (expected 1): $out"
  grep -q Traceback <<<"$out" && fail "'$*' printed a traceback: $out"
  (($(wc -l <<<"$out") == 1)) || fail "'$*' printed more than one line: $out"
  grep -q "^convert_weights: .*pip install" <<<"$out" || fail "'$*' does not say what to install: $out"
  for w in "${words[@]}"; do grep -qw "$w" <<<"$out" || fail "'$*' does not name $w: $out"; done
  echo "ok: $* -> $out"
}
expect_one_line torch timm h5py -- to-h5 --timm-model convnext_atto "$work/atto.h5"
[[ -e $work/atto.h5 ]] && fail "to-h5 wrote $work/atto.h5 without its packages"
expect_one_line torch h5py -- to-torch "$fixture" "$work/w.pth" --group weights
expect_one_line h5py -- show "$fixture"

# The re-run under Debian's python3 where it has what `show` needs (python3-h5py, in build.sh's packages).
if ! /usr/bin/python3 -c "import h5py, numpy" 2>/dev/null; then
  echo "note: /usr/bin/python3 has no h5py here; the re-run is not checked"
  echo PASS
  exit 0
fi
out=$(bare show "$fixture" 2>&1) || fail "show under $python -S exited $?: $out"
grep -q "running under /usr/bin/python3" <<<"$out" || fail "show did not say it re-ran: $out"
grep -q "^conv_mlp = 1$" <<<"$out" || fail "show: no conv_mlp attribute: $out"
grep -q "^weights/stages.0.blocks.0.mlp.fc1.weight (32, 8, 1, 1) float32$" <<<"$out" ||
  fail "show: fc1's shape not listed: $out"
echo "ok: show re-ran under /usr/bin/python3 and listed the fixture's tensors"
echo PASS
