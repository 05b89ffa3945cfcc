#!/usr/bin/env bash
# A long nemesis run on real processes (crates/nemesis; needs root): a release build of latchkey
# and of the nemesis, then a random schedule of every fault family. Arguments go to
# `latchkey-nemesis run` (--minutes N, --seed S, --faults a,b, --workers N, --dir DIR, ...).
# Prints the summary table; exit status 1 if a check found a violation (the run's logs are kept).
set -euo pipefail
cd "$(dirname "$0")/.."
# Two commands: a `--bin` filter applies to every package named, and would leave the nemesis's
# own binary unbuilt.
cargo build --release --locked -p latchkey --bin latchkey
cargo build --release --locked -p latchkey-nemesis --bin latchkey-nemesis
exec target/release/latchkey-nemesis run --latchkey target/release/latchkey "$@"
