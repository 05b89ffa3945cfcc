//! What a node tells an observer that is not a client: the states the lease rules depend on
//! (a snapshot installed, leases resumed by a new leader, logged renewals, expiries), so a
//! simulation can count that its faults reached them. Production runs with [`NoProbe`].
//!
//! Also the planted bugs: switches that put back a fixed bug, for the simulation and the model
//! to prove that their checkers catch it. Off in every real configuration.

use std::sync::Arc;
use std::time::Duration;

use latchkey_core::SessionId;

/// One event on one node, in the order the node saw them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeEvent {
    /// The state machine replaced its table with a snapshot sent by the leader, covering the
    /// log up to `last_index`.
    SnapshotInstalled { last_index: u64 },
    /// This node, leader of `term`, resumed every lease after applying up to `applied_index`
    /// (its own first entry of the term or later). `stale_marks`: sessions whose lease mark in
    /// the lease table was not the one their table carries at that moment, the state issue #9's
    /// bug 1 needs (always 0 unless that bug is planted: the table's mark is taken).
    LeasesResumed {
        term: u64,
        applied_index: u64,
        stale_marks: usize,
        /// Each session's lease as resumed: how long it has left, on this node's clock. Empty
        /// unless [`Probe::wants_resumed_leases`]: a checker compares each with the client's
        /// own deadline at that moment (a lease resumed shorter than it is cut short, whether
        /// or not it later runs out).
        leases: Vec<(SessionId, Duration)>,
    },
    /// This leader committed a `RenewLeases` for these sessions.
    LeasesRenewedThroughLog { sessions: Vec<SessionId> },
    /// This leader committed the expiry of these sessions (their lease ran out here).
    SessionsExpired { sessions: Vec<SessionId> },
    /// This leader committed the end of this many waits whose wait timeout had passed.
    WaitsExpired { count: usize },
    /// This node, leader of `term`, asked openraft to hand the group to member `to`, its
    /// preferred leader (`node.rs` `rebalance_leadership`).
    LeaderTransferStarted { term: u64, to: u64 },
    /// This node, outside the group (replica subsets), sent a client to the group's replica
    /// `to` (`Groups::serving`).
    SentToReplica { to: u64 },
    /// A keepalive reached this node while it believed it led in `term` (openraft's metrics),
    /// before the node confirmed that with a quorum. Only for a probe that asks
    /// ([`Probe::wants_keepalives`]): one per keepalive request on the hot path.
    KeepAliveAtLeader { term: u64 },
    /// This node asked openraft for a snapshot (and openraft took the request) because `ops`
    /// client operations were applied since its last snapshot, with the leader's coalescing on
    /// (`Node::lease_duties`, issue #35: openraft's own policy counts entries, and one entry
    /// carries up to `BATCH_OPS_MAX` operations).
    SnapshotAskedByOperations { ops: u64 },
    /// After a [`ProbeEvent::SnapshotAskedByOperations`], this node saw its count of operations
    /// since the last snapshot go back: a snapshot was built or installed here since it asked.
    /// Once per ask at most; the observer tells a build from an install by the
    /// [`ProbeEvent::SnapshotInstalled`] between them.
    SnapshotTakenAfterAsk,
}

pub trait Probe: Send + Sync + 'static {
    /// `node` saw `event` in its member of Raft group `group` (0 in a cluster of one group).
    fn event(&self, node: u64, group: u32, event: ProbeEvent);

    /// Whether [`ProbeEvent::LeasesResumed`] should list every lease (one element per session,
    /// built at each leader change only for a probe that asks).
    fn wants_resumed_leases(&self) -> bool {
        false
    }

    /// Whether the node should report [`ProbeEvent::KeepAliveAtLeader`] (it reads the Raft
    /// metrics for each keepalive only for a probe that asks).
    fn wants_keepalives(&self) -> bool {
        false
    }
}

pub type SharedProbe = Arc<dyn Probe>;

/// Tells nobody.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProbe;

impl Probe for NoProbe {
    fn event(&self, _node: u64, _group: u32, _event: ProbeEvent) {}
}

/// Bugs that latchkey fixed, put back on purpose so that a checker can show it catches them.
/// Every field is false outside the simulation and the lease model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[doc(hidden)]
pub struct Plant {
    /// After a snapshot install, keep the lease marks this node applied before the install
    /// (issue #9, bug 1): a new leader then resumes a lease from a mark the table no longer has.
    pub stale_mark_after_install: bool,
    /// A new leader resumes leases as soon as it is elected, before it applied the entries the
    /// old leader committed (issue #9, bug 2).
    pub resume_before_applied: bool,
    /// A keepalive is answered on this node's own belief that it leads (openraft's metrics),
    /// without a quorum confirming it after the keepalive arrived: a deposed leader that has
    /// not heard of its successor, or one handing its group over (a leader transfer, which
    /// skips the followers' leader lease), renews leases its successor already resumed.
    pub renew_without_quorum: bool,
    /// Not a bug: for a planted storage bug that loses acknowledged entries, let openraft
    /// accept a follower's reverted log (`allow_log_reversion`) instead of panicking, so that
    /// the run goes on and the history checkers judge the consequences. (A panic inside a
    /// simulated host can abort the whole test process while its runtime unwinds.)
    pub tolerate_log_reversion: bool,
    /// Bugs of the read-write locks, semaphores and elections (issue #32) put back in the lock
    /// table (`latchkey_core::TablePlant`), set on every member's table like its byte budget.
    pub table: latchkey_core::TablePlant,
    /// The leader ends each lock-delay (issue #32 item 4) at half its length on its clock
    /// (`node/delays.rs`): a name lost with a delay is granted again before the delay is over.
    pub delay_ends_early: bool,
    /// The leader hands a batch entry's answers (issue #35, `ServerConfig::coalesce`) to its
    /// callers in reverse order (`node/gather.rs`): the batch was proposed oldest first and
    /// answered newest first, so each caller of a batch of several gets another's outcome (a
    /// grant of another name or session, a release it did not ask for).
    pub batch_answers_reversed: bool,
}
