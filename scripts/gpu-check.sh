#!/usr/bin/env bash
# First run on a bare GPU machine (CUDA 13, cuDNN, NCCL, CMake, ninja, PyTorch + timm; no -dev packages, no
# network): unpacks the Debian packages scripts/gpu-deps.sh downloaded into a private prefix (never into /) and
# points their CMake and pkg-config files into it, builds Release with CUDA against it, runs `ctest -L cuda`
# (plus compute-sanitizer memcheck on the op table and optimizer tests), trains convnext_atto briefly on
# synthetic data (bf16), and times a ConvNeXt training step (bf16, 224 px) against PyTorch eager timm
# (channels_last + autocast bf16) at the same batch. Everything is written to OUT.
#
#   scripts/gpu-check.sh [options] [OUT]        OUT defaults to $OUT, else ./gpu-check-out
#     --deps DIR       the .deb folder (default .deps)           --build DIR   build folder (default build-gpu)
#     --model NAME     ConvNeXt variant (default tiny)           --batch N[,N] batch sizes to time (default 64,128)
#     --image PX       image size (default 224)                  --steps N     timed steps (default 20)
#     --no-sanitize    skip compute-sanitizer                    --no-bench    skip the timing comparison
#     --peak-tflops T  the GPU's dense bf16 peak, for the MFU (default: from the GPU's name: H100 SXM/H200 989,
#                      H100 NVL 835, H100 PCIe 756; unknown names print no MFU)
#     --only STAGES    comma list of build,test,sanitize,train,bench (default all): for callers limited to ~10
#                      minutes a command (--only build; --only test; --only sanitize; --only train,bench);
#                      the prefix and build folder are reused between calls
#     --dry-run        what a machine without a GPU can check: unpack, configure, and build and run a program
#                      using every dependency, with the system's copies of the packages hidden; scan the
#                      configured build for paths outside the prefix; then stop
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

deps=.deps build=build-gpu model=tiny batches=64,128 image=224 steps=20 sanitize=1 bench=1 dry=0 out="" peak=""
only=build,test,sanitize,train,bench
while (($#)); do
  case "$1" in
    --deps) deps=$2; shift ;;
    --build) build=$2; shift ;;
    --model) model=$2; shift ;;
    --batch) batches=$2; shift ;;
    --image) image=$2; shift ;;
    --steps) steps=$2; shift ;;
    --no-sanitize) sanitize=0 ;;
    --no-bench) bench=0 ;;
    --peak-tflops) peak=$2; shift ;;
    --dry-run) dry=1 ;;
    --only) only=$2; shift ;;
    -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
    -*) echo "gpu-check: unknown option $1" >&2; exit 2 ;;
    *) out=$1 ;;
  esac
  shift
done
out=${out:-${OUT:-gpu-check-out}}
mkdir -p "$out" "$build"
out=$(cd "$out" && pwd)
build=$(cd "$build" && pwd)
summary=$out/summary.txt
: >"$summary"
say() { echo "== $*" | tee -a "$summary"; }
show() { tee -a "$summary"; }
jobs=$(nproc)
want() { [[ ",$only," == *",$1,"* ]]; }
targets=(test_cuda test_optim_cuda test_nn_cuda test_trainer_cuda bench_train_step convnext_zero)

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
  elif hidden test ! -e "/$(head -1 "$hide_list" | sed 's,^,usr/,')" 2>"$out/hide.log"; then
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
# cuDNN and NCCL normally sit beside CUDA or in /usr; if not, fall back to PyTorch's pip wheels.
for lib in cudnn nccl; do
  hdr=$([[ $lib == cudnn ]] && echo cudnn_version.h || echo nccl.h)
  compgen -G "/usr/local/cuda/include/$hdr" >/dev/null || compgen -G "/usr/include/$hdr" >/dev/null ||
    compgen -G "/usr/include/*/$hdr" >/dev/null && continue
  root=$(python3 -c "import nvidia.$lib as m; print(list(m.__path__)[0])" 2>/dev/null) || continue
  say "$lib from the Python wheel at $root"
  cmake_args+=("-DCZ_${lib^^}_ROOT=$root")
  export LD_LIBRARY_PATH=$root/lib:$LD_LIBRARY_PATH
done
say "configuring $build"
if ! maybe_hidden cmake "${cmake_args[@]}" >"$out/configure.log" 2>&1; then
  say "configure failed:"
  tail -40 "$out/configure.log" | show
  exit 1
fi
grep -E "CUDA backend|CUDA compiler identification|cuDNN" "$out/configure.log" | show || true

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

if ((dry)); then
  say "building and running a program that uses every dependency ($build/deps-probe)"
  probe=$build/deps-probe
  rm -rf "$probe"
  probe_ok=1
  if maybe_hidden cmake -S "$repo/scripts/deps-probe" -B "$probe" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    "${dep_args[@]}" >"$out/probe.log" 2>&1 && maybe_hidden cmake --build "$probe" >>"$out/probe.log" 2>&1 &&
    maybe_hidden "$probe/deps_probe" 2>&1 | tee -a "$out/probe.log" | show; then
    probe_outside=$(outside_paths "$probe")
    unresolved=$(maybe_hidden ldd "$probe/deps_probe" | grep "not found" || true)
    if [[ -n "$probe_outside$unresolved" ]]; then
      probe_ok=0
      echo "$probe_outside$unresolved" | show
    fi
  else
    probe_ok=0
    tail -30 "$out/probe.log" | show
  fi
  ((probe_ok)) || { say "the dependency probe failed: a bare machine would fail the same way"; exit 1; }
  say "dry run: would now build ${targets[*]} with $jobs jobs, run ctest -L cuda, compute-sanitizer"
  say "(${sanitize}), a short bf16 training run, and time $model at batch $batches, $image px (bench ${bench})"
  exit 0
fi

# ---- 3. build and test ----
{
  nvidia-smi || true
  nvcc --version | tail -2
  grep -h -E "define CUDNN_(MAJOR|MINOR|PATCHLEVEL) " /usr/include/cudnn_version*.h /usr/local/cuda/include/cudnn_version*.h 2>/dev/null | head -3 || true
  python3 -c 'import torch, timm; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "timm", timm.__version__)' || true
} >"$out/env.txt" 2>&1
say "building ${targets[*]} with $jobs jobs"
if ! cmake --build "$build" -j "$jobs" --target "${targets[@]}" >"$out/build.log" 2>&1; then
  grep -E "error|FAILED" "$out/build.log" | head -40 | tee -a "$summary" || true
  exit 1
fi
grep -i "warning" "$out/build.log" | head -20 >"$out/build-warnings.txt" || true
say "build ok ($(wc -l <"$out/build-warnings.txt") warning lines)"
missing_libs=$(ldd "$build/tests/tensor/test_cuda" "$build/tests/optim/test_optim_cuda" "$build/apps/convnext_zero" \
  "$build/bench/bench_train_step" 2>&1 | grep "not found" | sort -u || true)
[[ -z "$missing_libs" ]] || { say "shared libraries not found:"; echo "$missing_libs" | tee -a "$summary"; }
want build && [[ "$only" == build ]] && exit 0

status=0
if want test; then
  say "ctest -L cuda"
  ctest --test-dir "$build" -L cuda --output-on-failure --timeout 240 -j 1 >"$out/ctest.log" 2>&1 || status=1
  grep -E "tests passed|tests failed|Total Test time" "$out/ctest.log" | tee -a "$summary" || true
  grep -E "\(Failed\)|\(SEGFAULT\)|\(Timeout\)|Not Run" "$out/ctest.log" | tee -a "$summary" || true
  grep -E "Skipped" "$out/ctest.log" | head -5 | tee -a "$summary" || true
fi

if want sanitize && ((sanitize)) && command -v compute-sanitizer >/dev/null; then
  say "compute-sanitizer memcheck: op table (f32, bf16), ConvNeXt-shape ops, optimizer kernels"
  # Each run is capped (a sanitizer slows kernels 10-100x) so the stage fits a 10-minute command; a cap that
  # is hit shows as "timed out" below rather than as a silent pass.
  sanitize() {  # LOG TOOL TEST [FILTER]
    local log=$1 tool=$2 test=$3 filter=${4:-*}
    local rc=0
    timeout 170 compute-sanitizer --tool "$tool" --error-exitcode 9 "$test" --gtest_filter="$filter" \
      >"$out/$log" 2>&1 || rc=$?
    if ((rc == 124)); then say "$log: timed out after 170 s"; fi
    if ((rc != 0)); then status=1; fi
  }
  sanitize memcheck-tensor.log memcheck "$build/tests/tensor/test_cuda" 'All/OpTableCuda.*:CudaOps.*'
  sanitize memcheck-optim.log memcheck "$build/tests/optim/test_optim_cuda"
  sanitize racecheck-tensor.log racecheck "$build/tests/tensor/test_cuda" 'All/OpTableCuda.F32*'
  grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$out"/memcheck-*.log "$out"/racecheck-*.log | tee -a "$summary" || true
fi

# ---- 4. end to end: the main job's short run on the GPU, bf16 ----
train_args=(--model atto --image-size 64 --num-classes 10 --data synthetic --micro-batch 32 --steps 120
  --warmup-steps 10 --lr 2e-3 --eval-every 40 --device cuda --precision bf16 --log "$out/train_cuda_bf16.jsonl")
if want train; then
  say "training convnext_atto on synthetic data on the GPU (bf16, 120 steps)"
  if "$build/apps/convnext_zero" "${train_args[@]}" >"$out/train_cuda_bf16.log" 2>&1; then
    python3 - "$out/train_cuda_bf16.jsonl" <<'PY' | tee -a "$summary" || status=1
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
train = [r for r in rows if "loss" in r and r.get("split", "train") == "train"]
evals = [r for r in rows if r.get("split") == "eval"]
print(f"train loss {train[0]['loss']:.4f} (step {train[0].get('step')}) -> {train[-1]['loss']:.4f} "
      f"(step {train[-1].get('step')}); last eval {evals[-1] if evals else 'none'}")
PY
  else
    status=1
    tail -5 "$out/train_cuda_bf16.log" | tee -a "$summary"
  fi
fi

# ---- 5. ours vs PyTorch eager ----
if want bench && ((bench)); then
  have_torch=1
  python3 -c 'import torch, timm; assert torch.cuda.is_available()' 2>/dev/null || have_torch=0
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
  say "bf16 peak for the MFU: ${peak} TFLOP/s (0: unknown GPU, no MFU)"
  IFS=, read -ra bs <<<"$batches"
  for b in "${bs[@]}"; do
    say "training step: convnext_$model bf16 ${image}px batch $b"
    # The timed steps come first; the 5 profiled steps after them (slower) give the per-op breakdown.
    "$build/bench/bench_train_step" --model "$model" --device cuda --dtype bf16 --batch "$b" --image "$image" \
      --warmup 5 --steps "$steps" --peak-tflops "$peak" --profile 5 --json "$out/ours_b$b.json" 2>&1 |
      tee -a "$out/bench.log" >"$out/ours_b$b.txt" || status=1
    grep -E "^bench_train_step" "$out/ours_b$b.txt" | tee -a "$summary" || true
    if ((have_torch)); then
      python3 bench/train_step_torch.py --model "$model" --device cuda --dtype bf16 --batch "$b" --image "$image" \
        --warmup 5 --steps "$steps" --profile 5 --json "$out/torch_b$b.json" 2>&1 | tee -a "$out/bench.log" |
        tee "$out/torch_b$b.txt" | grep -E "^train_step_torch: convnext" | tee -a "$summary" || status=1
    else
      say "PyTorch with CUDA and timm not importable: no peer figure"
    fi
  done
  # Each of our own paths in place of the library's, once, at the first batch size; which is faster decides
  # the default: the direct depthwise kernels instead of cuDNN's; plain GEMMs plus our bias kernels instead of
  # cuBLASLt's epilogues (does BGRADB keep split-K for the tall weight-gradient GEMMs, K = batch x pixels?);
  # the stem and downsamplings as one GEMM over their patches instead of cuDNN (Note [Patchify as a GEMM]).
  for variant in --depthwise-direct --no-gemm-epilogues --patchify-gemm; do
    say "training step with $variant, batch ${bs[0]}"
    "$build/bench/bench_train_step" --model "$model" --device cuda --dtype bf16 --batch "${bs[0]}" \
      --image "$image" --warmup 5 --steps "$steps" "$variant" --json "$out/${variant#--}_b${bs[0]}.json" 2>&1 |
      tee -a "$out/bench.log" | tee -a "$summary" || status=1
  done
  python3 - "$out" "$peak" <<'PY' | tee -a "$summary" || status=1
import glob, json, os, sys
out = sys.argv[1]
peak = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
mfu = lambda r, f: f"{100 * r['img_per_s'] * f / 1e12 / peak:.1f}%" if peak > 0 and r else "-"
print(f"{'batch':>6} {'ours img/s':>11} {'torch img/s':>12} {'ours/torch':>11} {'ours MFU':>9} {'torch MFU':>10} "
      f"{'ours GiB':>9} {'torch GiB':>10}")
for path in sorted(glob.glob(os.path.join(out, "ours_b*.json")), key=lambda p: int(p.split("_b")[-1][:-5])):
    b = path.split("_b")[-1][:-5]
    ours = json.load(open(path))
    tp = os.path.join(out, f"torch_b{b}.json")
    torch = json.load(open(tp)) if os.path.exists(tp) else None
    ratio = f"{ours['img_per_s'] / torch['img_per_s']:.3f}" if torch else "-"
    flop = ours["train_flop_per_img"]  # the same model and image size on both sides
    print(f"{b:>6} {ours['img_per_s']:>11.1f} {torch['img_per_s'] if torch else float('nan'):>12.1f} {ratio:>11} "
          f"{mfu(ours, flop):>9} {mfu(torch, flop):>10} "
          f"{ours['peak_gib']:>9.2f} {torch['peak_gib'] if torch else float('nan'):>10.2f}")
    ops = ours.get("ops", [])
    if ops:
        total = ours["profiled_ms_per_step"]
        print(f"  where our step goes at batch {b} (profiled: {total:.2f} ms/step, top 12):")
        for o in ops[:12]:
            print(f"    {o['name']:<28} {o['calls_per_step']:>6.1f} calls {o['ms_per_step']:>9.3f} ms "
                  f"{100 * o['ms_per_step'] / total:>5.1f}%")
PY
fi
say "done (status $status); results in $out"
exit $status
