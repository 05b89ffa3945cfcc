//! Lock-delay in the lock table (issue #32 item 4), rule by rule: after a holder's grant is
//! lost (its session expired or was revoked) the name is not granted again until an
//! `EndDelays` entry names the delay (the leader proposes it when the delay has run on its
//! monotonic clock: `crates/server/src/node/delays.rs`) or an operator force-releases it; a
//! release or a close hands it over at once. `model.rs` checks the same rules on random
//! interleavings.

mod support;

use latchkey_core::codec::{
    decode_table, encode_table, SNAPSHOT_FORMAT_VERSION, SNAPSHOT_FORMAT_VERSION_V9,
};
use latchkey_core::limits::{self, LOCK_DELAY_MS_MAX, WAIT_TIMEOUT_MS_MAX};
use latchkey_core::*;
use support::apply_checked;

/// A table driven entry by entry (index `i` at `now_ms` = 1000 × i), sessions by number.
struct T {
    table: LockTable,
    index: u64,
    seq: u64,
}

fn key(id: u64) -> SessionKey {
    SessionKey {
        id: SessionId(id),
        secret: id,
    }
}

fn by() -> Actor {
    Actor {
        identity: None,
        claimed: "ops".into(),
    }
}

impl T {
    /// A table with sessions 1..=n (session i has id i).
    fn new(n: u64) -> T {
        let mut t = T {
            table: LockTable::new(),
            index: 0,
            seq: 0,
        };
        for i in 1..=n {
            t.apply(Op::CreateSession {
                ttl_ms: 15_000,
                secret: i,
            });
        }
        t
    }

    fn now_ms(&self) -> u64 {
        1_000 * self.index
    }

    fn apply(&mut self, op: Op) -> Applied {
        self.apply_at(1_000 * (self.index + 1), op)
    }

    /// The next entry, stamped `now_ms`.
    fn apply_at(&mut self, now_ms: u64, op: Op) -> Applied {
        self.index += 1;
        let cmd = Command { now_ms, op };
        apply_checked(&mut self.table, self.index, &cmd)
    }

    /// `who` acquires `name` with a lock-delay of `delay_ms`, waiting `wait_ms`; answers the
    /// entry and the request's seq.
    fn take(&mut self, who: u64, name: &str, wait_ms: u64, delay_ms: u64) -> (Applied, u64) {
        self.seq += 1;
        let seq = self.seq;
        let op = Op::AcquireDelayed {
            session: key(who),
            seq,
            name: name.into(),
            wait_ms,
            lock_delay_ms: delay_ms,
        };
        (self.apply(op), seq)
    }

    fn release(&mut self, who: u64, name: &str, token: u64) -> Applied {
        self.seq += 1;
        self.apply(Op::Release {
            session: key(who),
            seq: self.seq,
            name: name.into(),
            token,
        })
    }

    fn expire(&mut self, ids: &[u64]) -> Applied {
        self.apply(Op::ExpireSessions {
            ids: ids.iter().map(|i| SessionId(*i)).collect(),
        })
    }

    /// The running delays as an `EndDelays` names them.
    fn running(&self) -> Vec<DelayEnd> {
        self.table
            .running_delays()
            .map(|(name, token, _)| DelayEnd {
                name: name.into(),
                token,
            })
            .collect()
    }

    /// An `EndDelays` of every running delay, as the leader proposes it once they have run.
    fn end_running_delays(&mut self) -> Applied {
        let ends = self.running();
        assert!(!ends.is_empty(), "no delay runs");
        let a = self.apply(Op::EndDelays { ends });
        assert_ne!(a.outcome, Outcome::DelaysEnded { count: 0 });
        a
    }

    fn holder(&self, name: &str) -> Option<(u64, u64)> {
        self.table
            .describe(name)
            .and_then(|l| l.holder)
            .map(|h| (h.session.0, h.token))
    }
}

#[test]
fn an_expired_holder_s_delay_keeps_the_name_from_its_waiter_until_it_has_run() {
    let mut t = T::new(3);
    let (a, _) = t.take(1, "x", 0, 5_000);
    let Outcome::Granted { token } = a.outcome else {
        panic!("{a:?}")
    };
    assert_eq!(t.table.describe("x").unwrap().lock_delay_ms, Some(5_000));
    let (b, b_seq) = t.take(2, "x", WAIT_TIMEOUT_MS_MAX, 0);
    assert_eq!(b.outcome, Outcome::Queued { position: 1 });

    let e = t.expire(&[1]);
    let expired_at = t.now_ms();
    assert!(e.handoffs.is_empty(), "handed over during the delay: {e:?}");
    let state = t.table.describe("x").expect("the delay keeps the name");
    assert_eq!(state.holder, None);
    assert_eq!(state.waiters, 1);
    assert_eq!(state.delay_until_ms, Some(expired_at + 5_000));
    assert_eq!(state.lock_delay_ms, Some(5_000));
    assert_eq!(
        state.delay_token,
        Some(token),
        "the token a force-release names"
    );
    assert_eq!(
        t.table.running_delays().collect::<Vec<_>>(),
        [("x", token, 5_000)]
    );
    // The table keeps no end time: however late an entry's stamp, only an `EndDelays` that
    // names the delay ends it (the leader times it on its monotonic clock).
    for now_ms in [expired_at + 5_000, expired_at + 3_600_000, u64::MAX / 2] {
        let a = t.apply_at(now_ms, Op::EndDelays { ends: Vec::new() });
        assert!(a.handoffs.is_empty(), "handed over by a wall clock: {a:?}");
    }

    // Neither a try-lock nor a new waiter gets it while it runs; the waiter queues behind.
    let (c, _) = t.take(3, "x", 0, 0);
    assert_eq!(c.outcome, Outcome::NotGranted);
    let (c, _) = t.take(3, "x", WAIT_TIMEOUT_MS_MAX, 0);
    assert_eq!(c.outcome, Outcome::Queued { position: 2 });
    assert_eq!(
        t.table.request_state(SessionId(2), b_seq),
        Some(RequestState::Waiting {
            name: "x".into(),
            position: 1
        })
    );

    let end = t.end_running_delays();
    assert_eq!(end.outcome, Outcome::DelaysEnded { count: 1 });
    assert_eq!(end.handoffs.len(), 1);
    assert_eq!(end.handoffs[0].session, SessionId(2));
    assert_eq!(end.handoffs[0].seq, b_seq);
    assert!(end.handoffs[0].token > token);
    assert_eq!(t.holder("x"), Some((2, t.index)));
    assert_eq!(t.table.running_delays().count(), 0);
    // The waiter asked for no delay: its grant has none.
    assert_eq!(t.table.describe("x").unwrap().lock_delay_ms, None);
    assert_eq!(t.table.describe("x").unwrap().waiters, 1);
}

#[test]
fn a_release_or_a_close_hands_over_at_once() {
    let mut t = T::new(3);
    let (a, _) = t.take(1, "x", 0, 60_000);
    let Outcome::Granted { token } = a.outcome else {
        panic!()
    };
    t.take(2, "x", WAIT_TIMEOUT_MS_MAX, 60_000);
    let r = t.release(1, "x", token);
    assert_eq!(r.outcome, Outcome::Released);
    assert_eq!(r.handoffs.len(), 1);
    assert_eq!(t.holder("x").map(|h| h.0), Some(2));
    // The waiter's asked delay is now its grant's.
    assert_eq!(t.table.describe("x").unwrap().lock_delay_ms, Some(60_000));
    t.take(3, "x", WAIT_TIMEOUT_MS_MAX, 0);
    let c = t.apply(Op::CloseSession { session: key(2) });
    assert_eq!(c.handoffs.len(), 1);
    assert_eq!(t.holder("x").map(|h| h.0), Some(3));
    assert_eq!(t.table.running_delays().count(), 0);
}

#[test]
fn a_revoke_starts_the_delay_and_a_force_release_of_the_delayed_name_ends_it() {
    let mut t = T::new(4);
    t.take(1, "x", 0, 3_000);
    t.take(2, "x", WAIT_TIMEOUT_MS_MAX, 0);
    let r = t.apply(Op::RevokeSession {
        session: SessionId(1),
        by: by(),
        reason: "stuck".into(),
    });
    assert_eq!(r.outcome, Outcome::SessionRevoked { locks: 1 });
    assert!(r.handoffs.is_empty());
    t.end_running_delays();
    assert_eq!(t.holder("x").map(|h| h.0), Some(2));

    let (a, _) = t.take(3, "y", 0, 2_000);
    let Outcome::Granted { token } = a.outcome else {
        panic!()
    };
    t.take(1 + 1, "y", WAIT_TIMEOUT_MS_MAX, 0);
    t.expire(&[3]);
    let at = t.now_ms();
    assert_eq!(
        t.table.describe("y").unwrap().delay_until_ms,
        Some(at + 2_000)
    );
    let (b, _) = t.take(4, "y", 0, 0);
    assert_eq!(b.outcome, Outcome::NotGranted);
    // An operator's way out: a force-release of the delayed name (under another token: a
    // mismatch, nothing changes) ends the delay now, handing the name to its waiter, audited.
    let wrong = t.apply(Op::ForceRelease {
        name: "y".into(),
        token: Some(token + 1),
        by: by(),
        reason: "wedged".into(),
    });
    assert_eq!(
        wrong.outcome,
        Outcome::Rejected(Rejection::TokenMismatch {
            name: "y".into(),
            token: token + 1,
            holder_token: token
        })
    );
    assert!(t.table.describe("y").unwrap().holder.is_none());
    let f = t.apply(Op::ForceRelease {
        name: "y".into(),
        token: None,
        by: by(),
        reason: "wedged".into(),
    });
    assert_eq!(
        f.outcome,
        Outcome::ForceReleased {
            session: SessionId(3),
            token
        }
    );
    assert_eq!(f.handoffs.len(), 1, "{f:?}");
    assert_eq!(t.holder("y"), Some((2, t.index)));
    assert_eq!(t.table.running_delays().count(), 0);
    let audited = t.table.audit().last().expect("audited").clone();
    assert!(
        matches!(&audited.action, AuditAction::ForceRelease { name, token: tk, next_token, .. }
            if name == "y" && *tk == token && *next_token == Some(t.index)),
        "{audited:?}"
    );
}

fn force(name: &str, token: Option<u64>, target: ForceTarget) -> Op {
    Op::ForceReleaseTargeted {
        name: name.into(),
        token,
        target,
        by: by(),
        reason: "wedged".into(),
    }
}

/// A force-release of a holder that asked for a lock-delay starts the delay; its retry (the
/// same request after a lost answer: the holder's token) answers what the first attempt did
/// and changes nothing, so the dead holder's late writes stay out for the whole delay. Only a
/// request that names the delay as its target ends it (and only the delay under its token).
/// Before `ForceReleaseTargeted`, the retry ended the delay: `ForceRelease` still does, as
/// logs written by earlier builds hold it.
#[test]
fn a_retried_force_release_keeps_the_delay_its_first_attempt_started() {
    let mut t = T::new(2);
    let (a, _) = t.take(1, "x", 0, 9_000);
    let Outcome::Granted { token } = a.outcome else {
        panic!("{a:?}")
    };
    t.take(2, "x", WAIT_TIMEOUT_MS_MAX, 0);
    assert!(t.table.uses_lock_delay("x"));
    let first = t.apply(force("x", Some(token), ForceTarget::Holder));
    let taken = Outcome::ForceReleased {
        session: SessionId(1),
        token,
    };
    assert_eq!(first.outcome, taken);
    assert_eq!(t.running().len(), 1, "the release started the delay");
    let audited = t.table.audit().count();
    let before = (t.table.describe("x"), t.running());

    let retry = t.apply(force("x", Some(token), ForceTarget::Holder));
    assert_eq!(retry.outcome, taken, "the first attempt's answer");
    assert!(
        retry.changes.is_empty() && retry.handoffs.is_empty(),
        "{retry:?}"
    );
    assert_eq!(
        (t.table.describe("x"), t.running()),
        before,
        "nothing changed"
    );
    assert_eq!(t.table.audit().count(), audited, "audited once");
    assert_eq!(t.holder("x"), None);

    // Without a token (nobody holds it) or under another: nothing to take, nothing changes.
    for token in [None, Some(token + 1)] {
        let other = t.apply(force("x", token, ForceTarget::Holder));
        assert_eq!(
            other.outcome,
            Outcome::Rejected(Rejection::LockNotHeld { name: "x".into() })
        );
    }
    // Ending the delay names it: under another token, refused; under its own, it ends and
    // the waiter gets the name.
    let stale = t.apply(force("x", Some(token + 1), ForceTarget::Delay));
    assert_eq!(
        stale.outcome,
        Outcome::Rejected(Rejection::NoLockDelay {
            name: "x".into(),
            token: Some(token + 1)
        })
    );
    assert_eq!(t.running().len(), 1);
    let end = t.apply(force("x", Some(token), ForceTarget::Delay));
    assert_eq!(end.outcome, taken);
    let granted = t.index;
    assert_eq!(t.holder("x"), Some((2, granted)));
    assert_eq!(t.table.audit().count(), audited + 1);
    // Its retry finds no delay: refused, and the new holder keeps the name.
    let again = t.apply(force("x", Some(token), ForceTarget::Delay));
    assert_eq!(
        again.outcome,
        Outcome::Rejected(Rejection::NoLockDelay {
            name: "x".into(),
            token: Some(token)
        })
    );
    let holder_again = t.apply(force("x", Some(token), ForceTarget::Holder));
    assert_eq!(
        holder_again.outcome,
        Outcome::Rejected(Rejection::TokenMismatch {
            name: "x".into(),
            token,
            holder_token: granted
        })
    );
    assert_eq!(t.holder("x"), Some((2, granted)));
    // A delay's target on a name in no delay takes nobody's grant, with or without a token.
    let none = t.apply(force("x", None, ForceTarget::Delay));
    assert_eq!(
        none.outcome,
        Outcome::Rejected(Rejection::NoLockDelay {
            name: "x".into(),
            token: None
        })
    );
    assert_eq!(t.holder("x"), Some((2, granted)));
}

/// A delay its holder's expiry started is nobody's force-release: a release naming its token
/// (an operator who read the holder's token just before the session expired) finds nobody
/// holding, and is told so, rather than answered as if it had taken the grant.
#[test]
fn a_release_naming_a_delay_an_expiry_started_is_lock_not_held() {
    let mut t = T::new(2);
    let (a, _) = t.take(1, "x", 0, 9_000);
    let Outcome::Granted { token } = a.outcome else {
        panic!("{a:?}")
    };
    t.take(2, "x", WAIT_TIMEOUT_MS_MAX, 0);
    t.expire(&[1]);
    assert_eq!(t.running().len(), 1);
    let late = t.apply(force("x", Some(token), ForceTarget::Holder));
    assert_eq!(
        late.outcome,
        Outcome::Rejected(Rejection::LockNotHeld { name: "x".into() })
    );
    assert_eq!(t.running().len(), 1, "the delay runs on");
}

/// The entry earlier builds proposed (and logs hold) keeps its meaning: a `ForceRelease` that
/// finds a delay running under its token ends it, as it did when it was written.
#[test]
fn an_untargeted_force_release_still_ends_a_running_delay() {
    let mut t = T::new(2);
    let (a, _) = t.take(1, "x", 0, 9_000);
    let Outcome::Granted { token } = a.outcome else {
        panic!("{a:?}")
    };
    t.take(2, "x", WAIT_TIMEOUT_MS_MAX, 0);
    let untargeted = || Op::ForceRelease {
        name: "x".into(),
        token: Some(token),
        by: by(),
        reason: "wedged".into(),
    };
    t.apply(untargeted());
    assert_eq!(t.running().len(), 1);
    let second = t.apply(untargeted());
    assert_eq!(
        second.outcome,
        Outcome::ForceReleased {
            session: SessionId(1),
            token
        }
    );
    assert_eq!(t.holder("x"), Some((2, t.index)));
}

/// An `EndDelays` names each delay by the token of the grant whose loss started it: a stale
/// one (proposed for an earlier delay of the name, applied after a later one started) ends
/// nothing, so a delay never ends before its own time.
#[test]
fn an_end_that_names_an_earlier_delay_of_the_name_ends_nothing() {
    let mut t = T::new(3);
    let (a, _) = t.take(1, "x", 0, 5_000);
    let Outcome::Granted { token: first } = a.outcome else {
        panic!("{a:?}")
    };
    t.take(2, "x", WAIT_TIMEOUT_MS_MAX, 5_000);
    t.expire(&[1]);
    let stale = t.running();
    assert_eq!(stale[0].token, first);
    t.end_running_delays();
    let (_, second) = t.holder("x").expect("handed over");
    t.expire(&[2]);
    assert_eq!(
        t.table.running_delays().collect::<Vec<_>>(),
        [("x", second, 5_000)]
    );
    let a = t.apply(Op::EndDelays { ends: stale });
    assert_eq!(a.outcome, Outcome::DelaysEnded { count: 0 });
    assert_eq!(t.table.running_delays().count(), 1);
    // Unknown names are passed over too.
    let a = t.apply(Op::EndDelays {
        ends: vec![DelayEnd {
            name: "nope".into(),
            token: second,
        }],
    });
    assert_eq!(a.outcome, Outcome::DelaysEnded { count: 0 });
    assert_eq!(
        t.end_running_delays().outcome,
        Outcome::DelaysEnded { count: 1 }
    );
    assert!(t.table.describe("x").is_none());
}

/// A running delay outlives its session: it stays charged to the identity the session
/// belonged to (the server's quota on delays reads it), and the group keeps at most
/// `DELAYS_MAX` (the attacker review of issue #32: delays charged to nobody let one tenant
/// fill `LOCKS_MAX` for every other).
#[test]
fn a_running_delay_counts_for_its_identity_and_the_group_keeps_at_most_delays_max() {
    let mut t = T::new(0);
    for (i, who) in [(1u64, "tenant"), (2, "tenant"), (3, "other")] {
        t.apply(Op::OpenSession {
            ttl_ms: 15_000,
            secret: i,
            identity: Some(who.into()),
            owner: None,
        });
    }
    t.take(1, "a", 0, 1_000);
    t.take(1, "b", 0, 1_000);
    t.take(2, "a", WAIT_TIMEOUT_MS_MAX, 1_000);
    let usage = t.table.identity_usage("tenant");
    assert_eq!((usage.sessions, usage.waiting, usage.delays), (2, 1, 3));
    t.expire(&[1, 2]);
    let usage = t.table.identity_usage("tenant");
    assert_eq!((usage.sessions, usage.waiting, usage.delays), (0, 0, 2));
    assert_eq!(t.table.identity_usage("other").delays, 0);
    t.end_running_delays();
    assert_eq!(t.table.identity_usage("tenant").delays, 0);

    // The group's bound: one session's 1,024 names at most, so several sessions fill it.
    // The first sessions belong to one identity, "greedy": whatever its quota (checked by the
    // server before proposing, so calls in flight may pass it together), the table keeps at
    // most `DELAYS_PER_IDENTITY_MAX` of its delays. The others have no identity.
    let mut t = T::new(0);
    let per_session = limits::LOCKS_PER_SESSION_MAX;
    let sessions = limits::DELAYS_MAX.div_ceil(per_session) as u64;
    let greedy = (limits::DELAYS_PER_IDENTITY_MAX / per_session) as u64;
    for i in 1..=sessions + 1 {
        t.apply(Op::OpenSession {
            ttl_ms: 15_000,
            secret: i,
            identity: (i <= greedy).then(|| "greedy".into()),
            owner: None,
        });
    }
    // Filled without the invariant check after each entry (a scan of the table each),
    // checked once full.
    let mut n = 0;
    for i in 1..=sessions {
        if i == greedy + 1 {
            // Every greedy session's names are delayed: its next is refused by the table,
            // though the group has room.
            t.seq += 1;
            let over = t.apply(Op::AcquireDelayed {
                session: key(1),
                seq: t.seq,
                name: "greedy-more".into(),
                wait_ms: 0,
                lock_delay_ms: 1_000,
            });
            assert_eq!(
                over.outcome,
                Outcome::Rejected(Rejection::TooManyDelays {
                    max: limits::DELAYS_PER_IDENTITY_MAX
                })
            );
        }
        for _ in 0..per_session {
            if n == limits::DELAYS_MAX {
                break;
            }
            t.index += 1;
            t.seq += 1;
            let cmd = Command {
                now_ms: 1_000 * t.index,
                op: Op::AcquireDelayed {
                    session: key(i),
                    seq: t.seq,
                    name: format!("n{n}"),
                    wait_ms: 0,
                    lock_delay_ms: 1_000,
                },
            };
            let a = t.table.apply(t.index, &cmd);
            assert!(matches!(a.outcome, Outcome::Granted { .. }), "{a:?}");
            n += 1;
        }
    }
    t.table
        .check_invariants()
        .expect("invariants hold when full");
    assert_eq!(
        t.table.identity_usage("greedy").delays,
        limits::DELAYS_PER_IDENTITY_MAX
    );
    let copy = decode_table(&encode_table(&t.table)).expect("decodes");
    assert_eq!(
        copy.identity_usage("greedy").delays,
        limits::DELAYS_PER_IDENTITY_MAX,
        "counted again on decode"
    );
    let (over, _) = t.take(sessions + 1, "one-more", 0, 1_000);
    assert_eq!(
        over.outcome,
        Outcome::Rejected(Rejection::TooManyDelays {
            max: limits::DELAYS_MAX
        })
    );
    assert!(t.table.describe("one-more").is_none());
    // Without a delay the same acquire is granted.
    let (plain, _) = t.take(sessions + 1, "one-more", 0, 0);
    assert!(
        matches!(plain.outcome, Outcome::Granted { .. }),
        "{plain:?}"
    );
}

#[test]
fn a_waiter_whose_wait_ended_during_the_delay_is_not_granted() {
    let mut t = T::new(3);
    t.take(1, "x", 0, 10_000);
    let (_, b_seq) = t.take(2, "x", 2_000, 0);
    let (_, c_seq) = t.take(3, "x", WAIT_TIMEOUT_MS_MAX, 0);
    t.expire(&[1]);
    // The leader's ExpireWaits ends b's wait inside the delay, out of the delayed queue.
    let mut ended = false;
    for _ in 0..5 {
        let a = t.apply(Op::ExpireWaits);
        if a.ended_waits.contains(&(SessionId(2), b_seq)) {
            ended = true;
            break;
        }
    }
    assert!(ended);
    assert_eq!(t.table.describe("x").unwrap().waiters, 1);
    let end = t.end_running_delays();
    assert_eq!(end.handoffs[0].session, SessionId(3));
    assert_eq!(end.handoffs[0].seq, c_seq);
}

#[test]
fn delays_out_of_range_or_on_shared_names_are_refused_changing_nothing() {
    let mut t = T::new(3);
    let (a, _) = t.take(1, "x", 0, LOCK_DELAY_MS_MAX + 1);
    assert_eq!(
        a.outcome,
        Outcome::Rejected(Rejection::LockDelayOutOfRange {
            lock_delay_ms: LOCK_DELAY_MS_MAX + 1,
            max: LOCK_DELAY_MS_MAX
        })
    );
    assert!(t.table.describe("x").is_none());
    t.take(1, "x", 0, 1_000);
    t.seq += 1;
    let r = t.apply(Op::AcquireWith {
        session: key(2),
        seq: t.seq,
        name: "x".into(),
        wait_ms: WAIT_TIMEOUT_MS_MAX,
        mode: Mode::Shared,
    });
    assert_eq!(
        r.outcome,
        Outcome::Rejected(Rejection::LockDelayConflict { name: "x".into() })
    );
    t.seq += 1;
    t.apply(Op::AcquireWith {
        session: key(2),
        seq: t.seq,
        name: "s".into(),
        wait_ms: 0,
        mode: Mode::Permits(2),
    });
    let (c, _) = t.take(3, "s", WAIT_TIMEOUT_MS_MAX, 1_000);
    assert_eq!(
        c.outcome,
        Outcome::Rejected(Rejection::LockDelayConflict { name: "s".into() })
    );
}

#[test]
fn a_retried_acquire_gets_its_first_outcome_and_a_snapshot_keeps_the_delay() {
    let mut t = T::new(2);
    // Without a delay, the table still writes format 9 or older.
    assert_ne!(encode_table(&t.table)[0], SNAPSHOT_FORMAT_VERSION);
    let (a, seq) = t.take(1, "x", 0, 4_000);
    let again = t.apply(Op::AcquireDelayed {
        session: key(1),
        seq,
        name: "x".into(),
        wait_ms: 0,
        lock_delay_ms: 4_000,
    });
    assert_eq!(again.outcome, a.outcome);
    let (_, b_seq) = t.take(2, "x", WAIT_TIMEOUT_MS_MAX, 0);
    t.expire(&[1]);
    let bytes = encode_table(&t.table);
    assert_eq!(bytes[0], SNAPSHOT_FORMAT_VERSION);
    let mut copy = decode_table(&bytes).expect("decodes");
    assert_eq!(copy, t.table);
    assert_eq!(copy.bytes(), t.table.bytes());
    // Both end the delay in the same entry with the same grant.
    t.index += 1;
    let cmd = Command {
        now_ms: 1_000 * t.index,
        op: Op::EndDelays { ends: t.running() },
    };
    let mine = apply_checked(&mut t.table, t.index, &cmd);
    let theirs = apply_checked(&mut copy, t.index, &cmd);
    assert_eq!(mine, theirs);
    assert_eq!(mine.handoffs[0].seq, b_seq);
    assert_eq!(copy, t.table);
}

/// Elections and lock-delay: a campaign takes no delay of its own (`Op::Campaign` has none; the
/// server refuses one), but may wait for a name whose holder asked for one. It keeps its place
/// and its value through the delay, and `EndDelays` makes it the leader with that value. The
/// lost holder's token cannot proclaim meanwhile: nobody leads while a delay runs.
#[test]
fn a_campaign_waits_out_a_lock_delay_and_then_leads_with_its_value() {
    let mut t = T::new(3);
    let (a, _) = t.take(1, "svc", 0, 5_000);
    let Outcome::Granted { token: old } = a.outcome else {
        panic!("{a:?}")
    };
    t.seq += 1;
    let campaign_seq = t.seq;
    let c = t.apply(Op::Campaign {
        session: key(2),
        seq: campaign_seq,
        name: "svc".into(),
        wait_ms: WAIT_TIMEOUT_MS_MAX,
        value: b"2:80".to_vec(),
    });
    assert_eq!(c.outcome, Outcome::Queued { position: 1 });
    t.expire(&[1]);
    let state = t.table.describe("svc").expect("in a delay");
    assert!(
        state.holder.is_none() && state.delay_until_ms.is_some(),
        "{state:?}"
    );
    // A second campaign during the delay queues behind the first, with its own value.
    t.seq += 1;
    let late = t.apply(Op::Campaign {
        session: key(3),
        seq: t.seq,
        name: "svc".into(),
        wait_ms: WAIT_TIMEOUT_MS_MAX,
        value: b"3:80".to_vec(),
    });
    assert_eq!(late.outcome, Outcome::Queued { position: 2 });
    // Nobody leads during the delay: the lost grant's token proclaims nothing.
    t.seq += 1;
    let p = t.apply(Op::Proclaim {
        session: key(2),
        seq: t.seq,
        name: "svc".into(),
        token: old,
        value: b"x".to_vec(),
    });
    assert_eq!(
        p.outcome,
        Outcome::Rejected(Rejection::NotElectionLeader {
            name: "svc".into(),
            token: old
        })
    );
    let ended = t.end_running_delays();
    assert_eq!(ended.handoffs.len(), 1, "{ended:?}");
    let h = &ended.handoffs[0];
    assert_eq!((h.session, h.seq), (SessionId(2), campaign_seq));
    assert!(h.token > old);
    assert!(
        ended.changes.iter().any(|c| matches!(c,
            LockChange::Granted { session, value: Some(v), mode: Mode::Exclusive, .. }
                if *session == SessionId(2) && v == b"2:80")),
        "the grant after the delay publishes the campaign's value: {:?}",
        ended.changes
    );
    let leader = t.table.describe("svc").and_then(|l| l.holder).expect("led");
    assert_eq!(leader.session, SessionId(2));
    assert_eq!(leader.value.as_deref(), Some(&b"2:80"[..]));
    // The campaign's grant asked for no delay: its loss hands over at once.
    let handed = t.expire(&[2]);
    assert_eq!(handed.handoffs.len(), 1, "{handed:?}");
    let leader = t.table.describe("svc").and_then(|l| l.holder).expect("led");
    assert_eq!(leader.value.as_deref(), Some(&b"3:80"[..]));
    // With no delay left, the leader's value makes it format 9, as before lock-delay (as a
    // build before request fingerprints, snapshot format 11, holds it).
    t.table.forget_request_prints();
    let bytes = encode_table(&t.table);
    assert_eq!(bytes[0], SNAPSHOT_FORMAT_VERSION_V9);
    assert_eq!(decode_table(&bytes).expect("decodes"), t.table);
}

/// Conflict events (issue #32 item 5): a session's contended names, in name order, at most
/// `CONTENDED_PER_LEASE_MAX`; the list is cut only when one more contended name exists past
/// them (a session with exactly that many and other names held is answered in full), or when
/// the answer's budget runs out.
#[test]
fn a_contended_list_is_cut_only_when_more_remain() {
    let max = limits::CONTENDED_PER_LEASE_MAX;
    let mut t = T::new(2);
    for i in 0..max {
        t.take(1, &format!("c{i:03}"), 0, 0);
        t.take(2, &format!("c{i:03}"), WAIT_TIMEOUT_MS_MAX, 0);
    }
    for i in 0..5 {
        t.take(1, &format!("free{i}"), 0, 0);
    }
    let mut budget = ContendedBudget::default();
    let (names, all) = t.table.contended(SessionId(1), &mut budget);
    assert_eq!((names.len(), all), (max, true));
    assert_eq!(names[0], "c000");
    // One more contended name (after the others in name order): cut.
    t.take(1, "d", 0, 0);
    t.take(2, "d", WAIT_TIMEOUT_MS_MAX, 0);
    let (names, all) = t
        .table
        .contended(SessionId(1), &mut ContendedBudget::default());
    assert_eq!((names.len(), all), (max, false));
    assert!(!names.contains(&"d".to_string()));
    // A budget that runs out cuts too, and is shared by the sessions of one answer.
    let mut small = ContendedBudget {
        checks: 10,
        names: 4_096,
    };
    let (names, all) = t.table.contended(SessionId(1), &mut small);
    assert_eq!((names.len(), all), (10, false));
    assert_eq!(small.checks, 0);
    let (names, all) = t.table.contended(SessionId(1), &mut small);
    assert_eq!((names.len(), all), (0, false));
    // A session that holds nothing has all of its (no) contended names listed.
    let (names, all) = t.table.contended(SessionId(2), &mut small);
    assert_eq!((names.len(), all), (0, true));
}
