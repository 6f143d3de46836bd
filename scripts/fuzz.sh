#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, AddressSanitizer) in build-fuzz/ and runs each for SECONDS (default 120),
# keeping a corpus per target in build-fuzz/corpus/ between runs; crash inputs land in build-fuzz/artifacts/.
# usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (default: every cz_add_fuzzer target in fuzz/CMakeLists.txt)
# CZ_FUZZ_ARGS adds libFuzzer flags, e.g. "-fork=1 -ignore_crashes=1" to keep going past crashes in libhdf5.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-120}
shift || true
build=${CZ_FUZZ_BUILD:-$root/build-fuzz}

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCZ_BUILD_FUZZ=ON -DCZ_BUILD_TESTS=OFF -DCZ_BUILD_BENCH=OFF \
  -DCZ_WITH_CUDA=OFF >/dev/null
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(sed -n 's/^cz_add_fuzzer(\([a-z0-9_]*\).*/\1/p' "$root/fuzz/CMakeLists.txt")
fi
ninja -C "$build" -j"${CZ_FUZZ_JOBS:-2}" "${targets[@]}" fuzz_make_seeds
"$build/fuzz/fuzz_make_seeds" "$build/seeds"

mkdir -p "$build/artifacts" "$build/logs"
# libhdf5 (not instrumented) keeps some memory after failing to open a corrupt object header until the library
# shuts down; libFuzzer's per-input leak check would report it as ours. Our HDF5 ids are closed by RAII.
export LSAN_OPTIONS="suppressions=$root/fuzz/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
# A corrupt size field makes libhdf5 ask malloc for ~2^48 bytes; glibc returns NULL and HDF5 fails cleanly, so
# let ASan's malloc return NULL too instead of aborting. An allocation of ours that large still fails loudly
# (std::bad_alloc escapes the target).
export ASAN_OPTIONS="allocator_may_return_null=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
status=0
for t in "${targets[@]}"; do
  mkdir -p "$build/corpus/$t"
  dirs=("$build/corpus/$t")
  [ -d "$build/seeds/$t" ] && dirs+=("$build/seeds/$t")
  echo "== $t: ${seconds}s"
  # One input may take at most 10 s and 2 GiB; the limits catch decompression bombs as findings.
  if ! "$build/fuzz/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$build/artifacts/$t-" ${CZ_FUZZ_ARGS:-} "${dirs[@]}" >"$build/logs/$t.log" 2>&1; then
    echo "   FAILED: see $build/logs/$t.log and $build/artifacts/"
    status=1
  fi
  # Plain runs end with DONE and stat:: lines; fork mode (-fork=N) only with its periodic "#N: cov:" lines.
  { grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb|^#[0-9]+.*DONE' "$build/logs/$t.log" ||
    grep -E '^#[0-9]+: cov' "$build/logs/$t.log" | tail -1; } | sed 's/^/   /' || true
  crashes=$(find "$build/artifacts" -name "$t-*" | wc -l)
  if [ "$crashes" -gt 0 ]; then
    echo "   $crashes input(s) in $build/artifacts/$t-*"
    status=1
  fi
done
exit $status
