//! The table's byte budget (issue #13 item 5): the running count of accounted bytes equals a
//! count from scratch after any command sequence, the table never grows past its budget, a
//! command that would is refused with `TableFull` while releases, closes and expiries still
//! succeed, and a snapshot is never larger than the table's accounted bytes plus its header.

use latchkey_core::codec::{decode_table, encode_table};
use latchkey_core::*;
use proptest::prelude::*;

/// The table's own snapshot header (last index and four lengths) beyond its accounted bytes.
const TABLE_HEADER_BYTES_MAX: usize = 64;

fn key(id: u64) -> SessionKey {
    SessionKey {
        id: SessionId(id),
        secret: id,
    }
}

/// One step of a generated history, over few sessions (by creation order) and few names, so
/// that they collide: holds, queues, hand-overs, refusals for room.
#[derive(Clone, Debug)]
enum Step {
    Create {
        owner: Option<u8>,
    },
    Acquire {
        session: u8,
        name: u8,
        wait: bool,
    },
    Release {
        session: u8,
        name: u8,
    },
    Close {
        session: u8,
    },
    Expire {
        session: u8,
    },
    Cancel {
        session: u8,
        back: u8,
    },
    ExpireWaits,
    /// Issue #32: a reader (`permits` 0) or a permit of a semaphore of `permits`.
    AcquireWith {
        session: u8,
        name: u8,
        wait: bool,
        permits: u8,
    },
    ForceRelease {
        name: u8,
    },
    /// Issue #32's elections: a campaign with a value of `len` × 40 bytes, and a proclaim by
    /// the session's grant of the name, if it has one.
    Campaign {
        session: u8,
        name: u8,
        wait: bool,
        len: u8,
    },
    Proclaim {
        session: u8,
        name: u8,
        len: u8,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => proptest::option::of(0u8..3).prop_map(|owner| Step::Create { owner }),
        5 => (0u8..6, 0u8..6, any::<bool>())
            .prop_map(|(session, name, wait)| Step::Acquire { session, name, wait }),
        3 => (0u8..6, 0u8..6).prop_map(|(session, name)| Step::Release { session, name }),
        1 => (0u8..6).prop_map(|session| Step::Close { session }),
        1 => (0u8..6).prop_map(|session| Step::Expire { session }),
        1 => (0u8..6, 0u8..4).prop_map(|(session, back)| Step::Cancel { session, back }),
        1 => Just(Step::ExpireWaits),
        4 => (0u8..6, 0u8..6, any::<bool>(), 0u8..3)
            .prop_map(|(session, name, wait, permits)| Step::AcquireWith { session, name, wait, permits }),
        1 => (0u8..6).prop_map(|name| Step::ForceRelease { name }),
        3 => (0u8..6, 0u8..6, any::<bool>(), 0u8..26)
            .prop_map(|(session, name, wait, len)| Step::Campaign { session, name, wait, len }),
        2 => (0u8..6, 0u8..6, 0u8..26)
            .prop_map(|(session, name, len)| Step::Proclaim { session, name, len }),
    ]
}

fn name(n: u8) -> String {
    // Names of different lengths, so that a name's bytes count.
    format!("lock/{}", "x".repeat(n as usize * 40))
}

fn check(t: &LockTable, index: u64) -> Result<(), TestCaseError> {
    t.check_invariants()
        .map_err(|e| TestCaseError::fail(format!("after entry {index}: {e}")))?;
    prop_assert!(
        t.bytes() <= t.bytes_max(),
        "after entry {index}: {} bytes, budget {}",
        t.bytes(),
        t.bytes_max()
    );
    let encoded = encode_table(t);
    // The audit log is outside the budget (bounded on its own, `limits::AUDIT_BYTES_MAX`): an
    // operator's force-release must work in a full table.
    let audit: Vec<&AuditRecord> = t.audit().collect();
    let audit_bytes = postcard::to_stdvec(&audit).expect("encodes").len();
    prop_assert!(
        encoded.len() <= t.bytes() + TABLE_HEADER_BYTES_MAX + audit_bytes,
        "after entry {index}: a snapshot of {} bytes for {} accounted",
        encoded.len(),
        t.bytes()
    );
    let decoded = decode_table(&encoded).expect("a table decodes");
    prop_assert_eq!(decoded.bytes(), t.bytes());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn accounted_bytes_equal_a_recount_after_any_commands(
        steps in proptest::collection::vec(step(), 1..120),
        sessions_room in 2usize..5,
    ) {
        let mut t = LockTable::new();
        // Room for a few sessions and some of their locks and waits, so that the budget is
        // reached and refusals happen.
        t.set_bytes_max(sessions_room * limits::TABLE_SESSION_WITH_OUTCOMES_BYTES + 1_000);
        let mut created: Vec<u64> = Vec::new();
        let mut seq = 0u64;
        let mut tokens: std::collections::BTreeMap<(u64, u8), u64> = Default::default();
        for (i, s) in steps.into_iter().enumerate() {
            let index = i as u64 + 1;
            let now_ms = index * 100;
            let sid = |n: u8| created.get(n as usize % created.len().max(1)).copied().unwrap_or(1);
            seq += 1;
            let op = match s {
                Step::Create { owner } => match owner {
                    None => Op::CreateSession { ttl_ms: 5_000, secret: index },
                    Some(o) => Op::CreateOwnedSession {
                        ttl_ms: 5_000,
                        secret: index,
                        owner: format!("identity-{o}"),
                    },
                },
                Step::Acquire { session, name: n, wait } => Op::Acquire {
                    session: key(sid(session)),
                    seq,
                    name: name(n),
                    wait_ms: if wait { 1_000 } else { 0 },
                },
                Step::Release { session, name: n } => Op::Release {
                    session: key(sid(session)),
                    seq,
                    name: name(n),
                    token: tokens.get(&(sid(session), n)).copied().unwrap_or(0),
                },
                Step::Close { session } => Op::CloseSession { session: key(sid(session)) },
                Step::Expire { session } => Op::ExpireSessions { ids: vec![SessionId(sid(session))] },
                Step::Cancel { session, back } => Op::CancelWait {
                    session: key(sid(session)),
                    seq: seq.saturating_sub(back as u64 + 1),
                },
                Step::ExpireWaits => Op::ExpireWaits,
                Step::AcquireWith { session, name: n, wait, permits } => Op::AcquireWith {
                    session: key(sid(session)),
                    seq,
                    name: name(n),
                    wait_ms: if wait { 1_000 } else { 0 },
                    mode: match permits {
                        0 => Mode::Shared,
                        p => Mode::Permits(p as u32 + 1),
                    },
                },
                Step::ForceRelease { name: n } => Op::ForceRelease {
                    name: name(n),
                    token: None,
                    by: Actor::default(),
                    reason: "room".into(),
                },
                Step::Campaign { session, name: n, wait, len } => Op::Campaign {
                    session: key(sid(session)),
                    seq,
                    name: name(n),
                    wait_ms: if wait { 1_000 } else { 0 },
                    value: vec![b'v'; len as usize * 40],
                },
                Step::Proclaim { session, name: n, len } => Op::Proclaim {
                    session: key(sid(session)),
                    seq,
                    name: name(n),
                    token: tokens.get(&(sid(session), n)).copied().unwrap_or(0),
                    value: vec![b'p'; len as usize * 40],
                },
            };
            let before = t.bytes();
            let shrinking = matches!(
                op,
                Op::Release { .. } | Op::CloseSession { .. } | Op::ExpireSessions { .. }
                    | Op::CancelWait { .. } | Op::ExpireWaits | Op::ForceRelease { .. }
            );
            let applied = t.apply(index, &Command { now_ms, op: op.clone() });
            // Closes, releases, cancels and expiries never need room, and never grow the table.
            // (A cancel answers a finished request with that request's outcome, which may be an
            // acquire's refusal for room: that is a replay, not a refusal of the cancel.)
            prop_assert!(
                !matches!(applied.outcome, Outcome::Rejected(Rejection::TableFull { .. }))
                    || !shrinking
                    || matches!(op, Op::CancelWait { .. }),
                "{op:?} was refused for room"
            );
            if shrinking {
                prop_assert!(t.bytes() <= before, "{op:?} grew the table");
            }
            if let Outcome::SessionCreated { id, .. } = applied.outcome {
                created.push(id.0);
            }
            if let (
                Op::Acquire { session, name: n, .. }
                | Op::AcquireWith { session, name: n, .. }
                | Op::Campaign { session, name: n, .. },
                Outcome::Granted { token },
            ) = (&op, &applied.outcome) {
                let n = (0..6u8).find(|i| name(*i) == *n).expect("generated");
                tokens.insert((session.id.0, n), *token);
            }
            for h in &applied.handoffs {
                let n = (0..6u8).find(|i| name(*i) == h.name).expect("generated");
                tokens.insert((h.session.0, n), h.token);
            }
            check(&t, index)?;
        }
    }
}

fn apply(t: &mut LockTable, index: u64, op: Op) -> Outcome {
    t.apply(index, &Command { now_ms: 0, op }).outcome
}

/// A full table refuses a new session and a new lock with `TableFull`, which names its bytes and
/// budget; a release makes room, and the same acquire then succeeds. A close works on a full
/// table.
#[test]
fn a_full_table_refuses_growth_and_a_release_makes_room() {
    let mut t = LockTable::new();
    let budget = 2 * limits::TABLE_SESSION_WITH_OUTCOMES_BYTES + 2 * (limits::TABLE_LOCK_BYTES + 1);
    t.set_bytes_max(budget);
    for i in 1..=2 {
        assert!(matches!(
            apply(
                &mut t,
                i,
                Op::CreateSession {
                    ttl_ms: 5_000,
                    secret: i
                }
            ),
            Outcome::SessionCreated { .. }
        ));
    }
    let full = |bytes| Outcome::Rejected(Rejection::TableFull { bytes, max: budget });
    assert_eq!(
        apply(
            &mut t,
            3,
            Op::CreateSession {
                ttl_ms: 5_000,
                secret: 3
            }
        ),
        full(t.bytes())
    );
    let acquire = |seq, name: &str| Op::Acquire {
        session: key(1),
        seq,
        name: name.into(),
        wait_ms: 0,
    };
    assert_eq!(
        apply(&mut t, 4, acquire(1, "a")),
        Outcome::Granted { token: 4 }
    );
    assert_eq!(
        apply(&mut t, 5, acquire(2, "b")),
        Outcome::Granted { token: 5 }
    );
    assert_eq!(t.bytes(), budget);
    let refused = apply(&mut t, 6, acquire(3, "c"));
    assert_eq!(refused, full(budget));
    assert_eq!(
        refused.to_string_if_rejected(),
        format!(
            "the lock table is full: it holds {budget} bytes of its budget {budget}; release \
             locks or close sessions to make room"
        )
    );
    // A queued wait needs room too.
    let wait = Op::Acquire {
        session: key(2),
        seq: 1,
        name: "a".into(),
        wait_ms: 1_000,
    };
    assert_eq!(apply(&mut t, 7, wait), full(budget));
    let release = Op::Release {
        session: key(1),
        seq: 4,
        name: "a".into(),
        token: 4,
    };
    assert_eq!(apply(&mut t, 8, release), Outcome::Released);
    assert_eq!(
        apply(&mut t, 9, acquire(5, "c")),
        Outcome::Granted { token: 9 }
    );
    assert_eq!(
        apply(&mut t, 10, Op::CloseSession { session: key(1) }),
        Outcome::SessionClosed
    );
    assert_eq!(t.bytes(), limits::TABLE_SESSION_WITH_OUTCOMES_BYTES);
    t.check_invariants().expect("valid");
}

/// A table above a budget lowered after it was filled (a restart with a smaller
/// `--table-bytes-max`) still decodes and runs: it refuses growth and lets every shrinking
/// command through.
#[test]
fn a_table_above_a_lowered_budget_only_shrinks() {
    let mut t = LockTable::new();
    apply(
        &mut t,
        1,
        Op::CreateSession {
            ttl_ms: 5_000,
            secret: 1,
        },
    );
    let acquire = Op::Acquire {
        session: key(1),
        seq: 1,
        name: "a".into(),
        wait_ms: 0,
    };
    assert_eq!(apply(&mut t, 2, acquire), Outcome::Granted { token: 2 });
    let mut t = decode_table(&encode_table(&t)).expect("decodes");
    t.set_bytes_max(limits::TABLE_SESSION_WITH_OUTCOMES_BYTES);
    let more = Op::Acquire {
        session: key(1),
        seq: 2,
        name: "b".into(),
        wait_ms: 0,
    };
    assert!(matches!(
        apply(&mut t, 3, more),
        Outcome::Rejected(Rejection::TableFull { .. })
    ));
    let release = Op::Release {
        session: key(1),
        seq: 3,
        name: "a".into(),
        token: 2,
    };
    assert_eq!(apply(&mut t, 4, release), Outcome::Released);
    assert_eq!(t.bytes(), t.bytes_max());
}

trait RejectionText {
    fn to_string_if_rejected(&self) -> String;
}

impl RejectionText for Outcome {
    fn to_string_if_rejected(&self) -> String {
        match self {
            Outcome::Rejected(r) => r.to_string(),
            other => format!("{other:?}"),
        }
    }
}

/// Issue #32: a reader or a permit beside a holder needs room for its grant, and a reader that
/// queues behind a mutex's holder room for its wait and the holder's grant; refused, nothing
/// changes. Handing on what a release frees never needs room.
#[test]
fn a_full_table_refuses_readers_and_permits_and_a_release_hands_on_without_room() {
    let mut t = LockTable::new();
    for i in 1..=3 {
        apply(
            &mut t,
            i,
            Op::CreateSession {
                ttl_ms: 5_000,
                secret: i,
            },
        );
    }
    let take = |who, seq, name: &str, mode| Op::AcquireWith {
        session: key(who),
        seq,
        name: name.into(),
        wait_ms: 60_000,
        mode,
    };
    let sem = Mode::Permits(2);
    assert_eq!(
        apply(&mut t, 4, take(1, 1, "s", sem)),
        Outcome::Granted { token: 4 }
    );
    assert_eq!(
        apply(&mut t, 5, take(1, 2, "m", Mode::Exclusive)),
        Outcome::Granted { token: 5 }
    );
    // Exactly full: no room for a second permit's grant, nor for a reader behind "m".
    t.set_bytes_max(t.bytes());
    let before = t.clone();
    for (index, op) in [
        (6, take(2, 1, "s", sem)),
        (7, take(2, 2, "m", Mode::Shared)),
    ] {
        assert!(
            matches!(
                apply(&mut t, index, op),
                Outcome::Rejected(Rejection::TableFull { .. })
            ),
            "entry {index}"
        );
    }
    assert_eq!(t.describe("s"), before.describe("s"));
    assert_eq!(t.describe("m"), before.describe("m"));
    // With room, the second permit is granted and a third acquire waits.
    t.set_bytes_max(usize::MAX);
    assert_eq!(
        apply(&mut t, 8, take(2, 3, "s", sem)),
        Outcome::Granted { token: 5 }
    );
    assert_eq!(
        apply(&mut t, 9, take(3, 1, "s", sem)),
        Outcome::Queued { position: 1 }
    );
    t.set_bytes_max(t.bytes());
    let release = Op::Release {
        session: key(1),
        seq: 3,
        name: "s".into(),
        token: 4,
    };
    assert_eq!(apply(&mut t, 10, release), Outcome::Released);
    assert_eq!(t.describe("s").unwrap().holders.len(), 2);
    assert!(t.bytes() <= t.bytes_max());
}

/// A session remembers up to `SESSION_OUTCOMES_MAX` outcomes, charged `TABLE_OUTCOME_BYTES`
/// each when it is created. A rejection that names the request's lock (a proclaim
/// by a non-leader, an acquire of the wrong kind or count) must not keep the name,
/// up to `LOCK_NAME_BYTES_MAX` bytes, in that charge: the snapshot would outgrow the accounted bytes
/// about tenfold. A retry still gets its answer with the name. (A release of a lock not held
/// answers `NotHolder`, which names nothing.)
#[test]
fn remembered_rejections_naming_a_lock_stay_within_their_charge() {
    let mut t = LockTable::new();
    let mut index = 0;
    let mut next = |t: &mut LockTable, op: Op| {
        index += 1;
        apply(t, index, op)
    };
    for id in 1..=2 {
        next(
            &mut t,
            Op::CreateSession {
                ttl_ms: 5_000,
                secret: id,
            },
        );
    }
    let long = |i: usize| format!("{i:04}{}", "n".repeat(limits::LOCK_NAME_BYTES_MAX - 4));
    // Session 2 holds a permit of a semaphore of 3: session 1's acquire of it as a mutex, or as
    // a semaphore of 2, conflicts.
    let shared = long(9_999);
    let granted = next(
        &mut t,
        Op::AcquireWith {
            session: key(2),
            seq: 1,
            name: shared.clone(),
            wait_ms: 0,
            mode: Mode::Permits(3),
        },
    );
    assert!(matches!(granted, Outcome::Granted { .. }), "{granted:?}");
    for i in 0..limits::SESSION_OUTCOMES_MAX {
        let seq = i as u64 + 1;
        let op = match i % 3 {
            0 => Op::AcquireWith {
                session: key(1),
                seq,
                name: shared.clone(),
                wait_ms: 0,
                mode: Mode::Permits(2),
            },
            1 => Op::Proclaim {
                session: key(1),
                seq,
                name: long(i),
                token: 1,
                value: b"v".to_vec(),
            },
            _ => Op::Acquire {
                session: key(1),
                seq,
                name: shared.clone(),
                wait_ms: 0,
            },
        };
        let first = next(&mut t, op.clone());
        assert!(matches!(first, Outcome::Rejected(_)), "{first:?}");
        // The retry gets the first answer, name and all.
        assert_eq!(next(&mut t, op), first);
    }
    check(&t, index).unwrap();
}
