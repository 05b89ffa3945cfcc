//! How a member is configured: [`ServerConfig`] (what `latchkey serve`'s flags and config file
//! say, or what a test or the simulation builds), checked once by [`ServerConfig::validate`]
//! into the [`ValidConfig`] that [`crate::run`] and [`crate::run_with`] take; [`NodeEnv`], what
//! the server takes from the world besides its data dir; and where each group keeps its data.
//!
//! - [`origin`]: a web page origin that `--http-allow-origin` takes ([`origin::HttpOrigin`]),
//!   for the HTTP API's cross-site guard (`crate::api::http::cross_site`).
//! - [`reload`]: the parts of the configuration that reload without a restart.
//!
//! Below the node, which starts from a `ValidConfig`; depends on access control (the TLS
//! files, the access-control list), the cluster (the cluster id, member addresses, the peer
//! connector) and the seams (`clock`, `probe`), never on the node or the APIs.

pub mod origin;
pub mod reload;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use latchkey_core::limits;

use crate::access::{acl, tls};
use crate::clock::{OsEntropy, SharedClock, SharedEntropy, SystemNodeClock};
use crate::cluster::member_addr;
use crate::cluster::peer::{SharedPeerConnector, TcpPeerConnector};
use crate::cluster::peer_auth;
use crate::probe::{NoProbe, Plant, SharedProbe};

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
    /// Entries between snapshots; the log before a snapshot is purged. With [`Self::coalesce`],
    /// also this many client operations (a batch entry counts each of its operations,
    /// `Node::lease_duties`), so that a log of batch entries does not grow `BATCH_OPS_MAX`
    /// times longer between snapshots.
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
    pub http_allow_origins: Vec<origin::HttpOrigin>,
    /// The secret every member signs its peer messages with (`--cluster-secret-file`); without
    /// one, peers are told apart only by member id and cluster fingerprint (see `peer_auth`).
    pub cluster_secret: Option<peer_auth::ClusterSecret>,
    /// TLS for clients and members (`--tls-cert`, `--tls-key`, `--tls-ca`); plaintext when
    /// `None`. Only [`run`] serves it (the simulation's transports stay plaintext).
    pub tls: Option<Arc<tls::ServerTls>>,
    /// Client authentication, permissions and quotas (`--acl`, or `[acl]` in the config file),
    /// reloaded without a restart (`reload.rs`); every client may do anything when `None`.
    pub acl: Option<Arc<acl::AclPolicy>>,
    /// Gather client operations that arrive while the leader's earlier writes are in flight
    /// (`limits::GATHER_WRITES_IN_FLIGHT` of them) into one batch entry (issue #35,
    /// `node/gather.rs`). On by default, as in `serve` (`serve
    /// --coalesce false` and `bench --no-coalesce` turn it off). The simulation runs it in the
    /// odd seeds (`latchkey_sim::RunConfig::coalesce`), its checkers reading a batch entry's
    /// operations each as an entry of its own at the entry's index, and a planted batching bug
    /// (`Plant::batch_answers_reversed`) is caught there. Off, every operation is an entry of
    /// its own, as before issue #35.
    pub coalesce: bool,
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
            coalesce: true,
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

    /// Where other members and forwarded requests reach this member's HTTP API (issue #33):
    /// `http_listen`, or, when that is a wildcard (0.0.0.0), which names no host, its port on
    /// the host of this member's `--peers` entry. `None` without `--http-listen`, or when no
    /// host is known.
    pub fn http_advertise(&self) -> Option<String> {
        let http = self.http_listen?;
        if !http.ip().is_unspecified() {
            return Some(http.to_string());
        }
        let recorded = self.members().remove(&self.id)?;
        let client = member_addr::MemberAddr::split(&recorded).client;
        let (host, _) = client.rsplit_once(':')?;
        Some(format!("{host}:{}", http.port()))
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

    pub(crate) fn raft_config(&self) -> openraft::Config {
        openraft::Config {
            cluster_name: "latchkey".into(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_every_entries),
            max_in_snapshot_log_to_keep: self.log_kept_after_snapshot,
            // openraft gives `full_snapshot` this as its RPC timeout; `peer/network.rs` applies it to
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
            // `peer/network.rs`: openraft's default one answers "granted" unasked, a no-op. (openraft
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
    /// `LATCHKEY_TEST_PLANT` (a fixed bug put back for the nemesis, `latchkey serve`'s
    /// `serve.rs`): set on a release build, or naming no plant.
    #[error("{0}")]
    #[doc(hidden)]
    TestPlant(String),
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
    pub(crate) fn peer_listening_on(mut self, peer_listen: SocketAddr) -> ValidConfig {
        self.0.peer_listen = Some(peer_listen);
        self
    }

    /// The checked configuration, for `run_with`, which takes it apart.
    pub(crate) fn into_inner(self) -> ServerConfig {
        self.0
    }
}

impl std::ops::Deref for ValidConfig {
    type Target = ServerConfig;
    fn deref(&self) -> &ServerConfig {
        &self.0
    }
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
