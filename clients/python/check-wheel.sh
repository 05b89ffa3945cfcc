#!/usr/bin/env bash
# The wheel as a user installs it (issue #33): built with `pip wheel`, installed alone (with its
# dependencies from PyPI) into a fresh venv, and a program run against it outside the source
# tree. No server: a typed error within the fail-fast budget proves that the package, its
# generated protobuf modules and grpc load and run.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$python" -m venv "$work/build"
"$work/build/bin/pip" install --quiet --upgrade pip
"$work/build/bin/pip" wheel --quiet --no-deps -w "$work/wheel" "$here"
"$python" -m venv "$work/fresh"
"$work/fresh/bin/pip" install --quiet "$work"/wheel/latchkey-*.whl
cd "$work"
"$work/fresh/bin/python" - <<'PY'
import latchkey

policy = latchkey.RetryPolicy(unreachable_max=0.2)
with latchkey.Client(["127.0.0.1:1"], retry=policy) as c:
    try:
        c.describe("x")
    except latchkey.TransportError as e:
        print(f"check-wheel: installed from the wheel and ran: {e}")
    else:
        raise SystemExit("check-wheel: described a lock with no server")
PY
