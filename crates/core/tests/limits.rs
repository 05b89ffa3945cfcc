//! Every limit the state machine enforces, at, below and above its bound. (The sessions limit is
//! tested in `table.rs`'s unit tests: see `sessions_limit_is_enforced_at_sessions_max`.)

mod support;

use latchkey_core::limits::*;
use latchkey_core::*;
use support::*;

#[test]
fn lock_names_are_non_empty_and_at_most_512_bytes() {
    let too_long = |len| rejected(Rejection::NameTooLong { len, max: 512 });
    let ascii_max = "n".repeat(LOCK_NAME_BYTES_MAX);
    let ascii_over = "n".repeat(LOCK_NAME_BYTES_MAX + 1);
    // 256 two-byte characters: 512 bytes. 171 three-byte characters: 513 bytes, 171 chars.
    let utf8_max = "é".repeat(256);
    let utf8_over = "€".repeat(171);
    let utf8_over_by_one = format!("{}a", "é".repeat(256));
    assert_eq!(utf8_max.len(), 512);
    assert_eq!(utf8_over.len(), 513);

    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        step(2, acq("a", 1, ""), rejected(Rejection::NameEmpty)),
        step(3, acq("a", 2, &ascii_over), too_long(513)),
        step(4, acq("a", 3, &utf8_over), too_long(513)),
        step(5, acq("a", 4, &utf8_over_by_one), too_long(513)),
        step(6, acq("a", 5, &"x".repeat(10_000)), too_long(10_000)),
        step(7, acq("a", 6, &ascii_max), granted(7)),
        step(8, acq("a", 7, &utf8_max), granted(8)),
    ]);
    assert_eq!(sim.table.lock_count(), 2);
    assert_eq!(validate_name("a"), Ok(()));
    assert_eq!(validate_name(&ascii_max), Ok(()));
    assert_eq!(validate_name(""), Err(Rejection::NameEmpty));
}

/// A newline in a lock name broke the line-based output of `list` (issue #14): names with
/// control characters are refused before they are proposed, while the state machine still
/// applies what older versions logged.
#[test]
fn lock_names_with_control_characters_are_refused() {
    for (name, at) in [
        ("a\nb", 1),
        ("\tx", 0),
        ("x\u{1b}[31m", 1),
        ("é\u{7f}", 2),
        ("a\u{85}", 1),
    ] {
        assert_eq!(
            validate_name(name),
            Err(Rejection::NameControlCharacter { at }),
            "{name:?}"
        );
    }
    assert_eq!(validate_name("jobs/nightly backup-é"), Ok(()));
    let mut sim = TableDriver::new();
    sim.run(&[open(1, "a"), step(2, acq("a", 1, "old\nname"), granted(2))]);
}

#[test]
fn session_ttl_is_between_one_second_and_one_hour_inclusive() {
    let out = |ttl_ms| {
        rejected(Rejection::TtlOutOfRange {
            ttl_ms,
            min: 1_000,
            max: 3_600_000,
        })
    };
    let ok = |id, ttl_ms| Outcome::SessionCreated {
        id: SessionId(id),
        ttl_ms,
    };
    let mut sim = TableDriver::new();
    sim.run(&[
        step(1, Cmd::Open("a", 0), out(0)),
        step(2, Cmd::Open("a", SESSION_TTL_MS_MIN - 1), out(999)),
        step(3, Cmd::Open("a", SESSION_TTL_MS_MAX + 1), out(3_600_001)),
        step(4, Cmd::Open("a", u64::MAX), out(u64::MAX)),
        step(5, Cmd::Open("a", SESSION_TTL_MS_MIN), ok(5, 1_000)),
        step(6, Cmd::Open("a", SESSION_TTL_MS_MAX), ok(6, 3_600_000)),
        step(7, Cmd::Open("a", SESSION_TTL_MS_DEFAULT), ok(7, 15_000)),
    ]);
    assert_eq!(
        sim.table.session_count(),
        3,
        "a rejected create opened a session"
    );
}

#[test]
fn a_session_holds_or_waits_for_at_most_locks_per_session_max() {
    let mut t = LockTable::new();
    let cmd = |op| Command { now_ms: 0, op };
    let a = SessionKey {
        id: SessionId(1),
        secret: 1,
    };
    let b = SessionKey {
        id: SessionId(2),
        secret: 2,
    };
    for (index, secret) in [(1, 1), (2, 2)] {
        apply_checked(
            &mut t,
            index,
            &cmd(Op::CreateSession {
                ttl_ms: TTL_MS,
                secret,
            }),
        );
    }
    let acquire = |key, seq, name: String, wait| {
        cmd(Op::Acquire {
            session: key,
            seq,
            name,
            wait_ms: if wait { WAIT_TIMEOUT_MS_MAX } else { 0 },
        })
    };
    let mut index = 2;
    // b holds one lock, so that a's last slot can be a wait.
    index += 1;
    let o = apply_checked(&mut t, index, &acquire(b, 1, "busy".into(), true)).outcome;
    assert_eq!(o, granted(index));
    for i in 0..LOCKS_PER_SESSION_MAX as u64 - 1 {
        index += 1;
        let o = apply_checked(&mut t, index, &acquire(a, i + 1, format!("l{i}"), true)).outcome;
        assert_eq!(o, granted(index));
    }
    index += 1;
    let o = apply_checked(&mut t, index, &acquire(a, 5_000, "busy".into(), true)).outcome;
    assert_eq!(o, queued(1), "the last slot, counted with holds, is a wait");
    let too_many = rejected(Rejection::TooManyLocksForSession {
        max: LOCKS_PER_SESSION_MAX,
    });
    for (seq, wait) in [(5_001, true), (5_002, false)] {
        index += 1;
        let o = apply_checked(&mut t, index, &acquire(a, seq, "one-more".into(), wait)).outcome;
        assert_eq!(o, too_many);
    }
    assert_eq!(t.describe("one-more"), None);
    // Releasing one frees a slot.
    index += 1;
    let release = cmd(Op::Release {
        session: a,
        seq: 5_003,
        name: "l0".into(),
        token: 4,
    });
    assert_eq!(
        apply_checked(&mut t, index, &release).outcome,
        Outcome::Released
    );
    index += 1;
    let o = apply_checked(&mut t, index, &acquire(a, 5_004, "one-more".into(), true)).outcome;
    assert_eq!(o, granted(index));
}

#[test]
fn a_full_queue_rejects_the_next_waiter_with_queue_full() {
    let mut t = LockTable::new();
    let cmd = |op| Command { now_ms: 0, op };
    let sessions = WAITERS_PER_LOCK_MAX as u64 + 2;
    for i in 1..=sessions {
        let created = apply_checked(
            &mut t,
            i,
            &cmd(Op::CreateSession {
                ttl_ms: TTL_MS,
                secret: i,
            }),
        );
        assert_eq!(
            created.outcome,
            Outcome::SessionCreated {
                id: SessionId(i),
                ttl_ms: TTL_MS
            }
        );
    }
    let key = |i| SessionKey {
        id: SessionId(i),
        secret: i,
    };
    let acquire = |i, wait| {
        cmd(Op::Acquire {
            session: key(i),
            seq: 1,
            name: "L".into(),
            wait_ms: if wait { WAIT_TIMEOUT_MS_MAX } else { 0 },
        })
    };
    let mut index = sessions;
    for i in 1..sessions {
        index += 1;
        let want = if i == 1 {
            granted(index)
        } else {
            queued(i as u32 - 1)
        };
        assert_eq!(
            apply_checked(&mut t, index, &acquire(i, true)).outcome,
            want
        );
    }
    assert_eq!(
        t.describe("L").unwrap().waiters as usize,
        WAITERS_PER_LOCK_MAX
    );
    index += 1;
    let full = rejected(Rejection::QueueFull {
        max: WAITERS_PER_LOCK_MAX,
    });
    assert_eq!(
        apply_checked(&mut t, index, &acquire(sessions, true)).outcome,
        full
    );
    assert_eq!(
        t.describe("L").unwrap().waiters as usize,
        WAITERS_PER_LOCK_MAX
    );
    assert_eq!(
        t.request_state(SessionId(sessions), 1),
        Some(RequestState::Done(full))
    );
    // A try-lock on a full queue is simply not granted: it would not have queued anyway.
    index += 1;
    let try_lock = cmd(Op::Acquire {
        session: key(sessions),
        seq: 2,
        name: "L".into(),
        wait_ms: 0,
    });
    assert_eq!(
        apply_checked(&mut t, index, &try_lock).outcome,
        Outcome::NotGranted
    );
}

#[test]
fn outcomes_older_than_the_remembered_window_are_request_too_old() {
    let mut sim = TableDriver::new();
    sim.run(&[open(1, "a"), step(2, acq("a", 1, "L"), granted(2))]);
    // Seqs 2..=SESSION_OUTCOMES_MAX+1: together with seq 1 that is one outcome too many.
    let last = SESSION_OUTCOMES_MAX as u64 + 1;
    for seq in 2..=last {
        let index = seq + 1;
        sim.run(&[step(
            index,
            try_acq("a", seq, "L"),
            rejected(Rejection::AlreadyHeld { token: 2 }),
        )]);
    }
    let mut index = last + 1;
    let mut next = || {
        index += 1;
        index
    };
    sim.run(&[
        step(
            next(),
            acq("a", 1, "L"),
            rejected(Rejection::RequestTooOld { seq: 1 }),
        ),
        step(
            next(),
            rel("a", 1, "L", 2),
            rejected(Rejection::RequestTooOld { seq: 1 }),
        ),
        step(
            next(),
            cancel("a", 1),
            rejected(Rejection::UnknownRequest { seq: 1 }),
        ),
        // The oldest remembered one is still answered.
        step(
            next(),
            try_acq("a", 2, "L"),
            rejected(Rejection::AlreadyHeld { token: 2 }),
        ),
    ]);
    assert_eq!(sim.holder("L"), Some(("a", 2, 0)), "a too-old retry acted");
}

/// Regression: outcomes were forgotten in sequence-number order, so a wait that was granted after
/// the session had finished SESSION_OUTCOMES_MAX later requests had its grant forgotten at once: a
/// re-sent Acquire got RequestTooOld and the client never learned its token (a lost grant).
#[test]
fn a_long_wait_granted_after_many_later_requests_keeps_its_grant() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        step(3, acq("a", 1, "L"), granted(3)),
        step(4, acq("a", 2, "M"), granted(4)),
        step(5, acq("b", 1, "L"), queued(1)),
    ]);
    // While b waits, it finishes more requests than the session remembers.
    let mut index = 5;
    for seq in 2..=SESSION_OUTCOMES_MAX as u64 + 10 {
        index += 1;
        sim.run(&[step(index, try_acq("b", seq, "M"), Outcome::NotGranted)]);
    }
    index += 1;
    sim.run(&[step(index, rel("a", 3, "L", 3), Outcome::Released).hands(&[("L", "b", 1)])]);
    let grant = index;
    sim.run(&[
        step(index + 1, acq("b", 1, "L"), granted(grant)),
        step(index + 2, cancel("b", 1), granted(grant)),
    ]);
    assert_eq!(sim.holder("L"), Some(("b", grant, 0)));
}
