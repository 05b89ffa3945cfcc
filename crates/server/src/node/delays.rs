//! Timing lock-delays on the leader (issue #32 item 4). The table keeps no end time for a
//! running delay: a wall clock that steps forward (or a successor whose clock is ahead) would
//! end it early, which is the one promise a lock-delay makes to a resource that cannot check
//! tokens. The leader times each delay on its monotonic clock from when it first sees it, and
//! proposes `Op::EndDelays` naming it by the token of the grant whose loss started it. A new
//! leader sees every running delay afresh and gives it its full length again, as it resumes
//! leases: a failover lengthens a delay by up to the time the old leader had already counted,
//! never shortens it. The lease task ticks every `limits::LEASE_TICK_MS`, so a delay ends up
//! to that much late.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use latchkey_core::{limits, DelayEnd};
use tokio::time::Instant;

/// When this leader first saw each running delay, by the name and token that name it (a token
/// alone does not: one entry hands several names over under its index, and each of those
/// grants may start a delay of its own at another time).
#[derive(Debug, Default)]
pub(crate) struct DelayTimer {
    first_seen: HashMap<(String, u64), Instant>,
    /// When the running delays were last looked at: at most once a lease tick, since the look
    /// reads the table (up to `limits::DELAYS_MAX` delays) under its lock.
    scanned: Option<Instant>,
    /// `Plant::delay_ends_early`: end each delay at half its length (the simulation's
    /// lock-delay checker must catch it). False outside the simulation.
    ends_early: bool,
}

impl DelayTimer {
    /// A timer of no delays; `ends_early` is `Plant::delay_ends_early`.
    pub(crate) fn new(ends_early: bool) -> DelayTimer {
        DelayTimer {
            first_seen: HashMap::new(),
            scanned: None,
            ends_early,
        }
    }

    /// This member stopped leading (or leads a new term): every delay starts afresh when it
    /// leads again.
    pub(crate) fn stepped_down(&mut self) {
        self.first_seen.clear();
        self.scanned = None;
    }

    /// Whether to look at the running delays at `now`: once a lease tick at most (a delay
    /// ends up to a tick late, which it may).
    pub(crate) fn wants_scan(&mut self, now: Instant) -> bool {
        let tick = Duration::from_millis(limits::LEASE_TICK_MS);
        if self.scanned.is_some_and(|at| now < at + tick) {
            return false;
        }
        self.scanned = Some(now);
        true
    }

    /// The running delays (name, token, length in ms, as `LockTable::running_delays` gives
    /// them) that have run their length since this leader first saw them, at `now`: at most
    /// `limits::DELAYS_ENDED_PER_ENTRY_MAX`, the longest overdue first; the rest are due on a
    /// later tick. Forgets delays that no longer run.
    pub(crate) fn due<'a>(
        &mut self,
        running: impl Iterator<Item = (&'a str, u64, u64)>,
        now: Instant,
    ) -> Vec<DelayEnd> {
        let mut live = HashSet::new();
        let mut due: Vec<(Instant, DelayEnd)> = Vec::new();
        for (name, token, delay_ms) in running {
            let key = (name.to_owned(), token);
            let since = *self.first_seen.entry(key.clone()).or_insert(now);
            live.insert(key);
            let delay_ms = if self.ends_early {
                delay_ms / 2
            } else {
                delay_ms
            };
            let end = since + Duration::from_millis(delay_ms);
            if end <= now {
                let name = name.to_owned();
                due.push((end, DelayEnd { name, token }));
            }
        }
        self.first_seen.retain(|key, _| live.contains(key));
        due.sort_by_key(|(end, _)| *end);
        due.truncate(limits::DELAYS_ENDED_PER_ENTRY_MAX);
        due.into_iter().map(|(_, end)| end).collect()
    }

    /// How many delays this leader times.
    #[cfg(test)]
    fn timed(&self) -> usize {
        self.first_seen.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(due: &[DelayEnd]) -> Vec<(&str, u64)> {
        due.iter().map(|d| (d.name.as_str(), d.token)).collect()
    }

    /// A delay runs its full length from when this leader first saw it, whatever time the
    /// entry that started it carried.
    #[test]
    fn a_delay_is_due_its_length_after_the_leader_first_saw_it() {
        let start = Instant::now();
        let mut timer = DelayTimer::default();
        let running = [("a", 7, 1_000), ("b", 9, 3_000)];
        assert!(timer.due(running.into_iter(), start).is_empty());
        let at = |ms| start + Duration::from_millis(ms);
        assert!(timer.due(running.into_iter(), at(999)).is_empty());
        assert_eq!(
            names(&timer.due(running.into_iter(), at(1_000))),
            [("a", 7)]
        );
        // "a" ended (no longer running): forgotten; "b" is due at 3 s, not before.
        let running = [("b", 9, 3_000)];
        assert!(timer.due(running.into_iter(), at(2_999)).is_empty());
        assert_eq!(timer.timed(), 1);
        assert_eq!(
            names(&timer.due(running.into_iter(), at(3_000))),
            [("b", 9)]
        );
    }

    /// A leader that stepped down and leads again restarts every delay in full: a failover
    /// never shortens one.
    #[test]
    fn a_new_term_restarts_every_delay_in_full() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut timer = DelayTimer::default();
        let running = [("a", 7, 1_000)];
        assert!(timer.due(running.into_iter(), start).is_empty());
        timer.stepped_down();
        assert!(timer.due(running.into_iter(), at(900)).is_empty());
        assert!(timer.due(running.into_iter(), at(1_899)).is_empty());
        assert_eq!(
            names(&timer.due(running.into_iter(), at(1_900))),
            [("a", 7)]
        );
    }

    /// Two names handed over in one entry share its index as their token; a delay of each,
    /// started at different times, is timed on its own (the attacker review of issue #32: a
    /// timer keyed by the token alone ended the second one early, timed from the first).
    #[test]
    fn delays_of_two_names_under_one_token_are_timed_apart() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut timer = DelayTimer::default();
        assert!(timer
            .due([("a", 500, 60_000)].into_iter(), start)
            .is_empty());
        let both = [("a", 500, 60_000), ("b", 500, 60_000)];
        assert!(timer.due(both.into_iter(), at(50_000)).is_empty());
        assert_eq!(
            names(&timer.due(both.into_iter(), at(60_000))),
            [("a", 500)]
        );
        let b = [("b", 500, 60_000)];
        assert!(timer.due(b.into_iter(), at(109_999)).is_empty());
        assert_eq!(names(&timer.due(b.into_iter(), at(110_000))), [("b", 500)]);
    }

    /// A later delay of the same name (another token) is timed on its own.
    #[test]
    fn a_new_delay_of_the_same_name_is_timed_afresh() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut timer = DelayTimer::default();
        assert!(timer.due([("a", 7, 1_000)].into_iter(), start).is_empty());
        assert!(timer
            .due([("a", 12, 1_000)].into_iter(), at(1_500))
            .is_empty());
        assert_eq!(timer.timed(), 1);
        assert_eq!(
            names(&timer.due([("a", 12, 1_000)].into_iter(), at(2_500))),
            [("a", 12)]
        );
    }

    /// `Plant::delay_ends_early` really is the bug: the delay ends at half its length.
    #[test]
    fn the_planted_early_end_ends_a_delay_at_half_its_length() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut timer = DelayTimer::new(true);
        let running = [("a", 7, 1_000)];
        assert!(timer.due(running.into_iter(), start).is_empty());
        assert!(timer.due(running.into_iter(), at(499)).is_empty());
        assert_eq!(names(&timer.due(running.into_iter(), at(500))), [("a", 7)]);
    }
}
