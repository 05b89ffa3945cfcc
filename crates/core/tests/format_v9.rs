//! Lock-delay (issue #32 item 4) added snapshot format 10. A table that uses nothing of it is
//! still written in format 9, byte for byte what the build before lock-delay wrote, and such
//! bytes decode to the same table. The fixture `table_v9.hex` was written by that build
//! (commit 4618d6e) from the entries below, by `fixtures/write_v9.rs`: an election `svc` whose
//! leader proclaimed a new value and has a queued campaign behind it, and an election `db`.

use latchkey_core::codec::encode_table;
use latchkey_core::codec::{decode_table, SNAPSHOT_FORMAT_VERSION_V9};
use latchkey_core::*;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn key(i: u64) -> SessionKey {
    SessionKey {
        id: SessionId(i),
        secret: i,
    }
}

/// The entries `fixtures/write_v9.rs` applied.
fn table() -> LockTable {
    let mut t = LockTable::new();
    let campaign = |i, seq, name: &str, value: &[u8]| Command {
        now_ms: 1_000 * i,
        op: Op::Campaign {
            session: key(i),
            seq,
            name: name.into(),
            wait_ms: 60_000,
            value: value.to_vec(),
        },
    };
    for i in 1..=3 {
        let op = Op::CreateSession {
            ttl_ms: 5_000,
            secret: i,
        };
        t.apply(i, &Command { now_ms: 0, op });
    }
    let Outcome::Granted { token } = t.apply(4, &campaign(1, 1, "svc", b"1:80")).outcome else {
        panic!("the first campaign is granted");
    };
    t.apply(5, &campaign(2, 1, "svc", b"2:80"));
    t.apply(6, &campaign(3, 1, "db", b"3:5432"));
    let proclaim = Op::Proclaim {
        session: key(1),
        seq: 2,
        name: "svc".into(),
        token,
        value: b"1:81".to_vec(),
    };
    t.apply(
        7,
        &Command {
            now_ms: 7_000,
            op: proclaim,
        },
    );
    t
}

#[test]
fn a_snapshot_from_before_lock_delay_decodes_and_is_written_the_same() {
    let old = unhex(include_str!("fixtures/table_v9.hex").trim());
    assert_eq!(old[0], SNAPSHOT_FORMAT_VERSION_V9);
    let mut t = table();
    // Compared as a build before request fingerprints (snapshot format 11) holds it.
    t.forget_request_prints();
    let decoded = decode_table(&old).expect("a format 9 snapshot decodes");
    assert_eq!(decoded, t);
    assert_eq!(
        encode_table(&t),
        old,
        "a table that fits format 9 is written in it, as before lock-delay"
    );
}

/// Raft logs on disk hold encoded commands (postcard: an enum is its variant's index, then its
/// fields). Lock-delay's commands come after every command main had, elections' last, so an
/// entry written before lock-delay decodes to the same command: `Campaign` and `Proclaim` keep
/// the indexes 14 and 15 they have in the build that wrote `table_v9.hex`. A batch of
/// operations (issue #35) comes after lock-delay's (18).
#[test]
fn lock_delay_s_commands_come_after_every_earlier_command() {
    let tag = |op: Op| postcard::to_stdvec(&op).expect("encodes")[0];
    let campaign = Op::Campaign {
        session: key(1),
        seq: 1,
        name: "svc".into(),
        wait_ms: 0,
        value: Vec::new(),
    };
    let proclaim = Op::Proclaim {
        session: key(1),
        seq: 2,
        name: "svc".into(),
        token: 4,
        value: Vec::new(),
    };
    let delayed = Op::AcquireDelayed {
        session: key(1),
        seq: 3,
        name: "x".into(),
        wait_ms: 0,
        lock_delay_ms: 1_000,
    };
    assert_eq!(
        [
            tag(campaign),
            tag(proclaim),
            tag(delayed),
            tag(Op::EndDelays { ends: Vec::new() }),
            tag(Op::Batch(Vec::new())),
        ],
        [14, 15, 16, 17, 18]
    );
}
