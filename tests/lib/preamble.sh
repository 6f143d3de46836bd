# The shell tests' one preamble. Source it after reading the script's arguments:
#   source "$(dirname "${BASH_SOURCE[0]}")/../lib/preamble.sh"
# It gives every test the same
#   fail MESSAGE   prints "FAIL: MESSAGE" (after the test's own on_fail, if it defines one) and exits 1;
#   $work          a fresh temporary folder, removed when the script exits (a test may point $work elsewhere:
#                  the folder made here is still the one removed);
#   on_exit CMD    runs CMD when the script exits, before $work goes (the last registered first);
#   $py            the suite's one Python (CZ_PYTHON, chosen by CMake: cmake/Python.cmake);
#   mpirun         an array, "$mpiexec" as root and oversubscribed, where the script set $mpiexec;
# and the checks of run_checks.sh (steps_of, compare, refused). The script keeps its own `set` options.

fail() {
  if declare -F on_fail > /dev/null; then on_fail; fi
  echo "FAIL: $*"
  exit 1
}

py=${CZ_PYTHON:-python3}
cz_preamble_tmp=$(mktemp -d "${TMPDIR:-/tmp}/cz_test.XXXXXX")
work=$cz_preamble_tmp
cz_preamble_exits=()
on_exit() { cz_preamble_exits+=("$*"); }
cz_preamble_exit() {
  local i
  for ((i = ${#cz_preamble_exits[@]} - 1; i >= 0; i--)); do eval "${cz_preamble_exits[i]}"; done
  rm -rf "$cz_preamble_tmp"
}
trap cz_preamble_exit EXIT

if [[ -n ${mpiexec:-} ]]; then
  mpirun=("$mpiexec" --allow-run-as-root --oversubscribe)
fi

source "$(dirname "${BASH_SOURCE[0]}")/run_checks.sh"
