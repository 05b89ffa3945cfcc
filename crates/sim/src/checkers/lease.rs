//! The lease oracle: the cluster never expires a session before its client's own deadline has
//! passed. The client's deadline is what its library computed (send time of the last
//! acknowledged renewal + TTL − safety margin, on the client's drifting clock), recorded in
//! true time; the expiry is judged at the moment its `ExpireSessions` entry was proposed
//! (appended by its leader), which is no later than when it committed: a proposed expiry may
//! already be committed, and nothing can take it back.
//!
//! Unlike the deadline checker, this needs no hold check or waiter at the edge: every session
//! whose client recorded a deadline is judged, idle ones included. And every lease a new
//! leader resumes is judged at once against the client's deadline at that moment, so a lease
//! cut short is caught even if the client renews before it would run out.

use super::{ms, Violation};
use crate::history::HistoryData;

pub fn check(h: &HistoryData) -> Vec<Violation> {
    let mut out = check_expiries(h);
    out.extend(check_resumes(h));
    out
}

/// No leader resumes a lease that ends before its client's deadline as the client knew it at
/// that moment. A lease resumed shorter is cut short whether or not it later runs out: the
/// client may renew in time and hide it, or pause and lose its lock while it still holds it.
/// (Judged against deadlines the client had computed before the resume; one computed later
/// may rest on a renewal this leader had no way to know of yet.)
fn check_resumes(h: &HistoryData) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut known = std::collections::BTreeMap::<u64, std::time::Duration>::new();
    let mut log = h.client_deadline_log.iter().peekable();
    for resume in &h.resumed_leases {
        while let Some((_, session, deadline)) = log.next_if(|(at, _, _)| *at <= resume.at) {
            let d = known.entry(*session).or_default();
            *d = (*d).max(*deadline);
        }
        for (session, until) in &resume.until {
            let Some(&deadline) = known.get(session) else {
                continue;
            };
            if *until < deadline {
                out.push(Violation {
                    checker: "lease",
                    message: format!(
                        "node {} resumed session {session}'s lease at {} (term {}) to end at {}, \
                         {} before its client's deadline at {}",
                        resume.node,
                        ms(resume.at),
                        resume.term,
                        ms(*until),
                        ms(deadline - *until),
                        ms(deadline)
                    ),
                });
            }
        }
    }
    out
}

/// No expiry proposed before the client's deadline.
fn check_expiries(h: &HistoryData) -> Vec<Violation> {
    let mut out = Vec::new();
    // Sessions closed so far, by the client's own request: an expiry of one is a no-op.
    let mut closed = std::collections::BTreeSet::new();
    for end in h.committed_session_ends() {
        if !end.expiry {
            closed.extend(end.sessions);
            continue;
        }
        for session in end.sessions.iter().filter(|s| !closed.contains(*s)) {
            let Some(&deadline) = h.client_deadlines.get(session) else {
                continue;
            };
            if end.first_at < deadline {
                out.push(Violation {
                    checker: "lease",
                    message: format!(
                        "session {session} was expired by entry {} proposed at {} (committed by \
                         {}), {} before its client's deadline at {}",
                        end.index,
                        ms(end.first_at),
                        ms(end.known_at),
                        ms(deadline - end.first_at),
                        ms(deadline)
                    ),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::check;
    use crate::checkers::testkit::{expire, messages, t, Hist};
    use latchkey_core::{Op, SessionId, SessionKey};

    /// Sessions 1 and 2: their clients' deadlines are 4 s and 9 s; the cluster proposes the
    /// expiry of session 1 at 5 s (committed 5.2 s).
    fn base() -> Hist {
        let mut h = Hist::default();
        h.h.client_deadlines.insert(1, t(4_000));
        h.h.client_deadlines.insert(2, t(9_000));
        h.commit(7, expire(&[1]), 5_000, 5_200);
        h
    }

    #[test]
    fn accepts_an_expiry_after_the_clients_deadline() {
        let mut h = base();
        // Closing a session is the client's own doing, whatever its deadline.
        h.commit(
            8,
            Op::CloseSession {
                session: SessionKey {
                    id: SessionId(2),
                    secret: 0,
                },
            },
            6_000,
            6_100,
        );
        assert!(check(&h.h).is_empty());
    }

    /// Session 1's client computed a deadline of 4 s at 1 s, then 7 s at 3.5 s.
    fn resumed(until: u64, at: u64) -> Hist {
        let mut h = Hist::default();
        h.h.client_deadline_log.push((t(1_000), 1, t(4_000)));
        h.h.client_deadline_log.push((t(3_500), 1, t(7_000)));
        h.h.resumed_leases.push(crate::history::ResumedLeases {
            at: t(at),
            node: 2,
            term: 3,
            until: vec![(1, t(until))],
        });
        h
    }

    #[test]
    fn accepts_a_lease_resumed_to_the_clients_deadline_or_beyond() {
        assert!(check(&resumed(7_000, 5_000).h).is_empty());
        // Before 3.5 s the client knew only its 4 s deadline.
        assert!(check(&resumed(4_000, 3_000).h).is_empty());
    }

    #[test]
    fn rejects_a_lease_resumed_shorter_than_the_clients_deadline() {
        let m = messages(&check(&resumed(6_000, 5_000).h), "lease");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].contains("node 2 resumed session 1") && m[0].contains("7.000s"),
            "{m:?}"
        );
    }

    #[test]
    fn rejects_an_expiry_proposed_before_the_clients_deadline() {
        let mut h = base();
        h.commit(8, expire(&[2]), 8_000, 9_100);
        let m = messages(&check(&h.h), "lease");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].contains("session 2") && m[0].contains("8.000s") && m[0].contains("9.000s"),
            "{m:?}"
        );
    }
}
