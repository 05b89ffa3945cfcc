//! A real openraft node of one member on the real storage: commands commit and apply, a snapshot
//! compacts the log, and a restart recovers the table from snapshot + log replay.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use latchkey_core::{Command, LockTable, Op, Outcome, SessionId, SessionKey};
use latchkey_raft::{
    AppendEntriesRequest, AppendEntriesResponse, LockStateMachine, LogStore, NoopObserver,
    RPCError, Raft, SnapshotData, SnapshotResponse, StateHandle, TypeConfig, Vote, VoteRequest,
    VoteResponse,
};
use openraft::errors::{ReplicationClosed, StreamingError};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::{BasicNode, Config, ServerState};

/// One member: nothing is ever sent.
struct NoPeers;

impl RaftNetworkFactory<TypeConfig> for NoPeers {
    type Network = NoPeers;
    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> NoPeers {
        panic!("a single-node group asked for a client to {target}")
    }
}

impl RaftNetworkV2<TypeConfig> for NoPeers {
    type SnapshotData = SnapshotData;
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse, RPCError> {
        unreachable!("no peers")
    }
    async fn vote(
        &mut self,
        _rpc: VoteRequest,
        _option: RPCOption,
    ) -> Result<VoteResponse, RPCError> {
        unreachable!("no peers")
    }
    async fn full_snapshot(
        &mut self,
        _vote: Vote,
        _snapshot: latchkey_raft::Snapshot,
        _cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse, StreamingError<TypeConfig>> {
        unreachable!("no peers")
    }
}

const WAIT: Option<Duration> = Some(Duration::from_secs(20));

async fn start(dir: &Path) -> (Raft, StateHandle, LogStore) {
    let config = Arc::new(Config::default().validate().unwrap());
    let log = LogStore::open(&dir.join("raft-log")).unwrap();
    let sm = LockStateMachine::open(&dir.join("snapshots"), Arc::new(NoopObserver)).unwrap();
    let handle = sm.handle();
    let raft = Raft::new(1, config, NoPeers, log.clone(), sm)
        .await
        .unwrap();
    (raft, handle, log)
}

async fn propose(raft: &Raft, op: Op) -> Outcome {
    let cmd = Command { now_ms: 1, op };
    raft.client_write(cmd.into()).await.unwrap().data.outcome
}

fn acquire(session: SessionKey, seq: u64, name: &str) -> Op {
    Op::Acquire {
        session,
        seq,
        name: name.into(),
        wait_ms: latchkey_core::limits::WAIT_TIMEOUT_MS_MAX,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_recovers_locks_and_tokens_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (raft, handle, log) = start(dir.path()).await;
    raft.initialize(BTreeMap::from([(1, BasicNode::new("127.0.0.1:0"))]))
        .await
        .unwrap();
    raft.wait(WAIT)
        .state(ServerState::Leader, "leader")
        .await
        .unwrap();

    let Outcome::SessionCreated { id, .. } = propose(
        &raft,
        Op::CreateSession {
            ttl_ms: 15_000,
            secret: 5,
        },
    )
    .await
    else {
        panic!("no session")
    };
    let session = SessionKey { id, secret: 5 };

    // Concurrent proposals: their appends can share transactions.
    let writes = (1..=20u64).map(|seq| {
        let raft = raft.clone();
        async move { propose(&raft, acquire(session, seq, &format!("lock-{seq}"))).await }
    });
    let outcomes = futures::future::join_all(writes).await;
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Granted { .. })),
        "{outcomes:?}"
    );

    // Snapshot and compact, then write more so the restart needs snapshot + log.
    raft.trigger().snapshot().await.unwrap();
    let applied = handle.applied_index();
    raft.wait(WAIT)
        .metrics(
            |m| m.snapshot.is_some_and(|s| s.index >= applied),
            "snapshot",
        )
        .await
        .unwrap();
    raft.trigger().purge_log(applied).await.unwrap();
    raft.wait(WAIT)
        .metrics(|m| m.purged.is_some_and(|p| p.index >= applied), "purged")
        .await
        .unwrap();
    let queued = propose(
        &raft,
        acquire(
            SessionKey {
                id: SessionId(id.0),
                secret: 5,
            },
            21,
            "lock-21",
        ),
    )
    .await;
    assert!(matches!(queued, Outcome::Granted { .. }));

    let before: LockTable = handle.read(|t| t.clone());
    let last = handle.applied_index();
    raft.shutdown().await.unwrap();
    drop((raft, log));

    let (raft, handle, _log) = start(dir.path()).await;
    raft.wait(WAIT)
        .applied_index_at_least(Some(last), "replayed")
        .await
        .unwrap();
    assert_eq!(handle.read(|t| t.clone()), before);

    // The token counter continues above everything granted before the restart.
    raft.wait(WAIT)
        .state(ServerState::Leader, "leader again")
        .await
        .unwrap();
    let Outcome::Granted { token } = propose(&raft, acquire(session, 22, "after-restart")).await
    else {
        panic!("not granted")
    };
    assert!(token > last, "token {token} <= {last}");
    raft.shutdown().await.unwrap();
}
