#!/usr/bin/env bash
# The GPU check: one call of at most 9 minutes on a bare GPU machine (CUDA 13, cuDNN, NCCL, CMake, ninja,
# PyTorch + timm; no -dev packages, no network). It unpacks the Debian packages scripts/gpu-deps.sh downloaded
# into a private prefix (never into /), takes the executables from the prebuilt bundle scripts/gpu-bundle.sh
# made (or, when there is none or it does not match the sources, builds them here), then runs its stages in
# this order, the most valuable first, each capped:
#   build     the bundle unpacked and checked (every library resolves, the programs start), or a build
#   test      ctest -L cuda, less the rank tests: every op, the optimizer, the model, the trainer, checkpoints
#   ranks     the cuda_ranks_* tests: 2 and 4 ranks on one GPU at stages 0-3 over the MPI backend, offload,
#             INT8, simulated hosts, checkpoints across world sizes and devices, NCCL at one rank, bf16
#             repeating in two processes (tests/dist/train/run_cuda_rank_tests.sh)
#   job       the app (not the benchmark) beside bench_train_step at the same batch: synthetic data at each
#             batch, an ImageNet-like JPEG folder with the whole recipe, CUDA graphs on/off, the loader's scaling
#             (Note [The job stage]; the table in job.md and job.json)
#   node      8 ranks sharing the GPU as a node's ranks would (MPI backend), bound to 2 cores each by mpirun
#             (--map-by ppr:8:node:PE=2 --bind-to core), then unbound, beside 1 rank, on the JPEG folder with
#             the whole recipe: per rank its mask, share, loader threads, data wait and img/s (Note [The node
#             stage]; node.md and node.json)
#   train     the main job's short run on the GPU (convnext_atto, bf16)
#   eager     a ConvNeXt training step, ours against PyTorch eager, per batch size
#   compile   the same against torch.compile
#   switches  our paths in place of cuDNN's / cuBLASLt's (the defaults' evidence), the depthwise kernels per
#             stage, the GEMMs
#   sanitize  compute-sanitizer memcheck and racecheck
# OUT gets summary.txt (stage times, test counts, the multi-rank differences, the speed tables),
# gpu-check-logs.tar.gz (every log and JSON result) and the job table (job.md, job.json): few files, as the
# device tool brings back few.
#
#   scripts/gpu-check.sh [options] [OUT]        OUT defaults to $OUT, else ./gpu-check-out
#     --deps DIR        the .deb folder (default .deps)           --build DIR   build folder (default build-gpu)
#     --bundle FILE     the prebuilt bundle (default .gpu-bundle/bundle.tar.xz; "none": build here)
#     --model NAME      ConvNeXt variant (default tiny)           --batch N[,N] batch sizes to time (default 64,128)
#     --image PX        image size (default 224)                  --steps N     timed steps (default 20)
#     --compile-mode M  torch.compile mode of the compiled peer (default "default"; "none" leaves it out)
#     --peak-tflops T   the GPU's dense bf16 peak, for the MFU (default: from the GPU's name: H100 SXM/H200 989,
#                       H100 NVL 835, H100 PCIe 756; unknown names print no MFU)
#     --only STAGES     comma list of the stages above (default: all, in that order; build is always done)
#     --bench-jobs J    comma list of the job/eager/compile/switches runs (default all; names as the plan prints)
#     --tests REGEX     only the tests of the test and ranks stages whose names match (a rerun of failures)
#     --time-limit S    this call's wall-clock budget in seconds: every run is capped to what is left, a stage
#                       that needs more than is left is not started, and what did not fit is listed at the end
#                       with the command that runs it (540 under a 10-minute command limit)
#     --no-sanitize     leave out sanitize                        --no-bench    leave out eager, compile, switches
#     --dry-run         what a machine without a GPU can check: unpack the packages, check the bundle (its
#                       sources, every library resolving from the prefix with the system's copies hidden, the
#                       programs starting, two CPU ranks under the prefix's mpirun), configure the fallback
#                       build, build and run a program using every dependency, check the summary tables,
#                       print the plan with each stage's time
#     --source-hash     print the hash of the sources a bundle is checked against, and exit
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
orig_args=("$@")

# The sources the executables are compiled from, by path and content (C++, CUDA and CMake files; not data or
# scripts, which run from the tree): what travels with the working tree (there is no .git on the GPU machine).
# The byte order of C keeps the hash the same whatever the machine's locale. scripts/gpu-bundle.sh writes it
# into the bundle's manifest.
source_hash() {
  find src apps bench tests cmake CMakeLists.txt -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o \
    -name '*.cuh' -o -name '*.cmake' -o -name 'CMakeLists.txt' \) -print0 | LC_ALL=C sort -z | xargs -0 sha1sum |
    sha1sum | cut -c1-16
}

all_stages=build,test,ranks,job,node,train,eager,compile,switches,sanitize
deps=.deps build=build-gpu bundle=.gpu-bundle/bundle.tar.xz model=tiny batches=64,128 image=224 steps=20 dry=0
out="" peak="" limit=0 compile_mode=default only=$all_stages bench_jobs=all tests_re=""
while (($#)); do
  case "$1" in
    --deps) deps=$2; shift ;;
    --build) build=$2; shift ;;
    --bundle) bundle=$2; shift ;;
    --tests) tests_re=$2; shift ;;
    --source-hash) source_hash; exit 0 ;;
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
    --no-bench) only=${only//eager/}; only=${only//compile/}; only=${only//switches/} ;;
    --dry-run) dry=1 ;;
    -h | --help) sed -n '2,45p' "$0"; exit 0 ;;
    -*) echo "gpu-check: unknown option $1" >&2; exit 2 ;;
    *) out=$1 ;;
  esac
  shift
done
out=${out:-${OUT:-gpu-check-out}}
# A dry run works in a folder of its own: it reconfigures, and it must not touch a build a bundle comes from.
((dry)) && build=${build%/}-dry
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
  cp "$logs/job/job.md" "$logs/job/job.json" "$out/" 2>/dev/null || true
  cp "$logs/node/node.md" "$logs/node/node.json" "$out/" 2>/dev/null || true
  tar -czf "$out/gpu-check-logs.tar.gz" -C "$build" gpu-check-logs 2>/dev/null || true
}
trap pack EXIT
trap 'exit 143' TERM INT

# ---- time: each run gets at most what is left of --time-limit, less a margin for packing the logs ----
# Note [Stage times]: each stage's NEED (it is not started with less than that left) and CAP (it is stopped
# after that), in seconds, on a bare H100 with 16 cores. TIMES_SEEN says where they come from: until a GPU run
# measures them they are estimates; after one, each NEED is that run's time plus a margin.
# Measured by the first whole run, H100 80GB HBM3 (SXM), 16 cores, 2026-11-26 (bench/results/gpu/): build 5 s
# (the bundle; the packages' unpacking before it ~25 s), test 44, ranks 74, train 3, eager 77, compile 133,
# switches 22, sanitize 13; 400 s for the whole call. A build here instead of the bundle: not measured (it
# failed to link on that machine's GCC 13 against the prefix's static HDF5).
TIMES_SEEN="measured on an H100, 2026-11-26: the whole call 400 s; job stage (new) estimated"
# The job stage (Note [The job stage]) is not measured yet: its NEED is the sum of its runs' estimates (each
# run's start-up on a GPU, a few seconds, plus its steps), and each run is capped on its own.
declare -A need=([build]=10 [test]=60 [ranks]=95 [job]=0 [node]=0 [train]=10 [eager]=100 [compile]=170 [switches]=30
  [sanitize]=20)
declare -A cap=([build]=420 [test]=150 [ranks]=180 [job]=540 [node]=300 [train]=60 [eager]=180 [compile]=300
  [switches]=90 [sanitize]=120)
t0=$SECONDS
left() { if ((limit > 0)); then echo $((limit - (SECONDS - t0) - 15)); else echo 1000000; fi; }
not_run=()  # stage or stage:job names this call had no time for
stage_rows=()  # "stage|seconds|result" for the summary's table
# capped CAP CMD...: CMD with a timeout of CAP seconds, or of what is left when that is less; 124 if cut off.
capped() {
  local cap=$1 l
  shift
  l=$(left)
  ((l < cap)) && cap=$l
  ((cap > 0)) || return 124
  timeout --kill-after=10 "$cap" "$@"
}
# run_planned STAGE NAME CAP OUT CMD...: one run of a stage's plan, capped, its output in OUT; sets `state`
# ("ok", cut off or failed, said), and on trouble `result` (the stage's), `status` and not_run.
run_planned() {
  local st=$1 name=$2 jcap=$3 outf=$4 rc=0
  shift 4
  say "$st $name"
  capped "$jcap" "$@" >"$outf" 2>&1 || rc=$?
  state=ok
  if ((rc == 124)); then
    state="cut off after $jcap s (or the time limit)"
    not_run+=("$st:$name")
    result="some cut off"
  elif ((rc != 0)); then
    state="failed (exit $rc): $(tail -1 "$outf" | tr '\t' ' ')"
    status=1
    result="some failed"
  fi
  ((rc == 0)) || say "$name: $state"
}
# fits NAME NEED: true when NEED seconds are left; otherwise NAME is listed as not run.
fits() {
  (($(left) >= $2)) && return 0
  not_run+=("$1")
  say "$1: not run, $(left) s left of --time-limit $limit"
  return 1
}
# begin STAGE: true when the stage is wanted and its NEED fits; starts its clock. end STAGE RESULT: its row.
stage_t=0
begin() {
  want "$1" || return 1
  fits "$1" "${need[$1]}" || { stage_rows+=("$1|-|not run (time)"); return 1; }
  stage_t=$SECONDS
  say "stage $1 (needs ${need[$1]} s, at most ${cap[$1]} s)"
}
end() {
  stage_rows+=("$1|$((SECONDS - stage_t))|$2")
  say "stage $1: $2 in $((SECONDS - stage_t)) s"
}
IFS=, read -ra wanted_stages <<<"$only"
for st in "${wanted_stages[@]}"; do
  [[ -z "$st" || ",$all_stages," == *",$st,"* ]] ||
    { echo "gpu-check: unknown stage '$st' in --only (stages: $all_stages)" >&2; exit 2; }
done
[[ ",$only," == *,build,* ]] || only=build,$only  # every stage needs the executables
jobs=$(nproc)
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
# PMIx looks for its components under its own configured prefix, where a machine may hold another PMIx (the
# first GPU run's did: every rank warned that its zlib component had an undefined symbol).
export PMIX_INSTALL_PREFIX=$prefix/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)/pmix2
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

# ---- 2. the GPU libraries: CUDA's, cuDNN's and NCCL's, wherever this machine has them ----
# The executables need libcudnn.so.9, libnccl.so.2 and cuBLAS by SONAME. A machine with only PyTorch's pip
# wheels has them in site-packages/nvidia/*/lib rather than on the loader's path: each one ldd cannot find is
# looked up in the CUDA toolkit's folders and the wheels, and its folder goes onto LD_LIBRARY_PATH.
nvidia_wheels=$("${python_env[@]}" python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null || true)
lib_dirs_tried=(/usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib)
resolve_libs() {  # EXE...: adds the folders of what ldd cannot find; what stays missing into missing-libs.txt
  local lib dir found
  for lib in $(ldd "$@" 2>/dev/null | awk '/not found/ {print $1}' | sort -u); do
    found=""
    for dir in "${lib_dirs_tried[@]}"; do [[ -e "$dir/$lib" ]] && { found=$dir; break; }; done
    [[ -n "$found" || -z "$nvidia_wheels" ]] ||
      found=$(find "$nvidia_wheels" -name "$lib" -printf '%h\n' 2>/dev/null | head -1)
    if [[ -n "$found" ]]; then
      export LD_LIBRARY_PATH=$found:$LD_LIBRARY_PATH
      echo "$lib from $found" >>"$logs/libraries.txt"
    fi
  done
  { ldd "$@" 2>&1 | grep -E "not found" | sort -u || true; } >"$logs/missing-libs.txt"
}

# ---- 3. the fallback build's configuration (and, in a dry run, its proof) ----
# Paths Debian's packages would normally find under /usr (the OpenMP OpenBLAS, HDF5's serial flavour, Open MPI
# without its compiler wrapper, which lives in openmpi-bin, and its mpiexec, which an alternative would name)
# are given explicitly; the CMake config packages (fmt, GTest, benchmark, nlohmann_json, CLI11, libjpeg-turbo)
# and zlib are found through CMAKE_PREFIX_PATH.
dep_args=(
  -DCMAKE_PREFIX_PATH="$prefix/usr" -DCMAKE_INCLUDE_PATH="$prefix/usr/include" -DCMAKE_LIBRARY_PATH="$multi"
  -DCZ_CBLAS_INCLUDE="$prefix/usr/include/$(basename "$multi")/openblas-openmp"
  -DCZ_OPENBLAS_LIB="$multi/openblas-openmp/libopenblas.so"
  -DCZ_BLIS_HEADER="$prefix/usr/include/$(basename "$multi")/blis-openmp/blis.h"
  -DCZ_BLIS_LIB="$multi/blis-openmp/libblis.so.4"
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
# cuDNN's and NCCL's headers normally sit beside CUDA or in /usr; if not, those of PyTorch's pip wheels.
for lib in cudnn nccl; do
  hdr=$([[ $lib == cudnn ]] && echo cudnn_version.h || echo nccl.h)
  compgen -G "/usr/local/cuda/include/$hdr" >/dev/null || compgen -G "/usr/include/$hdr" >/dev/null ||
    compgen -G "/usr/include/*/$hdr" >/dev/null && continue
  root=$("${python_env[@]}" python3 -c "import nvidia.$lib as m; print(list(m.__path__)[0])" 2>/dev/null) || continue
  cmake_args+=("-DCZ_${lib^^}_ROOT=$root")
done

# configure_fallback: configures $build against the prefix and fails naming any path outside it.
configure_fallback() {
  say "configuring $build"
  if ! maybe_hidden cmake "${cmake_args[@]}" >"$logs/configure.log" 2>&1; then
    say "configure failed:"
    tail -40 "$logs/configure.log" | show
    return 1
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
    return 1
  fi
  say "every library and header path of the configured build lies in the prefix or the toolchain"
}

# ---- 4. the executables: the prebuilt bundle, or a build here ----
# Note [The prebuilt bundle]: building on the GPU machine costs minutes of a 9-minute call (279 build steps;
# nvcc alone is most of a 2-core machine's build). scripts/gpu-bundle.sh builds here for sm_90 instead and packs
# the executables and ctest's files into one xz file (Note [Stage times] for what it saves). The bundle names
# the sources it was built from; a working tree with other sources builds here instead, so a stale bundle never
# tests code other than the tree's. Unpacked, every path of the build and source folders it was made in, and
# its mpiexec, is rewritten to where it landed (ctest's files name them absolutely); every executable must
# then find each library it needs (the prefix's, CUDA's, cuDNN's, NCCL's: resolve_libs) and start.
bundle_manifest=""
bundle_state="none"
# The bundle's tar stream: xz where the machine has it, else Python's lzma (a bare image may lack xz-utils).
bundle_tar() {
  if command -v xz >/dev/null; then
    xz -dc "$bundle"
  else
    "${python_env[@]}" python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' \
      "$bundle"
  fi
}  # none | stale | ok | broken
unpack_bundle() {  # DIR: unpacks the bundle into DIR and rewrites its paths; false when it does not match
  local dir=$1 want have old_build old_src old_mpiexec
  [[ "$bundle" != none && -f "$bundle" ]] || { say "no bundle ($bundle): building here"; return 1; }
  bundle_manifest=$(bundle_tar | tar -xO manifest.txt) || { bundle_state=broken; say "cannot read $bundle"; return 1; }
  want=$(sed -n 's/^source_hash //p' <<<"$bundle_manifest")
  have=$(source_hash)
  if [[ "$want" != "$have" ]]; then
    bundle_state=stale
    say "the bundle was built from other sources (hash $want, $(sed -n 's/^commit //p' <<<"$bundle_manifest")) than this tree ($have): building here"
    return 1
  fi
  mkdir -p "$dir"
  bundle_tar | tar -C "$dir" -x
  old_build=$(sed -n 's/^build_dir //p' <<<"$bundle_manifest")
  old_src=$(sed -n 's/^source_dir //p' <<<"$bundle_manifest")
  old_mpiexec=$(sed -n 's/^mpiexec //p' <<<"$bundle_manifest")
  find "$dir" -name '*.cmake' -print0 | xargs -0 sed -i \
    -e "s,\"$old_mpiexec\",\"@CZ_MPIEXEC@\",g" -e "s,$old_build,@CZ_BUILD@,g" -e "s,$old_src,@CZ_SOURCE@,g" \
    -e "s,@CZ_BUILD@,$dir,g" -e "s,@CZ_SOURCE@,$repo,g" -e "s,@CZ_MPIEXEC@,$prefix/usr/bin/mpiexec.openmpi,g"
  bundle_state=ok
}
# check_executables DIR [RUNNER]: every executable of the bundle finds its libraries and starts (RUNNER:
# maybe_hidden in a dry run, where resolve_libs then runs in the hidden namespace).
check_executables() {
  local dir=$1
  shift
  mapfile -t exes < <(find "$dir" -type f -perm -u+x ! -name '*.sh' ! -name '*.py' ! -path '*/deps-prefix/*' \
    ! -path '*/CMakeFiles/*' ! -path '*/gpu-check-logs/*')
  if (($#)); then
    "$@" bash -c "$(declare -f resolve_libs); $(declare -p lib_dirs_tried nvidia_wheels logs); resolve_libs \"\$@\"" \
      resolve "${exes[@]}"
  else
    resolve_libs "${exes[@]}"
  fi
  if [[ -s "$logs/missing-libs.txt" ]]; then
    say "the bundle's executables miss libraries:"
    show <"$logs/missing-libs.txt"
    return 1
  fi
  if ! "$@" "$dir/apps/convnext_zero" --help >"$logs/bundle-start.log" 2>&1 ||
    ! "$@" "$dir/tests/tensor/test_cuda" --gtest_list_tests >>"$logs/bundle-start.log" 2>&1; then
    say "the bundle's programs do not start:"
    tail -5 "$logs/bundle-start.log" | show
    return 1
  fi
  say "${#exes[@]} executables find every library and start"
}

# ---- the plan: every stage's commands, run or (dry run) printed ----
IFS=, read -ra bs <<<"$batches"
# bench jobs: STAGE|NAME|NEED|CAP|command: not started with less than NEED seconds left, stopped after CAP.
# eager: ours and PyTorch eager per batch; compile: torch.compile per batch (its time is mostly compilation,
# on the CPU); switches: our paths in place of the libraries' at the first batch, the depthwise kernels per
# stage, the GEMMs.
bench_plan=()
for b in "${bs[@]}"; do
  # The timed steps come first; the 5 profiled steps after them (slower) give the per-op table.
  bench_plan+=("eager|ours_b$b|20|120|$build/bench/bench_train_step --model $model --device cuda --dtype bf16 --batch $b \
--image $image --warmup 5 --steps $steps --peak-tflops @PEAK@ --profile 5 --json $logs/ours_b$b.json")
  bench_plan+=("eager|eager_b$b|25|120|${python_env[*]} python3 bench/train_step_torch.py --model $model --device cuda \
--dtype bf16 --batch $b --image $image --warmup 5 --steps $steps --profile 5 --json $logs/eager_b$b.json")
done
if [[ "$compile_mode" != none ]]; then
  for b in "${bs[@]}"; do
    bench_plan+=("compile|compile_b$b|90|240|${python_env[*]} python3 bench/train_step_torch.py --model $model \
--device cuda --dtype bf16 --batch $b --image $image --warmup 5 --steps $steps --profile 5 --compile $compile_mode \
--json $logs/compile_b$b.json")
  done
fi
# The depthwise kernels per stage, ours and cuDNN's, against the f32 FMA and memory bounds: first, as the
# depthwise convolution is where our step went (issue 13).
bench_plan+=("switches|depthwise|15|120|$build/bench/bench_depthwise_cuda --dtype bf16 --batch ${bs[0]} --image $image \
--peak-fp32-tflops @PEAK32@ --peak-gbps @GBPS@ --json $logs/depthwise.json")
# Each of our own paths in place of the library's, at the first batch size; which is faster decides the
# default: cuDNN's depthwise convolutions instead of our tiled kernels; plain GEMMs plus our bias kernels
# instead of cuBLASLt's epilogues; the stem and downsamplings as one GEMM over their patches instead of cuDNN.
for variant in depthwise-cudnn no-gemm-epilogues patchify-gemm; do
  bench_plan+=("switches|${variant}_b${bs[0]}|20|120|$build/bench/bench_train_step --model $model --device cuda \
--dtype bf16 --batch ${bs[0]} --image $image --warmup 5 --steps $steps --$variant --peak-tflops @PEAK@ --profile 5 \
--json $logs/${variant}_b${bs[0]}.json")
done
bench_plan+=("switches|gemm|15|120|$build/bench/bench_gemm_cuda --dtype bf16 --batch ${bs[0]} --image $image \
--peak-tflops @PEAK@ --json $logs/gemm.json")
want_job() { [[ "$bench_jobs" == all || ",$bench_jobs," == *",$1,"* ]]; }
# Note [The job stage]: the app (apps/convnext_zero, not the benchmark) as a user runs it, beside
# bench_train_step at the same batch in the same call (issue 40: steps of 15.0 ms in the benchmark took 23.9 ms
# in the app; on JPEGs with the whole recipe the app ran at 0.26x its step). Runs: NAME|NEED|CAP|BATCH|command.
#   step_bB                bench_train_step at batch B: the reference
#   synthetic_bB           the app on synthetic data at micro-batch B over one epoch's end, a few steps traced
#   synthetic_bB_old_threads  the same at the first batch with the threads the rule before issue 40 chose on a
#                          16-core host (OpenMP active, a thread per core, a loader thread per core): before
#                          and after in one call
#   folder_bB              an ImageNet-like JPEG folder (tools/make_imagenet_like.py, 10 classes x 200, made
#                          in the background while the test stages run) with the whole recipe at the last batch
#   folder_bB_half_loaders the same with half as many loader threads as cores
#   graphs_{on,off}_bB     --cuda-graphs on and off at each batch, where the app has the flag (probed)
#   loader_scaling         bench/loader_scaling.py over that folder at 1-16 threads beside PyTorch's, where the
#                          script exists
# scripts/gpu_job_summary.py turns the logs and traces into job.json and job.md (app img/s over step img/s, the
# trace's GPU-busy fraction, data wait, the longest wait at an epoch's end). Steps are few: the whole check
# fits one call of at most 10 minutes.
job_dir=$logs/job
job_data=$build/job-data
app=$build/apps/convnext_zero
cores_here=$(nproc)
app_common="--model $model --device cuda --precision bf16 --image-size $image --eval-batches 1 --no-progress"
job_plan=()
for b in "${bs[@]}"; do
  job_plan+=("step_b$b|15|60|$b|$build/bench/bench_train_step --model $model --device cuda --dtype bf16 --batch $b \
--image $image --warmup 5 --steps $steps --json $job_dir/step_b$b.json")
done
# Synthetic: 4096 images, so one epoch's end at step 4096/B + 1; 36 steps after it, the last few traced.
synthetic_run() {  # NAME BATCH [FLAGS...]: one synthetic run's plan entry
  local name=$1 b=$2 n
  shift 2
  n=$((4096 / b + 36))
  echo "$name|15|60|$b|$app $app_common --data synthetic:n=4096,size=$image --micro-batch $b --steps $n \
--trace $job_dir/$name.trace.json --trace-steps $((n - 6)):$((n - 3)) --log $job_dir/$name.jsonl $*"
}
for b in "${bs[@]}"; do job_plan+=("$(synthetic_run "synthetic_b$b" "$b")"); done
old_run=$(synthetic_run "synthetic_b${bs[0]}_old_threads" "${bs[0]}" --loader-threads "$cores_here")
job_plan+=("${old_run/|$app /|env OMP_WAIT_POLICY=active OMP_NUM_THREADS=$cores_here $app }")
fb=${bs[-1]}
job_plan+=("folder_b$fb|20|90|$fb|$app $app_common --data folder:$job_data --num-classes 10 --augment \
--aa rand-m9-mstd0.5-inc1 --reprob 0.25 --mixup 0.8 --cutmix 1.0 --micro-batch $fb --steps $((3 * 2000 / fb + 3)) \
--trace $job_dir/folder_b$fb.trace.json --trace-steps $((3 * 2000 / fb - 5)):$((3 * 2000 / fb - 2)) \
--log $job_dir/folder_b$fb.jsonl")
# The same with half the loader threads: whether loader threads on the launching thread's core (or its
# hyperthread sibling) slow the step more than the extra decoding helps.
folder_half=$(grep "^folder_b$fb|" <<<"$(printf '%s\n' "${job_plan[@]}")")
folder_half=${folder_half//folder_b$fb/folder_b${fb}_half_loaders}
job_plan+=("$folder_half --loader-threads $((cores_here / 2))")
for b in "${bs[@]}"; do
  for g in on off; do
    job_plan+=("graphs_${g}_b$b|12|60|$b|$app $app_common --data synthetic:n=4096,size=$image --micro-batch $b \
--steps 40 --log $job_dir/graphs_${g}_b$b.jsonl --cuda-graphs $g")
  done
done
# With the prefix's libraries on LD_LIBRARY_PATH (unlike the other Python runs): it starts our programs too.
job_plan+=("loader_scaling|60|150|$fb|env PYTHONUNBUFFERED=1 python3 bench/loader_scaling.py --build $build --data $job_data \
--threads 1,2,4,8,16 --recipe full --batch $fb --batches 20 --repeats 1 --torch --out $job_dir/loader_scaling.csv")
job_need() {  # the sum of the NEEDs of the job runs asked for that this tree can run
  local t=0 j name n
  for j in "${job_plan[@]}"; do
    IFS='|' read -r name n _ <<<"$j"
    want_job "$name" || continue
    [[ $name != loader_scaling || -f bench/loader_scaling.py ]] || continue
    [[ $name != graphs_* ]] || grep -rqs -- '"--cuda-graphs"' src/dist/train/ || continue
    t=$((t + n))
  done
  echo $t
}
need[job]=$(job_need)
# Note [The node stage]: the ranks of one 8-GPU node, played on the one GPU here (issue 51): 8 ranks over the
# MPI backend, first as a cluster's launcher binds them (mpirun --map-by ppr:8:node:PE=C --bind-to core, C the
# cores here over 8: 2 on a 16-core machine), then unbound (each rank's share then split from the whole
# mask, Note [A rank's CPUs on a node]), beside 1 rank with the machine to itself, on the JPEG folder with
# the whole recipe. ConvNeXt-small at micro-batch 48: 8 ranks on one GPU make each rank's step about 8 times
# the GPU's time for it, as slow for its loader as a step on a GPU of its own of an 8x larger model. Each run
# traces its last steps (every rank's data wait) and logs its steps; scripts/gpu_node_summary.py turns them
# and the header's masks into node.md and node.json. Runs: NAME|NEED|CAP|RANKS|command.
node_dir=$logs/node
mpiexec_node=$prefix/usr/bin/mpiexec.openmpi
pe=$((cores_here / 8 > 0 ? cores_here / 8 : 1))
node_steps=16  # 2000 images at 8 x 48 a step: 3 epochs
node_app() {  # NAME: the app's flags for one node run
  echo "$app --model small --device cuda --precision bf16 --image-size $image --comm-backend mpi \
--data folder:$job_data --num-classes 10 --augment --aa rand-m9-mstd0.5-inc1 --reprob 0.25 --mixup 0.8 --cutmix 1.0 \
--micro-batch 48 --steps $node_steps --eval-batches 1 --no-progress --trace $node_dir/$1.trace.json \
--trace-steps $((node_steps - 5)):$((node_steps - 1)) --log $node_dir/$1.jsonl"
}
node_plan=(
  "node_1_rank|30|90|1|$mpiexec_node --allow-run-as-root -np 1 --bind-to none $(node_app node_1_rank)"
  "node_8_bound|45|120|8|$mpiexec_node --allow-run-as-root --map-by ppr:8:node:PE=$pe --bind-to core -np 8 $(node_app node_8_bound)"
  "node_8_unbound|45|120|8|$mpiexec_node --allow-run-as-root --oversubscribe --bind-to none -np 8 $(node_app node_8_unbound)"
)
need[node]=0
for j in "${node_plan[@]}"; do IFS='|' read -r _ n _ <<<"$j"; need[node]=$((need[node] + n)); done
# The tests of the test stage, and of the ranks stage (the cuda_ranks_* of tests/dist/train/CMakeLists.txt, labelled
# `ranks`); --tests matches either stage's tests by their own names (issue 41: it composed ^cuda_ranks_.*(RE),
# which a full test name never matched).
test_args=(-L cuda -LE ranks)
ranks_args=(-L ranks)
if [[ -n "$tests_re" ]]; then
  test_args+=(-R "$tests_re")
  ranks_args+=(-R "$tests_re")
fi
train_args=(--model atto --image-size 64 --num-classes 10 --data synthetic --micro-batch 32 --steps 120
  --warmup-steps 10 --lr 2e-3 --eval-every 40 --device cuda --precision bf16 --log "$logs/train_cuda_bf16.jsonl")

if ((dry)); then
  configure_fallback || { say "the fallback build's configure failed: a bare machine would fail the same way"; exit 1; }
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
  # The bundle as the GPU machine will see it, with the system's copies of the packages hidden: its sources,
  # its libraries, its programs starting, two CPU ranks under the prefix's Open MPI, and ctest's cuda tests
  # (which skip here: every test executable and script starts and finds what it names).
  bdir=$build/bundle
  rm -rf "$bdir"
  # Without a bundle the rest is still checked and the plan printed; the dry run then fails at its end.
  no_bundle=0
  if unpack_bundle "$bdir"; then
    say "bundle: $(grep -E '^(commit|made|cuda_tests) ' <<<"$bundle_manifest" | paste -sd';'), $(du -b "$bundle" | cut -f1) bytes"
    check_executables "$bdir" maybe_hidden || exit 1
    if ! maybe_hidden "$prefix/usr/bin/mpiexec.openmpi" --allow-run-as-root --oversubscribe -np 2 \
      "$bdir/apps/convnext_zero" --depths 1,1,1,1 --dims 8,16,24,32 --num-classes 4 --image-size 32 --steps 2 \
      --micro-batch 4 --data synthetic:n=64,eval_n=16,classes=4 --no-progress >"$logs/bundle-mpi.log" 2>&1; then
      say "two CPU ranks under the prefix's mpiexec failed:"
      tail -10 "$logs/bundle-mpi.log" | show
      exit 1
    fi
    say "two CPU ranks under the prefix's mpiexec: $(grep -m1 '^done' "$logs/bundle-mpi.log")"
    rc=0
    maybe_hidden ctest --test-dir "$bdir" -L cuda -j "$jobs" --timeout 120 >"$logs/bundle-ctest.log" 2>&1 || rc=$?
    grep -E "tests passed|tests failed" "$logs/bundle-ctest.log" | show || true
    ran=$(grep -cE "Test +#[0-9]+: " "$logs/bundle-ctest.log" || true)
    listed=$(sed -n 's/^cuda_tests //p' <<<"$bundle_manifest")
    if ((rc != 0)) || ((ran != listed)); then
      grep -E "\*\*\*Failed|Not Run|Could not find" "$logs/bundle-ctest.log" | head -20 | show || true
      say "the bundle's cuda tests: $ran of $listed ran, ctest exit $rc"
      exit 1
    fi
    say "the bundle's $ran cuda tests all start (and skip: no GPU) with the system's copies hidden"
  else
    no_bundle=1
    say "no usable bundle: run scripts/gpu-bundle.sh (or the GPU call builds, which it cannot afford); the bundle's checks are skipped"
    bdir=$build  # the configured fallback build: its ctest files list the add_test tests (not yet GoogleTest's)
  fi
  say "checking the summary tables against made-up results (scripts/gpu_check_summary.py --self-test)"
  "${python_env[@]}" python3 scripts/gpu_check_summary.py --self-test >"$logs/summary-self-test.txt" 2>&1 ||
    { tail -20 "$logs/summary-self-test.txt" | show; exit 1; }
  say "checking the job table against a made-up log and trace (scripts/gpu_job_summary.py --self-test)"
  "${python_env[@]}" python3 scripts/gpu_job_summary.py --self-test >"$logs/job-summary-self-test.txt" 2>&1 ||
    { tail -20 "$logs/job-summary-self-test.txt" | show; exit 1; }
  say "checking the node table against a made-up header, log and trace (scripts/gpu_node_summary.py --self-test)"
  "${python_env[@]}" python3 scripts/gpu_node_summary.py --self-test >"$logs/node-summary-self-test.txt" 2>&1 ||
    { tail -20 "$logs/node-summary-self-test.txt" | show; exit 1; }
  if want node; then
    # The node runs' placement, on this machine's CPUs with CPU ranks (the GPU check's own mpiexec and app):
    # a run's header must name every rank's mask and share, as the summary reads them.
    say "node stage here: 2 CPU ranks under --map-by ppr:2:node:PE=1 --bind-to core name their masks"
    maybe_hidden "$mpiexec_node" --allow-run-as-root --map-by ppr:2:node:PE=1 --bind-to core -np 2 \
      "$bdir/apps/convnext_zero" --depths 1,1,1,1 --dims 8,16,24,32 --image-size 32 --micro-batch 2 --steps 1 \
      --eval-batches 0 --no-progress --device cpu >"$logs/node-dry.log" 2>&1 ||
      { tail -20 "$logs/node-dry.log" | show; say "the node stage's launch failed here"; exit 1; }
    grep -E "^convnext_zero: CPUs of the ranks on this host" "$logs/node-dry.log" | show ||
      { say "the node stage's header line is missing"; exit 1; }
  fi
  "${python_env[@]}" python3 -m py_compile bench/train_step_torch.py scripts/gpu_check_summary.py \
    scripts/gpu_job_summary.py scripts/gpu_node_summary.py
  # The tests each ctest stage would run, as the bundle's ctest files list them: a stage with none fails.
  # (With --tests, a stage may select none, so long as the other selects some.)
  selected=0
  for st in test ranks; do
    want "$st" || continue
    if [[ $st == test ]]; then args=("${test_args[@]}"); else args=("${ranks_args[@]}"); fi
    count=$(ctest --test-dir "$bdir" -N "${args[@]}" | sed -n 's/^Total Tests: //p')
    say "$st stage: ctest ${args[*]} selects ${count:-0} tests"
    selected=$((selected + ${count:-0}))
    [[ -n "$tests_re" ]] || ((${count:-0} > 0)) || { say "$st stage would run no test (a real run fails it)"; exit 1; }
  done
  [[ -z "$tests_re" ]] || ((selected > 0)) || { say "--tests '$tests_re' selects no test (a real run fails)"; exit 1; }
  ((no_bundle)) || [[ -d "$bdir/photos" ]] ||
    say "the bundle has no photos/: the job stage's JPEG folder needs the packages that ship them"
  if want job; then
    [[ -f bench/loader_scaling.py ]] && ls_state="runs" || ls_state="skipped: no bench/loader_scaling.py"
    grep -rqs -- '"--cuda-graphs"' src/dist/train/ && g_state="runs" ||
      g_state="skipped: convnext_zero has no --cuda-graphs"
    say "job stage here: graphs_* $g_state; loader_scaling $ls_state"
  fi
  say "dry run: the plan of a real run ($jobs jobs here; stages: $only; time limit: $( ((limit)) && echo "$limit s" || echo none); times: $TIMES_SEEN):"
  {
    echo "build (needs ${need[build]} s, at most ${cap[build]}): unpack $bundle and check it; else cmake --build -j"
    want test && echo "test (needs ${need[test]} s, at most ${cap[test]}): ctest ${test_args[*]} -j 6 (failures rerun alone)"
    want ranks && echo "ranks (needs ${need[ranks]} s, at most ${cap[ranks]}): ctest ${ranks_args[*]} -j 7"
    for job in "${job_plan[@]}"; do
      IFS='|' read -r name jneed jcap _ cmd <<<"$job"
      want job && want_job "$name" && echo "job $name (needs $jneed s, at most $jcap s): $cmd"
    done
    want job && echo "job: then scripts/gpu_job_summary.py $job_dir (job.md, job.json, also copied into OUT)"
    for job in "${node_plan[@]}"; do
      IFS='|' read -r name jneed jcap _ cmd <<<"$job"
      want node && echo "node $name (needs $jneed s, at most $jcap s): $cmd"
    done
    want node && echo "node: then scripts/gpu_node_summary.py $node_dir (node.md, node.json, also copied into OUT)"
    want train && echo "train (needs ${need[train]} s, at most ${cap[train]}): convnext_zero ${train_args[*]}"
    for job in "${bench_plan[@]}"; do
      IFS='|' read -r st name jneed jcap cmd <<<"$job"
      want "$st" && want_job "$name" && echo "$st $name (needs $jneed s, at most $jcap s): $cmd"
    done
    want sanitize && echo "sanitize (needs ${need[sanitize]} s): compute-sanitizer memcheck (op table, optimizer), racecheck (f32 op table)"
    true  # (pipefail: the group's status is its last command's)
  } | show
  # The budget: the unpacking (~25 s measured) and the NEEDs of the stages asked for, against the limit.
  total=25
  IFS=, read -ra stage_list <<<"$only"
  for st in "${stage_list[@]}"; do [[ -z "$st" ]] || total=$((total + ${need[$st]})); done
  if ((limit > 0)); then
    verdict=$( ((total <= limit - 15)) && echo "fits" || echo "does NOT fit: the stages past the limit are listed at the end of the real run, with the command that runs them")
    say "budget: ~$total s of needs (unpacking 25 + the stages: $only) against --time-limit $limit s (less 15 for packing): $verdict"
  else
    say "budget: ~$total s of needs (unpacking 25 + the stages: $only); no --time-limit given (the device tool's command limit is 600 s: give --time-limit 560)"
  fi
  ((no_bundle == 0)) || { say "dry run FAILED: no usable bundle (scripts/gpu-bundle.sh makes it)"; exit 1; }
  exit 0
fi

# ---- 5. the run ----
{
  nvidia-smi || true
  nvcc --version | tail -2
  grep -h -E "define CUDNN_(MAJOR|MINOR|PATCHLEVEL) " /usr/include/cudnn_version*.h /usr/local/cuda/include/cudnn_version*.h 2>/dev/null | head -3 || true
  "${python_env[@]}" python3 -c 'import torch, timm; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "nccl", torch.cuda.nccl.version(), "timm", timm.__version__)' || true
  nproc
  lscpu  # threads per core: whether a loader thread can share a core with the thread that launches kernels
} >"$logs/env.txt" 2>&1
say "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
status=0
tests_matched=0
begin build
build_how=""
if unpack_bundle "$build" && check_executables "$build"; then
  build_how="bundle ($(sed -n 's/^commit //p' <<<"$bundle_manifest"))"
  end build "ok: bundle unpacked and checked"
else
  [[ "$bundle_state" != ok ]] || say "the bundle does not run here: building instead"
  configure_fallback || { end build "configure failed"; exit 1; }
  say "building everything with $jobs jobs"
  if ! capped "${cap[build]}" cmake --build "$build" -j "$jobs" >"$logs/build.log" 2>&1; then
    grep -E "error|FAILED" "$logs/build.log" | head -40 | show || true
    end build "failed or out of time"
    exit 1
  fi
  resolve_libs "$build/apps/convnext_zero" "$build/tests/tensor/test_cuda"
  [[ ! -s "$logs/missing-libs.txt" ]] || { say "shared libraries not found:"; show <"$logs/missing-libs.txt"; status=1; }
  build_how="built here"
  end build "ok: built here"
fi
# The job stage's JPEG folder, made while the test stages run (one core; ~10 ms an image). The photographs come
# with the bundle (the GPU machine lacks the packages that ship them); without a bundle, from the packages.
gen_pid=""
if { want job && want_job folder_b$fb; } || want node; then
  mkdir -p "$job_dir"
  rm -rf "$job_data"
  photos=()
  [[ -d "$build/photos" ]] && photos=(--photos "$build/photos")
  ("${python_env[@]}" python3 tools/make_imagenet_like.py "$job_data" --classes 10 --per-class 200 "${photos[@]}" \
    >"$job_dir/make_imagenet_like.log" 2>&1) &
  gen_pid=$!
fi

# run_ctest STAGE ARGS...: ctest over the build, JOBS at a time (from $ctest_jobs), failures rerun alone (a
# failure caused by the sharing of the GPU is told apart from a real one).
run_ctest() {
  local st=$1 rc=0 listed
  shift
  # --tests picks tests of either stage: a stage it selects none of is not run (4); --tests that selects none
  # of either fails the call (after the ranks stage).
  if [[ -n "$tests_re" ]]; then
    listed=$(ctest --test-dir "$build" -N "$@" | sed -n 's/^Total Tests: //p')
    if ((${listed:-0} == 0)); then
      say "$st: no test of this stage matches --tests '$tests_re'"
      return 4
    fi
    tests_matched=1
  fi
  capped "${cap[$st]}" ctest --test-dir "$build" "$@" --output-on-failure --timeout 150 -j "$ctest_jobs" \
    >"$logs/ctest-$st.log" 2>&1 || rc=$?
  # ctest's own log holds every test's output, passed ones too: the rank tests' largest differences
  # ("maxdiff") come from tests that pass (the first GPU runs kept only the failures' output).
  cp "$build/Testing/Temporary/LastTest.log" "$logs/ctest-$st-full.log" 2>/dev/null || true
  ((rc == 124)) && { say "$st: ctest cut off by the time limit"; not_run+=("$st"); }
  # A stage that ran no test did not pass (issue 41: a --tests that matched nothing reported "passed").
  if ((rc != 124)) && ! grep -qE "Test +#[0-9]+: " "$logs/ctest-$st.log"; then
    say "$st: no test ran: ctest $* matched none in $build (see ctest-$st.log)"
    status=1
    return 3
  fi
  grep -E "tests passed|tests failed|Total Test time" "$logs/ctest-$st.log" | show || true
  skipped=$(grep -c "\*\*\*Skipped" "$logs/ctest-$st.log" || true)
  ((skipped == 0)) || say "$skipped of them skipped (a test skips when it sees no GPU): see ctest-$st.log"
  grep -h "^maxdiff " "$logs/ctest-$st-full.log" 2>/dev/null | sort -u | show || true
  # The CUDA plan's rows, planned against measured (tests/dist/plan/run_cuda_plan_rows.sh; docs/planning.md).
  grep -h "^plan row " "$logs/ctest-$st-full.log" 2>/dev/null | sort -u | show || true
  if ((rc != 0 && rc != 124)); then
    grep -E "\(Failed\)|\(SEGFAULT\)|\(Timeout\)|Not Run|Subprocess aborted" "$logs/ctest-$st.log" | show || true
    say "the failed tests again, one at a time"
    capped 150 ctest --test-dir "$build" --rerun-failed --output-on-failure --timeout 120 -j 1 \
      >"$logs/ctest-$st-rerun.log" 2>&1 || status=1
    grep -E "tests passed|tests failed|\(Failed\)|\(SEGFAULT\)|\(Timeout\)" "$logs/ctest-$st-rerun.log" | show || true
  fi
  return $rc
}

# ---- test: every cuda test but the rank tests ----
if begin test; then
  ctest_jobs=6
  rc=0
  run_ctest test "${test_args[@]}" || rc=$?
  case $rc in
    0) end test passed ;; 3) end test "failed: no test ran" ;; 4) end test "none matches --tests" ;;
    *) end test "failures (see above)" ;;
  esac
fi

# ---- ranks: several ranks on one GPU over the MPI backend; NCCL at one rank ----
if begin ranks; then
  ctest_jobs=7  # the cases side by side: the GPU has room for their ~30 processes, the 16 cores for their ranks
  result=passed rc=0
  run_ctest ranks "${ranks_args[@]}" || rc=$?
  case $rc in 0) ;; 3) result="failed: no test ran" ;; 4) result="none matches --tests" ;; *) result="failures (see above)" ;; esac
  # What the MPI backend's staging costs (Note [Choosing the comm backend]): the same all-reduce between 2 ranks
  # on CUDA buffers (staged through pinned host memory) and on host buffers.
  for dev in cuda cpu; do
    capped 40 "$prefix/usr/bin/mpiexec.openmpi" --allow-run-as-root --oversubscribe -np 2 "$build/apps/commbench" \
      -o all_reduce --device $dev --backend mpi --impl ring -b 1M -e 64M -f 4 -n 10 -w 3 \
      >"$logs/commbench-mpi-$dev.txt" 2>&1 || say "commbench on $dev buffers failed (commbench-mpi-$dev.txt)"
    say "MPI backend, 2 ranks, all-reduce on $dev buffers:"
    grep -E "^ *[0-9]+ " "$logs/commbench-mpi-$dev.txt" | tail -4 | show || true
  done
  end ranks "$result"
fi

if [[ -n "$tests_re" ]] && { want test || want ranks; } && ((!tests_matched)); then
  say "--tests '$tests_re' matches no test of the test or ranks stage"
  status=1
fi

# ---- job: the app beside its step (Note [The job stage]) ----
if begin job; then
  mkdir -p "$job_dir"
  : >"$job_dir/runs.tsv"
  result=ok
  has_graphs=0
  # Not `--help | grep -q`: grep's early exit ends the app with SIGPIPE, and pipefail then reads "no flag".
  [[ "$("$app" --help 2>&1)" == *--cuda-graphs* ]] && has_graphs=1
  ((has_graphs)) || say "convnext_zero has no --cuda-graphs: the graphs_* runs are skipped"
  for job in "${job_plan[@]}"; do
    IFS='|' read -r name jneed jcap batch cmd <<<"$job"
    want_job "$name" || continue
    trace=-
    [[ "$cmd" == *--trace* ]] && trace=$job_dir/$name.trace.json
    row() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$batch" "$job_dir/step_b$batch.json" "$job_dir/$name.jsonl" \
      "$trace" "$1" >>"$job_dir/runs.tsv"; }
    case $name in
      graphs_*) ((has_graphs)) || { row "skipped: convnext_zero has no --cuda-graphs"; continue; } ;;
      loader_scaling)
        if [[ ! -f bench/loader_scaling.py ]]; then
          say "loader_scaling: skipped: no bench/loader_scaling.py"
          continue
        fi ;;
    esac
    if [[ $name == folder_* || $name == loader_scaling ]]; then
      gen_rc=0
      [[ -z "$gen_pid" ]] || wait "$gen_pid" || gen_rc=$?
      gen_pid=""
      if ((gen_rc != 0)) || [[ ! -d "$job_data" ]]; then
        why="skipped: tools/make_imagenet_like.py failed: $(tail -1 "$job_dir/make_imagenet_like.log" 2>/dev/null)"
        say "$name: $why"
        [[ $name == folder_* ]] && row "$why"
        continue
      fi
      [[ $name == folder_* ]] && say "$(tail -1 "$job_dir/make_imagenet_like.log")"
    fi
    if ! fits "job:$name" "$jneed"; then
      [[ $name == step_* || $name == loader_scaling ]] || row "not run: out of time"
      result="some not run"
      continue
    fi
    # shellcheck disable=SC2086  # the plan's commands are plain words
    run_planned job "$name" "$jcap" "$job_dir/$name.txt" $cmd
    case $name in
      step_*) grep -E "^bench_train_step: convnext" "$job_dir/$name.txt" | show || true ;;
      loader_scaling) head -20 "$job_dir/loader_scaling.csv" 2>/dev/null | show || true ;;
      *)
        row "$state"
        # The threads each rank took (Note [CPU threads on a CUDA rank]) and the run's end.
        [[ $name == synthetic_b${bs[0]} || $name == *_old_threads ]] &&
          { grep -E "^convnext_zero: (OpenMP waits|CPU threads)" "$job_dir/$name.txt" | show || true; }
        grep -E "^done:" "$job_dir/$name.txt" | cut -c1-160 | show || true ;;
    esac
  done
  "${python_env[@]}" python3 scripts/gpu_job_summary.py "$job_dir" 2>&1 | show || { status=1; result="summary failed"; }
  end job "$result"
fi

# ---- node: a node's ranks on one GPU, bound and unbound (Note [The node stage]) ----
if begin node; then
  mkdir -p "$node_dir"
  : >"$node_dir/runs.tsv"
  result=ok
  gen_rc=0
  [[ -z "$gen_pid" ]] || wait "$gen_pid" || gen_rc=$?
  gen_pid=""
  if ((gen_rc != 0)) || [[ ! -d "$job_data" ]]; then
    result="skipped: tools/make_imagenet_like.py failed"
  else
    for job in "${node_plan[@]}"; do
      IFS='|' read -r name jneed jcap ranks cmd <<<"$job"
      if ! fits "node:$name" "$jneed"; then
        printf '%s\t%s\t-\t-\t-\t%s\n' "$name" "$ranks" "not run: out of time" >>"$node_dir/runs.tsv"
        result="some not run"
        continue
      fi
      # shellcheck disable=SC2086  # the plan's commands are plain words
      run_planned node "$name" "$jcap" "$node_dir/$name.txt" $cmd
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$ranks" "$node_dir/$name.txt" "$node_dir/$name.jsonl" \
        "$node_dir/$name.trace.json" "$state" >>"$node_dir/runs.tsv"
      grep -E "^convnext_zero: (CPU threads|CPUs of the ranks)|warning: the loader|^done:" "$node_dir/$name.txt" |
        cut -c1-400 | show || true
    done
    "${python_env[@]}" python3 scripts/gpu_node_summary.py "$node_dir" 2>&1 | show ||
      { status=1; result="summary failed"; }
  fi
  end node "$result"
fi

# ---- train: the main job's short run on the GPU, bf16 ----
if begin train; then
  if capped "${cap[train]}" "$build/apps/convnext_zero" "${train_args[@]}" >"$logs/train_cuda_bf16.log" 2>&1; then
    "${python_env[@]}" python3 - "$logs/train_cuda_bf16.jsonl" <<'PY' | show || status=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
train = [r for r in rows if "loss" in r and r.get("split", "train") == "train"]
evals = [r for r in rows if r.get("split") == "eval"]
print(f"train loss {train[0]['loss']:.4f} (step {train[0].get('step')}) -> {train[-1]['loss']:.4f} "
      f"(step {train[-1].get('step')}); last eval {evals[-1] if evals else 'none'}")
PY
    grep -E "^done" "$logs/train_cuda_bf16.log" | show || true
    end train ok
  else
    status=1
    tail -5 "$logs/train_cuda_bf16.log" | show
    end train failed
  fi
fi

# ---- eager, compile, switches: ours against PyTorch, and our own paths ----
if want eager || want compile || want switches; then
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
fi
for st in eager compile switches; do
  begin "$st" || continue
  result=ok
  for job in "${bench_plan[@]}"; do
    IFS='|' read -r jst name jneed jcap cmd <<<"$job"
    [[ "$jst" == "$st" ]] && want_job "$name" || continue
    [[ "$cmd" == *python3* ]] && ! ((have_torch)) && continue
    fits "$st:$name" "$jneed" || continue
    say "bench $name"
    rc=0
    cmd=${cmd//@PEAK32@/$peak32}
    cmd=${cmd//@GBPS@/$gbps}
    # shellcheck disable=SC2086  # the plan's commands are plain words
    capped "$jcap" ${cmd//@PEAK@/$peak} >"$logs/$name.txt" 2>&1 || rc=$?
    grep -E "^(bench_train_step: (convnext|MFU)|train_step_torch: convnext|\[gemm (path|time)\]|\[depthwise\])" "$logs/$name.txt" |
      show || true
    if ((rc == 124)); then
      say "$name: cut off after its $jcap s (or the time limit)"
      not_run+=("$st:$name")
      result="some cut off"
    elif ((rc != 0)); then
      status=1
      result="some failed"
      tail -5 "$logs/$name.txt" | show
    fi
  done
  end "$st" "$result"
done

# ---- sanitize: compute-sanitizer ----
if want sanitize && ! command -v compute-sanitizer >/dev/null; then
  say "compute-sanitizer not found: sanitize not run"
elif begin sanitize; then
  say "compute-sanitizer memcheck: op table (f32, bf16), ConvNeXt-shape ops, optimizer kernels; racecheck"
  # Each run is capped (a sanitizer slows kernels 10-100x); a cap that is hit shows as "cut off" below
  # rather than as a silent pass.
  sanitize() {  # LOG TOOL TEST [FILTER]
    local log=$1 tool=$2 test=$3 filter=${4:-*} rc=0
    fits "sanitize:$log" 40 || return 0
    capped "${cap[sanitize]}" compute-sanitizer --tool "$tool" --error-exitcode 9 "$test" --gtest_filter="$filter" \
      >"$logs/$log" 2>&1 || rc=$?
    ((rc == 124)) && say "$log: cut off after ${cap[sanitize]} s (or the time limit)"
    ((rc == 0)) || status=1
  }
  sanitize memcheck-tensor.log memcheck "$build/tests/tensor/test_cuda" 'All/OpTableCuda.*:CudaOps.*'
  sanitize memcheck-optim.log memcheck "$build/tests/optim/test_optim_cuda"
  sanitize racecheck-tensor.log racecheck "$build/tests/tensor/test_cuda" 'All/OpTableCuda.F32*'
  grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$logs"/memcheck-*.log "$logs"/racecheck-*.log 2>/dev/null | show || true
  end sanitize done
fi

# ---- the tables, and what is left for another call ----
echo | show
say "stages ($build_how; times: seconds of this call):"
printf '%s\n' "${stage_rows[@]}" | awk -F'|' '{ printf "   %-9s %6s s  %s\n", $1, $2, $3 }' | show
if compgen -G "$logs/*.json" >/dev/null; then
  echo | show
  "${python_env[@]}" python3 scripts/gpu_check_summary.py --peak-tflops "${peak:-0}" "$logs" 2>&1 | show || status=1
fi
if ((${#not_run[@]})); then
  stages=() jobs_left=()
  for item in "${not_run[@]}"; do
    stage=${item%%:*}
    [[ " ${stages[*]} " == *" $stage "* ]] || stages+=("$stage")
    [[ "$item" == *:* && "$stage" != sanitize ]] && jobs_left+=("${item#*:}")
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
