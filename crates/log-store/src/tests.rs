use std::io;
use std::path::Path;
use std::sync::mpsc as std_mpsc;

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::type_config::alias::{LogIdOf, OneshotReceiverOf, VoteOf};
use openraft::type_config::TypeConfigExt;
use openraft::vote::RaftLeaderId;
use openraft::{RaftLogReader, RaftTypeConfig};
use redb::ReadableDatabase;

use super::*;

openraft::declare_raft_types!(pub(crate) Tc);

type Store = LogStore<Tc>;
type Entry = <Tc as RaftTypeConfig>::Entry;
type Flushed = OneshotReceiverOf<Tc, Result<(), io::Error>>;

fn log_id(term: u64, index: u64) -> LogIdOf<Tc> {
    LogIdOf::<Tc>::new(
        <Tc as RaftTypeConfig>::LeaderId::new(term, 1).to_committed(),
        index,
    )
}

fn entry(term: u64, index: u64) -> Entry {
    Entry::new_normal(log_id(term, index), format!("t{term}i{index}"))
}

fn vote(term: u64) -> VoteOf<Tc> {
    VoteOf::<Tc>::new(term, 1)
}

/// Appends and returns the receiver of the flush callback.
async fn append(store: &mut Store, entries: Vec<Entry>) -> Flushed {
    let (tx, rx) = Tc::oneshot();
    store.append(entries, IOFlushed::signal(tx)).await.unwrap();
    rx
}

async fn flushed(rx: Flushed) {
    rx.await.expect("callback dropped").expect("flush failed");
}

async fn read_all(store: &mut Store) -> Vec<String> {
    store
        .try_get_log_entries(..)
        .await
        .unwrap()
        .into_iter()
        .map(|e| match e.payload {
            openraft::EntryPayload::Normal(s) => s,
            other => panic!("unexpected payload {other:?}"),
        })
        .collect()
}

/// Log indexes in the file, as a fresh read transaction sees them: what is committed.
fn file_indexes(store: &Store) -> Vec<u64> {
    let txn = store.shared.db.begin_read().unwrap();
    let table = txn.open_table(LOG).unwrap();
    table
        .range(0..)
        .unwrap()
        .map(|r| r.unwrap().0.value())
        .collect()
}

/// A writer that stops before each commit until the test lets it go. `entered` tells the test
/// the size of the batch the writer holds; sending on (or dropping) the gate lets it commit.
struct Held {
    store: Store,
    entered: std_mpsc::Receiver<usize>,
    gate: Option<std_mpsc::Sender<()>>,
}

impl Held {
    fn open(path: &Path) -> Held {
        let (entered_tx, entered) = std_mpsc::channel();
        let (gate, gate_rx) = std_mpsc::channel::<()>();
        let hook: BeforeCommit = Box::new(move |n| {
            let _ = entered_tx.send(n);
            // Err once the test dropped the gate: from then on, commit freely.
            let _ = gate_rx.recv();
        });
        Held {
            store: Store::open_with_hook(path, Some(hook)).unwrap(),
            entered,
            gate: Some(gate),
        }
    }

    fn wait_entered(&self) -> usize {
        self.entered.recv().unwrap()
    }

    fn release_one(&self) {
        self.gate.as_ref().unwrap().send(()).unwrap();
    }

    fn release_all(&mut self) {
        self.gate.take();
    }
}

#[tokio::test]
async fn flush_callback_fires_only_after_commit_and_entries_are_readable_before() {
    let dir = tempfile::tempdir().unwrap();
    let mut held = Held::open(&dir.path().join("log.redb"));
    let rx = append(&mut held.store, vec![entry(1, 1), entry(1, 2), entry(1, 3)]).await;
    assert_eq!(held.wait_entered(), 1);

    // The writer holds the batch and has not committed: readable (openraft requires it), but
    // not acknowledged and not in the file.
    assert_eq!(read_all(&mut held.store).await, ["t1i1", "t1i2", "t1i3"]);
    let state = held.store.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id, Some(log_id(1, 3)));
    assert_eq!(held.store.stats().write_transactions, 0);
    assert!(file_indexes(&held.store).is_empty());
    let mut rx = rx;
    assert!(matches!(
        rx.try_recv(),
        Err(tokio::sync::oneshot::error::TryRecvError::Empty)
    ));

    held.release_one();
    flushed(rx).await;
    // When the callback fired, the entries were committed.
    assert_eq!(file_indexes(&held.store), [1, 2, 3]);
    assert_eq!(held.store.stats().write_transactions, 1);
    held.release_all();
}

#[tokio::test]
async fn appends_queued_while_the_writer_is_busy_share_one_transaction() {
    const APPENDS: u64 = 100;
    let dir = tempfile::tempdir().unwrap();
    let mut held = Held::open(&dir.path().join("log.redb"));
    let mut callbacks = vec![append(&mut held.store, vec![entry(1, 1)]).await];
    assert_eq!(held.wait_entered(), 1);
    for i in 2..=APPENDS {
        callbacks.push(append(&mut held.store, vec![entry(1, i)]).await);
    }
    held.release_all();
    for rx in callbacks {
        flushed(rx).await;
    }
    // The first append alone, then everything that queued behind it: one fsync for 99.
    assert_eq!(held.wait_entered(), APPENDS as usize - 1);
    let stats = held.store.stats();
    assert_eq!(stats.write_transactions, 2);
    assert_eq!(stats.requests_written, APPENDS);
    assert_eq!(file_indexes(&held.store), (1..=APPENDS).collect::<Vec<_>>());
}

// Two workers: the test blocks one waiting for the writer while the save runs on the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn save_vote_returns_only_after_its_commit() {
    let dir = tempfile::tempdir().unwrap();
    let mut held = Held::open(&dir.path().join("log.redb"));
    let mut saver = held.store.clone();
    let saving = tokio::spawn(async move { saver.save_vote(&vote(3)).await });
    assert_eq!(held.wait_entered(), 1);
    assert!(!saving.is_finished());
    assert_eq!(held.store.read_vote().await.unwrap(), None);
    held.release_all();
    saving.await.unwrap().unwrap();
    assert_eq!(held.store.read_vote().await.unwrap(), Some(vote(3)));
}

#[tokio::test]
async fn truncate_and_purge_are_visible_at_once_and_applied_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.redb");
    let mut held = Held::open(&path);
    let first = append(&mut held.store, (1..=10).map(|i| entry(1, i)).collect()).await;
    assert_eq!(held.wait_entered(), 1);

    // All of these queue behind the held first batch and commit together, in this order.
    let s = &mut held.store;
    s.truncate_after(Some(log_id(1, 5))).await.unwrap();
    let second = append(s, vec![entry(2, 6), entry(2, 7), entry(2, 8)]).await;
    s.purge(log_id(1, 2)).await.unwrap();
    s.save_committed(Some(log_id(2, 7))).await.unwrap();

    let expect = ["t1i3", "t1i4", "t1i5", "t2i6", "t2i7", "t2i8"];
    let check = |state: LogState<Tc>| {
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 2)));
        assert_eq!(state.last_log_id, Some(log_id(2, 8)));
    };
    assert_eq!(read_all(s).await, expect);
    check(s.get_log_state().await.unwrap());
    assert_eq!(s.read_committed().await.unwrap(), Some(log_id(2, 7)));
    assert_eq!(
        s.try_get_log_entries(6..7).await.unwrap()[0].log_id(),
        log_id(2, 6)
    );
    assert!(s.try_get_log_entries(1..3).await.unwrap().is_empty());

    // The first batch commits; the rest is still pending: the view must not change.
    held.release_one();
    flushed(first).await;
    assert_eq!(file_indexes(&held.store), (1..=10).collect::<Vec<_>>());
    assert_eq!(read_all(&mut held.store).await, expect);
    check(held.store.get_log_state().await.unwrap());

    held.release_all();
    flushed(second).await;
    assert_eq!(file_indexes(&held.store), [3, 4, 5, 6, 7, 8]);
    assert_eq!(read_all(&mut held.store).await, expect);
    check(held.store.get_log_state().await.unwrap());
    assert_eq!(held.store.stats().write_transactions, 2);

    drop(held);
    let mut store = Store::open(&path).unwrap();
    assert_eq!(read_all(&mut store).await, expect);
    check(store.get_log_state().await.unwrap());
    assert_eq!(store.read_committed().await.unwrap(), Some(log_id(2, 7)));
}

#[tokio::test]
async fn reopen_keeps_entries_vote_committed_and_purge_point() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.redb");
    {
        let mut store = Store::open(&path).unwrap();
        flushed(append(&mut store, (1..=10).map(|i| entry(1, i)).collect()).await).await;
        store.purge(log_id(1, 4)).await.unwrap();
        store.save_committed(Some(log_id(1, 9))).await.unwrap();
        // A vote save returns after its commit, and everything queued before it is in that
        // commit or an earlier one.
        store.save_vote(&vote(2)).await.unwrap();
    }
    let mut store = Store::open(&path).unwrap();
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 4)));
    assert_eq!(state.last_log_id, Some(log_id(1, 10)));
    assert_eq!(read_all(&mut store).await.len(), 6);
    assert_eq!(store.read_vote().await.unwrap(), Some(vote(2)));
    assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 9)));

    // Everything purged: the last log id is the purge point.
    store.purge(log_id(1, 10)).await.unwrap();
    store.save_vote(&vote(2)).await.unwrap();
    drop(store);
    let mut store = Store::open(&path).unwrap();
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 10)));
    assert_eq!(state.last_log_id, Some(log_id(1, 10)));
    assert!(read_all(&mut store).await.is_empty());
}

#[tokio::test]
async fn meta_keys_are_durable_and_separate_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.redb");
    {
        let store = Store::open(&path).unwrap();
        assert_eq!(store.read_meta("members").unwrap(), None);
        store.write_meta("members", b"1=127.0.0.1:7420").unwrap();
        store.write_meta("vote", b"not a raft vote").unwrap();
    }
    let mut store = Store::open(&path).unwrap();
    assert_eq!(
        store.read_meta("members").unwrap().as_deref(),
        Some(&b"1=127.0.0.1:7420"[..])
    );
    assert_eq!(store.read_vote().await.unwrap(), None);
}

#[test]
fn open_refuses_a_value_in_an_unknown_format() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.redb");
    drop(Store::open(&path).unwrap());
    {
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(STATE)
            .unwrap()
            .insert(KEY_VOTE, &[9u8, 0, 0][..])
            .unwrap();
        txn.commit().unwrap();
    }
    match Store::open(&path) {
        Err(LogStoreError::Corrupt(msg)) => assert!(msg.contains("format version 9"), "{msg}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

/// Hostile input (issue #13): a stored log value read back from a damaged disk decodes to a
/// value or an error naming what is corrupt; never a panic.
mod hostile_input {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

        #[test]
        fn mutated_entries_and_votes_decode_or_are_refused(
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
            cut in any::<usize>(),
        ) {
            for mut bytes in [
                codec::encode(&entry(3, 17)).unwrap(),
                codec::encode(&vote(5)).unwrap(),
            ] {
                for (at, v) in &edits {
                    let at = at % bytes.len();
                    bytes[at] = *v;
                }
                bytes.truncate(cut % (bytes.len() + 1));
                let _ = codec::decode::<Entry>(&bytes, &"log entry");
                let _ = codec::decode::<VoteOf<Tc>>(&bytes, &"vote");
            }
        }

        #[test]
        fn noise_decodes_or_is_refused(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = codec::decode::<Entry>(&bytes, &"log entry");
            let _ = codec::decode::<VoteOf<Tc>>(&bytes, &"vote");
        }
    }
}
