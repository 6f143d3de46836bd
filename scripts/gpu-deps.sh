#!/usr/bin/env bash
# Downloads (never installs) the Debian packages a bare GPU machine lacks to build and test convnext_zero —
# the -dev packages of cmake/Dependencies.cmake and every shared library they pull in that is not part of a
# minimal base system — into a folder that scripts/gpu-check.sh unpacks with `dpkg -x` (default .deps/).
#
#   scripts/gpu-deps.sh [DIR] [--runtime RDIR]
#
# --runtime RDIR also copies into RDIR the packages a run from the prebuilt bundle needs (all but the -dev
# packages and protoc): DIR with them is 54 MiB since issue 43's GEMM libraries, which with the bundle and the
# working tree passes the device tool's 64 MiB; RDIR (36 MiB) does not. `scripts/gpu-check.sh --deps RDIR` then
# runs every stage from the bundle, but cannot build here if the bundle does not match.
#
# The list is closed by testing, not by apt's Depends (which drag in Fortran compilers, docs and -dev trees we
# do not use): the packages are unpacked into a scratch prefix, every shared object in it is run through ldd
# with the prefix first on LD_LIBRARY_PATH, and each library still resolved outside the prefix is mapped back to
# its package (dpkg -S) and downloaded too, until nothing outside the prefix and the base set is needed.
set -euo pipefail

dir=.deps runtime=""
while (($#)); do
  case "$1" in
    --runtime) runtime=$2; shift ;;
    -*) echo "gpu-deps: unknown option $1" >&2; exit 2 ;;
    *) dir=$1 ;;
  esac
  shift
done
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

# What the build needs directly (headers, CMake configs, link-time libraries).
wanted=(
  libopenblas-openmp-dev libopenblas0-openmp
  libdnnl-dev libdnnl2 libblis-openmp-dev libblis4-openmp libxsmm-dev  # the other CPU GEMM libraries (issue 43)
  libopenmpi-dev libopenmpi3 openmpi-common openmpi-bin
  libhdf5-dev libhdf5-103-1
  libgtest-dev libgmock-dev
  libbenchmark-dev libbenchmark1debian
  libfmt-dev libfmt9
  nlohmann-json3-dev libcli11-dev
  libturbojpeg0-dev libturbojpeg0 libjpeg62-turbo-dev libjpeg62-turbo
  libpng-dev libpng16-16
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 protobuf-compiler libprotoc32  # --tensorboard's messages
  zlib1g-dev zlib1g  # FindPNG needs zlib.h and libz.so; the runtime too, or the prefix's libz.so dangles
)
# Assumed on any machine that runs nvcc and PyTorch: the C/C++ runtimes and the compiler's OpenMP and zlib (whose
# runtime is downloaded anyway, above, for the -dev package's libz.so to point at).
base=(libc6 libgcc-s1 libstdc++6 libgomp1 zlib1g)

arch=$(dpkg --print-architecture)
have_deb() { compgen -G "$dir/${1}_*.deb" >/dev/null; }

fetch() {
  local todo=()
  for p in "$@"; do have_deb "$p" || todo+=("$p"); done
  ((${#todo[@]})) || return 0
  echo "gpu-deps: downloading ${todo[*]}"
  # (apt warns that it downloads "unsandboxed as root" when _apt cannot write to DIR: harmless here.)
  (cd "$dir" && apt-get download -q "${todo[@]/%/:$arch}" 2>&1 >/dev/null | grep -v unsandboxed || true)
}

# The package owning a library path (usrmerge: /lib/x86_64-linux-gnu and /usr/lib/x86_64-linux-gnu are one).
owner() {
  local path=$1 real
  real=$(readlink -f "$path")
  for p in "$path" "$real" "${path#/usr}" "/usr$path" "${real#/usr}" "/usr$real"; do
    dpkg -S "$p" 2>/dev/null | head -1 | cut -d: -f1 && return 0
  done
  return 1
}

fetch "${wanted[@]}"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for round in 1 2 3 4 5 6; do
  rm -rf "$scratch/root"
  mkdir -p "$scratch/root"
  for deb in "$dir"/*.deb; do dpkg -x "$deb" "$scratch/root"; done
  libpath=$(find "$scratch/root" -name '*.so*' -printf '%h\n' | sort -u | paste -sd:)
  # SONAME links that maintainer scripts (alternatives) would have made, as gpu-check.sh makes them.
  IFS=: read -ra libdirs <<<"$libpath"
  "$(command -v ldconfig || echo /sbin/ldconfig)" -n "${libdirs[@]}"
  missing=()
  while read -r lib; do
    [[ -z "$lib" || "$lib" == "$scratch"* ]] && continue
    pkg=$(owner "$lib") || { echo "gpu-deps: no package owns $lib" >&2; continue; }
    [[ " ${base[*]} " == *" $pkg "* || " ${missing[*]} " == *" $pkg "* ]] || missing+=("$pkg")
  done < <(find "$scratch/root" -type f -name '*.so*' -print0 |
           xargs -0 -n 32 env LD_LIBRARY_PATH="$libpath" ldd 2>/dev/null |
           awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
  ((${#missing[@]})) || break
  echo "gpu-deps: round $round: libraries outside the prefix come from ${missing[*]}"
  fetch "${missing[@]}"
done
((${#missing[@]} == 0)) || { echo "gpu-deps: dependency closure did not converge: ${missing[*]}" >&2; exit 1; }

echo "gpu-deps: $(ls "$dir"/*.deb | wc -l) packages, $(du -sh "$dir" | cut -f1) in $dir:"
ls "$dir"/*.deb | xargs -n1 basename | sed 's/_.*//' | paste -sd' ' | fold -s -w 110
if [[ -n "$runtime" ]]; then
  rm -rf "$runtime"
  mkdir -p "$runtime"
  for deb in "$dir"/*.deb; do
    case $(basename "$deb") in
      *-dev_* | protobuf-compiler_* | libprotoc32_*) ;;  # headers, CMake files, static libraries, protoc
      *) cp "$deb" "$runtime/" ;;
    esac
  done
  echo "gpu-deps: $(ls "$runtime"/*.deb | wc -l) runtime packages, $(du -sh "$runtime" | cut -f1) in $runtime"
fi
