//! The lock state machine across restarts and snapshot transfers.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};

use futures::stream;
use latchkey_core::{Applied, Command, Handoff, LockTable, Op, SessionId, SessionKey};
use latchkey_raft::snapshot::SNAPSHOT_FILE_NAME;
use latchkey_raft::{
    ApplyObserver, Entry, LockStateMachine, LogCommand, LogId, Membership, NoopObserver,
    SnapshotData, TypeConfig,
};
use openraft::entry::RaftEntry;
use openraft::storage::RaftStateMachine;
use openraft::vote::RaftLeaderId;
use openraft::{RaftSnapshotBuilder, RaftTypeConfig};

#[derive(Default)]
struct Recorder {
    applied: Mutex<Vec<(u64, Applied)>>,
    /// The tables the state machine reported as installed, with the index they cover.
    installed: Mutex<Vec<(u64, LockTable)>>,
}

impl ApplyObserver for Recorder {
    fn applied(&self, index: u64, _cmd: &Command, applied: &Applied) {
        self.applied.lock().unwrap().push((index, applied.clone()));
    }

    fn installed(&self, last_index: u64, table: &LockTable) {
        self.installed
            .lock()
            .unwrap()
            .push((last_index, table.clone()));
    }
}

fn log_id(index: u64) -> LogId {
    LogId::new(
        <TypeConfig as RaftTypeConfig>::LeaderId::new(1, 1).to_committed(),
        index,
    )
}

fn normal(index: u64, op: Op) -> Entry {
    Entry::new_normal(
        log_id(index),
        LogCommand(Command {
            now_ms: 1_000 + index,
            op,
        }),
    )
}

fn key(id: u64) -> SessionKey {
    SessionKey {
        id: SessionId(id),
        secret: 7,
    }
}

/// Blank, membership, then two sessions contending for "x": A holds it, B queues, A releases
/// and the lock is handed to B at index 7.
fn history() -> Vec<Entry> {
    vec![
        Entry::new_blank(log_id(1)),
        Entry::new_membership(
            log_id(2),
            Membership::new_with_defaults(vec![BTreeSet::from([1])], []),
        ),
        normal(
            3,
            Op::CreateSession {
                ttl_ms: 15_000,
                secret: 7,
            },
        ),
        normal(
            4,
            Op::CreateSession {
                ttl_ms: 15_000,
                secret: 7,
            },
        ),
        normal(
            5,
            Op::Acquire {
                session: key(3),
                seq: 1,
                name: "x".into(),
                wait_ms: 0,
            },
        ),
        normal(
            6,
            Op::Acquire {
                session: key(4),
                seq: 1,
                name: "x".into(),
                wait_ms: latchkey_core::limits::WAIT_TIMEOUT_MS_MAX,
            },
        ),
        normal(
            7,
            Op::Release {
                session: key(3),
                seq: 2,
                name: "x".into(),
                token: 5,
            },
        ),
    ]
}

async fn apply(sm: &mut LockStateMachine, entries: Vec<Entry>) -> std::io::Result<()> {
    sm.apply(stream::iter(entries.into_iter().map(|e| Ok((e, None)))))
        .await
}

fn open(dir: &Path) -> LockStateMachine {
    LockStateMachine::open(dir, Arc::new(NoopObserver)).unwrap()
}

#[tokio::test]
async fn restart_recovers_the_table_from_the_snapshot_and_tokens_continue() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = Arc::new(Recorder::default());
    let mut sm = LockStateMachine::open(dir.path(), recorder.clone()).unwrap();
    apply(&mut sm, history()).await.unwrap();

    // The observer saw each command once, in order, and the hand-over to B.
    let seen = recorder.applied.lock().unwrap().clone();
    assert_eq!(
        seen.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        vec![3, 4, 5, 6, 7]
    );
    assert_eq!(
        seen[4].1.handoffs,
        vec![Handoff {
            name: "x".into(),
            session: SessionId(4),
            seq: 1,
            token: 7
        }]
    );

    let before: LockTable = sm.handle().read(|t| t.clone());
    let applied_before = sm.applied_state().await.unwrap();
    assert_eq!(sm.handle().applied_index(), 7);
    let built = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    assert_eq!(built.meta.last_log_id, Some(log_id(7)));
    drop(sm);

    let mut sm = open(dir.path());
    assert_eq!(sm.handle().read(|t| t.clone()), before);
    assert_eq!(sm.applied_state().await.unwrap(), applied_before);
    assert_eq!(sm.handle().applied_index(), 7);
    let current = sm
        .get_current_snapshot()
        .await
        .unwrap()
        .expect("snapshot after restart");
    assert_eq!(current.meta, built.meta);

    // The entry after the snapshot grants with a higher token than any before the restart.
    apply(
        &mut sm,
        vec![normal(
            8,
            Op::Acquire {
                session: key(3),
                seq: 3,
                name: "y".into(),
                wait_ms: 0,
            },
        )],
    )
    .await
    .unwrap();
    let holder = sm
        .handle()
        .read(|t| t.describe("y"))
        .unwrap()
        .holder
        .unwrap();
    assert_eq!(holder.token, 8);
}

#[tokio::test]
async fn install_snapshot_rejects_corrupt_data_and_keeps_the_state() {
    let leader_dir = tempfile::tempdir().unwrap();
    let follower_dir = tempfile::tempdir().unwrap();
    let mut leader = open(leader_dir.path());
    apply(&mut leader, history()).await.unwrap();
    let snapshot = leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let bytes = snapshot.snapshot.into_inner();

    let recorder = Arc::new(Recorder::default());
    let mut follower = LockStateMachine::open(follower_dir.path(), recorder.clone()).unwrap();
    for i in [0, 3, bytes.len() / 2, bytes.len() - 1] {
        let mut bad = bytes.clone();
        bad[i] ^= 0x01;
        let err = follower
            .install_snapshot(&snapshot.meta, SnapshotData::new(bad))
            .await
            .expect_err("a corrupt snapshot was installed");
        assert_eq!(
            err.kind(),
            std::io::ErrorKind::InvalidData,
            "byte {i}: {err}"
        );
    }
    let truncated = bytes[..bytes.len() - 1].to_vec();
    assert!(follower
        .install_snapshot(&snapshot.meta, SnapshotData::new(truncated))
        .await
        .is_err());
    assert_eq!(follower.applied_state().await.unwrap().0, None);
    assert!(follower.get_current_snapshot().await.unwrap().is_none());
    assert!(!follower_dir.path().join(SNAPSHOT_FILE_NAME).exists());

    // Data that does not match the meta it came with is refused too.
    let mut wrong_meta = snapshot.meta.clone();
    wrong_meta.last_log_id = Some(log_id(6));
    assert!(follower
        .install_snapshot(&wrong_meta, SnapshotData::new(bytes.clone()))
        .await
        .is_err());

    follower
        .install_snapshot(&snapshot.meta, SnapshotData::new(bytes))
        .await
        .unwrap();
    let table = leader.handle().read(|t| t.clone());
    assert_eq!(follower.handle().read(|t| t.clone()), table);
    // Refused installs told the observer nothing; the installed one told it the whole table
    // (the server rebuilds its lease table from it: issue #9, bug 1).
    assert_eq!(
        *recorder.installed.lock().unwrap(),
        vec![(7, table.clone())]
    );
    drop(follower);
    // The installed snapshot is what a restart starts from.
    let follower = open(follower_dir.path());
    assert_eq!(follower.handle().read(|t| t.clone()), table);
    assert_eq!(follower.handle().applied_index(), 7);
}

#[tokio::test]
async fn open_refuses_a_corrupt_snapshot_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = open(dir.path());
    apply(&mut sm, history()).await.unwrap();
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    drop(sm);
    let path = dir.path().join(SNAPSHOT_FILE_NAME);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x80;
    std::fs::write(&path, bytes).unwrap();
    assert!(LockStateMachine::open(dir.path(), Arc::new(NoopObserver)).is_err());
}

#[tokio::test]
async fn a_replayed_command_is_an_error_not_a_second_apply() {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = open(dir.path());
    apply(&mut sm, history()).await.unwrap();
    let before = sm.handle().read(|t| t.clone());
    let replay = normal(
        7,
        Op::CreateSession {
            ttl_ms: 15_000,
            secret: 9,
        },
    );
    assert!(apply(&mut sm, vec![replay]).await.is_err());
    assert_eq!(sm.handle().read(|t| t.clone()), before);
}

#[tokio::test]
async fn blank_and_membership_entries_leave_the_table_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = open(dir.path());
    apply(&mut sm, history()[..2].to_vec()).await.unwrap();
    assert_eq!(sm.handle().read(|t| t.last_index()), 0);
    assert_eq!(sm.handle().applied_index(), 2);
    let (_, membership) = sm.applied_state().await.unwrap();
    assert_eq!(membership.log_id(), &Some(log_id(2)));
}

fn membership(configs: &[&[u64]]) -> Membership {
    let nodes: std::collections::BTreeMap<u64, latchkey_raft::Node> = [1u64, 2, 3]
        .iter()
        .filter(|id| configs.iter().any(|c| c.contains(id)))
        .map(|id| {
            let addr = format!("127.0.0.1:{}", 7000 + id);
            (*id, latchkey_raft::Node { addr })
        })
        .collect();
    let configs = configs
        .iter()
        .map(|c| c.iter().copied().collect::<BTreeSet<_>>())
        .collect();
    Membership::new(configs, nodes).unwrap()
}

/// The history of `fixtures/snapshot-v1.bin`: a group of {1, 2, 3} in which session 3 takes
/// "x" at 4, member 3 is removed (joint at 5, uniform at 6), and session 3 takes "y" at 7.
fn history_with_a_removal() -> Vec<Entry> {
    let key = key(3);
    vec![
        Entry::new_blank(log_id(1)),
        Entry::new_membership(log_id(2), membership(&[&[1, 2, 3]])),
        normal(
            3,
            Op::CreateSession {
                ttl_ms: 15_000,
                secret: 7,
            },
        ),
        normal(
            4,
            Op::Acquire {
                session: key,
                seq: 1,
                name: "x".into(),
                wait_ms: 0,
            },
        ),
        Entry::new_membership(log_id(5), membership(&[&[1, 2, 3], &[1, 2]])),
        Entry::new_membership(log_id(6), membership(&[&[1, 2]])),
        normal(
            7,
            Op::Acquire {
                session: key,
                seq: 2,
                name: "y".into(),
                wait_ms: 0,
            },
        ),
    ]
}

/// Issue #31: the ids a membership change removed are part of the state: recorded when the
/// entry is applied, carried by a snapshot to a member that installs it, read back after a
/// restart, and cleared when the same id is added again.
#[tokio::test]
async fn removed_members_survive_a_snapshot_install_and_a_restart_and_clear_when_re_added() {
    let leader_dir = tempfile::tempdir().unwrap();
    let follower_dir = tempfile::tempdir().unwrap();
    let mut leader = open(leader_dir.path());
    apply(&mut leader, history_with_a_removal()[..5].to_vec())
        .await
        .unwrap();
    assert_eq!(
        leader.handle().removed_at(3),
        None,
        "the joint config still has 3"
    );
    apply(&mut leader, history_with_a_removal()[5..].to_vec())
        .await
        .unwrap();
    assert_eq!(leader.handle().removed_at(3), Some(6));
    assert_eq!(leader.handle().removed_at(1), None);
    let snapshot = leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();

    let mut follower = open(follower_dir.path());
    follower
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    assert_eq!(follower.handle().removed_at(3), Some(6));
    drop(follower);
    let mut follower = open(follower_dir.path());
    assert_eq!(
        follower.handle().removed_at(3),
        Some(6),
        "after a restart, from the installed snapshot"
    );

    // Added again (as a learner, then a voter): no longer removed, also after a restart.
    apply(
        &mut follower,
        vec![Entry::new_membership(
            log_id(8),
            Membership::new(
                vec![BTreeSet::from([1, 2])],
                membership(&[&[1, 2, 3]])
                    .nodes()
                    .map(|(id, n)| (*id, n.clone()))
                    .collect::<std::collections::BTreeMap<_, _>>(),
            )
            .unwrap(),
        )],
    )
    .await
    .unwrap();
    assert_eq!(follower.handle().removed_at(3), None);
    follower
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    drop(follower);
    let follower = open(follower_dir.path());
    assert_eq!(follower.handle().removed_at(3), None);
    assert_eq!(follower.handle().applied_index(), 8);
}

/// Issue #31: a snapshot file of format version 1 (before the removed members were kept),
/// written by that release from [`history_with_a_removal`], still loads: the same table,
/// applied index and membership, and no removed members (version 1 has none). The next
/// removal is recorded, and the next snapshot is written in the current format.
#[tokio::test]
async fn a_version_1_snapshot_file_still_loads() {
    let fixture = include_bytes!("fixtures/snapshot-v1.bin");
    assert_eq!(fixture[0], latchkey_raft::snapshot::SNAPSHOT_FILE_FORMAT_V1);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(SNAPSHOT_FILE_NAME), fixture).unwrap();
    let mut sm = open(dir.path());

    let expected_dir = tempfile::tempdir().unwrap();
    let mut expected = open(expected_dir.path());
    apply(&mut expected, history_with_a_removal())
        .await
        .unwrap();
    // A table of format 10 or older remembers no request fingerprints (F2 of issue #35's
    // review, format 11): the same table but for those.
    assert_eq!(
        sm.handle().read(|t| t.clone()),
        expected.handle().read(|t| {
            let mut t = t.clone();
            t.forget_request_prints();
            t
        })
    );
    assert_eq!(
        sm.applied_state().await.unwrap(),
        expected.applied_state().await.unwrap()
    );
    assert_eq!(sm.handle().applied_index(), 7);
    assert_eq!(sm.handle().removed_at(3), None, "version 1 records none");

    apply(
        &mut sm,
        vec![Entry::new_membership(log_id(8), membership(&[&[1]]))],
    )
    .await
    .unwrap();
    assert_eq!(sm.handle().removed_at(2), Some(8));
    sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    drop(sm);
    let written = std::fs::read(dir.path().join(SNAPSHOT_FILE_NAME)).unwrap();
    assert_eq!(
        written[0],
        latchkey_raft::snapshot::SNAPSHOT_FILE_FORMAT_VERSION
    );
    let sm = open(dir.path());
    assert_eq!(sm.handle().removed_at(2), Some(8));
    assert!(sm.handle().read(|t| t.describe("y")).is_some());
}
