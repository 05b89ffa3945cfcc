//! openraft's storage conformance suite on latchkey's real storage: the segment log store and the
//! lock state machine, each built in a fresh temporary directory.

use std::sync::Arc;

use latchkey_raft::{LockStateMachine, LogStore, NoopObserver, StorageError, TypeConfig};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::type_config::TypeConfigExt;
use tempfile::TempDir;

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, LockStateMachine, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, LockStateMachine), StorageError> {
        let err = |e: String| StorageError::read(TypeConfig::err_from_string(e));
        let dir = tempfile::tempdir().map_err(|e| err(e.to_string()))?;
        let log = LogStore::open(&dir.path().join("raft-log")).map_err(|e| err(e.to_string()))?;
        let sm = LockStateMachine::open(&dir.path().join("snapshots"), Arc::new(NoopObserver))
            .map_err(|e| err(e.to_string()))?;
        Ok((dir, log, sm))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_passes() -> Result<(), StorageError> {
    Suite::test_all(Builder).await
}
