//! The snapshot encoding: round trip, and refusal of what this build cannot trust. (Tables that
//! decode but break an invariant are crafted in `table.rs`'s unit tests, which see the fields.)

mod support;

use latchkey_core::codec::{
    decode_table, encode_table, DecodeError, SNAPSHOT_FORMAT_VERSION, SNAPSHOT_FORMAT_VERSION_V10,
    SNAPSHOT_FORMAT_VERSION_V7, SNAPSHOT_FORMAT_VERSION_V8, SNAPSHOT_FORMAT_VERSION_V9,
};
use latchkey_core::*;
use support::*;

/// A table with every kind of state: holders, queues, remembered outcomes, a closed session.
fn busy_sim() -> TableDriver {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        open(3, "c"),
        open(4, "d"),
        step(5, acq("a", 1, "L"), granted(5)),
        step(6, acq("b", 1, "L"), queued(1)),
        step(7, acq("c", 1, "L"), queued(2)),
        step(8, acq("c", 2, "M"), granted(8)),
        step(9, try_acq("a", 2, "M"), Outcome::NotGranted),
        step(10, acq("a", 3, ""), rejected(Rejection::NameEmpty)),
        step(11, close("d"), Outcome::SessionClosed),
    ]);
    sim
}

#[test]
fn a_snapshot_decodes_to_an_equal_table_that_behaves_the_same() {
    let mut sim = busy_sim();
    let bytes = sim.encoding();
    // Its sessions remember their requests' fingerprints: format 11.
    assert_eq!(bytes[0], SNAPSHOT_FORMAT_VERSION);
    // Without them, a table that uses nothing of issue #32 is written in format 7, as before.
    let mut unprinted = sim.table.clone();
    unprinted.forget_request_prints();
    assert_eq!(encode_table(&unprinted)[0], SNAPSHOT_FORMAT_VERSION_V7);
    let restored = decode_table(&bytes).expect("decodes");
    assert_eq!(restored, sim.table);
    assert_eq!(encode_table(&restored), bytes);
    assert_eq!(restored.last_index(), 11);

    // The restored table continues exactly where the original would: queue, tokens, outcomes.
    // (`busy_sim()` only binds the session labels; its table is replaced by the decoded one.)
    let mut labelled = busy_sim();
    labelled.table = restored;
    let more = [
        step(12, rel("a", 4, "L", 5), Outcome::Released).hands(&[("L", "b", 1)]),
        step(13, acq("a", 1, "L"), granted(5)),
        step(14, acq("c", 1, "L"), queued(1)),
        step(15, close("b"), Outcome::SessionClosed).hands(&[("L", "c", 1)]),
    ];
    labelled.run(&more);
    sim.run(&more);
    assert_eq!(labelled.table, sim.table);
    assert_eq!(labelled.encoding(), sim.encoding());
}

#[test]
fn an_empty_table_round_trips() {
    let t = LockTable::new();
    assert_eq!(decode_table(&encode_table(&t)).expect("decodes"), t);
}

#[test]
fn unknown_versions_are_refused() {
    let bytes = busy_sim().encoding();
    for v in [0u8, SNAPSHOT_FORMAT_VERSION + 1, u8::MAX] {
        let mut other = bytes.clone();
        other[0] = v;
        assert!(
            matches!(decode_table(&other), Err(DecodeError::UnknownVersion(x)) if x == v),
            "version {v} was not refused"
        );
    }
}

#[test]
fn empty_and_truncated_snapshots_are_refused() {
    assert!(matches!(decode_table(&[]), Err(DecodeError::Empty)));
    let bytes = busy_sim().encoding();
    for len in 1..bytes.len() {
        assert!(
            decode_table(&bytes[..len]).is_err(),
            "a snapshot cut to {len} of {} bytes decoded",
            bytes.len()
        );
    }
}

/// Regression: trailing bytes after the table were ignored, so a snapshot with garbage appended
/// (a torn or concatenated write) decoded as if it were whole.
#[test]
fn trailing_bytes_after_the_table_are_refused() {
    let mut bytes = busy_sim().encoding();
    bytes.push(0);
    assert!(matches!(
        decode_table(&bytes),
        Err(DecodeError::Trailing(1))
    ));
}

/// Hostile input (issue #13): a snapshot's table arrives from a peer or the disk. Whatever the
/// bytes (a valid encoding with bytes flipped, cut, spliced or appended, or noise), decoding
/// returns a table that passes every invariant or an error; it never panics.
mod hostile_input {
    use super::*;
    use proptest::prelude::*;

    fn format_8_table() -> Vec<u8> {
        let mut t = LockTable::new();
        let key = |i| SessionKey {
            id: SessionId(i),
            secret: i,
        };
        let take = |i, name: &str, mode| Command {
            now_ms: 1_000,
            op: Op::AcquireWith {
                session: key(i),
                seq: 1,
                name: name.into(),
                wait_ms: 60_000,
                mode,
            },
        };
        for i in 1..=4 {
            t.apply(
                i,
                &Command {
                    now_ms: 0,
                    op: Op::CreateSession {
                        ttl_ms: 5_000,
                        secret: i,
                    },
                },
            );
        }
        t.apply(5, &take(1, "cfg", Mode::Shared));
        t.apply(6, &take(2, "cfg", Mode::Shared));
        t.apply(7, &take(3, "cfg", Mode::Exclusive));
        t.apply(8, &take(4, "jobs", Mode::Permits(1)));
        let mut more = take(1, "jobs", Mode::Permits(1));
        if let Op::AcquireWith { seq, .. } = &mut more.op {
            *seq = 2;
        }
        t.apply(9, &more);
        t.forget_request_prints(); // as a build before format 11 holds it
        let bytes = encode_table(&t);
        assert_eq!(bytes[0], SNAPSHOT_FORMAT_VERSION_V8);
        bytes
    }

    /// A table in format 9 (issue #32's elections): a leader with a value, a campaign queued
    /// with its own, and a remembered proclaim.
    fn format_9_table() -> Vec<u8> {
        let mut t = LockTable::new();
        let key = |i| SessionKey {
            id: SessionId(i),
            secret: i,
        };
        let campaign = |i, value: &[u8]| Command {
            now_ms: 1_000,
            op: Op::Campaign {
                session: key(i),
                seq: 1,
                name: "leader".into(),
                wait_ms: 60_000,
                value: value.to_vec(),
            },
        };
        for i in 1..=2 {
            let op = Op::CreateSession {
                ttl_ms: 5_000,
                secret: i,
            };
            t.apply(i, &Command { now_ms: 0, op });
        }
        t.apply(3, &campaign(1, b"10.0.0.1:80"));
        t.apply(4, &campaign(2, b"10.0.0.2:80"));
        let proclaim = Op::Proclaim {
            session: key(1),
            seq: 2,
            name: "leader".into(),
            token: 3,
            value: b"10.0.0.1:81".to_vec(),
        };
        t.apply(
            5,
            &Command {
                now_ms: 0,
                op: proclaim,
            },
        );
        t.forget_request_prints(); // as a build before format 11 holds it
        let bytes = encode_table(&t);
        assert_eq!(bytes[0], SNAPSHOT_FORMAT_VERSION_V9);
        bytes
    }

    /// A table in format 10 (lock-delay): a mutex held with a lock-delay and a waiter that
    /// asked for one, and a name in a running delay with a queue, in which a campaign waits
    /// with its value; and an election's leader with its value (format 9's state beside).
    fn format_10_table() -> Vec<u8> {
        let mut t = LockTable::new();
        let take = |i: u64, seq: u64, name: &str, wait_ms: u64| Command {
            now_ms: 1_000,
            op: Op::AcquireDelayed {
                session: SessionKey {
                    id: SessionId(i),
                    secret: i,
                },
                seq,
                name: name.into(),
                wait_ms,
                lock_delay_ms: 5_000,
            },
        };
        for i in 1..=4 {
            t.apply(
                i,
                &Command {
                    now_ms: 0,
                    op: Op::CreateSession {
                        ttl_ms: 5_000,
                        secret: i,
                    },
                },
            );
        }
        t.apply(5, &take(1, 1, "x", 0));
        t.apply(6, &take(2, 1, "x", 60_000));
        t.apply(7, &take(3, 1, "y", 0));
        t.apply(8, &take(4, 1, "y", 60_000));
        t.apply(
            9,
            &Command {
                now_ms: 2_000,
                op: Op::ExpireSessions {
                    ids: vec![SessionId(3)],
                },
            },
        );
        let campaign = |i: u64, name: &str, value: &[u8]| Command {
            now_ms: 2_000,
            op: Op::Campaign {
                session: SessionKey {
                    id: SessionId(i),
                    secret: i,
                },
                seq: 2,
                name: name.into(),
                wait_ms: 60_000,
                value: value.to_vec(),
            },
        };
        t.apply(10, &campaign(1, "y", b"1:80"));
        t.apply(11, &campaign(2, "leader", b"2:80"));
        t.forget_request_prints(); // as a build before format 11 holds it
        let bytes = encode_table(&t);
        assert_eq!(bytes[0], SNAPSHOT_FORMAT_VERSION_V10);
        bytes
    }

    fn mutate(mut bytes: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
        for &(at, kind, value) in edits {
            if bytes.is_empty() {
                bytes.push(value);
                continue;
            }
            let at = at % bytes.len();
            match kind % 4 {
                0 => bytes[at] = value,
                1 => bytes[at] ^= 1 << (value % 8),
                2 => bytes.truncate(at),
                _ => bytes.insert(at, value),
            }
        }
        bytes
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4_000, ..ProptestConfig::default() })]

        #[test]
        fn a_mutated_snapshot_decodes_to_a_valid_table_or_an_error(
            edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..8)
        ) {
            let bytes = mutate(busy_sim().encoding(), &edits);
            if let Ok(table) = decode_table(&bytes) {
                prop_assert!(table.check_invariants().is_ok());
            }
        }

        /// The same for a snapshot in format 8 (issue #32: a read-write lock with readers and
        /// a queued writer, a semaphore with a queue).
        #[test]
        fn a_mutated_format_8_snapshot_decodes_to_a_valid_table_or_an_error(
            edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..8)
        ) {
            let bytes = mutate(format_8_table(), &edits);
            if let Ok(table) = decode_table(&bytes) {
                prop_assert!(table.check_invariants().is_ok());
            }
        }

        /// The same for a snapshot in format 9 (issue #32's elections).
        #[test]
        fn a_mutated_format_9_snapshot_decodes_to_a_valid_table_or_an_error(
            edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..8)
        ) {
            let bytes = mutate(format_9_table(), &edits);
            if let Ok(table) = decode_table(&bytes) {
                prop_assert!(table.check_invariants().is_ok());
            }
        }

        /// The same for a snapshot in format 10 (lock-delays held, asked and running, and a
        /// campaign waiting out a delay).
        #[test]
        fn a_mutated_format_10_snapshot_decodes_to_a_valid_table_or_an_error(
            edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..8)
        ) {
            let bytes = mutate(format_10_table(), &edits);
            if let Ok(table) = decode_table(&bytes) {
                prop_assert!(table.check_invariants().is_ok());
            }
        }

        #[test]
        fn noise_never_decodes_to_a_broken_table(
            bytes in proptest::collection::vec(any::<u8>(), 0..512)
        ) {
            if let Ok(table) = decode_table(&bytes) {
                prop_assert!(table.check_invariants().is_ok());
            }
        }
    }
    /// A format 10 snapshot cut short anywhere (a torn write) is refused, never read as a
    /// smaller table; so is one with a byte too many.
    #[test]
    fn a_torn_format_10_snapshot_is_refused_at_every_length() {
        let bytes = format_10_table();
        for cut in 0..bytes.len() {
            assert!(
                decode_table(&bytes[..cut]).is_err(),
                "{cut} of {} bytes decoded",
                bytes.len()
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            decode_table(&longer),
            Err(DecodeError::Trailing(1))
        ));
        assert!(decode_table(&bytes).is_ok());
    }
}
