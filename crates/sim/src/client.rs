//! A simulated client: sessions, renewals and read-modify-writes under locks, recorded.
//!
//! It speaks the `Locks` gRPC API directly (through `LocksClient`) and follows the client
//! library's rules: a mutating request keeps its sequence number across retries and leader
//! changes; leader hints are followed; the session's deadline is the *send* time of the last
//! acknowledged renewal plus the TTL minus `latchkey_client`'s safety margin (a fifth of the
//! TTL, at least 200 ms), measured on this host's own drifting clock; once it passes, the
//! client reports its locks lost and stops acting as their holder.
//!
//! Faults the harness injects through [`ClientControl`]: a *pause* (the whole client stops
//! between reading and writing the resource for longer than the TTL, renewals included, then
//! writes without looking at the clock, as a process resuming from a GC pause would), a
//! *crash* (the client abandons its session while holding a lock) and a *partition* (at its
//! next critical section the client asks the harness to cut it off from every node for longer
//! than the TTL, and keeps working: it checks its hold every 50–100 ms and stops at once when
//! its deadline has passed).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use latchkey_proto::v1 as pb;
use latchkey_proto::v1::locks_client::LocksClient;
use latchkey_server::Clock;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::clock::{true_now, DriftClock};
use crate::history::{Actor, Event, History, OpKind, Ret};
use crate::net;
use crate::resource::Resource;

/// The client library's safety margin (`latchkey_client::safety_margin`).
pub fn safety_margin(ttl: Duration) -> Duration {
    (ttl / 5).max(Duration::from_millis(200))
}

/// How long one Acquire waits in the queue on the server.
pub const WAIT_MS: u64 = 3_000;
/// Deadline of one short RPC attempt.
const RPC_TIMEOUT: Duration = Duration::from_millis(1_000);

#[derive(Debug, Clone)]
pub struct ClientSetup {
    pub id: u32,
    pub nodes: Vec<String>,
    pub locks: Vec<String>,
    pub ttl: Duration,
    pub drift_ppm: i64,
    pub seed: u64,
    /// True time after which no new operation starts.
    pub stop_at: Duration,
    pub work_ms: (u64, u64),
}

/// Faults the harness asks a client to suffer at its next critical section.
#[derive(Debug, Default)]
pub struct ClientControl {
    /// Pause for this many milliseconds (0: none).
    pub pause_ms: AtomicU64,
    pub crash: AtomicBool,
    /// At the next critical section, be cut off from every node for this many milliseconds
    /// (0: none).
    pub cut_ms: AtomicU64,
    /// The client's request to the harness: cut me off now, for this many milliseconds.
    pub cut_now_ms: AtomicU64,
    /// True-time nanoseconds until which the whole client is paused.
    paused_until_ns: AtomicU64,
}

impl ClientControl {
    fn paused_for(&self) -> Option<Duration> {
        let until = Duration::from_nanos(self.paused_until_ns.load(Ordering::Relaxed));
        let now = true_now();
        (until > now).then(|| until - now)
    }
}

/// Routing and retries over the nodes.
struct Conn {
    nodes: Vec<String>,
    clients: Vec<LocksClient<Channel>>,
    leader: usize,
    rng: StdRng,
}

enum CallError {
    /// The server answered with a definite error.
    Status(Status),
    /// No node answered within the budget.
    GaveUp,
}

impl Conn {
    fn new(nodes: Vec<String>, seed: u64) -> Conn {
        let clients = nodes
            .iter()
            .map(|a| LocksClient::new(net::channel(a).expect("valid address")))
            .collect();
        Conn {
            nodes,
            clients,
            leader: 0,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// One logical request, retried (the same request each time) until answered or `budget`.
    async fn call<Req: Clone, Resp, F, Fut>(
        &mut self,
        request: Req,
        attempt: Duration,
        budget: Duration,
        mut send: F,
    ) -> Result<Resp, CallError>
    where
        F: FnMut(LocksClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        let start = Instant::now();
        loop {
            let mut req = tonic::Request::new(request.clone());
            req.set_timeout(attempt);
            let client = self.clients[self.leader].clone();
            match tokio::time::timeout(attempt, send(client, req)).await {
                Ok(Ok(resp)) => return Ok(resp.into_inner()),
                Ok(Err(status)) if status.code() == Code::Unavailable => {
                    let hint = status
                        .metadata()
                        .get(latchkey_proto::LEADER_ADDR_KEY)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|a| self.nodes.iter().position(|n| n == a));
                    self.leader = match hint {
                        Some(i) if i != self.leader => i,
                        _ => (self.leader + 1) % self.nodes.len(),
                    };
                }
                Ok(Err(status))
                    if matches!(
                        status.code(),
                        Code::Cancelled | Code::Unknown | Code::DeadlineExceeded
                    ) =>
                {
                    self.leader = (self.leader + 1) % self.nodes.len();
                }
                Ok(Err(status)) => return Err(CallError::Status(status)),
                Err(_) => self.leader = (self.leader + 1) % self.nodes.len(),
            }
            if start.elapsed() >= budget {
                return Err(CallError::GaveUp);
            }
            let backoff = self.rng.random_range(20..150);
            tokio::time::sleep(Duration::from_millis(backoff)).await;
        }
    }
}

/// One session's lease as this client sees it, on its own clock.
struct Lease {
    clock: Arc<DriftClock>,
    ttl: Duration,
    /// Local send instant of the newest acknowledged renewal.
    acked_sent: Mutex<Instant>,
    lost: AtomicBool,
}

impl Lease {
    fn deadline(&self) -> Instant {
        *self.acked_sent.lock().expect("lease lock") + self.ttl - safety_margin(self.ttl)
    }

    /// Whether the client may still act as the holder of the session's locks.
    fn holding(&self) -> bool {
        !self.lost.load(Ordering::Relaxed) && self.clock.now() < self.deadline()
    }
}

async fn renew(mut conn: Conn, key: pb::Session, lease: Arc<Lease>, control: Arc<ClientControl>) {
    let mut retry_at: Option<Instant> = None;
    loop {
        if let Some(d) = control.paused_for() {
            tokio::time::sleep(d).await;
        }
        let next =
            retry_at.unwrap_or(*lease.acked_sent.lock().expect("lease lock") + lease.ttl / 3);
        let now = lease.clock.now();
        if next > now {
            tokio::time::sleep(lease.clock.true_duration(next - now)).await;
            continue;
        }
        if !lease.holding() {
            lease.lost.store(true, Ordering::Relaxed);
            return;
        }
        let sent = lease.clock.now();
        let left = lease
            .clock
            .true_duration(lease.deadline().saturating_duration_since(sent));
        let request = pb::KeepAliveRequest {
            sessions: vec![key],
        };
        let result = conn
            .call(
                request,
                RPC_TIMEOUT.min(left),
                left,
                |mut c, r| async move { c.keep_alive(r).await },
            )
            .await;
        match result {
            Ok(resp) => match resp.leases.iter().find(|l| l.id == key.id) {
                Some(l) if l.alive => {
                    let mut acked = lease.acked_sent.lock().expect("lease lock");
                    *acked = (*acked).max(sent);
                    retry_at = None;
                }
                _ => {
                    lease.lost.store(true, Ordering::Relaxed);
                    return;
                }
            },
            Err(CallError::Status(s)) if s.code() == Code::NotFound => {
                lease.lost.store(true, Ordering::Relaxed);
                return;
            }
            Err(_) => {
                retry_at =
                    Some(lease.clock.now() + (lease.ttl / 10).max(Duration::from_millis(100)))
            }
        }
    }
}

/// The client's whole life, as a turmoil client future.
pub async fn run(
    setup: ClientSetup,
    history: History,
    resource: Resource,
    control: Arc<ClientControl>,
) -> turmoil::Result {
    let clock = Arc::new(DriftClock::new(setup.drift_ppm, 0));
    let mut rng = StdRng::seed_from_u64(setup.seed);
    let mut conn = Conn::new(setup.nodes.clone(), rng.random());
    let mut generation = 0;
    // The lock still held when the client stopped (kept to check it survives a restart).
    let mut renewal: Option<tokio::task::JoinHandle<()>> = None;
    'sessions: while true_now() < setup.stop_at {
        if let Some(r) = renewal.take() {
            r.abort();
        }
        generation += 1;
        let actor = Actor {
            client: setup.id,
            generation,
        };
        let sent = clock.now();
        let created = conn
            .call(
                pb::CreateSessionRequest {
                    ttl_ms: setup.ttl.as_millis() as u64,
                },
                RPC_TIMEOUT,
                Duration::from_secs(5),
                |mut c, r| async move { c.create_session(r).await },
            )
            .await;
        let Ok(created) = created else {
            continue;
        };
        let key = created.session.expect("session in answer");
        let lease = Arc::new(Lease {
            clock: clock.clone(),
            ttl: Duration::from_millis(created.ttl_ms).min(setup.ttl),
            acked_sent: Mutex::new(sent),
            lost: AtomicBool::new(false),
        });
        renewal = Some(tokio::spawn(renew(
            Conn::new(setup.nodes.clone(), rng.random()),
            key,
            lease.clone(),
            control.clone(),
        )));
        let mut seq = 0u64;
        while true_now() < setup.stop_at {
            if !lease.holding() {
                history.event(Event::Lost {
                    actor,
                    session: key.id,
                    at: true_now(),
                });
                continue 'sessions;
            }
            let lock = setup.locks[rng.random_range(0..setup.locks.len())].clone();
            seq += 1;
            let acquire_seq = seq;
            let op = history.invoke(actor, key.id, &lock, OpKind::Acquire, true_now());
            let token = loop {
                if !lease.holding() {
                    // Indeterminate: the server may still grant it; the session will expire.
                    continue 'sessions;
                }
                let request = pb::AcquireRequest {
                    session: Some(key),
                    seq: acquire_seq,
                    name: lock.clone(),
                    wait_timeout_ms: WAIT_MS,
                };
                let attempt = Duration::from_millis(WAIT_MS) + RPC_TIMEOUT;
                match conn
                    .call(request, attempt, attempt, |mut c, r| async move {
                        c.acquire(r).await
                    })
                    .await
                {
                    Ok(resp) => match pb::AcquireResult::try_from(resp.result) {
                        Ok(pb::AcquireResult::Granted) => break Some(resp.token),
                        Ok(pb::AcquireResult::NotGranted) => break None,
                        _ => {}
                    },
                    Err(CallError::Status(s)) if s.code() == Code::NotFound => {
                        lease.lost.store(true, Ordering::Relaxed);
                    }
                    Err(CallError::Status(s)) => {
                        panic!("client {}: unexpected Acquire error {s:?}", setup.id)
                    }
                    Err(CallError::GaveUp) => {}
                }
            };
            let Some(token) = token else {
                history.ret(op, Ret::NotGranted, true_now());
                continue;
            };
            history.ret(op, Ret::Granted { token }, true_now());

            if control.crash.swap(false, Ordering::Relaxed) {
                // The client dies holding the lock: no release, no renewals.
                continue 'sessions;
            }
            if !hold_check(&history, actor, &lease, key.id, &lock, token) {
                continue 'sessions;
            }
            let Some(read) = resource.begin(actor, &lock, token) else {
                // A newer holder wrote already: we lost the lock, whatever our clock says.
                continue 'sessions;
            };
            let cut_ms = control.cut_ms.swap(0, Ordering::Relaxed);
            if cut_ms > 0 {
                // Cut off from the cluster mid-critical-section: keep working, checking the hold
                // often, and stop at once when the deadline has passed. (Should the harness not
                // cut, e.g. the safety phase ended, the section just ends normally.)
                control.cut_now_ms.store(cut_ms, Ordering::Relaxed);
                let until = true_now() + Duration::from_millis(cut_ms);
                while true_now() < until {
                    let step = rng.random_range(50..=100);
                    tokio::time::sleep(Duration::from_millis(step)).await;
                    if !hold_check(&history, actor, &lease, key.id, &lock, token) {
                        continue 'sessions;
                    }
                }
            }
            let pause_ms = control.pause_ms.swap(0, Ordering::Relaxed);
            if pause_ms > 0 {
                let until = true_now() + Duration::from_millis(pause_ms);
                control
                    .paused_until_ns
                    .store(until.as_nanos() as u64, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                // Resumed mid-write, without looking at the clock: only the fence can stop it.
                resource.commit(actor, &lock, token, read);
                continue 'sessions;
            }
            let work = rng.random_range(setup.work_ms.0..=setup.work_ms.1);
            tokio::time::sleep(Duration::from_millis(work)).await;
            if !hold_check(&history, actor, &lease, key.id, &lock, token) {
                continue 'sessions;
            }
            if !resource.commit(actor, &lock, token, read) {
                continue 'sessions;
            }
            if true_now() >= setup.stop_at {
                // Keep this lock: the final check looks for it after the cluster restarts.
                break;
            }
            seq += 1;
            let op = history.invoke(actor, key.id, &lock, OpKind::Release { token }, true_now());
            let release_seq = seq;
            let released = loop {
                if !lease.holding() {
                    continue 'sessions;
                }
                let request = pb::ReleaseRequest {
                    session: Some(key),
                    seq: release_seq,
                    name: lock.clone(),
                    token,
                };
                match conn
                    .call(
                        request,
                        RPC_TIMEOUT,
                        RPC_TIMEOUT * 3,
                        |mut c, r| async move { c.release(r).await },
                    )
                    .await
                {
                    Ok(resp) => break resp.released,
                    Err(CallError::Status(s)) if s.code() == Code::NotFound => {
                        lease.lost.store(true, Ordering::Relaxed);
                    }
                    Err(CallError::Status(s)) => {
                        panic!("client {}: unexpected Release error {s:?}", setup.id)
                    }
                    Err(CallError::GaveUp) => {}
                }
            };
            history.ret(
                op,
                if released {
                    Ret::Released
                } else {
                    Ret::NotHolder
                },
                true_now(),
            );
            let think = rng.random_range(0..=setup.work_ms.1);
            tokio::time::sleep(Duration::from_millis(think)).await;
        }
        break;
    }
    // Keep the session (and any lock still held) alive until the simulation ends.
    if let Some(r) = renewal.take() {
        let _ = r.await;
    }
    Ok(())
}

/// Records that the client, by its own clock, still holds `lock`; false if it does not.
fn hold_check(
    history: &History,
    actor: Actor,
    lease: &Lease,
    session: u64,
    lock: &str,
    token: u64,
) -> bool {
    let at = true_now();
    if lease.holding() {
        history.event(Event::HoldCheck {
            actor,
            session,
            lock: lock.to_owned(),
            token,
            at,
        });
        true
    } else {
        history.event(Event::Lost { actor, session, at });
        false
    }
}
