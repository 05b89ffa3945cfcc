//! The openraft glue for the lock table: one Raft group replicating `latchkey_core::LockTable`.
//!
//! Layout:
//! - this file: [`TypeConfig`] (what the log carries: [`LogCommand`], a
//!   [`latchkey_core::Command`], in; [`latchkey_core::Applied`] out) and the aliases the server
//!   uses.
//! - [`state_machine`]: [`LockStateMachine`], openraft's `RaftStateMachine` around the table;
//!   [`StateHandle`], the server's read handle; [`ApplyObserver`], told of every applied command.
//! - [`snapshot`]: the snapshot file format (versioned header, checksum, postcard) and its atomic
//!   write.
//! - [`removed`]: [`RemovedMembers`], the ids membership changes took out of the group, kept
//!   with the table so that the server refuses a removed member's messages.
//! - [`runtime`]: [`LatchkeyRuntime`], openraft's tokio runtime with a seedable RNG
//!   ([`seed_thread_rng`]), so the simulation can replay openraft's random election timeouts.
//!
//! The log itself lives in `latchkey-log-store` ([`LogStore`]). A node is assembled as
//! `Raft::new(id, config, network, LogStore::open(..)?, LockStateMachine::open(..)?)`.

pub mod removed;
pub mod runtime;
pub mod snapshot;
pub mod state_machine;

use std::fmt;

use latchkey_core::{Command, Op};
use serde::{Deserialize, Serialize};

pub use removed::RemovedMembers;
pub use runtime::{seed_thread_rng, LatchkeyRuntime};
pub use state_machine::{
    ApplyObserver, LockSnapshotBuilder, LockStateMachine, NoopObserver, StateHandle,
};

openraft::declare_raft_types!(
    /// The types of latchkey's Raft group: lock commands in, their outcomes out, `u64` node ids,
    /// nodes addressed by `BasicNode { addr }`, on tokio ([`LatchkeyRuntime`]: tokio with an RNG
    /// the simulation can seed; OS-seeded unless [`seed_thread_rng`] is called).
    pub TypeConfig:
        D = LogCommand,
        R = latchkey_core::Applied,
        NodeId = u64,
        Node = openraft::BasicNode,
        AsyncRuntime = LatchkeyRuntime,
);

/// A [`Command`] as the Raft log carries it. openraft requires `Display` of log data (it logs
/// entries), which the core does not provide; this wrapper adds one that never prints session
/// secrets. Serialized exactly as the inner `Command` (a newtype is transparent to postcard),
/// so dropping the wrapper later would not change the log format.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(transparent)]
pub struct LogCommand(pub Command);

impl From<Command> for LogCommand {
    fn from(cmd: Command) -> Self {
        LogCommand(cmd)
    }
}

impl std::ops::Deref for LogCommand {
    type Target = Command;
    fn deref(&self) -> &Command {
        &self.0
    }
}

impl fmt::Display for LogCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0.op {
            Op::CreateSession { ttl_ms, .. } => write!(f, "CreateSession(ttl_ms={ttl_ms})"),
            Op::CreateOwnedSession { ttl_ms, owner, .. } => {
                write!(f, "CreateOwnedSession(ttl_ms={ttl_ms}, owner={owner:?})")
            }
            Op::CloseSession { session } => write!(f, "CloseSession({})", session.id),
            Op::ExpireSessions { ids } => write!(f, "ExpireSessions({} sessions)", ids.len()),
            Op::Acquire {
                session,
                seq,
                name,
                wait_ms,
            } => write!(
                f,
                "Acquire({}#{seq}, {name:?}, wait_ms={wait_ms})",
                session.id
            ),
            Op::CancelWait { session, seq } => write!(f, "CancelWait({}#{seq})", session.id),
            Op::Release {
                session,
                seq,
                name,
                token,
            } => write!(f, "Release({}#{seq}, {name:?}, token={token})", session.id),
            Op::MarkLeases { marks } => write!(f, "MarkLeases({} sessions)", marks.len()),
            Op::RenewLeases { ids } => write!(f, "RenewLeases({} sessions)", ids.len()),
            Op::ExpireWaits => write!(f, "ExpireWaits"),
            Op::EndDelays { ends } => write!(f, "EndDelays({} names)", ends.len()),
            Op::AcquireDelayed {
                session,
                seq,
                name,
                wait_ms,
                lock_delay_ms,
            } => write!(
                f,
                "AcquireDelayed({}#{seq}, {name:?}, wait_ms={wait_ms}, \
                 lock_delay_ms={lock_delay_ms})",
                session.id
            ),
            // The owner description is the client's to show, not the log's (it may name users).
            Op::OpenSession {
                ttl_ms, identity, ..
            } => write!(f, "OpenSession(ttl_ms={ttl_ms}, identity={identity:?})"),
            Op::ForceRelease { name, token, .. } => {
                write!(f, "ForceRelease({name:?}, token={token:?})")
            }
            Op::RevokeSession { session, .. } => write!(f, "RevokeSession({session})"),
            Op::AcquireWith {
                session,
                seq,
                name,
                wait_ms,
                mode,
            } => write!(
                f,
                "AcquireWith({}#{seq}, {name:?}, wait_ms={wait_ms}, {mode:?})",
                session.id
            ),
            // An election's value is the client's to show, not the log's.
            Op::Campaign {
                session,
                seq,
                name,
                wait_ms,
                value,
            } => write!(
                f,
                "Campaign({}#{seq}, {name:?}, wait_ms={wait_ms}, {} value bytes)",
                session.id,
                value.len()
            ),
            Op::Proclaim {
                session,
                seq,
                name,
                token,
                value,
            } => write!(
                f,
                "Proclaim({}#{seq}, {name:?}, token={token}, {} value bytes)",
                session.id,
                value.len()
            ),
        }
    }
}

/// A node id; also the member id in the membership config.
pub type NodeId = u64;
pub type Node = openraft::BasicNode;
pub type Raft = openraft::Raft<TypeConfig, LockStateMachine>;
pub type LogStore = latchkey_log_store::LogStore<TypeConfig>;
pub use latchkey_log_store::LogStoreError;

/// The bytes of one snapshot: exactly the content of the snapshot file (see [`snapshot`]).
pub type SnapshotData = std::io::Cursor<Vec<u8>>;

pub type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
pub type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;
pub type Entry = openraft::type_config::alias::EntryOf<TypeConfig>;
pub type EntryPayload = openraft::type_config::alias::EntryPayloadOf<TypeConfig>;
pub type Membership = openraft::Membership<NodeId, Node>;
pub type StoredMembership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
pub type Snapshot = openraft::type_config::alias::SnapshotOf<TypeConfig, SnapshotData>;

pub type RaftMetrics = openraft::RaftMetrics<TypeConfig>;
pub type StorageError = openraft::StorageError<TypeConfig>;
pub type Fatal = openraft::errors::Fatal<TypeConfig>;
pub type RaftError<E = openraft::errors::Infallible> = openraft::errors::RaftError<TypeConfig, E>;
pub type RPCError<E = openraft::errors::Infallible> = openraft::errors::RPCError<TypeConfig, E>;
pub type ClientWriteError = openraft::errors::ClientWriteError<TypeConfig>;
pub type ClientWriteResponse = openraft::raft::ClientWriteResponse<TypeConfig>;
pub type ForwardToLeader = openraft::errors::ForwardToLeader<TypeConfig>;
pub type InitializeError = openraft::errors::InitializeError<TypeConfig>;
pub type LinearizableReadError = openraft::errors::LinearizableReadError<TypeConfig>;
pub type VoteRequest = openraft::raft::VoteRequest<TypeConfig>;
pub type VoteResponse = openraft::raft::VoteResponse<TypeConfig>;
pub type AppendEntriesRequest = openraft::raft::AppendEntriesRequest<TypeConfig>;
pub type AppendEntriesResponse = openraft::raft::AppendEntriesResponse<TypeConfig>;
pub type SnapshotResponse = openraft::raft::SnapshotResponse<TypeConfig>;
