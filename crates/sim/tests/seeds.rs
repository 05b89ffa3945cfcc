//! The CI seeds: a fixed set of seeded simulations (safety phase with faults, then liveness),
//! each checked by every checker. About 25–45 s per seed in a debug build on 2 cores.
//! A failure prints the seed and the command that replays it.

use latchkey_sim::sweep::{failure_text, run_seed};

/// Seeds run on every `cargo test` (sweep more with `cargo run --release -p latchkey-sim --
/// --seeds N`).
const CI_SEEDS: std::ops::Range<u64> = 0..5;

#[test]
fn ci_seeds_pass_every_checker() {
    let mut failures = Vec::new();
    for seed in CI_SEEDS {
        let report = run_seed(seed);
        if !report.ok() {
            failures.push(failure_text(&report));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
