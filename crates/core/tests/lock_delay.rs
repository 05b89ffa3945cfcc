//! Lock-delay in the lock table (issue #32 item 4), rule by rule: after a holder's grant is
//! lost (its session expired or was revoked, or an operator force-released it) the name is not
//! granted again until the delay its acquire asked for has run from that entry's time; a
//! release or a close hands it over at once. `model.rs` checks the same rules on random
//! interleavings.

mod support;

use latchkey_core::codec::{
    decode_table, encode_table, SNAPSHOT_FORMAT_VERSION, SNAPSHOT_FORMAT_VERSION_V9,
};
use latchkey_core::limits::{LOCK_DELAY_MS_MAX, WAIT_TIMEOUT_MS_MAX};
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
        self.index += 1;
        let cmd = Command {
            now_ms: 1_000 * self.index,
            op,
        };
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

    /// `EndDelays` entry after entry until one ends a delay (at most `n`): answers it.
    fn end_delays_until_one_ends(&mut self, n: usize) -> Applied {
        for _ in 0..n {
            let a = self.apply(Op::EndDelays);
            if a.outcome != (Outcome::DelaysEnded { count: 0 }) {
                return a;
            }
            assert!(a.handoffs.is_empty(), "a grant while the delay runs");
        }
        panic!("no delay ended in {n} entries");
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
    assert_eq!(t.table.next_delay_end_ms(), Some(expired_at + 5_000));

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

    let end = t.end_delays_until_one_ends(10);
    assert!(t.now_ms() >= expired_at + 5_000);
    assert_eq!(end.outcome, Outcome::DelaysEnded { count: 1 });
    assert_eq!(end.handoffs.len(), 1);
    assert_eq!(end.handoffs[0].session, SessionId(2));
    assert_eq!(end.handoffs[0].seq, b_seq);
    assert!(end.handoffs[0].token > token);
    assert_eq!(t.holder("x"), Some((2, t.index)));
    assert_eq!(t.table.next_delay_end_ms(), None);
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
    assert_eq!(t.table.next_delay_end_ms(), None);
}

#[test]
fn a_revoke_and_a_force_release_start_the_delay_too() {
    let mut t = T::new(3);
    t.take(1, "x", 0, 3_000);
    t.take(2, "x", WAIT_TIMEOUT_MS_MAX, 0);
    let r = t.apply(Op::RevokeSession {
        session: SessionId(1),
        by: by(),
        reason: "stuck".into(),
    });
    assert_eq!(r.outcome, Outcome::SessionRevoked { locks: 1 });
    assert!(r.handoffs.is_empty());
    let at = t.now_ms();
    t.end_delays_until_one_ends(10);
    assert!(t.now_ms() >= at + 3_000);
    assert_eq!(t.holder("x").map(|h| h.0), Some(2));

    let (a, _) = t.take(3, "y", 0, 2_000);
    let Outcome::Granted { token } = a.outcome else {
        panic!()
    };
    let f = t.apply(Op::ForceRelease {
        name: "y".into(),
        token: Some(token),
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
    let at = t.now_ms();
    assert_eq!(
        t.table.describe("y").unwrap().delay_until_ms,
        Some(at + 2_000)
    );
    // No waiter: the name is free once the delay ends, and taken straight away then.
    let (b, _) = t.take(2, "y", 0, 0);
    assert_eq!(b.outcome, Outcome::NotGranted);
    t.end_delays_until_one_ends(10);
    assert!(t.table.describe("y").is_none());
    let (b, _) = t.take(2, "y", 0, 0);
    assert!(matches!(b.outcome, Outcome::Granted { .. }));
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
    let end = t.end_delays_until_one_ends(20);
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
    // Both ends the delay at the same entry with the same grant.
    let mut index = t.index;
    loop {
        index += 1;
        let cmd = Command {
            now_ms: 1_000 * index,
            op: Op::EndDelays,
        };
        let mine = apply_checked(&mut t.table, index, &cmd);
        let theirs = apply_checked(&mut copy, index, &cmd);
        t.index = index;
        assert_eq!(mine, theirs);
        if !mine.handoffs.is_empty() {
            assert_eq!(mine.handoffs[0].seq, b_seq);
            break;
        }
        assert!(index < 100);
    }
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
    let ended = t.end_delays_until_one_ends(10);
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
    // With no delay left, the leader's value makes it format 9, as before lock-delay.
    let bytes = encode_table(&t.table);
    assert_eq!(bytes[0], SNAPSHOT_FORMAT_VERSION_V9);
    assert_eq!(decode_table(&bytes).expect("decodes"), t.table);
}
