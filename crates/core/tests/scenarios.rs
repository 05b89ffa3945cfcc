//! Table-driven scenarios of the lock state machine: FIFO grants, handoffs, exactly-once
//! retries, stale releases, the cancel-vs-grant race, expiry/close handover, queries.

mod support;

use latchkey_core::*;
use support::*;

fn waiting(name: &str, position: u32) -> Option<RequestState> {
    Some(RequestState::Waiting {
        name: name.to_owned(),
        position,
    })
}

fn done(o: Outcome) -> Option<RequestState> {
    Some(RequestState::Done(o))
}

#[test]
fn grants_follow_fifo_order_of_the_queue() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        open(3, "c"),
        open(4, "d"),
        step(5, acq("a", 1, "L"), granted(5)),
        // Queue in an order that is neither session-id order nor reversed: c, b, d.
        step(6, acq("c", 1, "L"), queued(1)),
        step(7, acq("b", 1, "L"), queued(2)),
        step(8, acq("d", 1, "L"), queued(3)),
        step(9, rel("a", 2, "L", 5), Outcome::Released).hands(&[("L", "c", 1)]),
        step(10, rel("c", 2, "L", 9), Outcome::Released).hands(&[("L", "b", 1)]),
        step(11, rel("b", 2, "L", 10), Outcome::Released).hands(&[("L", "d", 1)]),
        step(12, rel("d", 2, "L", 11), Outcome::Released),
    ]);
    assert_eq!(
        sim.table.describe("L"),
        None,
        "the last release frees the lock"
    );
    assert_eq!(sim.table.lock_count(), 0);
}

#[test]
fn a_release_hands_to_exactly_the_first_waiter_and_shifts_the_rest() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        open(3, "c"),
        open(4, "d"),
        step(5, acq("a", 1, "L"), granted(5)),
        step(6, acq("b", 7, "L"), queued(1)),
        step(7, acq("c", 3, "L"), queued(2)),
        step(8, acq("d", 9, "L"), queued(3)),
    ]);
    assert_eq!(sim.holder("L"), Some(("a", 5, 3)));
    sim.run(&[step(20, rel("a", 2, "L", 5), Outcome::Released).hands(&[("L", "b", 7)])]);
    assert_eq!(sim.holder("L"), Some(("b", 20, 2)));
    assert_eq!(sim.state("b", 7), done(granted(20)));
    assert_eq!(sim.state("c", 3), waiting("L", 1));
    assert_eq!(sim.state("d", 9), waiting("L", 2));
    // The shifted waiters still see their new positions on retry, and are not re-queued.
    sim.run(&[
        step(21, acq("c", 3, "L"), queued(1)),
        step(22, acq("d", 9, "L"), queued(2)),
    ]);
    assert_eq!(sim.holder("L"), Some(("b", 20, 2)));
}

#[test]
fn retry_of_a_finished_request_returns_its_original_outcome() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        step(3, acq("a", 1, "L"), granted(3)),
        step(4, try_acq("b", 1, "L"), Outcome::NotGranted),
        step(5, rel("a", 2, "L", 3), Outcome::Released),
        step(6, acq("b", 2, "L"), granted(6)),
        // Retries at later indexes: the original outcomes, not a new evaluation.
        step(7, acq("a", 1, "L"), granted(3)),
        step(8, try_acq("b", 1, "L"), Outcome::NotGranted),
        step(9, rel("a", 2, "L", 3), Outcome::Released),
        step(10, acq("b", 2, "L"), granted(6)),
    ]);
    assert_eq!(sim.holder("L"), Some(("b", 6, 0)));
    // A rejection is an outcome too, and is remembered like one.
    sim.run(&[
        step(11, acq("a", 3, ""), rejected(Rejection::NameEmpty)),
        step(12, acq("a", 3, ""), rejected(Rejection::NameEmpty)),
    ]);
}

#[test]
fn retry_of_a_queued_acquire_after_its_grant_returns_the_original_token() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        step(3, acq("a", 1, "L"), granted(3)),
        step(4, acq("b", 5, "L"), queued(1)),
        step(5, rel("a", 2, "L", 3), Outcome::Released).hands(&[("L", "b", 5)]),
        // b's client missed the handoff and re-sends; later the lock changes hands again.
        step(6, acq("b", 5, "L"), granted(5)),
        step(7, rel("b", 6, "L", 5), Outcome::Released),
        step(8, acq("a", 3, "L"), granted(8)),
        step(9, acq("b", 5, "L"), granted(5)),
    ]);
    assert_eq!(sim.holder("L"), Some(("a", 8, 0)));
}

#[test]
fn retry_of_a_waiting_acquire_reports_its_position_without_queueing_twice() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        open(3, "c"),
        step(4, acq("a", 1, "L"), granted(4)),
        step(5, acq("b", 1, "L"), queued(1)),
        step(6, acq("c", 1, "L"), queued(2)),
        step(7, acq("c", 1, "L"), queued(2)),
        step(8, acq("b", 1, "L"), queued(1)),
        // Even with wait=false the retry is the same request, still waiting.
        step(9, try_acq("c", 1, "L"), queued(2)),
    ]);
    assert_eq!(sim.holder("L"), Some(("a", 4, 2)));
    sim.run(&[
        step(10, rel("a", 2, "L", 4), Outcome::Released).hands(&[("L", "b", 1)]),
        step(11, rel("b", 2, "L", 10), Outcome::Released).hands(&[("L", "c", 1)]),
        // Had c been queued twice, this release would hand L to c again (or to nobody).
        step(12, rel("c", 2, "L", 11), Outcome::Released),
    ]);
    assert_eq!(sim.table.describe("L"), None);
}

#[test]
fn a_stale_release_after_regrant_to_another_session_changes_nothing() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        open(3, "c"),
        step(4, acq("a", 1, "L"), granted(4)),
        step(5, acq("b", 1, "L"), queued(1)),
        step(6, acq("c", 1, "L"), queued(2)),
        step(7, rel("a", 2, "L", 4), Outcome::Released).hands(&[("L", "b", 1)]),
    ]);
    let before = sim.holder("L");
    assert_eq!(before, Some(("b", 7, 1)));
    sim.run(&[
        // a's old token, with a new sequence number: not a retry, a stale release.
        step(8, rel("a", 3, "L", 4), Outcome::NotHolder),
        // b itself naming a token it does not hold.
        step(9, rel("b", 2, "L", 4), Outcome::NotHolder),
        // c, a waiter, naming b's current token.
        step(10, rel("c", 2, "L", 7), Outcome::NotHolder),
    ]);
    assert_eq!(
        sim.holder("L"),
        before,
        "a stale release freed a later grant"
    );
    assert_eq!(sim.state("c", 1), waiting("L", 1));
}

#[test]
fn a_stale_release_after_regrant_to_the_same_session_changes_nothing() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        step(2, acq("a", 1, "L"), granted(2)),
        step(3, rel("a", 2, "L", 2), Outcome::Released),
        step(4, acq("a", 3, "L"), granted(4)),
        // The first release re-sent with a fresh seq (a client bug or a duplicate): the token
        // names the old grant, so the new grant survives.
        step(5, rel("a", 4, "L", 2), Outcome::NotHolder),
        // The original release retried with its own seq: its original answer, no action.
        step(6, rel("a", 2, "L", 2), Outcome::Released),
    ]);
    assert_eq!(sim.holder("L"), Some(("a", 4, 0)));
}

#[test]
fn releasing_a_free_lock_is_not_holder() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        step(2, rel("a", 1, "L", 1), Outcome::NotHolder),
        step(3, rel("a", 2, "L", 0), Outcome::NotHolder),
    ]);
    assert_eq!(sim.table.lock_count(), 0);
}

#[test]
fn cancel_after_the_grant_returns_the_grant() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        step(3, acq("a", 1, "L"), granted(3)),
        step(4, acq("b", 1, "L"), queued(1)),
        step(5, rel("a", 2, "L", 3), Outcome::Released).hands(&[("L", "b", 1)]),
        // b's wait timed out on the server just as the grant was committed: log order wins.
        step(6, cancel("b", 1), granted(5)),
        step(7, acq("b", 1, "L"), granted(5)),
    ]);
    assert_eq!(
        sim.holder("L"),
        Some(("b", 5, 0)),
        "the cancel undid the grant"
    );
}

#[test]
fn cancel_before_the_release_passes_the_lock_to_the_next_waiter() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        open(3, "c"),
        step(4, acq("a", 1, "L"), granted(4)),
        step(5, acq("b", 1, "L"), queued(1)),
        step(6, acq("c", 1, "L"), queued(2)),
        step(7, cancel("b", 1), Outcome::NotGranted),
    ]);
    assert_eq!(sim.state("c", 1), waiting("L", 1));
    assert_eq!(sim.holder("L"), Some(("a", 4, 1)));
    sim.run(&[
        step(8, rel("a", 2, "L", 4), Outcome::Released).hands(&[("L", "c", 1)]),
        // b's retries, of the acquire and of the cancel, both get "not granted".
        step(9, acq("b", 1, "L"), Outcome::NotGranted),
        step(10, cancel("b", 1), Outcome::NotGranted),
    ]);
    assert_eq!(sim.holder("L"), Some(("c", 8, 0)));
}

#[test]
fn cancel_of_an_unknown_request_is_rejected() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        step(
            2,
            cancel("a", 1),
            rejected(Rejection::UnknownRequest { seq: 1 }),
        ),
        // Unknown requests are not remembered: seq 1 is still usable.
        step(3, acq("a", 1, "L"), granted(3)),
    ]);
}

#[test]
fn expiry_hands_each_held_lock_to_its_first_waiter() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        open(3, "c"),
        step(4, acq("a", 1, "L"), granted(4)),
        step(5, acq("a", 2, "M"), granted(5)),
        step(6, acq("a", 3, "N"), granted(6)),
        step(7, acq("b", 1, "L"), queued(1)),
        step(8, acq("c", 1, "L"), queued(2)),
        step(9, acq("c", 2, "M"), queued(1)),
        expire(12, &["a"], &["a"]).hands(&[("L", "b", 1), ("M", "c", 2)]),
    ]);
    assert_eq!(sim.holder("L"), Some(("b", 12, 1)));
    assert_eq!(sim.holder("M"), Some(("c", 12, 0)));
    assert_eq!(
        sim.table.describe("N"),
        None,
        "a lock without waiters is freed"
    );
    assert_eq!(sim.table.session(sim.id("a")), None);
    sim.run(&[step(
        13,
        acq("a", 4, "L"),
        rejected(Rejection::SessionNotFound { id: SessionId(1) }),
    )]);
}

#[test]
fn close_hands_over_held_locks_and_drops_the_sessions_waits() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        open(3, "c"),
        step(4, acq("a", 1, "L"), granted(4)),
        step(5, acq("b", 1, "M"), granted(5)),
        step(6, acq("a", 2, "M"), queued(1)),
        step(7, acq("c", 1, "M"), queued(2)),
        step(8, acq("b", 2, "L"), queued(1)),
        step(9, close("a"), Outcome::SessionClosed)
            .hands(&[("L", "b", 2)])
            .drops(&[("a", 2)]),
    ]);
    assert_eq!(sim.holder("L"), Some(("b", 9, 0)));
    assert_eq!(sim.holder("M"), Some(("b", 5, 1)));
    assert_eq!(sim.state("c", 1), waiting("M", 1));
    sim.run(&[
        // A retried close finds no session.
        step(
            10,
            close("a"),
            rejected(Rejection::SessionNotFound { id: SessionId(1) }),
        ),
        step(11, rel("b", 3, "M", 5), Outcome::Released).hands(&[("M", "c", 1)]),
    ]);
}

#[test]
fn holder_and_first_waiter_expiring_together_hand_the_lock_to_the_third() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        open(3, "c"),
        open(4, "d"),
        step(5, acq("a", 1, "L"), granted(5)),
        step(6, acq("b", 1, "L"), queued(1)),
        step(7, acq("c", 1, "L"), queued(2)),
        step(8, acq("d", 1, "L"), queued(3)),
        // Listed holder first, and also first waiter first: neither order may leak the lock.
        expire(30, &["a", "b"], &["a", "b"])
            .hands(&[("L", "c", 1)])
            .drops(&[("b", 1)]),
    ]);
    assert_eq!(sim.holder("L"), Some(("c", 30, 1)));
    assert_eq!(sim.state("d", 1), waiting("L", 1));

    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        open(3, "c"),
        step(4, acq("a", 1, "L"), granted(4)),
        step(5, acq("b", 1, "L"), queued(1)),
        step(6, acq("c", 1, "L"), queued(2)),
        expire(40, &["b", "a"], &["b", "a"])
            .hands(&[("L", "c", 1)])
            .drops(&[("b", 1)]),
    ]);
    assert_eq!(sim.holder("L"), Some(("c", 40, 0)));
}

#[test]
fn every_waiter_leaving_with_the_holder_frees_the_lock() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        open(3, "c"),
        step(4, acq("a", 1, "L"), granted(4)),
        step(5, acq("b", 1, "L"), queued(1)),
        step(6, acq("c", 1, "L"), queued(2)),
        expire(7, &["c", "a", "b"], &["c", "a", "b"]).drops(&[("c", 1), ("b", 1)]),
    ]);
    assert_eq!(sim.table.describe("L"), None);
    assert_eq!(sim.table.session_count(), 0);
}

#[test]
fn expire_ignores_sessions_that_are_already_gone() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        step(3, close("a"), Outcome::SessionClosed),
        expire(4, &["a", "b"], &["b"]),
        expire(5, &["a", "b"], &[]),
    ]);
    assert_eq!(sim.table.session_count(), 0);
}

/// Regression: an ExpireSessions naming one session twice panicked (the second removal found no
/// session), which would crash every member applying that entry.
#[test]
fn expire_with_a_duplicate_id_expires_it_once() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        step(3, acq("a", 1, "L"), granted(3)),
        step(4, acq("b", 1, "L"), queued(1)),
        expire(5, &["a", "a"], &["a"]).hands(&[("L", "b", 1)]),
    ]);
    assert_eq!(sim.holder("L"), Some(("b", 5, 0)));
    assert_eq!(sim.table.session_count(), 1);
}

#[test]
fn try_lock_on_a_held_lock_is_not_granted_and_not_queued() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        step(3, try_acq("a", 1, "L"), granted(3)),
        step(4, try_acq("b", 1, "L"), Outcome::NotGranted),
    ]);
    assert_eq!(sim.holder("L"), Some(("a", 3, 0)));
    assert_eq!(sim.state("b", 1), done(Outcome::NotGranted));
    // Had b been queued, this release would hand L to it.
    sim.run(&[step(5, rel("a", 2, "L", 3), Outcome::Released)]);
    assert_eq!(sim.table.describe("L"), None);
}

#[test]
fn a_wrong_secret_is_session_not_found_and_changes_nothing() {
    let setup = [
        open(1, "a"),
        open(2, "b"),
        step(3, acq("a", 1, "L"), granted(3)),
        step(4, acq("b", 1, "L"), queued(1)),
    ];
    let not_found = |id| rejected(Rejection::SessionNotFound { id: SessionId(id) });
    let attempts = [
        step(5, close("a!"), not_found(1)),
        step(5, rel("a!", 2, "L", 3), not_found(1)),
        step(5, acq("a!", 2, "M"), not_found(1)),
        step(5, cancel("b!", 1), not_found(2)),
        step(5, acq("b!", 1, "L"), not_found(2)),
        step(5, close("b!"), not_found(2)),
    ];
    for attempt in attempts {
        let mut sim = TableDriver::new();
        sim.run(&setup);
        // A twin that applies a no-op at the same index: the tables must stay byte-identical.
        let mut twin = TableDriver::new();
        twin.run(&setup);
        twin.run(&[expire(5, &[], &[])]);
        sim.run(std::slice::from_ref(&attempt));
        assert_eq!(
            sim.encoding(),
            twin.encoding(),
            "{:?} with a wrong secret changed the table",
            attempt.cmd
        );
        // Nor did it use up the sequence number: the real session's request is new.
        sim.run(&[step(6, acq("a", 2, "M"), granted(6))]);
    }
}

#[test]
fn acquiring_a_lock_twice_in_one_session_is_rejected() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        step(3, acq("a", 1, "L"), granted(3)),
        step(
            4,
            acq("a", 2, "L"),
            rejected(Rejection::AlreadyHeld { token: 3 }),
        ),
        step(
            5,
            try_acq("a", 3, "L"),
            rejected(Rejection::AlreadyHeld { token: 3 }),
        ),
        step(6, acq("b", 1, "L"), queued(1)),
        step(
            7,
            acq("b", 2, "L"),
            rejected(Rejection::AlreadyWaiting { seq: 1 }),
        ),
        step(
            8,
            try_acq("b", 3, "L"),
            rejected(Rejection::AlreadyWaiting { seq: 1 }),
        ),
    ]);
    assert_eq!(sim.holder("L"), Some(("a", 3, 1)));
}

#[test]
fn fencing_tokens_are_the_granting_entries_indexes() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(10, "a"),
        open(20, "b"),
        step(100, acq("a", 1, "L"), granted(100)),
        step(150, acq("b", 1, "L"), queued(1)),
        step(1_000, rel("a", 2, "L", 100), Outcome::Released).hands(&[("L", "b", 1)]),
        step(1_001, acq("a", 3, "L"), queued(1)),
        expire(5_000, &["b"], &["b"]).hands(&[("L", "a", 3)]),
    ]);
    assert_eq!(
        sim.id("a"),
        SessionId(10),
        "session ids are entry indexes too"
    );
    assert_eq!(sim.holder("L"), Some(("a", 5_000, 0)));
}

#[test]
#[should_panic(expected = "out of order")]
fn applying_an_entry_twice_panics() {
    let mut sim = TableDriver::new();
    sim.run(&[open(1, "a")]);
    let cmd = sim.command(1, &acq("a", 1, "L"));
    sim.table.apply(1, &cmd);
}

#[test]
fn describe_reports_holder_token_grant_time_and_waiters() {
    let mut sim = TableDriver::new();
    assert_eq!(sim.table.describe("L"), None);
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        step(3, acq("a", 1, "L"), granted(3)),
        step(4, acq("b", 1, "L"), queued(1)),
    ]);
    let first = HolderState {
        session: SessionId(1),
        token: 3,
        mode: Mode::Exclusive,
        granted_at_ms: now_ms_at(3),
        owner: None,
        value: None,
    };
    assert_eq!(
        sim.table.describe("L"),
        Some(LockState {
            name: "L".into(),
            holder: Some(first.clone()),
            holders: vec![first],
            waiters: 1,
            queue: vec![WaiterState {
                session: SessionId(2),
                mode: Mode::Exclusive,
                since_ms: now_ms_at(4),
                owner: None,
            }],
            lock_delay_ms: None,
            delay_until_ms: None,
            delay_token: None,
        })
    );
    assert_eq!(sim.table.describe("l"), None, "names are case-sensitive");
    // A handoff is a new grant: its time is the handing entry's, not the first holder's.
    sim.run(&[step(9, rel("a", 2, "L", 3), Outcome::Released).hands(&[("L", "b", 1)])]);
    let holder = sim.table.describe("L").and_then(|i| i.holder);
    assert_eq!(
        holder,
        Some(HolderState {
            session: SessionId(2),
            token: 9,
            mode: Mode::Exclusive,
            granted_at_ms: now_ms_at(9),
            owner: None,
            value: None,
        })
    );
}

#[test]
fn list_returns_held_locks_with_the_prefix_in_name_order_up_to_the_limit() {
    let mut sim = TableDriver::new();
    sim.run(&[open(1, "a"), open(2, "b")]);
    // Inserted out of order; "jobs0" and "jobr" sort just outside the "jobs/" range.
    let names = [
        "jobs/c", "jobs0", "jobs/a", "jobr", "jobs/b/x", "jobs/", "job", "z",
    ];
    let mut index = 2;
    for (seq, name) in names.iter().enumerate() {
        index += 1;
        sim.run(&[step(index, acq("a", seq as u64 + 1, name), granted(index))]);
    }
    sim.run(&[step(index + 1, acq("b", 1, "jobs/a"), queued(1))]);
    let listed = |prefix: &str, limit: usize| -> Vec<String> {
        sim.table
            .list(prefix, limit)
            .into_iter()
            .map(|i| i.name)
            .collect()
    };
    assert_eq!(
        listed("jobs/", 100),
        ["jobs/", "jobs/a", "jobs/b/x", "jobs/c"]
    );
    assert_eq!(listed("jobs/", 2), ["jobs/", "jobs/a"]);
    assert_eq!(listed("jobs/", 0), Vec::<String>::new());
    assert_eq!(
        listed("jobs", 100),
        ["jobs/", "jobs/a", "jobs/b/x", "jobs/c", "jobs0"]
    );
    assert_eq!(
        listed("", 100),
        ["job", "jobr", "jobs/", "jobs/a", "jobs/b/x", "jobs/c", "jobs0", "z"]
    );
    assert_eq!(listed("nothing", 100), Vec::<String>::new());
    assert_eq!(listed("zz", 100), Vec::<String>::new());
    let a = &sim.table.list("jobs/a", 10)[0];
    assert_eq!((a.name.as_str(), a.waiters), ("jobs/a", 1));
    assert_eq!(a.holder.as_ref().map(|h| h.token), Some(5));
}

#[test]
fn request_state_tracks_a_request_from_queue_to_outcome() {
    let mut sim = TableDriver::new();
    sim.run(&[open(1, "a"), open(2, "b"), open(3, "c")]);
    assert_eq!(sim.state("a", 1), None, "an unknown request");
    assert_eq!(
        sim.table.request_state(SessionId(99), 1),
        None,
        "an unknown session"
    );
    sim.run(&[
        step(4, acq("a", 1, "L"), granted(4)),
        step(5, acq("b", 1, "L"), queued(1)),
        step(6, acq("c", 1, "L"), queued(2)),
    ]);
    assert_eq!(sim.state("a", 1), done(granted(4)));
    assert_eq!(sim.state("b", 1), waiting("L", 1));
    assert_eq!(sim.state("c", 1), waiting("L", 2));
    sim.run(&[step(7, cancel("b", 1), Outcome::NotGranted)]);
    assert_eq!(sim.state("b", 1), done(Outcome::NotGranted));
    assert_eq!(sim.state("c", 1), waiting("L", 1));
    sim.run(&[step(8, rel("a", 2, "L", 4), Outcome::Released).hands(&[("L", "c", 1)])]);
    assert_eq!(sim.state("a", 2), done(Outcome::Released));
    assert_eq!(sim.state("c", 1), done(granted(8)));
    sim.run(&[step(9, close("c"), Outcome::SessionClosed)]);
    assert_eq!(
        sim.table.request_state(SessionId(3), 1),
        None,
        "a closed session"
    );
}

#[test]
fn session_queries_follow_creation_and_removal() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        step(
            2,
            Cmd::Open("b", 60_000),
            Outcome::SessionCreated {
                id: SessionId(2),
                ttl_ms: 60_000,
            },
        ),
        open(3, "c"),
    ]);
    let sessions: Vec<SessionInfo> = sim.table.sessions().collect();
    assert_eq!(
        sessions,
        [
            SessionInfo {
                id: SessionId(1),
                ttl_ms: TTL_MS,
                lease_mark_ms: None,
            },
            SessionInfo {
                id: SessionId(2),
                ttl_ms: 60_000,
                lease_mark_ms: None,
            },
            SessionInfo {
                id: SessionId(3),
                ttl_ms: TTL_MS,
                lease_mark_ms: None,
            },
        ]
    );
    assert!(sim.table.session_valid(&sim.key("a")));
    assert!(!sim.table.session_valid(&sim.key("a!")));
    sim.run(&[expire(4, &["b"], &["b"])]);
    assert_eq!(sim.table.session(SessionId(2)), None);
    assert!(!sim.table.session_valid(&sim.key("b")));
    assert_eq!(sim.table.session_count(), 2);
}

/// Issue #9: a waiter whose client vanished stayed queued until its session expired, and the
/// next release handed it the lock, which then sat unused. Its wait now ends on the server.
#[test]
fn a_release_passes_over_a_waiter_whose_wait_has_ended() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        open(3, "c"),
        step(4, acq("a", 1, "L"), granted(4)),
        // b waits 50 ms (5 entries), c for as long as it takes.
        step(5, acq_for("b", 1, "L", 50), queued(1)),
        step(6, acq("c", 1, "L"), queued(2)),
    ]);
    let release = sim.command(20, &rel("a", 2, "L", 4));
    let got = apply_checked(&mut sim.table, 20, &release);
    assert_eq!(got.outcome, Outcome::Released);
    assert_eq!(got.ended_waits, vec![(sim.id("b"), 1)]);
    assert_eq!(got.handoffs.len(), 1);
    assert_eq!(sim.holder("L"), Some(("c", 20, 0)));
    assert_eq!(sim.state("b", 1), done(Outcome::NotGranted));
}

#[test]
fn expire_waits_ends_exactly_the_waits_whose_time_has_passed() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        open(3, "c"),
        step(4, acq("a", 1, "L"), granted(4)),
        step(5, acq_for("b", 1, "L", 30), queued(1)),
        step(6, acq_for("c", 1, "L", 100), queued(2)),
        // At entry 8 (now = 5's time + 30 ms) b's wait has just ended; c's has not.
        step(8, Cmd::ExpireWaits, Outcome::WaitsExpired { count: 1 }),
    ]);
    assert_eq!(sim.state("b", 1), done(Outcome::NotGranted));
    assert_eq!(sim.state("c", 1), waiting("L", 1));
    assert_eq!(sim.table.next_wait_end_ms(), Some(now_ms_at(6) + 100));
    sim.run(&[step(
        16,
        Cmd::ExpireWaits,
        Outcome::WaitsExpired { count: 1 },
    )]);
    assert_eq!(sim.state("c", 1), done(Outcome::NotGranted));
    assert_eq!(sim.holder("L"), Some(("a", 4, 0)));
    assert_eq!(sim.table.next_wait_end_ms(), None);
    // A retry of the ended acquire gets its outcome; a cancel too.
    sim.run(&[
        step(17, acq_for("b", 1, "L", 30), Outcome::NotGranted),
        step(18, cancel("c", 1), Outcome::NotGranted),
    ]);
}

/// Issue #9 item 10: a release reusing an acquire's sequence number answered `Queued` (seen by
/// the client as "unavailable"); it is a client error.
#[test]
fn a_request_that_reuses_another_kinds_sequence_number_is_rejected() {
    let mut sim = TableDriver::new();
    sim.run(&[
        open(1, "a"),
        open(2, "b"),
        step(3, acq("a", 1, "L"), granted(3)),
        step(4, acq("b", 1, "L"), queued(1)),
        step(
            5,
            rel("b", 1, "L", 3),
            rejected(Rejection::SequenceReused { seq: 1 }),
        ),
        step(
            6,
            rel("a", 1, "L", 3),
            rejected(Rejection::SequenceReused { seq: 1 }),
        ),
        step(7, rel("a", 2, "L", 3), Outcome::Released).hands(&[("L", "b", 1)]),
        step(
            8,
            acq("a", 2, "L"),
            rejected(Rejection::SequenceReused { seq: 2 }),
        ),
    ]);
}
