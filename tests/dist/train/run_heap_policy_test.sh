#!/usr/bin/env bash
# The host heap policy from the outside (Note [Freed heap memory stays mapped], issue 43): the header says
# it; a user's own glibc malloc settings are kept and the header says why.
#   run_heap_policy_test.sh CONVNEXT_ZERO
set -u
app=$1
source "$(dirname "${BASH_SOURCE[0]}")/../../lib/preamble.sh"
run() {  # run [ENV=V...] APP: a short run's "host heap" line
  out=$(env -u MALLOC_MMAP_THRESHOLD_ -u MALLOC_TRIM_THRESHOLD_ -u GLIBC_TUNABLES "$@" --depths 1,1,1,1 \
    --dims 8,16,24,32 --image-size 32 --micro-batch 2 --steps 1 --eval-batches 1 --no-progress 2>&1) ||
    fail "'$*' exited $?: $out"
  grep "^convnext_zero: host heap: " <<<"$out" || fail "'$*': the header does not say the heap policy: $out"
}
expect() {  # expect LINE WORDS
  [[ $1 == FAIL:* ]] && fail "${1#FAIL: }"
  grep -qF -- "$2" <<<"$1" || fail "expected '$2' in: $1"
  echo "ok: $2"
}
expect "$(run "$app")" "freed memory under 32 MiB stays mapped"
expect "$(run MALLOC_TRIM_THRESHOLD_=131072 "$app")" "glibc's own rules (MALLOC_TRIM_THRESHOLD_ is set)"
expect "$(run MALLOC_MMAP_THRESHOLD_=131072 "$app")" "glibc's own rules (MALLOC_MMAP_THRESHOLD_ is set)"
expect "$(run GLIBC_TUNABLES=glibc.malloc.trim_threshold=131072 "$app")" "GLIBC_TUNABLES sets glibc.malloc"
echo PASS
