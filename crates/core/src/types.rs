//! The vocabulary of the state machine: commands in, outcomes out.
//!
//! These types are what the Raft log stores (through serde), so their encoding is part of the
//! on-disk format: add enum variants only at the end, never reorder or remove one.

use serde::{Deserialize, Serialize};

/// A session's id: the log index of the entry that created it, so ids are unique and never reused.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(pub u64);

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What a client presents to act in a session: the id and the secret the leader drew for it.
/// The secret keeps one client from closing or releasing through another's session by guessing
/// the (sequential) id.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SessionKey {
    pub id: SessionId,
    pub secret: u64,
}

/// One replicated command. The leader stamps `now_ms` (its wall clock, Unix milliseconds) and any
/// randomness into the command, so that applying it is deterministic on every member.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Command {
    /// Wall-clock time on the proposing leader. Informational only ("held for"): no decision in
    /// the state machine depends on it, because leaders' clocks disagree.
    pub now_ms: u64,
    pub op: Op,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Open a session with a lease of `ttl_ms`. `secret` was drawn at random by the leader.
    CreateSession { ttl_ms: u64, secret: u64 },
    /// The client ends its session: its locks are released (each handed to its next waiter) and
    /// its waits leave their queues.
    CloseSession { session: SessionKey },
    /// The leader saw these sessions' leases run out. Same effect as a close.
    ExpireSessions { ids: Vec<SessionId> },
    /// Take `name`, or, when `wait_ms` is not zero and the lock is held, join its queue for at
    /// most `wait_ms` (cut to `WAIT_TIMEOUT_MS_MAX`) from this entry's `now_ms`. A wait that
    /// ends unserved ends on the server, through [`Op::ExpireWaits`] or a release that finds it
    /// ended, whether or not the client is still there.
    Acquire {
        session: SessionKey,
        seq: u64,
        name: String,
        wait_ms: u64,
    },
    /// End the wait started by the Acquire with sequence number `seq` (its wait timeout passed).
    /// If the lock was granted first, the outcome is that grant.
    CancelWait { session: SessionKey, seq: u64 },
    /// Release `name` if, and only if, this session holds it under `token`.
    Release {
        session: SessionKey,
        seq: u64,
        name: String,
        token: u64,
    },
    /// Lease checkpoint: the leader records that each listed session had gone unrenewed for
    /// `unrenewed_ms` when it proposed this. While a mark stands, the leader renews the session
    /// only through the log ([`Op::RenewLeases`]), so a later leader can trust the mark and
    /// need not restart that lease at a full TTL. This bounds how long repeated leader changes
    /// can keep a dead client's session alive.
    MarkLeases { marks: Vec<(SessionId, u64)> },
    /// A keepalive renewed these marked sessions: their marks are cleared.
    RenewLeases { ids: Vec<SessionId> },
    /// End every wait whose timeout has passed by this entry's `now_ms` (at most
    /// `WAITS_EXPIRED_PER_ENTRY_MAX`, earliest first): each leaves its queue not granted. The
    /// leader proposes it when a wait's end passes on its clock.
    ExpireWaits,
    /// [`Op::CreateSession`] on behalf of `owner`, the identity the access-control list
    /// authenticated (issue #13): the session belongs to it, so another identity cannot use it,
    /// and it counts toward `owner`'s quotas. A variant of its own, added at the end, so that
    /// logs written before access control still decode.
    CreateOwnedSession {
        ttl_ms: u64,
        secret: u64,
        owner: String,
    },
    /// Open a session, with what `CreateSession` and `CreateOwnedSession` carry plus the
    /// client's owner description (issue #14 item 7). The one variant new leaders propose; the
    /// older two stay so that logs written before it still decode.
    OpenSession {
        ttl_ms: u64,
        secret: u64,
        /// The authenticated identity (access control), if any.
        identity: Option<String>,
        /// What the client says about itself; not authenticated.
        owner: Option<SessionOwner>,
    },
    /// An operator takes `name` from its holder (issue #14 item 6): the lock is handed to the
    /// next waiter with this entry's index as its token, as a release would. With `token`, only
    /// if the holder's token is that one. Recorded in the audit log.
    ForceRelease {
        name: String,
        token: Option<u64>,
        by: Actor,
        reason: String,
    },
    /// An operator ends `session` as an expiry would (its locks handed on, its waits dropped).
    /// Recorded in the audit log.
    RevokeSession {
        session: SessionId,
        by: Actor,
        reason: String,
    },
    /// [`Op::Acquire`] in a [`Mode`] (issue #32): exclusive (what `Acquire` does), shared (a
    /// reader of a read-write lock) or one of a semaphore's permits. A variant of its own, added
    /// at the end, so that every entry written before it still decodes to the same command.
    /// Leaders propose it for `Shared` and `Permits` only; an exclusive acquire stays `Acquire`.
    AcquireWith {
        session: SessionKey,
        seq: u64,
        name: String,
        wait_ms: u64,
        mode: Mode,
    },
    /// Campaign in the election `name` (issue #32): an exclusive acquire, as [`Op::Acquire`],
    /// whose grant publishes `value` (at most `limits::ELECTION_VALUE_BYTES_MAX` bytes) as the
    /// leader's. A queued campaign keeps its value until it is granted (handed over) or its
    /// wait ends. Added at the end, so that every entry written before it decodes the same.
    Campaign {
        session: SessionKey,
        seq: u64,
        name: String,
        wait_ms: u64,
        value: Vec<u8>,
    },
    /// The leader of `name` under `token` replaces its published value (issue #32). Anyone
    /// else (another session, a stale token, a reader or permit holder) is refused
    /// `Rejection::NotElectionLeader` and nothing changes.
    Proclaim {
        session: SessionKey,
        seq: u64,
        name: String,
        token: u64,
        value: Vec<u8>,
    },
    /// [`Op::Acquire`] of a mutex with a lock-delay (issue #32 item 4): when the grant this
    /// acquire gets ends by its session's expiry or revoke, or by an operator's force-release
    /// (not by a release or a close), the name is not granted again until an
    /// [`Op::EndDelays`] names the delay, which the leader proposes once `lock_delay_ms` (at
    /// most `limits::LOCK_DELAY_MS_MAX`) has passed on its monotonic clock since it saw the
    /// delay start; that hands it to its head waiter. A variant of its own, added after the elections'
    /// ones, so that every entry written before it decodes to the same command. Leaders propose
    /// it only for a delay above zero. A campaign takes no lock-delay (the server refuses one).
    AcquireDelayed {
        session: SessionKey,
        seq: u64,
        name: String,
        wait_ms: u64,
        lock_delay_ms: u64,
    },
    /// End the named lock-delays (the first `limits::DELAYS_ENDED_PER_ENTRY_MAX`; one no
    /// longer running under its token is passed over): each name goes to the first of its
    /// waiters whose wait has not ended, or is free. The leader proposes it when a delay has
    /// run its length on the leader's monotonic clock since the leader first saw it (a new
    /// leader starts every running delay afresh), so that no wall clock's step ends a delay
    /// early: the table keeps no end time.
    EndDelays { ends: Vec<DelayEnd> },
    /// Several client operations in one entry (issue #35), applied in order as if each had an
    /// entry of its own at this index: each keeps its (session, seq) and its exactly-once
    /// outcome, the table's invariants hold after each, and one refused changes nothing for the
    /// others. Only what [`Op::batchable`] says may be inside (no nested batch, no session
    /// opening: a session's id is its entry's index), at most `limits::BATCH_OPS_MAX` of
    /// them. Three orders are refused `Rejection::BatchConflict` because their tokens would
    /// not increase (see `LockTable::apply`). The answer is [`Outcome::Batch`], with one
    /// [`Applied`] per operation in [`Applied::ops`]. Added at the end, so every entry written
    /// before it decodes the same.
    Batch(Vec<Op>),
    /// An operator's force-release that says what it ends (issue #32): the holder's grant
    /// (`ForceTarget::Holder`, as [`Op::ForceRelease`] of a held name) or the name's running
    /// lock-delay (`ForceTarget::Delay`: the name goes to its first live waiter now). With
    /// `token`, only the grant, or the delay, under that token. A `Holder` force-release that
    /// finds the delay its own first attempt started (a retry after a lost answer: the same
    /// token) answers that attempt's outcome and changes nothing, so a retry never ends the
    /// delay the release started, as an [`Op::ForceRelease`] would (it ends a running delay,
    /// the only way there was). Leaders propose it for a name with a lock-delay (running, or
    /// asked for by its holder) and for every `Delay` target; a name without one gets the
    /// [`Op::ForceRelease`] it always did, which earlier builds read. Added at the end, so
    /// every entry written before it decodes the same.
    ForceReleaseTargeted {
        name: String,
        token: Option<u64>,
        target: ForceTarget,
        by: Actor,
        reason: String,
    },
}

/// What an operator's [`Op::ForceReleaseTargeted`] ends.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForceTarget {
    /// The holder's grant (of several holders: the grant under the token, or every one).
    Holder,
    /// The running lock-delay: the name is granted to its first live waiter, or is free.
    Delay,
}

/// A running lock-delay an [`Op::EndDelays`] ends: the name, and the token of the grant whose
/// loss started it (a later delay of the same name has another).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct DelayEnd {
    pub name: String,
    pub token: u64,
}

/// How an acquire takes its lock (issue #32). A name is used one way at a time while anyone
/// holds or waits for it: as a lock (exclusive and shared holders: a read-write lock, of which
/// a mutex is the case with no reader) or as a semaphore of a fixed number of permits.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// The only holder: a mutex, or a read-write lock's writer. What [`Op::Acquire`] takes.
    Exclusive,
    /// One of any number of holders that are all shared: a read-write lock's reader.
    Shared,
    /// One of the permits of a semaphore of this many (fixed by the acquire that finds the
    /// name free, at most `limits::HOLDERS_PER_LOCK_MAX`).
    Permits(u32),
}

/// What a name is used as while held or waited for (see [`Mode`]).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockKind {
    /// A lock: one exclusive holder, or shared holders.
    Lock,
    /// A semaphore of this many permits.
    Semaphore { permits: u32 },
}

impl Mode {
    /// The kind of name this mode takes.
    pub fn kind(self) -> LockKind {
        match self {
            Mode::Exclusive | Mode::Shared => LockKind::Lock,
            Mode::Permits(permits) => LockKind::Semaphore { permits },
        }
    }
}

impl std::fmt::Display for LockKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockKind::Lock => f.write_str("a lock (exclusive or shared)"),
            LockKind::Semaphore { permits } => write!(f, "a semaphore of {permits} permits"),
        }
    }
}

/// A client's description of who runs a session: shown by `status` and `list` next to the
/// holder and the waiters. Not authenticated (contrast the *identity*, which access control
/// proves): it is what the client says. Each field is bounded (`limits::OWNER_*_BYTES_MAX`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionOwner {
    pub host: String,
    pub pid: u32,
    pub user: String,
    pub text: String,
}

impl SessionOwner {
    /// Every field within its limit; `Err` names the first one over.
    pub fn validate(&self) -> Result<(), Rejection> {
        for (field, value, max) in [
            ("host", &self.host, crate::limits::OWNER_HOST_BYTES_MAX),
            ("user", &self.user, crate::limits::OWNER_USER_BYTES_MAX),
            ("text", &self.text, crate::limits::OWNER_TEXT_BYTES_MAX),
        ] {
            if value.len() > max {
                return Err(Rejection::FieldTooLong {
                    field: format!("owner {field}"),
                    len: value.len(),
                    max,
                });
            }
        }
        Ok(())
    }
}

/// Who did an administrative action: the identity access control authenticated (`None` when
/// it is off: "anonymous"), and what the operator's tool said about them (e.g. `user@host`,
/// not authenticated).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Actor {
    pub identity: Option<String>,
    pub claimed: String,
}

impl Actor {
    pub fn validate(&self) -> Result<(), Rejection> {
        let identity = self.identity.as_deref().unwrap_or("");
        for (field, value, max) in [
            ("identity", identity, crate::limits::AUDIT_ACTOR_BYTES_MAX),
            (
                "operator",
                self.claimed.as_str(),
                crate::limits::AUDIT_ACTOR_BYTES_MAX,
            ),
        ] {
            if value.len() > max {
                return Err(Rejection::FieldTooLong {
                    field: field.into(),
                    len: value.len(),
                    max,
                });
            }
        }
        Ok(())
    }
}

/// Why an administrative action was taken: required, bounded.
pub fn validate_reason(reason: &str) -> Result<(), Rejection> {
    if reason.trim().is_empty() {
        return Err(Rejection::ReasonEmpty);
    }
    if reason.len() > crate::limits::AUDIT_REASON_BYTES_MAX {
        return Err(Rejection::FieldTooLong {
            field: "reason".into(),
            len: reason.len(),
            max: crate::limits::AUDIT_REASON_BYTES_MAX,
        });
    }
    Ok(())
}

/// One administrative action, as the audit log keeps it (`limits::AUDIT_RECORDS_MAX` of them,
/// oldest dropped first).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct AuditRecord {
    /// The log index of the entry that did it.
    pub index: u64,
    /// The leader's wall clock when it was proposed (Unix ms).
    pub at_ms: u64,
    pub action: AuditAction,
    pub by: Actor,
    pub reason: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum AuditAction {
    /// `name` was taken from `session`'s grant `token`; `next_token` is the grant to the next
    /// waiter, if one got it.
    ForceRelease {
        name: String,
        session: SessionId,
        token: u64,
        next_token: Option<u64>,
    },
    /// `session` was ended; it held `locks` locks.
    RevokeSession { session: SessionId, locks: u32 },
}

impl Op {
    /// An operator's force-release of `name`: the [`Op::ForceReleaseTargeted`] that says what
    /// it ends, or without a `target` the [`Op::ForceRelease`] earlier builds read.
    pub fn force_release(
        name: String,
        token: Option<u64>,
        target: Option<ForceTarget>,
        by: Actor,
        reason: String,
    ) -> Op {
        match target {
            Some(target) => Op::ForceReleaseTargeted {
                name,
                token,
                target,
                by,
                reason,
            },
            None => Op::ForceRelease {
                name,
                token,
                by,
                reason,
            },
        }
    }

    /// The (session, sequence number) that makes this command exactly-once, if any.
    pub fn request_id(&self) -> Option<(SessionId, u64)> {
        match self {
            Op::Acquire { session, seq, .. }
            | Op::AcquireWith { session, seq, .. }
            | Op::Campaign { session, seq, .. }
            | Op::Proclaim { session, seq, .. }
            | Op::AcquireDelayed { session, seq, .. }
            | Op::Release { session, seq, .. } => Some((session.id, *seq)),
            Op::CancelWait { session, seq } => Some((session.id, *seq)),
            Op::CreateSession { .. }
            | Op::CreateOwnedSession { .. }
            | Op::OpenSession { .. }
            | Op::ForceRelease { .. }
            | Op::ForceReleaseTargeted { .. }
            | Op::RevokeSession { .. }
            | Op::CloseSession { .. }
            | Op::ExpireSessions { .. }
            | Op::MarkLeases { .. }
            | Op::RenewLeases { .. }
            | Op::ExpireWaits
            | Op::EndDelays { .. }
            | Op::Batch(_) => None,
        }
    }

    /// Whether this operation may be one of an [`Op::Batch`]: a client's acquire, cancel,
    /// release, proclaim or close. Not a batch (no nesting), not a session's opening (its id
    /// is its entry's index, which two sessions cannot share), and not what the leader or an
    /// operator proposes (expiries, lease marks, force-releases, `EndDelays`): those keep
    /// entries of their own. A lock-delay acquire ([`Op::AcquireDelayed`]) is a client's
    /// acquire like any: its delay starts only when its grant is lost (an expiry, a revoke, a
    /// force-release), never by a batch, whose releases and closes end grants cleanly and may
    /// not end a grant the batch made (`Rejection::BatchConflict`).
    pub fn batchable(&self) -> bool {
        matches!(
            self,
            Op::Acquire { .. }
                | Op::AcquireWith { .. }
                | Op::AcquireDelayed { .. }
                | Op::Campaign { .. }
                | Op::Proclaim { .. }
                | Op::CancelWait { .. }
                | Op::Release { .. }
                | Op::CloseSession { .. }
        )
    }

    /// An upper bound of the bytes this operation takes in an entry (postcard: varints, the
    /// name and value with their lengths), for `limits::BATCH_BYTES_MAX`.
    pub fn bytes_max(&self) -> usize {
        const FIXED: usize = 64;
        match self {
            Op::Acquire { name, .. }
            | Op::AcquireWith { name, .. }
            | Op::AcquireDelayed { name, .. }
            | Op::Release { name, .. } => FIXED + name.len(),
            Op::Campaign { name, value, .. } | Op::Proclaim { name, value, .. } => {
                FIXED + name.len() + value.len()
            }
            Op::Batch(ops) => FIXED + ops.iter().map(Op::bytes_max).sum::<usize>(),
            _ => FIXED,
        }
    }
}

/// Check a batch's operations before it is proposed: not empty, at most
/// `limits::BATCH_OPS_MAX` operations and `limits::BATCH_BYTES_MAX` bytes, each batchable.
pub fn validate_batch(ops: &[Op]) -> Result<(), Rejection> {
    if ops.is_empty() || ops.len() > crate::limits::BATCH_OPS_MAX {
        return Err(Rejection::BatchTooLarge {
            ops: ops.len(),
            max: crate::limits::BATCH_OPS_MAX,
        });
    }
    let bytes: usize = ops.iter().map(Op::bytes_max).sum();
    if bytes > crate::limits::BATCH_BYTES_MAX {
        return Err(Rejection::FieldTooLong {
            field: "batch".into(),
            len: bytes,
            max: crate::limits::BATCH_BYTES_MAX,
        });
    }
    if ops.iter().any(|op| !op.batchable()) {
        return Err(Rejection::NotBatchable);
    }
    Ok(())
}

/// The result of one command, as the proposer sees it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    SessionCreated {
        id: SessionId,
        ttl_ms: u64,
    },
    SessionClosed,
    /// The sessions of an `ExpireSessions` that still existed and are now gone.
    SessionsExpired {
        ids: Vec<SessionId>,
    },
    /// The lock is yours; `token` is the fencing token of this grant.
    Granted {
        token: u64,
    },
    /// You are in the queue at this 1-based position; a later entry will grant or cancel.
    Queued {
        position: u32,
    },
    /// Not granted: the lock was held and the request did not wait, or its wait was cancelled.
    NotGranted,
    Released,
    /// The release named a grant that is not current (already released, expired, or another
    /// token): nothing changed. Releases are idempotent by token.
    NotHolder,
    Rejected(Rejection),
    /// The live sessions of a `MarkLeases`, now marked.
    LeasesMarked {
        ids: Vec<SessionId>,
    },
    /// The live sessions of a `RenewLeases`, now unmarked.
    LeasesRenewed {
        ids: Vec<SessionId>,
    },
    /// An `ExpireWaits` ended this many waits.
    WaitsExpired {
        count: usize,
    },
    /// A `ForceRelease` took the lock from `session`'s grant `token`.
    ForceReleased {
        session: SessionId,
        token: u64,
    },
    /// A `RevokeSession` ended the session, which held `locks` locks.
    SessionRevoked {
        locks: u32,
    },
    /// A `Proclaim` replaced the leader's published value (issue #32; since snapshot format 9).
    Proclaimed,
    /// An `EndDelays` ended this many lock-delays (issue #32 item 4).
    DelaysEnded {
        count: usize,
    },
    /// An `Op::Batch` was applied: each operation's answer is in `Applied::ops`, in order.
    /// Never remembered by a session (only its operations' outcomes are).
    Batch,
}

/// Why a command changed nothing. Each is a client error: a retry with the same input gets the
/// same answer.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("lock name is empty")]
    NameEmpty,
    #[error("lock name is {len} bytes, the limit is {max}")]
    NameTooLong { len: usize, max: usize },
    #[error("session TTL {ttl_ms} ms is outside {min}..={max} ms")]
    TtlOutOfRange { ttl_ms: u64, min: u64, max: u64 },
    #[error("session {id} does not exist (expired, closed, or never created)")]
    SessionNotFound { id: SessionId },
    #[error("too many sessions (limit {max})")]
    TooManySessions { max: usize },
    #[error("session holds or waits for too many locks (limit {max})")]
    TooManyLocksForSession { max: usize },
    #[error("too many locks in this group (limit {max})")]
    TooManyLocks { max: usize },
    #[error("the queue of this lock is full (limit {max} waiters)")]
    QueueFull { max: usize },
    #[error("this session already holds the lock (token {token})")]
    AlreadyHeld { token: u64 },
    #[error("this session is already waiting for the lock (request {seq})")]
    AlreadyWaiting { seq: u64 },
    #[error("request {seq} is older than the outcomes this session remembers")]
    RequestTooOld { seq: u64 },
    #[error("no acquire with request {seq} is known in this session")]
    UnknownRequest { seq: u64 },
    /// A request reused the sequence number of another kind of request (a release with an
    /// acquire's): a client bug, never retried into success.
    #[error("request {seq} reuses the sequence number of another request")]
    SequenceReused { seq: u64 },
    #[error("{field} is {len} bytes, the limit is {max}")]
    FieldTooLong {
        field: String,
        len: usize,
        max: usize,
    },
    #[error("a reason is required")]
    ReasonEmpty,
    #[error("lock {name:?} is not held")]
    LockNotHeld { name: String },
    #[error("lock {name:?} is held under token {holder_token}, not {token}: nothing released")]
    TokenMismatch {
        name: String,
        token: u64,
        holder_token: u64,
    },
    /// The table's byte budget (`limits::TABLE_BYTES_MAX`, `--table-bytes-max`) has no room for
    /// what the command would add: `bytes` is what the table held when it was refused.
    #[error(
        "the lock table is full: it holds {bytes} bytes of its budget {max}; release locks or \
         close sessions to make room"
    )]
    TableFull { bytes: usize, max: usize },
    /// Never in an applied entry's outcome (see `validate_name`); last, so that the encoding
    /// of the others is unchanged.
    #[error("lock name has a control character at byte {at} (newlines, tabs and escapes are not allowed)")]
    NameControlCharacter { at: usize },
    /// An acquire asked for a name as one kind while it is held or waited for as another
    /// (issue #32): nothing changed; it can be taken as `asked` once it is free.
    #[error("{name:?} is in use as {held}; it cannot be taken as {asked} until it is free")]
    KindConflict {
        name: String,
        held: LockKind,
        asked: LockKind,
    },
    /// A semaphore's permits are fixed by the acquire that found it free: an acquire asking
    /// for another count is refused, changing nothing.
    #[error("{name:?} is a semaphore of {permits} permits, not {asked}")]
    PermitsConflict {
        name: String,
        permits: u32,
        asked: u32,
    },
    #[error("a semaphore has 1 to {max} permits, not {permits}")]
    PermitsOutOfRange { permits: u32, max: u32 },
    /// A proclaim from a session that does not lead `name` under `token` (issue #32): it never
    /// led, or lost the lead (released, expired, force-released), or holds it shared or as a
    /// permit. Nothing changed.
    #[error("this session does not lead {name:?} under token {token}: nothing proclaimed")]
    NotElectionLeader { name: String, token: u64 },
    /// A lock-delay longer than `limits::LOCK_DELAY_MS_MAX` (issue #32 item 4).
    #[error("a lock-delay is at most {max} ms, not {lock_delay_ms}")]
    LockDelayOutOfRange { lock_delay_ms: u64, max: u64 },
    /// A lock-delay belongs to a mutex: an acquire with one of a name used as a read-write
    /// lock with readers or a semaphore, or a reader's or permit's acquire of a name whose
    /// holder or waiter asked for a delay, or that is in a delay, is refused, changing nothing.
    #[error("{name:?} has or asks for a lock-delay, which only a mutex (exclusive holders) takes")]
    LockDelayConflict { name: String },
    /// The group keeps `limits::DELAYS_MAX` lock-delays (asked for, held or running): an
    /// acquire asking for another is refused, changing nothing (one without a delay is not).
    #[error("the group keeps {max} lock-delays, its limit: acquire without one, or later")]
    TooManyDelays { max: usize },
    /// An `Op::Batch` with no operation or more than `limits::BATCH_OPS_MAX`: nothing applied.
    /// This and the two below are never remembered by a session: the operation did not happen,
    /// and may be sent again (alone, or in another batch).
    #[error("a batch has 1 to {max} operations, not {ops}")]
    BatchTooLarge { ops: usize, max: usize },
    /// An operation that cannot be in a batch (see `Op::batchable`): nothing changed for it.
    #[error(
        "only acquires, cancels, releases, proclaims and closes can be batched (not a batch, \
         a session's opening, or what the leader or an operator proposes)"
    )]
    NotBatchable,
    /// An operation of a batch that would end or take again a grant an earlier operation of
    /// the same batch made (a release of `name`, a close of its new holder, or a second
    /// acquire of a semaphore's permits): both would share the entry's index, so the fencing
    /// tokens of `name` would not increase. Nothing changed for it; alone (its own entry) it
    /// applies.
    #[error(
        "{name:?} was granted or acquired earlier in the same batch: send this operation alone"
    )]
    BatchConflict { name: String },
    /// An operator's end of a lock-delay ([`ForceTarget::Delay`]) found none running (under
    /// the token it named): it ended on its own, or never started. Nothing changed; the name's
    /// holder, if it has one now, keeps it. Never remembered by a session (operators' entries
    /// have no sequence number).
    #[error("no lock-delay of {name:?} is running{}: nothing ended", token.map(|t| format!(" under token {t}")).unwrap_or_default())]
    NoLockDelay { name: String, token: Option<u64> },
}

impl Rejection {
    /// Whether this rejection exists only since snapshot format 8 (issue #32): a table that
    /// remembers one cannot be written in format 7, which older members read.
    pub(crate) fn since_format_8(&self) -> bool {
        matches!(
            self,
            Rejection::KindConflict { .. }
                | Rejection::PermitsConflict { .. }
                | Rejection::PermitsOutOfRange { .. }
        )
    }

    /// Whether this rejection exists only since snapshot format 10 (lock-delay): a table that
    /// remembers one cannot be written in format 9 or older.
    pub(crate) fn since_format_10(&self) -> bool {
        matches!(
            self,
            Rejection::LockDelayOutOfRange { .. }
                | Rejection::LockDelayConflict { .. }
                | Rejection::TooManyDelays { .. }
        )
    }
}

impl Rejection {
    /// The name of the request's lock this rejection carries, if it carries one.
    fn lock_name_mut(&mut self) -> Option<&mut String> {
        match self {
            Rejection::LockNotHeld { name }
            | Rejection::TokenMismatch { name, .. }
            | Rejection::KindConflict { name, .. }
            | Rejection::PermitsConflict { name, .. }
            | Rejection::NotElectionLeader { name, .. }
            | Rejection::LockDelayConflict { name }
            // Never remembered (see `LockTable::apply`), but it names the request's lock.
            | Rejection::BatchConflict { name } => Some(name),
            _ => None,
        }
    }
}

impl Outcome {
    /// The outcome as a session remembers it for a retry: a rejection keeps no copy of the
    /// request's lock name (up to `LOCK_NAME_BYTES_MAX` bytes, while a remembered outcome is
    /// charged `TABLE_OUTCOME_BYTES`), since the retry names the lock again
    /// ([`Outcome::answered_for`] puts it back). [`crate::LockTable::request_state`] answers
    /// this form.
    pub fn remembered(mut self) -> Outcome {
        if let Outcome::Rejected(r) = &mut self {
            if let Some(name) = r.lock_name_mut() {
                *name = String::new();
            }
        }
        self
    }

    /// A remembered outcome as the answer to a retry of the request on the lock `name` (a
    /// retry is the same request; one that reuses the sequence number for another name gets
    /// the first request's answer naming its own lock).
    pub fn answered_for(mut self, name: &str) -> Outcome {
        if let Outcome::Rejected(r) = &mut self {
            if let Some(n) = r.lock_name_mut().filter(|n| n.is_empty()) {
                *n = name.to_owned();
            }
        }
        self
    }

    /// Whether this outcome exists only since snapshot format 9 (issue #32's elections): a
    /// table that remembers one cannot be written in format 8 or 7.
    pub(crate) fn since_format_9(&self) -> bool {
        matches!(
            self,
            Outcome::Proclaimed | Outcome::Rejected(Rejection::NotElectionLeader { .. })
        )
    }
}

/// A queued waiter that was granted the lock by this entry (a release, close or expiry handed
/// it over). The server wakes the Acquire call waiting for `(session, seq)`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Handoff {
    pub name: String,
    pub session: SessionId,
    pub seq: u64,
    pub token: u64,
}

/// Everything one applied entry produced.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    pub outcome: Outcome,
    /// Grants to queued waiters made by this entry, in the order they were made.
    pub handoffs: Vec<Handoff>,
    /// Waits that ended without a grant because their session went away in this entry.
    pub dropped_waits: Vec<(SessionId, u64)>,
    /// Waits that ended without a grant because their wait timeout had passed.
    pub ended_waits: Vec<(SessionId, u64)>,
    /// An Acquire not granted because the lock was held: the holder as of this entry, so the
    /// caller can say who held it when it asked (not who holds it later).
    pub busy: Option<HolderState>,
    /// Every change to a lock's holder or queue made by this entry, in the order it was made
    /// (what `latchkey watch` streams; see [`crate::watch`]).
    pub changes: Vec<LockChange>,
    /// An `Op::Batch`'s answer: one per operation, in order (each with its own outcome,
    /// handoffs and changes; the fields above stay empty). Empty for any other command, so a
    /// single operation's answer is the one it always was. See [`Applied::per_op`].
    pub ops: Vec<Applied>,
}

/// One change to one lock made by an applied entry: the raw material of watch events. Why it
/// happened (a release, an expiry, a revoke) is the entry's command.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum LockChange {
    /// `session` got `name` with `token` (straight away, or handed over from the queue), in
    /// `mode`; `value` is the election value the grant published (a campaign's), if any.
    Granted {
        name: String,
        session: SessionId,
        token: u64,
        mode: Mode,
        value: Option<Vec<u8>>,
    },
    /// `session` lost its grant `token` of `name`.
    Released {
        name: String,
        session: SessionId,
        token: u64,
    },
    /// `session` joined `name`'s queue with its request `seq`.
    Queued {
        name: String,
        session: SessionId,
        seq: u64,
    },
    /// `session`'s request `seq` left `name`'s queue without a grant (its wait ended, was
    /// cancelled, or its session went away).
    WaitEnded {
        name: String,
        session: SessionId,
        seq: u64,
    },
    /// The leader `session` of `name` under `token` published `value` (an `Op::Proclaim`).
    Proclaimed {
        name: String,
        session: SessionId,
        token: u64,
        value: Vec<u8>,
    },
}

impl Applied {
    /// An answer with `outcome` and no effects.
    pub fn just(outcome: Outcome) -> Applied {
        Applied {
            outcome,
            handoffs: Vec::new(),
            dropped_waits: Vec::new(),
            ended_waits: Vec::new(),
            busy: None,
            changes: Vec::new(),
            ops: Vec::new(),
        }
    }

    /// Each operation of the command `op` with its answer, in the order applied: the pairs of
    /// a batch, or `(op, self)` alone. Whatever follows entries op by op (the waiters, the
    /// lease table, metrics, the watch) reads an entry through this, so it sees a batch's
    /// operations as it would see them one entry each.
    pub fn per_op<'a>(&'a self, op: &'a Op) -> Vec<(&'a Op, &'a Applied)> {
        match op {
            Op::Batch(ops) if self.outcome == Outcome::Batch => ops.iter().zip(&self.ops).collect(),
            _ => vec![(op, self)],
        }
    }
}

/// A read-only view of one lock.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct LockState {
    pub name: String,
    /// The holder; of a lock with several (readers, permits), the first granted.
    pub holder: Option<HolderState>,
    /// Every holder, in the order granted (issue #32): one for a mutex or a writer.
    pub holders: Vec<HolderState>,
    pub waiters: u32,
    /// The first waiters in queue order (all of them from `describe`, at most
    /// `limits::LIST_WAITERS_SHOWN_MAX` from `list`).
    pub queue: Vec<WaiterState>,
    /// The lock-delay the holder's grant asked for (ms), if any (issue #32 item 4).
    pub lock_delay_ms: Option<u64>,
    /// While a lock-delay runs (no holder): the wall-clock time (Unix ms) of the entry that
    /// started it plus its length, an estimate of its end for display: the leader times it on
    /// its monotonic clock, so it ends later after a failover, and the starting leader's clock
    /// may differ from the reader's. Never acted on.
    pub delay_until_ms: Option<u64>,
    /// While a lock-delay runs: the token of the lost grant that started it. A force-release
    /// (`Op::AdminRelease`) naming this token ends the delay.
    pub delay_token: Option<u64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct HolderState {
    pub session: SessionId,
    pub token: u64,
    /// How it holds the lock (exclusive, shared, or a permit of N).
    pub mode: Mode,
    /// Leader wall-clock time of the grant (Unix ms); "held for" is measured from it.
    pub granted_at_ms: u64,
    /// The holder session's owner description, if its client gave one.
    pub owner: Option<SessionOwner>,
    /// The election value this grant published (`Op::Campaign`, `Op::Proclaim`), if any: an
    /// exclusive holder with a value is an election's leader.
    pub value: Option<Vec<u8>>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct WaiterState {
    pub session: SessionId,
    /// How it asked for the lock.
    pub mode: Mode,
    /// Leader wall-clock time the wait began (Unix ms); "waited for" is measured from it.
    pub since_ms: u64,
    pub owner: Option<SessionOwner>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    pub id: SessionId,
    pub ttl_ms: u64,
    /// The lease checkpoint standing for this session: unrenewed for this long when marked.
    pub lease_mark_ms: Option<u64>,
}

/// What one identity holds in the table, against its quotas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdentityUsage {
    pub sessions: usize,
    /// Acquire requests queued by its sessions.
    pub waiting: usize,
    /// Lock-delays asked for by its queued acquires, held with its grants, and running after
    /// its grants were lost (issue #32 item 4): each keeps a name from everyone for a while.
    pub delays: usize,
}

/// Where a request stands, for a retried Acquire that re-attaches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestState {
    /// Still queued for `name` at this 1-based position.
    Waiting {
        name: String,
        position: u32,
    },
    Done(Outcome),
}
