//! The server's gRPC API, in process: `run()` on a loopback listener with a temp data dir
//! (`latchkey_testkit::Node`), driven through the generated client. Covers the lock semantics
//! end to end through Raft and storage.

use std::path::Path;
use std::time::Duration;

use latchkey_proto::v1 as pb;
use latchkey_proto::v1::locks_client::LocksClient;
use latchkey_testkit::Node;
use tonic::transport::Channel;
use tonic::Code;

/// How long a fresh node gets to elect itself.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

async fn start(dir: &Path, addr: Option<std::net::SocketAddr>) -> Node {
    Node::start_in(dir, addr, |_| {})
        .await
        .expect("the node starts")
}

async fn client(node: &mut Node) -> LocksClient<Channel> {
    node.ready_client(READY_TIMEOUT)
        .await
        .expect("the node becomes leader")
}

async fn session(c: &mut LocksClient<Channel>, ttl_ms: u64) -> pb::Session {
    c.create_session(pb::CreateSessionRequest {
        ttl_ms,
        ..Default::default()
    })
    .await
    .expect("create session")
    .into_inner()
    .session
    .unwrap()
}

async fn acquire(
    c: &mut LocksClient<Channel>,
    s: &pb::Session,
    seq: u64,
    name: &str,
    wait_ms: u64,
) -> Result<pb::AcquireResponse, tonic::Status> {
    c.acquire(pb::AcquireRequest {
        session: Some(*s),
        seq,
        name: name.into(),
        wait_timeout_ms: wait_ms,
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner())
}

async fn describe(c: &mut LocksClient<Channel>, name: &str) -> pb::LockInfo {
    c.describe(pb::DescribeRequest { name: name.into() })
        .await
        .expect("describe")
        .into_inner()
        .lock
        .expect("describe answers with a lock")
}

fn granted(r: &pb::AcquireResponse) -> u64 {
    assert_eq!(r.result, pb::AcquireResult::Granted as i32, "{r:?}");
    r.token
}

fn reason(s: &tonic::Status) -> String {
    s.metadata()
        .get(latchkey_proto::ERROR_REASON_KEY)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_the_queued_waiter_with_a_higher_token() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = start(dir.path(), None).await;
    let mut c = client(&mut node).await;
    let a = session(&mut c, 10_000).await;
    let b = session(&mut c, 10_000).await;
    let t1 = granted(&acquire(&mut c, &a, 1, "job", 0).await.unwrap());

    // b queues (long-poll in the background), then a releases.
    let mut cb = c.clone();
    let waiter = tokio::spawn(async move { acquire(&mut cb, &b, 1, "job", 8_000).await });
    // Wait until b is visibly queued, then release.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let d = describe(&mut c, "job").await;
        if d.waiters == 1 {
            assert_eq!(d.token, t1);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "b never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rel = c
        .release(pb::ReleaseRequest {
            session: Some(a),
            seq: 2,
            name: "job".into(),
            token: t1,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(rel.released);
    let t2 = granted(&waiter.await.unwrap().unwrap());
    assert!(t2 > t1, "token {t2} after {t1}");

    // A stale release (a's old token) does not free b's grant.
    let stale = c
        .release(pb::ReleaseRequest {
            session: Some(a),
            seq: 3,
            name: "job".into(),
            token: t1,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!stale.released);
    let d = describe(&mut c, "job").await;
    assert!(d.held);
    assert_eq!((d.session, d.token), (b.id, t2));
    node.stop().await.expect("the node stops cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_and_wait_timeout_answer_not_granted_and_leave_no_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = start(dir.path(), None).await;
    let mut c = client(&mut node).await;
    let a = session(&mut c, 10_000).await;
    let b = session(&mut c, 10_000).await;
    granted(&acquire(&mut c, &a, 1, "x", 0).await.unwrap());
    let r = acquire(&mut c, &b, 1, "x", 0).await.unwrap();
    assert_eq!(r.result, pb::AcquireResult::NotGranted as i32);
    let r = acquire(&mut c, &b, 2, "x", 300).await.unwrap();
    assert_eq!(r.result, pb::AcquireResult::NotGranted as i32);
    // The timed-out wait left the queue through the log.
    let d = describe(&mut c, "x").await;
    assert_eq!(d.waiters, 0);
    // A retry of the timed-out request returns its original outcome.
    let r = acquire(&mut c, &b, 2, "x", 300).await.unwrap();
    assert_eq!(r.result, pb::AcquireResult::NotGranted as i32);
    node.stop().await.expect("the node stops cleanly");
}

/// Regression (issue #31): a release of a name with a control character was proposed (the
/// table then answered "not the holder"), so client-chosen control bytes reached the Raft log,
/// where they could be shaped like a log frame. No lock can have such a name, so it is refused
/// before the log: the applied index does not move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_a_name_with_a_control_character_never_reaches_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = start(dir.path(), None).await;
    let mut c = client(&mut node).await;
    let a = session(&mut c, 10_000).await;
    let token = granted(&acquire(&mut c, &a, 1, "jobs/a", 0).await.unwrap());
    // The last log index once everything in the log is applied.
    let settled = |c: &LocksClient<Channel>| {
        let mut c = c.clone();
        async move {
            let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
            loop {
                let s = c.node_status(pb::NodeStatusRequest {}).await.unwrap();
                let s = s.into_inner();
                if s.applied_index == s.last_log_index {
                    return s.last_log_index;
                }
                assert!(tokio::time::Instant::now() < deadline, "not applied: {s:?}");
                tokio::time::sleep(latchkey_testkit::POLL).await;
            }
        }
    };
    let before = settled(&c).await;
    for (seq, name) in [
        (2, "jobs/a\nb"),
        (3, "\u{1b}[2J"),
        (4, "x\u{0}\u{0}\u{0}\u{10}"),
    ] {
        let e = c
            .release(pb::ReleaseRequest {
                session: Some(a),
                seq,
                name: name.into(),
                token,
            })
            .await
            .expect_err(name);
        assert_eq!(
            (e.code(), reason(&e).as_str()),
            (Code::InvalidArgument, "name-control-character"),
            "{name:?}"
        );
    }
    let released = c
        .release(pb::ReleaseRequest {
            session: Some(a),
            seq: 5,
            name: "jobs/a".into(),
            token,
        })
        .await
        .expect("a valid name is released")
        .into_inner()
        .released;
    assert!(released);
    assert_eq!(
        settled(&c).await,
        before + 1,
        "the one valid release is the only entry the requests added"
    );
    node.stop().await.expect("the node stops cleanly");
}

/// A lock taken under a name with a control character before such names were refused (an
/// entry an older version logged) can still be released: the refusal above is only for names
/// no lock has. The old entry is written into the node's log while it is stopped, and the
/// restarted node commits and applies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_under_an_older_versions_name_with_a_control_character_is_released() {
    use latchkey_raft::{LogCommand, TypeConfig};
    use openraft::entry::RaftEntry;
    use openraft::storage::{IOFlushed, RaftLogStorage};
    use openraft::type_config::TypeConfigExt;

    let dir = tempfile::tempdir().unwrap();
    let legacy = "jobs/old\tname";
    let a = {
        let mut node = start(dir.path(), None).await;
        let mut c = client(&mut node).await;
        let a = session(&mut c, 60_000).await;
        node.stop().await.expect("the node stops cleanly");
        a
    };
    {
        let mut log =
            latchkey_log_store::LogStore::<TypeConfig>::open(&dir.path().join("raft-log")).unwrap();
        let last = log.get_log_state().await.unwrap().last_log_id.unwrap();
        let command = latchkey_core::Command {
            now_ms: 0,
            op: latchkey_core::Op::Acquire {
                session: latchkey_core::SessionKey {
                    id: latchkey_core::SessionId(a.id),
                    secret: a.secret,
                },
                seq: 1,
                name: legacy.into(),
                wait_ms: 0,
            },
        };
        let id = openraft::LogId::new(last.leader_id, last.index + 1);
        let (tx, rx) = TypeConfig::oneshot();
        log.append(
            [RaftEntry::new_normal(id, LogCommand(command))],
            IOFlushed::signal(tx),
        )
        .await
        .unwrap();
        rx.await.unwrap().unwrap();
    }
    let mut node = start(dir.path(), None).await;
    let mut c = client(&mut node).await;
    let held = describe(&mut c, legacy).await;
    assert!(held.held && held.session == a.id, "{held:?}");
    let released = c
        .release(pb::ReleaseRequest {
            session: Some(a),
            seq: 2,
            name: legacy.into(),
            token: held.token,
        })
        .await
        .expect("a held lock is released under its name")
        .into_inner()
        .released;
    assert!(released);
    node.stop().await.expect("the node stops cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = start(dir.path(), None).await;
    let mut c = client(&mut node).await;
    let e = c
        .create_session(pb::CreateSessionRequest {
            ttl_ms: 10,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::InvalidArgument, "ttl-out-of-range")
    );
    let a = session(&mut c, 10_000).await;
    let e = acquire(&mut c, &a, 1, "", 0).await.unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::InvalidArgument, "name-empty")
    );
    let long = "n".repeat(513);
    let e = acquire(&mut c, &a, 2, &long, 0).await.unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::InvalidArgument, "name-too-long")
    );
    // A newline in a name broke `latchkey list`'s one-lock-per-line output (issue #14).
    let e = acquire(&mut c, &a, 3, "jobs/a\nb", 0).await.unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::InvalidArgument, "name-control-character")
    );
    let ghost = pb::Session {
        id: 999_999,
        secret: 1,
    };
    let e = acquire(&mut c, &ghost, 1, "x", 0).await.unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::NotFound, "session-not-found")
    );
    let wrong_secret = pb::Session {
        id: a.id,
        secret: a.secret ^ 1,
    };
    let e = acquire(&mut c, &wrong_secret, 4, "x", 0).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = c
        .keep_alive(pb::KeepAliveRequest {
            sessions: vec![a; latchkey_core::limits::KEEPALIVE_SESSIONS_MAX + 1],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let list = c
        .list(pb::ListRequest {
            prefix: String::new(),
            limit: 0,
            group: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(list.locks.is_empty(), "nothing was taken by bad requests");
    // Keepalive answers for every session, alive or not.
    let ka = c
        .keep_alive(pb::KeepAliveRequest {
            sessions: vec![a, ghost],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        ka.leases
            .iter()
            .map(|l| (l.id, l.alive))
            .collect::<Vec<_>>(),
        vec![(a.id, true), (ghost.id, false)]
    );
    node.stop().await.expect("the node stops cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrenewed_session_expires_and_its_lock_goes_to_the_next_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = start(dir.path(), None).await;
    let mut c = client(&mut node).await;
    let a = session(&mut c, 1_000).await; // never renewed
    let b = session(&mut c, 30_000).await;
    let t1 = granted(&acquire(&mut c, &a, 1, "lease", 0).await.unwrap());
    let started = tokio::time::Instant::now();
    let r = acquire(&mut c, &b, 1, "lease", 9_000).await.unwrap();
    let t2 = granted(&r);
    assert!(t2 > t1);
    // Not before the TTL: the lease is a promise to the holder.
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "expired early"
    );
    let ka = c
        .keep_alive(pb::KeepAliveRequest { sessions: vec![a] })
        .await
        .unwrap()
        .into_inner();
    assert!(!ka.leases[0].alive);
    node.stop().await.expect("the node stops cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_sessions_locks_queues_and_the_token_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = start(dir.path(), None).await;
    let addr = node.addr;
    let mut c = client(&mut node).await;
    let a = session(&mut c, 30_000).await;
    let b = session(&mut c, 30_000).await;
    let t1 = granted(&acquire(&mut c, &a, 1, "keep", 0).await.unwrap());
    let r = acquire(&mut c, &b, 1, "keep", 200).await.unwrap();
    assert_eq!(r.result, pb::AcquireResult::NotGranted as i32);
    node.stop().await.expect("the node stops cleanly");

    let mut node = start(dir.path(), Some(addr)).await;
    let mut c = client(&mut node).await;
    let d = describe(&mut c, "keep").await;
    assert_eq!((d.held, d.session, d.token), (true, a.id, t1));
    // a's seq 1 retry still answers its original grant.
    assert_eq!(
        granted(&acquire(&mut c, &a, 1, "keep", 0).await.unwrap()),
        t1
    );
    let rel = c
        .release(pb::ReleaseRequest {
            session: Some(a),
            seq: 2,
            name: "keep".into(),
            token: t1,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(rel.released);
    let t2 = granted(&acquire(&mut c, &b, 2, "keep", 0).await.unwrap());
    assert!(t2 > t1);
    node.stop().await.expect("the node stops cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_applied_grants_and_report_leadership() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    // A free port for the metrics listener (outside the ephemeral range; the node binds it).
    let metrics_addr: std::net::SocketAddr = ([127, 0, 0, 1], latchkey_testkit::free_port()).into();
    let mut node = Node::start_in(dir.path(), None, |c| c.metrics_listen = Some(metrics_addr))
        .await
        .expect("the node starts");
    let mut c = client(&mut node).await;
    let a = session(&mut c, 10_000).await;
    let b = session(&mut c, 10_000).await;
    granted(&acquire(&mut c, &a, 1, "m", 0).await.unwrap());
    // b waits for "m" (its long-poll stays open), and a renews: the queue gauge and the
    // keepalive histogram have something to show.
    let mut waiting = c.clone();
    let wait = tokio::spawn(async move { acquire(&mut waiting, &b, 1, "m", 20_000).await });
    let queued_by = tokio::time::Instant::now() + Duration::from_secs(5);
    while describe(&mut c, "m").await.waiters != 1 {
        assert!(tokio::time::Instant::now() < queued_by, "b never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    c.keep_alive(pb::KeepAliveRequest { sessions: vec![a] })
        .await
        .unwrap();
    let body = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(metrics_addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap();
    assert!(
        body.starts_with("HTTP/1.0 200") || body.starts_with("HTTP/1.1 200"),
        "{body}"
    );
    for line in [
        "latchkey_grants_total 1",
        "latchkey_sessions_created_total 2",
        "latchkey_raft_is_leader 1",
        "latchkey_locks 1",
        "latchkey_queue_length{lock=\"m\"} 1",
        "latchkey_acquire_wait_seconds_count 1",
        "latchkey_keepalive_seconds_count 1",
    ] {
        assert!(
            body.lines().any(|l| l == line),
            "missing {line:?} in:\n{body}"
        );
    }
    // Three sessions' and acquires' proposals at least, each fsynced (a single node commits
    // alone); group commit may share an fsync between them.
    let count = |name: &str| -> u64 {
        body.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}_count ")))
            .unwrap_or_else(|| panic!("no {name}_count in:\n{body}"))
            .parse()
            .unwrap()
    };
    assert!(count("latchkey_commit_seconds") >= 4, "{body}");
    assert!(count("latchkey_fsync_seconds") >= 1, "{body}");
    wait.abort();
    node.stop().await.expect("the node stops cleanly");
}

/// Issue #9: a waiter whose client vanished (its long-poll dropped, no CancelWait ever sent)
/// stayed queued until its session expired, and a release handed it the lock. The server now
/// ends the wait when its wait timeout passes: within one lease tick and a commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_ends_on_the_server_when_its_client_vanished() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = start(dir.path(), None).await;
    let mut c = client(&mut node).await;
    let a = session(&mut c, 60_000).await;
    let b = session(&mut c, 60_000).await;
    let holder = granted(&acquire(&mut c, &a, 1, "x", 0).await.unwrap());
    // b waits up to 3 s, but its client gives up on the call after 500 ms and never comes
    // back: the server's long-poll is dropped with it.
    let mut vanishing = c.clone();
    let mut request = tonic::Request::new(pb::AcquireRequest {
        session: Some(b),
        seq: 1,
        name: "x".into(),
        wait_timeout_ms: 3_000,
        ..Default::default()
    });
    request.set_timeout(Duration::from_millis(500));
    let gone = vanishing.acquire(request).await;
    assert_eq!(gone.expect_err("the call was cut").code(), Code::Cancelled);
    // The waiter was proposed before the call was cut; on a loaded machine its entry may still
    // be committing (it was asserted at once, and failed under CI load with 0 waiters).
    let queued_by = tokio::time::Instant::now() + Duration::from_secs(2);
    while describe(&mut c, "x").await.waiters != 1 {
        assert!(
            tokio::time::Instant::now() < queued_by,
            "the waiter was never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Within the wait and a bound (lease tick + commit, generously 3 s), the queue empties.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
    loop {
        if describe(&mut c, "x").await.waiters == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the ended wait is still queued"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A retry of the ended request learns it was not granted; the release frees the lock.
    let r = acquire(&mut c, &b, 1, "x", 3_000).await.unwrap();
    assert_eq!(r.result, pb::AcquireResult::NotGranted as i32);
    let released = c
        .release(pb::ReleaseRequest {
            session: Some(a),
            seq: 2,
            name: "x".into(),
            token: holder,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(released.released);
    assert!(!describe(&mut c, "x").await.held, "handed to an ended wait");
    node.stop().await.expect("the node stops cleanly");
}

/// Issue #9 item 10: a release that reuses an acquire's sequence number was answered
/// "unavailable" (the client retried it forever); it is a client error now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_reusing_an_acquires_sequence_number_is_a_client_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = start(dir.path(), None).await;
    let mut c = client(&mut node).await;
    let a = session(&mut c, 60_000).await;
    let token = granted(&acquire(&mut c, &a, 1, "x", 0).await.unwrap());
    let err = c
        .release(pb::ReleaseRequest {
            session: Some(a),
            seq: 1,
            name: "x".into(),
            token,
        })
        .await
        .expect_err("a reused sequence number");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert_eq!(reason(&err), "sequence-reused");
    assert!(describe(&mut c, "x").await.held);
    node.stop().await.expect("the node stops cleanly");
}

/// A member's Raft groups share one log (issue #16), whose segments go from the front only,
/// each once every group purged its entries in it. A quiet group, whose few entries never reach
/// the snapshot policy, would keep the oldest segment, and so every later one, on disk forever:
/// the node has it snapshot and purge (`Node::compact_log`) once the log outgrew
/// `LOG_SEGMENTS_HELD_BACK_MAX` segments. Here group 1 holds only its founding entries while
/// group 0 writes past that bound and purges after every 100 entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_group_does_not_keep_the_shared_log_on_disk() {
    use latchkey_core::limits::{LOG_COMPACTION_CHECK_MS, LOG_SEGMENTS_HELD_BACK_MAX};
    use latchkey_log_store::LogStore;
    use latchkey_raft::TypeConfig;

    const SEGMENT_BYTES: u64 = 16 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut config = latchkey_server::ServerConfig::single(1, addr, dir.path().to_path_buf());
    config.groups = 2;
    config.snapshot_every_entries = 100;
    config.log_kept_after_snapshot = 10;
    let log_dir = dir.path().join("raft-log");
    let stores =
        LogStore::<TypeConfig>::open_groups_with_segment_bytes(&log_dir, &[0, 1], SEGMENT_BYTES)
            .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(latchkey_server::run_with(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        None::<tokio_stream::wrappers::TcpListenerStream>,
        config.validate().unwrap(),
        latchkey_server::NodeEnv::real(),
        stores,
        {
            let stop = stop.clone();
            async move { stop.cancelled().await }
        },
    ));
    let segments = || {
        std::fs::read_dir(&log_dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "seg"))
            })
            .count()
    };

    let mut c = LocksClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let s = loop {
        match c
            .create_session(pb::CreateSessionRequest {
                // Longer than the test: nothing renews it.
                ttl_ms: 600_000,
                group: Some(0),
                ..Default::default()
            })
            .await
        {
            Ok(r) => break r.into_inner().session.unwrap(),
            Err(e) => {
                assert!(started.elapsed() < READY_TIMEOUT, "not ready: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let name = (0..)
        .map(|i| format!("busy-{i}"))
        .find(|n| latchkey_core::group_of(n, 2) == 0)
        .unwrap();
    let mut seq = 0;
    let mut pair = |c: &mut LocksClient<Channel>| {
        seq += 2;
        let (c, name) = (c.clone(), name.clone());
        async move {
            let mut c = c;
            let token = acquire(&mut c, &s, seq - 1, &name, 0)
                .await
                .expect("acquire")
                .token;
            c.release(pb::ReleaseRequest {
                session: Some(s),
                seq,
                name,
                token,
            })
            .await
            .expect("release");
        }
    };
    // Group 0 writes, purging behind itself (its own entries, at most 110, span less than a
    // segment); group 1's founding entries hold segment 1, so every segment stays until the log
    // outgrew the bound. Only the count that makes compaction due is waited for: a run that
    // waited for more segments raced the compaction check, and on a loaded machine (about a
    // segment a second) lost that race every time and wrote until its session expired.
    let due = LOG_SEGMENTS_HELD_BACK_MAX + 1;
    let started = std::time::Instant::now();
    while segments() < due {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the log grew to only {} segments in {:?}",
            segments(),
            started.elapsed()
        );
        pair(&mut c).await;
    }

    // Within a few checks group 1 snapshots and purges, and the next writes delete the front:
    // the log is back to group 0's own few segments.
    let waited = std::time::Instant::now();
    while segments() >= LOG_SEGMENTS_HELD_BACK_MAX {
        assert!(
            waited.elapsed() < Duration::from_millis(5 * LOG_COMPACTION_CHECK_MS),
            "still {} segments after {:?}",
            segments(),
            waited.elapsed()
        );
        pair(&mut c).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    server.await.unwrap().unwrap();
}

async fn acquire_as(
    c: &mut LocksClient<Channel>,
    s: &pb::Session,
    seq: u64,
    name: &str,
    wait_ms: u64,
    mode: pb::LockMode,
    permits: u32,
) -> Result<pb::AcquireResponse, tonic::Status> {
    c.acquire(pb::AcquireRequest {
        session: Some(*s),
        seq,
        name: name.into(),
        wait_timeout_ms: wait_ms,
        mode: mode as i32,
        permits,
        value: None,
        lock_delay_ms: 0,
    })
    .await
    .map(|r| r.into_inner())
}

/// Issue #32 through gRPC: a semaphore's permits each get a token and every holder is listed;
/// a long-polling waiter is woken when a permit frees; bad modes are refused before anything is
/// proposed; a name in use as a semaphore cannot be read-locked; readers share the lock and
/// Describe lists each; an operator's force-release with a token takes one permit only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_and_permits_through_grpc() {
    use pb::LockMode::{Exclusive, Permits, Shared};
    let dir = tempfile::tempdir().unwrap();
    let mut node = start(dir.path(), None).await;
    let mut c = client(&mut node).await;
    let s: Vec<pb::Session> = futures::future::join_all((0..4).map(|_| {
        let mut c = c.clone();
        async move { session(&mut c, 10_000).await }
    }))
    .await;

    // Bad input: refused with its reason, nothing proposed.
    for (mode, permits, want) in [
        (Permits, 0, "permits-out-of-range"),
        (Permits, 1_025, "permits-out-of-range"),
        (Exclusive, 2, "invalid-request"),
        (Shared, 2, "invalid-request"),
    ] {
        let e = acquire_as(&mut c, &s[0], 1, "jobs", 0, mode, permits)
            .await
            .unwrap_err();
        assert_eq!(reason(&e), want, "{mode:?} {permits}: {e:?}");
        assert_eq!(e.code(), Code::InvalidArgument);
    }
    let unknown = c
        .acquire(pb::AcquireRequest {
            session: Some(s[0]),
            seq: 1,
            name: "jobs".into(),
            mode: 7,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&unknown), "invalid-request", "{unknown:?}");

    // Two permits of 2, each with its own token; the third waits.
    let t0 = granted(
        &acquire_as(&mut c, &s[0], 2, "jobs", 0, Permits, 2)
            .await
            .unwrap(),
    );
    let t1 = granted(
        &acquire_as(&mut c, &s[1], 1, "jobs", 0, Permits, 2)
            .await
            .unwrap(),
    );
    assert!(t1 > t0);
    let busy = acquire_as(&mut c, &s[2], 1, "jobs", 0, Permits, 2)
        .await
        .unwrap();
    assert_eq!(busy.result, pb::AcquireResult::NotGranted as i32);
    let held_by = busy
        .held_by
        .expect("a try-lock that found it held names the holder");
    assert_eq!((held_by.mode, held_by.permits), (Permits as i32, 2));
    // Another count, or the other kind, is refused and changes nothing.
    let e = acquire_as(&mut c, &s[2], 2, "jobs", 0, Permits, 3)
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "permits-conflict", "{e:?}");
    let e = acquire_as(&mut c, &s[2], 3, "jobs", 0, Shared, 0)
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "kind-conflict", "{e:?}");

    let d = describe(&mut c, "jobs").await;
    assert_eq!((d.mode, d.permits), (Permits as i32, 2));
    let holders: Vec<(u64, u64)> = d.holders.iter().map(|h| (h.session, h.token)).collect();
    assert_eq!(holders, vec![(s[0].id, t0), (s[1].id, t1)]);
    assert_eq!(
        (d.session, d.token),
        (s[0].id, t0),
        "the old fields: the first holder"
    );

    // A waiter long-polls; the operator takes one permit (by its token): the waiter gets it.
    let mut cw = c.clone();
    let waiter = s[2];
    let waiting =
        tokio::spawn(
            async move { acquire_as(&mut cw, &waiter, 4, "jobs", 8_000, Permits, 2).await },
        );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let d = describe(&mut c, "jobs").await;
        if d.waiters == 1 {
            assert_eq!(d.queue[0].mode, Permits as i32);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let taken = c
        .admin_release(pb::AdminReleaseRequest {
            name: "jobs".into(),
            token: Some(t1),
            reason: "test: one permit".into(),
            operator: "api test".into(),
            end_delay: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((taken.session, taken.token), (s[1].id, t1));
    let t2 = granted(&waiting.await.unwrap().unwrap());
    assert!(t2 > t1);
    let d = describe(&mut c, "jobs").await;
    let holders: Vec<(u64, u64)> = d.holders.iter().map(|h| (h.session, h.token)).collect();
    assert_eq!(
        holders,
        vec![(s[0].id, t0), (s[2].id, t2)],
        "one permit taken"
    );

    // Readers hold together; a writer does not get in; List shows every reader.
    let r0 = granted(
        &acquire_as(&mut c, &s[0], 5, "cfg", 0, Shared, 0)
            .await
            .unwrap(),
    );
    let r1 = granted(
        &acquire_as(&mut c, &s[1], 6, "cfg", 0, Shared, 0)
            .await
            .unwrap(),
    );
    let w = acquire_as(&mut c, &s[3], 1, "cfg", 0, Exclusive, 0)
        .await
        .unwrap();
    assert_eq!(w.result, pb::AcquireResult::NotGranted as i32);
    let listed = c
        .list(pb::ListRequest {
            prefix: "cfg".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let cfg = &listed.locks[0];
    assert_eq!((cfg.mode, cfg.permits), (Shared as i32, 0));
    let tokens: Vec<u64> = cfg.holders.iter().map(|h| h.token).collect();
    assert_eq!(tokens, vec![r0, r1]);

    // A mutex reads as before: exclusive, one holder, the old fields.
    let m = granted(&acquire(&mut c, &s[3], 2, "mutex", 0).await.unwrap());
    let d = describe(&mut c, "mutex").await;
    assert_eq!((d.mode, d.permits, d.token), (Exclusive as i32, 0, m));
    assert_eq!(d.holders.len(), 1);
}

/// A watch event as (kind, session, token, mode, value).
type Event = (String, u64, u64, Option<i32>, Option<Vec<u8>>);

async fn next_event(watch: &mut tonic::Streaming<pb::WatchMessage>) -> Event {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(10), watch.message())
            .await
            .expect("watch events in time")
            .expect("watch open")
            .expect("watch not ended");
        if let Some(pb::watch_message::Item::Event(e)) = m.item {
            return (e.kind, e.session, e.token, e.mode, e.value);
        }
    }
}

async fn campaign(
    c: &mut LocksClient<Channel>,
    s: &pb::Session,
    seq: u64,
    name: &str,
    wait_ms: u64,
    value: &[u8],
) -> Result<pb::AcquireResponse, tonic::Status> {
    c.acquire(pb::AcquireRequest {
        session: Some(*s),
        seq,
        name: name.into(),
        wait_timeout_ms: wait_ms,
        value: Some(value.to_vec()),
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner())
}

/// Issue #32's elections through gRPC: a campaign's grant publishes its value (Describe's
/// `value`, the watch's `granted` event with its mode), a queued campaign gets the lead with
/// its own value when the leader resigns, only the leader under its token proclaims
/// (`not-election-leader` otherwise), a value with a shared mode, over the limit or with a
/// lock-delay is refused before anything is proposed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_through_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = start(dir.path(), None).await;
    let mut c = client(&mut node).await;
    let a = session(&mut c, 10_000).await;
    let b = session(&mut c, 10_000).await;
    let mut watch = c
        .watch(pb::WatchRequest {
            prefix: "svc".into(),
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();

    // Bad input: refused with its reason.
    let e = c
        .acquire(pb::AcquireRequest {
            session: Some(a),
            seq: 1,
            name: "svc".into(),
            mode: pb::LockMode::Shared as i32,
            value: Some(b"x".to_vec()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "invalid-request", "{e:?}");
    let long = vec![b'x'; latchkey_core::limits::ELECTION_VALUE_BYTES_MAX + 1];
    let e = campaign(&mut c, &a, 1, "svc", 0, &long).await.unwrap_err();
    assert_eq!(reason(&e), "field-too-long", "{e:?}");
    // A campaign takes no lock-delay (`Op::Campaign` has none): refused, not dropped.
    let e = c
        .acquire(pb::AcquireRequest {
            session: Some(a),
            seq: 1,
            name: "svc".into(),
            value: Some(b"x".to_vec()),
            lock_delay_ms: 1_000,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "invalid-request", "{e:?}");
    assert_eq!(e.code(), Code::InvalidArgument);

    let t1 = granted(&campaign(&mut c, &a, 2, "svc", 0, b"a:80").await.unwrap());
    let info = describe(&mut c, "svc").await;
    assert_eq!((info.session, info.token), (a.id, t1));
    assert_eq!(info.value.as_deref(), Some(&b"a:80"[..]));
    assert_eq!(info.holders[0].value.as_deref(), Some(&b"a:80"[..]));

    // The leader proclaims; another session, or a stale token, is refused.
    c.proclaim(pb::ProclaimRequest {
        session: Some(a),
        seq: 3,
        name: "svc".into(),
        token: t1,
        value: b"a:81".to_vec(),
    })
    .await
    .expect("the leader proclaims");
    assert_eq!(
        describe(&mut c, "svc").await.value.as_deref(),
        Some(&b"a:81"[..])
    );
    let e = c
        .proclaim(pb::ProclaimRequest {
            session: Some(b),
            seq: 1,
            name: "svc".into(),
            token: t1,
            value: b"b".to_vec(),
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&e), "not-election-leader", "{e:?}");
    assert_eq!(e.code(), Code::FailedPrecondition);

    // b queues with its value; a resigns; b leads with its own.
    let mut seen = Vec::new();
    let mut cb = c.clone();
    let pending =
        tokio::spawn(async move { campaign(&mut cb, &b, 2, "svc", 60_000, b"b:80").await });
    while seen.len() < 5 && seen.last().is_none_or(|e: &Event| e.0 != "queued") {
        seen.push(next_event(&mut watch).await);
    }
    c.release(pb::ReleaseRequest {
        session: Some(a),
        seq: 4,
        name: "svc".into(),
        token: t1,
    })
    .await
    .expect("release");
    let t2 = granted(&pending.await.unwrap().unwrap());
    assert!(t2 > t1);
    let info = describe(&mut c, "svc").await;
    assert_eq!(
        (info.session, info.value.as_deref()),
        (b.id, Some(&b"b:80"[..]))
    );

    // The watch told it all, with modes and values.
    while seen.len() < 5 {
        seen.push(next_event(&mut watch).await);
    }
    let exclusive = Some(pb::LockMode::Exclusive as i32);
    assert_eq!(
        seen,
        vec![
            (
                "granted".into(),
                a.id,
                t1,
                exclusive,
                Some(b"a:80".to_vec())
            ),
            ("proclaimed".into(), a.id, t1, None, Some(b"a:81".to_vec())),
            ("queued".into(), b.id, 0, None, None),
            ("released".into(), a.id, t1, None, None),
            (
                "granted".into(),
                b.id,
                t2,
                exclusive,
                Some(b"b:80".to_vec())
            ),
        ]
    );
    node.stop().await.expect("the node stops");
}

/// GET /metrics of a node's metrics listener.
async fn scrape(metrics_addr: std::net::SocketAddr) -> String {
    latchkey_testkit::scrape_metrics(metrics_addr)
        .await
        .expect("the metrics")
}

fn counter(body: &str, name: &str) -> u64 {
    assert!(
        body.contains(&format!("\n{name} ")),
        "no {name} in:\n{body}"
    );
    latchkey_testkit::counter(body, name)
}

/// Issue #35: acquires and releases that arrive together from many callers are gathered by
/// the leader into batch entries (fewer entries than operations), and each caller gets its
/// own operation's answer: one grant per contended lock, the other caller not granted, every
/// holder and token what `describe` says, every release released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_operations_share_entries_and_each_caller_gets_its_own_answer() {
    const CALLERS: usize = 32;
    let dir = tempfile::tempdir().unwrap();
    let metrics_addr: std::net::SocketAddr = ([127, 0, 0, 1], latchkey_testkit::free_port()).into();
    // The gathering is off by default: this test turns it on.
    let mut node = Node::start_in(dir.path(), None, |c| {
        c.metrics_listen = Some(metrics_addr);
        c.coalesce = true;
    })
    .await
    .expect("the node starts");
    let mut c = client(&mut node).await;
    let mut sessions = Vec::new();
    for _ in 0..CALLERS {
        sessions.push(session(&mut c, 30_000).await);
    }
    let before = scrape(metrics_addr).await;
    // Callers 2k and 2k+1 both try "pair/k" (without waiting): one of them gets it.
    let acquires = sessions.iter().enumerate().map(|(i, s)| {
        let mut c = c.clone();
        let s = *s;
        async move { acquire(&mut c, &s, 1, &format!("pair/{}", i / 2), 0).await }
    });
    let answers = futures::future::join_all(acquires).await;
    let mut held = Vec::new();
    for pair in 0..CALLERS / 2 {
        let (a, b) = (&answers[2 * pair], &answers[2 * pair + 1]);
        let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
        let grant = pb::AcquireResult::Granted as i32;
        let (winner, token) = match (a.result == grant, b.result == grant) {
            (true, false) => (2 * pair, a.token),
            (false, true) => (2 * pair + 1, b.token),
            _ => panic!("pair/{pair}: not exactly one grant: {a:?} {b:?}"),
        };
        let loser = if winner % 2 == 0 {
            winner + 1
        } else {
            winner - 1
        };
        let lost = answers[loser].as_ref().unwrap();
        assert_eq!(
            lost.result,
            pb::AcquireResult::NotGranted as i32,
            "{lost:?}"
        );
        let info = describe(&mut c, &format!("pair/{pair}")).await;
        assert_eq!((info.session, info.token), (sessions[winner].id, token));
        assert_eq!(info.holders.len(), 1);
        held.push((winner, format!("pair/{pair}"), token));
    }
    let releases = held.iter().map(|(i, name, token)| {
        let mut c = c.clone();
        let s = sessions[*i];
        let (name, token) = (name.clone(), *token);
        async move {
            c.release(pb::ReleaseRequest {
                session: Some(s),
                seq: 2,
                name,
                token,
            })
            .await
            .map(|r| r.into_inner())
        }
    });
    for released in futures::future::join_all(releases).await {
        assert!(released.expect("release").released);
    }
    for pair in 0..CALLERS / 2 {
        assert!(describe(&mut c, &format!("pair/{pair}"))
            .await
            .holders
            .is_empty());
    }
    let after = scrape(metrics_addr).await;
    let delta = |name| counter(&after, name) - counter(&before, name);
    let (entries, ops) = (
        delta("latchkey_entries_applied_total"),
        delta("latchkey_operations_applied_total"),
    );
    // The node's own entries (a lease mark, say) may fall in the window too.
    assert!(ops >= (CALLERS + CALLERS / 2) as u64, "{after}");
    assert!(
        entries < ops,
        "{ops} operations took {entries} entries: none was gathered into a batch"
    );
    node.stop().await.expect("the node stops cleanly");
}

/// One `Batch` call (issue #35 item 1).
async fn batch(
    c: &mut LocksClient<Channel>,
    ops: Vec<pb::batch_op::Op>,
) -> Result<Vec<pb::batch_result::Result>, tonic::Status> {
    let ops = ops
        .into_iter()
        .map(|op| pb::BatchOp { op: Some(op) })
        .collect();
    let results = c
        .batch(pb::BatchRequest { ops })
        .await?
        .into_inner()
        .results;
    Ok(results
        .into_iter()
        .map(|r| r.result.expect("every operation has a result"))
        .collect())
}

fn batch_acquire(s: &pb::Session, seq: u64, name: &str, wait_ms: u64) -> pb::batch_op::Op {
    pb::batch_op::Op::Acquire(pb::AcquireRequest {
        session: Some(*s),
        seq,
        name: name.into(),
        wait_timeout_ms: wait_ms,
        ..Default::default()
    })
}

/// Issue #35 item 1: each operation of a `Batch` call is answered as its own call would be,
/// in order: grants, a wait answered PENDING at once and still queued (re-sent alone, same
/// seq, it is granted on the release), an operation's error beside the others' answers, a
/// retried batch answered with the first outcomes, and malformed batches refused whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_answers_each_operation_as_its_own_call_would() {
    use pb::batch_op::Op;
    use pb::batch_result::Result as R;
    let dir = tempfile::tempdir().unwrap();
    let mut node = start(dir.path(), None).await;
    let mut c = client(&mut node).await;
    let (a, b) = (session(&mut c, 60_000).await, session(&mut c, 60_000).await);

    let first = batch(
        &mut c,
        vec![
            batch_acquire(&a, 1, "x", 0),
            batch_acquire(&a, 2, "y", 0),
            batch_acquire(&a, 3, "", 0),
            Op::Release(pb::ReleaseRequest {
                session: Some(a),
                seq: 4,
                name: "never-held".into(),
                token: 1,
            }),
        ],
    )
    .await
    .expect("the batch");
    let [R::Acquire(x), R::Acquire(y), R::Error(bad), R::Release(never)] = &first[..] else {
        panic!("{first:?}");
    };
    let (tx, ty) = (granted(x), granted(y));
    assert!(tx != ty, "{first:?}");
    assert_eq!(bad.code, Code::InvalidArgument as i32, "{bad:?}");
    assert!(bad.message.contains("name"), "{bad:?}");
    assert!(!never.released);
    // Retried whole (a lost answer): the same outcomes, nothing taken twice.
    let again = batch(
        &mut c,
        vec![batch_acquire(&a, 1, "x", 0), batch_acquire(&a, 2, "y", 0)],
    )
    .await
    .unwrap();
    let [R::Acquire(x2), R::Acquire(y2)] = &again[..] else {
        panic!("{again:?}");
    };
    assert_eq!((granted(x2), granted(y2)), (tx, ty));

    // b waits for x: PENDING at once, in the batch, and queued.
    let started = std::time::Instant::now();
    let waiting = batch(
        &mut c,
        vec![
            batch_acquire(&b, 1, "x", 30_000),
            Op::KeepAlive(pb::KeepAliveRequest {
                sessions: vec![a, b],
            }),
        ],
    )
    .await
    .unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(latchkey_core::limits::ACQUIRE_POLL_MS_MAX),
        "the batch waited {:?} for its queued acquire",
        started.elapsed()
    );
    let [R::Acquire(pending), R::KeepAlive(renewed)] = &waiting[..] else {
        panic!("{waiting:?}");
    };
    assert_eq!(
        pending.result,
        pb::AcquireResult::Pending as i32,
        "{pending:?}"
    );
    assert_eq!(pending.position, 1, "{pending:?}");
    assert_eq!(renewed.leases.len(), 2, "{renewed:?}");
    assert!(renewed.leases.iter().all(|l| l.alive), "{renewed:?}");
    assert_eq!(describe(&mut c, "x").await.waiters, 1);

    // a releases x and closes itself in one batch; b's wait, re-sent alone, is granted.
    let done = batch(
        &mut c,
        vec![
            Op::Release(pb::ReleaseRequest {
                session: Some(a),
                seq: 5,
                name: "x".into(),
                token: tx,
            }),
            Op::CloseSession(pb::CloseSessionRequest { session: Some(a) }),
        ],
    )
    .await
    .unwrap();
    assert!(
        matches!(&done[..], [R::Release(r), R::CloseSession(_)] if r.released)
            || matches!(&done[..], [R::Error(e), R::CloseSession(_)] if e.reason == "session-not-found"),
        "{done:?}"
    );
    let resumed = acquire(&mut c, &b, 1, "x", 30_000).await.unwrap();
    assert!(granted(&resumed) > tx);
    assert!(!describe(&mut c, "y").await.held, "a's close released y");

    // Malformed batches are refused whole.
    for ops in [
        vec![],
        (0..=latchkey_core::limits::BATCH_CALL_OPS_MAX)
            .map(|i| batch_acquire(&b, 100 + i as u64, "z", 0))
            .collect(),
    ] {
        let n = ops.len();
        let err = batch(&mut c, ops).await.expect_err("a malformed batch");
        assert_eq!(err.code(), Code::InvalidArgument, "{n} ops: {err:?}");
    }
    // One keepalive renews any number of sessions: two in a batch are refused (their answers
    // together could outgrow a message after the batch's other operations applied).
    let keepalive = || Op::KeepAlive(pb::KeepAliveRequest { sessions: vec![b] });
    let err = batch(&mut c, vec![keepalive(), keepalive()])
        .await
        .expect_err("two keepalives");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("at most one keepalive"), "{err:?}");
    let err = c
        .batch(pb::BatchRequest {
            ops: vec![pb::BatchOp { op: None }],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        matches!(&err.results[..], [pb::BatchResult { result: Some(R::Error(e)) }] if e.code == Code::InvalidArgument as i32),
        "{err:?}"
    );
    node.stop().await.expect("the node stops cleanly");
}

/// Issue #35 items 1 and 3: a batch's operations reach the leader at once, so with the leader's
/// gathering on they share entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batchs_operations_share_entries() {
    const OPS: usize = 64;
    let dir = tempfile::tempdir().unwrap();
    let metrics_addr: std::net::SocketAddr = ([127, 0, 0, 1], latchkey_testkit::free_port()).into();
    let mut node = Node::start_in(dir.path(), None, |c| {
        c.metrics_listen = Some(metrics_addr);
        c.coalesce = true;
    })
    .await
    .expect("the node starts");
    let mut c = client(&mut node).await;
    let s = session(&mut c, 30_000).await;
    let before = scrape(metrics_addr).await;
    let ops = (0..OPS)
        .map(|i| batch_acquire(&s, 1 + i as u64, &format!("many/{i}"), 0))
        .collect();
    let results = batch(&mut c, ops).await.unwrap();
    assert_eq!(results.len(), OPS);
    for (i, r) in results.iter().enumerate() {
        let pb::batch_result::Result::Acquire(r) = r else {
            panic!("{i}: {r:?}");
        };
        let info = describe(&mut c, &format!("many/{i}")).await;
        assert_eq!((info.session, info.token), (s.id, granted(r)), "many/{i}");
    }
    let after = scrape(metrics_addr).await;
    let delta = |name| counter(&after, name) - counter(&before, name);
    let (entries, ops) = (
        delta("latchkey_entries_applied_total"),
        delta("latchkey_operations_applied_total"),
    );
    assert!(ops >= OPS as u64, "{after}");
    assert!(
        entries * 4 <= ops,
        "{ops} operations took {entries} entries: a batch's operations were not gathered"
    );
    node.stop().await.expect("the node stops cleanly");
}
