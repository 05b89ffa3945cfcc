//! Lease marks (`MarkLeases`/`RenewLeases`): the replicated half of bounded lease extension.
//! A mark records how long a session had gone unrenewed; a logged renewal clears it; both
//! survive snapshots; neither touches locks.

use latchkey_core::codec::{decode_table, encode_table};
use latchkey_core::*;

fn cmd(op: Op) -> Command {
    Command { now_ms: 0, op }
}

fn open(t: &mut LockTable, index: u64) -> SessionKey {
    match t
        .apply(
            index,
            &cmd(Op::CreateSession {
                ttl_ms: 10_000,
                secret: 7,
            }),
        )
        .outcome
    {
        Outcome::SessionCreated { id, .. } => SessionKey { id, secret: 7 },
        o => panic!("{o:?}"),
    }
}

#[test]
fn a_mark_stands_until_a_logged_renewal_clears_it_and_survives_a_snapshot() {
    let mut t = LockTable::new();
    let a = open(&mut t, 1);
    let b = open(&mut t, 2);
    let ghost = SessionId(99);
    let o = t
        .apply(
            3,
            &cmd(Op::MarkLeases {
                marks: vec![(a.id, 6_000), (ghost, 1), (b.id, 0)],
            }),
        )
        .outcome;
    // Only live sessions are marked.
    assert_eq!(
        o,
        Outcome::LeasesMarked {
            ids: vec![a.id, b.id]
        }
    );
    assert_eq!(t.session(a.id).unwrap().lease_mark_ms, Some(6_000));
    assert_eq!(t.session(b.id).unwrap().lease_mark_ms, Some(0));

    let t2 = decode_table(&encode_table(&t)).unwrap();
    assert_eq!(t2.session(a.id).unwrap().lease_mark_ms, Some(6_000));

    let o = t
        .apply(
            4,
            &cmd(Op::RenewLeases {
                ids: vec![a.id, ghost],
            }),
        )
        .outcome;
    assert_eq!(o, Outcome::LeasesRenewed { ids: vec![a.id] });
    assert_eq!(t.session(a.id).unwrap().lease_mark_ms, None);
    assert_eq!(t.session(b.id).unwrap().lease_mark_ms, Some(0));
    // A later mark replaces the value.
    t.apply(
        5,
        &cmd(Op::MarkLeases {
            marks: vec![(b.id, 5_000)],
        }),
    );
    assert_eq!(t.session(b.id).unwrap().lease_mark_ms, Some(5_000));
    t.check_invariants().unwrap();
}

#[test]
fn marks_do_not_touch_locks_or_outcomes() {
    let mut t = LockTable::new();
    let a = open(&mut t, 1);
    let granted = t
        .apply(
            2,
            &cmd(Op::Acquire {
                session: a,
                seq: 1,
                name: "L".into(),
                wait_ms: 0,
            }),
        )
        .outcome;
    assert_eq!(granted, Outcome::Granted { token: 2 });
    let before = t.describe("L");
    t.apply(
        3,
        &cmd(Op::MarkLeases {
            marks: vec![(a.id, 9_000)],
        }),
    );
    t.apply(4, &cmd(Op::RenewLeases { ids: vec![a.id] }));
    assert_eq!(t.describe("L"), before);
    assert_eq!(t.request_state(a.id, 1), Some(RequestState::Done(granted)));
}

/// A table restored into a new cluster (`latchkey snapshot restore`) keeps its sessions but
/// none of their marks: the old cluster's "unrenewed for u" would cut the new cluster's first
/// lease short.
#[test]
fn restarting_leases_lifts_every_mark_and_keeps_the_sessions() {
    let mut t = LockTable::new();
    let a = open(&mut t, 1);
    let b = open(&mut t, 2);
    t.apply(
        3,
        &cmd(Op::MarkLeases {
            marks: vec![(a.id, 6_000), (b.id, 1)],
        }),
    );
    assert!(t.sessions().all(|s| s.lease_mark_ms.is_some()));
    t.restart_leases();
    let sessions: Vec<SessionInfo> = t.sessions().collect();
    assert_eq!(sessions.len(), 2);
    assert!(sessions.iter().all(|s| s.lease_mark_ms.is_none()));
    assert_eq!(t.last_index(), 3, "restarting leases is not an entry");
    t.check_invariants().unwrap();
}
