//! The client never believes it holds a lock past the moment the cluster could grant the lock
//! to another: every time a client found, on its own drifting clock, that it still held its
//! session's locks, no expiry of that session had been proposed yet (the leader appended the
//! expiry entry later, in true time).

use std::time::Duration;

use super::{ms, Violation};
use crate::history::{Event, HistoryData};

pub fn check(h: &HistoryData) -> Vec<Violation> {
    let ends = h.committed_session_ends();
    let mut out = Vec::new();
    for e in &h.events {
        let Event::HoldCheck {
            actor,
            session,
            lock,
            token,
            at,
        } = e
        else {
            continue;
        };
        for end in ends.iter().filter(|end| end.sessions.contains(session)) {
            if end.first_at <= *at {
                out.push(Violation {
                    checker: "deadline",
                    message: format!(
                        "{actor:?} believed at {} that it held lock {lock:?} (token {token}) but \
                         the end of session {session} was proposed at {} (entry {})",
                        ms(*at),
                        ms(end.first_at),
                        end.index
                    ),
                });
            }
        }
    }
    out
}

/// How many hold checks happened within `window` before the end of their session was proposed:
/// the near misses that show the checker judged the deadline rule where it matters (a run
/// where no check comes close to an expiry would let a broken rule pass).
pub fn hold_checks_before_end(h: &HistoryData, window: Duration) -> usize {
    let ends = h.committed_session_ends();
    h.events
        .iter()
        .filter(|e| {
            let Event::HoldCheck { session, at, .. } = e else {
                return false;
            };
            ends.iter().any(|end| {
                end.sessions.contains(session)
                    && *at < end.first_at
                    && end.first_at.saturating_sub(window) <= *at
            })
        })
        .count()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{check, hold_checks_before_end};
    use crate::checkers::testkit::{acquire, expire, messages, Hist};

    /// Client 1 holds `a` (token 5) and checks its deadline; the leader proposes the expiry of
    /// its session at 5 s, committed at 5.5 s.
    fn base() -> Hist {
        let mut h = Hist::default();
        h.granted(1, "a", 100, 5, 110);
        h.hold_check(1, "a", 5, 120);
        h.hold_check(1, "a", 5, 4_300);
        h.commit(9, expire(&[1]), 5_000, 5_500);
        // Another session's checks are not judged against this expiry.
        h.hold_check(2, "b", 7, 6_000);
        h
    }

    #[test]
    fn accepts_hold_checks_before_the_expiry_was_proposed() {
        let h = base();
        assert!(check(&h.h).is_empty());
        assert_eq!(hold_checks_before_end(&h.h, Duration::from_secs(1)), 1);
    }

    #[test]
    fn rejects_a_hold_check_after_the_expiry_was_proposed_but_before_it_committed() {
        let mut h = base();
        h.hold_check(1, "a", 5, 5_200);
        let m = messages(&check(&h.h), "deadline");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].contains("end of session 1") && m[0].contains("5.000s"),
            "{m:?}"
        );
    }

    /// A close in a batch entry (issue #35) ends its session as an entry of its own would: a
    /// hold check after the batch was proposed is judged against it.
    #[test]
    fn rejects_a_hold_check_after_a_batch_entry_closing_the_session_was_proposed() {
        let mut h = Hist::default();
        h.granted(1, "a", 100, 5, 110);
        let close = latchkey_core::Op::CloseSession {
            session: crate::checkers::testkit::key(1),
        };
        let batch = latchkey_core::Op::Batch(vec![acquire(3, "b"), close]);
        h.commit(9, batch, 2_000, 2_100);
        h.hold_check(1, "a", 5, 1_500);
        assert_eq!(hold_checks_before_end(&h.h, Duration::from_secs(1)), 1);
        h.hold_check(1, "a", 5, 2_050);
        let m = messages(&check(&h.h), "deadline");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(m[0].contains("(entry 9)"), "{m:?}");
    }

    #[test]
    fn rejects_a_hold_check_at_the_instant_the_expiry_was_proposed() {
        let mut h = base();
        h.hold_check(1, "a", 5, 5_000);
        assert_eq!(messages(&check(&h.h), "deadline").len(), 1);
    }
}
