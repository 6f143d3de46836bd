#!/usr/bin/env bash
# Runs comm_fault on 3 ranks (usage: run_fault_test.sh MPIRUN COMM_FAULT hang|kill) and checks that the job
# fails (non-zero, not by the guard timeout), that every surviving rank (0 and 1) printed a line naming the
# collective, its size and the ranks, and that it all ended soon after the comm timeout.
set -u
mpirun=$1 exe=$2 mode=$3
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
comm_timeout=3
start=$(date +%s)
out=$(timeout 90 "$mpirun" --allow-run-as-root --oversubscribe -np 3 "$exe" "$mode" "$comm_timeout" 2>&1)
rc=$?
elapsed=$(($(date +%s) - start))
echo "$out"
echo "== exit code $rc after ${elapsed}s"
[[ $rc -ne 0 ]] || fail "the job exited 0"
[[ $rc -ne 124 ]] || fail "the job hung until the guard timeout"
what='all_reduce of 67108864 bytes on ranks \[0, 1, 2\]'
for r in 0 1; do
  grep -E "^\[rank $r\] .*$what" <<<"$out" >/dev/null || fail "rank $r did not report the collective"
done
if [[ $mode == hang ]]; then
  grep -E "comm timeout: $what after 3\.0 s" <<<"$out" >/dev/null || fail "no timeout message"
else
  grep -E "died|terminated" <<<"$out" >/dev/null || fail "no message about the dead peer"
fi
# Start-up and the warm-up collective take a few seconds under load; the failure itself must take ~3 s.
((elapsed <= comm_timeout + 30)) || fail "took ${elapsed}s"
echo "PASS"
