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
}

/// Many short histories with sessions coming and going.
const SHORT: Profile = Profile {
    steps: 250,
    sessions_max: 5,
    ending_pct: 10,
};
/// Few long-lived sessions that finish far more requests than they remember.
const LONG: Profile = Profile {
    steps: 3_000,
    sessions_max: 3,
    ending_pct: 0,
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

#[derive(Clone, Default)]
struct Model {
    sessions: BTreeMap<SessionId, MSession>,
    holders: BTreeMap<String, (SessionId, u64, u64)>,
    queues: BTreeMap<String, VecDeque<(SessionId, u64)>>,
    outcomes: BTreeMap<(SessionId, u64), Outcome>,
    /// When each queued wait ends (the `now_ms` of its Acquire plus its capped `wait_ms`).
    until: BTreeMap<(SessionId, u64), u64>,
}

/// What a release answers, as opposed to an acquire or a cancel.
fn release_outcome(o: &Outcome) -> bool {
    matches!(o, Outcome::Released | Outcome::NotHolder)
}

enum MSeen {
    New,
    Waiting(String, u32),
    Done(Outcome),
    TooOld,
}

impl Model {
    fn apply(&mut self, index: u64, cmd: &Command) -> Applied {
        let mut fx = Applied {
            outcome: Outcome::NotGranted,
            handoffs: vec![],
            dropped_waits: vec![],
            ended_waits: vec![],
            busy: None,
            changes: vec![],
        };
        let now = cmd.now_ms;
        fx.outcome = match &cmd.op {
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
                for &(_, sid, seq) in &ended {
                    self.unqueue(sid, seq);
                    self.record(sid, seq, Outcome::NotGranted);
                    fx.ended_waits.push((sid, seq));
                }
                Outcome::WaitsExpired { count: ended.len() }
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
                    self.remove(&[session.id], index, now, &mut fx);
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
                self.remove(&live, index, now, &mut fx);
                Outcome::SessionsExpired { ids: live }
            }
            Op::Acquire {
                session,
                seq,
                name,
                wait_ms,
            } => match self.auth(session) {
                Some(r) => r,
                None => match self.seen(session.id, *seq) {
                    MSeen::Waiting(_, position) => Outcome::Queued { position },
                    MSeen::Done(o) if release_outcome(&o) => {
                        Outcome::Rejected(Rejection::SequenceReused { seq: *seq })
                    }
                    MSeen::Done(o) => o,
                    MSeen::TooOld => Outcome::Rejected(Rejection::RequestTooOld { seq: *seq }),
                    MSeen::New => {
                        let o = self.acquire(session.id, *seq, name, *wait_ms, index, now);
                        if o == Outcome::NotGranted {
                            // The model's sessions have no owner descriptions.
                            fx.busy = self.holders.get(name.as_str()).map(|h| HolderState {
                                session: h.0,
                                token: h.1,
                                mode: Mode::Exclusive,
                                granted_at_ms: h.2,
                                owner: None,
                            });
                        }
                        if !matches!(o, Outcome::Queued { .. }) {
                            self.record(session.id, *seq, o.clone());
                        }
                        o
                    }
                },
            },
            Op::CancelWait { session, seq } => match self.auth(session) {
                Some(r) => r,
                None => match self.seen(session.id, *seq) {
                    MSeen::Waiting(_, _) => {
                        self.unqueue(session.id, *seq);
                        self.record(session.id, *seq, Outcome::NotGranted);
                        Outcome::NotGranted
                    }
                    MSeen::Done(o) if release_outcome(&o) => {
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
                    MSeen::Done(o) if release_outcome(&o) => o,
                    MSeen::Waiting(_, _) | MSeen::Done(_) => {
                        Outcome::Rejected(Rejection::SequenceReused { seq: *seq })
                    }
                    MSeen::TooOld => Outcome::Rejected(Rejection::RequestTooOld { seq: *seq }),
                    MSeen::New => {
                        let holds = self
                            .holders
                            .get(name)
                            .is_some_and(|h| (h.0, h.1) == (session.id, *token));
                        let o = if holds {
                            self.hand_over(name, index, now, &mut fx);
                            Outcome::Released
                        } else {
                            Outcome::NotHolder
                        };
                        self.record(session.id, *seq, o.clone());
                        o
                    }
                },
            },
            // Administrative commands are covered by tests/admin.rs, not generated here.
            Op::ForceRelease { .. } | Op::RevokeSession { .. } => {
                unreachable!("the generator makes no administrative commands")
            }
        };
        fx
    }

    /// Take a queued wait out of its queue and out of `until`.
    fn unqueue(&mut self, sid: SessionId, seq: u64) {
        for q in self.queues.values_mut() {
            q.retain(|w| *w != (sid, seq));
        }
        self.until.remove(&(sid, seq));
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
        self.outcomes.insert((sid, seq), o);
    }

    fn acquire(
        &mut self,
        sid: SessionId,
        seq: u64,
        name: &str,
        wait_ms: u64,
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
        if let Some(&(h, token, _)) = self.holders.get(name) {
            if h == sid {
                return Outcome::Rejected(Rejection::AlreadyHeld { token });
            }
        }
        let queue = self.queues.entry(name.to_owned()).or_default();
        if let Some(&(_, seq)) = queue.iter().find(|w| w.0 == sid) {
            return Outcome::Rejected(Rejection::AlreadyWaiting { seq });
        }
        if !self.holders.contains_key(name) {
            self.holders.insert(name.to_owned(), (sid, index, now));
            return Outcome::Granted { token: index };
        }
        if wait_ms == 0 {
            return Outcome::NotGranted;
        }
        // (The per-session and per-queue limits are out of reach with a handful of sessions and
        // names; `limits.rs` tests them.)
        queue.push_back((sid, seq));
        let position = queue.len() as u32;
        self.until.insert(
            (sid, seq),
            now.saturating_add(wait_ms.min(WAIT_TIMEOUT_MS_MAX)),
        );
        Outcome::Queued { position }
    }

    fn hand_over(&mut self, name: &str, index: u64, now: u64, fx: &mut Applied) {
        // Waiters whose wait has ended are passed over: they leave not granted.
        let next = loop {
            let Some((sid, seq)) = self.queues.get_mut(name).and_then(|q| q.pop_front()) else {
                break None;
            };
            let until = self
                .until
                .remove(&(sid, seq))
                .expect("queued wait has an end");
            if until > now {
                break Some((sid, seq));
            }
            self.record(sid, seq, Outcome::NotGranted);
            fx.ended_waits.push((sid, seq));
        };
        match next {
            None => {
                self.holders.remove(name);
            }
            Some((sid, seq)) => {
                self.holders.insert(name.to_owned(), (sid, index, now));
                self.record(sid, seq, Outcome::Granted { token: index });
                fx.handoffs.push(Handoff {
                    name: name.to_owned(),
                    session: sid,
                    seq,
                    token: index,
                });
            }
        }
    }

    /// Leaving sessions first drop every wait (each session's in seq order), then hand over
    /// every hold (each session's in name order), so nothing goes to a leaving session.
    fn remove(&mut self, ids: &[SessionId], index: u64, now: u64, fx: &mut Applied) {
        for id in ids {
            let mut seqs: Vec<u64> = self
                .queues
                .values()
                .flatten()
                .filter(|w| w.0 == *id)
                .map(|w| w.1)
                .collect();
            seqs.sort();
            for q in self.queues.values_mut() {
                q.retain(|w| w.0 != *id);
            }
            self.until.retain(|(sid, _), _| sid != id);
            fx.dropped_waits.extend(seqs.into_iter().map(|s| (*id, s)));
        }
        for id in ids {
            let held: Vec<String> = self
                .holders
                .iter()
                .filter(|(_, h)| h.0 == *id)
                .map(|(n, _)| n.clone())
                .collect();
            for name in held {
                self.hand_over(&name, index, now, fx);
            }
            self.sessions.remove(id);
            self.outcomes.retain(|(sid, _), _| sid != id);
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

#[derive(Default)]
struct History {
    holders: BTreeMap<String, (SessionId, u64)>,
    last_token: BTreeMap<String, u64>,
    queues: BTreeMap<String, VecDeque<(SessionId, u64)>>,
    /// Every grant ever acknowledged, by request.
    grants: BTreeMap<(SessionId, u64), u64>,
}

impl History {
    fn grant(&mut self, ctx: &str, name: &str, sid: SessionId, seq: u64, token: u64, index: u64) {
        assert_eq!(
            token, index,
            "{ctx}: a new grant's token is not its entry index"
        );
        if let Some(h) = self.holders.get(name) {
            panic!("{ctx}: {name} granted to {sid} while {h:?} holds it");
        }
        if let Some(&last) = self.last_token.get(name) {
            assert!(token > last, "{ctx}: token {token} for {name} after {last}");
        }
        self.last_token.insert(name.to_owned(), token);
        self.holders.insert(name.to_owned(), (sid, token));
        self.grants.insert((sid, seq), token);
    }

    fn unqueue(&mut self, sid: SessionId, seq: u64) {
        for q in self.queues.values_mut() {
            q.retain(|w| *w != (sid, seq));
        }
    }

    /// Fold one entry's answers in. `fresh` says whether the command carried a new seq.
    fn observe(&mut self, ctx: &str, index: u64, op: &Op, fresh: bool, fx: &Applied) {
        let ended: Vec<SessionId> = match (&fx.outcome, op) {
            (Outcome::SessionClosed, Op::CloseSession { session }) => vec![session.id],
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
            let queued = self.queues.values().any(|q| q.contains(&(*sid, *seq)));
            assert!(queued, "{ctx}: ended a wait that was not queued");
            self.unqueue(*sid, *seq);
        }
        self.holders.retain(|_, h| !ended.contains(&h.0));
        for q in self.queues.values() {
            assert!(
                q.iter().all(|w| !ended.contains(&w.0)),
                "{ctx}: a leaving session's wait was not dropped"
            );
        }
        if let Some((sid, seq)) = op.request_id() {
            match (&fx.outcome, op) {
                (Outcome::Granted { token }, _) => match self.grants.get(&(sid, seq)) {
                    Some(t) => assert_eq!(t, token, "{ctx}: a retry changed the grant"),
                    None => {
                        let Op::Acquire { name, .. } = op else {
                            panic!("{ctx}: a grant to a new non-acquire request")
                        };
                        assert!(
                            fresh,
                            "{ctx}: a retry granted a request never granted before"
                        );
                        self.grant(ctx, name, sid, seq, *token, index);
                    }
                },
                (Outcome::Queued { position }, Op::Acquire { name, .. }) if fresh => {
                    let q = self.queues.entry(name.clone()).or_default();
                    assert_eq!(
                        *position as usize,
                        q.len() + 1,
                        "{ctx}: not queued at the end"
                    );
                    q.push_back((sid, seq));
                }
                (Outcome::Queued { position }, _) => {
                    let (name, q) = self
                        .queues
                        .iter()
                        .find(|(_, q)| q.contains(&(sid, seq)))
                        .unwrap_or_else(|| panic!("{ctx}: Queued for a request not queued"));
                    let at = q.iter().position(|w| *w == (sid, seq)).unwrap() + 1;
                    assert_eq!(*position as usize, at, "{ctx}: wrong position in {name}");
                }
                (Outcome::NotGranted, Op::CancelWait { .. }) => self.unqueue(sid, seq),
                (Outcome::Released, Op::Release { name, token, .. }) if fresh => {
                    let h = self.holders.remove(name);
                    assert_eq!(h, Some((sid, *token)), "{ctx}: released a lock not held");
                }
                _ => {}
            }
        }
        for h in &fx.handoffs {
            let head = self.queues.get_mut(&h.name).and_then(|q| q.pop_front());
            assert_eq!(
                head,
                Some((h.session, h.seq)),
                "{ctx}: {} handed to a waiter that is not the head of its queue",
                h.name
            );
            self.grant(ctx, &h.name, h.session, h.seq, h.token, index);
        }
    }

    fn compare(&self, ctx: &str, table: &LockTable, names: &BTreeSet<String>) {
        for name in names {
            let got = table
                .describe(name)
                .map(|i| (i.holder.map(|h| (h.session, h.token)), i.waiters as usize));
            let waiters = self.queues.get(name).map_or(0, |q| q.len());
            let want = self.holders.get(name).map(|h| (Some(*h), waiters));
            assert_eq!(
                got, want,
                "{ctx}: describe({name:?}) disagrees with the history"
            );
            if want.is_none() {
                assert_eq!(waiters, 0, "{ctx}: {name} is free with a queue");
            }
        }
        let listed: BTreeSet<String> = table
            .list("", usize::MAX)
            .into_iter()
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
    names: BTreeSet<String>,
    /// The entries applied, for replay.
    log: Vec<(u64, Command, Applied)>,
    /// The holders as the entries' watch events tell them (`LockChange`s replayed alone): must
    /// match the model's after every entry.
    watched: BTreeMap<String, (SessionId, u64)>,
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
            names: NAMES.iter().map(|n| n.to_string()).collect(),
            log: vec![],
            watched: BTreeMap::new(),
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
        let index = self.index;
        let (op, fresh) = self.generate();
        let ctx = format!("seed {} entry {index} ({op:?})", self.seed);
        let cmd = Command {
            now_ms: 1_000 * index,
            op: op.clone(),
        };
        let got = self.table.apply(index, &cmd);
        if let Err(e) = self.table.check_invariants() {
            panic!("{ctx}: invariant broken: {e}");
        }
        let want = self.model.apply(index, &cmd);
        // The model does not list changes; they are checked against its holders below.
        let unchanged = Applied {
            changes: vec![],
            ..got.clone()
        };
        assert_eq!(unchanged, want, "{ctx}: the table and the model disagree");
        for event in latchkey_core::watch_events(index, &cmd, &got) {
            let key = (event.session, event.token.unwrap_or(0));
            match event.kind {
                WatchKind::Granted => {
                    let before = self.watched.insert(event.lock.clone(), key);
                    assert_eq!(before, None, "{ctx}: {event:?} granted a held lock");
                }
                WatchKind::Released
                | WatchKind::Expired
                | WatchKind::Revoked
                | WatchKind::ForceReleased => {
                    let before = self.watched.remove(&event.lock);
                    assert_eq!(before, Some(key), "{ctx}: {event:?} ended another grant");
                }
                WatchKind::Queued | WatchKind::WaitEnded => {}
            }
        }
        let by_model: BTreeMap<String, (SessionId, u64)> = self
            .model
            .holders
            .iter()
            .map(|(n, (s, t, _))| (n.clone(), (*s, *t)))
            .collect();
        assert_eq!(
            self.watched, by_model,
            "{ctx}: watch events disagree with the model"
        );
        self.history.observe(&ctx, index, &op, fresh, &got);
        self.history.compare(&ctx, &self.table, &self.names);
        for name in &self.names {
            let at = |h: &HolderState| (h.session, h.token, h.granted_at_ms);
            let got = self
                .table
                .describe(name)
                .and_then(|i| i.holder)
                .map(|h| at(&h));
            let want = self.model.holders.get(name).copied();
            assert_eq!(got, want, "{ctx}: holder of {name} per the model");
        }
        self.track(&op, fresh, &got);
        self.compare_requests(&ctx);
        if self.rng.percent(3) {
            let restored = decode_table(&encode_table(&self.table)).expect("snapshot decodes");
            assert_eq!(restored, self.table, "{ctx}: snapshot round trip");
            self.table = restored;
        }
        self.log.push((index, cmd, got));
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
            (_, Outcome::SessionClosed) | (_, Outcome::SessionsExpired { .. }) => {
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
    for seed in [7, 8, 9] {
        let r = run(seed, SHORT);
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
