#!/usr/bin/env bash
# commbench's spread, point-to-point and check modes under mpirun, from the outside (issue 53):
#   spread_json    --json at 2 ranks with -a 2: one valid JSON document; every row has min/p50/p99/max_us
#                  ordered min <= p50 <= p99 <= max, every rank's figures, and the machine facts
#   sendrecv       --op sendrecv at 3 ranks: the bandwidth and latency matrices, table and JSON, every
#                  off-diagonal cell positive, the diagonal null
#   check_p2p      --check-p2p at 3 ranks: every pair right (exit 0); then CZ_COMMBENCH_CORRUPT=2:1 must fail
#                  (exit 1) naming rank 2 -> rank 1 and no other pair
#   timeout        a size that cannot finish within --timeout 1: the job ends within 20 s, naming the size
# usage: run_commbench_tests.sh CASE COMMBENCH MPIEXEC
set -euo pipefail
case_name=$1 bench=$2 mpiexec=$3
py=${CZ_PYTHON:-python3}
run() { local np=$1; shift; "$mpiexec" --allow-run-as-root --oversubscribe -np "$np" "$bench" "$@"; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

case $case_name in
spread_json)
  run 2 -o all_reduce -b 1K -e 256K -f 16 -n 20 -w 2 -a 2 --json >"$out/doc.json"
  "$py" - "$out/doc.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))  # the whole of stdout: one document
assert doc["average"] == "min", doc["average"]
m = doc["machine"]
for k in ("host", "cpu", "cores", "driver", "cuda_driver", "cuda_runtime", "nccl", "mpi", "ranks", "topology"):
    assert k in m, k
assert m["mpi"], m["mpi"]
assert len(doc["results"]) == 3, len(doc["results"])
for row in doc["results"]:
    for place in ("out_of_place", "in_place"):
        p = row[place]
        assert 0 < p["min_us"] <= p["p50_us"] <= p["p99_us"] <= p["max_us"], (row["size"], place, p)
        assert len(p["ranks"]) == 2
        # -a 2: the time column is the smaller rank's
        assert abs(p["time_us"] - min(r["time_us"] for r in p["ranks"])) < 1e-9, p
        assert p["min_us"] == min(r["min_us"] for r in p["ranks"])
        assert p["max_us"] == max(r["max_us"] for r in p["ranks"])
        assert p["wrong"] == 0
    assert row["p50_us"] == row["out_of_place"]["p50_us"]
print("spread_json OK:", json.dumps({k: doc["results"][-1][k] for k in ("size", "min_us", "p50_us", "p99_us", "max_us")}))
PY
  ;;
sendrecv)
  run 3 --op sendrecv -b 8 -e 64K -f 8192 -n 5 -w 1 --window 8 | tee "$out/table.txt"
  grep -q "# 65536 bytes: bandwidth (GB/s), row: sender" "$out/table.txt"
  grep -q "# 8 bytes: latency (us)" "$out/table.txt"
  run 3 --op sendrecv -b 4K -e 4K -n 5 -w 1 --window 8 --json >"$out/doc.json"
  "$py" - "$out/doc.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["op"] == "sendrecv" and doc["ranks"] == 3 and "machine" in doc
(res,) = doc["results"]
for key in ("bandwidth_GBps", "latency_us"):
    m = res[key]
    for a in range(3):
        for b in range(3):
            assert (m[a][b] is None) == (a == b), (key, a, b, m)
            assert a == b or m[a][b] > 0, (key, a, b, m)
print("sendrecv OK:", res["bandwidth_GBps"], res["latency_us"])
PY
  ;;
check_p2p)
  run 3 --check-p2p -b 1000 -e 1M -f 32 | tee "$out/ok.txt"
  grep -q "# check-p2p: 18 pair transfers, 0 wrong: OK" "$out/ok.txt"
  set +e
  CZ_COMMBENCH_CORRUPT=2:1 run 3 --check-p2p -b 1000 -e 1M -f 32 >"$out/bad.txt" 2>&1
  rc=$?
  set -e
  cat "$out/bad.txt"
  [[ $rc -ne 0 ]] || { echo "FAIL: a corrupted pair exited 0"; exit 1; }
  [[ $(grep -c "^# WRONG: rank 2 (.*) -> rank 1 (.*): 1 of [0-9]* bytes wrong" "$out/bad.txt") -eq 3 ]]
  [[ $(grep -c "^# WRONG:" "$out/bad.txt") -eq 3 ]]
  grep -q "# check-p2p: 18 pair transfers, 3 wrong: FAILED" "$out/bad.txt"
  ;;
timeout)
  start=$(date +%s)
  set +e
  run 2 -o all_reduce -b 1K -e 16M -f 16384 -n 300 -w 1 --timeout 1 >"$out/log.txt" 2>&1
  rc=$?
  set -e
  cat "$out/log.txt"
  took=$(($(date +%s) - start))
  [[ $rc -ne 0 ]] || { echo "FAIL: exit 0 past the timeout"; exit 1; }
  ((took < 20)) || { echo "FAIL: took ${took}s"; exit 1; }
  grep -q "^ *1024 .* 0 " "$out/log.txt"  # the first size ran
  grep -q "commbench: all_reduce of 16777216 bytes ran past --timeout 1 s on rank [01]" "$out/log.txt"
  ;;
*)
  echo "unknown case $case_name"
  exit 2
  ;;
esac
echo "PASS $case_name"
