//! The client against a scripted in-process gRPC server: leader hints, sequence numbers kept
//! across retries and long-polls, and the client-side lease deadline. No latchkey server needed.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use latchkey_client::{Client, Error};
use latchkey_proto::v1::locks_server::{Locks, LocksServer};
use latchkey_proto::v1::*;
use latchkey_proto::{ERROR_REASON_KEY, LEADER_ADDR_KEY};
use tokio::time::Instant;
use tonic::{Request, Response, Status};

#[derive(Default)]
struct Script {
    /// Answer everything with UNAVAILABLE + this leader hint.
    redirect_to: Option<String>,
    /// Acquire: answer PENDING this many times, then the final answer.
    pending: u32,
    /// Acquire's final answer: GRANTED (token 7) or NOT_GRANTED.
    grant: bool,
    /// Fail the first Acquire attempt as a broken transport would (no latchkey-error).
    drop_first_acquire: bool,
    /// KeepAlive: never answer / answer "not alive".
    keepalive_hangs: bool,
    keepalive_dead: bool,
    /// Acquire: never answer (a wait long-polling on a held lock).
    acquire_hangs: bool,
    /// Acquire: answer that the request's outcome is forgotten (`request-too-old`).
    acquire_too_old: bool,
}

#[derive(Default)]
struct Seen {
    acquires: Vec<(u64, u64)>, // (seq, wait_timeout_ms)
    /// Each Acquire's (mode, permits), as sent.
    modes: Vec<(i32, u32)>,
    releases: Vec<u64>,
    keepalives: u32,
    closes: u32,
}

#[derive(Clone, Default)]
struct Fake {
    script: Arc<Mutex<Script>>,
    seen: Arc<Mutex<Seen>>,
    /// Acquire calls received so far, to await rather than poll.
    acquire_calls: Arc<tokio::sync::watch::Sender<usize>>,
    /// Release calls received so far.
    release_calls: Arc<tokio::sync::watch::Sender<usize>>,
}

fn error(code: tonic::Code, reason: &'static str) -> Status {
    let mut s = Status::new(code, reason);
    s.metadata_mut()
        .insert(ERROR_REASON_KEY, reason.parse().unwrap());
    s
}

impl Fake {
    fn redirect(&self) -> Result<(), Status> {
        match &self.script.lock().unwrap().redirect_to {
            Some(addr) => {
                let mut s = error(tonic::Code::Unavailable, "not-leader");
                s.metadata_mut()
                    .insert(LEADER_ADDR_KEY, addr.parse().unwrap());
                Err(s)
            }
            None => Ok(()),
        }
    }
}

#[tonic::async_trait]
impl Locks for Fake {
    async fn create_session(
        &self,
        request: Request<CreateSessionRequest>,
    ) -> Result<Response<CreateSessionResponse>, Status> {
        self.redirect()?;
        Ok(Response::new(CreateSessionResponse {
            session: Some(Session { id: 1, secret: 42 }),
            ttl_ms: request.into_inner().ttl_ms,
            // A server from before groups: no `groups`, read as one.
            groups: 0,
        }))
    }

    async fn keep_alive(
        &self,
        request: Request<KeepAliveRequest>,
    ) -> Result<Response<KeepAliveResponse>, Status> {
        self.redirect()?;
        self.seen.lock().unwrap().keepalives += 1;
        let (hangs, dead) = {
            let s = self.script.lock().unwrap();
            (s.keepalive_hangs, s.keepalive_dead)
        };
        if hangs {
            std::future::pending::<()>().await;
        }
        let leases = request
            .into_inner()
            .sessions
            .iter()
            .map(|s| SessionLease {
                id: s.id,
                alive: !dead && s.secret == 42,
                ttl_ms: 1_000,
                ..Default::default()
            })
            .collect();
        Ok(Response::new(KeepAliveResponse {
            leases,
            refused: Vec::new(),
        }))
    }

    async fn close_session(
        &self,
        _: Request<CloseSessionRequest>,
    ) -> Result<Response<CloseSessionResponse>, Status> {
        self.redirect()?;
        self.seen.lock().unwrap().closes += 1;
        Ok(Response::new(CloseSessionResponse {}))
    }

    async fn acquire(
        &self,
        request: Request<AcquireRequest>,
    ) -> Result<Response<AcquireResponse>, Status> {
        self.redirect()?;
        let r = request.into_inner();
        self.seen
            .lock()
            .unwrap()
            .acquires
            .push((r.seq, r.wait_timeout_ms));
        self.seen.lock().unwrap().modes.push((r.mode, r.permits));
        self.acquire_calls.send_modify(|n| *n += 1);
        if self.script.lock().unwrap().acquire_hangs {
            std::future::pending::<()>().await;
        }
        if self.script.lock().unwrap().acquire_too_old {
            return Err(error(tonic::Code::FailedPrecondition, "request-too-old"));
        }
        let mut script = self.script.lock().unwrap();
        if script.drop_first_acquire {
            script.drop_first_acquire = false;
            return Err(Status::unavailable("connection reset"));
        }
        let result = if script.pending > 0 {
            script.pending -= 1;
            AcquireResult::Pending
        } else if script.grant {
            AcquireResult::Granted
        } else {
            AcquireResult::NotGranted
        };
        Ok(Response::new(AcquireResponse {
            result: result as i32,
            token: if result == AcquireResult::Granted {
                7
            } else {
                0
            },
            position: 1,
            ..Default::default()
        }))
    }

    async fn proclaim(
        &self,
        _: Request<latchkey_proto::v1::ProclaimRequest>,
    ) -> Result<Response<latchkey_proto::v1::ProclaimResponse>, Status> {
        Err(Status::unimplemented("not in this fake"))
    }

    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseResponse>, Status> {
        self.redirect()?;
        self.seen
            .lock()
            .unwrap()
            .releases
            .push(request.into_inner().seq);
        self.release_calls.send_modify(|n| *n += 1);
        Ok(Response::new(ReleaseResponse { released: true }))
    }

    async fn describe(
        &self,
        request: Request<DescribeRequest>,
    ) -> Result<Response<DescribeResponse>, Status> {
        self.redirect()?;
        Ok(Response::new(DescribeResponse {
            lock: Some(LockInfo {
                name: request.into_inner().name,
                held: true,
                session: 1,
                token: 7,
                held_for_ms: 1500,
                waiters: 2,
                ..Default::default()
            }),
            read_index: 0,
        }))
    }

    async fn admin_release(
        &self,
        _: Request<latchkey_proto::v1::AdminReleaseRequest>,
    ) -> Result<Response<latchkey_proto::v1::AdminReleaseResponse>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }

    async fn admin_revoke(
        &self,
        _: Request<latchkey_proto::v1::AdminRevokeRequest>,
    ) -> Result<Response<latchkey_proto::v1::AdminRevokeResponse>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }

    type BackupStream = futures::stream::Empty<Result<BackupChunk, Status>>;

    async fn backup(
        &self,
        _: Request<BackupRequest>,
    ) -> Result<Response<Self::BackupStream>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }

    type WatchStream = futures::stream::Empty<Result<WatchMessage, Status>>;

    async fn watch(&self, _: Request<WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }

    async fn audit(
        &self,
        _: Request<latchkey_proto::v1::AuditRequest>,
    ) -> Result<Response<latchkey_proto::v1::AuditResponse>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }

    async fn batch(
        &self,
        _: Request<latchkey_proto::v1::BatchRequest>,
    ) -> Result<Response<latchkey_proto::v1::BatchResponse>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }

    async fn list(&self, _: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        self.redirect()?;
        Ok(Response::new(ListResponse {
            locks: vec![],
            truncated: false,
        }))
    }

    async fn node_status(
        &self,
        _: Request<NodeStatusRequest>,
    ) -> Result<Response<NodeStatusResponse>, Status> {
        Ok(Response::new(NodeStatusResponse {
            id: 1,
            role: "leader".into(),
            term: 3,
            last_log_index: 10,
            applied_index: 10,
            leader_id: 1,
            members: vec![Member {
                id: 1,
                addr: "x".into(),
            }],
            sessions: 1,
            locks: 1,
            cluster_id: String::new(),
            learners: vec![],
            // A server from before groups: no `groups`, read as one.
            ..Default::default()
        }))
    }

    async fn add_member(
        &self,
        _: Request<AddMemberRequest>,
    ) -> Result<Response<MembersResponse>, Status> {
        Err(Status::unimplemented("not faked"))
    }

    async fn remove_member(
        &self,
        _: Request<RemoveMemberRequest>,
    ) -> Result<Response<MembersResponse>, Status> {
        Err(Status::unimplemented("not faked"))
    }

    async fn move_member(
        &self,
        _: Request<MoveMemberRequest>,
    ) -> Result<Response<MembersResponse>, Status> {
        Err(Status::unimplemented("not faked"))
    }
}

async fn serve(fake: Fake) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(LocksServer::new(fake))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    addr
}

/// A leader and a follower that points at it; the client only knows the follower first.
async fn cluster(script: Script) -> (Fake, Client) {
    let leader = Fake {
        script: Arc::new(Mutex::new(script)),
        ..Fake::default()
    };
    let leader_addr = serve(leader.clone()).await;
    let follower = Fake::default();
    follower.script.lock().unwrap().redirect_to = Some(leader_addr.to_string());
    let follower_addr = serve(follower).await;
    let client = Client::connect([follower_addr.to_string(), leader_addr.to_string()])
        .await
        .unwrap();
    (leader, client)
}

#[tokio::test]
async fn wait_follows_the_leader_hint_and_keeps_one_seq_across_polls_and_retries() {
    let (leader, client) = cluster(Script {
        pending: 2,
        grant: true,
        drop_first_acquire: true,
        ..Script::default()
    })
    .await;
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    let guard = session
        .lock("a")
        .wait(Some(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(guard.token(), 7);
    assert_eq!(guard.name(), "a");
    assert_eq!(
        latchkey_client::fencing_header(&guard),
        ("latchkey-token", "7".to_string())
    );
    let acquires = leader.seen.lock().unwrap().acquires.clone();
    // Dropped attempt, two PENDING long-polls, the grant: one logical request, one seq.
    assert_eq!(acquires.len(), 4, "{acquires:?}");
    assert!(
        acquires.iter().all(|(seq, _)| *seq == acquires[0].0),
        "{acquires:?}"
    );
    // Each re-send asks for the remaining time, never more.
    assert!(
        acquires.windows(2).all(|w| w[1].1 <= w[0].1),
        "{acquires:?}"
    );
    assert!(acquires[0].1 <= 60_000 && acquires[0].1 > 50_000);

    guard.release().await.unwrap();
    let releases = leader.seen.lock().unwrap().releases.clone();
    assert_eq!(releases.len(), 1);
    assert_ne!(releases[0], acquires[0].0, "a new request gets a new seq");
    session.close().await.unwrap();
    assert_eq!(leader.seen.lock().unwrap().closes, 1);
}

/// Issue #32: a permit's or a reader's request carries its mode on every re-send of its one
/// seq (a long-poll answered pending, a dropped attempt, a leader hint); a mutex's leaves it
/// unset, as before; a permit count out of range is refused before anything is sent.
#[tokio::test]
async fn the_mode_goes_with_every_resend_of_one_request() {
    let (leader, client) = cluster(Script {
        pending: 2,
        grant: true,
        drop_first_acquire: true,
        ..Script::default()
    })
    .await;
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    let guard = session
        .acquire_permit("jobs", 3)
        .wait(Some(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(guard.token(), 7);
    let seen = std::mem::take(&mut *leader.seen.lock().unwrap());
    assert_eq!(seen.acquires.len(), 4, "{:?}", seen.acquires);
    assert!(seen
        .acquires
        .iter()
        .all(|(seq, _)| *seq == seen.acquires[0].0));
    assert_eq!(seen.modes, vec![(LockMode::Permits as i32, 3); 4]);

    let reader = session.lock_shared("cfg").wait(None).await.unwrap();
    let mutex = session.lock("m").wait(None).await.unwrap();
    let modes = leader.seen.lock().unwrap().modes.clone();
    assert_eq!(
        modes,
        vec![
            (LockMode::Shared as i32, 0),
            (LockMode::Exclusive as i32, 0)
        ]
    );
    for bad in [0, 1_025] {
        assert!(
            matches!(
                session.acquire_permit("jobs", bad).wait(None).await,
                Err(Error::InvalidArgument { .. })
            ),
            "{bad} permits"
        );
    }
    assert_eq!(leader.seen.lock().unwrap().modes.len(), 2, "nothing sent");
    drop((guard, reader, mutex));
}

#[tokio::test]
async fn not_granted_is_wait_timed_out_and_try_acquire_is_none() {
    let (_leader, client) = cluster(Script::default()).await;
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    match session
        .lock("a")
        .wait(Some(Duration::from_millis(200)))
        .await
    {
        Err(Error::WaitTimedOut { name }) => assert_eq!(name, "a"),
        other => panic!("{other:?}"),
    }
    assert!(session.lock("a").try_acquire().await.unwrap().is_none());
    assert!(matches!(
        session.lock("").try_acquire().await,
        Err(Error::InvalidArgument { .. })
    ));
}

#[tokio::test]
async fn unanswered_renewals_lose_the_lock_at_ttl_minus_margin() {
    let (leader, client) = cluster(Script {
        grant: true,
        ..Script::default()
    })
    .await;
    let before_create = Instant::now();
    let session = client.session(Duration::from_secs(1)).await.unwrap();
    let guard = session.lock("a").wait(None).await.unwrap();
    leader.script.lock().unwrap().keepalive_hangs = true;
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("lost() must complete");
    let lost_after = before_create.elapsed();
    // The deadline is the last acknowledged send + TTL - margin; one renewal may have been
    // acknowledged (at TTL/3) before the hang, so no earlier than 800 ms after the create.
    assert!(lost_after >= Duration::from_millis(800), "{lost_after:?}");
    assert!(guard.is_lost());
    assert!(session.is_lost());
    assert!(matches!(
        session.lock("b").wait(None).await,
        Err(Error::SessionLost { .. })
    ));
}

#[tokio::test]
async fn server_saying_the_session_is_gone_loses_it_at_once() {
    let (leader, client) = cluster(Script {
        grant: true,
        keepalive_dead: true,
        ..Script::default()
    })
    .await;
    let session = client.session(Duration::from_secs(3)).await.unwrap();
    let guard = session.lock("a").wait(None).await.unwrap();
    // The first renewal (at TTL/3 = 1 s) hears "not alive", long before the 2.4 s deadline.
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("lost() must complete");
    assert!(started.elapsed() < Duration::from_millis(2_000));
    assert!(guard.lost_reason().unwrap().contains("expired"));
    assert_eq!(leader.seen.lock().unwrap().keepalives, 1);
}

#[tokio::test]
async fn reads_map_to_plain_structs() {
    let (_leader, client) = cluster(Script::default()).await;
    let lock = client.describe("x").await.unwrap();
    assert_eq!(lock.name, "x");
    let holder = lock.holder.unwrap();
    assert_eq!((holder.session, holder.token), (1, 7));
    assert_eq!(holder.held_for, Duration::from_millis(1500));
    assert_eq!(lock.waiters, 2);
    assert!(client.list("").await.unwrap().locks.is_empty());
}

/// tokio's clock plus an offset the test moves forward: a process that was paused, as its
/// monotonic clock sees it on resuming.
#[derive(Default)]
struct JumpClock(Mutex<Duration>);

impl latchkey_client::ClientClock for JumpClock {
    fn now(&self) -> Instant {
        Instant::now() + *self.0.lock().unwrap()
    }
}

#[tokio::test]
async fn is_lost_reads_the_clock_so_a_resumed_holder_sees_its_deadline_passed() {
    let (leader, _) = cluster(Script {
        grant: true,
        ..Script::default()
    })
    .await;
    let addr = serve(leader).await;
    let clock = Arc::new(JumpClock::default());
    let env = latchkey_client::ClientEnv {
        clock: clock.clone(),
        ..latchkey_client::ClientEnv::default()
    };
    let client = Client::with_env(
        [addr.to_string()],
        latchkey_client::ClientConfig::default(),
        env,
    )
    .unwrap();
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    let guard = session.lock("a").wait(None).await.unwrap();
    assert!(!guard.is_lost());
    // 9 s pass on the client's clock while no task runs: past the 8 s deadline (TTL - TTL/5).
    *clock.0.lock().unwrap() = Duration::from_secs(9);
    assert!(
        guard.is_lost(),
        "the deadline has passed on the client's clock"
    );
    assert!(session.is_lost());
    // The renewal task notices at its next wake-up and says why.
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("lost() must complete");
    assert!(guard.lost_reason().is_some());
}

/// Regression: every wait held a permit of the one in-flight budget, and releases needed one
/// too, so a session with 64 waits outstanding could never release (nor end those waits).
#[tokio::test]
async fn release_and_close_complete_with_the_most_waits_outstanding() {
    use futures::stream::{FuturesUnordered, StreamExt};
    use latchkey_core::limits::SESSION_WAITS_IN_FLIGHT_MAX;

    let (leader, client) = cluster(Script {
        grant: true,
        ..Script::default()
    })
    .await;
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    let guard = session.lock("held").wait(None).await.unwrap();
    leader.script.lock().unwrap().acquire_hangs = true;
    let mut calls = leader.acquire_calls.subscribe();
    let first_wait = *calls.borrow_and_update();

    let mut waits: FuturesUnordered<_> = (0..SESSION_WAITS_IN_FLIGHT_MAX)
        .map(|i| session.lock(format!("wait/{i}")).wait(None))
        .collect();
    // Drive the waits until the server has every one of them.
    let all_sent = calls.wait_for(|n| *n >= first_wait + SESSION_WAITS_IN_FLIGHT_MAX);
    tokio::select! {
        r = waits.next() => panic!("a wait ended: {r:?}"),
        r = tokio::time::timeout(Duration::from_secs(20), all_sent) => {
            r.expect("all waits reach the server").unwrap();
        }
    }
    let release = tokio::time::timeout(Duration::from_secs(10), guard.release());
    tokio::select! {
        r = waits.next() => panic!("a wait ended: {r:?}"),
        r = release => r.expect("the release must not queue behind the waits").unwrap(),
    }
    assert_eq!(leader.seen.lock().unwrap().releases.len(), 1);
    drop(waits);
    tokio::time::timeout(Duration::from_secs(10), session.close())
        .await
        .expect("the close must not queue behind the abandoned waits")
        .unwrap();
    assert_eq!(leader.seen.lock().unwrap().closes, 1);
}

/// Regression: an Acquire whose outcome the server had forgotten (`request-too-old`) was given
/// up, so a grant among those outcomes stayed held by the live session with no guard.
#[tokio::test]
async fn an_acquire_answered_too_old_releases_the_grant_the_session_holds() {
    // The fake's Describe says session 1 (ours) holds the lock with token 7.
    let (leader, client) = cluster(Script {
        acquire_too_old: true,
        ..Script::default()
    })
    .await;
    let session = client.session(Duration::from_secs(10)).await.unwrap();
    let mut releases = leader.release_calls.subscribe();
    match session.lock("a").wait(None).await {
        Err(Error::Conflict { reason, .. }) => assert_eq!(reason, "request-too-old"),
        other => panic!("{other:?}"),
    }
    tokio::time::timeout(Duration::from_secs(10), releases.wait_for(|n| *n == 1))
        .await
        .expect("the orphan grant must be released")
        .unwrap();
    session.close().await.unwrap();
}

/// Issue #33: endpoints that refuse connections fail a call within the fail-fast budget
/// (`CLIENT_UNREACHABLE_MS_MAX`, about what etcdctl takes), not after the whole retry budget
/// (64 attempts in 11.7 s before), and the error names the endpoint and the cause.
#[tokio::test]
async fn endpoints_that_refuse_connections_fail_fast_naming_the_cause() {
    use latchkey_core::limits;
    // Nothing listens on ports 1 and 2 of localhost: connections are refused at once.
    let client = Client::connect(["127.0.0.1:1", "127.0.0.1:2"])
        .await
        .unwrap();
    let err = client.list("").await.unwrap_err();
    let Error::Transport {
        attempts, elapsed, ..
    } = &err
    else {
        panic!("{err:?}")
    };
    let text = err.to_string();
    assert!(text.contains("connection refused"), "{text}");
    assert!(text.contains("cannot reach 127.0.0.1:"), "{text}");
    let budget = Duration::from_millis(limits::CLIENT_UNREACHABLE_MS_MAX);
    assert!(*elapsed >= budget && *elapsed < 2 * budget, "{text}");
    // Several rounds over both endpoints, not one try each.
    assert!(*attempts >= 4, "{text}");
}

/// Issue #33: a name that does not resolve says so ("no such host"), not "uncategorized
/// error", and fails within the fail-fast budget too.
#[tokio::test]
async fn an_endpoint_that_does_not_resolve_says_no_such_host() {
    use latchkey_core::limits;
    let client = Client::connect(["nosuchhost.invalid:7420"]).await.unwrap();
    let err = client.list("").await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("cannot reach nosuchhost.invalid:7420: no such host"),
        "{text}"
    );
    let Error::Transport { elapsed, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(
        *elapsed < 2 * Duration::from_millis(limits::CLIENT_UNREACHABLE_MS_MAX),
        "{text}"
    );
}

/// The fail-fast budget is for endpoints that never answer: once a member answered (here "not
/// the leader", as in an election), the call keeps its whole retry budget, although the other
/// endpoint refuses every connection.
#[tokio::test]
async fn a_member_that_answers_keeps_the_whole_retry_budget() {
    let follower = Fake::default();
    follower.script.lock().unwrap().redirect_to = Some(String::new());
    let follower_addr = serve(follower).await;
    let retry = latchkey_client::RetryPolicy {
        attempts_max: 1_000,
        elapsed_max: Duration::from_millis(1_500),
        unreachable_max: Duration::from_millis(200),
        backoff_initial: Duration::from_millis(10),
        backoff_max: Duration::from_millis(50),
    };
    let config = latchkey_client::ClientConfig {
        retry,
        ..Default::default()
    };
    let client = Client::with_config(
        ["127.0.0.1:1".to_owned(), follower_addr.to_string()],
        config,
    )
    .unwrap();
    let err = client.list("").await.unwrap_err();
    let Error::Unavailable { elapsed, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(*elapsed >= Duration::from_millis(1_500), "{err}");
}

/// A member that accepts connections but does not answer in time (busy, paused) is not a dead
/// address: the call keeps its whole retry budget. (With the fail-fast budget applied to it, a
/// `cluster add` gave up after one unanswered 5 s attempt.)
#[tokio::test]
async fn a_member_that_accepts_but_does_not_answer_keeps_the_whole_retry_budget() {
    // The kernel completes the handshakes; nothing ever answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let config = latchkey_client::ClientConfig {
        rpc_timeout: Duration::from_millis(300),
        retry: latchkey_client::RetryPolicy {
            attempts_max: 1_000,
            elapsed_max: Duration::from_millis(1_500),
            unreachable_max: Duration::from_millis(200),
            backoff_initial: Duration::from_millis(10),
            backoff_max: Duration::from_millis(50),
        },
        ..Default::default()
    };
    let client = Client::with_config([addr], config).unwrap();
    let err = client.list("").await.unwrap_err();
    let Error::Transport {
        attempts, elapsed, ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert!(*elapsed >= Duration::from_millis(1_500), "{err}");
    assert!(*attempts >= 2, "{err}");
    drop(silent);
}

/// Regression (issue #34's nemesis, `isolate-leader`): a dead member whose connection times out
/// (a host down, a cut link: its SYNs dropped) took the whole fail-fast budget in one attempt,
/// and the call gave up without trying the live member ("cannot reach ...: timed out (1
/// attempts in 2.0s)"). The fail-fast budget ends a call only once every endpoint was tried.
#[tokio::test]
async fn a_dead_endpoint_whose_connect_times_out_does_not_hide_the_live_one() {
    // A listener whose accept queue is full and never drained: the kernel drops further SYNs,
    // so a connection to it times out, as to a host that is down.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let dead = socket.listen(1).unwrap();
    let dead_addr = dead.local_addr().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..8 {
        match tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(dead_addr),
        )
        .await
        {
            Ok(Ok(s)) => fillers.push(s),
            _ => break,
        }
    }
    let live = serve(Fake::default()).await;
    let config = latchkey_client::ClientConfig {
        // The connect times out before the attempt does, as with the defaults (2 s and 5 s).
        connect_timeout: Duration::from_millis(500),
        rpc_timeout: Duration::from_secs(2),
        retry: latchkey_client::RetryPolicy {
            attempts_max: 1_000,
            elapsed_max: Duration::from_secs(10),
            unreachable_max: Duration::from_millis(400),
            backoff_initial: Duration::from_millis(10),
            backoff_max: Duration::from_millis(50),
        },
        ..Default::default()
    };
    // The dead one first: the client starts at the first endpoint.
    let client = Client::with_config([dead_addr.to_string(), live.to_string()], config).unwrap();
    client
        .list("")
        .await
        .expect("the live member answers although the dead one took the fail-fast budget");
    drop((dead, fillers));
}
