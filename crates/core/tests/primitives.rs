//! Read-write locks, counting semaphores and elections in the lock table (issue #32), rule by
//! rule. `model.rs` checks the same rules on random
//! interleavings; here each rule has a history of its own.

mod support;

use latchkey_core::codec::{
    self, decode_table, encode_table, SNAPSHOT_FORMAT_VERSION_V8, SNAPSHOT_FORMAT_VERSION_V9,
};
use latchkey_core::limits::{self, HOLDERS_PER_LOCK_MAX, WAIT_TIMEOUT_MS_MAX};
use latchkey_core::*;
use support::apply_checked;

/// A holder as (session, token, mode).
type Held = (u64, u64, Mode);
/// A waiter as (session, mode).
type Waiting = (u64, Mode);

/// A table driven entry by entry (index `i` at `now_ms` = 1000 × i), sessions by number.
struct T {
    table: LockTable,
    index: u64,
    seq: u64,
}

fn key(id: u64) -> SessionKey {
    SessionKey {
        id: SessionId(id),
        secret: id,
    }
}

fn by() -> Actor {
    Actor {
        identity: None,
        claimed: "ops".into(),
    }
}

impl T {
    /// A table with sessions 1..=n (created at entries 1..=n, so session i has id i).
    fn new(n: u64) -> T {
        let mut t = T {
            table: LockTable::new(),
            index: 0,
            seq: 0,
        };
        for i in 1..=n {
            let o = t.apply(Op::CreateSession {
                ttl_ms: 15_000,
                secret: i,
            });
            assert_eq!(
                o.outcome,
                Outcome::SessionCreated {
                    id: SessionId(i),
                    ttl_ms: 15_000
                }
            );
        }
        t
    }

    fn apply(&mut self, op: Op) -> Applied {
        self.index += 1;
        let cmd = Command {
            now_ms: 1_000 * self.index,
            op,
        };
        apply_checked(&mut self.table, self.index, &cmd)
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// `who` acquires `name` in `mode`, waiting (for ever) if it must; answers the applied
    /// entry and the request's seq.
    fn take(&mut self, who: u64, name: &str, mode: Mode) -> (Applied, u64) {
        self.take_for(who, name, mode, WAIT_TIMEOUT_MS_MAX)
    }

    fn take_for(&mut self, who: u64, name: &str, mode: Mode, wait_ms: u64) -> (Applied, u64) {
        let seq = self.next_seq();
        let a = self.apply(Op::AcquireWith {
            session: key(who),
            seq,
            name: name.into(),
            wait_ms,
            mode,
        });
        (a, seq)
    }

    fn outcome(&mut self, who: u64, name: &str, mode: Mode) -> Outcome {
        self.take(who, name, mode).0.outcome
    }

    fn release(&mut self, who: u64, name: &str, token: u64) -> Applied {
        let seq = self.next_seq();
        self.apply(Op::Release {
            session: key(who),
            seq,
            name: name.into(),
            token,
        })
    }

    /// The holders of `name` as (session, token, mode), in grant order, and its queue's
    /// sessions with their modes.
    fn state(&self, name: &str) -> (Vec<Held>, Vec<Waiting>) {
        match self.table.describe(name) {
            None => (vec![], vec![]),
            Some(l) => (
                l.holders
                    .iter()
                    .map(|h| (h.session.0, h.token, h.mode))
                    .collect(),
                l.queue.iter().map(|w| (w.session.0, w.mode)).collect(),
            ),
        }
    }
}

/// (session, token) of each handoff.
fn handed(a: &Applied) -> Vec<(u64, u64)> {
    a.handoffs.iter().map(|h| (h.session.0, h.token)).collect()
}

const R: Mode = Mode::Shared;
const W: Mode = Mode::Exclusive;

#[test]
fn readers_share_a_lock_and_each_grant_takes_its_entrys_index() {
    let mut t = T::new(3);
    assert_eq!(t.outcome(1, "cfg", R), Outcome::Granted { token: 4 });
    assert_eq!(t.outcome(2, "cfg", R), Outcome::Granted { token: 5 });
    assert_eq!(
        t.state("cfg").0,
        vec![(1, 4, R), (2, 5, R)],
        "two readers hold at once"
    );
    // The plain mutex acquire is the writer of the same lock: it waits for the readers.
    let seq = t.next_seq();
    let a = t.apply(Op::Acquire {
        session: key(3),
        seq,
        name: "cfg".into(),
        wait_ms: WAIT_TIMEOUT_MS_MAX,
    });
    assert_eq!(a.outcome, Outcome::Queued { position: 1 });
}

#[test]
fn a_reader_behind_a_waiting_writer_waits_so_the_writer_is_not_starved() {
    let mut t = T::new(4);
    assert_eq!(t.outcome(1, "cfg", R), Outcome::Granted { token: 5 });
    assert_eq!(t.outcome(2, "cfg", W), Outcome::Queued { position: 1 });
    // Readers hold, but a writer waits: a new reader queues behind it.
    assert_eq!(t.outcome(3, "cfg", R), Outcome::Queued { position: 2 });
    assert_eq!(t.outcome(4, "cfg", R), Outcome::Queued { position: 3 });
    // The last reader leaves: the writer alone gets it.
    let a = t.release(1, "cfg", 5);
    assert_eq!(a.outcome, Outcome::Released);
    assert_eq!(handed(&a), vec![(2, 9)]);
    assert_eq!(t.state("cfg"), (vec![(2, 9, W)], vec![(3, R), (4, R)]));
    // The writer leaves: the run of readers at the head gets it together, under one token.
    let a = t.release(2, "cfg", 9);
    assert_eq!(handed(&a), vec![(3, 10), (4, 10)]);
    assert_eq!(t.state("cfg"), (vec![(3, 10, R), (4, 10, R)], vec![]));
}

#[test]
fn a_handover_grants_the_run_of_readers_at_the_head_and_stops_at_a_writer() {
    let mut t = T::new(5);
    assert_eq!(t.outcome(1, "cfg", W), Outcome::Granted { token: 6 });
    assert_eq!(t.outcome(2, "cfg", R), Outcome::Queued { position: 1 });
    assert_eq!(t.outcome(3, "cfg", R), Outcome::Queued { position: 2 });
    assert_eq!(t.outcome(4, "cfg", W), Outcome::Queued { position: 3 });
    assert_eq!(t.outcome(5, "cfg", R), Outcome::Queued { position: 4 });
    let a = t.apply(Op::ExpireSessions {
        ids: vec![SessionId(1)],
    });
    assert_eq!(handed(&a), vec![(2, 11), (3, 11)]);
    assert_eq!(
        t.state("cfg"),
        (vec![(2, 11, R), (3, 11, R)], vec![(4, W), (5, R)])
    );
}

#[test]
fn a_reader_waits_behind_a_mutexs_holder_which_makes_it_a_read_write_lock() {
    let mut t = T::new(3);
    let seq = t.next_seq();
    let a = t.apply(Op::Acquire {
        session: key(1),
        seq,
        name: "L".into(),
        wait_ms: 0,
    });
    assert_eq!(a.outcome, Outcome::Granted { token: 4 });
    // A try-lock as a reader is refused with the holder named.
    let (a, _) = t.take_for(2, "L", R, 0);
    assert_eq!(a.outcome, Outcome::NotGranted);
    assert_eq!(
        a.busy.map(|h| (h.session, h.token, h.mode)),
        Some((SessionId(1), 4, W))
    );
    assert_eq!(t.outcome(2, "L", R), Outcome::Queued { position: 1 });
    assert_eq!(t.outcome(3, "L", R), Outcome::Queued { position: 2 });
    let a = t.release(1, "L", 4);
    assert_eq!(handed(&a), vec![(2, 8), (3, 8)]);
}

#[test]
fn a_cancelled_or_ended_writers_wait_lets_the_readers_behind_it_in() {
    let mut t = T::new(4);
    assert_eq!(t.outcome(1, "cfg", R), Outcome::Granted { token: 5 });
    let (a, writer) = t.take(2, "cfg", W);
    assert_eq!(a.outcome, Outcome::Queued { position: 1 });
    assert_eq!(t.outcome(3, "cfg", R), Outcome::Queued { position: 2 });
    let a = t.apply(Op::CancelWait {
        session: key(2),
        seq: writer,
    });
    assert_eq!(a.outcome, Outcome::NotGranted);
    assert_eq!(handed(&a), vec![(3, 8)]);
    // The same through a wait timeout: the writer's wait ends at entry 10 + 2.
    let (a, writer) = t.take_for(4, "cfg", W, 2_000);
    assert_eq!(a.outcome, Outcome::Queued { position: 1 });
    assert_eq!(t.outcome(2, "cfg", R), Outcome::Queued { position: 2 });
    t.apply(Op::RenewLeases { ids: vec![] });
    let a = t.apply(Op::ExpireWaits);
    assert_eq!(a.ended_waits, vec![(SessionId(4), writer)]);
    assert_eq!(a.outcome, Outcome::WaitsExpired { count: 1 });
    assert_eq!(handed(&a), vec![(2, 12)]);
}

#[test]
fn a_semaphore_has_the_permits_its_first_acquire_fixed_each_grant_with_its_own_token() {
    let mut t = T::new(5);
    let three = Mode::Permits(3);
    assert_eq!(t.outcome(1, "jobs", three), Outcome::Granted { token: 6 });
    assert_eq!(t.outcome(2, "jobs", three), Outcome::Granted { token: 7 });
    assert_eq!(t.outcome(3, "jobs", three), Outcome::Granted { token: 8 });
    assert_eq!(t.outcome(4, "jobs", three), Outcome::Queued { position: 1 });
    assert_eq!(t.outcome(5, "jobs", three), Outcome::Queued { position: 2 });
    let a = t.release(2, "jobs", 7);
    assert_eq!(handed(&a), vec![(4, 9)], "one permit freed, one waiter in");
    let (holders, queue) = t.state("jobs");
    assert_eq!(holders.len(), 3);
    assert_eq!(queue, vec![(5, three)]);
}

#[test]
fn permits_freed_together_go_to_as_many_waiters_each_with_a_token_of_its_own() {
    let mut t = T::new(6);
    let two = Mode::Permits(2);
    assert_eq!(t.outcome(1, "jobs", two), Outcome::Granted { token: 7 });
    assert_eq!(t.outcome(2, "jobs", two), Outcome::Granted { token: 8 });
    for (who, position) in [(3, 1), (4, 2), (5, 3), (6, 4)] {
        assert_eq!(t.outcome(who, "jobs", two), Outcome::Queued { position });
    }
    // Both holders expire in one entry (13): two permits, two waiters, two tokens, both above
    // every earlier one and at most the entry's index.
    let a = t.apply(Op::ExpireSessions {
        ids: vec![SessionId(1), SessionId(2)],
    });
    assert_eq!(handed(&a), vec![(3, 9), (4, 10)]);
    // Again in the very next entry: the tokens go on from the last one, not from the index.
    let a = t.apply(Op::ExpireSessions {
        ids: vec![SessionId(3), SessionId(4)],
    });
    assert_eq!(handed(&a), vec![(5, 11), (6, 12)]);
    assert!(12 <= t.index);
    // Free again, the next first grant takes its entry's index.
    t.apply(Op::ExpireSessions {
        ids: vec![SessionId(5), SessionId(6)],
    });
    assert_eq!(t.table.describe("jobs"), None);
}

#[test]
fn a_conflicting_kind_or_permit_count_is_refused_and_changes_nothing() {
    let mut t = T::new(3);
    assert_eq!(
        t.outcome(1, "jobs", Mode::Permits(2)),
        Outcome::Granted { token: 4 }
    );
    assert_eq!(t.outcome(2, "cfg", R), Outcome::Granted { token: 5 });
    let before = encode_table(&t.table);
    let (a, _) = t.take(3, "jobs", Mode::Permits(5));
    let want = Rejection::PermitsConflict {
        name: "jobs".into(),
        permits: 2,
        asked: 5,
    };
    assert_eq!(a.outcome, Outcome::Rejected(want.clone()));
    assert_eq!(
        want.to_string(),
        "\"jobs\" is a semaphore of 2 permits, not 5"
    );
    let (a, _) = t.take(3, "jobs", R);
    let want = Rejection::KindConflict {
        name: "jobs".into(),
        held: LockKind::Semaphore { permits: 2 },
        asked: LockKind::Lock,
    };
    assert_eq!(a.outcome, Outcome::Rejected(want.clone()));
    assert_eq!(
        want.to_string(),
        "\"jobs\" is in use as a semaphore of 2 permits; it cannot be taken as a lock \
         (exclusive or shared) until it is free"
    );
    let seq = t.next_seq();
    let a = t.apply(Op::Acquire {
        session: key(3),
        seq,
        name: "jobs".into(),
        wait_ms: WAIT_TIMEOUT_MS_MAX,
    });
    assert!(matches!(
        a.outcome,
        Outcome::Rejected(Rejection::KindConflict { .. })
    ));
    let (a, _) = t.take(3, "cfg", Mode::Permits(2));
    assert!(matches!(
        a.outcome,
        Outcome::Rejected(Rejection::KindConflict { .. })
    ));
    // Nothing but the remembered answers changed: the same holders, no queue.
    assert_eq!(t.state("jobs"), (vec![(1, 4, Mode::Permits(2))], vec![]));
    assert_eq!(t.state("cfg"), (vec![(2, 5, R)], vec![]));
    assert_ne!(
        encode_table(&t.table),
        before,
        "the refusals are remembered"
    );
    // Once free, the name can be taken as anything.
    t.release(1, "jobs", 4);
    assert_eq!(t.outcome(3, "jobs", R), Outcome::Granted { token: t.index });
}

#[test]
fn a_semaphore_has_one_to_the_limit_of_permits() {
    let mut t = T::new(1);
    for permits in [0, HOLDERS_PER_LOCK_MAX as u32 + 1] {
        let (a, _) = t.take(1, "jobs", Mode::Permits(permits));
        assert_eq!(
            a.outcome,
            Outcome::Rejected(Rejection::PermitsOutOfRange {
                permits,
                max: HOLDERS_PER_LOCK_MAX as u32
            })
        );
    }
    let max = Mode::Permits(HOLDERS_PER_LOCK_MAX as u32);
    assert!(matches!(t.outcome(1, "jobs", max), Outcome::Granted { .. }));
}

#[test]
fn retries_get_the_original_answer_for_the_new_acquires() {
    let mut t = T::new(2);
    let (a, first) = t.take(1, "jobs", Mode::Permits(1));
    assert_eq!(a.outcome, Outcome::Granted { token: 3 });
    let (a, second) = t.take(2, "jobs", Mode::Permits(1));
    assert_eq!(a.outcome, Outcome::Queued { position: 1 });
    let retry = |who, seq| Op::AcquireWith {
        session: key(who),
        seq,
        name: "jobs".into(),
        wait_ms: WAIT_TIMEOUT_MS_MAX,
        mode: Mode::Permits(1),
    };
    assert_eq!(
        t.apply(retry(1, first)).outcome,
        Outcome::Granted { token: 3 }
    );
    assert_eq!(
        t.apply(retry(2, second)).outcome,
        Outcome::Queued { position: 1 }
    );
    let a = t.release(1, "jobs", 3);
    assert_eq!(handed(&a), vec![(2, 4)]);
    assert_eq!(
        t.apply(retry(2, second)).outcome,
        Outcome::Granted { token: 4 }
    );
    assert_eq!(
        t.table.request_state(SessionId(2), second),
        Some(RequestState::Done(Outcome::Granted { token: 4 }))
    );
    // A late duplicate of the first release frees nothing now.
    let seq = t.next_seq();
    let stale = Op::Release {
        session: key(1),
        seq,
        name: "jobs".into(),
        token: 3,
    };
    assert_eq!(t.apply(stale).outcome, Outcome::NotHolder);
    assert_eq!(t.state("jobs").0, vec![(2, 4, Mode::Permits(1))]);
}

#[test]
fn a_revoke_or_force_release_hands_on_what_it_freed() {
    let mut t = T::new(5);
    let two = Mode::Permits(2);
    assert_eq!(t.outcome(1, "jobs", two), Outcome::Granted { token: 6 });
    assert_eq!(t.outcome(2, "jobs", two), Outcome::Granted { token: 7 });
    assert_eq!(t.outcome(3, "jobs", two), Outcome::Queued { position: 1 });
    assert_eq!(t.outcome(4, "jobs", two), Outcome::Queued { position: 2 });
    assert_eq!(t.outcome(5, "jobs", two), Outcome::Queued { position: 3 });
    // One permit by its token.
    let a = t.apply(Op::ForceRelease {
        name: "jobs".into(),
        token: Some(7),
        by: by(),
        reason: "stuck".into(),
    });
    assert_eq!(
        a.outcome,
        Outcome::ForceReleased {
            session: SessionId(2),
            token: 7
        }
    );
    assert_eq!(handed(&a), vec![(3, 8)]);
    assert_eq!(t.table.revoked_grants(SessionId(2)), Some((&[7][..], None)));
    // A revoke frees the session's permit.
    let a = t.apply(Op::RevokeSession {
        session: SessionId(1),
        by: by(),
        reason: "runaway".into(),
    });
    assert_eq!(a.outcome, Outcome::SessionRevoked { locks: 1 });
    assert_eq!(handed(&a), vec![(4, 9)]);
    // Without a token: every holder loses it; each taken grant is audited.
    let a = t.apply(Op::ForceRelease {
        name: "jobs".into(),
        token: None,
        by: by(),
        reason: "drain".into(),
    });
    assert_eq!(handed(&a), vec![(5, 10)]);
    let audited: Vec<_> = t
        .table
        .audit()
        .filter(|r| r.reason == "drain")
        .map(|r| r.action.clone())
        .collect();
    assert_eq!(audited.len(), 2, "{audited:?}");
    // A token no holder has is refused.
    let a = t.apply(Op::ForceRelease {
        name: "jobs".into(),
        token: Some(7),
        by: by(),
        reason: "again".into(),
    });
    assert!(matches!(
        a.outcome,
        Outcome::Rejected(Rejection::TokenMismatch { .. })
    ));
}

#[test]
fn readers_granted_together_are_force_released_together_by_their_token() {
    let mut t = T::new(4);
    assert_eq!(t.outcome(1, "cfg", W), Outcome::Granted { token: 5 });
    t.outcome(2, "cfg", R);
    t.outcome(3, "cfg", R);
    t.outcome(4, "cfg", W);
    let a = t.release(1, "cfg", 5);
    assert_eq!(handed(&a), vec![(2, 9), (3, 9)]);
    let a = t.apply(Op::ForceRelease {
        name: "cfg".into(),
        token: Some(9),
        by: by(),
        reason: "stuck".into(),
    });
    assert_eq!(handed(&a), vec![(4, 10)]);
    assert_eq!(t.state("cfg").0, vec![(4, 10, W)]);
}

#[test]
fn a_table_with_a_read_write_lock_or_a_semaphore_is_written_in_format_8_and_round_trips() {
    let mut t = T::new(3);
    t.outcome(1, "cfg", R);
    t.outcome(2, "cfg", W);
    t.outcome(3, "jobs", Mode::Permits(2));
    // As a build before request fingerprints (snapshot format 11) holds it.
    t.table.forget_request_prints();
    let bytes = encode_table(&t.table);
    assert_eq!(bytes[0], SNAPSHOT_FORMAT_VERSION_V8);
    let decoded = decode_table(&bytes).expect("decodes");
    assert_eq!(decoded, t.table);
    // The decoded table goes on as the original.
    let mut other = T {
        table: decoded,
        index: t.index,
        seq: t.seq,
    };
    assert_eq!(
        handed(&other.release(1, "cfg", 4)),
        handed(&t.release(1, "cfg", 4))
    );
    assert_eq!(other.table, t.table);

    // A session that remembers a rejection only format 8 has keeps the table in format 8
    // after every name is free.
    let mut t = T::new(2);
    t.outcome(1, "jobs", Mode::Permits(2));
    t.outcome(2, "jobs", Mode::Permits(3));
    t.release(1, "jobs", 3);
    assert_eq!(t.table.lock_count(), 0);
    // As a build before request fingerprints (snapshot format 11) holds it.
    t.table.forget_request_prints();
    assert_eq!(encode_table(&t.table)[0], SNAPSHOT_FORMAT_VERSION_V8);
    assert_eq!(decode_table(&encode_table(&t.table)).unwrap(), t.table);
}

#[test]
fn list_merges_mutexes_and_names_with_several_holders_in_name_order() {
    let mut t = T::new(3);
    let seq = t.next_seq();
    t.apply(Op::Acquire {
        session: key(1),
        seq,
        name: "b".into(),
        wait_ms: 0,
    });
    t.outcome(2, "a", R);
    t.outcome(3, "c", Mode::Permits(2));
    let names: Vec<String> = t.table.list("", 10).into_iter().map(|l| l.name).collect();
    assert_eq!(names, ["a", "b", "c"]);
    let names: Vec<String> = t.table.list("", 2).into_iter().map(|l| l.name).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(t.table.lock_count(), 3);
}

/// At most `HOLDERS_PER_LOCK_MAX` readers hold at once: the next one waits (no error) and is
/// let in when one leaves.
#[test]
fn a_reader_past_the_holders_limit_waits_for_one_to_leave() {
    let n = HOLDERS_PER_LOCK_MAX as u64 + 1;
    let mut t = T::new(n);
    for who in 1..n {
        assert!(matches!(t.outcome(who, "cfg", R), Outcome::Granted { .. }));
    }
    assert_eq!(t.outcome(n, "cfg", R), Outcome::Queued { position: 1 });
    let token = t.state("cfg").0[0].1;
    let a = t.release(1, "cfg", token);
    assert_eq!(handed(&a), vec![(n, t.index)]);
}

// ---- elections (issue #32): an exclusive lock with a published value ----

impl T {
    /// `who` campaigns for `name` with `value`, waiting for ever; answers the entry and seq.
    fn campaign(&mut self, who: u64, name: &str, value: &[u8]) -> (Applied, u64) {
        let seq = self.next_seq();
        let a = self.apply(Op::Campaign {
            session: key(who),
            seq,
            name: name.into(),
            wait_ms: WAIT_TIMEOUT_MS_MAX,
            value: value.to_vec(),
        });
        (a, seq)
    }

    fn proclaim_as(&mut self, who: u64, seq: u64, name: &str, token: u64, value: &[u8]) -> Outcome {
        self.apply(Op::Proclaim {
            session: key(who),
            seq,
            name: name.into(),
            token,
            value: value.to_vec(),
        })
        .outcome
    }

    /// The leader of `name` as `describe` tells it: (session, token, value).
    fn leader(&self, name: &str) -> Option<(u64, u64, Option<Vec<u8>>)> {
        let h = self.table.describe(name)?.holder?;
        Some((h.session.0, h.token, h.value))
    }
}

#[test]
fn a_campaign_publishes_its_value_and_the_next_candidate_gets_its_own_on_handover() {
    let mut t = T::new(2);
    let (a, _) = t.campaign(1, "svc", b"host-1:80");
    let Outcome::Granted { token: first } = a.outcome else {
        panic!("{a:?}")
    };
    assert_eq!(
        a.changes,
        vec![LockChange::Granted {
            name: "svc".into(),
            session: SessionId(1),
            token: first,
            mode: Mode::Exclusive,
            value: Some(b"host-1:80".to_vec()),
        }]
    );
    assert_eq!(
        t.leader("svc"),
        Some((1, first, Some(b"host-1:80".to_vec())))
    );
    // The second candidate queues (FIFO, as any exclusive acquire) with its own value.
    let (a, _) = t.campaign(2, "svc", b"host-2:80");
    assert_eq!(a.outcome, Outcome::Queued { position: 1 });
    assert_eq!(t.leader("svc").unwrap().2, Some(b"host-1:80".to_vec()));
    // The leader resigns: the next one leads under a higher token, with its value.
    let a = t.release(1, "svc", first);
    let second = a.handoffs[0].token;
    assert!(second > first);
    assert_eq!(
        t.leader("svc"),
        Some((2, second, Some(b"host-2:80".to_vec())))
    );
    let events = watch_events(
        t.index,
        &Command {
            now_ms: 0,
            op: Op::ExpireWaits,
        },
        &a,
    );
    assert_eq!(events[1].kind, WatchKind::Granted);
    assert_eq!(events[1].value, Some(b"host-2:80".to_vec()));
    assert_eq!(events[1].mode, Some(Mode::Exclusive));
    // Its session expires: the value goes with the grant, and the name is free.
    t.apply(Op::ExpireSessions {
        ids: vec![SessionId(2)],
    });
    assert_eq!(t.leader("svc"), None);
    // A plain acquire of the name now publishes nothing.
    let (a, _) = t.take(1, "svc", Mode::Exclusive);
    let Outcome::Granted { token } = a.outcome else {
        panic!("{a:?}")
    };
    assert_eq!(t.leader("svc"), Some((1, token, None)));
}

#[test]
fn only_the_leader_under_its_token_proclaims_and_a_retry_is_answered_the_same() {
    let mut t = T::new(3);
    let (a, _) = t.campaign(1, "svc", b"v1");
    let Outcome::Granted { token } = a.outcome else {
        panic!("{a:?}")
    };
    t.take(3, "svc", R);
    let seq = t.next_seq();
    assert_eq!(
        t.proclaim_as(1, seq, "svc", token, b"v2"),
        Outcome::Proclaimed
    );
    assert_eq!(t.leader("svc").unwrap().2, Some(b"v2".to_vec()));
    // The same request again: the remembered answer, no new change.
    let before = t.table.clone();
    let again = t.apply(Op::Proclaim {
        session: key(1),
        seq,
        name: "svc".into(),
        token,
        value: b"v2".to_vec(),
    });
    assert_eq!(again.outcome, Outcome::Proclaimed);
    assert!(again.changes.is_empty());
    assert_eq!(t.table.describe("svc"), before.describe("svc"));
    // Another session, a stale token, an unknown name: refused, nothing changes.
    let not_leader = |token| {
        Outcome::Rejected(Rejection::NotElectionLeader {
            name: "svc".into(),
            token,
        })
    };
    let seq = t.next_seq();
    assert_eq!(t.proclaim_as(2, seq, "svc", token, b"x"), not_leader(token));
    let seq = t.next_seq();
    assert_eq!(
        t.proclaim_as(1, seq, "svc", token - 1, b"x"),
        not_leader(token - 1)
    );
    assert_eq!(t.leader("svc").unwrap().2, Some(b"v2".to_vec()));
    // A value over the limit is refused before anything, and not remembered.
    let seq = t.next_seq();
    let long = vec![b'x'; limits::ELECTION_VALUE_BYTES_MAX + 1];
    let o = t.proclaim_as(1, seq, "svc", token, &long);
    assert!(
        matches!(o, Outcome::Rejected(Rejection::FieldTooLong { .. })),
        "{o:?}"
    );
    assert_eq!(t.table.request_state(SessionId(1), seq), None);
    // An acquire or a release reusing a proclaim's seq is told so.
    let reused = Outcome::Rejected(Rejection::SequenceReused { seq: 5 });
    let o = t.apply(Op::Release {
        session: key(1),
        seq: 5,
        name: "svc".into(),
        token,
    });
    assert_eq!(o.outcome, reused);
    let o = t.apply(Op::Campaign {
        session: key(1),
        seq: 5,
        name: "svc".into(),
        wait_ms: 0,
        value: vec![],
    });
    assert_eq!(o.outcome, reused);
    // After the leader released, its token proclaims nothing.
    t.release(1, "svc", token);
    let seq = t.next_seq();
    assert_eq!(
        t.proclaim_as(1, seq, "svc", token, b"v3"),
        not_leader(token)
    );
}

#[test]
fn a_campaign_whose_wait_ends_drops_its_value_and_values_are_charged() {
    let mut t = T::new(2);
    let empty = t.table.bytes();
    let (a, _) = t.campaign(1, "svc", b"abc");
    let Outcome::Granted { token } = a.outcome else {
        panic!("{a:?}")
    };
    let held = t.table.bytes();
    let seq = t.next_seq();
    t.apply(Op::Campaign {
        session: key(2),
        seq,
        name: "svc".into(),
        wait_ms: 1_000,
        value: vec![b'w'; 100],
    });
    let queued = t.table.bytes();
    assert!(queued >= held + 100 + limits::TABLE_WAITER_BYTES);
    t.apply(Op::ExpireWaits);
    assert_eq!(
        t.table.bytes(),
        held,
        "the ended campaign's value was not dropped"
    );
    t.release(1, "svc", token);
    assert_eq!(t.table.bytes(), empty);
    // A value over the limit is refused, remembered like any acquire's answer.
    let long = vec![b'x'; limits::ELECTION_VALUE_BYTES_MAX + 1];
    let (a, seq) = t.campaign(1, "svc", &long);
    assert!(matches!(
        a.outcome,
        Outcome::Rejected(Rejection::FieldTooLong { .. })
    ));
    assert_eq!(
        t.table.request_state(SessionId(1), seq),
        Some(RequestState::Done(a.outcome))
    );
    assert_eq!(t.leader("svc"), None);
}

#[test]
fn a_table_with_an_election_is_written_in_format_9_and_round_trips() {
    let mut t = T::new(3);
    let (a, _) = t.campaign(1, "svc", b"one");
    let Outcome::Granted { token } = a.outcome else {
        panic!("{a:?}")
    };
    t.campaign(2, "svc", b"two");
    // As a build before request fingerprints (snapshot format 11) holds it.
    t.table.forget_request_prints();
    let bytes = encode_table(&t.table);
    assert_eq!(bytes[0], SNAPSHOT_FORMAT_VERSION_V9);
    let decoded = decode_table(&bytes).expect("decodes");
    assert_eq!(decoded, t.table);
    let mut other = T {
        table: decoded,
        index: t.index,
        seq: t.seq,
    };
    assert_eq!(other.release(1, "svc", token), t.release(1, "svc", token));
    assert_eq!(other.table, t.table);
    assert_eq!(other.leader("svc").unwrap().2, Some(b"two".to_vec()));
    // A semaphore's name cannot be campaigned for.
    t.take(3, "jobs", Mode::Permits(2));
    let (a, _) = t.campaign(1, "jobs", b"x");
    assert!(matches!(
        a.outcome,
        Outcome::Rejected(Rejection::KindConflict { .. })
    ));
    // A table with no election and no remembered proclaim stays in the older formats.
    let mut t = T::new(1);
    let (a, _) = t.take(1, "m", Mode::Exclusive);
    assert!(matches!(a.outcome, Outcome::Granted { .. }));
    assert_eq!(encode_table(&t.table)[0], codec::SNAPSHOT_FORMAT_VERSION);
    // As a build before request fingerprints (snapshot format 11) holds it.
    t.table.forget_request_prints();
    assert_eq!(encode_table(&t.table)[0], codec::SNAPSHOT_FORMAT_VERSION_V7);
}

/// Regression: a published value was charged `TABLE_VALUE_BYTES` plus its bytes, but a
/// snapshot writes the election's name again beside it: a campaign under a long name added
/// more to a snapshot than to the accounted bytes, against the rule that each charge is at
/// least what the thing takes in a snapshot (`table.rs`, "Byte budget").
#[test]
fn a_published_value_is_charged_at_least_what_it_takes_in_a_snapshot() {
    let long = "n".repeat(limits::LOCK_NAME_BYTES_MAX);
    for value in [
        &b""[..],
        b"v",
        &[b'v'; limits::ELECTION_VALUE_BYTES_MAX][..],
    ] {
        let mut plain = T::new(2);
        let mut elected = T::new(2);
        plain.take(1, &long, Mode::Exclusive);
        elected.campaign(1, &long, value);
        // And a campaign queued behind the leader, with its value.
        plain.take(2, &long, Mode::Exclusive);
        elected.campaign(2, &long, value);
        let charged = elected.table.bytes() - plain.table.bytes();
        let written = encode_table(&elected.table).len() - encode_table(&plain.table).len();
        assert!(
            written <= charged,
            "{} value bytes: {written} bytes more in a snapshot, {charged} more accounted",
            value.len()
        );
    }
}
