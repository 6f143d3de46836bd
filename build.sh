#!/usr/bin/env bash
# Set up a Debian 12 machine, build convnext_zero in Release, then run the main job or the test suite.
#
#   ./build.sh run [ARGS]  set up, build, run the main job (a short training run on the embedded synthetic data;
#                          ARGS go to convnext_zero)
#   ./build.sh test   set up, build, run the whole test suite (ctest)
#
# Set-up installs missing Debian packages when run as root; otherwise it prints the one apt-get line needed and
# stops. BUILD_DIR (default build) and CMAKE_ARGS (extra configure flags) are honoured.
set -euo pipefail
cd "$(dirname "$0")"

mode=${1:-}
if [[ "$mode" != run && "$mode" != test ]]; then
  echo "usage: $0 run [convnext_zero flags] | test" >&2
  exit 2
fi

packages=(build-essential cmake ninja-build pkg-config ccache
  libopenblas-openmp-dev libdnnl-dev libblis-openmp-dev libxsmm-dev  # CPU GEMMs measured per shape (issue 43)
  libopenmpi-dev openmpi-bin libhdf5-dev
  libgtest-dev libgmock-dev libbenchmark-dev libfmt-dev nlohmann-json3-dev libcli11-dev
  libturbojpeg0-dev libpng-dev libprotobuf-dev protobuf-compiler python3-matplotlib python3-h5py hdf5-tools
  iproute2  # ip, tc, bridge: the test bed of hosts (scripts/hosts.sh; util-linux is essential)
  gdb  # the elastic tests print a stalled launch's stacks (tests/hosts/run_elastic_tests.sh)
  # A real Slurm for the tests labelled slurm (scripts/slurm.sh runs its own munged, slurmctld and slurmd, with
  # their own key, socket and slurm.conf). Installing starts no Slurm daemon (their init scripts stop without
  # /etc/slurm/slurm.conf); munge's may start the system's munged, on its own socket, which the tests never use.
  slurm-wlm munge)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]]; then
    echo "== installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "missing Debian packages; run:"
    echo "  sudo apt-get install -y ${missing[*]}"
    exit 1
  fi
fi

build_dir=${BUILD_DIR:-build}
jobs=$(nproc)
echo "== configuring ($build_dir, Release)"
# shellcheck disable=SC2086
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >/dev/null
echo "== building with $jobs jobs"
cmake --build "$build_dir" -j "$jobs"

case "$mode" in
  run)
    exec scripts/main_job.sh "$build_dir" "${@:2}"
    ;;
  test)
    echo "== testing"
    # python3-h5py is in the package list: the checkpoint_h5py test must run, not skip.
    export CZ_REQUIRE_H5PY=1
    cd "$build_dir"
    exec ctest --output-on-failure --timeout 600 -j "$jobs"
    ;;
esac
