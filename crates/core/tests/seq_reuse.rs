//! A seq reused for another request (issue #35's attacker review, F2). A session remembers
//! each answered request's outcome by its seq, for exactly-once retries; it used to answer any
//! request with that seq the remembered outcome, so an acquire of `b` reusing the seq of an
//! acquire of `a` was answered `granted` with `a`'s token while `b` was not held. Since
//! snapshot format 11 the outcome (and a waiting request) carries a fingerprint of its request:
//! another request with the seq is refused `SequenceReused` and changes nothing; the same
//! request (a retry) is answered as before. Outcomes decoded from an older snapshot carry no
//! fingerprint and are answered as before; `fixtures/table_v10.hex` was written by the build
//! before fingerprints (commit 87a3bc6) by `fixtures/write_v10.rs`.

use latchkey_core::codec::{
    decode_table, encode_table, SNAPSHOT_FORMAT_VERSION, SNAPSHOT_FORMAT_VERSION_V10,
};
use latchkey_core::*;

fn key(i: u64) -> SessionKey {
    SessionKey {
        id: SessionId(i),
        secret: i,
    }
}

fn at(i: u64, op: Op) -> Command {
    Command {
        now_ms: 1_000 * i,
        op,
    }
}

fn acquire(s: u64, seq: u64, name: &str, wait_ms: u64) -> Op {
    Op::Acquire {
        session: key(s),
        seq,
        name: name.into(),
        wait_ms,
    }
}

fn release(s: u64, seq: u64, name: &str, token: u64) -> Op {
    Op::Release {
        session: key(s),
        seq,
        name: name.into(),
        token,
    }
}

fn reused(seq: u64) -> Outcome {
    Outcome::Rejected(Rejection::SequenceReused { seq })
}

/// A table of two sessions (ids 1 and 2).
fn two_sessions() -> LockTable {
    let mut t = LockTable::new();
    for i in 1..=2 {
        let op = Op::CreateSession {
            ttl_ms: 5_000,
            secret: i,
        };
        t.apply(i, &at(0, op));
    }
    t
}

/// Apply `op` at `index`; the invariants hold after it.
fn apply(t: &mut LockTable, index: u64, op: Op) -> Outcome {
    let o = t.apply(index, &at(index, op)).outcome;
    t.check_invariants().expect("invariants");
    o
}

/// Apply `op` at `index` and check that it changed nothing but the applied index.
fn refused_unchanged(t: &mut LockTable, index: u64, op: Op) -> Outcome {
    let mut before = t.clone();
    let o = apply(t, index, op);
    // The one field every entry moves: compare the rest through a table at the same index.
    before.apply(index, &at(index, Op::RenewLeases { ids: Vec::new() }));
    assert_eq!(*t, before, "a refused reuse changed the table");
    o
}

fn holder(t: &LockTable, name: &str) -> Option<(SessionId, u64)> {
    let h = t.describe(name)?.holder?;
    Some((h.session, h.token))
}

#[test]
fn a_seq_reused_for_another_request_is_refused_and_a_retry_answered_as_before() {
    let mut t = two_sessions();
    assert_eq!(
        apply(&mut t, 3, acquire(1, 7, "a", 0)),
        Outcome::Granted { token: 3 }
    );
    // Another name with the seq: refused, nothing changes, and `b` is not held.
    assert_eq!(
        refused_unchanged(&mut t, 4, acquire(1, 7, "b", 0)),
        reused(7)
    );
    assert_eq!(holder(&t, "b"), None);
    // Another mode of the same name: a reader's grant is not a writer's.
    let shared = Op::AcquireWith {
        session: key(1),
        seq: 7,
        name: "a".into(),
        wait_ms: 0,
        mode: Mode::Shared,
    };
    assert_eq!(refused_unchanged(&mut t, 5, shared), reused(7));
    // The same request (a retry, with another wait, which a retry may shorten): as before.
    assert_eq!(
        apply(&mut t, 6, acquire(1, 7, "a", 30_000)),
        Outcome::Granted { token: 3 }
    );

    // A waiting seq reused for another name is refused; its retry is answered its place.
    assert_eq!(
        apply(&mut t, 7, acquire(2, 1, "a", 60_000)),
        Outcome::Queued { position: 1 }
    );
    assert_eq!(
        refused_unchanged(&mut t, 8, acquire(2, 1, "c", 60_000)),
        reused(1)
    );
    assert_eq!(
        apply(&mut t, 9, acquire(2, 1, "a", 60_000)),
        Outcome::Queued { position: 1 }
    );
    // Handed over later, the wait's outcome keeps its request's fingerprint.
    assert_eq!(apply(&mut t, 10, release(1, 8, "a", 3)), Outcome::Released);
    assert_eq!(holder(&t, "a"), Some((SessionId(2), 10)));
    assert_eq!(
        refused_unchanged(&mut t, 11, acquire(2, 1, "c", 0)),
        reused(1)
    );
    assert_eq!(holder(&t, "c"), None);
    assert_eq!(
        apply(&mut t, 12, acquire(2, 1, "a", 0)),
        Outcome::Granted { token: 10 }
    );

    // A release's seq reused for another release (another token) is refused; the retry
    // answers as before.
    assert_eq!(
        refused_unchanged(&mut t, 13, release(1, 8, "a", 10)),
        reused(8)
    );
    assert_eq!(holder(&t, "a"), Some((SessionId(2), 10)));
    assert_eq!(apply(&mut t, 14, release(1, 8, "a", 3)), Outcome::Released);

    // Through a snapshot (format 11): the same answers.
    let bytes = encode_table(&t);
    assert_eq!(bytes[0], SNAPSHOT_FORMAT_VERSION);
    let mut u = decode_table(&bytes).expect("decodes");
    assert_eq!(u, t);
    assert_eq!(
        refused_unchanged(&mut u, 15, acquire(1, 7, "b", 0)),
        reused(7)
    );
    assert_eq!(
        apply(&mut u, 16, acquire(1, 7, "a", 0)),
        Outcome::Granted { token: 3 }
    );
    assert_eq!(
        refused_unchanged(&mut u, 17, acquire(2, 1, "c", 0)),
        reused(1)
    );
    assert_eq!(
        apply(&mut u, 18, acquire(2, 1, "a", 0)),
        Outcome::Granted { token: 10 }
    );
}

/// Two acquires with one seq in one batch: the first is granted, the second refused.
#[test]
fn a_batch_reusing_a_seq_for_another_name_grants_only_the_first() {
    let mut t = two_sessions();
    let applied = t.apply(
        3,
        &at(
            3,
            Op::Batch(vec![acquire(1, 7, "dup/a", 0), acquire(1, 7, "dup/b", 0)]),
        ),
    );
    t.check_invariants().expect("invariants");
    let outcomes: Vec<_> = applied.ops.iter().map(|a| a.outcome.clone()).collect();
    assert_eq!(outcomes, [Outcome::Granted { token: 3 }, reused(7)]);
    assert_eq!(holder(&t, "dup/b"), None);
}

/// The entries `fixtures/write_v10.rs` applied.
fn table_v10_entries() -> LockTable {
    let mut t = two_sessions();
    apply(&mut t, 3, acquire(1, 1, "a", 0));
    apply(&mut t, 4, acquire(2, 1, "a", 60_000));
    let delayed = Op::AcquireDelayed {
        session: key(1),
        seq: 2,
        name: "d".into(),
        wait_ms: 0,
        lock_delay_ms: 1_000,
    };
    apply(&mut t, 5, delayed);
    apply(&mut t, 6, acquire(1, 3, "b", 0));
    apply(&mut t, 7, release(1, 4, "b", 6));
    t
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn a_snapshot_from_before_fingerprints_decodes_and_answers_its_outcomes_as_before() {
    let old = unhex(include_str!("fixtures/table_v10.hex").trim());
    assert_eq!(old[0], SNAPSHOT_FORMAT_VERSION_V10);
    let mut decoded = decode_table(&old).expect("a format 10 snapshot decodes");
    // The same table as this build makes from the entries, but for the fingerprints.
    let mut built = table_v10_entries();
    assert_eq!(encode_table(&built)[0], SNAPSHOT_FORMAT_VERSION);
    built.forget_request_prints();
    assert_eq!(decoded, built);
    assert_eq!(
        encode_table(&decoded),
        old,
        "a table without fingerprints is written in format 10, as before them"
    );
    // Its outcomes carry no fingerprint: answered to any acquire with the seq, as before.
    assert_eq!(
        apply(&mut decoded, 8, acquire(1, 1, "x", 0)),
        Outcome::Granted { token: 3 }
    );
    // Its wait neither; handed over, its outcome is answered as before too.
    assert_eq!(
        apply(&mut decoded, 9, release(1, 5, "a", 3)),
        Outcome::Released
    );
    assert_eq!(
        apply(&mut decoded, 10, acquire(2, 1, "y", 0)),
        Outcome::Granted { token: 9 }
    );
    // A request answered since remembers its fingerprint: format 11 from then on.
    assert_eq!(
        apply(&mut decoded, 11, acquire(1, 6, "e", 0)),
        Outcome::Granted { token: 11 }
    );
    assert_eq!(
        refused_unchanged(&mut decoded, 12, acquire(1, 6, "f", 0)),
        reused(6)
    );
    assert_eq!(encode_table(&decoded)[0], SNAPSHOT_FORMAT_VERSION);
}
