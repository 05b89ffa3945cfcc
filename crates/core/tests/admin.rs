//! Issue #14 items 6 and 7 on the pure table: owner descriptions, force-release, revoke and
//! the audit log, each case a row of inputs and expected outcomes, with `check_invariants`
//! after every entry and a snapshot round trip at the end of each.

use latchkey_core::codec::{decode_table, encode_table};
use latchkey_core::*;

const TTL_MS: u64 = limits::SESSION_TTL_MS_DEFAULT;

fn key(id: u64) -> SessionKey {
    SessionKey {
        id: SessionId(id),
        secret: id,
    }
}

fn owner(host: &str) -> SessionOwner {
    SessionOwner {
        host: host.into(),
        pid: 4411,
        user: "deploy".into(),
        text: "nightly job".into(),
    }
}

fn actor() -> Actor {
    Actor {
        identity: Some("ops".into()),
        claimed: "alice@laptop".into(),
    }
}

/// A table where session 1 (owner web-3) holds L with token 3, session 2 waits for it since
/// entry 4, and session 5 (no owner) holds M with token 6. Entry `i` is stamped `i * 1000` ms.
fn table() -> LockTable {
    let mut t = LockTable::new();
    let mut apply = |index: u64, op: Op| {
        let applied = t.apply(
            index,
            &Command {
                now_ms: index * 1_000,
                op,
            },
        );
        t.check_invariants().expect("invariants");
        applied.outcome
    };
    let open = |secret, owner| Op::OpenSession {
        ttl_ms: TTL_MS,
        secret,
        identity: None,
        owner,
    };
    let acquire = |id, name: &str, wait_ms| Op::Acquire {
        session: key(id),
        seq: 1,
        name: name.into(),
        wait_ms,
    };
    apply(1, open(1, Some(owner("web-3"))));
    apply(2, open(2, Some(owner("web-4"))));
    assert_eq!(apply(3, acquire(1, "L", 0)), Outcome::Granted { token: 3 });
    assert_eq!(
        apply(4, acquire(2, "L", 60_000)),
        Outcome::Queued { position: 1 }
    );
    apply(5, open(5, None));
    assert_eq!(apply(6, acquire(5, "M", 0)), Outcome::Granted { token: 6 });
    t
}

fn force(name: &str, token: Option<u64>, reason: &str) -> Op {
    Op::ForceRelease {
        name: name.into(),
        token,
        by: actor(),
        reason: reason.into(),
    }
}

fn revoke(id: u64, reason: &str) -> Op {
    Op::RevokeSession {
        session: SessionId(id),
        by: actor(),
        reason: reason.into(),
    }
}

#[test]
fn administrative_commands_answer_hand_over_and_audit_as_the_table_says() {
    struct Case {
        what: &'static str,
        op: Op,
        outcome: Outcome,
        /// (lock, session, token) handed over by the entry.
        handoffs: Vec<(&'static str, u64, u64)>,
        /// The audit log's actions afterwards.
        audit: Vec<AuditAction>,
        /// Session 1's force-released tokens afterwards (None: the session is gone).
        revoked_of_1: Option<Vec<u64>>,
    }
    let cases = [
        Case {
            what: "force-release hands the lock to the waiter with a higher token",
            op: force("L", None, "stuck deploy"),
            outcome: Outcome::ForceReleased {
                session: SessionId(1),
                token: 3,
            },
            handoffs: vec![("L", 2, 10)],
            audit: vec![AuditAction::ForceRelease {
                name: "L".into(),
                session: SessionId(1),
                token: 3,
                next_token: Some(10),
            }],
            revoked_of_1: Some(vec![3]),
        },
        Case {
            what: "a conditional force-release with the holder's token",
            op: force("L", Some(3), "stuck"),
            outcome: Outcome::ForceReleased {
                session: SessionId(1),
                token: 3,
            },
            handoffs: vec![("L", 2, 10)],
            audit: vec![AuditAction::ForceRelease {
                name: "L".into(),
                session: SessionId(1),
                token: 3,
                next_token: Some(10),
            }],
            revoked_of_1: Some(vec![3]),
        },
        Case {
            what: "a conditional force-release with another token changes nothing",
            op: force("L", Some(2), "stuck"),
            outcome: Outcome::Rejected(Rejection::TokenMismatch {
                name: "L".into(),
                token: 2,
                holder_token: 3,
            }),
            handoffs: vec![],
            audit: vec![],
            revoked_of_1: Some(vec![]),
        },
        Case {
            what: "a free lock",
            op: force("free", None, "stuck"),
            outcome: Outcome::Rejected(Rejection::LockNotHeld {
                name: "free".into(),
            }),
            handoffs: vec![],
            audit: vec![],
            revoked_of_1: Some(vec![]),
        },
        Case {
            what: "no reason",
            op: force("L", None, "  "),
            outcome: Outcome::Rejected(Rejection::ReasonEmpty),
            handoffs: vec![],
            audit: vec![],
            revoked_of_1: Some(vec![]),
        },
        Case {
            what: "a reason over its limit",
            op: force("L", None, &"x".repeat(limits::AUDIT_REASON_BYTES_MAX + 1)),
            outcome: Outcome::Rejected(Rejection::FieldTooLong {
                field: "reason".into(),
                len: limits::AUDIT_REASON_BYTES_MAX + 1,
                max: limits::AUDIT_REASON_BYTES_MAX,
            }),
            handoffs: vec![],
            audit: vec![],
            revoked_of_1: Some(vec![]),
        },
        Case {
            what: "revoke ends the session and hands its locks on",
            op: revoke(1, "runaway"),
            outcome: Outcome::SessionRevoked { locks: 1 },
            handoffs: vec![("L", 2, 10)],
            audit: vec![AuditAction::RevokeSession {
                session: SessionId(1),
                locks: 1,
            }],
            revoked_of_1: None,
        },
        Case {
            what: "revoke of a session that does not exist",
            op: revoke(99, "runaway"),
            outcome: Outcome::Rejected(Rejection::SessionNotFound { id: SessionId(99) }),
            handoffs: vec![],
            audit: vec![],
            revoked_of_1: Some(vec![]),
        },
    ];
    for case in cases {
        let mut t = table();
        let applied = t.apply(
            10,
            &Command {
                now_ms: 10_000,
                op: case.op,
            },
        );
        t.check_invariants()
            .unwrap_or_else(|e| panic!("{}: {e}", case.what));
        assert_eq!(applied.outcome, case.outcome, "{}", case.what);
        let handoffs: Vec<(&str, u64, u64)> = applied
            .handoffs
            .iter()
            .map(|h| (h.name.as_str(), h.session.0, h.token))
            .collect();
        assert_eq!(handoffs, case.handoffs, "{}", case.what);
        let audit: Vec<AuditAction> = t.audit().map(|r| r.action.clone()).collect();
        assert_eq!(audit, case.audit, "{}", case.what);
        for r in t.audit() {
            assert_eq!(
                (r.index, r.at_ms, &r.by),
                (10, 10_000, &actor()),
                "{}",
                case.what
            );
        }
        assert_eq!(
            t.revoked_grants(SessionId(1))
                .map(|(tokens, _)| tokens.to_vec()),
            case.revoked_of_1,
            "{}",
            case.what
        );
        let restored = decode_table(&encode_table(&t)).expect("decodes");
        assert_eq!(restored, t, "{}: snapshot round trip", case.what);
    }
}

#[test]
fn describe_shows_owners_grant_time_and_each_waiters_start() {
    let t = table();
    let l = t.describe("L").expect("held");
    let h = l.holder.expect("held");
    assert_eq!(
        (h.session, h.token, h.granted_at_ms),
        (SessionId(1), 3, 3_000)
    );
    assert_eq!(h.owner, Some(owner("web-3")));
    assert_eq!(
        l.queue,
        vec![WaiterState {
            session: SessionId(2),
            mode: Mode::Exclusive,
            since_ms: 4_000,
            owner: Some(owner("web-4")),
        }]
    );
    assert_eq!(t.describe("M").and_then(|m| m.holder).unwrap().owner, None);
}

#[test]
fn a_try_lock_on_a_held_lock_names_the_holder_as_of_its_entry() {
    let mut t = table();
    let applied = t.apply(
        10,
        &Command {
            now_ms: 10_000,
            op: Op::Acquire {
                session: key(5),
                seq: 2,
                name: "L".into(),
                wait_ms: 0,
            },
        },
    );
    assert_eq!(applied.outcome, Outcome::NotGranted);
    let busy = applied.busy.expect("names the holder");
    assert_eq!((busy.session, busy.token), (SessionId(1), 3));
    assert_eq!(busy.owner, Some(owner("web-3")));
}

#[test]
fn an_owner_description_over_its_limits_is_refused() {
    let mut t = LockTable::new();
    let mut long = owner("h");
    long.text = "t".repeat(limits::OWNER_TEXT_BYTES_MAX + 1);
    let applied = t.apply(
        1,
        &Command {
            now_ms: 0,
            op: Op::OpenSession {
                ttl_ms: TTL_MS,
                secret: 1,
                identity: None,
                owner: Some(long),
            },
        },
    );
    assert!(
        matches!(applied.outcome, Outcome::Rejected(Rejection::FieldTooLong { ref field, .. }) if field == "owner text"),
        "{:?}",
        applied.outcome
    );
    assert_eq!(t.session_count(), 0);
}

#[test]
fn the_audit_log_keeps_the_newest_records_and_the_revoked_list_is_bounded() {
    let mut t = LockTable::new();
    let index = std::cell::Cell::new(0);
    let next = |t: &mut LockTable, op: Op| {
        index.set(index.get() + 1);
        let i = index.get();
        t.apply(i, &Command { now_ms: i, op }).outcome
    };
    next(
        &mut t,
        Op::OpenSession {
            ttl_ms: TTL_MS,
            secret: 1,
            identity: None,
            owner: None,
        },
    );
    let rounds = limits::AUDIT_RECORDS_MAX + 5;
    let mut last_taken = 0;
    for _ in 0..rounds {
        let granted = next(
            &mut t,
            Op::Acquire {
                session: key(1),
                seq: index.get() + 1,
                name: "L".into(),
                wait_ms: 0,
            },
        );
        let Outcome::Granted { token } = granted else {
            panic!("{granted:?}")
        };
        assert_eq!(
            next(&mut t, force("L", Some(token), "drill")),
            Outcome::ForceReleased {
                session: SessionId(1),
                token
            }
        );
        last_taken = token;
    }
    t.check_invariants().expect("invariants");
    assert_eq!(t.audit().count(), limits::AUDIT_RECORDS_MAX);
    let newest = t.audit().last().expect("records");
    assert!(
        matches!(&newest.action, AuditAction::ForceRelease { token, .. } if *token == last_taken)
    );
    let (revoked, through) = t.revoked_grants(SessionId(1)).expect("live");
    assert_eq!(revoked.len(), limits::REVOKED_GRANTS_PER_SESSION_MAX);
    assert_eq!(revoked.last(), Some(&last_taken));
    assert!(through.is_some_and(|m| m < revoked[0]));
}
