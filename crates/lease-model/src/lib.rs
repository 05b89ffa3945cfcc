//! An exhaustive model of the session-lease protocol (issue #10), checked with stateright's BFS.
//!
//! The model drives the *real* code: every member holds a real [`LockTable`] and a real
//! [`Leases`], and the model calls them in the order the server does (see `node.rs`
//! `lease_duties`, `service.rs` `keep_alive`, `waiters.rs` `Observer`). What the model owns is
//! only what the server gets from elsewhere: the Raft log, elections, snapshot installs, the
//! clocks and the clients.
//!
//! Layout:
//! - [`Config`]: the bounds of one check (members, clients, time, elections, installs, plant).
//! - [`State`]: the abstract Raft log (committed entries and the leader's uncommitted ones),
//!   each member's applied prefix, table and leases, each client's session and beliefs.
//! - [`Action`]: the events; [`LeaseModel`] implements [`stateright::Model`].
//! - [`LeaseModel::trace`]: a counterexample as readable lines (who did what, at which tick).
//!
//! Members call the real code as the server calls it: `Leases::applied` (the apply observer's
//! call per entry), `installed` on a snapshot install, `resume` when a leader takes office,
//! `renew`/`renew_logged` for keepalives, `mark_stale`/`marks_to_log`/`marks_logged`,
//! `take_expired`. Properties: no two clients believe they hold the lock at the same true
//! time; no session is expired (its expiry committed) before its client's own deadline (`acked
//! send + TTL − margin`, the client library's rule); tokens only increase; a session outlives
//! its client's last acknowledged renewal by at most 2 × TTL. The planted bugs of issue #9
//! (`Plant`) are each found as a double grant.
//!
//! What is abstracted, and why that is sound:
//! - Raft is a committed log common to all members plus the leader's uncommitted entries,
//!   which commit in order or, when the leader dies, are lost or committed in the next term. A
//!   winner has every committed entry in its log (Raft's election rule) but may have applied
//!   any prefix; it appends a blank entry and (fixed code) resumes leases once it applied it.
//!   Followers apply entry by entry or install the leader's current snapshot. Messages inside
//!   one tick take no time: a keepalive arrives when sent, which is the worst case for the
//!   lease inequality (arrival never earlier than send).
//! - A leadership transfer needs no case of its own: `Elect` already lets any member win while
//!   the old leader is alive, and what makes that sound (one leader acknowledging at a time) is
//!   the keepalive's quorum confirmation after arrival (`ReadPolicy::ReadIndex`), which a
//!   transfer does not skip: it skips only the followers' leader lease, which keeps healthy
//!   leaders from being deposed and plays no part in the lease inequality.
//! - Time is ticks of TTL/5 (TTL 5 s, 1 s ticks); each member's clock runs at a fixed rate at
//!   an edge of `CLOCK_DRIFT_PPM_MAX` (±1 %), clients' clocks slow (their deadlines last
//!   longest in true time, the worst case for every property). The small checks try every
//!   member rate.
//! - The leader does what it can before time advances (apply, commit, resume, mark, expire): a
//!   leader that is slower only decides later on its own clock, the safe direction, and an
//!   election can still cut in between any proposal and its commit. Followers may lag freely.
//! - Clients renew no sooner than a third of a TTL after their last acknowledged renewal (the
//!   client library's schedule); they hear of a grant as soon as any member applies it.
//! - A member's table adds nothing to a state's fingerprint: it is the committed log's first
//!   `applied` entries, which are hashed.
//!
//! Bounds: `tests/lease_model.rs` (which prints the states each check explored): 2 members, 2
//! clients (one holding, one queued), 1 election, 1 install, 6 ticks; every rate assignment at
//! 4 ticks; 3 members, 1 client, 2 elections, 4 ticks; the bug checks stop at the first double
//! grant. The crate and stateright are built with `opt-level = 3` in the dev profile (root
//! `Cargo.toml`), so `cargo test` finishes it in a few minutes.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use latchkey_core::{
    limits, Applied, Command, LockTable, Op, Outcome, RequestState, SessionId, SessionKey,
};
use latchkey_server::leases::{Leases, Renew};
use latchkey_server::Plant;
use stateright::{Model, Path, Property};
use tokio::time::Instant;

/// One tick of true time. Small next to the TTL so the checker sees the steps of a lease (a
/// renewal, half a TTL, the client's margin) as different ticks.
pub const TICK_MS: u64 = 1_000;
/// The session TTL in ticks: five, so the client's margin (a fifth) is one tick and a lease is
/// marked stale after three.
pub const TTL_TICKS: u64 = 5;
pub const TTL_MS: u64 = TTL_TICKS * TICK_MS;
/// How long a client's session may outlive its last acknowledged renewal, as leases.rs states
/// it: within 2 × TTL (the model's elections take no time, so the "+ election" terms vanish).
pub const GONE_HOLDER_BOUND_TICKS: u64 = 2 * TTL_TICKS;
/// Clock rates at the edges of the drift the design assumes, in parts per million of true time.
pub const FAST_PPM: u64 = 1_000_000 + limits::CLOCK_DRIFT_PPM_MAX;
pub const SLOW_PPM: u64 = 1_000_000 - limits::CLOCK_DRIFT_PPM_MAX;
/// Clients run slow: a slow client clock makes its deadline latest in true time, the worst case
/// for every property the model checks (a client believes longest).
pub const CLIENT_PPM: u64 = SLOW_PPM;
const LOCK: &str = "L";
const _: () = assert!(TTL_MS >= limits::SESSION_TTL_MS_MIN && TTL_MS <= limits::SESSION_TTL_MS_MAX);

/// The bounds of one check.
#[derive(Debug, Clone)]
pub struct Config {
    pub members: usize,
    pub clients: usize,
    /// True ticks the model runs for.
    pub time_max: u32,
    pub elections_max: u8,
    pub installs_max: u8,
    /// Acquires per client over the whole run.
    pub acquires_max: u8,
    /// Start with every client's session open, client 0 holding the lock and the others queued
    /// for it, everything applied everywhere at tick 0 (a state the model reaches from an empty
    /// cluster by the actions it also explores); otherwise start from an empty cluster.
    pub warm_start: bool,
    /// Time does not advance while the leader has a duty it can do now (apply, commit, resume,
    /// mark, expire): the fairness the bounded-liveness property needs. Safety configurations
    /// leave it off, so the leader may be arbitrarily slow.
    pub urgent_leader: bool,
    /// Clients may release the lock (handing it to the next waiter).
    pub releases: bool,
    /// Each member's clock rate: `None` tries both edges of the drift bound for every member
    /// (2^members initial states); `Some` fixes them, for the larger checks.
    pub rates_ppm: Option<Vec<u64>>,
    pub plant: Plant,
}

/// The model: its bounds and the instant every clock counts from.
pub struct LeaseModel {
    pub config: Config,
    base: Instant,
}

impl LeaseModel {
    pub fn new(config: Config) -> LeaseModel {
        LeaseModel {
            config,
            base: Instant::now(),
        }
    }
}

/// A state of the whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// True time, in ticks.
    pub t: u32,
    pub term: u64,
    pub leader: usize,
    pub elections: u8,
    pub installs: u8,
    /// Committed entries, a prefix common to every member (index i holds log index i + 1).
    pub log: Vec<Entry>,
    /// Entries the leader of `term` proposed that have not committed, in proposal order.
    pub pending: Vec<Entry>,
    pub members: Vec<Member>,
    pub clients: Vec<Client>,
    /// Sessions live in the committed log (what any member has after applying all of it).
    pub committed_live: BTreeSet<SessionId>,
    pub last_token: u64,
    /// Sessions the cluster expired (an expiry committed) while their client's own deadline
    /// had not passed: (client, tick).
    pub early_expiries: Vec<(usize, u32)>,
    /// Grants whose token was not above every token granted before.
    pub token_regressions: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry {
    pub term: u64,
    pub what: What,
}

/// A log entry, with what its proposer needs when it applies it (a keepalive's arrival).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum What {
    /// A new leader's first entry of its term.
    Blank,
    Open {
        client: usize,
        sent_ms: u64,
        sent_t: u32,
    },
    Acquire {
        session: SessionId,
        seq: u64,
        client: usize,
    },
    Release {
        session: SessionId,
        seq: u64,
        token: u64,
        client: usize,
    },
    /// A `RenewLeases` for a keepalive that found its session marked.
    Renew {
        client: usize,
        session: SessionId,
        arrived: Instant,
        sent_ms: u64,
        sent_t: u32,
    },
    Mark {
        marks: Vec<(SessionId, u64)>,
    },
    Expire {
        ids: Vec<SessionId>,
    },
}

fn secret(client: usize) -> u64 {
    1_000 + client as u64
}

fn key(session: SessionId, client: usize) -> SessionKey {
    SessionKey {
        id: session,
        secret: secret(client),
    }
}

impl Entry {
    /// The command the table applies. `now_ms` is informational in the table (it decides
    /// nothing), so it is fixed: a varying stamp would only multiply states.
    fn command(&self) -> Option<Command> {
        let op = match &self.what {
            What::Blank => return None,
            What::Open { client, .. } => Op::CreateSession {
                ttl_ms: TTL_MS,
                secret: secret(*client),
            },
            What::Acquire {
                session,
                seq,
                client,
            } => Op::Acquire {
                session: key(*session, *client),
                seq: *seq,
                name: LOCK.into(),
                wait_ms: latchkey_core::limits::WAIT_TIMEOUT_MS_MAX,
            },
            What::Release {
                session,
                seq,
                token,
                client,
            } => Op::Release {
                session: key(*session, *client),
                seq: *seq,
                name: LOCK.into(),
                token: *token,
            },
            What::Renew { session, .. } => Op::RenewLeases {
                ids: vec![*session],
            },
            What::Mark { marks } => Op::MarkLeases {
                marks: marks.clone(),
            },
            What::Expire { ids } => Op::ExpireSessions { ids: ids.clone() },
        };
        Some(Command { now_ms: 0, op })
    }

    /// A duty of the leader's `lease_duties` task, which proposes one at a time.
    fn is_duty(&self) -> bool {
        matches!(
            self.what,
            What::Renew { .. } | What::Mark { .. } | What::Expire { .. }
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Member {
    pub rate_ppm: u64,
    /// Entries applied (or covered by an installed snapshot).
    pub applied: usize,
    pub table: Table,
    pub leases: Leases,
}

/// The real lock table. It adds nothing to a state's fingerprint: a member's table is the
/// committed log's first `applied` entries applied to an empty table (an installed snapshot is
/// the leader's table, made the same way), so the log and `applied`, which are hashed, decide
/// it. `LockTable` is not `Hash`, and encoding it for every state would dominate the check.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Table(pub LockTable);

impl Hash for Table {
    fn hash<H: Hasher>(&self, _h: &mut H) {}
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Client {
    /// The session, once the client heard it was created.
    pub session: Option<SessionId>,
    pub opened: bool,
    /// Send time (client clock, ms) of the newest acknowledged renewal or of the CreateSession.
    pub acked_sent_ms: u64,
    /// The same send, in true ticks (for the bounded-liveness property).
    pub acked_t: u32,
    pub keepalive_in_flight: bool,
    /// The token of the grant the client believes it holds.
    pub holds: Option<u64>,
    /// The sequence number of the Acquire it waits on.
    pub waiting: Option<u64>,
    pub acquires: u8,
    pub next_seq: u64,
    /// Its deadline passed, or it was told its session is gone: it believes nothing more.
    pub lost: bool,
}

impl Client {
    /// The client library's deadline (`session.rs` `ClientLease::deadline`), on the client's clock.
    pub fn deadline_ms(&self) -> u64 {
        let ttl = Duration::from_millis(TTL_MS);
        self.acked_sent_ms + (ttl - latchkey_client::safety_margin(ttl)).as_millis() as u64
    }

    fn believes(&self) -> bool {
        self.holds.is_some() && !self.lost
    }
}

/// Client clock reading at true tick `t`, ms.
pub fn client_ms(t: u32) -> u64 {
    t as u64 * TICK_MS * CLIENT_PPM / 1_000_000
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// True time advances one tick; every clock advances at its rate.
    Tick,
    /// A client opens its session (CreateSession proposed).
    Open(usize),
    /// A client asks for the lock, waiting in its queue if it is held.
    Acquire(usize),
    /// A client lets go of the lock (believes it no longer holds it from now).
    Release(usize),
    /// A client's keepalive reaches the leader.
    KeepAlive(usize),
    /// The leader's oldest uncommitted entry commits; the leader applies it if caught up.
    Commit,
    /// A member applies its next committed entry.
    Apply(usize),
    /// A follower installs a snapshot of the leader's applied prefix.
    Install(usize),
    /// The leader dies (or is deposed) and `member` wins the next term. With `keep_tail`, the
    /// old leader's uncommitted entries reached a majority and commit in the new term.
    Elect { member: usize, keep_tail: bool },
    /// The leader resumes every lease (`node.rs` `resume_leases`).
    Resume,
    /// The leader marks stale sessions and proposes its unlogged marks.
    Mark,
    /// The leader proposes the expiry of sessions whose deadline passed.
    Expire,
}

impl LeaseModel {
    /// Member `m`'s clock at the state's true time.
    fn now(&self, s: &State, m: usize) -> Instant {
        self.base + Duration::from_millis(s.t as u64 * TICK_MS * s.members[m].rate_ppm / 1_000_000)
    }

    fn ms_since_base(&self, i: Instant) -> u64 {
        i.duration_since(self.base).as_millis() as u64
    }

    fn resumed(&self, s: &State) -> bool {
        s.members[s.leader].leases.resumed_term() == Some(s.term)
    }

    fn duty_in_flight(&self, s: &State) -> bool {
        s.pending.iter().any(|e| e.term == s.term && e.is_duty())
    }

    /// The leader's `lease_duties` would propose marks now.
    fn marks_due(&self, s: &State) -> Option<Vec<(SessionId, u64)>> {
        if !self.resumed(s) || self.duty_in_flight(s) {
            return None;
        }
        let now = self.now(s, s.leader);
        let mut l = s.members[s.leader].leases.clone();
        l.mark_stale(now);
        let marks = l.marks_to_log(now);
        (!marks.is_empty()).then_some(marks)
    }

    fn expiry_due(&self, s: &State) -> bool {
        self.resumed(s)
            && !self.duty_in_flight(s)
            && s.members[s.leader]
                .leases
                .next_deadline()
                .is_some_and(|d| d <= self.now(s, s.leader))
    }

    /// The fixed code resumes once the leader applied its own first entry of the term.
    fn resume_due(&self, s: &State) -> bool {
        let l = &s.members[s.leader];
        !self.config.plant.resume_before_applied
            && !self.resumed(s)
            && l.applied > 0
            && s.log[l.applied - 1].term == s.term
    }

    fn leader_has_duty(&self, s: &State) -> bool {
        s.members[s.leader].applied < s.log.len()
            || !s.pending.is_empty()
            || self.resume_due(s)
            || self.marks_due(s).is_some()
            || self.expiry_due(s)
    }

    /// `node.rs` `resume_leases`, after its wait (or without it, with the plant).
    fn resume(&self, s: &mut State) {
        let now = self.now(s, s.leader);
        let term = s.term;
        let l = &mut s.members[s.leader];
        let live: Vec<_> = l.table.0.sessions().collect();
        l.leases.resume(term, live, now);
    }

    /// An entry commits: the check of early expiries happens here, when the cluster decides.
    fn append(&self, s: &mut State, entry: Entry) {
        let index = s.log.len() as u64 + 1;
        match &entry.what {
            What::Open { .. } => {
                s.committed_live.insert(SessionId(index));
            }
            What::Expire { ids } => {
                for id in ids {
                    if !s.committed_live.remove(id) {
                        continue;
                    }
                    let now_ms = client_ms(s.t);
                    for (c, client) in s.clients.iter().enumerate() {
                        if client.session == Some(*id) && now_ms < client.deadline_ms() {
                            s.early_expiries.push((c, s.t));
                        }
                    }
                }
            }
            _ => {}
        }
        s.log.push(entry);
    }

    /// Member `m` applies its next committed entry: the table, then the leases as
    /// `waiters.rs` `Observer::applied` keeps them (`Leases::applied`), then (on the leader)
    /// what the proposer does when its `propose` returns.
    fn apply_next(&self, s: &mut State, m: usize) {
        let i = s.members[m].applied;
        let entry = s.log[i].clone();
        s.members[m].applied += 1;
        let Some(cmd) = entry.command() else { return };
        let now = self.now(s, m);
        let member = &mut s.members[m];
        let applied = member.table.0.apply(i as u64 + 1, &cmd);
        member.leases.applied(&cmd.op, &applied.outcome, now);
        self.learn_grants(s, &entry, &applied);
        if m != s.leader || entry.term != s.term {
            // The proposer is gone or deposed: its call failed, nobody is answered.
            return;
        }
        match entry.what {
            What::Open {
                client,
                sent_ms,
                sent_t,
            } => {
                if let Outcome::SessionCreated { id, .. } = applied.outcome {
                    let c = &mut s.clients[client];
                    c.session = Some(id);
                    c.acked_sent_ms = sent_ms;
                    c.acked_t = sent_t;
                }
            }
            What::Renew {
                client,
                session,
                arrived,
                sent_ms,
                sent_t,
            } => {
                // `node.rs` `renew_through_log`, then the keepalive's answer.
                let live = matches!(&applied.outcome, Outcome::LeasesRenewed { ids } if ids.contains(&session));
                let renewed = live && s.members[m].leases.renew_logged(session, arrived);
                let c = &mut s.clients[client];
                c.keepalive_in_flight = false;
                if renewed && !c.lost {
                    acknowledge(c, sent_ms, sent_t);
                }
            }
            What::Mark { ref marks } => s.members[m].leases.marks_logged(marks),
            _ => {}
        }
    }

    /// A client hears of its grant as soon as any member applies it (it re-attaches to the
    /// request after any failure): the earliest it could, which only widens what it believes.
    fn learn_grants(&self, s: &mut State, entry: &Entry, applied: &Applied) {
        let mut grants: Vec<(SessionId, u64, u64)> = applied
            .handoffs
            .iter()
            .map(|h| (h.session, h.seq, h.token))
            .collect();
        if let (What::Acquire { session, seq, .. }, Outcome::Granted { token }) =
            (&entry.what, &applied.outcome)
        {
            grants.push((*session, *seq, *token));
        }
        for (session, seq, token) in grants {
            self.learn_grant(s, session, seq, token);
        }
    }

    fn learn_grant(&self, s: &mut State, session: SessionId, seq: u64, token: u64) {
        let Some(c) = s
            .clients
            .iter()
            .position(|c| c.session == Some(session) && c.waiting == Some(seq) && !c.lost)
        else {
            return;
        };
        if token <= s.last_token {
            s.token_regressions += 1;
        }
        s.last_token = s.last_token.max(token);
        let client = &mut s.clients[c];
        client.waiting = None;
        client.holds = Some(token);
    }

    fn step(&self, s: &mut State, action: &Action) -> bool {
        let cfg = &self.config;
        match *action {
            Action::Tick => {
                if s.t >= cfg.time_max || (cfg.urgent_leader && self.leader_has_duty(s)) {
                    return false;
                }
                s.t += 1;
                let now_ms = client_ms(s.t);
                for c in s.clients.iter_mut() {
                    if c.session.is_some() && !c.lost && now_ms >= c.deadline_ms() {
                        c.lost = true;
                        c.holds = None;
                        c.waiting = None;
                    }
                }
            }
            Action::Open(c) => {
                if s.clients[c].opened {
                    return false;
                }
                s.clients[c].opened = true;
                s.pending.push(Entry {
                    term: s.term,
                    what: What::Open {
                        client: c,
                        sent_ms: client_ms(s.t),
                        sent_t: s.t,
                    },
                });
            }
            Action::Acquire(c) => {
                let client = &mut s.clients[c];
                let Some(session) = client.session else {
                    return false;
                };
                if client.lost
                    || client.holds.is_some()
                    || client.waiting.is_some()
                    || client.acquires >= cfg.acquires_max
                {
                    return false;
                }
                client.acquires += 1;
                client.next_seq += 1;
                let seq = client.next_seq;
                client.waiting = Some(seq);
                s.pending.push(Entry {
                    term: s.term,
                    what: What::Acquire {
                        session,
                        seq,
                        client: c,
                    },
                });
            }
            Action::Release(c) => {
                if !cfg.releases {
                    return false;
                }
                let client = &mut s.clients[c];
                let (Some(session), Some(token)) = (client.session, client.holds) else {
                    return false;
                };
                if client.lost {
                    return false;
                }
                client.holds = None;
                client.next_seq += 1;
                let seq = client.next_seq;
                s.pending.push(Entry {
                    term: s.term,
                    what: What::Release {
                        session,
                        seq,
                        token,
                        client: c,
                    },
                });
            }
            Action::KeepAlive(c) => return self.keep_alive(s, c),
            Action::Commit => {
                if s.pending.is_empty() {
                    return false;
                }
                let entry = s.pending.remove(0);
                self.append(s, entry);
                if s.members[s.leader].applied + 1 == s.log.len() {
                    self.apply_next(s, s.leader);
                }
            }
            Action::Apply(m) => {
                if s.members[m].applied >= s.log.len() {
                    return false;
                }
                self.apply_next(s, m);
            }
            Action::Install(m) => {
                let k = s.members[s.leader].applied;
                if m == s.leader || s.installs >= cfg.installs_max || s.members[m].applied >= k {
                    return false;
                }
                s.installs += 1;
                let table = s.members[s.leader].table.clone();
                let now = self.now(s, m);
                let member = &mut s.members[m];
                member.applied = k;
                member.leases.installed(table.0.sessions(), now);
                member.table = table;
                // `Waiters::recheck`: a call whose request the installed table shows granted
                // is answered.
                for c in 0..s.clients.len() {
                    let (Some(session), Some(seq)) = (s.clients[c].session, s.clients[c].waiting)
                    else {
                        continue;
                    };
                    if let Some(RequestState::Done(Outcome::Granted { token })) =
                        s.members[m].table.0.request_state(session, seq)
                    {
                        self.learn_grant(s, session, seq, token);
                    }
                }
            }
            Action::Elect { member, keep_tail } => {
                if member == s.leader
                    || s.elections >= cfg.elections_max
                    || (keep_tail && s.pending.is_empty())
                {
                    return false;
                }
                let old = s.leader;
                s.members[old].leases.stepped_down();
                for entry in std::mem::take(&mut s.pending) {
                    // The old leader's calls fail, committed or not.
                    match &entry.what {
                        What::Renew { client, .. } => {
                            s.clients[*client].keepalive_in_flight = false
                        }
                        What::Expire { ids } => s.members[old].leases.expiry_failed(ids),
                        What::Acquire { client, .. } if !keep_tail => {
                            s.clients[*client].waiting = None
                        }
                        _ => {}
                    }
                    if keep_tail {
                        self.append(s, entry);
                    }
                }
                s.elections += 1;
                s.term += 1;
                s.leader = member;
                s.pending.push(Entry {
                    term: s.term,
                    what: What::Blank,
                });
                if cfg.plant.resume_before_applied {
                    self.resume(s);
                }
            }
            Action::Resume => {
                if !self.resume_due(s) {
                    return false;
                }
                self.resume(s);
            }
            Action::Mark => {
                let Some(marks) = self.marks_due(s) else {
                    return false;
                };
                let now = self.now(s, s.leader);
                let l = &mut s.members[s.leader].leases;
                l.mark_stale(now);
                debug_assert_eq!(l.marks_to_log(now), marks);
                s.pending.push(Entry {
                    term: s.term,
                    what: What::Mark { marks },
                });
            }
            Action::Expire => {
                if !self.expiry_due(s) {
                    return false;
                }
                let now = self.now(s, s.leader);
                let ids = s.members[s.leader].leases.take_expired(now);
                if ids.is_empty() {
                    return false;
                }
                s.pending.push(Entry {
                    term: s.term,
                    what: What::Expire { ids },
                });
            }
        }
        true
    }

    /// `service.rs` `keep_alive`: the leader confirms its term (which waits until it applied
    /// everything committed), checks the session in its table, then asks its leases.
    fn keep_alive(&self, s: &mut State, c: usize) -> bool {
        let client = &s.clients[c];
        let Some(session) = client.session else {
            return false;
        };
        let sent_ms = client_ms(s.t);
        // The client library renews a third of a TTL after its last acknowledged renewal, or
        // later (retries come after a first attempt): never sooner.
        let due_ms = client.acked_sent_ms
            + TTL_MS / latchkey_core::limits::CLIENT_RENEWAL_TTL_DIVISOR as u64;
        if client.lost
            || client.keepalive_in_flight
            || sent_ms < due_ms
            || s.members[s.leader].applied < s.log.len()
        {
            return false;
        }
        let arrived = self.now(s, s.leader);
        let term = s.term;
        let leader = &mut s.members[s.leader];
        let decision = if leader.table.0.session_valid(&key(session, c)) {
            leader.leases.renew(session, arrived, term)
        } else {
            Renew::Gone
        };
        let client = &mut s.clients[c];
        match decision {
            Renew::NotResumed => return false,
            Renew::Renewed => acknowledge(client, sent_ms, s.t),
            Renew::Gone => {
                client.lost = true;
                client.holds = None;
                client.waiting = None;
            }
            Renew::NeedsLog => {
                client.keepalive_in_flight = true;
                s.pending.push(Entry {
                    term,
                    what: What::Renew {
                        client: c,
                        session,
                        arrived,
                        sent_ms,
                        sent_t: s.t,
                    },
                });
            }
        }
        true
    }
}

/// `session.rs` `ClientLease::acknowledged`: an older acknowledgement never moves the deadline back.
fn acknowledge(c: &mut Client, sent_ms: u64, sent_t: u32) {
    if sent_ms >= c.acked_sent_ms {
        c.acked_sent_ms = sent_ms;
        c.acked_t = sent_t;
    }
}

impl Model for LeaseModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let cfg = &self.config;
        let mut out = Vec::new();
        // Every member's clock at either edge of the drift bound.
        let assignments: Vec<Vec<u64>> = match &cfg.rates_ppm {
            Some(r) => vec![r.clone()],
            None => (0..(1u32 << cfg.members))
                .map(|bits| {
                    (0..cfg.members)
                        .map(|m| {
                            if bits & (1 << m) != 0 {
                                FAST_PPM
                            } else {
                                SLOW_PPM
                            }
                        })
                        .collect()
                })
                .collect(),
        };
        for rates in assignments {
            let members = (0..cfg.members)
                .map(|m| Member {
                    rate_ppm: rates[m],
                    applied: 1,
                    table: Table::default(),
                    leases: Leases::new(cfg.plant),
                })
                .collect();
            // Member 0 leads term 1; its blank entry is committed and applied everywhere.
            let mut s = State {
                t: 0,
                term: 1,
                leader: 0,
                elections: 0,
                installs: 0,
                log: vec![Entry {
                    term: 1,
                    what: What::Blank,
                }],
                pending: Vec::new(),
                members,
                clients: vec![Client::default(); cfg.clients],
                committed_live: BTreeSet::new(),
                last_token: 0,
                early_expiries: Vec::new(),
                token_regressions: 0,
            };
            self.resume(&mut s);
            if cfg.warm_start {
                s = self.warm(s);
            }
            out.push(s);
        }
        out
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        actions.push(Action::Tick);
        for c in 0..self.config.clients {
            actions.push(Action::KeepAlive(c));
            actions.push(Action::Acquire(c));
            actions.push(Action::Release(c));
            actions.push(Action::Open(c));
        }
        actions.push(Action::Commit);
        actions.push(Action::Resume);
        actions.push(Action::Mark);
        actions.push(Action::Expire);
        for m in 0..self.config.members {
            actions.push(Action::Apply(m));
            actions.push(Action::Install(m));
            actions.push(Action::Elect {
                member: m,
                keep_tail: false,
            });
            if !s.pending.is_empty() {
                actions.push(Action::Elect {
                    member: m,
                    keep_tail: true,
                });
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut next = s.clone();
        self.step(&mut next, &action).then_some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(NO_DOUBLE_GRANT, |_, s: &State| {
                s.clients.iter().filter(|c| c.believes()).count() <= 1
            }),
            Property::always(NO_EARLY_EXPIRY, |_, s: &State| s.early_expiries.is_empty()),
            Property::always(TOKENS_INCREASE, |_, s: &State| s.token_regressions == 0),
            Property::always(GONE_HOLDER_EXPIRES, |m: &LeaseModel, s: &State| {
                !m.config.urgent_leader
                    || s.clients.iter().all(|c| {
                        c.session.is_none_or(|id| {
                            !s.committed_live.contains(&id)
                                || s.t as u64 <= c.acked_t as u64 + GONE_HOLDER_BOUND_TICKS
                        })
                    })
            }),
            Property::sometimes(REACHES_INSTALL, |_, s: &State| s.installs > 0),
            Property::sometimes(REACHES_ELECTED_BEHIND, |_, s: &State| {
                let l = &s.members[s.leader];
                l.applied < s.log.len() && s.log[l.applied].term < s.term
            }),
            Property::sometimes(REACHES_LOGGED_RENEWAL, |_, s: &State| {
                s.log.iter().any(|e| match e.what {
                    What::Renew {
                        client, sent_ms, ..
                    } => sent_ms > 0 && s.clients[client].acked_sent_ms == sent_ms,
                    _ => false,
                })
            }),
            Property::sometimes(REACHES_GRANT_AFTER_EXPIRY, |_, s: &State| {
                s.clients.iter().filter_map(|c| c.holds).any(|token| {
                    s.log
                        .iter()
                        .enumerate()
                        .any(|(i, e)| matches!(e.what, What::Expire { .. }) && (i as u64) < token)
                })
            }),
        ]
    }
}

pub const NO_DOUBLE_GRANT: &str = "no two clients believe they hold the lock at once";
pub const NO_EARLY_EXPIRY: &str = "no session expires before its client's deadline";
pub const TOKENS_INCREASE: &str = "a fencing token never repeats or decreases";
pub const GONE_HOLDER_EXPIRES: &str = "a gone holder's session ends within 2 x TTL";
pub const REACHES_INSTALL: &str = "reached: a follower installs a snapshot";
pub const REACHES_ELECTED_BEHIND: &str = "reached: a leader elected before applying the tail";
pub const REACHES_LOGGED_RENEWAL: &str = "reached: a logged renewal is acknowledged";
pub const REACHES_GRANT_AFTER_EXPIRY: &str = "reached: a lock granted after an expiry";
/// The safety properties (each a must-hold invariant).
pub const SAFETY: [&str; 4] = [
    NO_DOUBLE_GRANT,
    NO_EARLY_EXPIRY,
    TOKENS_INCREASE,
    GONE_HOLDER_EXPIRES,
];
/// The states the bugs need, which a check of the fixed code must reach.
pub const COVERAGE: [&str; 4] = [
    REACHES_INSTALL,
    REACHES_ELECTED_BEHIND,
    REACHES_LOGGED_RENEWAL,
    REACHES_GRANT_AFTER_EXPIRY,
];

impl LeaseModel {
    /// The warm start: every client opens, client 0 takes the lock, the others queue for it,
    /// and every member applies everything, all at tick 0, by the model's own actions.
    fn warm(&self, mut s: State) -> State {
        let mut steps = Vec::new();
        for c in 0..self.config.clients {
            steps.extend([
                Action::Open(c),
                Action::Commit,
                Action::Acquire(c),
                Action::Commit,
            ]);
        }
        for a in steps {
            s = self
                .next_state(&s, a.clone())
                .unwrap_or_else(|| panic!("warm start: {a:?} not enabled"));
        }
        for m in 1..self.config.members {
            while s.members[m].applied < s.log.len() {
                s = self
                    .next_state(&s, Action::Apply(m))
                    .expect("apply enabled");
            }
        }
        s
    }

    /// A counterexample as one line per step: the tick, who acted, what it did.
    pub fn trace(&self, path: &Path<State, Action>) -> String {
        let mut out = String::new();
        let steps = path.clone().into_vec();
        let first = &steps[0].0;
        let rates: Vec<String> = first
            .members
            .iter()
            .enumerate()
            .map(|(m, mem)| {
                let r = if mem.rate_ppm == FAST_PPM {
                    "fast"
                } else {
                    "slow"
                };
                format!("m{m} {r}")
            })
            .collect();
        let _ = writeln!(
            out,
            "clocks: {}, clients slow; TTL {} ticks of {TICK_MS} ms",
            rates.join(", "),
            TTL_TICKS
        );
        let _ = writeln!(out, "start: {}", self.summary(first));
        for (i, pair) in steps.windows(2).enumerate() {
            let (prev, Some(action)) = (&pair[0].0, &pair[0].1) else {
                continue;
            };
            let next = &pair[1].0;
            let _ = writeln!(out, "{:>3}. {}", i + 1, self.describe(prev, action, next));
        }
        let last = &steps[steps.len() - 1].0;
        let _ = writeln!(out, "end:   {}", self.summary(last));
        out
    }

    fn summary(&self, s: &State) -> String {
        let clients: Vec<String> = s
            .clients
            .iter()
            .enumerate()
            .map(|(c, cl)| {
                let session = cl.session.map_or("-".into(), |id| format!("s{id}"));
                let holds = match (cl.lost, cl.holds) {
                    (true, _) => "lost".to_string(),
                    (false, Some(t)) => format!("holds L (token {t})"),
                    (false, None) => "holds nothing".to_string(),
                };
                format!(
                    "c{c} {session} {holds}, deadline {} ms on its clock",
                    cl.deadline_ms()
                )
            })
            .collect();
        let members: Vec<String> = s
            .members
            .iter()
            .enumerate()
            .map(|(m, mem)| format!("m{m} applied {}/{}", mem.applied, s.log.len()))
            .collect();
        format!(
            "t={} term {} leader m{}; {}; {}",
            s.t,
            s.term,
            s.leader,
            members.join(", "),
            clients.join("; ")
        )
    }

    fn describe(&self, prev: &State, action: &Action, next: &State) -> String {
        let at = format!("[t={}]", prev.t);
        let l = prev.leader;
        let ms = |s: &State, m: usize| self.ms_since_base(self.now(s, m));
        let what = match action {
            Action::Tick => {
                let lost: Vec<String> = (0..next.clients.len())
                    .filter(|&c| next.clients[c].lost && !prev.clients[c].lost)
                    .map(|c| format!("c{c}"))
                    .collect();
                let lost = if lost.is_empty() {
                    String::new()
                } else {
                    format!("; deadline passed for {}", lost.join(", "))
                };
                format!("time advances to t={}{lost}", next.t)
            }
            Action::Open(c) => format!("c{c} opens a session"),
            Action::Acquire(c) => format!("c{c} asks for L (waits if held)"),
            Action::Release(c) => format!("c{c} releases L"),
            Action::KeepAlive(c) => {
                let cl = &next.clients[*c];
                let outcome = if cl.lost {
                    "answered gone".to_string()
                } else if cl.keepalive_in_flight {
                    format!(
                        "marked: m{l} proposes RenewLeases (arrived {} ms)",
                        ms(prev, l)
                    )
                } else {
                    format!(
                        "renewed in memory; c{c} deadline now {} ms",
                        cl.deadline_ms()
                    )
                };
                format!(
                    "c{c} sends a keepalive at {} ms (its clock) to m{l}: {outcome}",
                    client_ms(prev.t)
                )
            }
            Action::Commit => {
                let e = &next.log[next.log.len() - 1];
                let applied = if next.members[l].applied == next.log.len() {
                    format!(", m{l} applies it at {} ms", ms(prev, l))
                } else {
                    String::new()
                };
                format!(
                    "entry {} commits: {}{applied}",
                    next.log.len(),
                    self.entry_text(e)
                )
            }
            Action::Apply(m) => {
                let i = prev.members[*m].applied;
                format!(
                    "m{m} applies entry {} ({}) at {} ms (its clock)",
                    i + 1,
                    self.entry_text(&prev.log[i]),
                    ms(prev, *m)
                )
            }
            Action::Install(m) => format!(
                "m{m} installs a snapshot of entries 1..={} at {} ms (its clock)",
                next.members[*m].applied,
                ms(prev, *m)
            ),
            Action::Elect { member, keep_tail } => {
                let tail = if *keep_tail {
                    "its uncommitted entries commit"
                } else {
                    "its uncommitted entries are lost"
                };
                let resumed = if self.config.plant.resume_before_applied {
                    format!(
                        "; resumes leases at once at {} ms (PLANTED bug 2)",
                        ms(prev, *member)
                    )
                } else {
                    String::new()
                };
                format!(
                    "m{l} dies, {tail}; m{member} wins term {} having applied {}/{} entries{resumed}",
                    next.term,
                    next.members[*member].applied,
                    next.log.len()
                )
            }
            Action::Resume => format!(
                "m{l} has applied its first entry of term {}: resumes every lease at {} ms",
                prev.term,
                ms(prev, l)
            ),
            Action::Mark => format!(
                "m{l} proposes {}",
                self.entry_text(&next.pending[next.pending.len() - 1])
            ),
            Action::Expire => format!(
                "m{l} finds deadlines passed at {} ms, proposes {}",
                ms(prev, l),
                self.entry_text(&next.pending[next.pending.len() - 1])
            ),
        };
        let mut line = format!("{at} {what}");
        for (c, t) in next.early_expiries.iter().skip(prev.early_expiries.len()) {
            let _ = write!(
                line,
                "  <-- c{c}'s session expired at t={t} while c{c}'s deadline has not passed"
            );
        }
        for c in 0..next.clients.len() {
            if next.clients[c].holds.is_some() && prev.clients[c].holds.is_none() {
                let _ = write!(
                    line,
                    "  <-- c{c} now holds L (token {})",
                    next.clients[c].holds.unwrap()
                );
            }
        }
        line
    }

    fn entry_text(&self, e: &Entry) -> String {
        match &e.what {
            What::Blank => format!("blank entry of term {}", e.term),
            What::Open { client, .. } => format!("CreateSession for c{client}"),
            What::Acquire { client, .. } => format!("Acquire L by c{client}"),
            What::Release { client, token, .. } => {
                format!("Release L (token {token}) by c{client}")
            }
            What::Renew {
                client, session, ..
            } => format!("RenewLeases [s{session}] for c{client}"),
            What::Mark { marks } => {
                let m: Vec<String> = marks
                    .iter()
                    .map(|(id, u)| format!("s{id} unrenewed {u} ms"))
                    .collect();
                format!("MarkLeases [{}]", m.join(", "))
            }
            What::Expire { ids } => {
                let ids: Vec<String> = ids.iter().map(|id| format!("s{id}")).collect();
                format!("ExpireSessions [{}]", ids.join(", "))
            }
        }
    }
}
