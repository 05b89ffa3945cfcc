//! Prometheus metrics of one node, served as text on `GET /metrics` (and `GET /healthz`: the
//! process is up; `GET /readyz`: it can serve) when
//! `ServerConfig::metrics_listen` is set.
//!
//! Counters count applied entries on this member (every member applies every entry, so a
//! follower's counters track the leader's); gauges are read from the node when scraped.
//! Latency histograms: commit, fsync (through the log store's commit observer), keepalive and
//! acquire wait. The queue lengths of the `METRICS_LONGEST_QUEUES` longest queues come from a
//! scan of the table at each scrape. `/readyz` is `NodeStatus::readiness` (a known leader and
//! an apply lag within `READY_APPLY_LAG_MAX`), over the groups the member belongs to; `lib.rs`'s
//! `report_health` keeps the gRPC health service (`tonic-health`) in step with it.

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::serve::ListenerExt;
use axum::Router;
use latchkey_core::{Applied, Op, Outcome};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::observe::refusals::{PeerReason, Refusals};

type Count = Counter<u64, AtomicU64>;
/// The `method` label of [`Metrics::requests`]: the gRPC method's name in snake case (an HTTP
/// API call counts under its gRPC counterpart's).
type MethodLabel = [(&'static str, &'static str); 1];
/// The `lock` label of [`Metrics::queue_length`].
type LockLabel = [(&'static str, String); 1];
/// The `group` label of the per-group gauges (issue #16).
type GroupLabel = [(&'static str, String); 1];

/// Buckets of the latency histograms: 0.25 ms to about 4 s, doubling (a commit, an fsync or a
/// keepalive on a healthy cluster takes well under the top bucket; a stall shows there).
fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.000_25, 2.0, 15)
}

/// Buckets of acquire waits: 1 ms to about 4.5 minutes, doubling (a wait ends within
/// `WAIT_TIMEOUT_MS_MAX`).
fn wait_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.001, 2.0, 19)
}

pub struct Metrics {
    registry: Registry,
    pub grants: Count,
    pub handoffs: Count,
    pub releases: Count,
    pub sessions_created: Count,
    pub sessions_closed: Count,
    pub sessions_expired: Count,
    pub rejections: Count,
    pub keepalive_sessions: Count,
    pub logged_renewals: Count,
    pub snapshots_installed: Count,
    pub waits_expired: Count,
    /// Log entries with a command applied, and the operations they carried (a batch's each
    /// count, issue #35): operations per entry is how much the leader's coalescing gathers.
    pub entries_applied: Count,
    pub operations_applied: Count,
    /// Leader transfers this member started, as a group's leader handing it to its preferred
    /// member (issue #16's rebalance).
    pub leader_transfers: Count,
    /// Refused clients by reason, and the rate-limited log of them (`refusals.rs`); shared
    /// with the TLS accept loops, which refuse below the APIs.
    pub refusals: Arc<Refusals>,
    /// Refused peer RPCs by reason, and the rate-limited log of them (the peer service's
    /// admission, `cluster/peer/admission.rs`).
    pub peer_refusals: Arc<Refusals<PeerReason>>,
    /// Client calls received, gRPC and HTTP API alike, by method (`latchkey bench` divides them
    /// by operations).
    requests: Family<MethodLabel, Count>,
    /// Operations carried by `Batch` calls, by the method each would be alone (issue #35):
    /// a `Batch` counts once in `requests`, and its operations here.
    batched: Family<MethodLabel, Count>,
    /// Proposal to applied outcome, on the leader that proposed (a majority's fsync included).
    pub commit_seconds: Histogram,
    /// One group commit of the log store: its write transaction and fsync.
    pub fsync_seconds: Histogram,
    /// A keepalive's arrival to its answer on the leader (read index, logged renewal if any).
    pub keepalive_seconds: Histogram,
    /// From the arrival of the acquire call that was granted to its grant, on the node that
    /// answered it: the wait in the queue, up to one long-poll (`ACQUIRE_POLL_MS_MAX`); a
    /// longer wait counts from its last re-sent call.
    pub acquire_wait_seconds: Histogram,
    /// The queue lengths of the longest queues, refreshed at each scrape.
    queue_length: Family<LockLabel, Gauge>,
    /// Each Raft group's last log index and leadership on this member (issue #16); the
    /// unlabelled `latchkey_raft_*` gauges are group 0's.
    group_last_log_index: Family<GroupLabel, Gauge>,
    group_is_leader: Family<GroupLabel, Gauge>,
    sessions: Gauge,
    locks: Gauge,
    term: Gauge,
    is_leader: Gauge,
    last_log_index: Gauge,
    applied_index: Gauge,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut m = Metrics {
            registry: Registry::default(),
            grants: Count::default(),
            handoffs: Count::default(),
            releases: Count::default(),
            sessions_created: Count::default(),
            sessions_closed: Count::default(),
            sessions_expired: Count::default(),
            rejections: Count::default(),
            keepalive_sessions: Count::default(),
            logged_renewals: Count::default(),
            snapshots_installed: Count::default(),
            waits_expired: Count::default(),
            entries_applied: Count::default(),
            operations_applied: Count::default(),
            leader_transfers: Count::default(),
            refusals: Arc::new(Refusals::new()),
            peer_refusals: Arc::new(Refusals::new()),
            requests: Family::default(),
            batched: Family::default(),
            commit_seconds: Histogram::new(latency_buckets()),
            fsync_seconds: Histogram::new(latency_buckets()),
            keepalive_seconds: Histogram::new(latency_buckets()),
            acquire_wait_seconds: Histogram::new(wait_buckets()),
            queue_length: Family::default(),
            group_last_log_index: Family::default(),
            group_is_leader: Family::default(),
            sessions: Gauge::default(),
            locks: Gauge::default(),
            term: Gauge::default(),
            is_leader: Gauge::default(),
            last_log_index: Gauge::default(),
            applied_index: Gauge::default(),
        };
        let r = &mut m.registry;
        r.register(
            "latchkey_commit_seconds",
            "Time from proposing a command to its applied outcome, on the leader",
            m.commit_seconds.clone(),
        );
        r.register(
            "latchkey_fsync_seconds",
            "Time of one log-store group commit (write transaction and fsync)",
            m.fsync_seconds.clone(),
        );
        r.register(
            "latchkey_keepalive_seconds",
            "Time from a keepalive's arrival to its answer, on the leader",
            m.keepalive_seconds.clone(),
        );
        r.register(
            "latchkey_acquire_wait_seconds",
            "Time from the arrival of a granted acquire call to its grant (the queue wait within one long-poll)",
            m.acquire_wait_seconds.clone(),
        );
        r.register(
            "latchkey_queue_length",
            "Waiters queued on the locks with the longest queues (at most METRICS_LONGEST_QUEUES)",
            m.queue_length.clone(),
        );
        r.register(
            "latchkey_grants",
            "Grants applied (direct and handed over)",
            m.grants.clone(),
        );
        r.register(
            "latchkey_handoffs",
            "Grants to queued waiters on release, close or expiry",
            m.handoffs.clone(),
        );
        r.register("latchkey_releases", "Releases applied", m.releases.clone());
        r.register(
            "latchkey_entries_applied",
            "Log entries with a command applied",
            m.entries_applied.clone(),
        );
        r.register(
            "latchkey_operations_applied",
            "Operations applied (each of a batch entry's counts)",
            m.operations_applied.clone(),
        );
        r.register(
            "latchkey_waits_expired",
            "Waits ended by the server because their wait timeout passed",
            m.waits_expired.clone(),
        );
        r.register(
            "latchkey_snapshots_installed",
            "Snapshots installed from the leader (the table replaced without entries)",
            m.snapshots_installed.clone(),
        );
        r.register(
            "latchkey_sessions_created",
            "Sessions created",
            m.sessions_created.clone(),
        );
        r.register(
            "latchkey_sessions_closed",
            "Sessions closed by their client",
            m.sessions_closed.clone(),
        );
        r.register(
            "latchkey_sessions_expired",
            "Sessions expired by the leader",
            m.sessions_expired.clone(),
        );
        r.register(
            "latchkey_rejections",
            "Commands rejected by the lock table",
            m.rejections.clone(),
        );
        r.register(
            "latchkey_keepalive_sessions",
            "Sessions renewed by keepalives on this node",
            m.keepalive_sessions.clone(),
        );
        r.register(
            "latchkey_leader_transfers",
            "Leader transfers this node started, handing a group back to its preferred member",
            m.leader_transfers.clone(),
        );
        r.register(
            "latchkey_logged_renewals",
            "Marked sessions renewed through the log",
            m.logged_renewals.clone(),
        );
        r.register(
            "latchkey_auth_refused",
            "Clients refused, by reason: a TLS handshake without an accepted certificate, \
             credentials or a call the access-control list refuses, a quota",
            m.refusals.counts(),
        );
        r.register(
            "latchkey_peer_refused",
            "Peer (Raft) RPCs refused, by reason: the sender's credentials (certificate, \
             cluster, MAC, membership) or what its message says",
            m.peer_refusals.counts(),
        );
        r.register(
            "latchkey_requests",
            "Client gRPC calls received by this node, by method",
            m.requests.clone(),
        );
        r.register(
            "latchkey_batched_operations",
            "Operations carried by Batch calls received by this node, by the method each \
             would be called alone",
            m.batched.clone(),
        );
        r.register(
            "latchkey_group_last_log_index",
            "Last log index of each Raft group on this member",
            m.group_last_log_index.clone(),
        );
        r.register(
            "latchkey_group_is_leader",
            "1 for each Raft group this member leads",
            m.group_is_leader.clone(),
        );
        r.register("latchkey_sessions", "Live sessions", m.sessions.clone());
        r.register("latchkey_locks", "Held locks", m.locks.clone());
        r.register("latchkey_raft_term", "Current Raft term", m.term.clone());
        r.register(
            "latchkey_raft_is_leader",
            "1 when this node is the leader",
            m.is_leader.clone(),
        );
        r.register(
            "latchkey_raft_last_log_index",
            "Last log index",
            m.last_log_index.clone(),
        );
        r.register(
            "latchkey_raft_applied_index",
            "Last applied log index",
            m.applied_index.clone(),
        );
        m
    }

    /// Count one client gRPC call of `method`.
    pub fn request(&self, method: &'static str) {
        self.requests.get_or_create(&[("method", method)]).inc();
    }

    /// Count one operation of a `Batch` call, under the method it would be alone.
    pub fn batched(&self, method: &'static str) {
        self.batched.get_or_create(&[("method", method)]).inc();
    }

    /// Count one applied entry with a command, and its operations.
    pub fn entry_applied(&self, cmd: &Op) {
        self.entries_applied.inc();
        let ops = match cmd {
            Op::Batch(ops) => ops.len(),
            _ => 1,
        };
        self.operations_applied.inc_by(ops as u64);
    }

    /// Count one applied operation (an entry's, or one of a batch's).
    pub fn applied(&self, cmd: &Op, applied: &Applied) {
        match (&cmd, &applied.outcome) {
            // A reader, a permit or a campaign is a grant too (issue #32).
            (
                Op::Acquire { .. } | Op::AcquireWith { .. } | Op::Campaign { .. },
                Outcome::Granted { .. },
            ) => {
                self.grants.inc();
            }
            (_, Outcome::Released) => {
                self.releases.inc();
            }
            (_, Outcome::SessionCreated { .. }) => {
                self.sessions_created.inc();
            }
            (_, Outcome::SessionClosed) => {
                self.sessions_closed.inc();
            }
            (_, Outcome::SessionsExpired { ids }) => {
                self.sessions_expired.inc_by(ids.len() as u64);
            }
            (_, Outcome::Rejected(_)) => {
                self.rejections.inc();
            }
            _ => {}
        }
        self.waits_expired.inc_by(applied.ended_waits.len() as u64);
        let handed = applied.handoffs.len() as u64;
        self.grants.inc_by(handed);
        self.handoffs.inc_by(handed);
    }
}

/// The node's state the gauges show, read at each scrape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gauges {
    pub sessions: u64,
    pub locks: u64,
    pub term: u64,
    pub is_leader: bool,
    pub last_log_index: u64,
    pub applied_index: u64,
    /// `Err(why)` when this member should not get traffic (see [`NodeStatus::readiness`]).
    pub ready: Result<(), String>,
    /// The locks with the longest queues and their lengths, longest first.
    pub longest_queues: Vec<(String, usize)>,
    /// Each Raft group's (group, last log index, led here), in a cluster of several; empty
    /// otherwise.
    pub groups: Vec<(u32, u64, bool)>,
}

/// What a scrape reads: the counters, and the gauges' values from the node.
struct Scraped {
    metrics: Arc<Metrics>,
    gauges: Box<dyn Fn() -> Gauges + Send + Sync>,
}

async fn scrape(State(scraped): State<Arc<Scraped>>) -> impl IntoResponse {
    let g = (scraped.gauges)();
    let m = &scraped.metrics;
    m.sessions.set(g.sessions as i64);
    m.locks.set(g.locks as i64);
    m.term.set(g.term as i64);
    m.is_leader.set(i64::from(g.is_leader));
    m.last_log_index.set(g.last_log_index as i64);
    m.applied_index.set(g.applied_index as i64);
    for (group, last, leads) in &g.groups {
        let label = [("group", group.to_string())];
        m.group_last_log_index
            .get_or_create(&label)
            .set(*last as i64);
        m.group_is_leader
            .get_or_create(&label)
            .set(i64::from(*leads));
    }
    m.queue_length.clear();
    for (lock, len) in g.longest_queues {
        m.queue_length
            .get_or_create(&[("lock", lock)])
            .set(len as i64);
    }
    let mut body = String::new();
    match encode(&mut body, &m.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// `/readyz`: 200 when this member knows a leader and has applied close to the commit index,
/// 503 with the reason otherwise (for load balancers and Kubernetes readiness probes).
async fn ready(State(scraped): State<Arc<Scraped>>) -> impl IntoResponse {
    match (scraped.gauges)().ready {
        Ok(()) => (StatusCode::OK, "ready\n".to_owned()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

/// Serve `/metrics`, `/healthz` and `/readyz` until `shutdown`; `gauges` reads the node's state at each
/// scrape.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    gauges: impl Fn() -> Gauges + Send + Sync + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let scraped = Arc::new(Scraped {
        metrics,
        gauges: Box::new(gauges),
    });
    let app = Router::new()
        .route("/metrics", get(scrape))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(scraped);
    // TCP_NODELAY as on the gRPC sockets: a scrape's response must not wait for a delayed ACK.
    let listener = listener.tap_io(|stream| {
        if let Err(e) = stream.set_nodelay(true) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY on a metrics connection");
        }
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_core::{Command, LockTable, Mode, SessionKey};

    /// Regression (issue #32): a reader's or a permit's grant at once (an `AcquireWith`) was
    /// not counted in `latchkey_grants`, which matched `Acquire` alone.
    #[test]
    fn every_mode_of_grant_is_counted() {
        let metrics = Metrics::new();
        let mut table = LockTable::new();
        let mut apply = |index: u64, op: Op| {
            let cmd = Command { now_ms: 0, op };
            let applied = table.apply(index, &cmd);
            metrics.applied(&cmd.op, &applied);
            applied.outcome
        };
        let Outcome::SessionCreated { id, .. } = apply(
            1,
            Op::CreateSession {
                ttl_ms: 10_000,
                secret: 7,
            },
        ) else {
            panic!("the session is created");
        };
        let session = SessionKey { id, secret: 7 };
        let modes = [Mode::Exclusive, Mode::Shared, Mode::Permits(2)];
        for (i, mode) in modes.into_iter().enumerate() {
            let outcome = apply(
                2 + i as u64,
                Op::AcquireWith {
                    session,
                    seq: 1 + i as u64,
                    name: format!("lock-{i}"),
                    wait_ms: 0,
                    mode,
                },
            );
            assert!(
                matches!(outcome, Outcome::Granted { .. }),
                "{mode:?}: {outcome:?}"
            );
        }
        assert_eq!(metrics.grants.get(), 3);
    }
}
