//! Elections (issue #32) added snapshot format 9. A table that uses nothing of it is still
//! written in format 8, byte for byte what the build before elections wrote, and such bytes
//! decode to the same table. The fixture `table_v8.hex` was written by that build (commit
//! a056056) from the entries below, by `fixtures/write_v8.rs`: a read-write lock with two
//! readers and a queued writer, a semaphore of 1 with a queued permit, and a session that
//! remembers a `PermitsConflict` (a rejection format 8 added).

use latchkey_core::codec::{decode_table, encode_table, SNAPSHOT_FORMAT_VERSION_V8};
use latchkey_core::*;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The entries `fixtures/write_v8.rs` applied.
fn table() -> LockTable {
    let mut t = LockTable::new();
    let key = |i| SessionKey {
        id: SessionId(i),
        secret: i,
    };
    let take = |i, seq, name: &str, mode| Command {
        now_ms: 1_000 * i,
        op: Op::AcquireWith {
            session: key(i),
            seq,
            name: name.into(),
            wait_ms: 60_000,
            mode,
        },
    };
    for i in 1..=4 {
        let op = Op::CreateSession {
            ttl_ms: 5_000,
            secret: i,
        };
        t.apply(i, &Command { now_ms: 0, op });
    }
    t.apply(5, &take(1, 1, "cfg", Mode::Shared));
    t.apply(6, &take(2, 1, "cfg", Mode::Shared));
    t.apply(7, &take(3, 1, "cfg", Mode::Exclusive));
    t.apply(8, &take(4, 1, "jobs", Mode::Permits(1)));
    t.apply(9, &take(1, 2, "jobs", Mode::Permits(1)));
    t.apply(10, &take(2, 2, "jobs", Mode::Permits(3)));
    t
}

#[test]
fn a_snapshot_from_before_elections_decodes_and_is_written_the_same() {
    let old = unhex(include_str!("fixtures/table_v8.hex").trim());
    assert_eq!(old[0], SNAPSHOT_FORMAT_VERSION_V8);
    let decoded = decode_table(&old).expect("a format 8 snapshot decodes");
    assert_eq!(
        encode_table(&decoded),
        old,
        "a table that fits format 8 is written in it, as before elections"
    );
    // The same entries today make a table that differs in one thing: its remembered
    // `PermitsConflict` keeps no copy of the lock's name (the retry names it again; a
    // remembered outcome is charged `TABLE_OUTCOME_BYTES`, less than a name may take). It is
    // written in format 8 too, is charged the same, and both answer alike from here on.
    let mut t = table();
    // Compared as a build before request fingerprints (snapshot format 11) holds it.
    t.forget_request_prints();
    assert_eq!(encode_table(&t)[0], SNAPSHOT_FORMAT_VERSION_V8);
    assert_eq!(decode_table(&encode_table(&t)).expect("decodes"), t);
    assert_eq!(decoded.bytes(), t.bytes());
    let (mut decoded, mut t) = (decoded, t);
    let key = |i| SessionKey {
        id: SessionId(i),
        secret: i,
    };
    let retry = Command {
        now_ms: 19_000,
        op: Op::AcquireWith {
            session: key(2),
            seq: 2,
            name: "jobs".into(),
            wait_ms: 60_000,
            mode: Mode::Permits(3),
        },
    };
    let answered = t.apply(19, &retry);
    assert!(
        matches!(
            &answered.outcome,
            Outcome::Rejected(Rejection::PermitsConflict { name, .. }) if name == "jobs"
        ),
        "{answered:?}"
    );
    assert_eq!(decoded.apply(19, &retry), answered);
    // A campaign on a fresh name makes both tables format 9 alike.
    let campaign = Command {
        now_ms: 20_000,
        op: Op::Campaign {
            session: key(4),
            seq: 2,
            name: "svc".into(),
            wait_ms: 0,
            value: b"4:80".to_vec(),
        },
    };
    assert_eq!(decoded.apply(20, &campaign), t.apply(20, &campaign));
    for name in ["cfg", "jobs", "svc"] {
        assert_eq!(decoded.describe(name), t.describe(name), "{name}");
    }
    assert_eq!(decoded.bytes(), t.bytes());
    decoded
        .check_invariants()
        .expect("the decoded table's invariants");
    t.check_invariants().expect("the built table's invariants");
    assert_eq!(encode_table(&decoded)[0], encode_table(&t)[0]);
}
