//! The invariants every run's history must satisfy, one per file.

mod deadline;
mod durability;
mod fencing_order;
mod linearizable;
mod liveness;
mod no_overlap;
mod unique_token;

use std::fmt;
use std::time::Duration;

use crate::history::HistoryData;

#[derive(Debug, Clone)]
pub struct Violation {
    pub checker: &'static str,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.checker, self.message)
    }
}

/// What the checkers need to know about the run besides its history.
#[derive(Debug, Clone, Copy)]
pub struct CheckConfig {
    /// After the faults healed, acquires invoked from `healed_at + settle` on must be granted.
    pub settle: Duration,
    /// Acquires invoked after this are not judged for liveness (the run winds down).
    pub liveness_until: Duration,
}

/// Runs every checker; the cheap ones first. The linearizability search only runs on a
/// history that passed the others (a broken history makes it exponential, and the cheaper
/// checkers explain a bug better).
pub fn check_all(h: &HistoryData, config: &CheckConfig) -> Vec<Violation> {
    let mut out = Vec::new();
    out.extend(fencing_order::check(h));
    out.extend(no_overlap::check(h));
    out.extend(unique_token::check(h));
    out.extend(durability::check(h));
    out.extend(deadline::check(h));
    out.extend(liveness::check(h, config));
    if out.is_empty() {
        out.extend(linearizable::check(h));
    }
    out
}

fn ms(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}
