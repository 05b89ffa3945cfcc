//! The latchkey server: one member of a Raft group serving the lock API.
//!
//! [`run`] serves a node on a TCP listener until a shutdown signal; tests call it directly.
//! [`run_with`] is the one entry point beneath it, with the connections, the environment and
//! the log store supplied (the simulation's). Both take a [`ValidConfig`]: a configuration is
//! checked once, where it is built. `run_with` returns an error when a group's Raft core stops
//! on its own (a storage failure), so the process exits rather than lingers. This file wires
//! the parts together and names the public paths other crates use; it holds no policy.
//!
//! The parts, one folder each, from the top down. Each uses only the parts below it, so a
//! change to an upper one cannot reach a lower one, and none imports another in a circle:
//! - `api/`: the client APIs, translators only: `service` (the `Locks` gRPC service) and
//!   [`http`] (the HTTP/JSON API, [`http::ROUTES`], the page in `ui/`; [`cross_site`], its
//!   guard against cross-site requests), both running acquire, release, close, keepalive and
//!   their batch through `calls`. Protobuf and JSON types stop here.
//! - `node/`: the domain layer. `Node`, one member of one Raft group (start-up, the data dir,
//!   the lease task and the leader's other duties); `ops`, its operations in domain types,
//!   with `Node::authorize`, the one access check of both APIs; `membership`, membership
//!   changes and the node's status; [`groups`], with `--groups G` one `Node` per group and
//!   which group a request goes to; [`backup`], the backup file and the restore.
//! - `config/`: [`ServerConfig`] and [`ValidConfig`], [`NodeEnv`] (the clock, entropy, probe
//!   and peer connector a test or the simulation replaces), [`reload`] (the TLS files and the
//!   access-control list, reloaded on SIGHUP and on a change).
//! - `access/`: [`acl`] (client identities, permissions on lock-name prefixes, quotas) and
//!   [`tls`] (the certificate and client CA, the accept loop both APIs share, the members' mTLS
//!   dialer [`tls::TlsPeerConnector`]).
//! - `error`: the one place server errors become gRPC statuses and HTTP API JSON errors.
//! - `cluster/`: members talking to each other: `peer` (the `RaftPeer` service, its admission
//!   of every message, the network client openraft uses), [`peer_auth`] (cluster id, member
//!   certificate, MAC), [`member_addr`] (`CLIENT` or `CLIENT/PEER`), `leader_contact`.
//! - `lease/`: [`leases`] (session deadlines on the leader's monotonic clock) and `waiters`
//!   (long-polling acquires, woken by the apply observer).
//! - `observe/`: `metrics` (Prometheus, `/healthz`, `/readyz`), [`refusals`] (refused clients
//!   and peer RPCs, counted and logged), `watch` (the member's recent lock changes and its watch
//!   streams).
//! - The seams, which depend on nothing of the crate: [`clock`] (time and entropy), [`probe`]
//!   (events and planted bugs for the simulation), `certificate` (a certificate's names).

mod access;
mod api;
mod certificate;
pub mod clock;
mod cluster;
mod config;
mod error;
mod lease;
mod node;
mod observe;
pub mod probe;

// The public paths other crates and the tests use, kept as they were before the folders: each
// module lives in the folder of its part, and is named here once.
pub use access::{acl, tls};
pub use api::http;
pub use api::http::cross_site;
pub use cluster::{member_addr, peer_auth};
pub use config::reload;
pub use config::{ConfigError, NodeEnv, ServerConfig, ValidConfig, GROUP_DIR_PREFIX};
pub use lease::leases;
pub use node::{backup, groups};
pub use observe::refusals;

use api::service;
use cluster::peer;
use observe::metrics;

use std::future::Future;
use std::sync::Arc;

use futures::Stream;
use latchkey_core::limits;
use latchkey_proto::v1::locks_server::LocksServer;
use latchkey_proto::v1::raft_peer_server::RaftPeerServer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tonic::transport::server::Connected;

pub use clock::{Entropy, NodeClock, OsEntropy, SharedClock, SharedEntropy, SystemNodeClock};
pub use node::NodeLogStore;
pub use node::StartError;
pub use peer::{snapshot_chunks, PeerConnector, SharedPeerConnector, TcpPeerConnector};

/// The peer protocol's messages as members encode them, for tests that speak it as an attacker
/// would (`crates/cli/tests/peer_attacks.rs`, issue #31's attack matrix). Not an API: a member
/// only ever receives these from the network, through `RaftPeer`'s admission checks.
#[doc(hidden)]
pub mod peer_wire {
    pub use crate::cluster::peer::{encode, snapshot_chunks, AppendFrame, Ballot};
}
pub use probe::{NoProbe, Plant, Probe, ProbeEvent, SharedProbe};

/// Serve one node on `listener` until `shutdown` completes, then stop every task and return.
/// The log is the segment log store in `config.data_dir`. With `config.peer_listen`, the peer service
/// is served on a listener of its own bound here (with the same TLS), and not on `listener`.
pub async fn run(
    listener: TcpListener,
    config: ValidConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let peer_listen = config.peer_listen;
    let (peer_listener, config) = match peer_listen {
        None => (None, config),
        Some(addr) => {
            let l = TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen for members on {addr}: {e}"))?;
            let bound = l.local_addr()?;
            (Some(l), config.peer_listening_on(bound))
        }
    };
    let log_stores = node::Node::open_log_stores(&config)?;
    // Made here, before the node: the TLS accept loops report refused handshakes to its
    // metrics.
    let member = node::MemberShared::new();
    let refusals = member.metrics.refusals.clone();
    // The files an operator may change without a restart, polled until the node stops.
    let stop_watching = tokio_util::sync::CancellationToken::new();
    let watch = tokio::spawn(reload::Reloadable::of(&config).watch(stop_watching.clone()));
    // Connections come through `tls::accept_loop`, which tells a client speaking the wrong
    // protocol (TLS to a plaintext port or the reverse) so and does the TLS handshake.
    fn channel<T>() -> (tokio::sync::mpsc::Sender<T>, tokio::sync::mpsc::Receiver<T>) {
        tokio::sync::mpsc::channel(limits::CONN_HANDSHAKES_IN_FLIGHT_MAX)
    }
    use tokio_stream::wrappers::ReceiverStream;
    let served = match config.tls.clone() {
        None => {
            let accept = |listener| {
                let (tx, rx) = channel();
                tokio::spawn(tls::accept_loop(listener, tx, tls::plaintext_handshake));
                ReceiverStream::new(rx)
            };
            let incoming = accept(listener);
            let peer_incoming = peer_listener.map(accept);
            serve_member(
                incoming,
                peer_incoming,
                config,
                NodeEnv::real(),
                log_stores,
                member,
                shutdown,
            )
            .await
        }
        Some(server_tls) => {
            let accept = |listener| {
                let (tx, rx) = channel();
                let (handshake_tls, refusals) = (server_tls.clone(), refusals.clone());
                tokio::spawn(tls::accept_loop(listener, tx, move |stream, from| {
                    tls::tls_handshake(
                        handshake_tls.clone(),
                        tls::Served::Grpc,
                        refusals.clone(),
                        stream,
                        from,
                    )
                }));
                ReceiverStream::new(rx)
            };
            let incoming = accept(listener);
            let peer_incoming = peer_listener.map(accept);
            let env = NodeEnv {
                connector: Arc::new(tls::TlsPeerConnector(server_tls)),
                ..NodeEnv::real()
            };
            serve_member(
                incoming,
                peer_incoming,
                config,
                env,
                log_stores,
                member,
                shutdown,
            )
            .await
        }
    };
    stop_watching.cancel();
    let _ = watch.await;
    served
}

/// [`run`] with everything from outside supplied: `incoming` yields accepted client and peer
/// connections (any transport tonic can serve), or client connections only when
/// `peer_incoming` yields the peers' (`--peer-listen`); `env` gives the clock, entropy, probe
/// and the connector used to reach peers, and `log_stores` are the logs, one per Raft group in
/// group order (the segment log store, or a simulation's that can lose unsynced writes).
pub async fn run_with<I, IO, IE, LS>(
    incoming: I,
    peer_incoming: Option<I>,
    config: ValidConfig,
    env: NodeEnv,
    log_stores: Vec<LS>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()>
where
    I: Stream<Item = Result<IO, IE>>,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>>,
    LS: NodeLogStore,
{
    let member = node::MemberShared::new();
    serve_member(
        incoming,
        peer_incoming,
        config,
        env,
        log_stores,
        member,
        shutdown,
    )
    .await
}

/// [`run_with`] with the member's shared parts made by the caller ([`run`]'s accept loops
/// report to its metrics).
async fn serve_member<I, IO, IE, LS>(
    incoming: I,
    peer_incoming: Option<I>,
    config: ValidConfig,
    env: NodeEnv,
    log_stores: Vec<LS>,
    member: node::MemberShared,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()>
where
    I: Stream<Item = Result<IO, IE>>,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>>,
    LS: NodeLogStore,
{
    let config = config.into_inner();
    // Bind everything that can fail before the node starts, so a refused start leaves no
    // task behind.
    let metrics_listener = match config.metrics_listen {
        None => None,
        Some(addr) => {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("cannot serve metrics on {addr}: {e}"))?;
            tracing::info!(%addr, "serving metrics at /metrics");
            Some(listener)
        }
    };
    let http_listener = match config.http_listen {
        None => None,
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("cannot serve the HTTP API on {addr}: {e}"))?,
        ),
    };
    if log_stores.len() != config.groups as usize {
        return Err(anyhow::anyhow!(
            "{} log stores for {} groups",
            log_stores.len(),
            config.groups
        ));
    }
    // The groups' networks dial each member once, on one shared channel.
    let env = if config.groups > 1 {
        NodeEnv {
            connector: Arc::new(peer::SharedChannels::new(env.connector.clone())),
            ..env
        }
    } else {
        env
    };
    let mut nodes = Vec::with_capacity(log_stores.len());
    let mut renewals = Vec::with_capacity(log_stores.len());
    for (group, log_store) in (0u32..).zip(log_stores) {
        match node::Node::start(
            config.for_group(group),
            group,
            env.clone(),
            log_store,
            &member,
        )
        .await
        {
            Ok((node, renew)) => {
                nodes.push(node);
                renewals.push(renew);
            }
            Err(e) => {
                // The groups started before this one stop with the refused start.
                for node in &nodes {
                    let _ = node.raft.shutdown().await;
                }
                return Err(e.into());
            }
        }
    }
    let groups = groups::Groups::new(nodes);
    let node = groups.first().clone();
    tracing::info!(
        id = node.id,
        cluster = %node.cluster,
        groups = groups.count(),
        addr = %node.config.listen,
        peer_addr = %node.config.peer_listen.unwrap_or(node.config.listen),
        data_dir = %node.config.data_dir.display(),
        "latchkey node serving"
    );
    let mut tasks = Vec::new();
    for (n, renewals) in groups.all().iter().zip(renewals) {
        tasks.push(tokio::spawn(n.clone().lease_duties(renewals)));
        tasks.push(tokio::spawn(n.clone().follow_membership()));
        tasks.push(tokio::spawn(n.clone().found_later()));
        tasks.push(tokio::spawn(n.clone().rebalance_leadership()));
        // Only for a log shared by groups (the simulation's store has none: its schedule stays
        // as it was).
        if n.shares_log() {
            tasks.push(tokio::spawn(n.clone().compact_log()));
        }
    }
    let (health, health_service) = tonic_health::server::health_reporter();
    let health_task = tokio::spawn(report_health(groups.clone(), health));
    let metrics = metrics_listener.map(|listener| {
        let stop = node.shutdown.clone();
        let status_of = groups.clone();
        tokio::spawn(metrics::serve(
            listener,
            node.metrics.clone(),
            move || {
                // Group 0's role, term and indexes; sessions, locks and queues of every group.
                let mut gauges = status_of.first().status().gauges();
                let mut queues = Vec::new();
                for node in status_of.all() {
                    queues.extend(
                        node.state
                            .read(|t| t.longest_queues(limits::METRICS_LONGEST_QUEUES)),
                    );
                }
                queues.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                queues.truncate(limits::METRICS_LONGEST_QUEUES);
                gauges.longest_queues = queues;
                // Ready once every group this member belongs to is (with replica subsets,
                // group 0 may not be one of them).
                gauges.ready = status_of.readiness();
                if status_of.count() > 1 {
                    let (mut sessions, mut locks) = (0, 0);
                    gauges.groups = status_of
                        .all()
                        .iter()
                        .map(|n| {
                            let s = n.status();
                            sessions += s.sessions;
                            locks += s.locks;
                            (
                                n.shape.group,
                                s.last_log_index,
                                s.role == node::membership::Role::Leader,
                            )
                        })
                        .collect();
                    gauges.sessions = sessions;
                    gauges.locks = locks;
                }
                gauges
            },
            async move { stop.cancelled().await },
        ))
    });

    let http = http_listener.map(|listener| {
        let stop = node.shutdown.clone();
        tokio::spawn(http::serve(
            listener,
            groups.clone(),
            node.config.tls.clone(),
            async move { stop.cancelled().await },
        ))
    });

    let locks = LocksServer::new(service::LocksService::new(groups.clone()))
        .max_decoding_message_size(limits::CLIENT_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(limits::CLIENT_MESSAGE_BYTES_MAX);
    let peer = RaftPeerServer::new(peer::PeerRouter::new(
        groups
            .all()
            .iter()
            .map(|n| {
                peer::PeerService::new(
                    n.raft.clone(),
                    n.state.clone(),
                    n.peer_auth.clone(),
                    n.config.table_bytes_max,
                    n.shutdown.clone(),
                    n.succession.clone(),
                    n.leader_contact.clone(),
                )
            })
            .collect(),
        groups.first().metrics.peer_refusals.clone(),
    ))
    .max_decoding_message_size(limits::PEER_MESSAGE_BYTES_MAX)
    .max_encoding_message_size(limits::PEER_MESSAGE_BYTES_MAX);
    // A member whose Raft core stopped (a storage failure such as ENOSPC, EIO or EFBIG stops it
    // for good) can only refuse every call. Rather than linger as a process that answers
    // "shutting down", which no supervisor can tell from a working one, it stops serving and
    // `run_with` returns an error, so the process exits and is restarted; what it acknowledged
    // is on disk (issue #14). One group's core stopping stops the member.
    let core_stopped: Arc<std::sync::Mutex<Option<u32>>> = Default::default();
    let cores_running = futures::future::select_all(groups.all().iter().map(|n| {
        let mut core_metrics = n.raft.server_metrics();
        let group = n.shape.group;
        Box::pin(async move {
            use openraft::async_runtime::WatchReceiver;
            while core_metrics.changed().await.is_ok() {}
            group
        })
    }));
    let stop = node.shutdown.clone();
    let stop_serving = {
        let core_stopped = core_stopped.clone();
        async move {
            tokio::select! {
                () = shutdown => {}
                (group, _, _) = cores_running => {
                    *core_stopped.lock().expect("core_stopped lock") = Some(group);
                }
                // A server that ended on its own (its listener failed) ends the other too.
                () = stop.cancelled() => {}
            }
            // End long-polls first, so that graceful shutdown does not wait for them.
            stop.cancel();
        }
    };
    let builder = || {
        tonic::transport::Server::builder()
            .concurrency_limit_per_connection(limits::CLIENT_CONCURRENT_REQUESTS_MAX)
            // A half-open connection (its peer's host died) is found and closed, and with it
            // the streams it held (`limits::PEER_APPEND_STREAMS_MAX`).
            .http2_keepalive_interval(Some(std::time::Duration::from_millis(
                limits::PEER_KEEPALIVE_INTERVAL_MS,
            )))
            .http2_keepalive_timeout(Some(std::time::Duration::from_millis(
                limits::PEER_KEEPALIVE_TIMEOUT_MS,
            )))
            .http2_max_pending_accept_reset_streams(Some(limits::CLIENT_PENDING_RESET_STREAMS_MAX))
    };
    // A server ending on its own (its listener failed) ends the node's serving
    // (`stop_serving` above), and so the other server.
    let ended = |served: Result<(), tonic::transport::Error>| {
        node.shutdown.cancel();
        served
    };
    let (shared_peer, own_peer) = match peer_incoming {
        None => (Some(peer), None),
        Some(peer_incoming) => (None, Some((peer, peer_incoming))),
    };
    let serve_clients = async {
        ended(
            builder()
                .add_service(locks)
                .add_optional_service(shared_peer)
                .add_service(health_service)
                .serve_with_incoming_shutdown(incoming, node.shutdown.clone().cancelled_owned())
                .await,
        )
    };
    let serve_peers = async {
        match own_peer {
            // The peer service is served with the clients'.
            None => Ok(()),
            Some((peer, peer_incoming)) => ended(
                builder()
                    .add_service(peer)
                    .serve_with_incoming_shutdown(
                        peer_incoming,
                        node.shutdown.clone().cancelled_owned(),
                    )
                    .await,
            ),
        }
    };
    let ((), served, peers_served) = tokio::join!(stop_serving, serve_clients, serve_peers);
    let served = served.and(peers_served);

    node.shutdown.cancel();
    for task in tasks {
        let _ = task.await;
    }
    let _ = health_task.await;
    if let Some(m) = metrics {
        let _ = m.await;
    }
    if let Some(h) = http {
        if let Ok(Err(e)) = h.await {
            tracing::warn!("HTTP API: {e}");
        }
    }
    let stopped = *core_stopped.lock().expect("core_stopped lock");
    if let Some(group) = stopped {
        use openraft::async_runtime::WatchReceiver;
        let why = match &groups.all()[group as usize]
            .raft
            .metrics()
            .borrow_watched()
            .running_state
        {
            Err(fatal) => fatal.to_string(),
            Ok(()) => "no error reported".to_owned(),
        };
        let which = if groups.count() > 1 {
            format!(" of group {group}")
        } else {
            String::new()
        };
        tracing::error!(
            "the Raft core{which} stopped ({why}); exiting so that this member can be restarted"
        );
        for n in groups.all() {
            let _ = n.raft.shutdown().await;
        }
        return Err(anyhow::anyhow!(
            "the Raft core{which} stopped: {why} (acknowledged entries are on disk; restart the \
             member once the cause, e.g. a full disk, is fixed)"
        ));
    }
    for n in groups.all() {
        if let Err(e) = n.raft.shutdown().await {
            tracing::warn!(group = n.shape.group, "raft shutdown: {e}");
        }
    }
    tracing::info!("latchkey node stopped");
    served.map_err(Into::into)
}

/// Keeps the standard gRPC health service (`grpc.health.v1.Health`) in step with
/// [`ops::NodeStatus::readiness`], for the whole server ("") and for the `Locks` service: SERVING
/// when this member can serve, NOT_SERVING otherwise and once it shuts down. Checked every
/// `limits::HEALTH_REPORT_INTERVAL_MS` (readiness also changes with the apply lag, which no
/// event announces cheaply).
async fn report_health(groups: Arc<groups::Groups>, health: tonic_health::server::HealthReporter) {
    use tonic_health::ServingStatus;
    let locks = <LocksServer<service::LocksService> as tonic::server::NamedService>::NAME;
    let node = groups.first().clone();
    let mut last = None;
    loop {
        // Serving once every group this member belongs to is ready.
        let ready = groups.readiness().is_ok();
        let status = if ready {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        if last != Some(status) {
            health.set_service_status("", status).await;
            health.set_service_status(locks, status).await;
            last = Some(status);
        }
        tokio::select! {
            () = node.shutdown.cancelled() => break,
            () = tokio::time::sleep(std::time::Duration::from_millis(
                limits::HEALTH_REPORT_INTERVAL_MS,
            )) => {}
        }
    }
    health
        .set_service_status("", ServingStatus::NotServing)
        .await;
    health
        .set_service_status(locks, ServingStatus::NotServing)
        .await;
}
