//! Issue #13 item 5: memory and snapshot size stay bounded.
//!
//! - A table whose snapshot is larger than a peer message (64 MiB) reaches a member whose data
//!   dir was wiped: the leader has snapshotted and purged its log, so only a snapshot, streamed
//!   in chunks, can bring the member up to date. Before chunking, a snapshot went as one
//!   message capped at 64 MiB and such a table could never reach a new member.
//!   The table is of elections' leaders, each with a value of the largest size
//!   (`limits::ELECTION_VALUE_BYTES_MAX`): about 1.9 KB of snapshot per acquire where a plain
//!   lock takes about 500 bytes, so a quarter of the acquires fill it (the fill of 146,000
//!   plain locks was most of this test's three minutes in CI's debug build; issue #34).
//! - A node's table budget (`--table-bytes-max`): an acquire past it is refused `table-full`
//!   (gRPC RESOURCE_EXHAUSTED, the CLI says so), and a release makes room again.

mod common;

use std::time::{Duration, Instant};

use common::cluster::{Cluster, Timing};
use common::rpc::{pinned, reason, runtime};
use common::{wait_until, Server};
use latchkey_proto::v1 as pb;
use tokio::task::JoinSet;

/// Bytes of one peer message (`limits::PEER_MESSAGE_BYTES_MAX`): the snapshot must be larger.
const PEER_MESSAGE_BYTES: u64 = latchkey_core::limits::PEER_MESSAGE_BYTES_MAX as u64;
/// Elections' leaders with names of `NAME_BYTES` and values of `VALUE_BYTES` that make a
/// snapshot well above a peer message (each is about 1.9 KB in a snapshot: its lock, its name
/// again beside its value, and the value; 36,000 made a snapshot of 68.5 MB, so 40,000 are
/// about 76 MB), taken by `SESSIONS` sessions.
const SESSIONS: u64 = 40;
const LOCKS_PER_SESSION: u64 = 1_000;
const NAME_BYTES: usize = 500;
const VALUE_BYTES: usize = latchkey_core::limits::ELECTION_VALUE_BYTES_MAX;
/// Acquires in flight while filling: enough to keep the leader's group commit busy, few enough
/// that a debug-build cluster on two shared cores keeps its heartbeats on time.
const FILL_TASKS: u64 = 24;
/// The members snapshot once, after most of the locks are taken (at about 37,500 entries,
/// about 71 MB of them).
const SNAPSHOT_EVERY_ENTRIES: u64 = 37_500;

fn name(session: u64, i: u64) -> String {
    let n = format!("big/{session:04}/{i:04}/");
    let pad = NAME_BYTES - n.len();
    n + &"x".repeat(pad)
}

/// Takes `LOCKS_PER_SESSION` locks, each a campaign publishing a value of `VALUE_BYTES`, in
/// each of `SESSIONS` new sessions, `FILL_TASKS` tasks at once, through the members at `addrs`
/// (the leader first). A failed call ("not the leader" when a loaded machine delays heartbeats
/// past an election timeout) is retried at the next member with the same sequence number
/// (exactly-once in the table), a bounded number of times.
fn fill(addrs: &[String]) -> u64 {
    let rt = runtime();
    let clients: Vec<_> = addrs.iter().map(|a| pinned(&rt, a)).collect();
    rt.block_on(async move {
        let mut tasks = JoinSet::new();
        for w in 0..FILL_TASKS {
            let clients = clients.clone();
            tasks.spawn(async move {
                let mut at = 0;
                let mut failures = 0;
                let mut failed = |what: &str, e: tonic::Status, at: &mut usize| {
                    failures += 1;
                    assert!(failures <= 200, "{what}: {e} (too many failures)");
                    *at = (*at + 1) % clients.len();
                };
                for s in (w..SESSIONS).step_by(FILL_TASKS as usize) {
                    let session = loop {
                        let req = pb::CreateSessionRequest {
                            ttl_ms: 3_600_000,
                            ..Default::default()
                        };
                        match clients[at].clone().create_session(req).await {
                            Ok(r) => break r.into_inner().session,
                            Err(e) => failed("create session", e, &mut at),
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    };
                    for i in 0..LOCKS_PER_SESSION {
                        let req = pb::AcquireRequest {
                            session,
                            seq: i + 1,
                            name: name(s, i),
                            wait_timeout_ms: 0,
                            value: Some(vec![b'v'; VALUE_BYTES]),
                            ..Default::default()
                        };
                        let granted = loop {
                            match clients[at].clone().acquire(req.clone()).await {
                                Ok(r) => break r.into_inner(),
                                Err(e) => failed(&format!("acquire {s}/{i}"), e, &mut at),
                            }
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        };
                        assert_eq!(
                            granted.result,
                            pb::AcquireResult::Granted as i32,
                            "{granted:?}"
                        );
                    }
                }
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.expect("a fill task");
        }
    });
    SESSIONS * LOCKS_PER_SESSION
}

/// What member `id` says of itself: its applied index and its table's lock count.
fn applied_and_locks(cluster: &Cluster, id: u64) -> Option<(u64, u64)> {
    let rt = runtime();
    let mut c = pinned(&rt, &cluster.addr(id));
    let req = common::rpc::request(pb::NodeStatusRequest {}, Duration::from_secs(5));
    let s = rt.block_on(c.node_status(req)).ok()?.into_inner();
    Some((s.applied_index, s.locks))
}

/// Regression test for issue #13 item 5: a snapshot went to a member as one peer message
/// capped at 64 MiB, so a table larger than that could never reach a new or lagging member.
#[test]
fn a_snapshot_larger_than_a_peer_message_reaches_a_wiped_member() {
    // Slow elections: the fill loads two cores, and a leader change would only slow the test.
    let timing = Timing {
        heartbeat_ms: 500,
        election_timeout_ms: (5_000, 10_000),
    };
    let every = SNAPSHOT_EVERY_ENTRIES.to_string();
    let mut cluster = Cluster::start_configured(
        3,
        timing,
        &[
            "--snapshot-every-entries",
            &every,
            "--log-kept-after-snapshot",
            "100",
        ],
    );
    let (leader, _) = cluster.wait_leader(&[], Duration::from_secs(30));
    let wiped = cluster.ids().into_iter().find(|&id| id != leader).unwrap();
    cluster.kill9(wiped);
    cluster.wipe(wiped);

    let started = Instant::now();
    let others = cluster
        .ids()
        .into_iter()
        .filter(|&id| id != leader && id != wiped);
    let addrs: Vec<String> = std::iter::once(leader)
        .chain(others)
        .map(|id| cluster.addr(id))
        .collect();
    let locks = fill(&addrs);
    eprintln!("filled {locks} locks in {:?}", started.elapsed());

    // The leader snapshotted a table larger than a peer message (and purged the log before
    // it, `--log-kept-after-snapshot 100`).
    let snapshot = cluster
        .data_dir(leader)
        .join("snapshots")
        .join("snapshot.bin");
    let size = || std::fs::metadata(&snapshot).map_or(0, |m| m.len());
    wait_until(
        "the leader's snapshot of the full table",
        Duration::from_secs(120),
        || size() > PEER_MESSAGE_BYTES,
    );
    // The leader may have changed during the fill; any member that has applied everything
    // serves as the reference.
    let (leader, _) = cluster.wait_leader(&[wiped], Duration::from_secs(60));
    let (leader_applied, leader_locks) = applied_and_locks(&cluster, leader).expect("leader");
    assert_eq!(leader_locks, locks);
    eprintln!(
        "the leader's snapshot: {} bytes; its applied index {leader_applied}",
        size()
    );

    let restarted = Instant::now();
    cluster.restart(wiped);
    wait_until(
        "the wiped member to apply the leader's index",
        Duration::from_secs(300),
        || applied_and_locks(&cluster, wiped).is_some_and(|(a, _)| a >= leader_applied),
    );
    let took = restarted.elapsed();
    let (_, wiped_locks) = applied_and_locks(&cluster, wiped).expect("the wiped member");
    assert_eq!(wiped_locks, locks, "the wiped member's table");
    let received = cluster.log_lines(wiped, "received a snapshot");
    let bytes: Vec<u64> = received
        .iter()
        .filter(|l| l.contains("ok=true"))
        .filter_map(|l| {
            let rest = &l[l.find("bytes=")? + "bytes=".len()..];
            rest.split_whitespace().next()?.parse().ok()
        })
        .collect();
    assert!(
        bytes.iter().any(|&b| b > PEER_MESSAGE_BYTES),
        "the wiped member did not install a snapshot above 64 MiB: {received:?}"
    );
    eprintln!("the wiped member caught up in {took:?}: {received:?}");
}

/// The table budget: a node with `--table-bytes-max 65536` (five sessions' worth) refuses an
/// acquire past it with RESOURCE_EXHAUSTED `table-full`, the CLI prints why, and a release
/// makes room for the same acquire.
#[test]
fn an_acquire_past_the_table_budget_is_refused_until_a_release_makes_room() {
    let server = Server::start_with(&["--table-bytes-max", "65536"]);
    let rt = runtime();
    let mut c = pinned(&rt, &server.addr);
    let session = rt
        .block_on(c.create_session(pb::CreateSessionRequest {
            ttl_ms: 60_000,
            ..Default::default()
        }))
        .expect("a session")
        .into_inner()
        .session;
    let acquire = |c: &mut latchkey_proto::v1::locks_client::LocksClient<_>, seq: u64, lock| {
        rt.block_on(c.acquire(pb::AcquireRequest {
            session,
            seq,
            name: name(0, lock),
            wait_timeout_ms: 0,
            ..Default::default()
        }))
    };
    // A session is charged about 12.5 KB up front; each lock about 650 bytes: the budget
    // ends within a hundred locks.
    let mut granted = Vec::new();
    let refused = loop {
        let seq = granted.len() as u64 + 1;
        assert!(seq <= 200, "no refusal within 200 locks");
        match acquire(&mut c, seq, seq) {
            Ok(r) => {
                let r = r.into_inner();
                assert_eq!(r.result, pb::AcquireResult::Granted as i32, "{r:?}");
                granted.push((seq, r.token));
            }
            Err(status) => break status,
        }
    };
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert_eq!(reason(&refused).as_deref(), Some("table-full"));
    assert!(
        refused.message().contains("lock table is full") && refused.message().contains("65536"),
        "{refused:?}"
    );
    // The CLI says why.
    let work = tempfile::tempdir().unwrap();
    let out = common::run(
        &[
            "lock".into(),
            "another".into(),
            "--endpoints".into(),
            server.addr.clone(),
            "--".into(),
            "true".into(),
        ],
        work.path(),
        common::CLI_TIMEOUT,
    );
    assert!(!out.status.success(), "{}", out.stderr);
    assert!(out.stderr.contains("lock table is full"), "{}", out.stderr);
    eprintln!("the CLI on a full table: {}", out.stderr.trim());

    // A release makes room: the refused lock, asked for again in a new request, is granted.
    let (seq, token) = granted[0];
    let released = rt
        .block_on(c.release(pb::ReleaseRequest {
            session,
            seq: 1_000,
            name: name(0, seq),
            token,
        }))
        .expect("a release on a full table")
        .into_inner();
    assert!(released.released, "{released:?}");
    let refused_lock = granted.len() as u64 + 1;
    let again = acquire(&mut c, 1_001, refused_lock)
        .expect("room after the release")
        .into_inner();
    assert_eq!(again.result, pb::AcquireResult::Granted as i32, "{again:?}");
}
