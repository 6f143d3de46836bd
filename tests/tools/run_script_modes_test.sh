#!/usr/bin/env bash
# Every scripts/*.sh and scripts/*.py keeps its run bit (issue 41: scripts/gpu-bundle.sh had none, so
# `scripts/gpu-bundle.sh` failed with "Permission denied" where the docs say to run it). The bit is checked
# on the files, which a checkout takes from git's mode; a missing one is fixed with
# `git update-index --chmod=+x FILE` (and chmod +x).
#   run_script_modes_test.sh SOURCE_DIR
set -u
src=$1
shopt -s nullglob
files=("$src"/scripts/*.sh "$src"/scripts/*.py)
((${#files[@]} > 0)) || { echo "FAIL: no scripts/*.sh or scripts/*.py under $src"; exit 1; }
bad=()
for f in "${files[@]}"; do [[ -x "$f" ]] || bad+=("${f#"$src"/}"); done
if ((${#bad[@]})); then
  echo "FAIL: without a run bit: ${bad[*]} (git update-index --chmod=+x FILE; chmod +x FILE)"
  exit 1
fi
# The mode git records, where this is a checkout: a file made executable only here would lose it in a clone.
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  mapfile -t staged < <(git -C "$src" ls-files -s -- 'scripts/*.sh' 'scripts/*.py' | awk '$1 != "100755" {print $4}')
  ((${#staged[@]} == 0)) || { echo "FAIL: git records no run bit for: ${staged[*]}"; exit 1; }
fi
echo "PASS: ${#files[@]} scripts, each executable"
