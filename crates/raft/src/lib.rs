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
        fmt_op(&self.0.op, f)
    }
}

/// Operations of a batch a log line shows; the rest are counted.
const BATCH_OPS_SHOWN: usize = 4;

/// One operation as a log line shows it: never a session's secret, an owner description or
/// an election's value.
fn fmt_op(op: &Op, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    {
        match op {
            Op::Batch(ops) => {
                write!(f, "Batch({} ops: ", ops.len())?;
                for (i, op) in ops.iter().take(BATCH_OPS_SHOWN).enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    fmt_op(op, f)?;
                }
                if ops.len() > BATCH_OPS_SHOWN {
                    write!(f, ", {} more", ops.len() - BATCH_OPS_SHOWN)?;
                }
                f.write_str(")")
            }
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
            Op::ForceReleaseTargeted {
                name,
                token,
                target,
                ..
            } => write!(
                f,
                "ForceReleaseTargeted({name:?}, token={token:?}, {target:?})"
            ),
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

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_core::{SessionId, SessionKey};

    /// A batch's log line shows its operations as each shows alone, a few of them, and never
    /// a session's secret or an election's value.
    #[test]
    fn a_batch_log_line_shows_no_secret_and_few_operations() {
        let session = SessionKey {
            id: SessionId(7),
            secret: 0x5ec7_e75e_c7e7,
        };
        let campaign = Op::Campaign {
            session,
            seq: 1,
            name: "leader".into(),
            wait_ms: 0,
            value: b"hidden-value".to_vec(),
        };
        let mut ops = vec![campaign, Op::CloseSession { session }];
        ops.extend((2..10).map(|seq| Op::Release {
            session,
            seq,
            name: format!("lock-{seq}"),
            token: seq,
        }));
        let line = LogCommand(Command {
            now_ms: 0,
            op: Op::Batch(ops),
        })
        .to_string();
        assert_eq!(
            line,
            "Batch(10 ops: Campaign(7#1, \"leader\", wait_ms=0, 12 value bytes), \
             CloseSession(7), Release(7#2, \"lock-2\", token=2), Release(7#3, \"lock-3\", \
             token=3), 6 more)"
        );
        assert!(!line.contains(&session.secret.to_string()));
    }
}
