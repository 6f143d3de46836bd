#!/usr/bin/env bash
# Builds, here (no GPU needed), everything a GPU check runs, for Hopper only (sm_90: the H100 and H200), and
# packs it into one compressed file that scripts/gpu-check.sh unpacks on the GPU machine instead of building
# there (Note [The prebuilt bundle] in gpu-check.sh).
#
#   scripts/gpu-bundle.sh [--build DIR] [--arch SM] [OUT]     OUT defaults to .gpu-bundle/bundle.tar.xz
#
# The bundle holds: every executable a `cuda`-labelled test runs, every program of apps/ and src/ (the apps and
# the helpers they start), and the GPU benchmarks; the photographs of the job stage's JPEG folder (photos/); every CTestTestfile.cmake and GoogleTest discovery file of the build (ctest's view of the
# suite); and manifest.txt (the build folder and source folder it was made in, which gpu-check.sh rewrites
# to where it lands; the commit and a hash of the sources, which gpu-check.sh checks against the working
# tree it travels with; the CUDA architectures; the libraries the executables need). The Debian packages
# that run them still come from scripts/gpu-deps.sh (.deps/).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
build=build-gpu arch=90 out=.gpu-bundle/bundle.tar.xz
while (($#)); do
  case "$1" in
    --build) build=$2; shift ;;
    --arch) arch=$2; shift ;;
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    -*) echo "gpu-bundle: unknown option $1" >&2; exit 2 ;;
    *) out=$1 ;;
  esac
  shift
done
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")

mkdir -p "$build"
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCZ_WITH_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" >"$build/gpu-bundle-configure.log" 2>&1 ||
  { tail -20 "$build/gpu-bundle-configure.log"; echo "gpu-bundle: configure failed" >&2; exit 1; }
build=$(cd "$build" && pwd)
grep -q "^CMAKE_CUDA_ARCHITECTURES:.*=$arch$" "$build/CMakeCache.txt" ||
  { echo "gpu-bundle: $build is not configured for sm_$arch" >&2; exit 1; }
echo "gpu-bundle: building $build (sm_$arch) with $(nproc) jobs"
cmake --build "$build" -j "$(nproc)"

# The executables: those of the cuda-labelled tests (a test script's first argument after the case is the app
# it runs), plus the programs gpu-check.sh runs itself.
mapfile -t exes < <(ctest --test-dir "$build" -N -L cuda --show-only=json-v1 | python3 -c '
import json, os, sys
seen = set()
for t in json.load(sys.stdin)["tests"]:
    for a in t.get("command", []):
        if os.path.isfile(a) and os.access(a, os.X_OK) and not a.endswith((".sh", ".py")) and "/bin/" not in a:
            seen.add(a)
print("\n".join(sorted(seen)))')
for t in bench/bench_train_step bench/bench_gemm_cuda bench/bench_depthwise_cuda; do
  exes+=("$build/$t")
done
# Every program under apps/ and src/: the helpers the programs start themselves (apps/cz_h5_probe, which
# checks a checkpoint before it is read: the first GPU run's checkpoint tests failed without it), and the
# links to it beside the other executables (Note [Helpers beside the program]: relative, so they still
# point at it where the bundle lands).
mapfile -t -O "${#exes[@]}" exes < <(find "$build/apps" "$build/src" -type f -perm -u+x ! -path '*/CMakeFiles/*')
mapfile -t -O "${#exes[@]}" exes < <(find "$build" -name cz_h5_probe -type l ! -path '*/CMakeFiles/*')
mapfile -t exes < <(printf '%s\n' "${exes[@]}" | sort -u)
ncuda=$(ctest --test-dir "$build" -N -L cuda | sed -n 's/^Total Tests: //p')
echo "gpu-bundle: $ncuda cuda tests in ${#exes[@]} executables"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
{
  echo "build_dir $build"
  echo "source_dir $repo"
  echo "commit $(git -C "$repo" rev-parse HEAD)$(git -C "$repo" diff --quiet HEAD -- src apps bench tests cmake CMakeLists.txt || echo +dirty)"
  echo "source_hash $(scripts/gpu-check.sh --source-hash)"
  echo "mpiexec $(sed -n 's/^MPIEXEC_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt")"
  echo "cuda_architectures $arch"
  echo "cuda_tests $ncuda"
  echo "made $(date -u +%FT%TZ) on $(hostname) with $(nvcc --version | tail -1)"
  # What the executables load, by SONAME: gpu-check.sh checks each resolves on the GPU machine.
  echo "needs $(for e in "${exes[@]}"; do readelf -d "$e" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; done | sort -u | paste -sd' ')"
} >"$stage/manifest.txt"
# The photographs tools/make_imagenet_like.py cuts its JPEG folder from (gpu-check.sh's job stage): the GPU
# machine lacks the Debian packages that ship them.
rm -rf "$build/photos"
/usr/bin/python3 tools/make_imagenet_like.py --save-photos "$build/photos" >/dev/null ||
  { echo "gpu-bundle: tools/make_imagenet_like.py --save-photos failed (python3-matplotlib or python3-scipy?)" >&2; exit 1; }
(cd "$build" && find . \( -name CTestTestfile.cmake -o -name '*_tests.cmake' -o -name '*_include.cmake' \) -print) \
  >"$stage/files.txt"
for e in "${exes[@]}"; do echo ".${e#"$build"}"; done >>"$stage/files.txt"
(cd "$build" && find ./photos -type f) >>"$stage/files.txt"
tar -C "$build" -cf "$stage/build.tar" -T "$stage/files.txt"
tar -C "$stage" -rf "$stage/build.tar" manifest.txt
# -9e: 8 MB against -6's 22 MB (the executables share most of their code; a 64 MiB window sees it).
xz -T0 -9e -c "$stage/build.tar" >"$out.tmp"
mv "$out.tmp" "$out"
raw=$(du -b "$stage/build.tar" | cut -f1)
echo "gpu-bundle: $out: $(du -b "$out" | cut -f1) bytes ($raw uncompressed), ${#exes[@]} executables"
cat "$stage/manifest.txt"
