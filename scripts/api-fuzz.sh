#!/usr/bin/env bash
# The HTTP API against its contract (issue #31 item 7). schemathesis, driven by the OpenAPI
# document a live node serves (docs/openapi.json), sends generated requests, valid and
# invalid, to a single-member node and runs all its checks on every answer: no 5xx, each
# status and body as the document says, every request the document calls valid accepted
# (not 400) and every one it calls invalid refused. Seeded and bounded (examples per
# operation, and a hard time limit); any finding fails the run, with schemathesis's report
# and a curl line for each.
#
# Usage: scripts/api-fuzz.sh            (after `cargo build -p latchkey`; CI runs it from .ci/run)
# Environment: LATCHKEY_BIN (the binary; default $CARGO_TARGET_DIR or ./target, debug),
#   API_FUZZ_SEED (default 1), API_FUZZ_EXAMPLES (per operation and phase; default 100),
#   API_FUZZ_TIMEOUT_S (the whole run's limit; default 300), API_FUZZ_VENV (where schemathesis
#   is installed, pinned by scripts/api-fuzz-requirements.txt; default target/api-fuzz/venv).
# The report (JUnit XML) and, after a failure, the node's log land in target/api-fuzz/.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${LATCHKEY_BIN:-$TARGET/debug/latchkey}
SEED=${API_FUZZ_SEED:-1}
EXAMPLES=${API_FUZZ_EXAMPLES:-100}
TIMEOUT_S=${API_FUZZ_TIMEOUT_S:-300}
VENV=${API_FUZZ_VENV:-$TARGET/api-fuzz/venv}
OUT=$TARGET/api-fuzz
REQUIREMENTS=$ROOT/scripts/api-fuzz-requirements.txt
[[ -x $BIN ]] || { echo "api-fuzz: no binary at $BIN (cargo build -p latchkey)" >&2; exit 2; }

# schemathesis in a venv of its own (the conformance venv holds the Python client's pins),
# reinstalled when the pins change.
pinned=$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)
if [[ ! -x $VENV/bin/schemathesis || $(cat "$VENV/.pinned" 2>/dev/null) != "$pinned" ]]; then
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet -r "$REQUIREMENTS"
    echo "$pinned" >"$VENV/.pinned"
fi

work=$(mktemp -d)
node=
stop() {
    if [[ -n $node ]]; then
        kill "$node" 2>/dev/null || true
        wait "$node" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap stop EXIT

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
grpc=127.0.0.1:$(free_port)
http=127.0.0.1:$(free_port)
"$BIN" serve --listen "$grpc" --http-listen "$http" --data-dir "$work/data" >"$work/node.log" 2>&1 &
node=$!
# Ready once it leads its group (a single member elects itself), at most 30 s.
for _ in $(seq 60); do
    curl -fsS "http://$http/v1/cluster/status" 2>/dev/null | grep -q '"role":"leader"' && break
    kill -0 "$node" 2>/dev/null || { cat "$work/node.log" >&2; echo "api-fuzz: the node exited" >&2; exit 1; }
    sleep 0.5
done
curl -fsS "http://$http/v1/cluster/status" | grep -q '"role":"leader"' \
    || { cat "$work/node.log" >&2; echo "api-fuzz: the node did not become leader in 30 s" >&2; exit 1; }

mkdir -p "$OUT"
set +e
# One worker and no example database kept between runs: a seed replays the same requests.
# Run in target/api-fuzz/: schemathesis keeps a cache in its working directory.
cd "$OUT"
timeout "$TIMEOUT_S" "$VENV/bin/schemathesis" run "http://$http/v1/openapi.json" \
    --checks all --seed "$SEED" --max-examples "$EXAMPLES" --workers 1 \
    --continue-on-failure --request-timeout 20 --generation-database none \
    --no-color --output-sanitize false --output-truncate false \
    --report junit --report-dir "$OUT"
status=$?
set -e
if ((status != 0)); then
    cp "$work/node.log" "$OUT/node.log"
    ((status == 124)) && echo "api-fuzz: over its limit of $TIMEOUT_S s" >&2
    echo "api-fuzz: FAILED (exit $status); the node's log is in $OUT/node.log" >&2
    exit 1
fi
echo "api-fuzz: clean (seed $SEED, $EXAMPLES examples per operation and phase)"
