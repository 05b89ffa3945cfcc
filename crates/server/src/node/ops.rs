//! The node's operations, in domain types: what the gRPC service and the HTTP API call (each
//! only translates its wire format to these and back) and what the lease task proposes through.
//! [`Node::authorize`] is the one access check both APIs run before any operation.
//!
//! Mutations become Raft log entries stamped with the leader's time; reads and keepalives are
//! answered only after this node confirmed with a majority that it is still the leader.
//!
//! What is here: [`Node::propose`] (a command, stamped with the leader's wall-clock time and
//! any randomness, through the log), [`Node::linearizable_read`] (openraft's read-index
//! round), `acquire` with its long-poll (a queued request waits in `waiters.rs`), the
//! keepalive decision (renewed after a read-index round; a session with a standing lease mark
//! is renewed through a logged `RenewLeases` the lease task writes, see `leases.rs`), the
//! operator's calls (force-release, revoke, audit, backup). The status and membership changes
//! are in `membership.rs`. Nothing here takes or returns a protobuf or JSON type.

use std::sync::{Arc, Weak};
use std::time::Duration;

use latchkey_core::{
    limits, Actor, Applied, AuditRecord, Command, ForceTarget, HolderState, IdentityUsage,
    LockState, Mode, Op, Outcome, Rejection, SessionId, SessionKey, SessionOwner,
};
use openraft::async_runtime::WatchReceiver;
use openraft::{ReadPolicy, ServerState};
use tokio::sync::oneshot;

use crate::access::acl::{Acl, Caller, Identity, Need, Refusal};
use crate::cluster::member_addr::MemberAddr;
use crate::error::ApiError;
use crate::lease::leases::Renew;
use crate::lease::waiters::{Slot, WaitEnd};
use crate::node::{Node, RenewRequest};

/// How an Acquire call ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    Granted {
        token: u64,
    },
    /// `held_by`: the holder (the first, of several) and how it holds the name, as of the
    /// entry that refused a request that asked not to wait (`None` for a wait that ended, or a
    /// retry answered from the remembered outcome).
    NotGranted {
        held_by: Option<(Held, Mode)>,
    },
    /// Still queued at `position`: the client calls again with the same sequence number.
    Pending {
        position: u32,
    },
}

/// A copy of the table for a backup, with where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupImage {
    /// The last log index applied to `table`: every token issued so far is at most this.
    pub applied_index: u64,
    /// The cluster's members (`ID=ADDR,...`) and fingerprint.
    pub members: String,
    pub fingerprint: String,
    /// `latchkey_core::codec::encode_table` output.
    pub table: Vec<u8>,
}

/// A new session: its key (the secret proves ownership) and the lease it got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewSession {
    pub key: SessionKey,
    pub ttl_ms: u64,
}

/// A keepalive's answer for one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionLease {
    pub id: SessionId,
    pub alive: bool,
    /// The session's lease; 0 when it is gone.
    pub ttl_ms: u64,
    /// Tokens of its grants an operator force-released, and the highest one forgotten (see
    /// `LockTable::revoked_grants`).
    pub revoked_tokens: Vec<u64>,
    pub revoked_through: Option<u64>,
    /// Held names someone waits for (`LockTable::contended`).
    pub contended: Vec<String>,
    /// `contended` is part of them, not all (`LockTable::contended`).
    pub contended_truncated: bool,
}

/// One lock as a read answers it: who holds it, for how long, and how many wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockView {
    pub name: String,
    /// The holder; of a name with several (readers, permits), the first granted.
    pub held: Option<Held>,
    /// Every holder, in the order granted (issue #32): one for a mutex or a writer.
    pub holders: Vec<Held>,
    /// How it is held (`Exclusive` for a free name): a semaphore's is `Permits(n)`.
    pub mode: Mode,
    pub waiters: u32,
    /// The first waiters, in queue order (all from describe, a few from list).
    pub queue: Vec<Waiting>,
    /// The lock-delay the holder's grant asked for (ms), if any.
    pub lock_delay_ms: Option<u64>,
    /// While a lock-delay runs (no holder): how long until it ends, on this node's wall clock
    /// from the leader's stamped end.
    pub delay_remaining_ms: Option<u64>,
    /// While a lock-delay runs: the lost grant's token, which a force-release names to end it.
    pub delay_token: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub session: SessionId,
    pub token: u64,
    /// Measured on this node's wall clock from the leader's grant time.
    pub held_for_ms: u64,
    pub owner: Option<SessionOwner>,
    /// The election value this grant published (issue #32), if any.
    pub value: Option<Vec<u8>>,
}

impl Held {
    fn new(h: HolderState, now_ms: u64) -> Held {
        Held {
            session: h.session,
            token: h.token,
            held_for_ms: now_ms.saturating_sub(h.granted_at_ms),
            owner: h.owner,
            value: h.value,
        }
    }
}

/// One waiter of a lock, as a read answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub session: SessionId,
    /// Measured on this node's wall clock from the leader's time of the wait's entry.
    pub waited_ms: u64,
    pub owner: Option<SessionOwner>,
    /// How it asked for the lock.
    pub mode: Mode,
}

impl LockView {
    fn new(name: &str, info: Option<LockState>, now_ms: u64) -> LockView {
        match info {
            None => LockView {
                name: name.to_owned(),
                held: None,
                holders: Vec::new(),
                mode: Mode::Exclusive,
                waiters: 0,
                queue: Vec::new(),
                lock_delay_ms: None,
                delay_remaining_ms: None,
                delay_token: None,
            },
            Some(i) => {
                // A name is in the table while held (a waiter that fits is granted in the
                // same entry): its first holder's mode is the name's.
                let mode = i
                    .holders
                    .first()
                    .map(|h| h.mode)
                    .or_else(|| i.queue.first().map(|w| w.mode))
                    .unwrap_or(Mode::Exclusive);
                let holders: Vec<Held> = i
                    .holders
                    .into_iter()
                    .map(|h| Held::new(h, now_ms))
                    .collect();
                LockView {
                    name: i.name,
                    held: holders.first().cloned(),
                    holders,
                    mode,
                    waiters: i.waiters,
                    queue: i
                        .queue
                        .into_iter()
                        .map(|w| Waiting {
                            session: w.session,
                            waited_ms: now_ms.saturating_sub(w.since_ms),
                            owner: w.owner,
                            mode: w.mode,
                        })
                        .collect(),
                    lock_delay_ms: i.lock_delay_ms,
                    delay_remaining_ms: i.delay_until_ms.map(|u| u.saturating_sub(now_ms)),
                    delay_token: i.delay_token,
                }
            }
        }
    }

    /// Roughly the bytes this view takes in a List answer (for `LIST_RESPONSE_BYTES_MAX`).
    fn wire_bytes(&self) -> usize {
        let owner = |o: &Option<SessionOwner>| {
            o.as_ref()
                .map_or(0, |o| o.host.len() + o.user.len() + o.text.len() + 16)
        };
        // An election value goes out twice (the holder and `holders`), and in JSON a byte may
        // take six (`\u00XX`): counted at that, so that values cannot carry a List answer past
        // the message limits (a page is cut short instead).
        let value = |h: &Held| h.value.as_ref().map_or(0, |v| 6 * v.len());
        // A lock-delay's three numbers: a key and up to 20 digits each in JSON.
        let delay = [
            self.lock_delay_ms,
            self.delay_remaining_ms,
            self.delay_token,
        ]
        .iter()
        .flatten()
        .count()
            * 44;
        self.name.len()
            + 64
            + delay
            + self.held.as_ref().map_or(0, |h| owner(&h.owner) + value(h))
            + self
                .holders
                .iter()
                .map(|h| 40 + owner(&h.owner) + value(h))
                .sum::<usize>()
            + self
                .queue
                .iter()
                .map(|w| 32 + owner(&w.owner))
                .sum::<usize>()
    }
}

/// At most `KEEPALIVE_SESSIONS_MAX` sessions in one keepalive (a whole request, and each
/// group's share of it).
pub fn check_keepalive_len(sessions: usize) -> Result<(), ApiError> {
    if sessions > limits::KEEPALIVE_SESSIONS_MAX {
        return Err(ApiError::Invalid(format!(
            "{sessions} sessions in one keepalive, the limit is {}",
            limits::KEEPALIVE_SESSIONS_MAX
        )));
    }
    Ok(())
}

/// A semaphore's permits are 1..=`HOLDERS_PER_LOCK_MAX`: refused before proposing, as the
/// table would refuse it (`PermitsOutOfRange`), so bad input costs no log entry.
pub fn validate_mode(mode: Mode) -> Result<(), Rejection> {
    match mode {
        Mode::Permits(permits)
            if permits == 0 || permits as usize > limits::HOLDERS_PER_LOCK_MAX =>
        {
            Err(Rejection::PermitsOutOfRange {
                permits,
                max: limits::HOLDERS_PER_LOCK_MAX as u32,
            })
        }
        _ => Ok(()),
    }
}

fn rejected(o: Outcome) -> ApiError {
    match o {
        Outcome::Rejected(r) => ApiError::Rejected(r),
        other => ApiError::Raft(format!("unexpected outcome {other:?}")),
    }
}

/// Frees the waiter slot however the call ends (including when the client goes away).
struct SlotGuard {
    node: Arc<Node>,
    slot: Slot,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.node.waiters.unregister(self.slot);
    }
}

/// What a client call presents to prove who it is: the `authorization` header's value (gRPC
/// metadata or HTTP header, `Bearer TOKEN`) and the client certificate chain of its TLS
/// connection; and where it comes from, for the log of refusals.
#[derive(Debug, Clone, Copy, Default)]
pub struct Credentials<'a> {
    pub authorization: Option<&'a [u8]>,
    pub certs: Option<&'a [rustls_pki_types::CertificateDer<'static>]>,
    pub from: Option<std::net::SocketAddr>,
}

impl Node {
    /// The one place a client call is authenticated and authorised (issue #13), for gRPC and
    /// HTTP alike: `None` when access control is off (every call allowed), else the caller
    /// once it holds `need` and owns every session in `sessions`. Decided by the list in force
    /// when the call arrives (a reload applies from the next call); every refusal is counted
    /// and logged (`refusals.rs`).
    pub fn authorize(
        &self,
        credentials: Credentials<'_>,
        need: Need<'_>,
        sessions: &[SessionId],
    ) -> Result<Option<Caller>, ApiError> {
        let Some(policy) = &self.config.acl else {
            return Ok(None);
        };
        let refusals = &self.metrics.refusals;
        match self.admit(&policy.current(), credentials, need, sessions) {
            Ok(who) => Ok(Some(Caller::new(who, credentials.from, refusals.clone()))),
            Err(refusal) => {
                refusals.refused(credentials.from, refusal.reason(), &refusal);
                Err(refusal.into())
            }
        }
    }

    /// [`Node::authorize`]'s decision by `acl`.
    fn admit(
        &self,
        acl: &Acl,
        credentials: Credentials<'_>,
        need: Need<'_>,
        sessions: &[SessionId],
    ) -> Result<Arc<Identity>, Refusal> {
        let who = acl.authenticate(credentials.authorization, credentials.certs)?;
        who.allows(need)?;
        for id in sessions {
            // The owner is fixed at creation, so this node's table answers for any session it
            // has applied; one it has not is refused by the operation (not found, or not the
            // leader).
            let owner = self
                .state
                .read(|t| t.session_identity(*id).map(|o| o.map(str::to_owned)));
            if let Some(owner) = owner {
                if owner.as_deref() != Some(who.name.as_str()) {
                    return Err(Refusal::NotSessionOwner {
                        session: id.0,
                        identity: who.name.clone(),
                    });
                }
            }
        }
        Ok(who)
    }

    /// Stamp and propose one command; answer with its outcome once a majority has it on disk
    /// and it is applied.
    pub async fn propose(&self, op: Op) -> Result<Outcome, ApiError> {
        Ok(self.propose_applied(op).await?.outcome)
    }

    /// [`Node::propose`], answering everything the entry produced: for an operation a batch
    /// entry carried (`gather.rs`), that operation's part, as if it had had the entry alone.
    pub async fn propose_applied(&self, op: Op) -> Result<Applied, ApiError> {
        if self.shutdown.is_cancelled() {
            return Err(ApiError::ShuttingDown);
        }
        if self.quorum_lost() {
            return Err(ApiError::NoQuorum);
        }
        let proposed = self.clock.now();
        let applied = tokio::select! {
            applied = self.write_gathered(op) => applied?,
            () = tokio::time::sleep(Duration::from_millis(limits::PROPOSE_TIMEOUT_MS)) => {
                return Err(ApiError::NoQuorum)
            }
            () = self.quorum_lost_later() => return Err(ApiError::NoQuorum),
        };
        self.metrics
            .commit_seconds
            .observe(self.clock.now().duration_since(proposed).as_secs_f64());
        Ok(applied)
    }

    /// Write `op` in an entry: at once and alone when fewer than
    /// `limits::GATHER_WRITES_IN_FLIGHT` gathered writes are in flight (or it cannot be
    /// batched, or coalescing is off), else in the next batch entry (`gather.rs`).
    async fn write_gathered(&self, op: Op) -> Result<Applied, ApiError> {
        if !self.config.coalesce || !op.batchable() {
            return self.write(op).await;
        }
        let mut answer = self.gather.push(op);
        loop {
            // A receiver that `try_recv` found answered or closed is done: polling it again (the
            // `select!` below) panics, so a closed one is answered here. The simulation's
            // coalescing seeds found that (issue #35): a writer that went away mid-write drops
            // its batch's senders, and a caller woken by the freed writer saw `Closed` first.
            match answer.try_recv() {
                Ok(answer) => return answer,
                // A sender dropped unanswered: its writer went away mid-write.
                Err(oneshot::error::TryRecvError::Closed) => return Err(ApiError::NoQuorum),
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            let freed = self.gather.freed();
            if let Some(turn) = self.gather.take() {
                let mut written = self.write(turn.op()).await;
                if self.config.plant.batch_answers_reversed {
                    // Planted (`Plant::batch_answers_reversed`): answered newest first.
                    if let Ok(applied) = &mut written {
                        applied.ops.reverse();
                    }
                }
                turn.answer(written);
                continue;
            }
            tokio::select! {
                // A sender dropped unanswered: its writer went away mid-write.
                answer = &mut answer => return answer.unwrap_or(Err(ApiError::NoQuorum)),
                () = freed => {}
            }
        }
    }

    /// Stamp `op` with the leader's wall clock and write it as one entry.
    async fn write(&self, op: Op) -> Result<Applied, ApiError> {
        let cmd = Command {
            now_ms: self.clock.wall_ms(),
            op,
        };
        Ok(self.raft.client_write(cmd.into()).await?.data)
    }

    /// Whether this node leads a group of several voters but no majority has acknowledged it
    /// for longer than its leader lease (`election_timeout_max_ms`): the others may already
    /// be electing another leader, and nothing it proposes commits until the partition heals.
    /// It then answers "no quorum" at once, and a waiting proposal does as soon as it sees it,
    /// so the client retries on another member instead of waiting out `PROPOSE_TIMEOUT_MS`
    /// (the nemesis, issue #34, measured 5-10 s without a grant with the leader cut from the
    /// majority but reachable by clients). The answer is the one the timeout gave: the client
    /// retries under the same sequence number, so a proposal that does commit later is
    /// answered once.
    fn quorum_lost(&self) -> bool {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        if m.state != ServerState::Leader
            || m.membership_config
                .membership()
                .voter_ids()
                .nth(1)
                .is_none()
        {
            return false;
        }
        let lease = Duration::from_millis(self.config.election_timeout_max_ms);
        m.last_quorum_acked
            .as_ref()
            .is_some_and(|acked| openraft::Instant::elapsed(&**acked) > lease)
    }

    /// Completes once [`Node::quorum_lost`], checked every heartbeat.
    async fn quorum_lost_later(&self) {
        let every = Duration::from_millis(self.config.heartbeat_ms.max(1));
        loop {
            tokio::time::sleep(every).await;
            if self.quorum_lost() {
                return;
            }
        }
    }

    /// Return once this node confirmed with a majority that it leads and has applied
    /// everything committed before the call: the table then answers a linearizable read.
    pub async fn linearizable_read(&self) -> Result<(), ApiError> {
        self.raft
            .ensure_linearizable(ReadPolicy::ReadIndex)
            .await
            .map(|_| ())
            .map_err(ApiError::from)
    }

    /// What `identity` holds on this member, against its quotas: its sessions and queued
    /// acquires in this group's table and in this member's copies of the other groups it
    /// belongs to (docs/securing.md, "Access control"). Read before proposing; an acquire's
    /// wait and delay quotas also count the identity's requests checked on this member and
    /// not yet applied (`QuotaInFlight`). Calls of one identity at the leaders of other groups
    /// can still each pass before the others' entries are applied here (the member's copy of
    /// another group trails that group's leader), and sessions are counted from the tables
    /// alone, so those quotas may be overshot by the calls in flight (each connection at most
    /// CLIENT_CONCURRENT_REQUESTS_MAX). A group this member is outside of (`--replicas`) is not counted.
    /// Followers refuse the proposal anyway, so the leader's count decides.
    pub fn identity_usage(&self, identity: &str) -> IdentityUsage {
        let mut usage = self.state.read(|t| t.identity_usage(identity));
        if let Some(groups) = self.member_groups.get().and_then(Weak::upgrade) {
            let others = groups.identity_usage_besides(self.shape.group, identity);
            usage.sessions += others.sessions;
            usage.waiting += others.waiting;
            usage.delays += others.delays;
        }
        usage
    }

    /// Open a session; under access control it belongs to the identity `owner` and counts
    /// toward its session quota. `description` is what the client says about itself.
    pub async fn create_session(
        &self,
        ttl_ms: u64,
        owner: Option<&Caller>,
        description: Option<SessionOwner>,
    ) -> Result<NewSession, ApiError> {
        latchkey_core::validate_ttl_ms(ttl_ms)?;
        if let Some(d) = &description {
            d.validate()?;
        }
        let secret = self.entropy.next_u64();
        let identity = match owner {
            None => None,
            Some(owner) => {
                let usage = self.identity_usage(&owner.name);
                if usage.sessions >= owner.max_sessions {
                    return Err(owner.over_quota(format!(
                        "identity {:?} already has {} sessions, its quota (max_sessions) is {}",
                        owner.name, usage.sessions, owner.max_sessions
                    )));
                }
                Some(owner.name.clone())
            }
        };
        let op = Op::OpenSession {
            ttl_ms,
            secret,
            identity,
            owner: description,
        };
        match self.propose(op).await? {
            Outcome::SessionCreated { id, ttl_ms } => Ok(NewSession {
                key: SessionKey { id, secret },
                ttl_ms,
            }),
            other => Err(rejected(other)),
        }
    }

    pub async fn close_session(&self, session: SessionKey) -> Result<(), ApiError> {
        match self.propose(Op::CloseSession { session }).await? {
            Outcome::SessionClosed => Ok(()),
            other => Err(rejected(other)),
        }
    }

    /// Acquire `name` in `mode` for request `seq` of `session`, long-polling a queued request
    /// for up to `poll_ms_max` of its wait (`ACQUIRE_POLL_MS_MAX` for a call of its own, 0 in a
    /// `Batch` call: a queued request then answers `Pending` at once and stays queued). With a `value`, a campaign: an exclusive
    /// acquire whose grant publishes it (issue #32). Under access control, a new request that
    /// may queue counts toward `owner`'s quota of queued acquires (the `lock` permission
    /// covers every mode). `lock_delay_ms` above zero asks for a lock-delay (a mutex only; not
    /// with a campaign's value, which is refused as an invalid request).
    #[allow(clippy::too_many_arguments)]
    pub async fn acquire(
        self: &Arc<Node>,
        session: SessionKey,
        seq: u64,
        name: String,
        wait_timeout_ms: u64,
        mode: Mode,
        value: Option<Vec<u8>>,
        lock_delay_ms: u64,
        owner: Option<&Caller>,
        poll_ms_max: u64,
    ) -> Result<Acquired, ApiError> {
        debug_assert!(poll_ms_max <= limits::ACQUIRE_POLL_MS_MAX);
        latchkey_core::validate_name(&name)?;
        validate_mode(mode)?;
        if let Some(value) = &value {
            if mode != Mode::Exclusive {
                return Err(ApiError::Invalid(format!(
                    "an election value goes with an exclusive acquire (a campaign), not {mode:?}"
                )));
            }
            if lock_delay_ms > 0 {
                // `Op::Campaign` has no delay: refused rather than dropped without a word.
                return Err(ApiError::Invalid(
                    "a campaign (an acquire with an election value) takes no lock-delay".into(),
                ));
            }
            latchkey_core::validate_value(value)?;
        }
        if lock_delay_ms > limits::LOCK_DELAY_MS_MAX {
            return Err(Rejection::LockDelayOutOfRange {
                lock_delay_ms,
                max: limits::LOCK_DELAY_MS_MAX,
            }
            .into());
        }
        if lock_delay_ms > 0 && mode != Mode::Exclusive {
            return Err(Rejection::LockDelayConflict { name }.into());
        }
        let wait_ms = wait_timeout_ms.min(limits::WAIT_TIMEOUT_MS_MAX);
        let mut reservation = None;
        if let (Some(owner), true) = (owner, wait_ms > 0 || lock_delay_ms > 0) {
            // A retry of a request the table knows (queued or done) adds no wait or delay.
            // Counted like the session quota (see `Node::identity_usage`), with the identity's
            // other such requests checked on this member and not yet applied: those of one
            // `Batch` call, or of concurrent calls, would each pass on the same count.
            let known = self
                .state
                .read(|t| t.request_state(session.id, seq).is_some());
            if !known {
                let (waits, delays) = (usize::from(wait_ms > 0), usize::from(lock_delay_ms > 0));
                // The scan of the tables runs before the reservations' lock is taken (it
                // reads every session of every group: under the lock it serialized the
                // member's quota-counted acquires behind it).
                let usage = self.identity_usage(&owner.name);
                reservation = Some(self.quota_in_flight.reserve(
                    &owner.name,
                    (session.id, seq),
                    usage,
                    waits,
                    delays,
                    |usage| {
                        // A lock-delay outlives its session: bounded by its own quota, so that
                        // a tenant that lets sessions die cannot park names for every other
                        // tenant.
                        if delays > 0 && usage.delays >= owner.max_delays {
                            return Err(owner.over_quota(format!(
                                "identity {:?} already has {} lock-delays (asked for, held or \
                                 running), its quota (max_delays) is {}",
                                owner.name, usage.delays, owner.max_delays
                            )));
                        }
                        if waits > 0 && usage.waiting >= owner.max_waiting {
                            return Err(owner.over_quota(format!(
                                "identity {:?} already has {} acquires waiting or being \
                                 queued, its quota (max_waiting) is {}",
                                owner.name, usage.waiting, owner.max_waiting
                            )));
                        }
                        Ok(())
                    },
                )?);
            }
        }
        let started = self.clock.now();
        let granted = |token| {
            self.metrics
                .acquire_wait_seconds
                .observe(self.clock.now().duration_since(started).as_secs_f64());
            Acquired::Granted { token }
        };
        // Register before proposing, so a grant applied between the proposal's answer and our
        // wait cannot be missed.
        let (slot, rx) = self
            .waiters
            .register(session.id, seq)
            .map_err(|_| ApiError::TooManyWaiting)?;
        let _slot = SlotGuard {
            node: self.clone(),
            slot,
        };
        // A mutex's acquire stays `Op::Acquire`, so its entries are what older members and
        // logs know; only readers and permits need `AcquireWith`.
        // A lock-delay needs `AcquireDelayed`, which only builds since lock-delay apply.
        let op = match (mode, value) {
            (_, Some(value)) => Op::Campaign {
                session,
                seq,
                name,
                wait_ms,
                value,
            },
            (Mode::Exclusive, None) if lock_delay_ms > 0 => Op::AcquireDelayed {
                session,
                seq,
                name,
                wait_ms,
                lock_delay_ms,
            },
            (Mode::Exclusive, None) => Op::Acquire {
                session,
                seq,
                name,
                wait_ms,
            },
            (Mode::Shared | Mode::Permits(_), None) => Op::AcquireWith {
                session,
                seq,
                name,
                wait_ms,
                mode,
            },
        };
        let applied = self.propose_applied(op).await?;
        // Applied: the table counts the request now (queued), or it no longer waits.
        drop(reservation);
        let position = match applied.outcome {
            Outcome::Granted { token } => return Ok(granted(token)),
            Outcome::NotGranted => {
                let now_ms = self.clock.wall_ms();
                return Ok(Acquired::NotGranted {
                    held_by: applied.busy.map(|h| {
                        let mode = h.mode;
                        (Held::new(h, now_ms), mode)
                    }),
                });
            }
            Outcome::Queued { position } => position,
            other => return Err(rejected(other)),
        };
        let poll_ms = wait_ms.min(poll_ms_max.min(limits::ACQUIRE_POLL_MS_MAX));
        // A wait that ends within this call's poll leaves the queue at the poll's end; a
        // longer one (or one polled for less than all of it) answers `Pending` and stays.
        let cancel_at_end = wait_ms <= poll_ms;
        let poll_end = started + Duration::from_millis(poll_ms);
        tokio::select! {
            end = rx => match end {
                Ok(WaitEnd::Granted { token }) => return Ok(granted(token)),
                Ok(WaitEnd::SessionGone) => {
                    return Err(Rejection::SessionNotFound { id: session.id }.into())
                }
                Ok(WaitEnd::NotGranted) => return Ok(Acquired::NotGranted { held_by: None }),
                // Replaced by a newer call for the same request: that one listens now.
                Err(_) => return Ok(Acquired::Pending { position }),
            },
            _ = crate::clock::sleep_until(&*self.clock, poll_end) => {}
            _ = self.shutdown.cancelled() => return Err(ApiError::ShuttingDown),
            // Cut off from its majority, this leader will see no grant the others commit: the
            // client re-sends (same sequence number) to a member that can.
            () = self.quorum_lost_later() => return Err(ApiError::NoQuorum),
        }
        if !cancel_at_end {
            // The place in the queue now, not the one the poll began with: the queue ahead
            // may have moved while it waited, and this answer is how the client hears of it.
            let now = self.state.read(|t| match t.request_state(session.id, seq) {
                Some(latchkey_core::RequestState::Waiting { position, .. }) => Some(position),
                _ => None,
            });
            return Ok(Acquired::Pending {
                position: now.unwrap_or(position),
            });
        }
        // The wait timed out: leave the queue through the log. If the grant was applied first,
        // the cancel answers with that grant, so a grant is never lost.
        match self.propose(Op::CancelWait { session, seq }).await? {
            Outcome::Granted { token } => Ok(granted(token)),
            Outcome::NotGranted => Ok(Acquired::NotGranted { held_by: None }),
            other => Err(rejected(other)),
        }
    }

    /// Release `name` if `session` holds it under `token`; false if it does not.
    pub async fn release(
        &self,
        session: SessionKey,
        seq: u64,
        name: String,
        token: u64,
    ) -> Result<bool, ApiError> {
        // Not `validate_name` alone: a lock taken under a name an older version allowed is
        // released. But a name with a control character that no lock has is refused here, not
        // proposed: its entry could only answer "not the holder", and it would carry control
        // bytes a client chose into the Raft log (issue #31). Such names are refused before an
        // acquire is proposed, so the locks under them only ever go away, and a table read
        // that lags can only let one more release through to the log, never refuse a held one
        // (short of a leader that has not yet applied an older version's acquire of it).
        latchkey_core::validate_stored_name(&name)?;
        if let Err(refused) = latchkey_core::validate_name(&name) {
            if self.state.read(|t| t.describe(&name).is_none()) {
                return Err(refused.into());
            }
        }
        match self
            .propose(Op::Release {
                session,
                seq,
                name,
                token,
            })
            .await?
        {
            Outcome::Released => Ok(true),
            Outcome::NotHolder => Ok(false),
            other => Err(rejected(other)),
        }
    }

    /// The leader of `name` under `token` (`session`'s exclusive grant) publishes `value`
    /// (issue #32); anyone else is refused `Rejection::NotElectionLeader`.
    pub async fn proclaim(
        &self,
        session: SessionKey,
        seq: u64,
        name: String,
        token: u64,
        value: Vec<u8>,
    ) -> Result<(), ApiError> {
        latchkey_core::validate_value(&value)?;
        latchkey_core::validate_stored_name(&name)?;
        let op = Op::Proclaim {
            session,
            seq,
            name,
            token,
            value,
        };
        match self.propose(op).await? {
            Outcome::Proclaimed => Ok(()),
            other => Err(rejected(other)),
        }
    }

    /// Renew the leases of `sessions`: in memory, or through the log for marked sessions
    /// (handed to the lease task), and say which are alive.
    pub async fn keep_alive(&self, sessions: &[SessionKey]) -> Result<Vec<SessionLease>, ApiError> {
        let arrived = self.clock.now();
        check_keepalive_len(sessions.len())?;
        if self.probe.wants_keepalives() {
            let (state, term) = {
                let metrics = self.raft.metrics();
                let m = metrics.borrow_watched();
                (m.state, m.current_term)
            };
            if state == ServerState::Leader {
                self.probe.event(
                    self.id,
                    self.shape.group,
                    crate::probe::ProbeEvent::KeepAliveAtLeader { term },
                );
            }
        }
        // Confirm leadership with a majority *after* the request arrived: a deposed leader
        // fails here and never extends a lease.
        let term = if self.config.plant.renew_without_quorum {
            use openraft::async_runtime::WatchReceiver;
            let (state, leader, term) = {
                let metrics = self.raft.metrics();
                let m = metrics.borrow_watched();
                (m.state, m.current_leader, m.current_term)
            };
            if state != openraft::ServerState::Leader {
                return Err(ApiError::NotLeader {
                    leader_id: leader,
                    leader_addr: None,
                });
            }
            term
        } else {
            self.raft
                .ensure_linearizable(ReadPolicy::ReadIndex)
                .await
                .map_err(ApiError::from)?
                .committed_leader_id()
                .term
        };
        // Decide each session: renewed in memory, needs a logged renewal, or gone.
        let mut decisions: Vec<(SessionId, u64, Renew)> = Vec::with_capacity(sessions.len());
        let mut revoked: Vec<(Vec<u64>, Option<u64>)> = Vec::with_capacity(sessions.len());
        let mut contended: Vec<(Vec<String>, bool)> = Vec::with_capacity(sessions.len());
        let mut budget = latchkey_core::ContendedBudget::default();
        for key in sessions {
            let (ttl_ms, taken, waited_for) = self.state.read(|t| {
                let ttl_ms = t
                    .session_valid(key)
                    .then(|| t.session(key.id).map(|i| i.ttl_ms))
                    .flatten();
                let taken = ttl_ms
                    .and_then(|_| t.revoked_grants(key.id))
                    .map_or((Vec::new(), None), |(tokens, through)| {
                        (tokens.to_vec(), through)
                    });
                let waited_for =
                    ttl_ms.map_or((Vec::new(), false), |_| t.contended(key.id, &mut budget));
                (ttl_ms, taken, waited_for)
            });
            revoked.push(taken);
            contended.push(waited_for);
            let decision = match ttl_ms {
                None => Renew::Gone,
                Some(_) => self
                    .leases
                    .lock()
                    .expect("leases lock")
                    .renew(key.id, arrived, term),
            };
            decisions.push((key.id, ttl_ms.unwrap_or(0), decision));
        }
        // Elected, but the leases of this term are not resumed yet (the old leader's tail is
        // still being applied): no session may be renewed or declared gone on this table yet.
        if decisions.iter().any(|(_, _, d)| *d == Renew::NotResumed) {
            return Err(ApiError::LeasesNotResumed {
                leader_id: self.id,
                // The address members and hints name this node by (as in NotLeader's hints).
                leader_addr: self.own_client_addr(),
            });
        }
        let marked: Vec<(SessionId, tokio::time::Instant)> = decisions
            .iter()
            .filter(|(_, _, d)| *d == Renew::NeedsLog)
            .map(|(id, _, _)| (*id, arrived))
            .collect();
        let renewed_through_log = if marked.is_empty() {
            Vec::new()
        } else {
            let (reply, answer) = oneshot::channel();
            self.renewals
                .send(RenewRequest {
                    sessions: marked,
                    reply,
                })
                .await
                .map_err(|_| ApiError::ShuttingDown)?;
            answer.await.map_err(|_| ApiError::ShuttingDown)??
        };
        let renewed = decisions
            .iter()
            .filter(|(_, _, d)| *d == Renew::Renewed)
            .count()
            + renewed_through_log.len();
        self.metrics.keepalive_sessions.inc_by(renewed as u64);
        self.metrics
            .keepalive_seconds
            .observe(self.clock.now().duration_since(arrived).as_secs_f64());
        Ok(decisions
            .into_iter()
            .zip(revoked)
            .zip(contended)
            .map(
                |(((id, ttl_ms, d), (revoked_tokens, revoked_through)), (contended, all))| {
                    SessionLease {
                        id,
                        alive: match d {
                            Renew::Renewed => true,
                            Renew::NeedsLog => renewed_through_log.contains(&id),
                            Renew::Gone => false,
                            Renew::NotResumed => unreachable!("answered above"),
                        },
                        ttl_ms,
                        revoked_tokens,
                        revoked_through,
                        contended,
                        contended_truncated: !all,
                    }
                },
            )
            .collect())
    }

    /// The lock `name` as of a linearizable read, and the index of the last entry applied
    /// when it was read (every watch event at or below it is reflected in the view).
    pub async fn describe(&self, name: &str) -> Result<(LockView, u64), ApiError> {
        latchkey_core::validate_stored_name(name)?;
        self.linearizable_read().await?;
        let now_ms = self.clock.wall_ms();
        let (info, index) = self
            .state
            .read_applied(|t, index| (t.describe(name), index));
        Ok((LockView::new(name, info, now_ms), index))
    }

    /// Up to `limit` locks whose names start with `prefix` (0: as many as allowed), as of a
    /// linearizable read, and whether more were left out.
    pub async fn list(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<(Vec<LockView>, bool), ApiError> {
        if prefix.len() > limits::LOCK_NAME_BYTES_MAX {
            return Err(ApiError::from(Rejection::NameTooLong {
                len: prefix.len(),
                max: limits::LOCK_NAME_BYTES_MAX,
            }));
        }
        let limit = match limit {
            0 => limits::LIST_RESULTS_MAX,
            n => n.min(limits::LIST_RESULTS_MAX),
        };
        self.linearizable_read().await?;
        let now_ms = self.clock.wall_ms();
        // One more than asked, to tell whether the answer was cut.
        let mut found = self.state.read(|t| t.list(prefix, limit + 1));
        let mut truncated = found.len() > limit;
        found.truncate(limit);
        let mut locks = Vec::with_capacity(found.len());
        let mut bytes = 0;
        for i in found {
            let name = i.name.clone();
            let view = LockView::new(&name, Some(i), now_ms);
            bytes += view.wire_bytes();
            if bytes > limits::LIST_RESPONSE_BYTES_MAX {
                truncated = true;
                break;
            }
            locks.push(view);
        }
        Ok((locks, truncated))
    }

    /// An operator's force-release of `name` (only of the grant `token`, when given), or with
    /// `end_delay` the end of its running lock-delay (only the one under `token`): the session
    /// and token of the grant taken (or whose loss started the delay).
    ///
    /// A name with a lock-delay (running, or asked for by its holder or a waiter) gets an
    /// `Op::ForceReleaseTargeted`, which says what it ends, so that a retry of a release that
    /// started a delay ends nothing; so does every `end_delay`. Any other name gets the
    /// `Op::ForceRelease` it always did, which members of earlier builds apply (see
    /// docs/primitives.md: upgrade every member before the first lock-delay); an `end_delay`
    /// of a name in no delay is refused here, proposing nothing.
    ///
    /// The table is read after a linearizable read, so it holds every entry committed before
    /// the request (a new leader's applied state may lag: issue #9): a token the caller read
    /// from `describe` is in it. A delay can start after the read only if its grant was made
    /// after it too; an `Op::ForceRelease` naming an older token then ends nothing of it. Only
    /// a request naming no token (the clients always name one) meets the old entry's rule
    /// that ends a delay it finds, and only for a delay whose grant and loss both fell between
    /// the read and the entry.
    pub async fn force_release(
        &self,
        name: String,
        token: Option<u64>,
        end_delay: bool,
        by: Actor,
        reason: String,
    ) -> Result<(SessionId, u64), ApiError> {
        latchkey_core::validate_name(&name)?;
        by.validate()?;
        latchkey_core::validate_reason(&reason)?;
        self.linearizable_read().await?;
        let (delayed, in_delay) = self.state.read(|t| {
            let in_delay = t
                .running_delays()
                .any(|(n, d, _)| n == name && token.is_none_or(|t| t == d));
            (t.uses_lock_delay(&name), in_delay)
        });
        let target = if end_delay {
            if !in_delay {
                return Err(ApiError::Rejected(Rejection::NoLockDelay { name, token }));
            }
            Some(ForceTarget::Delay)
        } else if delayed {
            Some(ForceTarget::Holder)
        } else {
            None
        };
        let op = Op::force_release(name, token, target, by, reason);
        match self.propose(op).await? {
            Outcome::ForceReleased { session, token } => Ok((session, token)),
            other => Err(rejected(other)),
        }
    }

    /// An operator ends `session`: how many locks it held.
    pub async fn revoke_session(
        &self,
        session: SessionId,
        by: Actor,
        reason: String,
    ) -> Result<u32, ApiError> {
        by.validate()?;
        latchkey_core::validate_reason(&reason)?;
        match self
            .propose(Op::RevokeSession {
                session,
                by,
                reason,
            })
            .await?
        {
            Outcome::SessionRevoked { locks } => Ok(locks),
            other => Err(rejected(other)),
        }
    }

    /// The audit log, oldest first, as of a linearizable read.
    /// A consistent copy of the whole table (`latchkey snapshot save`), as of a linearizable
    /// read: encoded under the table's read lock together with the applied index, so applying
    /// waits for the encoding (as it does for a snapshot build); reads do not.
    pub async fn backup(&self) -> Result<BackupImage, ApiError> {
        self.linearizable_read().await?;
        let (applied_index, table) = self
            .state
            .read_applied(|t, applied| (applied, latchkey_core::codec::encode_table(t)));
        if table.len() as u64 > limits::BACKUP_TABLE_BYTES_MAX {
            return Err(ApiError::BackupTooLarge {
                bytes: table.len() as u64,
                max: limits::BACKUP_TABLE_BYTES_MAX,
            });
        }
        Ok(BackupImage {
            applied_index,
            // The voters now (the membership may have changed since the cluster was founded).
            members: crate::node::members_text(&self.membership().voters.into_iter().collect()),
            fingerprint: self.peer_auth.fingerprint().to_owned(),
            table,
        })
    }

    pub async fn audit(&self) -> Result<Vec<AuditRecord>, ApiError> {
        self.linearizable_read().await?;
        Ok(self.state.read(|t| t.audit().cloned().collect()))
    }

    /// NotLeader (with the hint) unless this member leads.
    pub(super) fn leader_only(&self) -> Result<(), ApiError> {
        let m = self.raft.metrics().borrow_watched().clone();
        if m.state == ServerState::Leader {
            return Ok(());
        }
        let leader_addr = m.current_leader.and_then(|l| {
            m.membership_config
                .membership()
                .get_node(&l)
                .map(|n| MemberAddr::split(&n.addr).client.to_owned())
        });
        Err(ApiError::NotLeader {
            leader_id: m.current_leader,
            leader_addr,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A List answer's size counts election values at their worst (two copies, six JSON bytes
    /// a byte): 4,000 leaders with 1-KiB values once counted under half a megabyte and went
    /// out as 8 MB, over the message limit, failing every List of their prefix.
    #[test]
    fn a_list_answer_counts_election_values() {
        let held = |value: Option<Vec<u8>>| Held {
            session: SessionId(1),
            token: 1,
            held_for_ms: 0,
            owner: None,
            value,
        };
        let view = |value: Option<Vec<u8>>| LockView {
            name: "e".into(),
            held: Some(held(value.clone())),
            holders: vec![held(value)],
            mode: Mode::Exclusive,
            waiters: 0,
            queue: Vec::new(),
            lock_delay_ms: None,
            delay_remaining_ms: None,
            delay_token: None,
        };
        let without = view(None).wire_bytes();
        let with = view(Some(vec![0; limits::ELECTION_VALUE_BYTES_MAX])).wire_bytes();
        assert_eq!(with - without, 12 * limits::ELECTION_VALUE_BYTES_MAX);
    }
}
