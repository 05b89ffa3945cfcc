#!/usr/bin/env bash
# Failover timing of a real 3-member cluster on loopback (issue #11's failover target).
#
# Starts 3 `latchkey serve` members (default settings unless flags are given after `--`), keeps
# a light background load of `latchkey lock` loops on them, and ROUNDS times: kills the leader
# with SIGKILL, at once starts a NEW `latchkey lock fo-<round> -- true` process with all three
# endpoints, and reports the time from the kill to that process's exit (its grant, its
# release, its session close: the first grant by the new leader, as a user sees it). The killed
# member is then restarted on its data dir and the next round waits until all three answer.
#
# For each round it prints the survivors' key log lines (election timer, pre-vote, votes,
# leadership) with their offset from the kill, and keeps every member's full log in the work
# directory. It prints min/median/max at the end.
#
# Usage: scripts/failover-timing.sh [ROUNDS] [-- extra `latchkey serve` flags]
#   cargo build --release -p latchkey && scripts/failover-timing.sh 10
#   scripts/failover-timing.sh 5 -- --heartbeat-ms 150 --election-timeout-ms 1000..2000
# Environment: LATCHKEY (the binary; default $CARGO_TARGET_DIR or ./target, release),
#   RUST_LOG (the members' log filter; default info), LOAD (background lock loops; default 2),
#   KEEP=1 (keep the work directory).
set -euo pipefail

ROUNDS=${1:-10}
shift || true
[[ ${1:-} == -- ]] && shift
SERVE_FLAGS=("$@")
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${LATCHKEY:-${CARGO_TARGET_DIR:-$ROOT/target}/release/latchkey}
[[ -x $BIN ]] || { echo "no binary at $BIN (cargo build --release -p latchkey)" >&2; exit 2; }
export RUST_LOG=${RUST_LOG:-info}
LOAD=${LOAD:-2}
DIR=$(mktemp -d /tmp/latchkey-failover.XXXXXX)

# Three free loopback ports (bound then released; a clash makes a member fail to start, and
# the health wait below says so).
read -r P1 P2 P3 < <(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
PY
)
PORTS=("" "$P1" "$P2" "$P3")
PEERS="1=127.0.0.1:$P1,2=127.0.0.1:$P2,3=127.0.0.1:$P3"
EPS="127.0.0.1:$P1,127.0.0.1:$P2,127.0.0.1:$P3"
declare -a PID LOADPIDS=()

start_member() {
    local i=$1
    "$BIN" serve --id "$i" --listen "127.0.0.1:${PORTS[$i]}" --data-dir "$DIR/m$i" \
        --peers "$PEERS" "${SERVE_FLAGS[@]}" >>"$DIR/m$i.log" 2>&1 &
    PID[$i]=$!
}

cleanup() {
    local p
    for p in "${LOADPIDS[@]}" "${PID[@]:1}"; do
        [[ -n $p ]] && kill -9 "$p" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    if [[ ${KEEP:-0} == 1 ]]; then echo "logs kept in $DIR"; else rm -rf "$DIR"; fi
}
trap cleanup EXIT

status_json() { "$BIN" cluster status --json --endpoints "$EPS" 2>/dev/null || echo '{}'; }

# Waits (at most 60 s) until every member answers and one of them leads; prints the leader id.
wait_healthy() {
    local deadline=$((SECONDS + 60)) s
    while ((SECONDS < deadline)); do
        s=$(status_json)
        if [[ $(jq '[.members[]? | select(.role == "leader" or .role == "follower")] | length' <<<"$s") == 3 ]] &&
            [[ -n $(jq -r '.leader // empty' <<<"$s") ]]; then
            jq -r '.leader' <<<"$s"
            return 0
        fi
        sleep 0.2
    done
    echo "cluster not healthy after 60 s: $s" >&2
    return 1
}

# The survivors' log lines that tell the story of one failover, as offsets from the kill.
timeline() {
    local t0_ns=$1 t1_ns=$2 killed=$3
    python3 - "$t0_ns" "$t1_ns" "$killed" "$DIR" <<'PY'
import datetime, re, sys
t0, t1, killed, d = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
keys = re.compile(r"election timeout expired|trigger pre-vote|new pre-candidate|pre-vote|"
                  r"new candidate|reject vote|vote is changing|Leader|leader|elected|"
                  r"error|unreachable|timeout", re.I)
ts = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z")
events = []
for i in (1, 2, 3):
    if i == killed:
        continue
    for line in open(f"{d}/m{i}.log", errors="replace"):
        m = ts.match(line)
        if not m:
            continue
        frac = m.group(1)
        whole, sub = frac.split(".")
        t = datetime.datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(
            tzinfo=datetime.timezone.utc).timestamp()
        ns = int(t) * 10**9 + int((sub + "000000000")[:9])
        if t0 - 3 * 10**9 <= ns <= t1 + 2 * 10**8 and keys.search(line):
            events.append((ns, i, line[m.end():].strip()))
events.sort()
seen = {}
for ns, i, text in events:
    short = re.sub(r"\s+", " ", text)[:220]
    # Repeated lines (a replication error per retry) once per member and kind.
    kind = (i, re.sub(r"[0-9]+", "#", short)[:80])
    seen[kind] = seen.get(kind, 0) + 1
    if seen[kind] <= 2:
        print(f"    {(ns - t0) / 1e6:+9.1f} ms  m{i}  {short}")
PY
}

for i in 1 2 3; do start_member "$i"; done
wait_healthy >/dev/null
for ((l = 0; l < LOAD; l++)); do
    (while :; do "$BIN" lock --endpoints "$EPS" "bg-$l" -- true >/dev/null 2>&1 || true; done) &
    LOADPIDS+=($!)
done

declare -a TIMES=()
for ((r = 1; r <= ROUNDS; r++)); do
    leader=$(wait_healthy)
    # Let the restarted member catch up and the load run, and kill at a random heartbeat phase.
    sleep "$(python3 -c 'import random; print(round(random.uniform(2, 3), 3))')"
    leader=$(wait_healthy)
    t0=$(date +%s%N)
    kill -9 "${PID[$leader]}"
    wait "${PID[$leader]}" 2>/dev/null || true
    rc=0
    "$BIN" lock --endpoints "$EPS" "fo-$r" -- true >"$DIR/lock-$r.log" 2>&1 || rc=$?
    t1=$(date +%s%N)
    ms=$(((t1 - t0) / 1000000))
    echo "round $r: killed leader m$leader; first grant after $ms ms (exit $rc)"
    [[ $rc == 0 ]] && TIMES+=("$ms")
    timeline "$t0" "$t1" "$leader"
    start_member "$leader"
done

if ((${#TIMES[@]})); then
    sorted=$(printf '%s\n' "${TIMES[@]}" | sort -n)
    n=${#TIMES[@]}
    min=$(head -1 <<<"$sorted")
    max=$(tail -1 <<<"$sorted")
    if ((n % 2)); then
        med=$(sed -n "$((n / 2 + 1))p" <<<"$sorted")
    else
        a=$(sed -n "$((n / 2))p" <<<"$sorted")
        b=$(sed -n "$((n / 2 + 1))p" <<<"$sorted")
        med=$(((a + b) / 2))
    fi
    echo "kill -> first grant over $n of $ROUNDS rounds: min $min ms, median $med ms, max $max ms"
    echo "all (ms): $(tr '\n' ' ' <<<"$sorted")"
fi
