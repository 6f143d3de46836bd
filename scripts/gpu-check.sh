#!/usr/bin/env bash
# First run on a bare GPU machine (CUDA 13, cuDNN, NCCL, CMake, ninja, PyTorch + timm; no -dev packages, no
# network): unpacks the Debian packages scripts/gpu-deps.sh downloaded into a private prefix (never into /)
# and points their CMake and pkg-config files into it, builds Release with CUDA against it, runs the tests
# labelled `cuda` (and compute-sanitizer on the op table and optimizer tests), trains convnext_atto briefly
# (bf16), and times a ConvNeXt training step against PyTorch eager and torch.compile at the same batch sizes,
# plus each of our own paths in place of cuDNN's or cuBLASLt's. OUT gets summary.txt (the tables that decide
# the defaults) and gpu-check-logs.tar.gz (every log and JSON result): two files, as a device tool that brings
# back at most a few files wants.
#
#   scripts/gpu-check.sh [options] [OUT]        OUT defaults to $OUT, else ./gpu-check-out
#     --deps DIR        the .deb folder (default .deps)           --build DIR   build folder (default build-gpu)
#     --model NAME      ConvNeXt variant (default tiny)           --batch N[,N] batch sizes to time (default 64,128)
#     --image PX        image size (default 224)                  --steps N     timed steps (default 20)
#     --compile-mode M  torch.compile mode of the compiled peer (default "default"; "none" leaves it out)
#     --peak-tflops T   the GPU's dense bf16 peak, for the MFU (default: from the GPU's name: H100 SXM/H200 989,
#                       H100 NVL 835, H100 PCIe 756; unknown names print no MFU)
#     --only STAGES     comma list of build,test,train,bench,sanitize (default: all of them, in that order)
#     --bench-jobs J    comma list of bench jobs (default all; names as the plan prints them)
#     --time-limit S    this call's wall-clock budget in seconds: every run is capped to what is left, and what
#                       does not fit is listed at the end with the command that runs it (570 under a 10-minute
#                       command limit)
#     --no-sanitize     leave out sanitize                        --no-bench    leave out bench
#     --dry-run         what a machine without a GPU can check: unpack, configure, and build and run a program
#                       using every dependency, with the system's copies of the packages hidden; scan the
#                       configured build for paths outside the prefix; check the summary tables; print the plan
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
orig_args=("$@")

deps=.deps build=build-gpu model=tiny batches=64,128 image=224 steps=20 dry=0 out="" peak="" limit=0
compile_mode=default only=build,test,train,bench,sanitize bench_jobs=all
while (($#)); do
  case "$1" in
    --deps) deps=$2; shift ;;
    --build) build=$2; shift ;;
    --model) model=$2; shift ;;
    --batch) batches=$2; shift ;;
    --image) image=$2; shift ;;
    --steps) steps=$2; shift ;;
    --compile-mode) compile_mode=$2; shift ;;
    --peak-tflops) peak=$2; shift ;;
    --only) only=$2; shift ;;
    --bench-jobs) bench_jobs=$2; shift ;;
    --time-limit) limit=$2; shift ;;
    --no-sanitize) only=${only//sanitize/} ;;
    --no-bench) only=${only//bench/} ;;
    --dry-run) dry=1 ;;
    -h | --help) sed -n '2,26p' "$0"; exit 0 ;;
    -*) echo "gpu-check: unknown option $1" >&2; exit 2 ;;
    *) out=$1 ;;
  esac
  shift
done
out=${out:-${OUT:-gpu-check-out}}
mkdir -p "$out" "$build"
out=$(cd "$out" && pwd)
build=$(cd "$build" && pwd)
logs=$build/gpu-check-logs  # everything this call writes; packed into OUT when it ends, however it ends
rm -rf "$logs"
mkdir -p "$logs"
summary=$logs/summary.txt
say() { echo "== $*" | tee -a "$summary"; }
show() { tee -a "$summary"; }
want() { [[ ",$only," == *",$1,"* ]]; }
pack() {
  cp "$summary" "$out/summary.txt" 2>/dev/null || true
  tar -czf "$out/gpu-check-logs.tar.gz" -C "$build" gpu-check-logs 2>/dev/null || true
}
trap pack EXIT
trap 'exit 143' TERM INT

# ---- time: each run gets at most what is left of --time-limit, less a margin for packing the logs ----
t0=$SECONDS
left() { if ((limit > 0)); then echo $((limit - (SECONDS - t0) - 20)); else echo 1000000; fi; }
not_run=()  # stage or stage:job names this call had no time for
# capped CAP CMD...: CMD with a timeout of CAP seconds, or of what is left when that is less; 124 if cut off.
capped() {
  local cap=$1 l
  shift
  l=$(left)
  ((l < cap)) && cap=$l
  ((cap > 0)) || return 124
  timeout --kill-after=10 "$cap" "$@"
}
# fits NAME NEED: true when NEED seconds are left; otherwise NAME is listed as not run.
fits() {
  (($(left) >= $2)) && return 0
  not_run+=("$1")
  say "$1: not run, $(left) s left of --time-limit $limit"
  return 1
}
jobs=$(nproc)
targets=(test_cuda test_optim_cuda test_nn_cuda test_trainer_cuda bench_train_step bench_gemm_cuda bench_depthwise_cuda
  convnext_zero)

# ---- 1. the dependency prefix ----
# Note [Relocating the prefix]: Debian's CMake and pkg-config files name their files by absolute /usr paths
# (libjpeg-turbo's imported targets point at /usr/lib/<arch>/libjpeg.so.62.3.0, OpenBLAS's config and most
# .pc files hard-code prefix=/usr). Unpacked elsewhere, they still point at /usr, which works only on a
# machine that has the same packages installed, and that machine is the one where nothing is needed. So every
# absolute /usr path in the prefix's *.cmake and *.pc files is rewritten into the prefix, once, at unpacking,
# and checked afterwards (audit_prefix). Paths the files compute from their own location are left alone.
compgen -G "$deps/*.deb" >/dev/null || { echo "gpu-check: no .deb files in $deps (run scripts/gpu-deps.sh)" >&2; exit 1; }
prefix=$build/deps-prefix
# A /usr path in a CMake or pkg-config file: not inside another path, quoted, after =, -I or -L, or bare.
usr_re='(^|[^[:alnum:]_./-]|-[IL])/usr(/|"|'"'"'|$|[[:space:];)])'
relocate_prefix() {
  local esc files
  esc=$(printf '%s' "$prefix" | sed 's/[\\&,]/\\&/g')
  mapfile -d '' files < <(find "$prefix" -type f \( -name '*.cmake' -o -name '*.pc' \) -print0)
  # Twice: one match consumes the character after /usr, which may be the boundary of the next one.
  ((${#files[@]} == 0)) || sed -i -E "s,$usr_re,\\1$esc/usr\\2,g; s,$usr_re,\\1$esc/usr\\2,g" "${files[@]}"
}
# Prints file:line: text for every /usr path left outside the prefix in its CMake and pkg-config files.
audit_prefix() {
  find "$prefix" -type f \( -name '*.cmake' -o -name '*.pc' \) -print0 |
    xargs -0 -r awk -v p="$prefix" -v re="$usr_re" '{
      line = $0
      while ((i = index(line, p)) > 0) line = substr(line, 1, i - 1) "CZPREFIX" substr(line, i + length(p))
      if (line ~ re) { f = FILENAME; sub("^" p "/", "", f); print f ":" FNR ": " $0 }
    }'
}
# Unpacked again only when the package set or the prefix's place changed (the relocation writes the place into
# the files); otherwise fresh header mtimes would make ninja rebuild everything.
stamp=$( (ls -l "$deps"/*.deb; echo "$prefix relocated v1") | md5sum | cut -d' ' -f1)
if [[ "$(cat "$prefix/.stamp" 2>/dev/null)" != "$stamp" ]]; then
  rm -rf "$prefix"
  mkdir -p "$prefix"
  for deb in "$deps"/*.deb; do dpkg -x "$deb" "$prefix"; done
  mapfile -t libdirs < <(find "$prefix" -name '*.so*' -printf '%h\n' | sort -u)
  # SONAME links the packages' alternatives would have made (libpsm_infinipath.so.1).
  "$(command -v ldconfig || echo /sbin/ldconfig)" -n "${libdirs[@]}"
  relocate_prefix
  # What CMake found in an earlier prefix (or outside one) stays in its cache: look again.
  rm -f "$build/CMakeCache.txt"
  echo "$stamp" >"$prefix/.stamp"
fi
leftover=$(audit_prefix)
if [[ -n "$leftover" ]]; then
  say "CMake/pkg-config files in the prefix still name /usr paths outside it (missing on a bare machine):"
  echo "$leftover" | show
  exit 1
fi
mapfile -t libdirs < <(find "$prefix" -name '*.so*' -printf '%h\n' | sort -u)
multi=$prefix/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
# Python (PyTorch above all) runs without the prefix's libraries, which may be older than the ones it needs.
python_env=(env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1)
[[ -z "${LD_LIBRARY_PATH:-}" ]] || python_env+=(LD_LIBRARY_PATH="$LD_LIBRARY_PATH")
export LD_LIBRARY_PATH=$(IFS=:; echo "${libdirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OPAL_PREFIX=$prefix/usr  # Open MPI finds its help files and components relative to this
export PATH=$prefix/usr/bin:$PATH
# pkg-config (FindMPI asks it) sees only the prefix's .pc files, which name the prefix since the relocation.
export PKG_CONFIG_LIBDIR=$multi/pkgconfig:$prefix/usr/share/pkgconfig
unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
say "unpacked $(ls "$deps"/*.deb | wc -l) packages into $prefix; its CMake and pkg-config files point into it"

# ---- hiding the system's copies (dry run) ----
# Note [Hiding the system's copies]: on a machine that has the Debian packages installed, a file the prefix
# lacks or a path that still says /usr is found anyway, so a configure here cannot show what a bare machine
# does. The dry run therefore configures and builds its probe in a private mount namespace where /usr is an
# overlay that whites out every file the prefix also holds: those packages are then absent, as on the bare
# machine, and the toolchain (compiler, C library, CMake, CUDA) is untouched. It needs root (or user
# namespaces) and overlayfs; where they are missing the dry run says so and relies on the path scan alone.
hide_list=$build/hidden-paths.txt  # the prefix's files that this machine has too, relative to /usr
hidden() {  # CMD...: runs CMD (from the current folder) with the files in $hide_list gone from /usr
  unshare -m --propagation private bash -c '
    set -e
    list=$1 dir=$2
    shift 2
    t=$(mktemp -d)
    mount -t tmpfs tmpfs "$t"
    mkdir "$t/upper" "$t/work"
    cd "$t/upper"
    sed -n "s,/[^/]*\$,,p" "$list" | sort -u | xargs -r -d "\n" mkdir -p
    xargs -r -d "\n" -I{} mknod {} c 0 0 <"$list"
    mount -t overlay overlay -o "lowerdir=/usr,upperdir=$t/upper,workdir=$t/work" /usr
    cd "$dir"
    exec "$@"' hidden "$hide_list" "$PWD" "$@"
}
hide=0
if ((dry)); then
  (cd "$prefix" && find . \( -type f -o -type l \) -printf '%P\n') | sed -E 's,^lib(32|64|x32)?/,usr/lib\1/,' |
    while read -r p; do [[ "$p" == usr/* ]] && [[ -e /$p || -L /$p ]] && echo "${p#usr/}"; done >"$hide_list" || true
  if [[ ! -s "$hide_list" ]]; then
    say "this machine has none of the prefix's files under /usr: nothing to hide"
  elif hidden test ! -e "/$(head -1 "$hide_list" | sed 's,^,usr/,')" 2>"$logs/hide.log"; then
    hide=1
    say "configuring with the system's copies of $(wc -l <"$hide_list") files of those packages hidden"
  else
    say "cannot hide the system's copies here (needs root or user namespaces, and overlayfs; see hide.log):"
    say "configuring with them visible; only the path scan below stands between this and a bare machine"
  fi
fi
maybe_hidden() { if ((hide)); then hidden "$@"; else "$@"; fi; }

# ---- 2. configure ----
# Paths Debian's packages would normally find under /usr (the OpenMP OpenBLAS, HDF5's serial flavour, Open MPI
# without its compiler wrapper, which lives in openmpi-bin, and its mpiexec, which an alternative would name)
# are given explicitly; the CMake config packages (fmt, GTest, benchmark, nlohmann_json, CLI11, libjpeg-turbo)
# and zlib are found through CMAKE_PREFIX_PATH.
dep_args=(
  -DCMAKE_PREFIX_PATH="$prefix/usr" -DCMAKE_INCLUDE_PATH="$prefix/usr/include" -DCMAKE_LIBRARY_PATH="$multi"
  -DCZ_CBLAS_INCLUDE="$prefix/usr/include/$(basename "$multi")/openblas-openmp"
  -DCZ_OPENBLAS_LIB="$multi/openblas-openmp/libopenblas.so"
  -DHDF5_ROOT="$multi/hdf5/serial"
  -DMPI_SKIP_COMPILER_WRAPPER=ON -DMPI_C_HEADER_DIR="$multi/openmpi/include" -DMPI_C_LIB_NAMES=mpi
  -DMPI_mpi_LIBRARY="$multi/openmpi/lib/libmpi.so" -DMPIEXEC_EXECUTABLE="$prefix/usr/bin/mpiexec.openmpi"
)
cmake_args=(-S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCZ_WITH_CUDA=ON "${dep_args[@]}")
# Only the GPU in the machine (the default builds sm_89 and sm_90): half the nvcc time of every call.
if ((!dry)) && cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1) &&
  [[ "$cc" =~ ^[0-9]+\.[0-9]+$ ]]; then
  cmake_args+=(-DCMAKE_CUDA_ARCHITECTURES="${cc/./}")
fi
# cuDNN and NCCL normally sit beside CUDA or in /usr; if not, fall back to PyTorch's pip wheels.
for lib in cudnn nccl; do
  hdr=$([[ $lib == cudnn ]] && echo cudnn_version.h || echo nccl.h)
  compgen -G "/usr/local/cuda/include/$hdr" >/dev/null || compgen -G "/usr/include/$hdr" >/dev/null ||
    compgen -G "/usr/include/*/$hdr" >/dev/null && continue
  root=$("${python_env[@]}" python3 -c "import nvidia.$lib as m; print(list(m.__path__)[0])" 2>/dev/null) || continue
  say "$lib from the Python wheel at $root"
  cmake_args+=("-DCZ_${lib^^}_ROOT=$root")
  export LD_LIBRARY_PATH=$root/lib:$LD_LIBRARY_PATH
done
say "configuring $build"
if ! maybe_hidden cmake "${cmake_args[@]}" >"$logs/configure.log" 2>&1; then
  say "configure failed:"
  tail -40 "$logs/configure.log" | show
  exit 1
fi
grep -E "CUDA backend|CUDA compiler identification|cuDNN" "$logs/configure.log" | show || true

# Every library and header the configured build names must come from the prefix, the toolchain's own
# excepted (compiler, C library, CUDA, cuDNN, NCCL): on a bare machine nothing else exists. The cache holds
# what find_* resolved, build.ninja every include and link path the compiler will be given. An imported
# target's include folder that is the compiler's default (/usr/include) never reaches build.ninja: the hidden
# configure and the probe below catch that kind.
read -r -d '' scan_awk <<'AWK' || true
function allowed(p, base) {
  if (index(p, prefix) == 1 || index(p, repo) == 1 || index(p, build) == 1) return 1
  if (p !~ /^(\/usr)?\/(lib|lib32|lib64|libx32|include)(\/|$)/) return 1  # not a library or header folder
  if (p ~ /^\/usr\/lib\/gcc\//) return 1                                   # the compiler's own (libgomp, crt)
  if (tolower(p) ~ /cuda|cudnn|nccl|cublas|cupti|nvrtc|culibos|nvidia/) return 1  # CUDA's, where a system has it
  base = p
  sub(/.*\//, "", base)
  if (base ~ /^lib(c|m|dl|pthread|rt|util|mvec|resolv)(_nonshared)?\.(a|so)/) return 1  # the C library (libc6-dev)
  return 0
}
FILENAME ~ /CMakeCache\.txt$/ {
  if ($0 !~ /^[A-Za-z0-9_.+-]+:[A-Z]+=/) next
  key = substr($0, 1, index($0, ":") - 1)
  type = substr($0, index($0, ":") + 1)
  sub(/=.*/, "", type)
  if (type == "INTERNAL" || type == "STATIC" || key ~ /^(CMAKE_|CUDA|CUDAToolkit_|CZ_CUDNN|CZ_NCCL)/) next
  n = split(substr($0, index($0, "=") + 1), v, ";")
  for (i = 1; i <= n; i++) if (v[i] ~ /^\// && !allowed(v[i])) print "CMakeCache.txt: " key "=" v[i]
  next
}
{
  n = split($0, t, /[ \t"'=;:,]+/)
  for (i = 1; i <= n; i++) {
    p = t[i]
    sub(/^-(I|L|isystem|iquote|idirafter)/, "", p)
    if (p ~ /^\// && !allowed(p)) print "build.ninja: " p
  }
}
AWK
outside_paths() {  # DIR: the scan over one configured build folder
  awk -v prefix="$prefix" -v repo="$repo" -v build="$1" "$scan_awk" "$1/CMakeCache.txt" "$1/build.ninja" | sort -u
}
outside=$(outside_paths "$build")
if [[ -n "$outside" ]]; then
  say "the configured build uses these from outside the prefix; a bare machine has none of them:"
  echo "$outside" | show
  exit 1
fi
say "every library and header path of the configured build lies in the prefix or the toolchain"

# ---- the plan: every stage's commands, run or (dry run) printed ----
IFS=, read -ra bs <<<"$batches"
# bench jobs: NAME|NEED|CAP|command: not started with less than NEED seconds left, stopped after CAP. The
# peers' table first (ours, eager, compiled per batch), then our switches at the first batch, then the GEMMs.
# NEED is a guess at the job's time on an H100 (torch.compile's is mostly compilation, on the CPU).
bench_plan=()
for b in "${bs[@]}"; do
  # The timed steps come first; the 5 profiled steps after them (slower) give the per-op table.
  bench_plan+=("ours_b$b|60|240|$build/bench/bench_train_step --model $model --device cuda --dtype bf16 --batch $b \
--image $image --warmup 5 --steps $steps --peak-tflops @PEAK@ --profile 5 --json $logs/ours_b$b.json")
  bench_plan+=("eager_b$b|60|240|${python_env[*]} python3 bench/train_step_torch.py --model $model --device cuda \
--dtype bf16 --batch $b --image $image --warmup 5 --steps $steps --profile 5 --json $logs/eager_b$b.json")
  [[ "$compile_mode" == none ]] ||
    bench_plan+=("compile_b$b|180|420|${python_env[*]} python3 bench/train_step_torch.py --model $model --device cuda \
--dtype bf16 --batch $b --image $image --warmup 5 --steps $steps --profile 5 --compile $compile_mode \
--json $logs/compile_b$b.json")
done
# Each of our own paths in place of the library's, at the first batch size; which is faster decides the
# default: cuDNN's depthwise convolutions instead of our tiled kernels; plain GEMMs plus our bias kernels
# instead of cuBLASLt's epilogues; the stem and downsamplings as one GEMM over their patches instead of cuDNN.
for variant in depthwise-cudnn no-gemm-epilogues patchify-gemm; do
  bench_plan+=("${variant}_b${bs[0]}|60|240|$build/bench/bench_train_step --model $model --device cuda --dtype bf16 \
--batch ${bs[0]} --image $image --warmup 5 --steps $steps --$variant --peak-tflops @PEAK@ --profile 5 \
--json $logs/${variant}_b${bs[0]}.json")
done
bench_plan+=("gemm|45|180|$build/bench/bench_gemm_cuda --dtype bf16 --batch ${bs[0]} --image $image \
--peak-tflops @PEAK@ --json $logs/gemm.json")
# The depthwise kernels per stage, ours and cuDNN's, against the f32 FMA and memory bounds.
bench_plan+=("depthwise|30|120|$build/bench/bench_depthwise_cuda --dtype bf16 --batch ${bs[0]} --image $image \
--peak-fp32-tflops @PEAK32@ --peak-gbps @GBPS@ --json $logs/depthwise.json")
want_job() { [[ "$bench_jobs" == all || ",$bench_jobs," == *",$1,"* ]]; }

if ((dry)); then
  say "building and running a program that uses every dependency ($build/deps-probe)"
  probe=$build/deps-probe
  rm -rf "$probe"
  probe_ok=1
  if maybe_hidden cmake -S "$repo/scripts/deps-probe" -B "$probe" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    "${dep_args[@]}" >"$logs/probe.log" 2>&1 && maybe_hidden cmake --build "$probe" >>"$logs/probe.log" 2>&1 &&
    maybe_hidden "$probe/deps_probe" 2>&1 | tee -a "$logs/probe.log" | show; then
    probe_outside=$(outside_paths "$probe")
    unresolved=$(maybe_hidden ldd "$probe/deps_probe" | grep "not found" || true)
    if [[ -n "$probe_outside$unresolved" ]]; then
      probe_ok=0
      echo "$probe_outside$unresolved" | show
    fi
  else
    probe_ok=0
    tail -30 "$logs/probe.log" | show
  fi
  ((probe_ok)) || { say "the dependency probe failed: a bare machine would fail the same way"; exit 1; }
  say "checking the summary tables against made-up results (scripts/gpu_check_summary.py --self-test)"
  "${python_env[@]}" python3 scripts/gpu_check_summary.py --self-test >"$logs/summary-self-test.txt" 2>&1 ||
    { tail -20 "$logs/summary-self-test.txt" | show; exit 1; }
  "${python_env[@]}" python3 -m py_compile bench/train_step_torch.py scripts/gpu_check_summary.py
  say "dry run: the plan of a real run ($jobs jobs; stages: $only; time limit: $( ((limit)) && echo "$limit s" || echo none)):"
  {
    echo "build: cmake --build $build -j $jobs --target ${targets[*]}"
    echo "test: ctest --test-dir $build -L cuda -j 4 (failures rerun alone)"
    echo "train: $build/apps/convnext_zero --model atto ... --device cuda --precision bf16"
    for job in "${bench_plan[@]}"; do
      IFS='|' read -r name need cap cmd <<<"$job"
      want_job "$name" && echo "bench $name (needs ${need} s, at most $cap s): $cmd"
    done
    echo "sanitize: compute-sanitizer memcheck (op table, ConvNeXt-shape ops, optimizer), racecheck (f32 op table)"
  } | show
  exit 0
fi

# ---- 3. build ----
{
  nvidia-smi || true
  nvcc --version | tail -2
  grep -h -E "define CUDNN_(MAJOR|MINOR|PATCHLEVEL) " /usr/include/cudnn_version*.h /usr/local/cuda/include/cudnn_version*.h 2>/dev/null | head -3 || true
  "${python_env[@]}" python3 -c 'import torch, timm; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "timm", timm.__version__)' || true
} >"$logs/env.txt" 2>&1
status=0
if want build || want test || want train || want bench || want sanitize; then
  # Every stage needs the binaries; on a warm machine this is a no-op.
  say "building ${targets[*]} with $jobs jobs"
  if ! capped 480 cmake --build "$build" -j "$jobs" --target "${targets[@]}" >"$logs/build.log" 2>&1; then
    grep -E "error|FAILED" "$logs/build.log" | head -40 | show || true
    say "build failed or ran out of time"
    exit 1
  fi
  grep -i "warning" "$logs/build.log" | head -20 >"$logs/build-warnings.txt" || true
  say "build ok ($(wc -l <"$logs/build-warnings.txt") warning lines)"
  missing_libs=$(ldd "$build/tests/tensor/test_cuda" "$build/tests/optim/test_optim_cuda" "$build/apps/convnext_zero" \
    "$build/bench/bench_train_step" 2>&1 | grep "not found" | sort -u || true)
  [[ -z "$missing_libs" ]] || { say "shared libraries not found:"; echo "$missing_libs" | show; status=1; }
fi

# ---- 4. tests ----
if want test && fits test 120; then
  # Four test processes share the GPU; a test that fails is run again alone, so a failure caused by the
  # sharing is told apart from a real one.
  say "ctest -L cuda (4 at a time)"
  rc=0
  capped 420 ctest --test-dir "$build" -L cuda --output-on-failure --timeout 240 -j 4 >"$logs/ctest.log" 2>&1 || rc=$?
  ((rc == 124)) && { say "ctest cut off by the time limit"; not_run+=(test); }
  grep -E "tests passed|tests failed|Total Test time" "$logs/ctest.log" | show || true
  skipped=$(grep -c "\*\*\*Skipped" "$logs/ctest.log" || true)
  ((skipped == 0)) || say "$skipped of them skipped (a test skips when it sees no GPU): see ctest.log"
  if ((rc != 0 && rc != 124)); then
    grep -E "\(Failed\)|\(SEGFAULT\)|\(Timeout\)|Not Run|Subprocess aborted" "$logs/ctest.log" | show || true
    say "the failed tests again, one at a time"
    capped 240 ctest --test-dir "$build" --rerun-failed --output-on-failure --timeout 240 -j 1 \
      >"$logs/ctest-rerun.log" 2>&1 || status=1
    grep -E "tests passed|tests failed|\(Failed\)|\(SEGFAULT\)|\(Timeout\)" "$logs/ctest-rerun.log" | show || true
  fi
fi

# ---- 5. end to end: the main job's short run on the GPU, bf16 ----
train_args=(--model atto --image-size 64 --num-classes 10 --data synthetic --micro-batch 32 --steps 120
  --warmup-steps 10 --lr 2e-3 --eval-every 40 --device cuda --precision bf16 --log "$logs/train_cuda_bf16.jsonl")
if want train && fits train 60; then
  say "training convnext_atto on synthetic data on the GPU (bf16, 120 steps)"
  if capped 180 "$build/apps/convnext_zero" "${train_args[@]}" >"$logs/train_cuda_bf16.log" 2>&1; then
    "${python_env[@]}" python3 - "$logs/train_cuda_bf16.jsonl" <<'PY' | show || status=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
train = [r for r in rows if "loss" in r and r.get("split", "train") == "train"]
evals = [r for r in rows if r.get("split") == "eval"]
print(f"train loss {train[0]['loss']:.4f} (step {train[0].get('step')}) -> {train[-1]['loss']:.4f} "
      f"(step {train[-1].get('step')}); last eval {evals[-1] if evals else 'none'}")
PY
  else
    status=1
    tail -5 "$logs/train_cuda_bf16.log" | show
  fi
fi

# ---- 6. ours against PyTorch eager and torch.compile, and our switches ----
if want bench; then
  if [[ -z "$peak" ]]; then
    # Dense bf16 tensor-core peaks (NVIDIA's data sheets, without sparsity).
    case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
      *H200*) peak=989 ;;
      *H100*NVL*) peak=835 ;;
      *H100*PCIe*) peak=756 ;;
      *H100*) peak=989 ;;
      *) peak=0 ;;
    esac
  fi
  # f32 (non-tensor-core) peaks and memory bandwidths, for the depthwise bounds (data sheets).
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
    *H200*) peak32=67 gbps=4800 ;;
    *H100*NVL*) peak32=60 gbps=3900 ;;
    *H100*PCIe*) peak32=51 gbps=2000 ;;
    *H100*) peak32=67 gbps=3350 ;;
    *) peak32=0 gbps=0 ;;
  esac
  say "bf16 peak for the MFU: ${peak} TFLOP/s (0: unknown GPU, no MFU)"
  have_torch=1
  "${python_env[@]}" python3 -c 'import torch, timm; assert torch.cuda.is_available()' 2>/dev/null || have_torch=0
  ((have_torch)) || say "PyTorch with CUDA and timm not importable: no peer figures"
  for job in "${bench_plan[@]}"; do
    IFS='|' read -r name need cap cmd <<<"$job"
    want_job "$name" || continue
    [[ "$cmd" == *python3* ]] && ! ((have_torch)) && continue
    fits "bench:$name" "$need" || continue
    say "bench $name"
    rc=0
    # shellcheck disable=SC2086  # the plan's commands are plain words
    cmd=${cmd//@PEAK32@/$peak32}
    cmd=${cmd//@GBPS@/$gbps}
    capped "$cap" ${cmd//@PEAK@/$peak} >"$logs/$name.txt" 2>&1 || rc=$?
    grep -E "^(bench_train_step: (convnext|MFU)|train_step_torch: convnext|\[gemm (path|time)\]|\[depthwise\])" "$logs/$name.txt" |
      show || true
    if ((rc == 124)); then
      say "$name: cut off after its $cap s (or the time limit)"
      not_run+=("bench:$name")
    elif ((rc != 0)); then
      status=1
      tail -5 "$logs/$name.txt" | show
    fi
  done
fi

# ---- 7. compute-sanitizer ----
if want sanitize && ! command -v compute-sanitizer >/dev/null; then
  say "compute-sanitizer not found: sanitize not run"
elif want sanitize && fits sanitize 120; then
  say "compute-sanitizer memcheck: op table (f32, bf16), ConvNeXt-shape ops, optimizer kernels; racecheck"
  # Each run is capped (a sanitizer slows kernels 10-100x); a cap that is hit shows as "cut off" below
  # rather than as a silent pass.
  sanitize() {  # LOG TOOL TEST [FILTER]
    local log=$1 tool=$2 test=$3 filter=${4:-*} rc=0
    fits "sanitize:$log" 60 || return 0
    capped 170 compute-sanitizer --tool "$tool" --error-exitcode 9 "$test" --gtest_filter="$filter" \
      >"$logs/$log" 2>&1 || rc=$?
    ((rc == 124)) && say "$log: cut off after 170 s (or the time limit)"
    ((rc == 0)) || status=1
  }
  sanitize memcheck-tensor.log memcheck "$build/tests/tensor/test_cuda" 'All/OpTableCuda.*:CudaOps.*'
  sanitize memcheck-optim.log memcheck "$build/tests/optim/test_optim_cuda"
  sanitize racecheck-tensor.log racecheck "$build/tests/tensor/test_cuda" 'All/OpTableCuda.F32*'
  grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$logs"/memcheck-*.log "$logs"/racecheck-*.log 2>/dev/null | show || true
fi

# ---- the tables, and what is left for another call ----
if compgen -G "$logs/*.json" >/dev/null; then
  echo | show
  "${python_env[@]}" python3 scripts/gpu_check_summary.py --peak-tflops "${peak:-0}" "$logs" 2>&1 | show || status=1
fi
if ((${#not_run[@]})); then
  stages=() jobs_left=()
  for item in "${not_run[@]}"; do
    stage=${item%%:*}
    [[ " ${stages[*]} " == *" $stage "* ]] || stages+=("$stage")
    [[ "$item" == bench:* ]] && jobs_left+=("${item#bench:}")
  done
  rest=()
  skip=0
  for a in "${orig_args[@]}"; do  # the caller's options, less the ones the next call replaces
    if ((skip)); then skip=0; continue; fi
    case "$a" in --only | --bench-jobs) skip=1 ;; --no-sanitize | --no-bench) ;; *) rest+=("$a") ;; esac
  done
  next="scripts/gpu-check.sh ${rest[*]} --only $(IFS=,; echo "${stages[*]}")"
  ((${#jobs_left[@]})) && next+=" --bench-jobs $(IFS=,; echo "${jobs_left[*]}")"
  say "not run in this call for lack of time: ${not_run[*]}"
  say "next call: $next   (then scripts/gpu_check_summary.py over both calls' logs for one table)"
fi
say "done (status $status, $((SECONDS - t0)) s); summary.txt and gpu-check-logs.tar.gz in $out"
exit $status
