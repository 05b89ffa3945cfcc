//! The latchkey server: one member of a Raft group serving the lock API.
//!
//! Layout:
//! - [`run`] serves a node on a TCP listener until a shutdown signal; tests call it directly.
//!   [`run_with`] is the one entry point beneath it, with the connections, the environment and
//!   the log store supplied (the simulation's). Both take a [`ValidConfig`]: a configuration is
//!   checked once, where it is built. `run_with` returns an error when a group's Raft core
//!   stops on its own (a storage failure), so the process exits rather than lingers.
//! - `groups`: with `--groups G` a member runs one `Node` per Raft group, sharing one
//!   `MemberShared` (metrics, the shutdown token); [`groups::Groups`] sends each request to
//!   its lock's or session's group, and every error of a group carries `latchkey-group`.
//! - `node`: storage, the openraft node, leases and the leader's duties (restart leases on
//!   election, propose expiries).
//! - `ops`: the node's operations in domain types (propose, linearizable read, acquire,
//!   keepalive, status); the lease task and the service call them.
//! - `service`: the client `Locks` gRPC service, protobuf <-> `ops`; `peer`: the `RaftPeer`
//!   service and the network client openraft uses. Separate services, separate message limits.
//!   Protobuf types stop at these two.
//! - `leases`: session deadlines on the leader's monotonic clock.
//! - `waiters`: long-polling Acquire calls, woken by the apply observer.
//! - `leader_contact`: when this member last heard from its group's leader, for `watch`.
//! - [`http`]: the HTTP/JSON API (`--http-listen`), a second translator over `ops` beside
//!   `service`, with the same access check; [`http::ROUTES`] is its list of routes.
//! - [`cross_site`]: the HTTP API's guard against cross-site requests, a layer on its whole
//!   router: a write must be JSON and come from no web page, the node's own or a listed origin
//!   (`--http-allow-origin`).
//! - `acl`: client identities (bearer tokens, client certificates), their permissions on
//!   lock-name prefixes and their quotas (`--acl`), reloaded on SIGHUP and on a file change;
//!   `Node::authorize` checks every call of both APIs against it.
//! - [`refusals`]: refused clients counted by reason and logged, rate-limited.
//! - [`reload`]: the TLS files and the access-control list, reloaded on SIGHUP and on a change.
//! - `clock`: the seam through which the server reads time; [`NodeEnv`] bundles it with the
//!   entropy, the [`probe`] and the [`PeerConnector`] (`TcpPeerConnector`, or
//!   [`tls::TlsPeerConnector`]).
//! - `peer_auth`: who may send peer messages (cluster id, member certificate, MAC);
//!   [`tls`]: the TLS accept loop and the members' mTLS dialer.
//! - `metrics`: Prometheus metrics, `/healthz` and `/readyz`; `watch`: the member's recent
//!   lock changes and its watch streams.
//! - [`backup`]: the backup file (`latchkey snapshot save`, from `ops`' `backup`) and the
//!   restore that seeds a new member's data dir from it (`latchkey snapshot restore`).
//! - `member_addr`: a member's recorded address, `CLIENT` or `CLIENT/PEER` (`--peer-listen`).
//! - `error`: the one place server errors become gRPC statuses and HTTP API JSON errors.

mod access;
mod api;
pub mod clock;
mod cluster;
mod error;
mod lease;
mod node;
mod observe;
pub mod probe;
pub mod reload;

// The public paths other crates and the tests use, kept as they were before the folders: each
// module lives in the folder of its part, and is named here once.
pub use access::{acl, tls};
pub use api::{cross_site, http};
pub use cluster::{member_addr, peer_auth};
pub use lease::leases;
pub use node::{backup, groups};
pub use observe::refusals;

use api::service;
use cluster::peer;
use node::ops;
use observe::metrics;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
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

/// A group's data lives in `<data-dir>/group-N/` (N >= 1; group 0 in the data dir itself),
/// except its Raft log, which the member's groups share in group 0's (`node::open_member_logs`).
pub const GROUP_DIR_PREFIX: &str = "group-";

/// Where group `group` of the member with data dir `data_dir` keeps its data.
pub(crate) fn group_data_dir(data_dir: &std::path::Path, group: u32) -> std::path::PathBuf {
    match group {
        0 => data_dir.to_path_buf(),
        g => data_dir.join(format!("{GROUP_DIR_PREFIX}{g}")),
    }
}

/// How one node runs. Build with [`ServerConfig::single`] or [`ServerConfig::cluster`], then
/// adjust the timing fields if needed, then check it with [`ServerConfig::validate`]: [`run`] and
/// [`run_with`] take only the [`ValidConfig`] it returns.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub id: u64,
    /// The address clients (and, without `peer_listen`, peers) reach this node at (also what
    /// is recorded as its address in the group's membership).
    pub listen: SocketAddr,
    /// Serve the peer service here instead of on `listen` (`--peer-listen`): the client port
    /// then answers no Raft message. Recorded in the membership after `listen`, as
    /// `CLIENT/PEER` (`member_addr`).
    pub peer_listen: Option<SocketAddr>,
    pub data_dir: PathBuf,
    /// The members that found the group, this node included: id -> address (`CLIENT` or
    /// `CLIENT/PEER`, see `member_addr`). Empty means "just me". Used only when the data dir
    /// is new; afterwards the membership is in the log and
    /// changes through `cluster add`/`remove`/`move` (a dir still checks that these name its
    /// cluster).
    pub peers: BTreeMap<u64, String>,
    /// Join this existing cluster (`--join`): with a new data dir the node waits, without
    /// founding a cluster, until the leader adds it (`cluster add`).
    pub join: Option<peer_auth::ClusterId>,
    /// Where this node dials a member, when not at its address in `peers` (a proxy, NAT).
    /// Tests route peer traffic through fault-injecting proxies this way.
    pub peer_dial: BTreeMap<u64, String>,
    /// Raft heartbeat interval.
    pub heartbeat_ms: u64,
    /// Raft election timeout range. A follower that has not heard from the leader for its
    /// leader lease (openraft makes it `election_timeout_max_ms`) plus a random time in this
    /// range asks for votes (pre-vote first), so a dead leader is replaced `max + [min, max)`
    /// after its last heartbeat.
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// With several groups: how long a group's preferred leader (group g's is the (g mod N)-th
    /// voter by id, the member that founded it) must have been caught up and answering before
    /// the group's leader hands the group back to it, so that leaderships spread over the
    /// members again after one returns (`node.rs` `rebalance_leadership`). 0: never.
    pub rebalance_after_ms: u64,
    /// Entries between snapshots; the log before a snapshot is purged.
    pub snapshot_every_entries: u64,
    /// Entries kept in the log behind a snapshot, so that a follower a little behind catches
    /// up by entries rather than by a snapshot install.
    pub log_kept_after_snapshot: u64,
    /// The lock table's byte budget (`--table-bytes-max`): a command that would take the table
    /// past it is refused (`table-full`). Every member must be given the same one, since it
    /// decides what `apply` answers: it is part of the cluster's fingerprint (`peer_auth`), so
    /// members with different budgets refuse each other's messages.
    pub table_bytes_max: usize,
    /// The cluster's Raft groups (`--groups`, issue #16): the lock namespace is split over
    /// them by `latchkey_core::group_of`, each group with its own log, leader and leases.
    /// Fixed when the cluster is founded (recorded in the data dir; a start with another count
    /// is refused) and part of the peer fingerprint.
    pub groups: u32,
    /// Replicas per Raft group (`--replicas`, issue #16, "groups across machines"): 0 puts
    /// every group on every member; R places group g on R of the founding members
    /// (`latchkey_core::groups::replicas_of`), so that a cluster of more members than a group
    /// needs grows its capacity with its members. It decides only the voters each group is
    /// founded with; a member outside a group still runs it, without a membership, and answers
    /// its requests with a hint to one of its replicas (`groups.rs`). Fixed when the cluster is
    /// founded (recorded in the data dir) and part of every group's peer fingerprint, since
    /// members that placed a group differently would found it with different voters.
    pub replicas: u32,
    /// Where to serve Prometheus metrics (`/metrics`) and `/healthz` over HTTP; off when `None`.
    pub metrics_listen: Option<SocketAddr>,
    /// Where to serve the HTTP/JSON API (`--http-listen`, see `http`); off when `None`. With
    /// `tls`, it is served over TLS with the same certificate and client verification.
    pub http_listen: Option<SocketAddr>,
    /// Web page origins other than the node's own that may write to the HTTP API and read its
    /// answers (`--http-allow-origin`, see `cross_site`); at most `HTTP_ALLOW_ORIGINS_MAX`, and
    /// only with `http_listen`.
    pub http_allow_origins: Vec<cross_site::HttpOrigin>,
    /// The secret every member signs its peer messages with (`--cluster-secret-file`); without
    /// one, peers are told apart only by member id and cluster fingerprint (see `peer_auth`).
    pub cluster_secret: Option<peer_auth::ClusterSecret>,
    /// TLS for clients and members (`--tls-cert`, `--tls-key`, `--tls-ca`); plaintext when
    /// `None`. Only [`run`] serves it (the simulation's transports stay plaintext).
    pub tls: Option<Arc<tls::ServerTls>>,
    /// Client authentication, permissions and quotas (`--acl`, or `[acl]` in the config file),
    /// reloaded without a restart (`reload.rs`); every client may do anything when `None`.
    pub acl: Option<Arc<acl::AclPolicy>>,
    /// Fixed bugs put back on purpose (the simulation's checker tests); all off by default.
    #[doc(hidden)]
    pub plant: Plant,
}

impl ServerConfig {
    pub fn single(id: u64, listen: SocketAddr, data_dir: PathBuf) -> ServerConfig {
        ServerConfig {
            id,
            listen,
            peer_listen: None,
            data_dir,
            peers: BTreeMap::new(),
            join: None,
            peer_dial: BTreeMap::new(),
            // Why these values: see `limits::ELECTION_TIMEOUT_MS_MIN_DEFAULT`.
            heartbeat_ms: limits::HEARTBEAT_MS_DEFAULT,
            election_timeout_min_ms: limits::ELECTION_TIMEOUT_MS_MIN_DEFAULT,
            election_timeout_max_ms: limits::ELECTION_TIMEOUT_MS_MAX_DEFAULT,
            rebalance_after_ms: limits::REBALANCE_AFTER_MS_DEFAULT,
            snapshot_every_entries: limits::SNAPSHOT_EVERY_ENTRIES_DEFAULT,
            log_kept_after_snapshot: limits::LOG_KEPT_AFTER_SNAPSHOT_DEFAULT,
            table_bytes_max: limits::TABLE_BYTES_MAX,
            groups: 1,
            replicas: 0,
            metrics_listen: None,
            http_listen: None,
            http_allow_origins: Vec::new(),
            cluster_secret: None,
            tls: None,
            acl: None,
            plant: Plant::default(),
        }
    }

    pub fn cluster(
        id: u64,
        listen: SocketAddr,
        data_dir: PathBuf,
        peers: BTreeMap<u64, String>,
    ) -> ServerConfig {
        ServerConfig {
            peers,
            ..ServerConfig::single(id, listen, data_dir)
        }
    }

    /// The group's members, this node included.
    pub fn members(&self) -> BTreeMap<u64, String> {
        if self.peers.is_empty() {
            BTreeMap::from([(self.id, self.own_addr())])
        } else {
            self.peers.clone()
        }
    }

    /// This node's address as the membership records it: `listen`, and `peer_listen` if set.
    pub fn own_addr(&self) -> String {
        member_addr::MemberAddr::join(
            &self.listen.to_string(),
            self.peer_listen.map(|a| a.to_string()).as_deref(),
        )
    }

    /// Check the configuration once, where it is built; [`run`] and [`run_with`] take only a
    /// checked one. Nothing here looks at `listen`, so [`ValidConfig::listening_on`] keeps a
    /// checked configuration checked.
    pub fn validate(self) -> Result<ValidConfig, ConfigError> {
        if self.id == 0 {
            return Err(ConfigError::IdZero);
        }
        if !self.peers.is_empty() && !self.peers.contains_key(&self.id) {
            return Err(ConfigError::NotAMember {
                id: self.id,
                members: self
                    .peers
                    .keys()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            });
        }
        if self.join.is_some() && !self.peers.is_empty() {
            return Err(ConfigError::JoinWithPeers);
        }
        for (id, addr) in &self.peers {
            member_addr::MemberAddr::check(addr)
                .map_err(|why| ConfigError::MemberAddr { id: *id, why })?;
        }
        if let Some(mine) = self.peers.get(&self.id) {
            // The others dial this member at the peer part of its entry: it must serve the peer
            // service there, and only there.
            let given = member_addr::MemberAddr::split(mine).peer.is_some();
            if given != self.peer_listen.is_some() {
                return Err(ConfigError::PeerListenMismatch {
                    id: self.id,
                    entry: mine.clone(),
                });
            }
        }
        if self.heartbeat_ms == 0 || self.heartbeat_ms * 3 > self.election_timeout_min_ms {
            return Err(ConfigError::HeartbeatTooLong {
                heartbeat_ms: self.heartbeat_ms,
                election_timeout_min_ms: self.election_timeout_min_ms,
            });
        }
        if self.election_timeout_min_ms >= self.election_timeout_max_ms {
            return Err(ConfigError::ElectionTimeoutRange {
                min_ms: self.election_timeout_min_ms,
                max_ms: self.election_timeout_max_ms,
            });
        }
        if self.election_timeout_max_ms * 2 > limits::SESSION_TTL_MS_DEFAULT {
            // A leader change must fit well inside a lease, or failovers would expire sessions
            // that renewed on time.
            tracing::warn!(
                "election timeout {} ms is over half the default session TTL",
                self.election_timeout_max_ms
            );
        }
        if self.snapshot_every_entries == 0 {
            return Err(ConfigError::NoSnapshotInterval);
        }
        if !(limits::TABLE_BYTES_MIN..=limits::TABLE_BYTES_MAX).contains(&self.table_bytes_max) {
            return Err(ConfigError::TableBytesMax(self.table_bytes_max));
        }
        latchkey_core::groups::check_groups(self.groups).map_err(ConfigError::Groups)?;
        if !self.http_allow_origins.is_empty() && self.http_listen.is_none() {
            return Err(ConfigError::AllowOriginWithoutHttp);
        }
        if self.http_allow_origins.len() > limits::HTTP_ALLOW_ORIGINS_MAX {
            return Err(ConfigError::TooManyAllowedOrigins(
                self.http_allow_origins.len(),
            ));
        }
        match self.join {
            // A member that joins is given no founding list: it checks the count alone.
            Some(_) => latchkey_core::groups::check_replica_count(self.replicas),
            None => latchkey_core::groups::check_replicas(
                self.replicas,
                self.members().len(),
                self.groups,
            ),
        }
        .map_err(ConfigError::Replicas)?;
        if self.peers.len() > 1
            && self
                .tls
                .as_ref()
                .is_some_and(|tls| !tls.requires_client_certs())
        {
            return Err(ConfigError::TlsClusterWithoutCa);
        }
        if let Some(tls) = self.tls.as_ref().filter(|_| self.peers.len() > 1) {
            // The others accept this member's messages only over a certificate naming it.
            let (want, names) = (
                peer_auth::member_certificate_name(self.id),
                tls.certificate_names(),
            );
            if !names.contains(&want) {
                return Err(ConfigError::MemberCertificateName { want, names });
            }
        }
        Ok(ValidConfig(self))
    }

    /// The configuration of group `group`'s node: group 0 keeps the data dir itself (so a
    /// dir of a one-group cluster is group 0 of nothing else), group g its `group-g` subdir.
    pub fn for_group(&self, group: u32) -> ServerConfig {
        let mut config = self.clone();
        config.data_dir = group_data_dir(&self.data_dir, group);
        config
    }

    fn raft_config(&self) -> openraft::Config {
        openraft::Config {
            cluster_name: "latchkey".into(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_every_entries),
            max_in_snapshot_log_to_keep: self.log_kept_after_snapshot,
            // openraft gives `full_snapshot` this as its RPC timeout; `peer.rs` applies it to
            // each chunk of the streamed snapshot (openraft's default, 200 ms, was the limit of
            // the whole snapshot when it went as one message).
            install_snapshot_timeout: limits::SNAPSHOT_CHUNK_TIMEOUT_MS,
            // A restarted leader must win an election, never resume its old term. The lock
            // table is in memory and the committed index is saved without waiting for an fsync,
            // so after a crash a node may reload an older committed index than the one it
            // acknowledged. A resumed leader's read index is max(its old term's first entry,
            // that committed index), below the acknowledged entries it has not re-applied yet:
            // a linearizable read would then answer from a stale table (e.g. a lock still held
            // under a token whose release was acknowledged). A new term's first entry lies after
            // every entry of the old one, so reads wait until those are applied.
            enable_leader_restore: Some(false),
            allow_log_reversion: Some(self.plant.tolerate_log_reversion),
            // A member that was paused or cut off must not depose a healthy leader when it is
            // back (issue #9 item 9). Without pre-vote (openraft's default) its election timer
            // raises its term on every firing (`Engine::elect`); its vote requests are refused
            // by the lease rule of `Engine::handle_vote_req` (a follower that heard from the
            // leader within `election_timeout_max`, the leader itself while a quorum acks it),
            // but the leader's next AppendEntries to it is answered `HigherVote`, and the
            // leader adopts that term and steps down (`RaftCore::handle_notification`,
            // `Notification::HigherVote` -> `VoteHandler::update_vote`). With pre-vote the
            // timer first runs `Engine::pre_elect`, which asks the others whether they would
            // grant term + 1 (`Engine::handle_pre_vote_req`: the same lease and log rules,
            // nothing persisted) and raises the term only once a quorum would. A member that
            // cannot win keeps its term, so its return disturbs nobody; a dead leader is
            // replaced one round trip later than before. It needs the real `pre_vote` RPC of
            // `peer.rs`: openraft's default one answers "granted" unasked, a no-op. (openraft
            // 0.10.0-alpha.37, `src/engine/engine_impl.rs`, `src/core/raft_core.rs`.)
            enable_pre_vote: Some(true),
            ..Default::default()
        }
    }
}

/// Why a [`ServerConfig`] is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("node id must be at least 1")]
    IdZero,
    #[error("{0}")]
    ClusterSecret(String),
    #[error("{0}")]
    Tls(String),
    #[error("{0}")]
    Acl(String),
    #[error(
        "members of a TLS cluster dial each other with mTLS: give every member --tls-ca FILE, the \
         CA that signed the members' certificates"
    )]
    TlsClusterWithoutCa,
    #[error(
        "this member's certificate names {names:?}: a member's certificate must name it \
         `{want}` (subject CN or a DNS subject alternative name), or the other members refuse its \
         messages"
    )]
    MemberCertificateName { want: String, names: Vec<String> },
    #[error(
        "--join and --peers exclude each other: --peers founds a new cluster, --join waits to be \
         added to an existing one"
    )]
    JoinWithPeers,
    #[error("member {id}'s address: {why}")]
    MemberAddr { id: u64, why: String },
    #[error(
        "this member's --peers entry {id}={entry} and --peer-listen disagree: with --peer-listen \
         ADDR, its entry must be CLIENT_ADDR/PEER_ADDR (the others dial the peer part), and \
         without it just CLIENT_ADDR"
    )]
    PeerListenMismatch { id: u64, entry: String },
    #[error("this node's id {id} is not in --peers ({members})")]
    NotAMember { id: u64, members: String },
    #[error("heartbeat must be non-zero and at most a third of the election timeout")]
    HeartbeatTooLong {
        heartbeat_ms: u64,
        election_timeout_min_ms: u64,
    },
    #[error("election timeout min must be below max")]
    ElectionTimeoutRange { min_ms: u64, max_ms: u64 },
    #[error("snapshot interval must be at least one entry")]
    NoSnapshotInterval,
    #[error(
        "--table-bytes-max {0} is outside {min}..={max}",
        min = limits::TABLE_BYTES_MIN,
        max = limits::TABLE_BYTES_MAX
    )]
    TableBytesMax(usize),
    #[error("--groups: {0}")]
    Groups(latchkey_core::groups::BadGroups),
    #[error("{0}")]
    Replicas(latchkey_core::groups::BadReplicas),
    #[error(
        "--http-allow-origin lists origins allowed to use the HTTP API: it needs --http-listen"
    )]
    AllowOriginWithoutHttp,
    #[error(
        "--http-allow-origin lists {0} origins, at most {max} may be listed",
        max = limits::HTTP_ALLOW_ORIGINS_MAX
    )]
    TooManyAllowedOrigins(usize),
}

/// A [`ServerConfig`] that passed [`ServerConfig::validate`]. Read it as a `ServerConfig`.
#[derive(Debug, Clone)]
pub struct ValidConfig(ServerConfig);

impl ValidConfig {
    /// The same configuration at the address its listener got (with port 0 the kernel picks
    /// one, known only after binding). Validation does not look at `listen`.
    pub fn listening_on(mut self, listen: SocketAddr) -> ValidConfig {
        self.0.listen = listen;
        self
    }

    /// The same for `peer_listen`, at the address the peer listener got.
    fn peer_listening_on(mut self, peer_listen: SocketAddr) -> ValidConfig {
        self.0.peer_listen = Some(peer_listen);
        self
    }
}

impl std::ops::Deref for ValidConfig {
    type Target = ServerConfig;
    fn deref(&self) -> &ServerConfig {
        &self.0
    }
}

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

/// What the server needs from the world besides its data dir: time and the network. Tests and
/// simulations replace both.
#[derive(Clone)]
pub struct NodeEnv {
    pub clock: SharedClock,
    pub connector: SharedPeerConnector,
    pub entropy: SharedEntropy,
    /// Told about lease-relevant events (the simulation counts them); [`NoProbe`] otherwise.
    pub probe: SharedProbe,
}

impl NodeEnv {
    /// The machine's clocks and TCP.
    pub fn real() -> NodeEnv {
        NodeEnv {
            clock: Arc::new(SystemNodeClock),
            connector: Arc::new(TcpPeerConnector),
            entropy: Arc::new(OsEntropy),
            probe: Arc::new(NoProbe),
        }
    }
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
    let config = config.0;
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
                            (n.shape.group, s.last_log_index, s.role == ops::Role::Leader)
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
                    n.peer_auth.clone(),
                    n.config.table_bytes_max,
                    n.shutdown.clone(),
                    n.succession.clone(),
                    n.leader_contact.clone(),
                )
            })
            .collect(),
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

#[cfg(test)]
mod tests {
    use super::ServerConfig;

    /// See the comment in `raft_config`: with leader restore, a leader restarted with an older
    /// committed index answers linearizable reads from a table that misses acknowledged entries
    /// (found by the simulation's final crash-and-restart of every node).
    #[test]
    fn a_restarted_leader_must_win_an_election() {
        let config = ServerConfig::single(1, "127.0.0.1:0".parse().unwrap(), "unused".into());
        assert_eq!(config.raft_config().enable_leader_restore, Some(false));
    }

    /// `--peer-listen` and this member's `--peers` entry must agree: the others dial the
    /// entry's peer part, so a member must serve the peer service there, and only with one.
    #[test]
    fn peer_listen_and_the_members_own_entry_must_agree() {
        use super::ConfigError;
        let peers = |one: &str| {
            [(1, one.to_owned()), (2, "127.0.0.1:7002".to_owned())]
                .into_iter()
                .collect()
        };
        let config = |one: &str, peer_listen: Option<&str>| {
            let mut c = ServerConfig::cluster(
                1,
                "127.0.0.1:7001".parse().unwrap(),
                "unused".into(),
                peers(one),
            );
            c.peer_listen = peer_listen.map(|a| a.parse().unwrap());
            c.validate().map(|_| ())
        };
        assert_eq!(config("127.0.0.1:7001", None), Ok(()));
        assert_eq!(
            config("127.0.0.1:7001/127.0.0.1:8001", Some("127.0.0.1:8001")),
            Ok(())
        );
        for (one, peer_listen) in [
            ("127.0.0.1:7001/127.0.0.1:8001", None),
            ("127.0.0.1:7001", Some("127.0.0.1:8001")),
        ] {
            assert!(
                matches!(
                    config(one, peer_listen),
                    Err(ConfigError::PeerListenMismatch { id: 1, .. })
                ),
                "{one} {peer_listen:?}"
            );
        }
        assert!(matches!(
            config("127.0.0.1:7001/", None),
            Err(ConfigError::MemberAddr { id: 1, .. })
        ));
    }

    /// `--replicas` is checked where the configuration is built: against the founding members
    /// and the group count (every member in some group), and on its own for a member that
    /// joins; the HTTP API serves replica subsets too.
    #[test]
    fn a_placement_that_leaves_a_member_in_no_group_is_refused() {
        use super::ConfigError;
        use latchkey_core::groups::BadReplicas;
        let peers: std::collections::BTreeMap<u64, String> = (1..=7)
            .map(|i| (i, format!("127.0.0.1:{}", 7000 + i)))
            .collect();
        let config = |groups, replicas| {
            let mut c = ServerConfig::cluster(
                1,
                "127.0.0.1:7001".parse().unwrap(),
                "unused".into(),
                peers.clone(),
            );
            c.groups = groups;
            c.replicas = replicas;
            c
        };
        assert!(config(5, 3).validate().is_ok());
        assert!(matches!(
            config(4, 3).validate(),
            Err(ConfigError::Replicas(BadReplicas::MembersInNoGroup { .. }))
        ));
        // The HTTP API serves groups on replica subsets too.
        let mut http = config(5, 3);
        http.http_listen = Some("127.0.0.1:0".parse().unwrap());
        assert!(http.validate().is_ok());
        let mut joining =
            ServerConfig::single(9, "127.0.0.1:7009".parse().unwrap(), "unused".into());
        joining.join = Some(super::peer_auth::ClusterId::founded_by(&peers));
        joining.groups = 5;
        joining.replicas = 2;
        assert!(matches!(
            joining.validate(),
            Err(ConfigError::Replicas(BadReplicas::TooFew { replicas: 2 }))
        ));
    }

    /// See the comment in `raft_config`: without pre-vote a follower back from a SIGSTOP or a
    /// partition raised its term and deposed a healthy leader (`cluster_rejoin` tests).
    #[test]
    fn a_returning_member_asks_before_it_campaigns() {
        let config = ServerConfig::single(1, "127.0.0.1:0".parse().unwrap(), "unused".into());
        assert_eq!(config.raft_config().enable_pre_vote, Some(true));
    }
}
