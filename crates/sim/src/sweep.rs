//! Running seeds and reporting failures reproducibly.

use std::time::Instant;

pub use crate::config::replay_command;
use crate::config::{RunConfig, RunReport};
use crate::sim::run;

const VIOLATIONS_SHOWN_PER_CHECKER: usize = 5;

/// A human report of a failed run: seed, replay command, violations, the fault schedule.
pub fn failure_text(r: &RunReport) -> String {
    let mut s = format!(
        "=== latchkey-sim: seed {} FAILED ===\nreplay: {}\nconfig: {:?}\n",
        r.config.seed,
        replay_command(r.config.seed, r.config.groups, r.config.replicas),
        r.config
    );
    if !cfg!(tokio_unstable) {
        s.push_str(
            "note: built without --cfg tokio_unstable (a RUSTFLAGS variable replaces \
             .cargo/config.toml): the replay repeats the faults and workload, not necessarily \
             the exact interleaving\n",
        );
    }
    if let Some(e) = &r.sim_error {
        s.push_str(&format!("simulation error: {e}\n"));
    }
    // At most a few per checker: one broken entry tends to break many after it.
    let mut shown: std::collections::BTreeMap<&str, usize> = Default::default();
    for v in &r.violations {
        let n = shown.entry(v.checker).or_default();
        *n += 1;
        if *n <= VIOLATIONS_SHOWN_PER_CHECKER {
            s.push_str(&format!("violation: {v}\n"));
        }
    }
    for (checker, n) in shown {
        if n > VIOLATIONS_SHOWN_PER_CHECKER {
            s.push_str(&format!("({n} violations of {checker} in all)\n"));
        }
    }
    s.push_str(&format!("reached: {}\n", r.coverage));
    s.push_str(&format!("trace hash: {:016x}\n", r.trace_hash));
    s.push_str("faults:\n");
    for f in &r.faults {
        s.push_str(&format!("  {f}\n"));
    }
    s
}

/// Runs one seed and prints a one-line summary (or the failure report).
pub fn run_seed(seed: u64) -> RunReport {
    run_config(&RunConfig::from_seed(seed))
}

/// Runs one configuration (a seed's, perhaps with a bug planted) and prints a one-line summary
/// (or the failure report).
pub fn run_config(config: &RunConfig) -> RunReport {
    let (seed, started) = (config.seed, Instant::now());
    let report = run(config);
    if report.ok() {
        println!(
            "seed {seed}: ok ({} nodes, {} groups, {} clients, {} idle sessions, coalescing {}, client batching {}, {} ops, {} grants, {} committed entries, {} hold checks within 1s of their expiry, {} faults; {}; trace hash {:016x}) in {:.1}s",
            report.config.nodes,
            report.config.groups,
            report.config.clients,
            report.config.idle_sessions,
            if report.config.coalesce { "on" } else { "off" },
            if report.config.client_batch { "on" } else { "off" },
            report.operations,
            report.grants,
            report.committed_entries,
            report.hold_checks_near_expiry,
            report.faults.len(),
            report.coverage,
            report.trace_hash,
            started.elapsed().as_secs_f64()
        );
        // With several groups, what each reached: the states a bug needs, group by group.
        if report.by_group.len() > 1 {
            for (g, group) in report.by_group.iter().enumerate() {
                let targeted = if g as u32 == config.targeted_group() {
                    ", its leader targeted"
                } else {
                    ""
                };
                println!(
                    "  group {g}{targeted}: {} grants, {} committed entries; {}",
                    group.grants, group.committed_entries, group.coverage
                );
            }
        }
    } else {
        println!("{}", failure_text(&report));
    }
    report
}
