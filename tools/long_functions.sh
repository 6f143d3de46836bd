#!/usr/bin/env bash
# Lists the functions in src/ longer than N lines (default 80), longest first, by Universal Ctags' start and end
# lines: the house rule is none over 80 but tables (the flag tables, src/dist/train/flags_*.cpp).
#   tools/long_functions.sh [N]
set -eu
n=${1:-80}
cd "$(dirname "$0")/.."
command -v ctags >/dev/null || { echo "long_functions.sh: needs Universal Ctags (apt install universal-ctags)" >&2; exit 1; }
find src \( -name '*.cpp' -o -name '*.cu' -o -name '*.h' -o -name '*.cuh' \) -print0 |
  xargs -0 ctags --language-force=c++ --c++-kinds=f --fields=+ne --extras=-q -o - 2>/dev/null |
  awk -F'\t' -v n="$n" '{
    s = ""; e = ""
    for (i = 4; i <= NF; i++) { if ($i ~ /^line:/) s = substr($i, 6); if ($i ~ /^end:/) e = substr($i, 5) }
    if (s != "" && e != "" && e - s + 1 > n && $1 !~ /^__anon/) printf "%d %s:%s %s\n", e - s + 1, $2, s, $1
  }' | sort -rn
