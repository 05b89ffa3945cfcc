//! What happened in one run: the clients' operations, the resource's decisions, and what the
//! servers wrote to their logs. Times are true simulation time (the same for every host), so
//! checkers can order events that hosts measured on drifting clocks.

use std::collections::BTreeMap;
use std::fmt;
use std::hash::{DefaultHasher, Hasher};
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use latchkey_core::{Mode, Op};
use latchkey_server::ProbeEvent;

/// Who issued an operation: a client and the generation of its session (a client that lost
/// its session starts a new one, a new "thread" for the linearizability tester).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Actor {
    pub client: u32,
    pub generation: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpKind {
    Acquire,
    Release { token: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ret {
    Granted {
        token: u64,
    },
    /// A wait that ended without a grant.
    NotGranted,
    Released,
    NotHolder,
}

#[derive(Debug, Clone)]
pub enum Event {
    /// A client operation started. `id` pairs it with its [`Event::Return`].
    Invoke {
        id: u64,
        actor: Actor,
        session: u64,
        lock: String,
        op: OpKind,
        at: Duration,
    },
    /// A client operation answered. Operations without a Return are indeterminate.
    Return { id: u64, ret: Ret, at: Duration },
    /// The client checked its own deadline and found it still held its locks.
    HoldCheck {
        actor: Actor,
        session: u64,
        lock: String,
        token: u64,
        at: Duration,
    },
    /// The client's deadline passed: it reported its locks lost.
    Lost {
        actor: Actor,
        session: u64,
        at: Duration,
    },
}

/// One election operation of a client (issue #32, `RunConfig::elections`), with its answer
/// if it had one. Kept apart from [`Event`]: the mutex checkers do not model elections.
#[derive(Debug, Clone)]
pub struct ElectionOp {
    pub actor: Actor,
    pub session: u64,
    /// The election's name.
    pub name: String,
    pub kind: ElectionKind,
    pub invoked: Duration,
    /// `None`: indeterminate (no answer, or one that says nothing of the outcome).
    pub ret: Option<(ElectionRet, Duration)>,
}

/// What a client asked of an election. Every value a run proclaims or campaigns with is its
/// own (`c<client>.g<generation>.<n>`), so a read names the operation it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElectionKind {
    Campaign {
        value: String,
    },
    Proclaim {
        token: u64,
        value: String,
    },
    Resign {
        token: u64,
    },
    /// A read of the leader (`Client::leader`).
    Read,
    /// The leader asked its leadership whether it may be lost and found it held (an instant:
    /// answered when invoked), as a `HoldCheck` of a lock.
    Leading {
        token: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElectionRet {
    /// The campaign won: the term's token.
    Leads {
        token: u64,
    },
    Proclaimed,
    /// `not-election-leader`: the term had ended.
    NotLeader,
    Resigned,
    NotHeld,
    /// The leader read: `(session, token, value)`, or nobody.
    Leader(Option<(u64, u64, String)>),
    Leading,
}

/// One write of a critical section to the fenced resource.
#[derive(Debug, Clone)]
pub struct ResourceOp {
    pub actor: Actor,
    pub lock: String,
    pub token: u64,
    pub at: Duration,
    /// `Begin` reads the value, `Commit` writes the value read plus one.
    pub step: Step,
    pub accepted: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Begin { read: u64 },
    Commit { wrote: u64 },
}

/// The lock-table operations an entry's `op` carries, in order: each operation of an
/// `Op::Batch` (issue #35, `ServerConfig::coalesce`) as if it were an entry of its own at the
/// entry's index (the table applies it so: its grants take that index as their token), any
/// other operation itself, and none for an entry without one (a membership change, a blank).
/// Every reader of appended or committed entries' operations in the simulation goes through
/// this (or [`Appended::ops`], [`Committed::ops`]), so that a batch entry is read like the
/// entries it stands for.
///
/// Left out: a second acquire of permits of one name in a batch, which the table always
/// refuses (`Rejection::BatchConflict`) and the leader proposes again alone, later (seed 58
/// with `--coalesce` once read such a refused acquire as queued at the batch and the `fifo`
/// checker blamed a grant it had not been ahead of). The other refusals of a batch (a release
/// of a name, or a close of a session holding one, that the batch granted) depend on the
/// table's state, which the history does not hold: such an operation is read as applied at
/// the batch, then again where it was sent alone; a close so read ends its session early, which
/// only makes the `deadline` rule stricter (a client closes a session it no longer uses).
pub fn ops_in(op: &Option<Op>) -> impl Iterator<Item = &Op> + '_ {
    let (ops, batch): (&[Op], bool) = match op {
        Some(Op::Batch(ops)) => (ops, true),
        Some(op) => (std::slice::from_ref(op), false),
        None => (&[], false),
    };
    let mut permits: Vec<&str> = Vec::new();
    ops.iter().filter(move |op| match op {
        Op::AcquireWith {
            name,
            mode: latchkey_core::Mode::Permits(_),
            ..
        } if batch => {
            let first = !permits.contains(&name.as_str());
            permits.push(name);
            first
        }
        _ => true,
    })
}

/// A log entry some server appended, by log id.
#[derive(Debug, Clone)]
pub struct Appended {
    pub index: u64,
    /// `(term, leader node)` of the entry's log id.
    pub leader: (u64, u64),
    pub op: Option<Op>,
    /// When the first member appended it (the leader, normally).
    pub first_at: Duration,
}

impl Appended {
    /// The operations the entry carries, a batch's each on its own ([`ops_in`]).
    pub fn ops(&self) -> impl Iterator<Item = &Op> + '_ {
        ops_in(&self.op)
    }
}

/// A committed entry, as the first member that learned of the commit saw it.
#[derive(Debug, Clone)]
pub struct Committed {
    pub leader: (u64, u64),
    pub op: Option<Op>,
    /// When a member first saved a commit index covering it: the entry was committed by then.
    pub known_at: Duration,
    /// [`entry_digest`] of the whole entry (log id's leader and payload, including what `op`
    /// leaves out: the leader's timestamp, membership changes), compared with every later
    /// sighting of this index.
    pub digest: u64,
    /// The member that first saw it committed.
    pub seen_by: u64,
}

impl Committed {
    /// The operations the entry carries, a batch's each on its own ([`ops_in`]).
    pub fn ops(&self) -> impl Iterator<Item = &Op> + '_ {
        ops_in(&self.op)
    }
}

/// One entry in a member's log, as [`HistoryData::record_commits`] compares it.
pub trait LogEntry {
    /// `(term, leader node)` of the entry's log id.
    fn leader(&self) -> (u64, u64);
    /// [`entry_digest`] of the entry.
    fn digest(&self) -> u64;
    /// The lock-table operation it carries, if any.
    fn op(&self) -> Option<Op>;
}

/// A digest of a log entry: its log id's `(term, leader node)` and the `Debug` rendering of its
/// whole payload (every payload type in the log renders all its fields, and only from ordered
/// collections, so equal entries give equal digests). Only compared within one run.
pub fn entry_digest(leader: (u64, u64), payload: &dyn fmt::Debug) -> u64 {
    struct Feed<'a>(&'a mut DefaultHasher);
    impl fmt::Write for Feed<'_> {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            self.0.write(s.as_bytes());
            Ok(())
        }
    }
    let mut hasher = DefaultHasher::new();
    hasher.write_u64(leader.0);
    hasher.write_u64(leader.1);
    fmt::write(&mut Feed(&mut hasher), format_args!("{payload:?}")).expect("hashing never fails");
    hasher.finish()
}

#[derive(Debug, Default)]
pub struct HistoryData {
    pub events: Vec<Event>,
    pub resource: Vec<ResourceOp>,
    /// Keyed by `(index, term, leader node)`.
    pub appended: BTreeMap<(u64, u64, u64), Appended>,
    /// Every index any member saw committed, with the entry it saw first. Bounded by the
    /// number of entries one run commits (a run is minutes of simulated time), so it is kept
    /// whole; the grant checks need the entries anyway. Each member's sighting is compared
    /// with it and then dropped, so members add nothing per index.
    pub committed: BTreeMap<u64, Committed>,
    /// Per member, `(life, index)`: the highest index compared against [`Self::committed`] in
    /// that life of the member (its disk's crash generation). One element per member.
    pub commit_checked: BTreeMap<u64, (u64, u64)>,
    /// Violations found while recording (a committed index whose entry changed).
    pub recorded_violations: Vec<String>,
    /// The newest leader seen appending its own entries: `(term, node)`.
    pub leader: Option<(u64, u64)>,
    /// The final state of each lock after the cluster restarted at the end: `(session, token)`.
    pub final_holders: BTreeMap<String, Option<(u64, u64)>>,
    /// When the faults stopped.
    pub healed_at: Option<Duration>,
    /// What the nodes told the simulation's probe (lease-relevant states), in order.
    pub probed: Vec<Probed>,
    /// Per session: the latest deadline its client's library computed (the send time of its
    /// last acknowledged renewal + TTL − margin, on the client's drifting clock), converted to
    /// true time. Only grows: the library never moves a deadline back.
    pub client_deadlines: BTreeMap<u64, Duration>,
    /// Every deadline a client's library computed, in the order they were computed: `(true
    /// time computed, session, deadline in true time)`. [`Self::client_deadlines`] is its
    /// running maximum at the end; the resume check needs it at each moment.
    pub client_deadline_log: Vec<(Duration, u64, Duration)>,
    /// Every time a leader resumed the leases: each session's lease end, in true time.
    pub resumed_leases: Vec<ResumedLeases>,
    /// Every term a node began as leader: what it knew was committed when it appended its
    /// first entry of the term.
    pub term_starts: Vec<TermStart>,
    /// Per member: the index of the last entry it appended to its log, and `(term, leader
    /// node)` of that entry's log id. One element per member; the renewal-then-failover
    /// schedule reads it to see that followers hold a leader's entry.
    pub last_appended: BTreeMap<u64, (u64, (u64, u64))>,
    /// By invocation id: the mode of every acquire that was not exclusive (a reader or a
    /// permit, issue #32); an acquire not here took its lock exclusively (a mutex or a writer).
    /// Kept beside the events so that histories recorded without modes (the nemesis) read as
    /// all exclusive.
    pub modes: BTreeMap<u64, Mode>,
    /// By invocation id: the lock-delay every acquire that asked for one asked for (issue #32
    /// item 4, `RunConfig::lock_delay`); an acquire not here asked for none.
    pub delays: BTreeMap<u64, Duration>,
    /// Every election operation (`RunConfig::elections`), in invocation order; empty without.
    pub elections: Vec<ElectionOp>,
    /// The `Batch` calls of two or more operations the clients' libraries sent
    /// (`RunConfig::client_batch`; told through `ClientEnv::batch_sent`). Counted for the
    /// whole run: a group's view ([`Self::of_group`]) has none.
    pub client_batches_of_several: usize,
    next_id: u64,
}

/// One event a node reported through `latchkey_server::Probe`.
#[derive(Debug, Clone)]
pub struct Probed {
    pub at: Duration,
    pub node: u64,
    pub event: ProbeEvent,
}

/// A leader resumed every lease (`ProbeEvent::LeasesResumed`, with the leases).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumedLeases {
    pub at: Duration,
    pub node: u64,
    pub term: u64,
    /// `(session, true time its resumed lease ends)`: the end on the node's own clock,
    /// converted with that clock's drift.
    pub until: Vec<(u64, Duration)>,
}

/// A node appended its first entry of `term` as its leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermStart {
    pub term: u64,
    pub node: u64,
    /// The index of that first entry.
    pub first_index: u64,
    /// The highest commit index the node had saved by then (in any life): entries above it
    /// were not applied on it yet.
    pub commit_index: Option<u64>,
    pub at: Duration,
}

/// The shared, append-only record of a run.
#[derive(Debug, Clone, Default)]
pub struct History(Arc<Mutex<HistoryData>>);

impl History {
    pub fn with<T>(&self, f: impl FnOnce(&mut HistoryData) -> T) -> T {
        f(&mut self.0.lock().expect("history lock"))
    }

    pub fn invoke(&self, actor: Actor, session: u64, lock: &str, op: OpKind, at: Duration) -> u64 {
        self.with(|h| {
            h.next_id += 1;
            let id = h.next_id;
            h.events.push(Event::Invoke {
                id,
                actor,
                session,
                lock: lock.to_owned(),
                op,
                at,
            });
            id
        })
    }

    /// Like [`Self::invoke`] of an acquire, in `mode`.
    pub fn invoke_acquire(
        &self,
        actor: Actor,
        session: u64,
        lock: &str,
        mode: Mode,
        at: Duration,
    ) -> u64 {
        let id = self.invoke(actor, session, lock, OpKind::Acquire, at);
        if mode != Mode::Exclusive {
            self.with(|h| h.modes.insert(id, mode));
        }
        id
    }

    /// Records that an election operation started; the index pairs it with
    /// [`Self::election_ret`].
    pub fn election_invoke(
        &self,
        actor: Actor,
        session: u64,
        name: &str,
        kind: ElectionKind,
        at: Duration,
    ) -> usize {
        self.with(|h| {
            h.elections.push(ElectionOp {
                actor,
                session,
                name: name.to_owned(),
                kind,
                invoked: at,
                ret: None,
            });
            h.elections.len() - 1
        })
    }

    pub fn election_ret(&self, i: usize, ret: ElectionRet, at: Duration) {
        self.with(|h| h.elections[i].ret = Some((ret, at)));
    }

    pub fn ret(&self, id: u64, ret: Ret, at: Duration) {
        self.with(|h| h.events.push(Event::Return { id, ret, at }));
    }

    pub fn event(&self, e: Event) {
        self.with(|h| h.events.push(e));
    }

    /// The client of `session` computed `deadline` (true time) as its lease deadline.
    pub fn client_deadline(&self, session: u64, deadline: Duration) {
        self.with(|h| {
            let d = h.client_deadlines.entry(session).or_default();
            *d = (*d).max(deadline);
            h.client_deadline_log
                .push((crate::clock::true_now(), session, deadline));
        });
    }

    pub fn snapshot(&self) -> HistoryData {
        self.with(|h| HistoryData {
            events: h.events.clone(),
            resource: h.resource.clone(),
            appended: h.appended.clone(),
            committed: h.committed.clone(),
            commit_checked: h.commit_checked.clone(),
            recorded_violations: h.recorded_violations.clone(),
            leader: h.leader,
            final_holders: h.final_holders.clone(),
            healed_at: h.healed_at,
            probed: h.probed.clone(),
            client_deadlines: h.client_deadlines.clone(),
            client_deadline_log: h.client_deadline_log.clone(),
            resumed_leases: h.resumed_leases.clone(),
            term_starts: h.term_starts.clone(),
            last_appended: h.last_appended.clone(),
            modes: h.modes.clone(),
            delays: h.delays.clone(),
            elections: h.elections.clone(),
            client_batches_of_several: h.client_batches_of_several,
            next_id: h.next_id,
        })
    }
}

impl HistoryData {
    /// Records that `node`, in its life `life`, saved commit index `upto` (openraft then
    /// applies up to it), and compares every entry that became committed for it: every index
    /// above the last one it compared in this life, up to `upto`, not only the newest (a
    /// lagging member learns of many at once, most of them already seen committed by others).
    /// `held(range)` yields the entries the member's log holds in `range`, by index. In a new
    /// life the member's log may have lost and refetched entries, so everything it holds up to
    /// `upto` is compared again. Entries it no longer holds (purged into a snapshot) are
    /// skipped.
    pub fn record_commits<E: LogEntry, I: IntoIterator<Item = (u64, E)>>(
        &mut self,
        node: u64,
        life: u64,
        upto: u64,
        held: impl FnOnce(RangeInclusive<u64>) -> I,
        at: Duration,
    ) {
        let from = match self.commit_checked.get(&node) {
            Some(&(l, checked)) if l == life => checked.saturating_add(1),
            _ => 0,
        };
        if from > upto {
            return;
        }
        self.commit_checked.insert(node, (life, upto));
        for (index, e) in held(from..=upto) {
            self.record_commit(node, upto, index, &e, at);
        }
    }

    /// Records that `node` holds `entry` at `index`, under its commit index `upto`. The first
    /// sighting fixes the committed entry; a later one with another digest means a committed
    /// entry was replaced, which [`crate::checkers`] reports.
    pub fn record_commit(
        &mut self,
        node: u64,
        upto: u64,
        index: u64,
        entry: &impl LogEntry,
        at: Duration,
    ) {
        let digest = entry.digest();
        match self.committed.get(&index) {
            Some(c) if c.digest != digest => self.recorded_violations.push(format!(
                "committed entry {index} changed: node {} saw it committed by {} as {}, node \
                 {node} now has {} under commit index {upto} at {}",
                c.seen_by,
                secs(c.known_at),
                describe(c.leader, &c.op, c.digest),
                describe(entry.leader(), &entry.op(), digest),
                secs(at),
            )),
            Some(_) => {}
            None => {
                self.committed.insert(
                    index,
                    Committed {
                        leader: entry.leader(),
                        op: entry.op(),
                        known_at: at,
                        digest,
                        seen_by: node,
                    },
                );
            }
        }
    }

    /// What group `group` of `groups` saw: the log records of `log` (that group's members'
    /// logs and probes) and, of this history's client records, those of the group's locks and
    /// sessions.
    pub fn of_group(&self, log: &HistoryData, group: u32, groups: u32) -> HistoryData {
        let lock_in = |name: &str| latchkey_core::group_of(name, groups) == group;
        let session_in = |id: u64| {
            latchkey_core::group_of_session(latchkey_core::SessionId(id), groups) == group
        };
        let mut kept = std::collections::BTreeSet::new();
        let events = self
            .events
            .iter()
            .filter(|e| match e {
                Event::Invoke { id, lock, .. } => lock_in(lock) && kept.insert(*id),
                Event::Return { id, .. } => kept.contains(id),
                Event::HoldCheck { lock, .. } => lock_in(lock),
                Event::Lost { session, .. } => session_in(*session),
            })
            .cloned()
            .collect();
        HistoryData {
            events,
            resource: (self.resource.iter())
                .filter(|r| lock_in(&r.lock))
                .cloned()
                .collect(),
            appended: log.appended.clone(),
            committed: log.committed.clone(),
            commit_checked: log.commit_checked.clone(),
            recorded_violations: log.recorded_violations.clone(),
            leader: log.leader,
            final_holders: (self.final_holders.iter())
                .filter(|(name, _)| lock_in(name))
                .map(|(name, holder)| (name.clone(), *holder))
                .collect(),
            healed_at: self.healed_at,
            probed: log.probed.clone(),
            client_deadlines: (self.client_deadlines.iter())
                .filter(|(id, _)| session_in(**id))
                .map(|(id, d)| (*id, *d))
                .collect(),
            client_deadline_log: (self.client_deadline_log.iter())
                .filter(|(_, id, _)| session_in(*id))
                .copied()
                .collect(),
            resumed_leases: log.resumed_leases.clone(),
            term_starts: log.term_starts.clone(),
            last_appended: log.last_appended.clone(),
            modes: self.modes.clone(),
            delays: self.delays.clone(),
            elections: (self.elections.iter())
                .filter(|e| lock_in(&e.name))
                .cloned()
                .collect(),
            client_batches_of_several: 0,
            next_id: self.next_id,
        }
    }

    /// Every operation with its answer (if any), in invocation order.
    pub fn operations(&self) -> Vec<Operation> {
        let mut ops: Vec<Operation> = Vec::new();
        let mut by_id = BTreeMap::new();
        for e in &self.events {
            match e {
                Event::Invoke {
                    id,
                    actor,
                    session,
                    lock,
                    op,
                    at,
                } => {
                    by_id.insert(*id, ops.len());
                    ops.push(Operation {
                        actor: *actor,
                        session: *session,
                        lock: lock.clone(),
                        op: op.clone(),
                        mode: self.modes.get(id).copied().unwrap_or(Mode::Exclusive),
                        invoked: *at,
                        ret: None,
                    });
                }
                Event::Return { id, ret, at } => {
                    if let Some(&i) = by_id.get(id) {
                        ops[i].ret = Some((ret.clone(), *at));
                    }
                }
                _ => {}
            }
        }
        ops
    }

    /// The names some acquire took in a mode other than exclusive (read-write locks with a
    /// reader, semaphores): the checkers that model a mutex leave them out.
    pub fn names_with_modes(&self) -> std::collections::BTreeSet<String> {
        let ids: std::collections::BTreeSet<u64> = self.modes.keys().copied().collect();
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Invoke { id, lock, .. } if ids.contains(id) => Some(lock.clone()),
                _ => None,
            })
            .collect()
    }

    /// Every grant its client checked it still held at least once after the answer, with
    /// the span it believed it held it (see [`Hold`]), in the order the grants were answered.
    pub fn holds(&self) -> Vec<Hold> {
        let mut last_check: BTreeMap<(u64, &str, u64), Duration> = BTreeMap::new();
        for e in &self.events {
            if let Event::HoldCheck {
                session,
                lock,
                token,
                at,
                ..
            } = e
            {
                let t = last_check
                    .entry((*session, lock.as_str(), *token))
                    .or_default();
                *t = (*t).max(*at);
            }
        }
        let mut out: Vec<Hold> = self
            .operations()
            .into_iter()
            .filter_map(|op| {
                let (OpKind::Acquire, Some((Ret::Granted { token }, from))) = (&op.op, &op.ret)
                else {
                    return None;
                };
                let until = *last_check.get(&(op.session, op.lock.as_str(), *token))?;
                (until >= *from).then(|| Hold {
                    actor: op.actor,
                    session: op.session,
                    lock: op.lock.clone(),
                    token: *token,
                    mode: op.mode,
                    from: *from,
                    until,
                })
            })
            .collect();
        out.sort_by_key(|h| h.from);
        out
    }

    /// Sessions each committed expiry or close removed, with the entry's index and when it was
    /// first appended and known committed. A batch entry's closes (issue #35) are one end,
    /// of every session they close.
    pub fn committed_session_ends(&self) -> Vec<SessionEnd> {
        let mut out = Vec::new();
        for (&index, c) in &self.committed {
            let mut sessions: Vec<u64> = Vec::new();
            let mut expiry = false;
            for op in c.ops() {
                match op {
                    Op::ExpireSessions { ids } => {
                        expiry = true;
                        sessions.extend(ids.iter().map(|s| s.0));
                    }
                    Op::CloseSession { session } => sessions.push(session.id.0),
                    _ => {}
                }
            }
            if sessions.is_empty() && !expiry {
                continue;
            }
            let first_at = self
                .appended
                .get(&(index, c.leader.0, c.leader.1))
                .map_or(c.known_at, |a| a.first_at);
            out.push(SessionEnd {
                index,
                sessions,
                expiry,
                first_at,
                known_at: c.known_at,
            });
        }
        out
    }
}

fn secs(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

fn describe(leader: (u64, u64), op: &Option<Op>, digest: u64) -> String {
    format!("{{leader {leader:?}, op {op:?}, digest {digest:016x}}}")
}

#[derive(Debug, Clone)]
pub struct Operation {
    pub actor: Actor,
    pub session: u64,
    pub lock: String,
    pub op: OpKind,
    /// An acquire's mode (exclusive for a release).
    pub mode: Mode,
    pub invoked: Duration,
    pub ret: Option<(Ret, Duration)>,
}

/// One grant a client believed it held: from the moment its grant was answered to its last
/// hold check that found it held (the client acted as its holder only in between).
#[derive(Debug, Clone)]
pub struct Hold {
    pub actor: Actor,
    pub session: u64,
    pub lock: String,
    pub token: u64,
    pub mode: Mode,
    pub from: Duration,
    pub until: Duration,
}

#[derive(Debug, Clone)]
pub struct SessionEnd {
    pub index: u64,
    pub sessions: Vec<u64>,
    /// The cluster expired them (`Op::ExpireSessions`), rather than their clients closing them.
    pub expiry: bool,
    pub first_at: Duration,
    pub known_at: Duration,
}
