//! Issue #35: `Op::Batch`, several client operations in one entry. The rules, one test each;
//! `tests/model.rs` checks random batches against the reference model.

use latchkey_core::limits::{BATCH_BYTES_MAX, BATCH_OPS_MAX, WAIT_TIMEOUT_MS_MAX};
use latchkey_core::*;

struct Run {
    table: LockTable,
    index: u64,
}

impl Run {
    fn new() -> Run {
        Run {
            table: LockTable::new(),
            index: 0,
        }
    }

    /// Apply `op` as the next entry (10 ms after the last), checking every invariant.
    fn apply(&mut self, op: Op) -> Applied {
        self.index += 1;
        let cmd = Command {
            now_ms: 10 * self.index,
            op,
        };
        let applied = self.table.apply(self.index, &cmd);
        if let Err(e) = self.table.check_invariants() {
            panic!("invariant broken after entry {} ({cmd:?}): {e}", self.index);
        }
        applied
    }

    /// The outcomes of a batch's operations.
    fn batch(&mut self, ops: Vec<Op>) -> Vec<Outcome> {
        let applied = self.apply(Op::Batch(ops));
        assert_eq!(applied.outcome, Outcome::Batch);
        applied.ops.into_iter().map(|a| a.outcome).collect()
    }

    fn open(&mut self, secret: u64) -> SessionKey {
        let op = Op::CreateSession {
            ttl_ms: 15_000,
            secret,
        };
        match self.apply(op).outcome {
            Outcome::SessionCreated { id, .. } => SessionKey { id, secret },
            other => panic!("no session: {other:?}"),
        }
    }
}

fn acquire(session: SessionKey, seq: u64, name: &str) -> Op {
    Op::Acquire {
        session,
        seq,
        name: name.into(),
        wait_ms: WAIT_TIMEOUT_MS_MAX,
    }
}

fn permit(session: SessionKey, seq: u64, name: &str) -> Op {
    Op::AcquireWith {
        session,
        seq,
        name: name.into(),
        wait_ms: WAIT_TIMEOUT_MS_MAX,
        mode: Mode::Permits(3),
    }
}

fn release(session: SessionKey, seq: u64, name: &str, token: u64) -> Op {
    Op::Release {
        session,
        seq,
        name: name.into(),
        token,
    }
}

fn conflict(name: &str) -> Outcome {
    Outcome::Rejected(Rejection::BatchConflict { name: name.into() })
}

#[test]
fn a_batch_answers_each_operation_in_order_and_exactly_once() {
    let mut r = Run::new();
    let (a, b) = (r.open(1), r.open(2));
    let ops = vec![
        acquire(a, 1, "x"),
        acquire(b, 1, "x"),
        acquire(b, 2, ""),
        acquire(b, 3, "y"),
    ];
    let at = r.index + 1;
    let first = r.batch(ops.clone());
    assert_eq!(
        first,
        vec![
            Outcome::Granted { token: at },
            Outcome::Queued { position: 1 },
            // Refused, and nothing else in the batch is affected by it.
            Outcome::Rejected(Rejection::NameEmpty),
            Outcome::Granted { token: at },
        ]
    );
    // The same batch again (a retry) is answered from each session's remembered outcomes.
    let again = r.batch(ops);
    assert_eq!(again, first);
    // A release in a batch hands the lock to the next waiter, with this entry's index.
    let applied = r.apply(Op::Batch(vec![release(a, 2, "x", at)]));
    assert_eq!(applied.ops[0].outcome, Outcome::Released);
    assert_eq!(applied.ops[0].handoffs.len(), 1);
    assert_eq!(applied.ops[0].handoffs[0].session, b.id);
    assert_eq!(applied.ops[0].handoffs[0].token, r.index);
}

/// A grant the batch made is never ended in it: its next grant would take the same index as
/// its token, and a fencing token must increase. Refused, the operation is not remembered,
/// so alone (the next entry) it applies.
#[test]
fn a_batch_never_ends_a_grant_it_made() {
    let mut r = Run::new();
    let (a, b) = (r.open(1), r.open(2));
    let at = r.index + 1;
    let got = r.batch(vec![
        acquire(a, 1, "x"),
        acquire(b, 1, "x"),
        release(a, 2, "x", at),
    ]);
    assert_eq!(
        got,
        vec![
            Outcome::Granted { token: at },
            Outcome::Queued { position: 1 },
            conflict("x"),
        ]
    );
    let applied = r.apply(release(a, 2, "x", at));
    assert_eq!(applied.outcome, Outcome::Released);
    assert_eq!(applied.handoffs[0].token, at + 1, "b's token is above a's");

    // A close of a session holding a grant of this batch (handed over by it, here).
    let c = r.open(3);
    let held = r.index - 1; // b's grant of x
    let got = r.batch(vec![
        acquire(c, 1, "x"),
        release(b, 2, "x", held),
        Op::CloseSession { session: c },
    ]);
    assert_eq!(
        got,
        vec![
            Outcome::Queued { position: 1 },
            Outcome::Released,
            conflict("x"),
        ]
    );
    assert!(
        r.table.session_valid(&c),
        "the refused close changed nothing"
    );
    assert_eq!(
        r.apply(Op::CloseSession { session: c }).outcome,
        Outcome::SessionClosed
    );

    // Two acquires of one semaphore's permits: its tokens count its acquires' entries.
    let at = r.index + 1;
    let got = r.batch(vec![permit(a, 3, "sem"), permit(b, 3, "sem")]);
    assert_eq!(got, vec![Outcome::Granted { token: at }, conflict("sem")]);
    assert_eq!(
        r.apply(permit(b, 3, "sem")).outcome,
        Outcome::Granted { token: at + 1 }
    );
}

#[test]
fn only_a_clients_lock_operations_are_batched() {
    let mut r = Run::new();
    let a = r.open(1);
    let refused = Outcome::Rejected(Rejection::NotBatchable);
    let got = r.batch(vec![
        Op::CreateSession {
            ttl_ms: 15_000,
            secret: 9,
        },
        Op::Batch(vec![acquire(a, 1, "x")]),
        Op::ExpireWaits,
        Op::ExpireSessions { ids: vec![a.id] },
        acquire(a, 1, "x"),
    ]);
    assert_eq!(
        got[..4],
        [refused.clone(), refused.clone(), refused.clone(), refused]
    );
    assert!(matches!(got[4], Outcome::Granted { .. }), "{got:?}");
    assert_eq!(r.table.session_count(), 1);

    for ops in [vec![], vec![acquire(a, 2, "y"); BATCH_OPS_MAX + 1]] {
        let n = ops.len();
        let applied = r.apply(Op::Batch(ops));
        let too_large = Rejection::BatchTooLarge {
            ops: n,
            max: BATCH_OPS_MAX,
        };
        assert_eq!(applied.outcome, Outcome::Rejected(too_large.clone()));
        assert!(applied.ops.is_empty());
        assert_eq!(validate_batch(&vec![acquire(a, 2, "y"); n]), Err(too_large));
    }
    assert!(r.table.describe("y").is_none());

    // What the leader checks before proposing.
    assert_eq!(validate_batch(&[acquire(a, 2, "y")]), Ok(()));
    assert_eq!(
        validate_batch(&[acquire(a, 2, "y"), Op::ExpireWaits]),
        Err(Rejection::NotBatchable)
    );
    let long = "n".repeat(limits::LOCK_NAME_BYTES_MAX);
    let value = vec![0; limits::ELECTION_VALUE_BYTES_MAX];
    let campaigns: Vec<Op> = (0..BATCH_OPS_MAX as u64)
        .map(|seq| Op::Campaign {
            session: a,
            seq,
            name: long.clone(),
            wait_ms: 0,
            value: value.clone(),
        })
        .collect();
    assert!(matches!(
        validate_batch(&campaigns),
        Err(Rejection::FieldTooLong {
            max: BATCH_BYTES_MAX,
            ..
        })
    ));
}

/// A lock-delay acquire (issue #32 item 4) is batched as any acquire: the batch may not end
/// the delayed grant it made (a release, a close: refused, unremembered), nor could it start
/// the delay (only a lost grant does, in an entry of its own); `EndDelays` is the leader's,
/// never batched. The grant's loss later starts the delay as if it had been alone.
#[test]
fn a_lock_delay_acquire_in_a_batch_is_an_acquire_whose_delay_starts_only_when_lost() {
    let mut r = Run::new();
    let (a, b) = (r.open(1), r.open(2));
    let at = r.index + 1;
    let delayed = Op::AcquireDelayed {
        session: a,
        seq: 1,
        name: "x".into(),
        wait_ms: 0,
        lock_delay_ms: 5_000,
    };
    let got = r.batch(vec![
        delayed,
        acquire(b, 1, "x"),
        release(a, 2, "x", at),
        Op::CloseSession { session: a },
        Op::EndDelays { ends: Vec::new() },
    ]);
    assert_eq!(
        got,
        vec![
            Outcome::Granted { token: at },
            Outcome::Queued { position: 1 },
            conflict("x"),
            conflict("x"),
            Outcome::Rejected(Rejection::NotBatchable),
        ]
    );
    let state = r.table.describe("x").expect("x is held");
    assert_eq!(state.lock_delay_ms, Some(5_000));
    assert_eq!(state.delay_until_ms, None, "no delay runs");

    // Lost (expired), the grant starts its delay: b waits it out.
    let expired = r.apply(Op::ExpireSessions { ids: vec![a.id] });
    assert!(expired.handoffs.is_empty(), "{expired:?}");
    let expired_at = 10 * r.index;
    let state = r.table.describe("x").expect("x is in a delay");
    assert!(state.holder.is_none());
    assert_eq!(state.delay_until_ms, Some(expired_at + 5_000));
}
