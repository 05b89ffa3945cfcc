#!/usr/bin/env bash
# The Raft groups table of docs/PERFORMANCE.md: uncontended, 64 clients, 3 members, G = 1, 2,
# 4, 8, ROUNDS rounds (default 2) interleaved, each run's JSON report in OUT_DIR and the VM's
# steal during it (from /proc/stat, as scripts/bench-table.sh reads it) in OUT_DIR/steal.txt.
# Usage: scripts/bench-groups.sh OUT_DIR [ROUNDS]   (B=path/to/latchkey, default the release build)
set -euo pipefail
OUT=${1:?usage: scripts/bench-groups.sh OUT_DIR [ROUNDS]}
ROUNDS=${2:-2}
B=${B:-target/release/latchkey}
mkdir -p "$OUT"
steal() { awk '/^cpu /{print $9}' /proc/stat; }
for round in $(seq 1 "$ROUNDS"); do
  for g in 1 2 4 8; do
    s0=$(steal); t0=$(date +%s.%N)
    "$B" bench --cluster 3 --groups "$g" --workload uncontended --clients 64 --duration 10s \
      --json >"$OUT/g$g-r$round.json" 2>"$OUT/g$g-r$round.err"
    t1=$(date +%s.%N); ticks=$(( $(steal) - s0 ))
    pct=$(awk -v t="$ticks" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", t / ((b - a) * 2 * 100) * 100 }')
    echo "g=$g round=$round steal_pct=$pct" >>"$OUT/steal.txt"
  done
done
