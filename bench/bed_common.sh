# Sourced by the benchmarks on the test bed of scripts/hosts.sh (hier_hosts.sh, hosts_figures.sh).
#
# bed_common BED REPS [BUILD_DIR] [N]: sets root (the checkout), build (BUILD_DIR, default root/build), reps
# (N, default REPS), hosts (scripts/hosts.sh), CZ_HOSTS_BED (BED unless it is set) and work (a temporary
# folder, removed on exit), and exports them with median, the median of the numbers on stdin.
bed_common() {
  local bed=$1 default_reps=$2
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  build=$(cd "${3:-$root/build}" && pwd)
  reps=${4:-$default_reps}
  hosts="$root/scripts/hosts.sh"
  export CZ_HOSTS_BED=${CZ_HOSTS_BED:-$bed}
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  export root hosts build reps work
  export -f median
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
