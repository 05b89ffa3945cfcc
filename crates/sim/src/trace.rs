//! A run's trace and its trace hash: whether two runs of one seed did the same thing.
//!
//! The trace is everything a run recorded, one line each, each kind in the order it was
//! recorded: the configuration and the faults injected, then by Raft group the clients'
//! operations and the resource's decisions (group 0's history holds them), the entries
//! appended and committed, the terms started, the leases resumed, the probe's events, the
//! clients' deadlines and the final holders (all with their true simulation time). The trace hash is a 64-bit FNV-1a hash of
//! those lines, fixed across machines, processes and toolchains (not `std`'s hasher, whose
//! output its documentation does not promise to keep). A run is a pure function of its seed:
//! two runs of one seed must print one trace hash (`tests/seeds.rs`, `latchkey-sim` prints it
//! with every seed). With `LATCHKEY_SIM_TRACE=DIR` each run also writes its trace to
//! `DIR/seed-S-groups-G-HASH.trace`, so that two runs that differ can be diffed to the
//! first step where they part.

use std::fmt::Write as _;

use crate::history::HistoryData;

/// The environment variable naming a directory for each run's trace.
pub const TRACE_DIR_VAR: &str = "LATCHKEY_SIM_TRACE";

/// Builds a run's trace, line by line, and hashes it as it goes.
#[derive(Debug)]
pub struct Trace {
    hash: u64,
    /// The lines, kept only when they are to be written out.
    lines: Option<String>,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

impl Trace {
    /// An empty trace; `keep_lines` keeps its text for [`Trace::text`].
    pub fn new(keep_lines: bool) -> Trace {
        Trace {
            hash: FNV_OFFSET,
            lines: keep_lines.then(String::new),
        }
    }

    /// Adds one line.
    pub fn line(&mut self, line: &str) {
        for b in line.bytes().chain(std::iter::once(b'\n')) {
            self.hash ^= u64::from(b);
            self.hash = self.hash.wrapping_mul(FNV_PRIME);
        }
        if let Some(lines) = &mut self.lines {
            lines.push_str(line);
            lines.push('\n');
        }
    }

    /// Adds what one Raft group's history recorded (`label` names it in every line).
    pub fn history(&mut self, label: &str, h: &HistoryData) {
        let mut s = String::new();
        let mut add = |trace: &mut Trace, what: std::fmt::Arguments<'_>| {
            s.clear();
            let _ = write!(s, "{label} {what}");
            trace.line(&s);
        };
        for e in &h.events {
            add(self, format_args!("event {e:?}"));
        }
        for r in &h.resource {
            add(self, format_args!("resource {r:?}"));
        }
        for (key, a) in &h.appended {
            add(self, format_args!("appended {key:?} {a:?}"));
        }
        for (index, c) in &h.committed {
            add(self, format_args!("committed {index} {c:?}"));
        }
        for t in &h.term_starts {
            add(self, format_args!("term {t:?}"));
        }
        for r in &h.resumed_leases {
            add(self, format_args!("resumed {r:?}"));
        }
        for p in &h.probed {
            add(self, format_args!("probed {p:?}"));
        }
        for (at, session, deadline) in &h.client_deadline_log {
            add(
                self,
                format_args!("deadline {at:?} session {session} {deadline:?}"),
            );
        }
        // Lock-delays asked for (`RunConfig::lock_delay`), only if any: a run without them
        // traces what it did before they existed.
        for (id, delay) in &h.delays {
            add(self, format_args!("delay {id} {delay:?}"));
        }
        // Election operations (`RunConfig::elections`), likewise only if any.
        for e in &h.elections {
            add(self, format_args!("election {e:?}"));
        }
        add(self, format_args!("final {:?}", h.final_holders));
    }

    /// The trace hash of the lines so far.
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// The lines, if they were kept.
    pub fn text(&self) -> Option<&str> {
        self.lines.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_hash_is_fnv_1a_of_the_lines() {
        // FNV-1a 64 of "a\n": a fixed value, the same on every machine and toolchain.
        let mut t = Trace::new(true);
        t.line("a");
        assert_eq!(t.hash(), 0x089b_dc07_b544_e7b2);
        assert_eq!(t.text(), Some("a\n"));
        let mut u = Trace::new(false);
        u.line("b");
        assert_ne!(t.hash(), u.hash());
        assert_eq!(u.text(), None);
    }
}
