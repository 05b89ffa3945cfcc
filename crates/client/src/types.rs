//! Plain answers of the read-only calls; no protobuf types leak out of this crate.

use std::time::Duration;

use latchkey_proto::v1 as pb;

/// One lock as the leader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    pub name: String,
    /// `None` when the lock is free.
    pub holder: Option<Holder>,
    /// Sessions queued for the lock.
    pub waiters: u32,
}

/// The current holder of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub session: u64,
    /// The fencing token of the grant.
    pub token: u64,
    /// How long the lock has been held, by the leader's clock.
    pub held_for: Duration,
}

impl LockInfo {
    pub(crate) fn from_pb(lock: pb::LockInfo) -> LockInfo {
        LockInfo {
            holder: lock.held.then(|| Holder {
                session: lock.session,
                token: lock.token,
                held_for: Duration::from_millis(lock.held_for_ms),
            }),
            name: lock.name,
            waiters: lock.waiters,
        }
    }
}

/// The answer of [`Client::list`](crate::Client::list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockList {
    pub locks: Vec<LockInfo>,
    /// More locks matched than the server returns in one answer.
    pub truncated: bool,
}

/// One node's view of its Raft group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub id: u64,
    /// "leader", "follower", "candidate", "learner" or "shutdown".
    pub role: String,
    pub term: u64,
    pub last_log_index: u64,
    pub applied_index: u64,
    /// The leader this node believes in, if any.
    pub leader_id: Option<u64>,
    /// The voters.
    pub members: Vec<Member>,
    /// Members being added, not voting yet.
    pub learners: Vec<Member>,
    /// The cluster's id (`latchkey serve --join` takes it).
    pub cluster_id: String,
    pub sessions: u64,
    pub locks: u64,
}

/// A member of a group: its id and client address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub addr: String,
}
