//! Watch events: what `latchkey watch` streams, derived from one applied entry.
//!
//! Every member applies the same log, so an event's place in the stream is its entry's log index
//! and its ordinal among that entry's events ([`WatchEvent::position`]): the same on every member.
//! A watcher can therefore resume on any member after the last position it saw, with nothing
//! missed and nothing repeated. [`watch_events`] is pure; the server feeds it from its apply
//! observer.

use serde::{Deserialize, Serialize};

use crate::types::{Applied, Command, LockChange, Mode, Op, SessionId};

/// What happened to a lock.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WatchKind {
    /// A session got the lock (straight away or handed over from the queue).
    Granted,
    /// The holder released it, or closed its session.
    Released,
    /// The holder's session expired (its lease ran out).
    Expired,
    /// An operator ended the holder's session (`latchkey admin revoke`).
    Revoked,
    /// An operator took the lock from its holder (`latchkey admin release`).
    ForceReleased,
    /// A session joined the lock's queue.
    Queued,
    /// A queued request left the queue without the lock (its wait timed out or was cancelled,
    /// or its session went away).
    WaitEnded,
    /// The leader of an election published a new value (`proclaim`; issue #32).
    Proclaimed,
}

impl WatchKind {
    /// The name shown by the CLI and sent on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            WatchKind::Granted => "granted",
            WatchKind::Released => "released",
            WatchKind::Expired => "expired",
            WatchKind::Revoked => "revoked",
            WatchKind::ForceReleased => "force_released",
            WatchKind::Queued => "queued",
            WatchKind::WaitEnded => "wait_ended",
            WatchKind::Proclaimed => "proclaimed",
        }
    }

    pub fn parse(s: &str) -> Option<WatchKind> {
        [
            WatchKind::Granted,
            WatchKind::Released,
            WatchKind::Expired,
            WatchKind::Revoked,
            WatchKind::ForceReleased,
            WatchKind::Queued,
            WatchKind::WaitEnded,
            WatchKind::Proclaimed,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

/// One change to one lock, positioned in the log.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    /// The log index of the entry that made the change.
    pub index: u64,
    /// Its place among that entry's events (all of them, before any prefix filter), from 0.
    pub ordinal: u32,
    pub kind: WatchKind,
    pub lock: String,
    pub session: SessionId,
    /// The grant's fencing token: the one granted, or the one that ended. `None` for queue
    /// changes.
    pub token: Option<u64>,
    /// How a grant holds the lock (exclusive, shared, a permit of N): `Some` for `Granted`.
    pub mode: Option<Mode>,
    /// The election value a grant published (a campaign's) or a proclaim replaced it with.
    pub value: Option<Vec<u8>>,
}

impl WatchEvent {
    /// Where the event stands in every member's stream: events are ordered by it.
    pub fn position(&self) -> (u64, u32) {
        (self.index, self.ordinal)
    }
}

/// The events of the entry at `index`, in the order the table made its changes (a batch's:
/// operation by operation, numbered on through the entry).
pub fn watch_events(index: u64, cmd: &Command, applied: &Applied) -> Vec<WatchEvent> {
    applied
        .per_op(&cmd.op)
        .into_iter()
        .flat_map(|(op, applied)| applied.changes.iter().map(move |c| (op, c)))
        .enumerate()
        .map(|(i, (op, change))| {
            let lost = match op {
                Op::ExpireSessions { .. } => WatchKind::Expired,
                Op::RevokeSession { .. } => WatchKind::Revoked,
                Op::ForceRelease { .. } | Op::ForceReleaseTargeted { .. } => {
                    WatchKind::ForceReleased
                }
                _ => WatchKind::Released,
            };
            let (mut mode, mut value) = (None, None);
            let (kind, lock, session, token) = match change {
                LockChange::Granted {
                    name,
                    session,
                    token,
                    mode: m,
                    value: v,
                } => {
                    (mode, value) = (Some(*m), v.clone());
                    (WatchKind::Granted, name, *session, Some(*token))
                }
                LockChange::Released {
                    name,
                    session,
                    token,
                } => (lost, name, *session, Some(*token)),
                LockChange::Queued { name, session, .. } => {
                    (WatchKind::Queued, name, *session, None)
                }
                LockChange::WaitEnded { name, session, .. } => {
                    (WatchKind::WaitEnded, name, *session, None)
                }
                LockChange::Proclaimed {
                    name,
                    session,
                    token,
                    value: v,
                } => {
                    value = Some(v.clone());
                    (WatchKind::Proclaimed, name, *session, Some(*token))
                }
            };
            WatchEvent {
                index,
                ordinal: u32::try_from(i).expect("an entry makes fewer than 2^32 changes"),
                kind,
                lock: lock.clone(),
                session,
                token,
                mode,
                value,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Actor, SessionKey};
    use crate::LockTable;

    /// Applies commands from index 1 on, stamped at `now_ms` = 1000 × index, and collects
    /// every entry's events.
    struct Run {
        table: LockTable,
        index: u64,
        events: Vec<WatchEvent>,
    }

    impl Run {
        fn new() -> Run {
            Run {
                table: LockTable::default(),
                index: 0,
                events: Vec::new(),
            }
        }

        fn apply(&mut self, op: Op) -> u64 {
            self.index += 1;
            let cmd = Command {
                now_ms: 1000 * self.index,
                op,
            };
            let applied = self.table.apply(self.index, &cmd);
            self.events.extend(watch_events(self.index, &cmd, &applied));
            self.index
        }

        fn session(&mut self) -> SessionKey {
            let secret = 7;
            let id = self.apply(Op::CreateSession {
                ttl_ms: 10_000,
                secret,
            });
            SessionKey {
                id: SessionId(id),
                secret,
            }
        }

        fn acquire(&mut self, s: SessionKey, seq: u64, name: &str, wait_ms: u64) -> u64 {
            self.apply(Op::Acquire {
                session: s,
                seq,
                name: name.into(),
                wait_ms,
            })
        }

        fn take(&mut self) -> Vec<(u64, u32, WatchKind, String, u64, Option<u64>)> {
            self.events
                .drain(..)
                .map(|e| (e.index, e.ordinal, e.kind, e.lock, e.session.0, e.token))
                .collect()
        }
    }

    use WatchKind::*;

    #[test]
    fn grant_queue_release_handoff_and_expiry_in_order() {
        let mut r = Run::new();
        let a = r.session();
        let b = r.session();
        let g = r.acquire(a, 1, "jobs/x", 0);
        let q = r.acquire(b, 1, "jobs/x", 60_000);
        let rel = r.apply(Op::Release {
            session: a,
            seq: 2,
            name: "jobs/x".into(),
            token: g,
        });
        let exp = r.apply(Op::ExpireSessions { ids: vec![b.id] });
        assert_eq!(
            r.take(),
            vec![
                (g, 0, Granted, "jobs/x".into(), a.id.0, Some(g)),
                (q, 0, Queued, "jobs/x".into(), b.id.0, None),
                (rel, 0, Released, "jobs/x".into(), a.id.0, Some(g)),
                (rel, 1, Granted, "jobs/x".into(), b.id.0, Some(rel)),
                (exp, 0, Expired, "jobs/x".into(), b.id.0, Some(rel)),
            ]
        );
    }

    #[test]
    fn a_session_leaving_drops_its_waits_before_handing_on_its_holds() {
        let mut r = Run::new();
        let a = r.session();
        let b = r.session();
        let c = r.session();
        let ga = r.acquire(a, 1, "a", 0);
        let gb = r.acquire(b, 1, "b", 0);
        r.acquire(a, 2, "b", 60_000);
        r.acquire(c, 1, "a", 60_000);
        r.take();
        let close = r.apply(Op::CloseSession { session: a });
        assert_eq!(
            r.take(),
            vec![
                (close, 0, WaitEnded, "b".into(), a.id.0, None),
                (close, 1, Released, "a".into(), a.id.0, Some(ga)),
                (close, 2, Granted, "a".into(), c.id.0, Some(close)),
            ]
        );
        let revoke = r.apply(Op::RevokeSession {
            session: b.id,
            by: Actor::default(),
            reason: "stuck".into(),
        });
        assert_eq!(
            r.take(),
            vec![(revoke, 0, Revoked, "b".into(), b.id.0, Some(gb))]
        );
    }

    #[test]
    fn force_release_timeouts_and_cancels() {
        let mut r = Run::new();
        let a = r.session();
        let b = r.session();
        let c = r.session();
        let ga = r.acquire(a, 1, "x", 0);
        // b waits 1 ms (ends before the next entry's time), c waits long.
        r.acquire(b, 1, "x", 1);
        r.acquire(c, 1, "x", 60_000);
        r.take();
        let force = r.apply(Op::ForceRelease {
            name: "x".into(),
            token: None,
            by: Actor::default(),
            reason: "stuck".into(),
        });
        // b's wait had ended: it leaves unserved, c gets the lock.
        assert_eq!(
            r.take(),
            vec![
                (force, 0, ForceReleased, "x".into(), a.id.0, Some(ga)),
                (force, 1, WaitEnded, "x".into(), b.id.0, None),
                (force, 2, Granted, "x".into(), c.id.0, Some(force)),
            ]
        );
        r.acquire(a, 2, "x", 60_000);
        r.take();
        let cancel = r.apply(Op::CancelWait { session: a, seq: 2 });
        assert_eq!(
            r.take(),
            vec![(cancel, 0, WaitEnded, "x".into(), a.id.0, None)]
        );
        r.acquire(a, 3, "x", 1);
        r.take();
        let expire = r.apply(Op::ExpireWaits);
        assert_eq!(
            r.take(),
            vec![(expire, 0, WaitEnded, "x".into(), a.id.0, None)]
        );
    }

    #[test]
    fn a_retried_or_refused_request_changes_nothing() {
        let mut r = Run::new();
        let a = r.session();
        let b = r.session();
        r.acquire(a, 1, "x", 0);
        r.take();
        // The same request again: its recorded outcome, no new event.
        r.acquire(a, 1, "x", 0);
        // Held, no wait: not granted, no event.
        r.acquire(b, 1, "x", 0);
        // A release with the wrong token.
        r.apply(Op::Release {
            session: a,
            seq: 2,
            name: "x".into(),
            token: 999,
        });
        assert_eq!(r.take(), vec![]);
    }

    #[test]
    fn kinds_round_trip_through_their_names() {
        for k in [
            Granted,
            Released,
            Expired,
            Revoked,
            ForceReleased,
            Queued,
            WaitEnded,
            Proclaimed,
        ] {
            assert_eq!(WatchKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(WatchKind::parse("nope"), None);
    }
}
