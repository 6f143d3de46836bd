#!/usr/bin/env bash
# First run on a bare GPU machine (CUDA 13, cuDNN, NCCL, CMake, ninja, PyTorch + timm; no -dev packages, no
# network): unpacks the Debian packages scripts/gpu-deps.sh downloaded into a private prefix (never into /),
# builds Release with CUDA against it, runs `ctest -L cuda` (plus compute-sanitizer memcheck on the op table
# and optimizer tests), trains convnext_atto briefly on synthetic data (bf16), and times a ConvNeXt training
# step (bf16, 224 px) against PyTorch eager timm (channels_last + autocast bf16) at the same batch. Everything
# is written to OUT.
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
#     --dry-run        unpack, configure (CZ_WITH_CUDA=ON) and check that every dependency CMake found lies in
#                      the prefix, then stop: what can be checked on a machine without a GPU
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
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
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
jobs=$(nproc)
want() { [[ ",$only," == *",$1,"* ]]; }
targets=(test_cuda test_optim_cuda test_nn_cuda test_trainer_cuda bench_train_step convnext_zero)

# ---- 1. the dependency prefix ----
compgen -G "$deps/*.deb" >/dev/null || { echo "gpu-check: no .deb files in $deps (run scripts/gpu-deps.sh)" >&2; exit 1; }
prefix=$build/deps-prefix
# Unpacked again only when the package set changed: fresh header mtimes would make ninja rebuild everything.
stamp=$(ls -l "$deps"/*.deb | md5sum | cut -d' ' -f1)
if [[ "$(cat "$prefix/.stamp" 2>/dev/null)" != "$stamp" ]]; then
  rm -rf "$prefix"
  mkdir -p "$prefix"
  for deb in "$deps"/*.deb; do dpkg -x "$deb" "$prefix"; done
  mapfile -t libdirs < <(find "$prefix" -name '*.so*' -printf '%h\n' | sort -u)
  # SONAME links the packages' alternatives would have made (libpsm_infinipath.so.1).
  "$(command -v ldconfig || echo /sbin/ldconfig)" -n "${libdirs[@]}"
  echo "$stamp" >"$prefix/.stamp"
fi
mapfile -t libdirs < <(find "$prefix" -name '*.so*' -printf '%h\n' | sort -u)
multi=$prefix/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
export LD_LIBRARY_PATH=$(IFS=:; echo "${libdirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OPAL_PREFIX=$prefix/usr  # Open MPI finds its help files and components relative to this
export PATH=$prefix/usr/bin:$PATH
# pkg-config (FindMPI asks it) sees only the prefix's .pc files, their /usr paths moved into the prefix.
export PKG_CONFIG_LIBDIR=$multi/pkgconfig:$prefix/usr/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=$prefix
say "unpacked $(ls "$deps"/*.deb | wc -l) packages into $prefix"

# ---- 2. configure ----
# Paths Debian's packages would normally find under /usr (the OpenMP OpenBLAS, HDF5's serial flavour, Open MPI
# without its compiler wrapper, which lives in openmpi-bin) are given explicitly; the CMake config packages
# (fmt, GTest, benchmark, nlohmann_json, CLI11, libjpeg-turbo) are found through CMAKE_PREFIX_PATH.
cmake_args=(
  -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCZ_WITH_CUDA=ON
  -DCMAKE_PREFIX_PATH="$prefix/usr" -DCMAKE_INCLUDE_PATH="$prefix/usr/include" -DCMAKE_LIBRARY_PATH="$multi"
  -DCZ_CBLAS_INCLUDE="$prefix/usr/include/$(basename "$multi")/openblas-openmp"
  -DCZ_OPENBLAS_LIB="$multi/openblas-openmp/libopenblas.so"
  -DHDF5_ROOT="$multi/hdf5/serial"
  -DMPI_SKIP_COMPILER_WRAPPER=ON -DMPI_C_HEADER_DIR="$multi/openmpi/include" -DMPI_C_LIB_NAMES=mpi
  -DMPI_mpi_LIBRARY="$multi/openmpi/lib/libmpi.so"
)
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
cmake "${cmake_args[@]}" >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
grep -E "CUDA backend|CUDA compiler identification|cuDNN" "$out/configure.log" | tee -a "$summary" || true

# Every dependency CMake resolved must come from the prefix, CUDA's own libraries excepted: on the bare machine
# nothing else exists.
outside=$(grep -E '^(fmt|nlohmann_json|CLI11|GTest|benchmark|libjpeg-turbo)_DIR:|^(PNG_LIBRARY_RELEASE|PNG_PNG_INCLUDE_DIR|HDF5_C_INCLUDE_DIR|HDF5_hdf5_LIBRARY_RELEASE|MPI_mpi_LIBRARY|MPI_C_HEADER_DIR|CZ_CBLAS_INCLUDE|CZ_OPENBLAS_LIB):' \
  "$build/CMakeCache.txt" | grep -v "=$prefix" || true)
if [[ -n "$outside" ]]; then
  say "dependencies found outside the prefix (they would be missing on a bare machine):"
  echo "$outside" | tee -a "$summary"
  exit 1
fi
say "every dependency resolves inside the prefix"
if ((dry)); then
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
