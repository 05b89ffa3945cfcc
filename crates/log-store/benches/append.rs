//! Append throughput of the log store through openraft's `RaftLogStorage::append`, with real
//! fsyncs: an entry counts only once its flush callback fired, which the writer does only after
//! the group commit holding it was written to its segment and `fdatasync`ed.
//!
//! `cargo bench -p latchkey-log-store --bench append`. The store lives under cargo's target tmp
//! dir (on the build disk), not in `/tmp`, which may be a tmpfs where an fsync costs nothing.
//! Entries are real latchkey log entries: an `Acquire` command of about 60 bytes.

use std::collections::VecDeque;
use std::io;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use latchkey_core::{Command, Op, SessionId, SessionKey};
use latchkey_log_store::LogStore;
use latchkey_raft::{Entry, LogCommand, LogId, TypeConfig};
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::type_config::alias::OneshotReceiverOf;
use openraft::type_config::TypeConfigExt;
use openraft::vote::RaftLeaderId;
use openraft::RaftTypeConfig;

type Store = LogStore<TypeConfig>;
type Flushed = OneshotReceiverOf<TypeConfig, Result<(), io::Error>>;

/// Appends in flight at once in the group-commit bench: the client library's per-session cap
/// (`SESSION_REQUESTS_IN_FLIGHT_MAX`), or 64 clients with one request each.
const IN_FLIGHT: usize = 64;

fn entry(index: u64) -> Entry {
    let log_id = LogId::new(
        <TypeConfig as RaftTypeConfig>::LeaderId::new(1, 1).to_committed(),
        index,
    );
    let op = Op::Acquire {
        session: SessionKey {
            id: SessionId(index % 1_024 + 1),
            secret: 0x9E37_79B9_7F4A_7C15,
        },
        seq: index,
        name: format!("jobs/tenant-{:02}/job-{:06}", index % 64, index % 100_000),
        wait_ms: latchkey_core::limits::WAIT_TIMEOUT_MS_MAX,
    };
    Entry::new_normal(
        log_id,
        LogCommand(Command {
            now_ms: 1_700_000_000_000 + index,
            op,
        }),
    )
}

/// Queues one entry and returns the receiver of its flush callback.
async fn append(store: &mut Store, index: u64) -> Flushed {
    let (tx, rx) = TypeConfig::oneshot();
    store
        .append([entry(index)], IOFlushed::signal(tx))
        .await
        .expect("append queued");
    rx
}

async fn flushed(rx: Flushed) {
    rx.await.expect("callback fired").expect("flush succeeded");
}

struct Bench {
    rt: tokio::runtime::Runtime,
    // Dropped after `store`: the writer thread closes the file before the dir goes.
    store: Store,
    _dir: tempfile::TempDir,
    next_index: u64,
}

impl Bench {
    fn open() -> Bench {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
        let store = Store::open(&dir.path().join("raft-log")).expect("open log store");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        Bench {
            rt,
            store,
            _dir: dir,
            next_index: 1,
        }
    }

    fn take_index(&mut self) -> u64 {
        let i = self.next_index;
        self.next_index += 1;
        i
    }

    /// Prints how many entries shared each fsync, the point of group commit.
    fn report(&self, what: &str) {
        let stats = self.store.stats();
        println!(
            "{what}: {} entries in {} fsynced group commits, {:.1} entries per fsync",
            stats.requests_written,
            stats.write_transactions,
            stats.requests_written as f64 / stats.write_transactions.max(1) as f64
        );
    }
}

/// (a) One entry per append, each awaited before the next: one fsync per entry, so this is the
/// latency of a durable write on this disk.
fn one_at_a_time(c: &mut Criterion) {
    let mut bench = Bench::open();
    let mut g = c.benchmark_group("log_store/append");
    g.throughput(Throughput::Elements(1));
    g.bench_function("one_entry_awaited", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                let index = bench.take_index();
                let Bench { rt, store, .. } = &mut bench;
                rt.block_on(async { flushed(append(store, index).await).await });
            }
            start.elapsed()
        })
    });
    g.finish();
    bench.report("one_entry_awaited");
}

/// (b) Appends keep coming while earlier ones wait for their fsync, up to `IN_FLIGHT` unflushed
/// at once (as openraft pipelines appends for many clients); the writer commits everything
/// queued during one fsync in the next group commit.
fn pipelined(c: &mut Criterion) {
    let mut bench = Bench::open();
    let mut g = c.benchmark_group("log_store/append");
    g.throughput(Throughput::Elements(1));
    g.bench_function("64_in_flight", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            let first = bench.next_index;
            bench.next_index += iters;
            let Bench { rt, store, .. } = &mut bench;
            rt.block_on(async {
                let mut window: VecDeque<Flushed> = VecDeque::with_capacity(IN_FLIGHT);
                for index in first..first + iters {
                    if window.len() == IN_FLIGHT {
                        // Callbacks fire in commit order, so the oldest is the next to finish.
                        flushed(window.pop_front().expect("full")).await;
                    }
                    window.push_back(append(store, index).await);
                }
                for rx in window {
                    flushed(rx).await;
                }
            });
            start.elapsed()
        })
    });
    g.finish();
    bench.report("64_in_flight");
}

fn config() -> Criterion {
    // fsync-bound: a few milliseconds per commit. Small samples keep the file under a minute.
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
}

criterion_group! {
    name = benches;
    config = config();
    targets = one_at_a_time, pipelined
}
criterion_main!(benches);
