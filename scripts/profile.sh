#!/usr/bin/env bash
# Profile the leader and one follower of a 3-member cluster under the uncontended load of
# issue #11, and print where their CPU goes by component (scripts/perf-categories.py).
#
#   cargo build --release && scripts/profile.sh [OUT_DIR] [CLIENTS]
#
# SERVE_ARGS and BENCH_ARGS add arguments to every `serve` and to the `bench`, for example
# BENCH_ARGS="--connections 4 --batch" (issue #35's batching; the leader coalesces by default,
# SERVE_ARGS="--coalesce false" not).
#
# Needs `perf` (linux-perf). Starts three `latchkey serve` processes on 127.0.0.1:7521-7523
# (metrics on 9521-9523) with data in OUT_DIR, loads them with `latchkey bench`, records each
# profiled process for 8 s with DWARF call graphs, and stops everything it started.
set -euo pipefail
BIN=${BIN:-target/release/latchkey}
OUT=${1:-/tmp/latchkey-profile}
CLIENTS=${2:-64}
HERE=$(cd "$(dirname "$0")" && pwd)
rm -rf "$OUT"; mkdir -p "$OUT"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
PEERS=1=127.0.0.1:7521,2=127.0.0.1:7522,3=127.0.0.1:7523
for i in 1 2 3; do
  RUST_LOG=warn "$BIN" serve --id $i --listen 127.0.0.1:752$i --data-dir "$OUT/n$i" \
    --peers $PEERS --metrics-listen 127.0.0.1:952$i ${SERVE_ARGS:-} >"$OUT/n$i.log" 2>&1 &
  PIDS+=($!)
done
ENDPOINTS=127.0.0.1:7521,127.0.0.1:7522,127.0.0.1:7523
leader=""
for _ in $(seq 100); do
  for i in 1 2 3; do
    if curl -s "127.0.0.1:952$i/metrics" 2>/dev/null | grep -q '^latchkey_raft_is_leader 1'; then leader=$i; fi
  done
  [ -n "$leader" ] && break
  sleep 0.2
done
[ -n "$leader" ] || { echo "no leader elected" >&2; exit 1; }
follower=$(( leader % 3 + 1 ))
"$BIN" bench --endpoints $ENDPOINTS --metrics-endpoints 127.0.0.1:9521,127.0.0.1:9522,127.0.0.1:9523 \
  --workload uncontended --clients "$CLIENTS" --duration 20s --warmup 2s ${BENCH_ARGS:-} >"$OUT/bench.txt" 2>&1 &
BENCH=$!
PIDS+=($BENCH)
sleep 4
for role in leader follower; do
  n=${!role}
  perf record -F 499 --call-graph dwarf,8192 -p "${PIDS[$((n-1))]}" -o "$OUT/$role.data" -- sleep 8 >/dev/null 2>&1
done
wait $BENCH || true
cat "$OUT/bench.txt"
for role in leader follower; do
  perf script -i "$OUT/$role.data" >"$OUT/$role.script" 2>/dev/null
  echo "== $role (member ${!role})"
  python3 "$HERE/perf-categories.py" "$OUT/$role.script"
  perf report -i "$OUT/$role.data" --no-children --sort sym --stdio -g none 2>/dev/null | grep '%' | head -15 | cut -c1-120
done
