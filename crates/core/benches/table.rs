//! Throughput of the pure lock table: `LockTable::apply` and the snapshot codec.
//!
//! `cargo bench -p latchkey-core --bench table`. Benches build with the `bench` profile, which
//! inherits `release`: `debug_assertions` are off, so `apply` does not run `check_invariants`
//! after every entry (it does in debug builds and tests). `decode_table` always runs it, once per
//! snapshot, and its time is part of the decode numbers.
//!
//! In (a) and (b) the commands are built before the timed loop and only their sequence numbers
//! and tokens change, so the numbers are `apply` alone; (c) builds each command as it goes (one
//! small allocation each, as decoding a log entry does in a node).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use latchkey_core::codec::{decode_table, encode_table};
use latchkey_core::limits::{EXPIRE_BATCH_MAX, SESSIONS_MAX, WAITERS_PER_LOCK_MAX};
use latchkey_core::{Applied, Command, LockTable, Op, Outcome, SessionId, SessionKey};

const TTL_MS: u64 = 15_000;

fn cmd(op: Op) -> Command {
    Command {
        now_ms: 1_700_000_000_000,
        op,
    }
}

fn key(id: SessionId) -> SessionKey {
    SessionKey {
        id,
        secret: id.0.wrapping_mul(0x9E37_79B9_7F4A_7C15),
    }
}

/// A lock name shaped like a real one (a tenant and a job id), 20-odd bytes.
fn lock_name(i: usize) -> String {
    format!("jobs/tenant-{:02}/job-{i:06}", i % 64)
}

/// `release` in `cargo bench`; `debug` when `cargo test --all-targets` runs each bench once as a
/// smoke test in a debug build, where `apply` checks every invariant after each entry, so
/// building a large table would take minutes.
fn size(release: usize, debug: usize) -> usize {
    if cfg!(debug_assertions) {
        debug
    } else {
        release
    }
}

/// Applies entries at increasing indexes, as the Raft log would.
struct Log {
    table: LockTable,
    index: u64,
}

impl Log {
    fn new() -> Log {
        Log {
            table: LockTable::new(),
            index: 0,
        }
    }

    fn apply(&mut self, cmd: &Command) -> Applied {
        self.index += 1;
        self.table.apply(self.index, cmd)
    }

    fn create_session(&mut self) -> SessionKey {
        let index = self.index + 1;
        let op = Op::CreateSession {
            ttl_ms: TTL_MS,
            secret: key(SessionId(index)).secret,
        };
        match self.apply(&cmd(op)).outcome {
            Outcome::SessionCreated { id, .. } => key(id),
            other => panic!("session not created: {other:?}"),
        }
    }
}

fn acquire(session: SessionKey, seq: u64, name: String, wait: bool) -> Command {
    let wait_ms = if wait {
        latchkey_core::limits::WAIT_TIMEOUT_MS_MAX
    } else {
        0
    };
    cmd(Op::Acquire {
        session,
        seq,
        name,
        wait_ms,
    })
}

fn release(session: SessionKey, seq: u64, name: String, token: u64) -> Command {
    cmd(Op::Release {
        session,
        seq,
        name,
        token,
    })
}

fn set_seq(c: &mut Command, next: u64) {
    match &mut c.op {
        Op::Acquire { seq, .. } | Op::Release { seq, .. } => *seq = next,
        other => unreachable!("{other:?}"),
    }
}

fn set_token(c: &mut Command, next: u64) {
    match &mut c.op {
        Op::Release { token, .. } => *token = next,
        other => unreachable!("{other:?}"),
    }
}

fn granted(applied: &Applied) -> u64 {
    match applied.outcome {
        Outcome::Granted { token } => token,
        ref other => panic!("not granted: {other:?}"),
    }
}

/// (a) A session takes a free lock and releases it: two entries, no queue. 1,024 sessions each
/// cycle their own lock in turn, so the table has the size of a busy node's.
fn acquire_release_distinct(c: &mut Criterion) {
    const SESSIONS: usize = 1_024;
    let mut log = Log::new();
    let mut clients: Vec<(Command, Command, u64)> = (0..SESSIONS)
        .map(|i| {
            let s = log.create_session();
            (
                acquire(s, 0, lock_name(i), false),
                release(s, 0, lock_name(i), 0),
                0,
            )
        })
        .collect();
    let mut turn = 0usize;

    let mut g = c.benchmark_group("table/acquire_release_distinct_locks");
    // One element = one applied entry; a cycle is two.
    g.throughput(Throughput::Elements(2));
    g.bench_function("cycle", |b| {
        b.iter(|| {
            let (acq, rel, seq) = &mut clients[turn % SESSIONS];
            turn += 1;
            *seq += 1;
            set_seq(acq, *seq);
            let token = granted(&log.apply(acq));
            *seq += 1;
            set_seq(rel, *seq);
            set_token(rel, token);
            black_box(log.apply(rel));
        })
    });
    g.finish();
}

/// (b) One lock with a queue of 1,000 waiters. Each cycle the holder releases (a handoff to the
/// head of the queue, in the same entry) and queues again at the tail: two entries, and the
/// queue stays at 1,000.
fn contended_handoff(c: &mut Criterion) {
    const WAITERS: usize = 1_000;
    const _: () = assert!(WAITERS < WAITERS_PER_LOCK_MAX);
    let name = "jobs/the-one-lock".to_string();
    let mut log = Log::new();
    // Per session: its acquire and release commands and its next sequence number.
    let mut clients: Vec<(Command, Command, u64)> = (0..=WAITERS)
        .map(|_| {
            let s = log.create_session();
            (
                acquire(s, 0, name.clone(), true),
                release(s, 0, name.clone(), 0),
                0,
            )
        })
        .collect();
    let mut holder_token = 0;
    for (i, (acq, _, seq)) in clients.iter_mut().enumerate() {
        *seq += 1;
        set_seq(acq, *seq);
        let applied = log.apply(acq);
        match applied.outcome {
            Outcome::Granted { token } if i == 0 => holder_token = token,
            Outcome::Queued { position } if position as usize == i => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    // The holder is clients[holder]; the queue holds the others in ring order after it.
    let mut holder = 0usize;

    let mut g = c.benchmark_group("table/contended_lock_1000_waiters");
    g.throughput(Throughput::Elements(2));
    g.bench_function("release_handoff_requeue", |b| {
        b.iter(|| {
            let (acq, rel, seq) = &mut clients[holder];
            *seq += 1;
            set_seq(rel, *seq);
            set_token(rel, holder_token);
            let applied = log.apply(rel);
            debug_assert_eq!(applied.outcome, Outcome::Released);
            holder_token = applied.handoffs[0].token;
            *seq += 1;
            set_seq(acq, *seq);
            black_box(log.apply(acq));
            holder = (holder + 1) % clients.len();
        })
    });
    g.finish();
}

/// (c) 1,024 sessions come and go: each is created and takes a lock of its own, then one
/// `ExpireSessions` entry (the largest the leader proposes) removes all of them, releasing the
/// locks. The table around them has 10,000 other sessions holding a lock each. The two halves
/// are timed separately; each bench runs both, so the table returns to its size every round.
fn session_churn(c: &mut Criterion) {
    const SESSIONS: usize = 1_024;
    const _: () = assert!(SESSIONS <= EXPIRE_BATCH_MAX);
    let background = size(10_000, 100);
    let mut log = Log::new();
    for i in 0..background {
        let s = log.create_session();
        granted(&log.apply(&acquire(s, 1, lock_name(i), false)));
    }
    let names: Vec<String> = (0..SESSIONS).map(|i| lock_name(background + i)).collect();

    let create_and_acquire = |log: &mut Log| -> Vec<SessionId> {
        names
            .iter()
            .map(|name| {
                let s = log.create_session();
                granted(&log.apply(&acquire(s, 1, name.clone(), false)));
                s.id
            })
            .collect()
    };
    let expire = |log: &mut Log, ids: Vec<SessionId>| {
        let applied = log.apply(&cmd(Op::ExpireSessions { ids }));
        debug_assert!(
            matches!(&applied.outcome, Outcome::SessionsExpired { ids } if ids.len() == SESSIONS)
        );
        applied
    };

    let mut g = c.benchmark_group("table/session_churn_1024");
    // One element = one session: two entries (create, acquire), or its share of the expiry.
    g.throughput(Throughput::Elements(SESSIONS as u64));
    g.bench_function("create_and_acquire", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                let ids = black_box(create_and_acquire(&mut log));
                timed += start.elapsed();
                expire(&mut log, ids);
            }
            timed
        })
    });
    g.bench_function("expire_holding_locks", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                let ids = create_and_acquire(&mut log);
                let start = Instant::now();
                let applied = black_box(expire(&mut log, ids));
                timed += start.elapsed();
                drop(applied);
            }
            timed
        })
    });
    g.finish();
    assert_eq!(log.table.session_count(), background);
}

/// (d) The snapshot of a full table: 100,000 sessions (the limit), each holding one lock.
fn snapshot_codec(c: &mut Criterion) {
    let sessions = size(SESSIONS_MAX, 1_000);
    let mut log = Log::new();
    for i in 0..sessions {
        let s = log.create_session();
        granted(&log.apply(&acquire(s, 1, lock_name(i), false)));
    }
    let table = log.table;
    assert_eq!(
        (table.session_count(), table.lock_count()),
        (sessions, sessions)
    );
    let bytes = encode_table(&table);
    println!(
        "snapshot of {} sessions and {} held locks: {} bytes ({:.1} MiB)",
        table.session_count(),
        table.lock_count(),
        bytes.len(),
        bytes.len() as f64 / (1024.0 * 1024.0)
    );
    assert_eq!(decode_table(&bytes).expect("decodes"), table);

    let mut g = c.benchmark_group("table/snapshot_100k_sessions_100k_locks");
    // Tens of milliseconds per call: fewer, longer samples.
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    g.bench_function("encode_table", |b| {
        b.iter(|| encode_table(black_box(&table)))
    });
    // Includes the one `check_invariants` a decode always runs; dropping the decoded table is
    // left out of the timing.
    g.bench_function("decode_table", |b| {
        b.iter_with_large_drop(|| decode_table(black_box(&bytes)).expect("decodes"))
    });
    // The part of a decode that is not postcard.
    g.bench_function("check_invariants", |b| {
        b.iter(|| black_box(&table).check_invariants().expect("valid"))
    });
    g.finish();
}

fn config() -> Criterion {
    // Small samples: the whole file runs in well under a minute on a shared 2-core machine.
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = acquire_release_distinct, contended_handoff, session_churn, snapshot_codec
}
criterion_main!(benches);
