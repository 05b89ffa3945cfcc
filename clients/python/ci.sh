#!/usr/bin/env bash
# The Python client's CI: a fresh venv in a temp dir, a real install of the package and its
# test extra from PyPI, and pytest against real `latchkey serve` processes.
# LATCHKEY_BIN: the server binary (default <repo>/target/debug/latchkey, built by cargo first).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
export LATCHKEY_BIN="${LATCHKEY_BIN:-$repo/target/debug/latchkey}"
python="${PYTHON:-python3}"
venv="$(mktemp -d)"
trap 'rm -rf "$venv"' EXIT
"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
# Not editable: test what a user installs.
"$venv/bin/pip" install --quiet "$here[test]"
cd "$here"
# Run from the tests, with the installed package (not src/) on the path.
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
# The wheel as a user installs it.
"$here/check-wheel.sh"
