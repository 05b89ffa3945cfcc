//! Seeded random command sequences, checked three ways after every entry:
//! - `check_invariants()` on the table;
//! - exact agreement (outcome, handoffs, dropped waits, `request_state`) with `Model`, a small
//!   reference implementation written from the semantics in issue 2, not from `table.rs`;
//! - history properties derived only from what the table returned (`History`): per lock, tokens
//!   strictly increase; at most one holder, equal to what `describe` reports; every grant goes to
//!   the head of the queue built from `Queued` answers; an acknowledged grant is never answered
//!   differently on retry.
//!
//! The generator is a hand-written splitmix64 rather than `proptest`: each command is chosen from
//! the current state (live sessions, waiting requests, held tokens), which proptest expresses
//! poorly, and a failing seed replays exactly, which matters more here than shrinking. It also
//! keeps the core free of new dependencies. A failure prints the seed and the entry index.

mod support;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use latchkey_core::codec::{decode_table, encode_table};
use latchkey_core::limits::*;
use latchkey_core::*;

// ---- the generator ----

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// Few names, so that sessions collide on them; two invalid ones, rarely used.
const NAMES: [&str; 4] = ["a", "b", "jobs/1", "jobs/2"];

#[derive(Clone, Copy)]
struct Profile {
    steps: usize,
    sessions_max: usize,
    /// Percent of steps that end sessions (close or expire).
    ending_pct: u64,
    /// Whether to generate issue #32's acquires (shared, permits) and the operator's
    /// force-release and revoke among today's commands. Off, the generator draws exactly the
    /// commands it drew before issue #32.
    primitives: bool,
    /// Whether to generate issue #32's elections (campaigns and proclaims) among the
    /// primitives. Off, the generator draws what it drew before elections.
    elections: bool,
    /// Whether to draw lock-delay acquires and `EndDelays` too (issue #32 item 4).
    delays: bool,
    /// Whether some entries are batches (issue #35) of the commands drawn above. Off, the
    /// generator draws what it drew before batches.
    batches: bool,
}

/// Many short histories with sessions coming and going.
const SHORT: Profile = Profile {
    steps: 250,
    sessions_max: 5,
    ending_pct: 10,
    primitives: false,
    elections: false,
    delays: false,
    batches: false,
};
/// `SHORT` with read-write locks, semaphores, force-releases and revokes, and more sessions,
/// so that readers and permits crowd.
const MIXED: Profile = Profile {
    steps: 250,
    sessions_max: 9,
    ending_pct: 10,
    primitives: true,
    elections: false,
    delays: false,
    batches: false,
};
/// `MIXED` with elections: campaigns (some queued behind plain acquires and readers) and
/// proclaims by leaders, stale leaders and others.
const ELECTIONS: Profile = Profile {
    elections: true,
    delays: false,
    ..MIXED
};
/// `MIXED` with lock-delays: acquires that ask for one, `EndDelays`, and the expiries,
/// revokes and force-releases that start them; and elections, whose campaigns may wait out a
/// delay.
const DELAYED: Profile = Profile {
    steps: 250,
    sessions_max: 7,
    ending_pct: 10,
    primitives: true,
    elections: true,
    delays: true,
    batches: false,
};
/// `SHORT` with a third of its entries batches of several of its commands.
const SHORT_BATCHED: Profile = Profile {
    batches: true,
    ..SHORT
};
/// `ELECTIONS` (every primitive, operators' actions) with a third of its entries batches.
const ELECTIONS_BATCHED: Profile = Profile {
    batches: true,
    ..ELECTIONS
};
/// `DELAYED` (lock-delays among every primitive and elections) with a third of its entries
/// batches, whose lock-delay acquires are applied as alone.
const DELAYED_BATCHED: Profile = Profile {
    batches: true,
    ..DELAYED
};
/// Few long-lived sessions that finish far more requests than they remember.
const LONG: Profile = Profile {
    steps: 3_000,
    sessions_max: 3,
    ending_pct: 0,
    primitives: false,
    elections: false,
    delays: false,
    batches: false,
};

// ---- the reference model ----

#[derive(Clone)]
struct MSession {
    secret: u64,
    ttl_ms: u64,
    /// Seqs in the order their final outcome was recorded; the last SESSION_OUTCOMES_MAX are
    /// remembered, and a seq not newer than a forgotten one is too old.
    recorded: VecDeque<u64>,
    remembered: BTreeSet<u64>,
    forgotten_max: Option<u64>,
}

/// What a name in use is used as (issue #32). `Mutex` is a lock that has had no reader since it
/// was last free: it is handed over holder by holder as before issue #32, while a name with
/// several holders is handed on once, after every session leaving in the entry has left it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MKind {
    Mutex,
    Lock,
    Semaphore(u32),
}

impl MKind {
    fn public(self) -> LockKind {
        match self {
            MKind::Mutex | MKind::Lock => LockKind::Lock,
            MKind::Semaphore(permits) => LockKind::Semaphore { permits },
        }
    }
}

/// A grant: session, token, time, mode.
type MGrant = (SessionId, u64, u64, Mode);

#[derive(Clone, Default)]
struct Model {
    sessions: BTreeMap<SessionId, MSession>,
    /// Every holder of each name in use, in the order granted.
    holders: BTreeMap<String, Vec<MGrant>>,
    queues: BTreeMap<String, VecDeque<(SessionId, u64)>>,
    /// The mode each queued request asked for.
    wait_modes: BTreeMap<(SessionId, u64), Mode>,
    kinds: BTreeMap<String, MKind>,
    /// The last token granted for each name in use.
    last_token: BTreeMap<String, u64>,
    outcomes: BTreeMap<(SessionId, u64), Outcome>,
    /// What each answered or waiting request was (issue #35's review, F2): its kind and what
    /// defines it, as text. A known seq used for another request is refused `SequenceReused`.
    requests: BTreeMap<(SessionId, u64), String>,
    /// When each queued wait ends (the `now_ms` of its Acquire plus its capped `wait_ms`).
    until: BTreeMap<(SessionId, u64), u64>,
    /// Elections (issue #32): the value each name's leader published, with the leader's token.
    values: BTreeMap<String, (u64, Vec<u8>)>,
    /// The value each queued campaign publishes when it is granted.
    campaigns: BTreeMap<(SessionId, u64), Vec<u8>>,
    /// Lock-delays: the one each held mutex's grant asked for,
    delay_of: BTreeMap<String, u64>,
    /// the one each queued acquire asked for,
    asked: BTreeMap<(SessionId, u64), u64>,
    /// and each running one (the name has no holder until an `EndDelays` names it).
    delayed: BTreeMap<String, MDelay>,
}

/// A running lock-delay in the model: the lost grant (session, token), its length, and the
/// entry time it started at.
#[derive(Clone, Copy, Debug)]
struct MDelay {
    session: SessionId,
    token: u64,
    delay_ms: u64,
    since: u64,
    /// Started by a force-release (not an expiry or a revoke): a retry of it answers it.
    by_force: bool,
}

/// What a release answers, as opposed to an acquire or a cancel.
fn release_outcome(o: &Outcome) -> bool {
    matches!(o, Outcome::Released | Outcome::NotHolder)
}

/// What a proclaim answers and is remembered for.
fn proclaim_outcome(o: &Outcome) -> bool {
    matches!(
        o,
        Outcome::Proclaimed | Outcome::Rejected(Rejection::NotElectionLeader { .. })
    )
}

/// The rejection of an invalid lock name or election value, if either is (the table checks
/// the value first).
fn invalid(name: &str, value: Option<&Vec<u8>>) -> Option<Outcome> {
    if let Some(v) = value.filter(|v| v.len() > ELECTION_VALUE_BYTES_MAX) {
        return Some(Outcome::Rejected(Rejection::FieldTooLong {
            field: "election value".into(),
            len: v.len(),
            max: ELECTION_VALUE_BYTES_MAX,
        }));
    }
    if name.is_empty() {
        return Some(Outcome::Rejected(Rejection::NameEmpty));
    }
    if name.len() > LOCK_NAME_BYTES_MAX {
        return Some(Outcome::Rejected(Rejection::NameTooLong {
            len: name.len(),
            max: LOCK_NAME_BYTES_MAX,
        }));
    }
    None
}

fn just(outcome: Outcome) -> Applied {
    Applied {
        outcome,
        handoffs: vec![],
        dropped_waits: vec![],
        ended_waits: vec![],
        busy: None,
        changes: vec![],
        ops: vec![],
    }
}

/// Which names of a batch asked for permits so far (issue #35).
type Permits = BTreeSet<String>;

enum MSeen {
    New,
    Waiting(String, u32),
    Done(Outcome),
    TooOld,
}

/// The session, seq and description of a request that carries a seq and stands for itself (a
/// cancel names an acquire by its seq): what the model compares a reused seq by. An acquire's
/// wait is not part of it (a retry may shorten it).
fn request_of(op: &Op) -> Option<(&SessionKey, u64, String)> {
    let acquire = |name: &str, mode: Mode, delay: u64, value: Option<&Vec<u8>>| {
        format!("acquire {name:?} {mode:?} delay {delay} value {value:?}")
    };
    Some(match op {
        Op::Acquire {
            session, seq, name, ..
        } => (session, *seq, acquire(name, Mode::Exclusive, 0, None)),
        Op::AcquireWith {
            session,
            seq,
            name,
            mode,
            ..
        } => (session, *seq, acquire(name, *mode, 0, None)),
        Op::AcquireDelayed {
            session,
            seq,
            name,
            lock_delay_ms,
            ..
        } => (
            session,
            *seq,
            acquire(name, Mode::Exclusive, *lock_delay_ms, None),
        ),
        Op::Campaign {
            session,
            seq,
            name,
            value,
            ..
        } => (
            session,
            *seq,
            acquire(name, Mode::Exclusive, 0, Some(value)),
        ),
        Op::Release {
            session,
            seq,
            name,
            token,
        } => (session, *seq, format!("release {name:?} {token}")),
        Op::Proclaim {
            session,
            seq,
            name,
            token,
            value,
        } => (
            session,
            *seq,
            format!("proclaim {name:?} {token} {value:?}"),
        ),
        _ => return None,
    })
}

impl Model {
    /// `apply_request` with the seq-reuse rule: a seq the session knows (waiting, or
    /// remembered) for another request is refused `SequenceReused`, changing nothing; a new
    /// request that is answered or waits is remembered as what it was.
    fn apply(&mut self, index: u64, cmd: &Command) -> Applied {
        let Some((key, seq, request)) = request_of(&cmd.op) else {
            return self.apply_request(index, cmd);
        };
        let sid = key.id;
        if self.auth(key).is_none() {
            let known = matches!(self.seen(sid, seq), MSeen::Waiting(..) | MSeen::Done(_));
            let other = self
                .requests
                .get(&(sid, seq))
                .is_some_and(|r| *r != request);
            if known && other {
                return just(Outcome::Rejected(Rejection::SequenceReused { seq }));
            }
            let new = matches!(self.seen(sid, seq), MSeen::New);
            let applied = self.apply_request(index, cmd);
            if new && self.sessions.contains_key(&sid) && !matches!(self.seen(sid, seq), MSeen::New)
            {
                self.requests.insert((sid, seq), request);
            }
            return applied;
        }
        self.apply_request(index, cmd)
    }

    fn apply_request(&mut self, index: u64, cmd: &Command) -> Applied {
        let mut fx = just(Outcome::NotGranted);
        let now = cmd.now_ms;
        fx.outcome = match &cmd.op {
            Op::Batch(ops) => return self.apply_batch(index, now, ops),
            // Lease marks change no lock state; tests/lease_marks.rs covers them.
            Op::MarkLeases { marks } => Outcome::LeasesMarked {
                ids: marks
                    .iter()
                    .map(|(id, _)| *id)
                    .filter(|id| self.sessions.contains_key(id))
                    .collect(),
            },
            Op::RenewLeases { ids } => Outcome::LeasesRenewed {
                ids: ids
                    .iter()
                    .copied()
                    .filter(|id| self.sessions.contains_key(id))
                    .collect(),
            },
            Op::ExpireWaits => {
                let mut ended: Vec<(u64, SessionId, u64)> = self
                    .until
                    .iter()
                    .filter(|(_, u)| **u <= now)
                    .map(|(&(sid, seq), &u)| (u, sid, seq))
                    .collect();
                ended.sort();
                ended.truncate(WAITS_EXPIRED_PER_ENTRY_MAX);
                let mut names = BTreeSet::new();
                for &(_, sid, seq) in &ended {
                    names.insert(self.unqueue(sid, seq));
                    self.record(sid, seq, Outcome::NotGranted);
                    fx.ended_waits.push((sid, seq));
                }
                // Behind a waiter that left, others may now fit (not behind a mutex's holder).
                for name in names {
                    self.admit_shared(&name, index, now, &mut fx);
                }
                Outcome::WaitsExpired {
                    count: fx.ended_waits.len(),
                }
            }
            // The owner changes no lock state: the server checks it (and quotas) before proposing.
            Op::CreateSession { ttl_ms, secret }
            | Op::CreateOwnedSession { ttl_ms, secret, .. }
            | Op::OpenSession { ttl_ms, secret, .. } => {
                if !(SESSION_TTL_MS_MIN..=SESSION_TTL_MS_MAX).contains(ttl_ms) {
                    Outcome::Rejected(Rejection::TtlOutOfRange {
                        ttl_ms: *ttl_ms,
                        min: SESSION_TTL_MS_MIN,
                        max: SESSION_TTL_MS_MAX,
                    })
                } else {
                    let s = MSession {
                        secret: *secret,
                        ttl_ms: *ttl_ms,
                        recorded: VecDeque::new(),
                        remembered: BTreeSet::new(),
                        forgotten_max: None,
                    };
                    self.sessions.insert(SessionId(index), s);
                    Outcome::SessionCreated {
                        id: SessionId(index),
                        ttl_ms: *ttl_ms,
                    }
                }
            }
            Op::CloseSession { session } => match self.auth(session) {
                Some(r) => r,
                None => {
                    self.remove(&[session.id], false, index, now, &mut fx);
                    Outcome::SessionClosed
                }
            },
            Op::ExpireSessions { ids } => {
                let mut live = vec![];
                for id in ids {
                    if self.sessions.contains_key(id) && !live.contains(id) {
                        live.push(*id);
                    }
                }
                self.remove(&live, true, index, now, &mut fx);
                Outcome::SessionsExpired { ids: live }
            }
            Op::Acquire {
                session,
                seq,
                name,
                wait_ms,
            } => self.acquire_request(
                session,
                *seq,
                name,
                (*wait_ms, Mode::Exclusive, None, 0),
                index,
                now,
                &mut fx,
            ),
            Op::AcquireWith {
                session,
                seq,
                name,
                wait_ms,
                mode,
            } => self.acquire_request(
                session,
                *seq,
                name,
                (*wait_ms, *mode, None, 0),
                index,
                now,
                &mut fx,
            ),
            Op::Campaign {
                session,
                seq,
                name,
                wait_ms,
                value,
            } => self.acquire_request(
                session,
                *seq,
                name,
                (*wait_ms, Mode::Exclusive, Some(value), 0),
                index,
                now,
                &mut fx,
            ),
            Op::Proclaim {
                session,
                seq,
                name,
                token,
                value,
            } => match self.auth(session) {
                Some(r) => r,
                None => match self.seen(session.id, *seq) {
                    MSeen::Done(o) if proclaim_outcome(&o) => o.answered_for(name),
                    MSeen::Waiting(_, _) | MSeen::Done(_) => {
                        Outcome::Rejected(Rejection::SequenceReused { seq: *seq })
                    }
                    MSeen::TooOld => Outcome::Rejected(Rejection::RequestTooOld { seq: *seq }),
                    MSeen::New => {
                        if let Some(r) = invalid(name, Some(value)) {
                            // Refused for its input: not remembered.
                            r
                        } else {
                            let leads = self.holders.get(name.as_str()).is_some_and(|hs| {
                                hs.iter().any(|h| {
                                    (h.0, h.1, h.3) == (session.id, *token, Mode::Exclusive)
                                })
                            });
                            let o = if leads {
                                self.values.insert(name.clone(), (*token, value.clone()));
                                Outcome::Proclaimed
                            } else {
                                Outcome::Rejected(Rejection::NotElectionLeader {
                                    name: name.clone(),
                                    token: *token,
                                })
                            };
                            self.record(session.id, *seq, o.clone());
                            o
                        }
                    }
                },
            },
            Op::CancelWait { session, seq } => match self.auth(session) {
                Some(r) => r,
                None => match self.seen(session.id, *seq) {
                    MSeen::Waiting(_, _) => {
                        let name = self.unqueue(session.id, *seq);
                        self.record(session.id, *seq, Outcome::NotGranted);
                        self.admit_shared(&name, index, now, &mut fx);
                        Outcome::NotGranted
                    }
                    MSeen::Done(o) if release_outcome(&o) || proclaim_outcome(&o) => {
                        Outcome::Rejected(Rejection::SequenceReused { seq: *seq })
                    }
                    MSeen::Done(o) => o,
                    MSeen::TooOld | MSeen::New => {
                        Outcome::Rejected(Rejection::UnknownRequest { seq: *seq })
                    }
                },
            },
            Op::Release {
                session,
                seq,
                name,
                token,
            } => match self.auth(session) {
                Some(r) => r,
                None => match self.seen(session.id, *seq) {
                    MSeen::Done(o) if release_outcome(&o) => o.answered_for(name),
                    MSeen::Waiting(_, _) | MSeen::Done(_) => {
                        Outcome::Rejected(Rejection::SequenceReused { seq: *seq })
                    }
                    MSeen::TooOld => Outcome::Rejected(Rejection::RequestTooOld { seq: *seq }),
                    MSeen::New => {
                        let holds = self.holders.get(name).is_some_and(|hs| {
                            hs.iter().any(|h| (h.0, h.1) == (session.id, *token))
                        });
                        let o = if holds {
                            self.take(name, session.id);
                            self.end_grant(name, None, index, now, &mut fx);
                            Outcome::Released
                        } else {
                            Outcome::NotHolder
                        };
                        self.record(session.id, *seq, o.clone());
                        o
                    }
                },
            },
            Op::ForceRelease { name, token, .. } | Op::ForceReleaseTargeted { name, token, .. } => {
                let target = match &cmd.op {
                    Op::ForceReleaseTargeted { target, .. } => Some(*target),
                    _ => None,
                };
                // The generator's operator and reason are valid; tests/admin.rs covers the rest.
                if let Err(r) = validate_name(name) {
                    Outcome::Rejected(r)
                } else if target == Some(ForceTarget::Delay) && !self.delayed.contains_key(name) {
                    Outcome::Rejected(Rejection::NoLockDelay {
                        name: name.clone(),
                        token: *token,
                    })
                } else if let Some(d) = self.delayed.get(name).copied() {
                    // A force-release of a name in a lock-delay: the holder's target finds
                    // nobody holding (under the delay's token: its own first attempt's answer,
                    // nothing changes); the delay's target, and the untargeted entry, end it.
                    match (target, token.filter(|t| *t != d.token)) {
                        (Some(ForceTarget::Holder), None) if token.is_some() && d.by_force => {
                            Outcome::ForceReleased {
                                session: d.session,
                                token: d.token,
                            }
                        }
                        (Some(ForceTarget::Holder), _) => {
                            Outcome::Rejected(Rejection::LockNotHeld { name: name.clone() })
                        }
                        (Some(ForceTarget::Delay), Some(t)) => {
                            Outcome::Rejected(Rejection::NoLockDelay {
                                name: name.clone(),
                                token: Some(t),
                            })
                        }
                        (None, Some(t)) => Outcome::Rejected(Rejection::TokenMismatch {
                            name: name.clone(),
                            token: t,
                            holder_token: d.token,
                        }),
                        (_, None) => {
                            self.delayed.remove(name);
                            self.admit(name, index, now, &mut fx);
                            Outcome::ForceReleased {
                                session: d.session,
                                token: d.token,
                            }
                        }
                    }
                } else if let Some(holders) = self.holders.get(name).cloned() {
                    let taken: Vec<MGrant> = holders
                        .iter()
                        .filter(|h| token.is_none_or(|t| t == h.1))
                        .copied()
                        .collect();
                    if taken.is_empty() {
                        Outcome::Rejected(Rejection::TokenMismatch {
                            name: name.clone(),
                            token: token.unwrap(),
                            holder_token: holders[0].1,
                        })
                    } else {
                        // A mutex has one holder, so "every holder under the token" is it.
                        for h in &taken {
                            self.take(name, h.0);
                        }
                        let lost = (taken[0].0, taken[0].1);
                        self.end_grant(name, Some(lost), index, now, &mut fx);
                        if let Some(d) = self.delayed.get_mut(name) {
                            d.by_force = true;
                        }
                        Outcome::ForceReleased {
                            session: taken[0].0,
                            token: taken[0].1,
                        }
                    }
                } else {
                    Outcome::Rejected(Rejection::LockNotHeld { name: name.clone() })
                }
            }
            Op::AcquireDelayed {
                session,
                seq,
                name,
                wait_ms,
                lock_delay_ms,
            } => self.acquire_request(
                session,
                *seq,
                name,
                (*wait_ms, Mode::Exclusive, None, *lock_delay_ms),
                index,
                now,
                &mut fx,
            ),
            Op::EndDelays { ends } => {
                let mut count = 0;
                for end in ends.iter().take(DELAYS_ENDED_PER_ENTRY_MAX) {
                    if self
                        .delayed
                        .get(&end.name)
                        .is_some_and(|d| d.token == end.token)
                    {
                        self.delayed.remove(&end.name);
                        self.admit(&end.name, index, now, &mut fx);
                        count += 1;
                    }
                }
                Outcome::DelaysEnded { count }
            }
            Op::RevokeSession { session, .. } => {
                if self.sessions.contains_key(session) {
                    let locks = self
                        .holders
                        .values()
                        .flatten()
                        .filter(|h| h.0 == *session)
                        .count() as u32;
                    self.remove(&[*session], true, index, now, &mut fx);
                    Outcome::SessionRevoked { locks }
                } else {
                    Outcome::Rejected(Rejection::SessionNotFound { id: *session })
                }
            }
        };
        fx
    }

    /// Issue #35: a batch is its operations applied one by one at its index, each as an entry
    /// of its own, except what may not share an entry with what came before it in the batch.
    fn apply_batch(&mut self, index: u64, now: u64, ops: &[Op]) -> Applied {
        if ops.is_empty() || ops.len() > BATCH_OPS_MAX {
            return just(Outcome::Rejected(Rejection::BatchTooLarge {
                ops: ops.len(),
                max: BATCH_OPS_MAX,
            }));
        }
        let mut permits = Permits::new();
        let ops = ops
            .iter()
            .map(|op| self.apply_in_batch(index, now, op, &mut permits))
            .collect();
        Applied {
            ops,
            ..just(Outcome::Batch)
        }
    }

    /// One operation of a batch stamped `now`, after the batch's earlier ones.
    fn apply_in_batch(&mut self, index: u64, now: u64, op: &Op, permits: &mut Permits) -> Applied {
        let refused = self.batch_refusal(op, now, permits);
        if let Op::AcquireWith {
            name,
            mode: Mode::Permits(_),
            ..
        } = op
        {
            permits.insert(name.clone());
        }
        match refused {
            Some(r) => just(Outcome::Rejected(r)),
            None => self.apply(
                index,
                &Command {
                    now_ms: now,
                    op: op.clone(),
                },
            ),
        }
    }

    /// Refused in a batch: what is not a client's lock operation, and what would end a grant
    /// the batch made (the model's grants made by the batch are those stamped `now`, which no
    /// other entry shares here) or take a second batch of permits of one name.
    fn batch_refusal(&self, op: &Op, now: u64, permits: &Permits) -> Option<Rejection> {
        let granted_now = |name: &str| {
            self.holders
                .get(name)
                .is_some_and(|hs| hs.iter().any(|h| h.2 == now))
        };
        let conflict = |name: &str| Some(Rejection::BatchConflict { name: name.into() });
        match op {
            Op::Acquire { .. }
            | Op::AcquireWith { .. }
            | Op::AcquireDelayed { .. }
            | Op::Campaign { .. }
            | Op::Proclaim { .. }
            | Op::CancelWait { .. }
            | Op::Release { .. }
            | Op::CloseSession { .. } => {}
            _ => return Some(Rejection::NotBatchable),
        }
        match op {
            Op::Release { name, .. } if granted_now(name) => conflict(name),
            Op::AcquireWith {
                name,
                mode: Mode::Permits(_),
                ..
            } if permits.contains(name) => conflict(name),
            Op::CloseSession { session } => self
                .holders
                .iter()
                .find(|(n, hs)| hs.iter().any(|h| h.0 == session.id) && granted_now(n))
                .and_then(|(n, _)| conflict(n)),
            _ => None,
        }
    }

    /// An acquire; `how` is its wait, its mode and a campaign's value.
    #[allow(clippy::too_many_arguments)]
    fn acquire_request(
        &mut self,
        session: &SessionKey,
        seq: u64,
        name: &str,
        how: (u64, Mode, Option<&Vec<u8>>, u64),
        index: u64,
        now: u64,
        fx: &mut Applied,
    ) -> Outcome {
        let (wait_ms, mode, value, lock_delay_ms) = how;
        if let Some(r) = self.auth(session) {
            return r;
        }
        match self.seen(session.id, seq) {
            MSeen::Waiting(_, position) => Outcome::Queued { position },
            MSeen::Done(o) if release_outcome(&o) || proclaim_outcome(&o) => {
                Outcome::Rejected(Rejection::SequenceReused { seq })
            }
            MSeen::Done(o) => o.answered_for(name),
            MSeen::TooOld => Outcome::Rejected(Rejection::RequestTooOld { seq }),
            MSeen::New => {
                // A campaign's value is checked first; then the lock-delay; then the
                // acquire's own checks.
                let o = match invalid("x", value) {
                    Some(r) => r,
                    None => match self.delay_check(name, mode, lock_delay_ms) {
                        Some(rejection) => Outcome::Rejected(rejection),
                        None => self.acquire(session.id, seq, name, wait_ms, mode, index, now),
                    },
                };
                match (&o, value) {
                    (Outcome::Granted { token }, Some(v)) => {
                        self.values.insert(name.to_owned(), (*token, v.clone()));
                    }
                    (Outcome::Queued { .. }, Some(v)) => {
                        self.campaigns.insert((session.id, seq), v.clone());
                    }
                    _ => {}
                }
                if lock_delay_ms > 0 {
                    match o {
                        Outcome::Granted { .. } => {
                            self.delay_of.insert(name.to_owned(), lock_delay_ms);
                        }
                        Outcome::Queued { .. } => {
                            self.asked.insert((session.id, seq), lock_delay_ms);
                        }
                        _ => {}
                    }
                }
                if o == Outcome::NotGranted {
                    // The model's sessions have no owner descriptions.
                    fx.busy = self.holders.get(name).map(|hs| HolderState {
                        session: hs[0].0,
                        token: hs[0].1,
                        mode: hs[0].3,
                        granted_at_ms: hs[0].2,
                        owner: None,
                        value: self.value_of(name, hs[0].1),
                    });
                }
                if !matches!(o, Outcome::Queued { .. }) {
                    self.record(session.id, seq, o.clone());
                }
                o
            }
        }
    }

    /// A lock-delay is a mutex's, within its limit: `None` if this acquire may go on.
    fn delay_check(&self, name: &str, mode: Mode, lock_delay_ms: u64) -> Option<Rejection> {
        if lock_delay_ms > LOCK_DELAY_MS_MAX {
            return Some(Rejection::LockDelayOutOfRange {
                lock_delay_ms,
                max: LOCK_DELAY_MS_MAX,
            });
        }
        let delayed = self.delayed.contains_key(name)
            || self.delay_of.contains_key(name)
            || self
                .queues
                .get(name)
                .is_some_and(|q| q.iter().any(|w| self.asked.contains_key(w)));
        let shared = matches!(
            self.kinds.get(name),
            Some(MKind::Lock | MKind::Semaphore(_))
        );
        ((mode != Mode::Exclusive && delayed) || (lock_delay_ms > 0 && shared))
            .then(|| Rejection::LockDelayConflict { name: name.into() })
    }

    /// A grant of `name` ended (its holder already taken out): a grant `lost` (its session
    /// and token) that asked for a delay starts it (no holder until an `EndDelays` names it,
    /// the queue kept); otherwise the name is handed on as before.
    fn end_grant(
        &mut self,
        name: &str,
        lost: Option<(SessionId, u64)>,
        index: u64,
        now: u64,
        fx: &mut Applied,
    ) {
        match (self.delay_of.remove(name), lost) {
            (Some(delay_ms), Some((session, token))) => {
                assert!(self.holders.get(name).is_none_or(|h| h.is_empty()));
                self.holders.remove(name);
                self.kinds.remove(name);
                self.last_token.remove(name);
                let d = MDelay {
                    session,
                    token,
                    delay_ms,
                    since: now,
                    by_force: false,
                };
                self.delayed.insert(name.to_owned(), d);
            }
            _ => self.admit(name, index, now, fx),
        }
    }

    /// Take a queued wait out of its queue and out of `until`; answers its lock's name.
    fn unqueue(&mut self, sid: SessionId, seq: u64) -> String {
        let mut name = None;
        for (n, q) in self.queues.iter_mut() {
            if q.contains(&(sid, seq)) {
                q.retain(|w| *w != (sid, seq));
                name = Some(n.clone());
            }
        }
        self.until.remove(&(sid, seq));
        self.wait_modes.remove(&(sid, seq));
        self.campaigns.remove(&(sid, seq));
        self.asked.remove(&(sid, seq));
        name.expect("queued")
    }

    /// The value `name`'s grant `token` published, if any.
    fn value_of(&self, name: &str, token: u64) -> Option<Vec<u8>> {
        self.values
            .get(name)
            .filter(|(t, _)| *t == token)
            .map(|(_, v)| v.clone())
    }

    fn auth(&self, key: &SessionKey) -> Option<Outcome> {
        match self.sessions.get(&key.id) {
            Some(s) if s.secret == key.secret => None,
            _ => Some(Outcome::Rejected(Rejection::SessionNotFound { id: key.id })),
        }
    }

    fn waiting(&self, sid: SessionId, seq: u64) -> Option<(String, u32)> {
        self.queues.iter().find_map(|(name, q)| {
            let i = q.iter().position(|w| *w == (sid, seq))?;
            Some((name.clone(), i as u32 + 1))
        })
    }

    fn seen(&self, sid: SessionId, seq: u64) -> MSeen {
        if let Some((name, position)) = self.waiting(sid, seq) {
            return MSeen::Waiting(name, position);
        }
        let s = &self.sessions[&sid];
        if s.remembered.contains(&seq) {
            MSeen::Done(self.outcomes[&(sid, seq)].clone())
        } else if s.forgotten_max.is_some_and(|f| f >= seq) {
            MSeen::TooOld
        } else {
            MSeen::New
        }
    }

    fn record(&mut self, sid: SessionId, seq: u64, o: Outcome) {
        // The model keeps every outcome of a live session, remembered or not.
        let twice = self.outcomes.contains_key(&(sid, seq));
        assert!(!twice, "model: {sid}/{seq} recorded twice");
        let s = self.sessions.get_mut(&sid).unwrap();
        s.recorded.push_back(seq);
        s.remembered.insert(seq);
        if s.recorded.len() > SESSION_OUTCOMES_MAX {
            let old = s.recorded.pop_front().unwrap();
            s.remembered.remove(&old);
            s.forgotten_max = s.forgotten_max.max(Some(old));
        }
        // A session remembers a rejection without the lock's name: a retry names it again.
        self.outcomes.insert((sid, seq), o.remembered());
    }

    /// Whether a grant in `mode` fits beside `name`'s holders: a writer alone, readers beside
    /// readers only (at most HOLDERS_PER_LOCK_MAX), a permit while fewer hold than permits.
    fn fits(&self, name: &str, mode: Mode) -> bool {
        let hs = self.holders.get(name).map_or(&[][..], Vec::as_slice);
        match mode {
            Mode::Exclusive => hs.is_empty(),
            Mode::Shared => {
                hs.len() < HOLDERS_PER_LOCK_MAX && hs.iter().all(|h| h.3 == Mode::Shared)
            }
            Mode::Permits(n) => hs.len() < n as usize,
        }
    }

    /// Give `name` to `sid`: a free name at the entry's index; a semaphore's permit the token
    /// after its last; a lock's grant the entry's index (readers granted together share it).
    fn grant(&mut self, name: &str, sid: SessionId, mode: Mode, index: u64, now: u64) -> u64 {
        let token = match (self.kinds.get(name), self.last_token.get(name)) {
            (Some(MKind::Semaphore(_)), Some(last)) => last + 1,
            _ => index,
        };
        if !self.kinds.contains_key(name) {
            let kind = match mode {
                Mode::Exclusive => MKind::Mutex,
                Mode::Shared => MKind::Lock,
                Mode::Permits(n) => MKind::Semaphore(n),
            };
            self.kinds.insert(name.to_owned(), kind);
        }
        self.last_token.insert(name.to_owned(), token);
        self.holders
            .entry(name.to_owned())
            .or_default()
            .push((sid, token, now, mode));
        token
    }

    #[allow(clippy::too_many_arguments)]
    fn acquire(
        &mut self,
        sid: SessionId,
        seq: u64,
        name: &str,
        wait_ms: u64,
        mode: Mode,
        index: u64,
        now: u64,
    ) -> Outcome {
        if name.is_empty() {
            return Outcome::Rejected(Rejection::NameEmpty);
        }
        if name.len() > LOCK_NAME_BYTES_MAX {
            return Outcome::Rejected(Rejection::NameTooLong {
                len: name.len(),
                max: LOCK_NAME_BYTES_MAX,
            });
        }
        if let Mode::Permits(permits) = mode {
            if permits == 0 || permits as usize > HOLDERS_PER_LOCK_MAX {
                return Outcome::Rejected(Rejection::PermitsOutOfRange {
                    permits,
                    max: HOLDERS_PER_LOCK_MAX as u32,
                });
            }
        }
        if let Some(h) = self
            .holders
            .get(name)
            .and_then(|hs| hs.iter().find(|h| h.0 == sid))
        {
            return Outcome::Rejected(Rejection::AlreadyHeld { token: h.1 });
        }
        let queue = self.queues.entry(name.to_owned()).or_default();
        if let Some(&(_, seq)) = queue.iter().find(|w| w.0 == sid) {
            return Outcome::Rejected(Rejection::AlreadyWaiting { seq });
        }
        if self.delayed.contains_key(name) {
            // In a lock-delay: nobody is granted; a waiter queues behind the others.
            if wait_ms == 0 {
                return Outcome::NotGranted;
            }
            queue.push_back((sid, seq));
            let position = queue.len() as u32;
            self.wait_modes.insert((sid, seq), mode);
            self.until.insert(
                (sid, seq),
                now.saturating_add(wait_ms.min(WAIT_TIMEOUT_MS_MAX)),
            );
            return Outcome::Queued { position };
        }
        let Some(&kind) = self.kinds.get(name) else {
            return Outcome::Granted {
                token: self.grant(name, sid, mode, index, now),
            };
        };
        match (kind.public(), mode.kind()) {
            (held, asked) if held == asked => {}
            (LockKind::Semaphore { permits }, LockKind::Semaphore { permits: asked }) => {
                return Outcome::Rejected(Rejection::PermitsConflict {
                    name: name.into(),
                    permits,
                    asked,
                })
            }
            (held, asked) => {
                return Outcome::Rejected(Rejection::KindConflict {
                    name: name.into(),
                    held,
                    asked,
                })
            }
        }
        // FIFO: whoever finds a queue waits behind it.
        if self.queues[name].is_empty() && self.fits(name, mode) {
            return Outcome::Granted {
                token: self.grant(name, sid, mode, index, now),
            };
        }
        if wait_ms == 0 {
            return Outcome::NotGranted;
        }
        if kind == MKind::Mutex && mode == Mode::Shared {
            // A reader waits behind a mutex's holder: it is a read-write lock from now on.
            self.kinds.insert(name.to_owned(), MKind::Lock);
        }
        // (The per-session and per-queue limits are out of reach with a handful of sessions and
        // names; `limits.rs` tests them.)
        let queue = self.queues.get_mut(name).unwrap();
        queue.push_back((sid, seq));
        let position = queue.len() as u32;
        self.wait_modes.insert((sid, seq), mode);
        self.until.insert(
            (sid, seq),
            now.saturating_add(wait_ms.min(WAIT_TIMEOUT_MS_MAX)),
        );
        Outcome::Queued { position }
    }

    /// `sid`'s grant of `name` ends.
    fn take(&mut self, name: &str, sid: SessionId) {
        let hs = self.holders.get_mut(name).unwrap();
        let token = hs.iter().find(|h| h.0 == sid).map(|h| h.1);
        if token.is_some() && self.values.get(name).map(|v| v.0) == token {
            self.values.remove(name);
        }
        let before = hs.len();
        hs.retain(|h| h.0 != sid);
        assert_eq!(hs.len() + 1, before, "model: {sid} did not hold {name}");
    }

    /// `admit` for a name with several holders only (a mutex's holder stays until its
    /// handover).
    fn admit_shared(&mut self, name: &str, index: u64, now: u64, fx: &mut Applied) {
        if self.kinds.get(name).is_some_and(|k| *k != MKind::Mutex) {
            self.admit(name, index, now, fx);
        }
    }

    /// Grant the head of the queue while it fits; a head whose wait has ended leaves not
    /// granted. A name with no holder left is free.
    fn admit(&mut self, name: &str, index: u64, now: u64, fx: &mut Applied) {
        while let Some(&(sid, seq)) = self.queues.get(name).and_then(|q| q.front()) {
            let mode = self.wait_modes[&(sid, seq)];
            if !self.fits(name, mode) {
                break;
            }
            self.queues.get_mut(name).unwrap().pop_front();
            self.wait_modes.remove(&(sid, seq));
            let until = self
                .until
                .remove(&(sid, seq))
                .expect("queued wait has an end");
            let value = self.campaigns.remove(&(sid, seq));
            let asked = self.asked.remove(&(sid, seq));
            if until <= now {
                self.record(sid, seq, Outcome::NotGranted);
                fx.ended_waits.push((sid, seq));
                continue;
            }
            let token = self.grant(name, sid, mode, index, now);
            if let Some(v) = value {
                self.values.insert(name.to_owned(), (token, v));
            }
            if let Some(d) = asked {
                self.delay_of.insert(name.to_owned(), d);
            }
            self.record(sid, seq, Outcome::Granted { token });
            fx.handoffs.push(Handoff {
                name: name.to_owned(),
                session: sid,
                seq,
                token,
            });
        }
        if self.holders.get(name).is_some_and(|hs| hs.is_empty()) {
            self.holders.remove(name);
            self.kinds.remove(name);
            self.last_token.remove(name);
        }
    }

    /// Leaving sessions first drop every wait (each session's in seq order), then leave every
    /// hold (each session's in name order), so nothing goes to a leaving session. A mutex is
    /// handed over as its holder leaves; a name with several holders is handed on once, after
    /// all the leaving sessions left it (in name order).
    fn remove(&mut self, ids: &[SessionId], lost: bool, index: u64, now: u64, fx: &mut Applied) {
        let mut shared = BTreeSet::new();
        for id in ids {
            let mut seqs: Vec<(u64, String)> = self
                .queues
                .iter()
                .flat_map(|(n, q)| q.iter().filter(|w| w.0 == *id).map(|w| (w.1, n.clone())))
                .collect();
            seqs.sort();
            for (seq, name) in seqs {
                self.unqueue(*id, seq);
                shared.insert(name);
                fx.dropped_waits.push((*id, seq));
            }
        }
        for id in ids {
            let held: Vec<String> = self
                .holders
                .iter()
                .filter(|(_, hs)| hs.iter().any(|h| h.0 == *id))
                .map(|(n, _)| n.clone())
                .collect();
            for name in held {
                let token = self.holders[&name].iter().find(|h| h.0 == *id).map(|h| h.1);
                self.take(&name, *id);
                if self.kinds[&name] == MKind::Mutex {
                    let lost = token.filter(|_| lost).map(|t| (*id, t));
                    self.end_grant(&name, lost, index, now, fx);
                } else {
                    shared.insert(name);
                }
            }
            self.sessions.remove(id);
            self.outcomes.retain(|(sid, _), _| sid != id);
        }
        for name in shared {
            self.admit_shared(&name, index, now, fx);
        }
    }

    fn request_state(&self, sid: SessionId, seq: u64) -> Option<RequestState> {
        self.sessions.get(&sid)?;
        match self.seen(sid, seq) {
            MSeen::Waiting(name, position) => Some(RequestState::Waiting { name, position }),
            MSeen::Done(o) => Some(RequestState::Done(o)),
            MSeen::New | MSeen::TooOld => None,
        }
    }
}

// ---- history properties, from the table's answers only ----

/// A holder or a waiter as the history knows it: session, token or seq, mode.
type HEntry = (SessionId, u64, Mode);

#[derive(Default)]
struct History {
    /// Every holder of each name, in the order granted.
    holders: BTreeMap<String, Vec<HEntry>>,
    /// The last grant of each name ever (token, entry index, mode), kept after it is free.
    last: BTreeMap<String, (u64, u64, Mode)>,
    queues: BTreeMap<String, VecDeque<HEntry>>,
    /// Every grant ever acknowledged, by request.
    grants: BTreeMap<(SessionId, u64), u64>,
}

/// Whether a grant in `mode` fits beside `holders`: a writer alone, never a reader beside a
/// writer, never more permit holders than permits.
fn fits_beside(holders: &[HEntry], mode: Mode) -> bool {
    match mode {
        Mode::Exclusive => holders.is_empty(),
        Mode::Shared => {
            holders.len() < HOLDERS_PER_LOCK_MAX && holders.iter().all(|h| h.2 == Mode::Shared)
        }
        Mode::Permits(n) => {
            holders.len() < n as usize && holders.iter().all(|h| h.2 == Mode::Permits(n))
        }
    }
}

impl History {
    #[allow(clippy::too_many_arguments)]
    fn grant(
        &mut self,
        ctx: &str,
        name: &str,
        sid: SessionId,
        seq: u64,
        mode: Mode,
        token: u64,
        index: u64,
    ) {
        match mode {
            Mode::Exclusive | Mode::Shared => assert_eq!(
                token, index,
                "{ctx}: a lock's new grant's token is not its entry index"
            ),
            Mode::Permits(_) => assert!(token <= index, "{ctx}: a token above its entry"),
        }
        let holders = self.holders.entry(name.to_owned()).or_default();
        assert!(
            fits_beside(holders, mode),
            "{ctx}: {name} granted to {sid} as {mode:?} while {holders:?} hold it"
        );
        if let Some(&(last, at, last_mode)) = self.last.get(name) {
            // Only readers granted by one entry share a token.
            let together =
                token == last && at == index && mode == Mode::Shared && last_mode == Mode::Shared;
            assert!(
                token > last || together,
                "{ctx}: token {token} for {name} after {last}"
            );
        }
        holders.push((sid, token, mode));
        self.last.insert(name.to_owned(), (token, index, mode));
        self.grants.insert((sid, seq), token);
    }

    fn unqueue(&mut self, sid: SessionId, seq: u64) {
        for q in self.queues.values_mut() {
            q.retain(|w| (w.0, w.1) != (sid, seq));
        }
    }

    fn end_grant(&mut self, ctx: &str, name: &str, sid: SessionId, token: u64) {
        let holders = self.holders.entry(name.to_owned()).or_default();
        let before = holders.len();
        holders.retain(|h| (h.0, h.1) != (sid, token));
        assert_eq!(
            holders.len() + 1,
            before,
            "{ctx}: released a grant of {name} not held"
        );
        if holders.is_empty() {
            self.holders.remove(name);
        }
    }

    /// Fold one entry's answers in. `fresh` says whether the command carried a new seq.
    fn observe(&mut self, ctx: &str, index: u64, op: &Op, fresh: bool, fx: &Applied) {
        let ended: Vec<SessionId> = match (&fx.outcome, op) {
            (Outcome::SessionClosed, Op::CloseSession { session }) => vec![session.id],
            (Outcome::SessionRevoked { .. }, Op::RevokeSession { session, .. }) => vec![*session],
            (Outcome::SessionsExpired { ids }, _) => ids.clone(),
            _ => vec![],
        };
        for (sid, seq) in &fx.dropped_waits {
            assert!(
                ended.contains(sid),
                "{ctx}: dropped a wait of a staying session"
            );
            self.unqueue(*sid, *seq);
        }
        // Ended waits leave their queues; in a handover, before the grant to the next waiter.
        for (sid, seq) in &fx.ended_waits {
            let queued = self
                .queues
                .values()
                .any(|q| q.iter().any(|w| (w.0, w.1) == (*sid, *seq)));
            assert!(queued, "{ctx}: ended a wait that was not queued");
            self.unqueue(*sid, *seq);
        }
        for hs in self.holders.values_mut() {
            hs.retain(|h| !ended.contains(&h.0));
        }
        self.holders.retain(|_, hs| !hs.is_empty());
        for q in self.queues.values() {
            assert!(
                q.iter().all(|w| !ended.contains(&w.0)),
                "{ctx}: a leaving session's wait was not dropped"
            );
        }
        if let (
            Outcome::ForceReleased { .. },
            Op::ForceRelease { name, .. } | Op::ForceReleaseTargeted { name, .. },
        ) = (&fx.outcome, op)
        {
            for change in &fx.changes {
                if let LockChange::Released {
                    name: n,
                    session,
                    token,
                } = change
                {
                    assert_eq!(n, name, "{ctx}: a force-release of {name} released {n}");
                    self.end_grant(ctx, name, *session, *token);
                }
            }
        }
        if let Some((sid, seq)) = op.request_id() {
            let asked = match op {
                Op::Acquire { name, .. } | Op::Campaign { name, .. } => {
                    Some((name, Mode::Exclusive))
                }
                Op::AcquireWith { name, mode, .. } => Some((name, *mode)),
                Op::AcquireDelayed { name, .. } => Some((name, Mode::Exclusive)),
                _ => None,
            };
            match (&fx.outcome, asked) {
                (Outcome::Granted { token }, _) => match self.grants.get(&(sid, seq)) {
                    Some(t) => assert_eq!(t, token, "{ctx}: a retry changed the grant"),
                    None => {
                        let Some((name, mode)) = asked else {
                            panic!("{ctx}: a grant to a new non-acquire request")
                        };
                        assert!(
                            fresh,
                            "{ctx}: a retry granted a request never granted before"
                        );
                        // FIFO: nobody is granted past a waiter.
                        let waiting = self.queues.get(name).map_or(0, |q| q.len());
                        assert_eq!(waiting, 0, "{ctx}: {name} granted past {waiting} waiters");
                        self.grant(ctx, name, sid, seq, mode, *token, index);
                    }
                },
                (Outcome::Queued { position }, Some((name, mode))) if fresh => {
                    let q = self.queues.entry(name.clone()).or_default();
                    assert_eq!(
                        *position as usize,
                        q.len() + 1,
                        "{ctx}: not queued at the end"
                    );
                    q.push_back((sid, seq, mode));
                }
                (Outcome::Queued { position }, _) => {
                    let (name, q) = self
                        .queues
                        .iter()
                        .find(|(_, q)| q.iter().any(|w| (w.0, w.1) == (sid, seq)))
                        .unwrap_or_else(|| panic!("{ctx}: Queued for a request not queued"));
                    let at = q.iter().position(|w| (w.0, w.1) == (sid, seq)).unwrap() + 1;
                    assert_eq!(*position as usize, at, "{ctx}: wrong position in {name}");
                }
                (Outcome::NotGranted, _) if matches!(op, Op::CancelWait { .. }) => {
                    self.unqueue(sid, seq)
                }
                (Outcome::Released, _) if fresh => {
                    let Op::Release { name, token, .. } = op else {
                        panic!("{ctx}: Released for a non-release")
                    };
                    self.end_grant(ctx, name, sid, *token);
                }
                _ => {}
            }
        }
        for h in &fx.handoffs {
            let head = self.queues.get_mut(&h.name).and_then(|q| q.pop_front());
            let Some((session, seq, mode)) = head else {
                panic!("{ctx}: {} handed over with nobody queued", h.name)
            };
            assert_eq!(
                (session, seq),
                (h.session, h.seq),
                "{ctx}: {} handed to a waiter that is not the head of its queue",
                h.name
            );
            self.grant(ctx, &h.name, h.session, h.seq, mode, h.token, index);
        }
    }

    fn compare(&self, ctx: &str, table: &LockTable, names: &BTreeSet<String>) {
        for name in names {
            if let Some(i) = table.describe(name).filter(|i| i.delay_until_ms.is_some()) {
                // In a lock-delay: nobody holds it, its waiters are kept.
                assert!(i.holders.is_empty(), "{ctx}: {name} held during its delay");
                assert!(
                    !self.holders.contains_key(name),
                    "{ctx}: {name} held during its delay"
                );
                let waiters = self.queues.get(name).map_or(0, |q| q.len());
                assert_eq!(i.waiters as usize, waiters, "{ctx}: {name}'s delayed queue");
                continue;
            }
            let got = table.describe(name).map(|i| {
                let holders: Vec<HEntry> = i
                    .holders
                    .iter()
                    .map(|h| (h.session, h.token, h.mode))
                    .collect();
                assert_eq!(
                    i.holder.map(|h| (h.session, h.token)),
                    holders.first().map(|h| (h.0, h.1)),
                    "{ctx}: describe({name:?})'s holder is not its first"
                );
                (holders, i.waiters as usize)
            });
            let waiters = self.queues.get(name).map_or(0, |q| q.len());
            let want = self.holders.get(name).map(|h| (h.clone(), waiters));
            assert_eq!(
                got, want,
                "{ctx}: describe({name:?}) disagrees with the history"
            );
            if want.is_none() {
                assert_eq!(waiters, 0, "{ctx}: {name} is free with a queue");
            }
            // No waiter left waiting that could be granted.
            if let Some(head) = self.queues.get(name).and_then(|q| q.front()) {
                let holders = self.holders.get(name).map_or(&[][..], Vec::as_slice);
                assert!(
                    !fits_beside(holders, head.2),
                    "{ctx}: {name}'s head {head:?} fits beside {holders:?} but waits"
                );
            }
        }
        let listed: BTreeSet<String> = table
            .list("", usize::MAX)
            .into_iter()
            .filter(|i| i.delay_until_ms.is_none())
            .map(|i| i.name)
            .collect();
        let held: BTreeSet<String> = self.holders.keys().cloned().collect();
        assert_eq!(listed, held, "{ctx}: list disagrees with the history");
    }
}

// ---- the driver ----

struct Client {
    key: SessionKey,
    next_seq: u64,
    /// The first command sent with each seq (with the right secret), for retries.
    sent: BTreeMap<u64, Op>,
}

struct Run {
    seed: u64,
    rng: Rng,
    profile: Profile,
    index: u64,
    table: LockTable,
    model: Model,
    history: History,
    clients: BTreeMap<SessionId, Client>,
    /// Every session id ever created, for expiring dead ones too.
    ever: Vec<SessionId>,
    /// Every token ever granted, for stale releases.
    tokens: Vec<u64>,
    /// The last force-release sent, for its retry (its answer lost: the same request again).
    last_force: Option<Op>,
    names: BTreeSet<String>,
    /// The entries applied, for replay.
    log: Vec<(u64, Command, Applied)>,
    /// The holders as the entries' watch events tell them (`LockChange`s replayed alone): must
    /// match the model's after every entry.
    watched: BTreeMap<String, BTreeSet<(SessionId, u64)>>,
    /// The elections' values as the watch events tell them (granted with a value, proclaimed,
    /// gone with their grant): must match the model's after every entry.
    watched_values: BTreeMap<String, (u64, Vec<u8>)>,
    /// How often each of issue #32's rules was exercised.
    reached: BTreeMap<&'static str, usize>,
}

impl Run {
    fn new(seed: u64, profile: Profile) -> Run {
        Run {
            seed,
            rng: Rng(seed),
            profile,
            index: 0,
            table: LockTable::new(),
            model: Model::default(),
            history: History::default(),
            clients: BTreeMap::new(),
            ever: vec![],
            tokens: vec![],
            last_force: None,
            names: NAMES
                .iter()
                .chain(&["sem"])
                .map(|n| n.to_string())
                .collect(),
            log: vec![],
            watched: BTreeMap::new(),
            watched_values: BTreeMap::new(),
            reached: BTreeMap::new(),
        }
    }

    fn name(&mut self) -> String {
        match self.rng.below(100) {
            0 => String::new(),
            1 => "x".repeat(LOCK_NAME_BYTES_MAX + 1),
            _ => self.rng.pick(&NAMES).to_string(),
        }
    }

    fn wrong(&mut self, mut key: SessionKey) -> SessionKey {
        key.secret ^= 1 + self.rng.below(u64::MAX - 1);
        key
    }

    /// Issue #32's commands for session `sid`, or `None` to draw one of today's: acquires in
    /// every mode (readers mostly of "a" and "b", permits of "sem" (2), which only this
    /// generator names, and "jobs/2" (3), which today's acquires also take,
    /// sometimes another kind or count: a conflict), an operator's force-release of a held
    /// name (every holder, or one grant's token), expiries of two live sessions at once and
    /// revokes.
    fn generate_primitive(&mut self, sid: SessionId) -> Option<(Op, bool)> {
        let c = &self.clients[&sid];
        let (key, seq) = (c.key, c.next_seq);
        let roll = self.rng.below(100);
        if self.profile.elections && (45..60).contains(&roll) {
            return Some(self.generate_election(key, seq));
        }
        if roll < 35 {
            let wait_ms = match self.rng.below(8) {
                0 => 0,
                1 => 1_000 * self.rng.below(6),
                _ => WAIT_TIMEOUT_MS_MAX,
            };
            let (mode, names): (Mode, &[&str]) = match self.rng.below(10) {
                0..=1 => (Mode::Exclusive, &NAMES),
                2..=5 => (Mode::Shared, &["a", "b"]),
                _ => {
                    let permits = match self.rng.below(20) {
                        0 => *self.rng.pick(&[0, 1, 4, HOLDERS_PER_LOCK_MAX as u32 + 1]),
                        _ => 2,
                    };
                    (Mode::Permits(permits), &["sem", "sem", "jobs/2"])
                }
            };
            let mut name = if self.rng.percent(85) {
                self.rng.pick(names).to_string()
            } else {
                self.name()
            };
            let mode = match mode {
                // jobs/2 is a semaphore of 3 (one acquire in twenty asks for another count).
                Mode::Permits(2) if name == "jobs/2" => Mode::Permits(3),
                m => m,
            };
            if name.is_empty() && self.rng.percent(50) {
                name = "a".into();
            }
            let op = Op::AcquireWith {
                session: key,
                seq,
                name,
                wait_ms,
                mode,
            };
            return Some((op, true));
        }
        if roll < 39 {
            if let Some(op) = self.last_force.take().filter(|_| self.rng.percent(25)) {
                return Some((op, false));
            }
            // Held names, and names in a lock-delay (an operator's way out of one).
            let held: Vec<(String, u64)> = self
                .model
                .holders
                .iter()
                .flat_map(|(n, hs)| hs.iter().map(move |h| (n.clone(), h.1)))
                .chain(self.model.delayed.iter().map(|(n, d)| (n.clone(), d.token)))
                .collect();
            let (name, token) = if !held.is_empty() && self.rng.percent(85) {
                self.rng.pick(&held).clone()
            } else {
                (self.name(), self.index)
            };
            let token = match self.rng.below(10) {
                0..=3 => None,
                4 if !self.tokens.is_empty() => Some(*self.rng.pick(&self.tokens)),
                _ => Some(token),
            };
            let by = Actor {
                identity: None,
                claimed: "model".into(),
            };
            let reason = "test".into();
            // The entry earlier builds propose, and the one that says what it ends (a retry of
            // a release that started a delay draws the delay's token: `held` has it).
            let target = match self.rng.below(4) {
                0 => None,
                1 if self.model.delayed.contains_key(&name) || self.rng.percent(10) => {
                    Some(ForceTarget::Delay)
                }
                _ => Some(ForceTarget::Holder),
            };
            let op = Op::force_release(name, token, target, by, reason);
            self.last_force = Some(op.clone());
            return Some((op, false));
        }
        if roll < 43 {
            // Several clients lost at once, mostly holders of one name: what they held is
            // handed on in one entry.
            let crowded: Vec<Vec<SessionId>> = self
                .model
                .holders
                .values()
                .filter(|hs| hs.len() > 1)
                .map(|hs| hs.iter().map(|h| h.0).collect())
                .collect();
            let live: Vec<SessionId> = self.clients.keys().copied().collect();
            let from = if !crowded.is_empty() && self.rng.percent(80) {
                self.rng.pick(&crowded).clone()
            } else {
                live
            };
            let first = self.rng.below(from.len() as u64) as usize;
            let second = (first + 1 + self.rng.below(from.len() as u64) as usize) % from.len();
            let ids = vec![from[first], from[second]];
            return Some((Op::ExpireSessions { ids }, false));
        }
        if roll < 45 {
            let session = *self.rng.pick(&self.ever);
            let op = Op::RevokeSession {
                session,
                by: Actor::default(),
                reason: "test".into(),
            };
            return Some((op, false));
        }
        None
    }

    /// A campaign (mostly for "a" and "jobs/1", which plain acquires and readers also take)
    /// or a proclaim (mostly by a holder of its grant, sometimes a stale token or another's),
    /// with values of every size, now and then one over the limit.
    fn generate_election(&mut self, key: SessionKey, seq: u64) -> (Op, bool) {
        let len = match self.rng.below(20) {
            0 => ELECTION_VALUE_BYTES_MAX + 1,
            1 => ELECTION_VALUE_BYTES_MAX,
            _ => self.rng.below(8) as usize,
        };
        let value = vec![b'v' + (seq % 8) as u8; len];
        if self.rng.percent(55) {
            let wait_ms = match self.rng.below(6) {
                0 => 0,
                1 => 1_000 * self.rng.below(6),
                _ => WAIT_TIMEOUT_MS_MAX,
            };
            let name = if self.rng.percent(85) {
                self.rng.pick(&["a", "jobs/1", "sem"]).to_string()
            } else {
                self.name()
            };
            let op = Op::Campaign {
                session: key,
                seq,
                name,
                wait_ms,
                value,
            };
            return (op, true);
        }
        let held: Vec<(String, u64)> = self
            .model
            .holders
            .iter()
            .flat_map(|(n, hs)| hs.iter().map(move |h| (n, h)))
            .filter(|(_, h)| h.0 == key.id || self.rng.0 % 5 == 0)
            .map(|(n, h)| (n.clone(), h.1))
            .collect();
        let (name, token) = if !held.is_empty() && self.rng.percent(85) {
            self.rng.pick(&held).clone()
        } else if !self.tokens.is_empty() {
            (self.name(), *self.rng.pick(&self.tokens))
        } else {
            (self.name(), self.index)
        };
        let op = Op::Proclaim {
            session: key,
            seq,
            name,
            token,
            value,
        };
        (op, true)
    }

    /// Lock-delay commands for session `sid`, or `None` for another: acquires of a mutex
    /// asking for a delay of a few entries (rarely one over the limit), and `EndDelays`.
    fn generate_delay(&mut self, sid: SessionId) -> Option<(Op, bool)> {
        let roll = self.rng.below(100);
        if roll < 15 {
            let c = &self.clients[&sid];
            let (key, seq) = (c.key, c.next_seq);
            let wait_ms = match self.rng.below(6) {
                0 => 0,
                1 => 1_000 * self.rng.below(6),
                _ => WAIT_TIMEOUT_MS_MAX,
            };
            let lock_delay_ms = match self.rng.below(30) {
                0 => LOCK_DELAY_MS_MAX + 1,
                1 => LOCK_DELAY_MS_MAX,
                _ => 1_000 * (1 + self.rng.below(5)),
            };
            let name = if self.rng.percent(90) {
                self.rng.pick(&["a", "b", "jobs/1", "jobs/2"]).to_string()
            } else {
                self.name()
            };
            let op = Op::AcquireDelayed {
                session: key,
                seq,
                name,
                wait_ms,
                lock_delay_ms,
            };
            return Some((op, true));
        }
        if roll < 25 {
            // The running delays the leader would end now (each at random: its monotonic clock
            // decides, which the table never sees), now and then a stale or unknown one.
            let mut ends: Vec<DelayEnd> = self
                .model
                .delayed
                .iter()
                .filter(|_| self.rng.percent(60))
                .map(|(name, d)| DelayEnd {
                    name: name.clone(),
                    token: d.token,
                })
                .collect();
            if self.rng.percent(10) {
                let name = self.rng.pick(&["a", "b", "jobs/1", "nope"]).to_string();
                let token = self.rng.below(self.index + 1);
                ends.push(DelayEnd { name, token });
            }
            return Some((Op::EndDelays { ends }, false));
        }
        None
    }

    /// Choose the next command; the bool says whether it carries a new seq of a live session.
    fn generate(&mut self) -> (Op, bool) {
        let live: Vec<SessionId> = self.clients.keys().copied().collect();
        let roll = self.rng.below(100);
        if live.is_empty() || (roll < 8 && live.len() < self.profile.sessions_max) {
            let ttl_ms = if self.rng.percent(90) {
                SESSION_TTL_MS_DEFAULT
            } else {
                *self.rng.pick(&[0, 999, 1_000, 3_600_000, 3_600_001])
            };
            return (
                Op::CreateSession {
                    ttl_ms,
                    secret: self.rng.next(),
                },
                false,
            );
        }
        let sid = *self.rng.pick(&live);
        if self.profile.delays {
            if let Some(generated) = self.generate_delay(sid) {
                return generated;
            }
        }
        if self.profile.primitives {
            if let Some(generated) = self.generate_primitive(sid) {
                return generated;
            }
        }
        if (8..8 + self.profile.ending_pct).contains(&roll) {
            if self.rng.percent(40) {
                let mut key = self.clients[&sid].key;
                if self.rng.percent(20) {
                    key = self.wrong(key);
                }
                return (Op::CloseSession { session: key }, false);
            }
            let mut ids: Vec<SessionId> = (0..self.rng.below(3))
                .map(|_| *self.rng.pick(&self.ever))
                .collect();
            if !ids.is_empty() && self.rng.percent(25) {
                ids.push(ids[0]);
            }
            if self.rng.percent(30) {
                return (Op::ExpireWaits, false);
            }
            return (Op::ExpireSessions { ids }, false);
        }
        let c = &self.clients[&sid];
        let (key, seq) = (c.key, c.next_seq);
        let used: Vec<u64> = c.sent.keys().copied().collect();
        let waiting: Vec<u64> = self
            .model
            .queues
            .values()
            .flatten()
            .filter(|w| w.0 == sid)
            .map(|w| w.1)
            .collect();
        let roll = self.rng.below(100);
        let (op, fresh) = if roll < 40 {
            let name = self.name();
            // No wait, a wait that ends within a few entries (each entry is 1 s later), or one
            // that never ends in a run.
            let wait_ms = match self.rng.below(4) {
                0 => 0,
                1 => 1_000 * self.rng.below(6),
                _ => WAIT_TIMEOUT_MS_MAX,
            };
            let op = Op::Acquire {
                session: key,
                seq,
                name,
                wait_ms,
            };
            (op, true)
        } else if roll < 60 {
            let held: Vec<(String, u64)> = self
                .model
                .holders
                .iter()
                .flat_map(|(n, hs)| hs.iter().map(move |h| (n, h)))
                .filter(|(_, h)| h.0 == sid)
                .map(|(n, h)| (n.clone(), h.1))
                .collect();
            let (name, token) = if !held.is_empty() && self.rng.percent(75) {
                self.rng.pick(&held).clone()
            } else {
                let token = if self.tokens.is_empty() {
                    self.index
                } else {
                    *self.rng.pick(&self.tokens)
                };
                (self.name(), token)
            };
            (
                Op::Release {
                    session: key,
                    seq,
                    name,
                    token,
                },
                true,
            )
        } else if roll < 72 {
            // A cancel of a seq never used is rejected and not remembered: not "fresh", so the
            // seq stays unused.
            let seq = if !waiting.is_empty() && self.rng.percent(70) {
                *self.rng.pick(&waiting)
            } else if !used.is_empty() && self.rng.percent(70) {
                *self.rng.pick(&used)
            } else {
                seq
            };
            (Op::CancelWait { session: key, seq }, false)
        } else if roll < 92 && !used.is_empty() {
            // A retry: mostly the very command sent before, sometimes another kind with its seq.
            let old = *self.rng.pick(&used);
            let op = if self.rng.percent(80) {
                self.clients[&sid].sent[&old].clone()
            } else {
                match self.rng.below(3) {
                    0 => Op::Acquire {
                        session: key,
                        seq: old,
                        name: self.name(),
                        wait_ms: latchkey_core::limits::WAIT_TIMEOUT_MS_MAX,
                    },
                    1 => Op::CancelWait {
                        session: key,
                        seq: old,
                    },
                    _ => Op::Release {
                        session: key,
                        seq: old,
                        name: self.name(),
                        token: self.index,
                    },
                }
            };
            (op, false)
        } else {
            let name = self.name();
            let op = Op::Acquire {
                session: self.wrong(key),
                seq,
                name,
                wait_ms: latchkey_core::limits::WAIT_TIMEOUT_MS_MAX,
            };
            (op, false)
        };
        (op, fresh)
    }

    fn step(&mut self) {
        self.index += 1 + if self.rng.percent(20) {
            self.rng.below(5)
        } else {
            0
        };
        if self.profile.batches && self.rng.percent(33) {
            return self.step_batch();
        }
        let index = self.index;
        let (op, fresh) = self.generate();
        let ctx = format!("seed {} entry {index} ({op:?})", self.seed);
        let cmd = Command {
            now_ms: 1_000 * index,
            op: op.clone(),
        };
        let reader_behind_writer = self.reader_behind_writer(&op);
        let delays_before = self.model.delayed.len();
        let got = self.table.apply(index, &cmd);
        let fresh = fresh && remembered(&op, &got.outcome);
        if let Err(e) = self.table.check_invariants() {
            panic!("{ctx}: invariant broken: {e}");
        }
        let want = self.model.apply(index, &cmd);
        // The model does not list changes; they are checked against its holders below.
        assert_eq!(
            without_changes(&got),
            want,
            "{ctx}: the table and the model disagree"
        );
        self.follow(&ctx, index, &op, fresh, &got);
        self.compare_entry(&ctx);
        self.track(&op, fresh, &got);
        self.compare_requests(&ctx);
        self.round_trip(&ctx);
        self.count(&op, &got, reader_behind_writer);
        self.count_delays(&op, &got, fresh, delays_before);
        self.log.push((index, cmd, got));
    }

    /// Issue #35: an entry that is a batch of 2 to 6 commands drawn as above, each from the
    /// state after the ones before it (the model applies each as it is drawn, at the batch's
    /// index). The table applies the batch as one entry: its answer for each operation must
    /// be the model's for that operation alone, and every check above holds after the batch.
    fn step_batch(&mut self) {
        let index = self.index;
        let now_ms = 1_000 * index;
        let mut permits = Permits::new();
        let mut drawn = Vec::new();
        for _ in 0..2 + self.rng.below(5) {
            // Mostly what a batch may carry; now and then what it refuses.
            let (mut op, mut fresh) = self.generate();
            for _ in 0..3 {
                if !matches!(op, Op::CreateSession { .. } | Op::ExpireSessions { .. }) {
                    break;
                }
                (op, fresh) = self.generate();
            }
            let reader_behind_writer = self.reader_behind_writer(&op);
            let delays_before = self.model.delayed.len();
            let want = self.model.apply_in_batch(index, now_ms, &op, &mut permits);
            let fresh = fresh && remembered(&op, &want.outcome);
            // The model's state is this operation's, as after an entry of its own.
            self.count_delays(&op, &want, fresh, delays_before);
            self.track(&op, fresh, &want);
            drawn.push((op, fresh, want, reader_behind_writer));
        }
        let ops: Vec<Op> = drawn.iter().map(|d| d.0.clone()).collect();
        let ctx = format!("seed {} entry {index} (batch {ops:?})", self.seed);
        let cmd = Command {
            now_ms,
            op: Op::Batch(ops),
        };
        let got = self.table.apply(index, &cmd);
        if let Err(e) = self.table.check_invariants() {
            panic!("{ctx}: invariant broken: {e}");
        }
        assert_eq!(got.outcome, Outcome::Batch, "{ctx}");
        assert_eq!(
            got.ops.len(),
            drawn.len(),
            "{ctx}: one answer per operation"
        );
        let events = latchkey_core::watch_events(index, &cmd, &got);
        let mut per_op_events = Vec::new();
        for ((op, fresh, want, reader_behind_writer), got) in drawn.iter().zip(&got.ops) {
            let ctx = format!("{ctx}: operation {op:?}");
            assert_eq!(
                &without_changes(got),
                want,
                "{ctx}: the batch's answer is not the operation's alone (the model's)"
            );
            let refused = match (op, &got.outcome) {
                (Op::Release { .. }, Outcome::Rejected(Rejection::BatchConflict { .. })) => {
                    Some("release of a grant of its batch refused")
                }
                (Op::CloseSession { .. }, Outcome::Rejected(Rejection::BatchConflict { .. })) => {
                    Some("close of a holder of its batch refused")
                }
                (_, Outcome::Rejected(Rejection::BatchConflict { .. })) => {
                    Some("second permits acquire refused")
                }
                (_, Outcome::Rejected(Rejection::NotBatchable)) => Some("not batchable"),
                (_, Outcome::Granted { .. }) => Some("granted in a batch"),
                (_, Outcome::Queued { .. }) => Some("queued in a batch"),
                (_, Outcome::Released) => Some("released in a batch"),
                _ => None,
            };
            if let Some(what) = refused {
                *self.reached.entry(what).or_default() += 1;
            }
            if !got.handoffs.is_empty() {
                *self.reached.entry("handed over in a batch").or_default() += 1;
            }
            if matches!(op, Op::AcquireDelayed { .. })
                && matches!(
                    got.outcome,
                    Outcome::Granted { .. } | Outcome::Queued { .. }
                )
            {
                *self
                    .reached
                    .entry("lock-delay acquire in a batch")
                    .or_default() += 1;
            }
            let alone = Command {
                now_ms,
                op: op.clone(),
            };
            per_op_events.extend(latchkey_core::watch_events(index, &alone, got));
            self.follow(&ctx, index, op, *fresh, got);
            self.count(op, got, *reader_behind_writer);
        }
        // The entry's watch events are its operations', numbered on through the entry.
        for (i, e) in per_op_events.iter_mut().enumerate() {
            e.ordinal = i as u32;
        }
        assert_eq!(events, per_op_events, "{ctx}: the batch's watch events");
        *self.reached.entry("batch").or_default() += 1;
        self.compare_entry(&ctx);
        self.compare_requests(&ctx);
        self.round_trip(&ctx);
        self.log.push((index, cmd, got));
    }

    /// A reader arriving while only readers hold, behind a queue (a waiting writer).
    fn reader_behind_writer(&self, op: &Op) -> bool {
        match op {
            Op::AcquireWith {
                name,
                mode: Mode::Shared,
                ..
            } => {
                self.model
                    .holders
                    .get(name)
                    .is_some_and(|hs| hs.iter().all(|h| h.3 == Mode::Shared))
                    && self.model.queues.get(name).is_some_and(|q| !q.is_empty())
            }
            _ => false,
        }
    }

    /// Fold one operation's answer into the watched holders and the history, checking both.
    fn follow(&mut self, ctx: &str, index: u64, op: &Op, fresh: bool, got: &Applied) {
        let cmd = Command {
            now_ms: 1_000 * index,
            op: op.clone(),
        };
        for event in latchkey_core::watch_events(index, &cmd, got) {
            let key = (event.session, event.token.unwrap_or(0));
            let token = event.token.unwrap_or(0);
            match event.kind {
                WatchKind::Granted => {
                    let holders = self.watched.entry(event.lock.clone()).or_default();
                    let new = holders.insert(key);
                    assert!(new, "{ctx}: {event:?} granted a grant already held");
                    let asked = match op {
                        Op::Campaign { .. } | Op::Acquire { .. } => Some(Mode::Exclusive),
                        Op::AcquireWith { mode, .. } => Some(*mode),
                        _ => None,
                    };
                    let mode = event.mode.expect("a grant says its mode");
                    if let (Some(asked), Some(_)) = (asked, op.request_id()) {
                        if got.handoffs.iter().all(|h| h.token != token) {
                            assert_eq!(mode, asked, "{ctx}: {event:?} in another mode");
                        }
                    }
                    if let Some(v) = &event.value {
                        assert_eq!(mode, Mode::Exclusive, "{ctx}: {event:?}: a shared leader");
                        self.watched_values
                            .insert(event.lock.clone(), (token, v.clone()));
                    }
                }
                WatchKind::Released
                | WatchKind::Expired
                | WatchKind::Revoked
                | WatchKind::ForceReleased => {
                    let holders = self.watched.entry(event.lock.clone()).or_default();
                    let held = holders.remove(&key);
                    assert!(held, "{ctx}: {event:?} ended a grant not held");
                    if holders.is_empty() {
                        self.watched.remove(&event.lock);
                    }
                    if self.watched_values.get(&event.lock).map(|v| v.0) == Some(token) {
                        self.watched_values.remove(&event.lock);
                    }
                }
                WatchKind::Proclaimed => {
                    let held = self
                        .watched
                        .get(&event.lock)
                        .is_some_and(|h| h.contains(&key));
                    assert!(held, "{ctx}: {event:?} proclaimed by no holder");
                    let v = event.value.clone().expect("a proclaim says its value");
                    self.watched_values.insert(event.lock.clone(), (token, v));
                }
                WatchKind::Queued | WatchKind::WaitEnded => {}
            }
        }
        self.history.observe(ctx, index, op, fresh, got);
    }

    /// After an entry: the watched holders and values, the history and every name's holders
    /// agree with the model and the table.
    fn compare_entry(&mut self, ctx: &str) {
        let by_model: BTreeMap<String, BTreeSet<(SessionId, u64)>> = self
            .model
            .holders
            .iter()
            .map(|(n, hs)| (n.clone(), hs.iter().map(|h| (h.0, h.1)).collect()))
            .collect();
        assert_eq!(
            self.watched, by_model,
            "{ctx}: watch events disagree with the model"
        );
        assert_eq!(
            self.watched_values, self.model.values,
            "{ctx}: the values watch events tell disagree with the model"
        );
        self.history.compare(ctx, &self.table, &self.names);
        for name in &self.names {
            let at = |h: &HolderState| (h.session, h.token, h.granted_at_ms, h.mode);
            let info = self.table.describe(name);
            let got = info
                .as_ref()
                .map(|i| i.holders.iter().map(at).collect::<Vec<_>>())
                .filter(|h| !h.is_empty());
            let want = self.model.holders.get(name).cloned();
            assert_eq!(got, want, "{ctx}: holders of {name} per the model");
            // A name in a lock-delay is described with no holder, as the model has none.
            let values = info
                .as_ref()
                .map(|i| {
                    i.holders
                        .iter()
                        .map(|h| h.value.clone())
                        .collect::<Vec<_>>()
                })
                .filter(|v| !v.is_empty());
            let want = self.model.holders.get(name).map(|hs| {
                hs.iter()
                    .map(|h| self.model.value_of(name, h.1))
                    .collect::<Vec<_>>()
            });
            assert_eq!(values, want, "{ctx}: values of {name} per the model");
            let delay = info
                .as_ref()
                .map_or((None, None), |i| (i.lock_delay_ms, i.delay_until_ms));
            let want = match self.model.delayed.get(name) {
                Some(d) => (Some(d.delay_ms), Some(d.since + d.delay_ms)),
                None => (self.model.delay_of.get(name).copied(), None),
            };
            assert_eq!(delay, want, "{ctx}: lock-delay of {name} per the model");
        }
    }

    /// Count what lock-delay's rules were exercised by (see `DELAYED`'s test), just after the
    /// model applied `op` (which answered `got`); `delays_before` is the model's count of
    /// names in a delay before it.
    fn count_delays(&mut self, op: &Op, got: &Applied, fresh: bool, delays_before: usize) {
        if self.model.delayed.len() > delays_before {
            *self.reached.entry("lock-delay started").or_default() += 1;
        }
        if let Op::Acquire { name, .. } | Op::AcquireDelayed { name, .. } = op {
            if matches!(got.outcome, Outcome::Queued { .. } | Outcome::NotGranted)
                && fresh
                && self.model.delayed.contains_key(name)
            {
                *self
                    .reached
                    .entry("acquire during a lock-delay")
                    .or_default() += 1;
            }
        }
    }

    /// Now and then, the table goes through a snapshot and on from the decoded one.
    fn round_trip(&mut self, ctx: &str) {
        if self.rng.percent(3) {
            let restored = decode_table(&encode_table(&self.table)).expect("snapshot decodes");
            assert_eq!(restored, self.table, "{ctx}: snapshot round trip");
            self.table = restored;
        }
    }

    /// Count what issue #32's rules were exercised by (see `MIXED`'s test).
    fn count(&mut self, op: &Op, got: &Applied, reader_behind_writer: bool) {
        let mut seen = |what: &'static str| *self.reached.entry(what).or_default() += 1;
        match (op, &got.outcome) {
            (Op::AcquireWith { mode, .. }, Outcome::Granted { .. }) => match mode {
                Mode::Shared => seen("reader granted at once"),
                Mode::Permits(_) => seen("permit granted at once"),
                Mode::Exclusive => {}
            },
            (_, Outcome::Queued { .. }) if reader_behind_writer => {
                seen("reader queued behind a waiting writer")
            }
            (_, Outcome::Rejected(Rejection::KindConflict { .. })) => seen("kind conflict"),
            (_, Outcome::Rejected(Rejection::PermitsConflict { .. })) => seen("permits conflict"),
            (_, Outcome::Rejected(Rejection::PermitsOutOfRange { .. })) => {
                seen("permits out of range")
            }
            (
                Op::ForceReleaseTargeted {
                    target: ForceTarget::Holder,
                    ..
                },
                Outcome::ForceReleased { .. },
            ) if got.changes.is_empty() => seen("force-release retry found its lock-delay"),
            (
                Op::ForceReleaseTargeted {
                    target: ForceTarget::Delay,
                    ..
                },
                Outcome::ForceReleased { .. },
            ) => seen("lock-delay ended by its target"),
            (_, Outcome::Rejected(Rejection::NoLockDelay { .. })) => seen("no lock-delay to end"),
            (Op::ForceRelease { .. }, Outcome::ForceReleased { .. })
                if !got.handoffs.is_empty()
                    && got
                        .changes
                        .iter()
                        .all(|c| !matches!(c, LockChange::Released { .. })) =>
            {
                seen("force-release ended a lock-delay")
            }
            (
                Op::ForceRelease { .. } | Op::ForceReleaseTargeted { .. },
                Outcome::ForceReleased { .. },
            ) => seen("force-released"),
            (Op::Campaign { .. }, Outcome::Granted { .. }) => seen("campaign granted at once"),
            (Op::Campaign { .. }, Outcome::Queued { .. }) => seen("campaign queued"),
            (Op::Proclaim { .. }, Outcome::Proclaimed) => seen("proclaimed"),
            (_, Outcome::Rejected(Rejection::NotElectionLeader { .. })) => seen("not leader"),
            (_, Outcome::Rejected(Rejection::FieldTooLong { .. })) => seen("value too long"),
            (_, Outcome::Rejected(Rejection::LockDelayConflict { .. })) => {
                seen("lock-delay conflict")
            }
            (_, Outcome::Rejected(Rejection::LockDelayOutOfRange { .. })) => {
                seen("lock-delay out of range")
            }
            (Op::EndDelays { .. }, _) if !got.handoffs.is_empty() => {
                seen("granted after a lock-delay")
            }
            (Op::EndDelays { .. }, Outcome::DelaysEnded { count })
                if *count > got.handoffs.len() =>
            {
                seen("freed after a lock-delay")
            }
            (_, Outcome::SessionRevoked { .. }) => seen("revoked"),
            _ => {}
        }
        let mut by_name: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for h in &got.handoffs {
            by_name.entry(&h.name).or_default().push(h.token);
        }
        for tokens in by_name.values() {
            if tokens.len() > 1 && tokens.windows(2).all(|w| w[0] == w[1]) {
                seen("readers handed a lock together");
            }
            if tokens.len() > 1 && tokens.windows(2).all(|w| w[0] < w[1]) {
                seen("permits handed over together");
            }
        }
        if got
            .changes
            .iter()
            .any(|c| matches!(c, LockChange::Granted { .. }))
            && matches!(op, Op::CancelWait { .. } | Op::ExpireWaits)
        {
            seen("grant after a wait left");
        }
        if got.handoffs.iter().any(|h| h.token < self.index) {
            seen("permit token below its entry");
        }
        for c in &got.changes {
            match c {
                LockChange::Granted {
                    value: Some(_),
                    token,
                    ..
                } if got.handoffs.iter().any(|h| h.token == *token) => {
                    seen("campaign handed over with its value");
                    if matches!(op, Op::EndDelays { .. }) {
                        seen("campaign granted after a lock-delay");
                    }
                }
                LockChange::WaitEnded { session, seq, .. }
                    if self.log.iter().any(|(_, c, _)| {
                        matches!(&c.op, Op::Campaign { session: k, seq: q, .. } if k.id == *session && q == seq)
                    }) =>
                {
                    seen("campaign's wait ended")
                }
                _ => {}
            }
        }
    }

    /// Update the clients' view after an entry.
    fn track(&mut self, op: &Op, fresh: bool, got: &Applied) {
        match (op, &got.outcome) {
            (Op::CreateSession { secret, .. }, Outcome::SessionCreated { id, .. }) => {
                let key = SessionKey {
                    id: *id,
                    secret: *secret,
                };
                let client = Client {
                    key,
                    next_seq: 1,
                    sent: BTreeMap::new(),
                };
                self.clients.insert(*id, client);
                self.ever.push(*id);
            }
            (_, Outcome::SessionClosed)
            | (_, Outcome::SessionsExpired { .. })
            | (_, Outcome::SessionRevoked { .. }) => {
                self.clients
                    .retain(|id, _| self.model.sessions.contains_key(id));
            }
            _ => {}
        }
        if let Outcome::Granted { token } = got.outcome {
            self.tokens.push(token);
        }
        self.tokens.extend(got.handoffs.iter().map(|h| h.token));
        if let (true, Some((sid, seq))) = (fresh, op.request_id()) {
            let c = self
                .clients
                .get_mut(&sid)
                .expect("fresh requests come from live sessions");
            c.sent.insert(seq, op.clone());
            c.next_seq += 1;
        }
    }

    /// `request_state` of recent requests of every live session agrees with the model.
    fn compare_requests(&self, ctx: &str) {
        for (sid, c) in &self.clients {
            // Every request now and then; the recent ones after every entry.
            let window = if self.index % 64 == 0 {
                SESSION_OUTCOMES_MAX as u64 + 20
            } else {
                16
            };
            for seq in c.next_seq.saturating_sub(window)..=c.next_seq {
                assert_eq!(
                    self.table.request_state(*sid, seq),
                    self.model.request_state(*sid, seq),
                    "{ctx}: request_state({sid}, {seq})"
                );
            }
            let info = self.table.session(*sid).map(|s| s.ttl_ms);
            assert_eq!(
                info,
                Some(self.model.sessions[sid].ttl_ms),
                "{ctx}: session {sid}"
            );
        }
        assert_eq!(
            self.table.session_count(),
            self.model.sessions.len(),
            "{ctx}"
        );
    }
}

/// Whether the table remembers the answer `o` to `op` under its seq: a proclaim refused for
/// its input is not (its seq stays unused), nor an operation a batch refused (issue #35).
fn remembered(op: &Op, o: &Outcome) -> bool {
    match (op, o) {
        (_, Outcome::Rejected(Rejection::BatchConflict { .. } | Rejection::NotBatchable)) => false,
        (Op::Proclaim { .. }, o) => matches!(
            o,
            Outcome::Proclaimed | Outcome::Rejected(Rejection::NotElectionLeader { .. })
        ),
        _ => true,
    }
}

/// An answer without its changes (the model does not list them; they are checked against
/// its holders through the watch events).
fn without_changes(got: &Applied) -> Applied {
    Applied {
        changes: vec![],
        ops: got.ops.iter().map(without_changes).collect(),
        ..got.clone()
    }
}

fn run(seed: u64, profile: Profile) -> Run {
    let mut r = Run::new(seed, profile);
    for _ in 0..profile.steps {
        r.step();
    }
    r
}

#[test]
fn random_histories_match_the_model_and_keep_every_invariant() {
    let mut outcomes = BTreeMap::<&str, usize>::new();
    for seed in 0..300 {
        let r = run(seed, SHORT);
        for (_, _, fx) in &r.log {
            let kind = match fx.outcome {
                Outcome::Granted { .. } => "granted",
                Outcome::Queued { .. } => "queued",
                Outcome::NotGranted => "not granted",
                Outcome::Released => "released",
                Outcome::NotHolder => "not holder",
                Outcome::Rejected(_) => "rejected",
                _ => "session",
            };
            *outcomes.entry(kind).or_default() += 1;
            if !fx.handoffs.is_empty() {
                *outcomes.entry("handoff").or_default() += 1;
            }
            if !fx.dropped_waits.is_empty() {
                *outcomes.entry("dropped wait").or_default() += 1;
            }
        }
    }
    // The generator must actually reach every kind of answer, or the checks above are idle.
    for kind in [
        "granted",
        "queued",
        "not granted",
        "released",
        "not holder",
        "rejected",
        "handoff",
        "dropped wait",
    ] {
        assert!(
            outcomes.get(kind).copied().unwrap_or(0) >= 50,
            "too few {kind:?} answers: {outcomes:?}"
        );
    }
}

/// Issue #32: read-write locks and semaphores interleaved with mutexes, releases, cancels,
/// expiries, force-releases and revokes, checked as above (the model, the invariants, the
/// history: FIFO, no reader beside a writer, never more holders than permits, tokens
/// increasing per name, no waiter left waiting that fits).
#[test]
fn mixed_histories_of_locks_readers_and_permits_match_the_model() {
    let mut reached = BTreeMap::<&str, usize>::new();
    for seed in 0..300 {
        let r = run(10_000 + seed, MIXED);
        for (what, n) in r.reached {
            *reached.entry(what).or_default() += n;
        }
    }
    // Each rule must be reached, or the checks above are idle for it.
    for what in [
        "reader granted at once",
        "permit granted at once",
        "reader queued behind a waiting writer",
        "kind conflict",
        "permits conflict",
        "permits out of range",
        "force-released",
        "revoked",
        "readers handed a lock together",
        "permits handed over together",
        "grant after a wait left",
        "permit token below its entry",
    ] {
        // The seeds are fixed: the counts are the same on every run (printed below).
        assert!(
            reached.get(what).copied().unwrap_or(0) >= 5,
            "{what:?} reached too rarely: {reached:?}"
        );
    }
    println!("reached: {reached:?}");
}

/// Issue #32's elections among everything above: campaigns granted at once and handed over
/// with their values, proclaims by leaders and refused ones by others, checked against the
/// model (outcomes, values in `describe` and in the watch events, remembered answers).
#[test]
fn histories_with_elections_match_the_model() {
    let mut reached = BTreeMap::<&str, usize>::new();
    for seed in 0..200 {
        let r = run(20_000 + seed, ELECTIONS);
        for (what, n) in r.reached {
            *reached.entry(what).or_default() += n;
        }
    }
    for what in [
        "campaign granted at once",
        "campaign queued",
        "campaign handed over with its value",
        "campaign's wait ended",
        "proclaimed",
        "not leader",
        "value too long",
        "kind conflict",
        "revoked",
        "force-released",
    ] {
        assert!(
            reached.get(what).copied().unwrap_or(0) >= 5,
            "{what:?} reached too rarely: {reached:?}"
        );
    }
    println!("reached: {reached:?}");
}

/// Lock-delay (issue #32 item 4) among everything `MIXED` draws, and elections: a lost grant
/// that asked for a delay keeps the name from everyone until an `EndDelays` names it (or an
/// operator force-releases it), which hands it to the head waiter (a campaign publishing its
/// value then); checked against
/// the model, the invariants (no grant while a delay runs) and the history as above.
#[test]
fn histories_with_lock_delays_match_the_model() {
    let mut reached = BTreeMap::<&str, usize>::new();
    for seed in 0..300 {
        let r = run(30_000 + seed, DELAYED);
        for (what, n) in r.reached {
            *reached.entry(what).or_default() += n;
        }
    }
    for what in [
        "lock-delay started",
        "acquire during a lock-delay",
        "granted after a lock-delay",
        "freed after a lock-delay",
        "lock-delay conflict",
        "lock-delay out of range",
        "campaign granted after a lock-delay",
        "force-release ended a lock-delay",
        "force-release retry found its lock-delay",
        "lock-delay ended by its target",
        "no lock-delay to end",
    ] {
        assert!(
            reached.get(what).copied().unwrap_or(0) >= 5,
            "{what:?} reached too rarely: {reached:?}"
        );
    }
    println!("reached: {reached:?}");
}

/// Issue #35: a third of the entries are batches of the commands above (every primitive,
/// elections, operators' actions refused in a batch). Each operation of a batch must answer
/// what the model answers for it applied alone at the batch's index, and every check above
/// (invariants after each operation, the history's tokens increasing per name and FIFO, the
/// watch events, remembered answers, snapshots) holds.
#[test]
fn batched_histories_apply_each_operation_as_alone() {
    let mut reached = BTreeMap::<&str, usize>::new();
    for seed in 0..200 {
        for r in [
            run(30_000 + seed, SHORT_BATCHED),
            run(40_000 + seed, ELECTIONS_BATCHED),
        ] {
            for (what, n) in r.reached {
                *reached.entry(what).or_default() += n;
            }
        }
    }
    // Lock-delays too: a batch's lock-delay acquires, and the delays their grants start.
    let mut delays = BTreeMap::<&str, usize>::new();
    for seed in 0..100 {
        for (what, n) in run(50_000 + seed, DELAYED_BATCHED).reached {
            *delays.entry(what).or_default() += n;
        }
    }
    for (what, min) in [
        ("lock-delay acquire in a batch", 20),
        ("lock-delay started", 5),
        ("acquire during a lock-delay", 5),
        ("granted after a lock-delay", 5),
        ("lock-delay conflict", 5),
        ("batch", 100),
    ] {
        assert!(
            delays.get(what).copied().unwrap_or(0) >= min,
            "{what:?} reached too rarely with lock-delays: {delays:?}"
        );
    }
    for (what, min) in [
        ("batch", 1_000),
        ("granted in a batch", 100),
        ("queued in a batch", 100),
        ("released in a batch", 100),
        ("handed over in a batch", 50),
        ("release of a grant of its batch refused", 5),
        ("close of a holder of its batch refused", 5),
        ("second permits acquire refused", 5),
        ("not batchable", 5),
        ("readers handed a lock together", 5),
        ("permits handed over together", 5),
        ("campaign handed over with its value", 5),
    ] {
        assert!(
            reached.get(what).copied().unwrap_or(0) >= min,
            "{what:?} reached too rarely: {reached:?}"
        );
    }
    println!("reached: {reached:?}");
}

#[test]
fn long_lived_sessions_forget_old_outcomes_but_never_a_remembered_grant() {
    let mut too_old = 0;
    for seed in 1_000..1_002 {
        let r = run(seed, LONG);
        too_old += r
            .log
            .iter()
            .filter(|(_, _, fx)| {
                matches!(
                    fx.outcome,
                    Outcome::Rejected(Rejection::RequestTooOld { .. })
                )
            })
            .count();
    }
    assert!(
        too_old > 0,
        "no retry was ever too old: the window was never exercised"
    );
}

#[test]
fn the_same_entries_give_the_same_answers_and_the_same_table() {
    for (seed, profile) in [(7, SHORT), (8, SHORT), (9, SHORT), (10, SHORT_BATCHED)] {
        let r = run(seed, profile);
        let mut one = LockTable::new();
        let mut two = LockTable::new();
        for (index, cmd, applied) in &r.log {
            let a = one.apply(*index, cmd);
            let b = two.apply(*index, cmd);
            assert_eq!(a, b, "seed {seed} entry {index}");
            assert_eq!(
                &a, applied,
                "seed {seed} entry {index}: replay differs from the run"
            );
        }
        assert_eq!(encode_table(&one), encode_table(&two), "seed {seed}");
        assert_eq!(encode_table(&one), encode_table(&r.table), "seed {seed}");
    }
}
