//! No grant during a lock-delay (issue #32 item 4, `docs/primitives.md` "Lock-delay"): when
//! a mutex grant that asked for a lock-delay `d` is lost (its session expired: not a release
//! or a close), nobody else is granted its name until `d` has passed since the loss, in true
//! time, but for the clock drift the design allows.
//!
//! The rule, made so that it never blames a correct cluster:
//! - *The lost grant*: an acquire that asked for `d` (`HistoryData::delays`), answered
//!   `Granted { token }` to session `S` on a name only ever taken as a mutex. It was lost by
//!   the first committed entry `E` that ends `S`, if that is an `ExpireSessions` (a
//!   `CloseSession` first is the client's own release: no delay), and only if the client
//!   invoked no release of that token before `E` was proposed: one invoked earlier may have
//!   committed before `E` and freed the name with no delay, so that grant is not judged (one
//!   invoked later comes after `E` in the log: `E`'s leader held every index below `E` when
//!   it appended it).
//! - *The loss time*: when `E` was first appended by its leader (`Appended::first_at`, or the
//!   time it was known committed if no append was recorded). The table starts the delay when
//!   a member applies `E`, after that; the leader times it from when it first sees it, later
//!   still. So this is the earliest the delay can start: a bug that ends a delay early by less
//!   than `E`'s time from proposal to apply goes unseen, a correct cluster is never blamed.
//! - *The next grant*: every acknowledged grant of the name whose token is above `E`'s index
//!   (a mutex's grant takes the index of the entry that grants it, so it was granted after the
//!   loss). It was granted no later than its client heard the answer, so that answer must not
//!   come before loss time + `d`·(1 − `limits::CLOCK_DRIFT_PPM_MAX`/10⁶): the leader measures
//!   `d` on its monotonic clock, which may run that much fast. A failover only lengthens a
//!   delay (a new leader times it afresh), so the rule holds across one.
//!
//! Judged on the clients' answers and the committed log alone. [`lost_delays`] is also what
//! the coverage counts: delays started and followed by a grant, across a failover or not.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use latchkey_core::{limits, Op};

use super::{ms, Violation};
use crate::history::{Event, HistoryData, OpKind, Ret};

/// A delayed grant lost by its session's expiry, and the first grant of its name after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostDelay {
    pub lock: String,
    pub session: u64,
    /// The lost grant's token.
    pub token: u64,
    pub delay: Duration,
    /// The index of the `ExpireSessions` entry that ended the session.
    pub lost_by: u64,
    /// When that entry was first appended (true time).
    pub lost_at: Duration,
    /// The earliest answered grant of the name by an entry after `lost_by`, if any.
    pub next: Option<NextGrant>,
}

/// A grant of a name after a lost delayed grant of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextGrant {
    pub session: u64,
    pub token: u64,
    /// When its acquire was invoked and when its grant was answered (true time).
    pub invoked: Duration,
    pub answered: Duration,
}

impl LostDelay {
    /// The earliest true time the next grant may be answered: the loss, plus the delay as a
    /// leader whose clock runs fast by the most the design allows measures it.
    pub fn earliest_next(&self) -> Duration {
        let d = self.delay.as_nanos();
        let slack = d * u128::from(limits::CLOCK_DRIFT_PPM_MAX) / 1_000_000;
        self.lost_at + Duration::from_nanos((d - slack) as u64)
    }
}

/// Every delayed grant of the history lost by its session's expiry (see the module doc), in
/// the order of the entries that lost them.
pub fn lost_delays(h: &HistoryData) -> Vec<LostDelay> {
    if h.delays.is_empty() {
        return Vec::new();
    }
    // Per session: the first committed entry that ended it, and whether it was an expiry.
    let mut ended: BTreeMap<u64, (u64, bool)> = BTreeMap::new();
    // A batch entry's closes (issue #35) end their sessions at its index.
    for (&index, op) in h
        .committed
        .iter()
        .flat_map(|(i, c)| c.ops().map(move |o| (i, o)))
    {
        let (ids, expired): (Vec<u64>, bool) = match op {
            Op::ExpireSessions { ids } => (ids.iter().map(|s| s.0).collect(), true),
            Op::CloseSession { session } => (vec![session.id.0], false),
            _ => continue,
        };
        for id in ids {
            ended.entry(id).or_insert((index, expired));
        }
    }
    let proposed_at = |index: u64| {
        let c = &h.committed[&index];
        h.appended
            .get(&(index, c.leader.0, c.leader.1))
            .map_or(c.known_at, |a| a.first_at)
    };
    let with_modes = h.names_with_modes();
    // Each invocation's (session, lock, kind, time), and the releases each (session, lock,
    // token) was asked, by when first.
    let mut invoked = BTreeMap::new();
    let mut release_asked: BTreeMap<(u64, &str, u64), Duration> = BTreeMap::new();
    for e in &h.events {
        if let Event::Invoke {
            id,
            session,
            lock,
            op,
            at,
            ..
        } = e
        {
            invoked.insert(*id, (*session, lock.as_str(), op, *at));
            if let OpKind::Release { token } = op {
                release_asked.entry((*session, lock, *token)).or_insert(*at);
            }
        }
    }
    // Every answered grant: (id, session, lock, token, invoked, answered).
    let grants: Vec<(u64, u64, &str, u64, Duration, Duration)> = h
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Return {
                id,
                ret: Ret::Granted { token },
                at,
            } => {
                let &(session, lock, op, inv) = invoked.get(id)?;
                matches!(op, OpKind::Acquire).then_some((*id, session, lock, *token, inv, *at))
            }
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    for &(id, session, lock, token, _, _) in &grants {
        let Some(&delay) = h.delays.get(&id) else {
            continue;
        };
        if with_modes.contains(lock) {
            continue;
        }
        let Some(&(lost_by, true)) = ended.get(&session) else {
            continue;
        };
        let lost_at = proposed_at(lost_by);
        if release_asked
            .get(&(session, lock, token))
            .is_some_and(|&at| at <= lost_at)
        {
            continue;
        }
        let next = grants
            .iter()
            .filter(|g| g.2 == lock && g.3 > lost_by)
            .min_by_key(|g| (g.5, g.3))
            .map(|g| NextGrant {
                session: g.1,
                token: g.3,
                invoked: g.4,
                answered: g.5,
            });
        out.push(LostDelay {
            lock: lock.to_owned(),
            session,
            token,
            delay,
            lost_by,
            lost_at,
            next,
        });
    }
    out.sort_by_key(|l| (l.lost_by, l.lock.clone(), l.token));
    // One grant is lost once (a grant answered twice, by a retry, is one grant).
    let mut seen = BTreeSet::new();
    out.retain(|l| seen.insert((l.lock.clone(), l.token)));
    out
}

pub fn check(h: &HistoryData) -> Vec<Violation> {
    let mut out = Vec::new();
    for l in lost_delays(h) {
        let Some(next) = l.next else { continue };
        let earliest = l.earliest_next();
        if next.answered < earliest {
            out.push(Violation {
                checker: "lock_delay",
                message: format!(
                    "lock {:?}: session {}'s grant (token {}, lock-delay {}) was lost by the \
                     expiry in entry {} proposed at {}, but session {} was granted it (token {}) \
                     and answered at {}, {} into the delay ({} before it could end at {})",
                    l.lock,
                    l.session,
                    l.token,
                    ms(l.delay),
                    l.lost_by,
                    ms(l.lost_at),
                    next.session,
                    next.token,
                    ms(next.answered),
                    ms(next.answered.saturating_sub(l.lost_at)),
                    ms(earliest - next.answered),
                    ms(earliest)
                ),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use latchkey_core::{Op, SessionId, SessionKey};

    use super::{check, lost_delays};
    use crate::checkers::testkit::{expire, messages, t, Hist};
    use crate::history::{OpKind, Ret};

    /// Client 1 takes `a` asking for a 2 s delay (token 5, answered at 100 ms); its session
    /// expires by entry 9, proposed at 1 s. Client 2 asked at 500 ms and is granted by entry
    /// 12, answered at `answered`.
    fn lost(answered: u64) -> Hist {
        let mut h = Hist::default();
        h.granted(1, "a", 0, 5, 100);
        h.h.delays.insert(1, t(2_000));
        h.commit(9, expire(&[1]), 1_000, 1_050);
        h.granted(2, "a", 500, 12, answered);
        h
    }

    #[test]
    fn accepts_a_grant_after_the_delay() {
        let h = lost(3_100);
        assert!(check(&h.h).is_empty(), "{:?}", check(&h.h));
        let l = lost_delays(&h.h);
        assert_eq!(l.len(), 1, "{l:?}");
        assert_eq!((l[0].lost_by, l[0].lost_at), (9, t(1_000)));
        assert_eq!(l[0].next.map(|n| n.token), Some(12));
        // Within the drift the design allows (1% of 2 s), not blamed.
        assert!(check(&lost(2_990).h).is_empty());
    }

    #[test]
    fn rejects_a_grant_during_the_delay() {
        let m = messages(&check(&lost(2_000).h), "lock_delay");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].contains("session 1's grant (token 5")
                && m[0].contains("entry 9")
                && m[0].contains("session 2 was granted it (token 12)"),
            "{m:?}"
        );
    }

    #[test]
    fn a_release_or_a_close_starts_no_delay() {
        // Released before the expiry was proposed: not judged.
        let mut h = lost(1_200);
        h.op(1, "a", OpKind::Release { token: 5 }, 900, None);
        assert!(check(&h.h).is_empty(), "{:?}", check(&h.h));
        // Closed by its client before any expiry: not judged.
        let mut h = Hist::default();
        h.granted(1, "a", 0, 5, 100);
        h.h.delays.insert(1, t(2_000));
        let close = Op::CloseSession {
            session: SessionKey {
                id: SessionId(1),
                secret: 0,
            },
        };
        h.commit(8, close, 900, 950);
        h.commit(9, expire(&[1]), 1_000, 1_050);
        h.granted(2, "a", 500, 12, 1_200);
        assert!(check(&h.h).is_empty(), "{:?}", check(&h.h));
        assert!(lost_delays(&h.h).is_empty());
    }

    #[test]
    fn judges_only_grants_that_asked_for_a_delay_and_later_grants() {
        // No delay asked: nothing judged.
        let mut h = lost(1_200);
        h.h.delays.clear();
        assert!(check(&h.h).is_empty());
        // A grant by an entry before the loss (token 8 < 9) is no grant after it.
        let mut h = Hist::default();
        h.granted(1, "a", 0, 5, 100);
        h.h.delays.insert(1, t(2_000));
        h.commit(9, expire(&[1]), 1_000, 1_050);
        h.op(
            2,
            "a",
            OpKind::Acquire,
            500,
            Some((Ret::Granted { token: 8 }, 1_100)),
        );
        assert!(check(&h.h).is_empty(), "{:?}", check(&h.h));
    }
}
