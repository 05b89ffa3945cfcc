//! The node and its groups: the domain layer between the APIs and the Raft log.
//!
//! - this file: [`Node`], one member of one Raft group (below).
//! - [`ops`]: the node's operations in domain types (propose, linearizable read, acquire,
//!   keepalive, status), which both APIs and the lease task call.
//! - [`groups`]: with `--groups G`, one `Node` per group and which group a request goes to.
//! - [`backup`]: the backup file of a group's table, and the restore that seeds a new data dir.
//!
//! Depends on the cluster (peers), leases and waiters, access control and `observe`; must not
//! depend on the APIs (`crate::api`), which depend on it.
//!
//! One member of a Raft group: storage, the openraft node, the lease table, and the leader's
//! duties (restarting leases on election, proposing expiries).
//!
//! Start-up ([`Node::start`]): the data dir's record (cluster id, member id, group count,
//! replica count; `DirRecord`) is checked against the flags in one function (`check_record`)
//! before the log is opened, so a refused start changes no byte of the dir. Then the node
//! founds its group or waits to be added (`--join`: a member that knows no membership founds
//! nothing). With `--groups G` a member runs one `Node` per group (group 0 in the data dir,
//! group g in `group-g/`, `ServerConfig::for_group`), sharing one [`MemberShared`]; their logs
//! are one, the data dir's `raft-log/`, opened by `open_member_logs` after every group dir's
//! record is checked ([`Node::open_log_stores`]), except a group that an older build gave a
//! `group-g/raft-log/` of its own, which keeps it.
//!
//! Founding: group g of a new cluster of several is founded first by member g mod N
//! (`founder_of`); the others initialize it only after `FOUNDING_WAIT_ELECTIONS` election
//! timeouts without news of it ([`Node::found_later`]), so leaders start spread. With replica
//! subsets (`--replicas R`, `latchkey_core::groups::replicas_of`: the founder and the next R-1
//! members by id) only a group's R replicas found it, with themselves as its voters; a member
//! outside it runs its node without a membership, reports itself `outside` (`Role::Outside`)
//! and sends its clients to a replica (`Node::placement`). `R` is recorded in the data dir and
//! in every group's peer fingerprint, since members that placed a group differently would
//! found it with different voters.
//!
//! The tasks a node runs for as long as it lives, each documented on its function:
//! [`Node::lease_duties`] (the lease task: every lease log write comes from it, so their log
//! order is the order they were decided in; it wakes on openraft's *server* metrics, which
//! change with role and vote, on renewals and on its deadlines, never once per entry),
//! [`Node::follow_membership`] (the peer address book in step with the membership),
//! [`Node::compact_log`] (only for a log shared by groups) and [`Node::rebalance_leadership`]
//! (only with several groups).

pub mod backup;
pub mod groups;
pub mod ops;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use latchkey_core::{limits, GroupShape, IdentityUsage, Op, Outcome, SessionId};
use tokio::sync::{mpsc, oneshot};

use crate::error::ApiError;
use crate::observe::metrics::Metrics;
use latchkey_log_store::{LogStore, LogStoreError, Migrated};
use latchkey_raft::{LockStateMachine, Raft, StateHandle, TypeConfig};
use openraft::async_runtime::WatchReceiver;
use openraft::{BasicNode, ReadPolicy, ServerState};
use tokio_util::sync::CancellationToken;

use crate::clock::{SharedClock, SharedEntropy};
use crate::cluster::member_addr::MemberAddr;
use crate::cluster::peer::AddressBook;
use crate::cluster::peer_auth::ClusterId;
use crate::config::{NodeEnv, ServerConfig};
use crate::lease::leases::Leases;
use crate::lease::waiters::{Observer, Waiters};
use crate::probe::ProbeEvent;

/// The log storage a node runs on: openraft's log storage plus a little durable metadata. The
/// segment log store is the real one; a simulation supplies one that can lose unsynced writes.
pub trait NodeLogStore: openraft::storage::RaftLogStorage<TypeConfig> {
    fn read_node_meta(&self, key: &str) -> Result<Option<Vec<u8>>, String>;
    fn write_node_meta(&self, key: &str, value: &[u8]) -> Result<(), String>;
    /// Reports each group commit's duration to `observer` (the fsync histogram); a store
    /// without real fsyncs (the simulation's) ignores it.
    fn observe_commits(&self, _observer: latchkey_log_store::CommitObserver) {}
    /// For a log shared by a member's groups: asks, without keeping the store open, up to
    /// which index this group must purge for the log's oldest segment to go
    /// (`LogStore::held_back_upto`; `Node::compact_log`). A store of its own has none.
    fn held_back(&self) -> Option<HeldBack> {
        None
    }
}

/// See [`NodeLogStore::held_back`].
pub type HeldBack = Box<dyn Fn() -> Option<u64> + Send + Sync>;

impl NodeLogStore for LogStore<TypeConfig> {
    fn read_node_meta(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        self.read_meta(key).map_err(|e| e.to_string())
    }

    fn write_node_meta(&self, key: &str, value: &[u8]) -> Result<(), String> {
        self.write_meta(key, value).map_err(|e| e.to_string())
    }

    fn observe_commits(&self, observer: latchkey_log_store::CommitObserver) {
        LogStore::observe_commits(self, observer);
    }

    fn held_back(&self) -> Option<HeldBack> {
        let watch = self.watch();
        Some(Box::new(move || watch.held_back_upto()))
    }
}

/// Log-store metadata key under which the cluster this data dir belongs to is recorded
/// ([`DirRecord`]).
pub(crate) const META_CLUSTER: &str = "cluster";
/// The same record as a file in the data dir, readable without opening the log.
pub(crate) const CLUSTER_FILE: &str = "cluster";
/// Written by `latchkey snapshot restore` into the data dir before it seeds anything, removed
/// once every group is seeded: a data dir that still has it was restored part way (a group
/// may be missing, and a start would found it empty), so a start refuses it.
pub(crate) const RESTORE_MARKER: &str = "restore-unfinished";
/// Where releases before membership changes recorded the member list the data dir was founded
/// with (log metadata key and file); such a dir belongs to `ClusterId::founded_by` that list.
const META_MEMBERS_OLD: &str = "members";
const MEMBERS_FILE_OLD: &str = "members";

/// What a data dir belongs to, for life: a cluster and a member id in it. Written when the
/// dir is first used (founding a cluster, or `--join`); the membership itself is in the log
/// and changes through it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DirRecord {
    cluster: ClusterId,
    /// `None` in a dir from before membership changes, which did not record it.
    member: Option<u64>,
    /// The dir was started with `--join`: it waits to be added and never founds a cluster.
    joined: bool,
    /// The cluster's Raft groups (`--groups`, issue #16), fixed when it is founded; 1 in a dir
    /// from before groups, which does not record it.
    groups: u32,
    /// Replicas per group (`--replicas`), fixed when it is founded; 0 (every member) in a dir
    /// that does not record it.
    replicas: u32,
}

impl DirRecord {
    fn encode(&self) -> String {
        let mut text = format!("cluster={}\n", self.cluster);
        if let Some(id) = self.member {
            text.push_str(&format!("member={id}\n"));
        }
        if self.joined {
            text.push_str("joined=true\n");
        }
        if self.groups != 1 {
            text.push_str(&format!("groups={}\n", self.groups));
        }
        if self.replicas != 0 {
            text.push_str(&format!("replicas={}\n", self.replicas));
        }
        text
    }

    fn decode(text: &str) -> Result<DirRecord, String> {
        let mut cluster = None;
        let mut member = None;
        let mut joined = false;
        let mut groups = 1;
        let mut replicas = 0;
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            match line.split_once('=') {
                Some(("cluster", v)) => cluster = Some(ClusterId::parse(v)?),
                Some(("member", v)) => {
                    member = Some(v.parse().map_err(|_| format!("bad member id {v:?}"))?)
                }
                Some(("joined", v)) => joined = v == "true",
                Some(("groups", v)) => {
                    groups = v
                        .parse()
                        .ok()
                        .filter(|g| latchkey_core::groups::check_groups(*g).is_ok())
                        .ok_or_else(|| format!("bad group count {v:?}"))?
                }
                Some(("replicas", v)) => {
                    replicas = v
                        .parse()
                        .ok()
                        .filter(|r| *r >= latchkey_core::limits::REPLICAS_MIN)
                        .ok_or_else(|| format!("bad replica count {v:?}"))?
                }
                _ => return Err(format!("unexpected line {line:?}")),
            }
        }
        Ok(DirRecord {
            cluster: cluster.ok_or("no cluster id")?,
            member,
            joined,
            groups,
            replicas,
        })
    }

    /// The record of a dir from before membership changes: its founding member list.
    fn from_old_members(text: &str) -> Result<DirRecord, String> {
        let mut members = BTreeMap::new();
        for entry in text.trim().split(',') {
            let (id, addr) = entry
                .split_once('=')
                .ok_or_else(|| format!("bad member entry {entry:?}"))?;
            let id: u64 = id.parse().map_err(|_| format!("bad member id {id:?}"))?;
            members.insert(id, addr.to_owned());
        }
        Ok(DirRecord {
            cluster: ClusterId::founded_by(&members),
            member: None,
            joined: false,
            groups: 1,
            replicas: 0,
        })
    }
}

/// The cluster the flags name, if they name one: `--join ID`, or `--peers LIST` (the cluster
/// that list founds). Without either, a data dir's own record decides (a single node restarted
/// on another address keeps its cluster).
fn named_cluster(config: &ServerConfig) -> Option<(ClusterId, &'static str)> {
    match &config.join {
        Some(id) => Some((id.clone(), "--join")),
        None if !config.peers.is_empty() => Some((ClusterId::founded_by(&config.peers), "--peers")),
        None => None,
    }
}
/// The log's segment directory inside the data dir.
pub(crate) const LOG_DIR: &str = "raft-log";
/// The log of a data dir from a build before the segment log (one redb file), migrated into
/// [`LOG_DIR`] on the first start (then renamed to `raft-log.redb.migrated` and kept).
pub(crate) const OLD_LOG_FILE: &str = "raft-log.redb";

/// Opens the log store of `data_dir`, first migrating a log of the previous (redb) build if the
/// dir has one and no segment directory yet.
pub(crate) fn open_log_dir(data_dir: &Path) -> Result<LogStore<TypeConfig>, LogStoreError> {
    migrate_log(data_dir)?;
    LogStore::<TypeConfig>::open(&data_dir.join(LOG_DIR))
}

fn migrate_log(data_dir: &Path) -> Result<(), LogStoreError> {
    let old = data_dir.join(OLD_LOG_FILE);
    let new = data_dir.join(LOG_DIR);
    match latchkey_log_store::migrate_from_redb::<TypeConfig>(&old, &new)? {
        Migrated::Nothing => {}
        done => tracing::info!(?done, dir = %data_dir.display(), "migrated the Raft log from redb"),
    }
    Ok(())
}

/// Opens the Raft logs of a member's `groups` groups, one store per group in group order.
///
/// The groups share one log, group 0's (`<data-dir>/raft-log`), so that one writer commits
/// the appends of all of them with one `fdatasync` per batch (issue #16). A data dir of the
/// build before that keeps a log of its own in `group-N/raft-log` for each group N ≥ 1; such a
/// group keeps it (it is opened alone, as that build did), and nothing is moved.
pub(crate) fn open_member_logs(
    data_dir: &Path,
    groups: u32,
) -> Result<Vec<LogStore<TypeConfig>>, LogStoreError> {
    migrate_log(data_dir)?;
    let mut own = BTreeMap::new();
    let mut sharing = Vec::new();
    for group in 0..groups {
        let dir = crate::config::group_data_dir(data_dir, group);
        // An error reading the dir is not taken for "no log of its own": that could open the
        // group empty in the shared log beside the log it has.
        let has = |name: &str| {
            let path = dir.join(name);
            path.try_exists().map_err(|source| LogStoreError::Io {
                op: "look for",
                path,
                source,
            })
        };
        if group > 0 && (has(LOG_DIR)? || has(OLD_LOG_FILE)?) {
            own.insert(group, open_log_dir(&dir)?);
        } else {
            sharing.push(group);
        }
    }
    if !own.is_empty() {
        tracing::info!(
            groups = ?own.keys().collect::<Vec<_>>(),
            "these groups keep the Raft logs of their own that an older build made"
        );
    }
    let mut shared =
        LogStore::<TypeConfig>::open_groups(&data_dir.join(LOG_DIR), &sharing)?.into_iter();
    Ok((0..groups)
        .map(|group| {
            own.remove(&group)
                .unwrap_or_else(|| shared.next().expect("one shared store per sharing group"))
        })
        .collect())
}
/// The state machine's snapshot directory inside the data dir.
pub(crate) const SNAPSHOT_DIR: &str = "snapshots";

/// The record of a data dir that member `id` founds a cluster of `members` with (what
/// `latchkey snapshot restore` writes into the dirs it seeds, as a first start would).
pub(crate) fn founder_record(
    id: u64,
    members: &BTreeMap<u64, String>,
    groups: u32,
    replicas: u32,
) -> String {
    DirRecord {
        cluster: ClusterId::founded_by(members),
        member: Some(id),
        joined: false,
        groups,
        replicas,
    }
    .encode()
}

/// What the groups of one member share: its metrics, the token that ends its serving, and
/// the member's [`Groups`](groups::Groups).
#[derive(Clone)]
pub struct MemberShared {
    pub metrics: Arc<Metrics>,
    /// Cancelled when the member begins to shut down; every group's long-polls end on it.
    pub shutdown: CancellationToken,
    /// The member's groups, set once by `Groups::new` when every group's node has started.
    pub groups: MemberGroups,
}

/// A group's way to its member's other groups (an identity's quotas are counted over them,
/// `Node::identity_usage`): weak, since the `Groups` holds the nodes.
pub type MemberGroups = Arc<std::sync::OnceLock<std::sync::Weak<dyn OtherGroups>>>;

/// What a group's node asks of its member's other groups: implemented by
/// [`Groups`](groups::Groups), which holds the nodes, so that the node does not depend on it.
pub trait OtherGroups: Send + Sync {
    /// What `identity` holds in the tables of the member's groups other than `except`.
    fn identity_usage_besides(&self, except: u32, identity: &str) -> IdentityUsage;
}

impl MemberShared {
    pub fn new() -> MemberShared {
        MemberShared {
            metrics: Arc::new(Metrics::new()),
            shutdown: CancellationToken::new(),
            groups: MemberGroups::default(),
        }
    }
}

pub struct Node {
    pub id: u64,
    /// Which Raft group of the cluster this is (issue #16): a member runs one `Node` per group.
    pub shape: GroupShape,
    pub raft: Raft,
    pub state: StateHandle,
    pub clock: SharedClock,
    pub entropy: SharedEntropy,
    pub leases: Arc<Mutex<Leases>>,
    pub waiters: Arc<Waiters>,
    /// Cancelled when the server begins to shut down; long-polls end on it.
    pub shutdown: CancellationToken,
    pub config: ServerConfig,
    /// Keepalives of marked sessions go to the lease task, which writes their renewal.
    pub renewals: mpsc::Sender<RenewRequest>,
    pub metrics: Arc<Metrics>,
    pub probe: crate::probe::SharedProbe,
    /// Who may send this member peer messages, and how it signs its own.
    pub peer_auth: Arc<crate::cluster::peer_auth::PeerAuth>,
    /// The cluster this member belongs to (its data dir's record).
    pub cluster: ClusterId,
    /// Where the peer network dials each member; `follow_membership` keeps it in step with the
    /// Raft membership.
    pub peer_book: AddressBook,
    /// This member's recent lock changes and its watch streams.
    pub watch: Arc<crate::observe::watch::WatchHub>,
    /// The successor this group's leader named (a leader transfer), shared by the group's
    /// peer network and peer service (`peer::Succession`).
    pub succession: Arc<crate::cluster::peer::Succession>,
    /// When this member last heard from the group's leader (stamped by the group's peer
    /// service); a quiet watch stream ends on a member without one (`Node::out_of_touch_for`).
    pub leader_contact: Arc<crate::cluster::leader_contact::LeaderContact>,
    /// With replica subsets (`--replicas`): the members that founded this group, its
    /// founder first, with their founding client addresses (`replicas_of` over the founding
    /// list). Empty with every member in every group, and on a member that joined (it was
    /// given no founding list). A member outside the group sends its clients to these
    /// (`Groups::serving`); the first is the group's preferred leader while it is a voter.
    pub(crate) placement: Vec<(u64, String)>,
    /// The founding member list, when another member founds this group first (see
    /// [`Node::found_later`]).
    found_later: Mutex<Option<BTreeMap<u64, BasicNode>>>,
    /// Whether this group holds back the member's shared log ([`Node::compact_log`]).
    held_back: Option<HeldBack>,
    /// The member's groups ([`MemberShared::groups`]).
    pub(crate) member_groups: MemberGroups,
}

/// The member that founds group `group` of a new cluster of members `ids`: the (group mod
/// N)-th by id, so that N members lead about G/N groups each. Also the group's preferred
/// leader later, over its voters (`Node::rebalance_leadership`).
pub(crate) fn founder_of(group: u32, ids: impl IntoIterator<Item = u64>) -> u64 {
    let mut ids: Vec<u64> = ids.into_iter().collect();
    assert!(!ids.is_empty(), "a cluster has members");
    ids.sort_unstable();
    ids[group as usize % ids.len()]
}

/// The replicas group `group` is founded on with `config`'s `--replicas`, and their client
/// addresses (see [`Node::placement`]); empty without replica subsets or a founding list.
fn placement(config: &ServerConfig, group: u32) -> Vec<(u64, String)> {
    if config.replicas == 0 || config.peers.is_empty() {
        return Vec::new();
    }
    latchkey_core::groups::replicas_of(group, config.peers.keys().copied(), config.replicas)
        .into_iter()
        .map(|id| {
            let addr = MemberAddr::split(&config.peers[&id]).client.to_owned();
            (id, addr)
        })
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("data dir {dir}: {source}")]
    DataDir { dir: String, source: std::io::Error },
    #[error("log store: {0}")]
    LogStore(String),
    #[error("state machine: {0}")]
    StateMachine(String),
    #[error(
        "data dir {dir} belongs to cluster {recorded}, but {flag} names cluster {given}; refusing \
         to start (start it with the flags it was founded or joined with, or a fresh data dir)"
    )]
    ClusterMismatch {
        dir: String,
        recorded: ClusterId,
        flag: &'static str,
        given: ClusterId,
    },
    #[error(
        "data dir {dir} belongs to member {recorded}, but this node was started with --id {given}; \
         refusing to start"
    )]
    MemberMismatch {
        dir: String,
        recorded: u64,
        given: u64,
    },
    #[error(
        "data dir {dir} belongs to a cluster of {recorded} Raft groups, but this node was started \
         with --groups {given}; refusing to start (a cluster's group count is fixed when it is \
         founded)"
    )]
    GroupsMismatch {
        dir: String,
        recorded: u32,
        given: u32,
    },
    #[error(
        "data dir {dir} belongs to a cluster of {recorded} replicas per Raft group (0: every \
         member), but this node was started with --replicas {given}; refusing to start (a \
         cluster's placement is fixed when it is founded)"
    )]
    ReplicasMismatch {
        dir: String,
        recorded: u32,
        given: u32,
    },
    #[error("data dir {dir}: unreadable cluster record: {why}")]
    BadRecord { dir: String, why: String },
    #[error(
        "data dir {dir}: a `latchkey snapshot restore` into it did not finish; refusing to start \
         (remove the data dir and restore it again)"
    )]
    RestoreUnfinished { dir: String },
    #[error("raft: {0}")]
    Raft(String),
}

/// A data dir belongs to one cluster and one member id for life: a node started on it with
/// flags naming another would form a different cluster around the same log. The one
/// comparison of a dir's record (its `cluster` file, or the log's own record) with the flags.
fn check_record(dir: &Path, recorded: &DirRecord, config: &ServerConfig) -> Result<(), StartError> {
    if let Some((given, flag)) = named_cluster(config) {
        if given != recorded.cluster {
            return Err(StartError::ClusterMismatch {
                dir: dir.display().to_string(),
                recorded: recorded.cluster.clone(),
                flag,
                given,
            });
        }
    }
    if recorded.groups != config.groups {
        return Err(StartError::GroupsMismatch {
            dir: dir.display().to_string(),
            recorded: recorded.groups,
            given: config.groups,
        });
    }
    if recorded.replicas != config.replicas {
        return Err(StartError::ReplicasMismatch {
            dir: dir.display().to_string(),
            recorded: recorded.replicas,
            given: config.replicas,
        });
    }
    match recorded.member {
        Some(member) if member != config.id => Err(StartError::MemberMismatch {
            dir: dir.display().to_string(),
            recorded: member,
            given: config.id,
        }),
        _ => Ok(()),
    }
}

pub(crate) fn members_text(members: &BTreeMap<u64, String>) -> String {
    members
        .iter()
        .map(|(id, addr)| format!("{id}={addr}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn bad_record(dir: &Path) -> impl FnOnce(String) -> StartError + '_ {
    move |why| StartError::BadRecord {
        dir: dir.display().to_string(),
        why,
    }
}

/// The data dir's record as its files say (`cluster`, or the old `members`), if it has one.
fn read_record_file(dir: &Path) -> Result<Option<DirRecord>, StartError> {
    let read = |name: &str| match std::fs::read_to_string(dir.join(name)) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(data_dir_error(dir)(e)),
    };
    if let Some(text) = read(CLUSTER_FILE)? {
        return DirRecord::decode(&text).map(Some).map_err(bad_record(dir));
    }
    match read(MEMBERS_FILE_OLD)? {
        Some(text) => DirRecord::from_old_members(&text)
            .map(Some)
            .map_err(bad_record(dir)),
        None => Ok(None),
    }
}

fn data_dir_error(dir: &Path) -> impl FnOnce(std::io::Error) -> StartError + '_ {
    move |source| StartError::DataDir {
        dir: dir.display().to_string(),
        source,
    }
}

impl Node {
    /// Open the logs of the member's groups (`open_member_logs`, migrating a previous build's
    /// redb log first), after checking each group dir's `cluster` file against the flags.
    ///
    /// The checks come first and read only those small files next to the logs: opening a log
    /// may write to it (a migration, or the truncation of a torn tail after a crash), and a
    /// refused start must leave the data dir as it was. Group 0's dir is checked before any
    /// group's dir is made. The log's own record, checked by [`Node::start`], stays the
    /// authority for data dirs from before the file existed.
    pub fn open_log_stores(config: &ServerConfig) -> Result<Vec<LogStore<TypeConfig>>, StartError> {
        for group in 0..config.groups {
            let config = config.for_group(group);
            let dir = &config.data_dir;
            if dir.join(RESTORE_MARKER).exists() {
                return Err(StartError::RestoreUnfinished {
                    dir: dir.display().to_string(),
                });
            }
            if let Some(recorded) = read_record_file(dir)? {
                check_record(dir, &recorded, &config)?;
            }
            latchkey_log_store::create_dir_durably(dir).map_err(data_dir_error(dir))?;
        }
        open_member_logs(&config.data_dir, config.groups)
            .map_err(|e| StartError::LogStore(e.to_string()))
    }

    /// Starts group `group` of this member (`config` is [`ServerConfig::for_group`]'s), with
    /// the metrics and shutdown its groups share.
    pub async fn start<LS: NodeLogStore>(
        config: ServerConfig,
        group: u32,
        env: NodeEnv,
        log_store: LS,
        member: &MemberShared,
    ) -> Result<(Arc<Node>, mpsc::Receiver<RenewRequest>), StartError> {
        let shape = GroupShape::new(group, config.groups).ok_or_else(|| {
            StartError::Raft(format!("group {group} of {} groups", config.groups))
        })?;
        let clock = env.clock.clone();
        let dir = config.data_dir.clone();
        latchkey_log_store::create_dir_durably(&dir).map_err(data_dir_error(&dir))?;

        // The log's record of the cluster (or, in an older dir, of its founding member list),
        // then the file beside it (written only once the log's record agrees, so a refused
        // start leaves no file naming the wrong cluster).
        let recorded = match log_store
            .read_node_meta(META_CLUSTER)
            .map_err(StartError::LogStore)?
        {
            Some(bytes) => Some(
                DirRecord::decode(&String::from_utf8_lossy(&bytes)).map_err(bad_record(&dir))?,
            ),
            None => match log_store
                .read_node_meta(META_MEMBERS_OLD)
                .map_err(StartError::LogStore)?
            {
                Some(bytes) => Some(
                    DirRecord::from_old_members(&String::from_utf8_lossy(&bytes))
                        .map_err(bad_record(&dir))?,
                ),
                None => None,
            },
        };
        let record = match recorded {
            Some(r) => {
                check_record(&dir, &r, &config)?;
                DirRecord {
                    member: Some(config.id),
                    ..r
                }
            }
            None => DirRecord {
                cluster: named_cluster(&config)
                    .map(|(id, _)| id)
                    .unwrap_or_else(|| ClusterId::founded_by(&config.members())),
                member: Some(config.id),
                joined: config.join.is_some(),
                groups: config.groups,
                replicas: config.replicas,
            },
        };
        // Founding: a dir that was never started with --join initializes Raft with the flags'
        // member list if its log holds no membership yet (a fresh dir, or a crash between this
        // record and the initialization). A joining member waits to be added instead.
        let founding = !record.joined;
        let members = config.members();
        let placement = placement(&config, shape.group);
        let text = record.encode();
        log_store
            .write_node_meta(META_CLUSTER, text.as_bytes())
            .map_err(StartError::LogStore)?;
        latchkey_log_store::write_durably(&dir, CLUSTER_FILE, text.as_bytes())
            .map_err(data_dir_error(&dir))?;

        let leases = Arc::new(Mutex::new(Leases::new(config.plant)));
        let waiters = Arc::new(Waiters::default());
        let metrics = member.metrics.clone();
        let fsync_seconds = metrics.fsync_seconds.clone();
        log_store.observe_commits(Box::new(move |took| {
            fsync_seconds.observe(took.as_secs_f64())
        }));
        let watch = Arc::new(crate::observe::watch::WatchHub::default());
        let observer = Arc::new(Observer {
            waiters: waiters.clone(),
            leases: leases.clone(),
            clock: clock.clone(),
            metrics: metrics.clone(),
            probe: env.probe.clone(),
            node: config.id,
            group: shape.group,
            watch: watch.clone(),
        });
        let sm = LockStateMachine::open(&dir.join(SNAPSHOT_DIR), observer)
            .map_err(|e| StartError::StateMachine(e.to_string()))?;
        sm.set_table_bytes_max(config.table_bytes_max);
        sm.set_group_shape(shape);
        let state = sm.handle();
        // Events before the table this member starts from (its snapshot) were never seen here.
        watch.started_at(state.applied_index());
        // Sessions recovered from the snapshot get a lease from now; the entries replayed after
        // it add theirs through the observer.
        {
            let now = clock.now();
            let mut l = leases.lock().expect("leases lock");
            state.read(|t| {
                for s in t.sessions() {
                    l.recovered(s.id, s.ttl_ms, s.lease_mark_ms, now);
                }
            });
        }

        let peer_auth = Arc::new(
            crate::cluster::peer_auth::PeerAuth::with_table_bytes_max(
                config.id,
                record.cluster.clone(),
                config.table_bytes_max,
                config.cluster_secret.clone(),
            )
            .with_member_certificates(
                config
                    .tls
                    .as_ref()
                    .is_some_and(|tls| tls.requires_client_certs()),
            )
            .with_group(shape, config.replicas),
        );
        let peer_book = AddressBook::default();
        let raft_config = Arc::new(
            config
                .raft_config()
                .validate()
                .map_err(|e| StartError::Raft(e.to_string()))?,
        );
        let succession = Arc::new(crate::cluster::peer::Succession::default());
        let held_back = log_store.held_back();
        let raft = Raft::new(
            config.id,
            raft_config,
            crate::cluster::peer::PeerNetwork {
                succession: succession.clone(),
                connector: env.connector.clone(),
                auth: peer_auth.clone(),
                reachable: Default::default(),
                dial: config.peer_dial.clone(),
                book: peer_book.clone(),
            },
            log_store,
            sm,
        )
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;

        let initialized = match raft.is_initialized().await {
            Ok(initialized) => initialized,
            Err(e) => {
                // This group's core runs already: stop it with the refused start.
                let _ = raft.shutdown().await;
                return Err(StartError::Raft(e.to_string()));
            }
        };
        let mut found_later = None;
        let placed_here = placement.is_empty() || placement.iter().any(|(id, _)| *id == config.id);
        if founding && !initialized && !placed_here {
            // Replica subsets (`--replicas`): another R members found this group; this
            // member runs it without a membership until a `cluster add` makes it one.
            tracing::info!(
                group = shape.group,
                replicas = ?placement.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
                "not one of this group's replicas: it is served by its replicas"
            );
        } else if founding && !initialized {
            let nodes: BTreeMap<u64, BasicNode> = members
                .iter()
                .filter(|(id, _)| placement.is_empty() || placement.iter().any(|(p, _)| p == *id))
                .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
                .collect();
            // Leaders spread over the members (issue #16): group g of a cluster of several is
            // initialized first by its founder, the (g mod N)-th member by id, which then
            // campaigns alone (the others, with no membership yet, cannot) and so leads it.
            // The others initialize it only if they have heard nothing of it a few election
            // timeouts later (its founder is down), so that a group never waits for one member.
            // With replica subsets only the group's replicas found it, with themselves as its
            // voters (`replicas_of`: the founder first).
            let founder = founder_of(shape.group, members.keys().copied());
            if (config.groups == 1 && placement.is_empty()) || founder == config.id {
                // Every member of a new cluster may call this with the same list; openraft
                // lets only one initialization win and the others join its term.
                if let Err(e) = raft.initialize(nodes).await {
                    tracing::info!("initialize: {e} (another member may have initialized first)");
                }
            } else {
                found_later = Some(nodes);
            }
        } else if !initialized {
            tracing::info!(
                cluster = %record.cluster,
                "not a member yet: waiting to be added (`latchkey cluster add {}=ADDR`)",
                config.id
            );
        }
        let (renew_tx, renew_rx) = mpsc::channel(limits::RENEW_QUEUE_CAPACITY);
        let node = Arc::new(Node {
            placement,
            id: config.id,
            shape,
            raft,
            state,
            clock,
            entropy: env.entropy.clone(),
            leases,
            waiters,
            shutdown: member.shutdown.clone(),
            config,
            renewals: renew_tx,
            metrics,
            probe: env.probe.clone(),
            peer_auth,
            cluster: record.cluster,
            peer_book,
            watch,
            succession,
            leader_contact: Default::default(),
            found_later: Mutex::new(found_later),
            held_back,
            member_groups: member.groups.clone(),
        });
        Ok((node, renew_rx))
    }

    /// Whether this group's log is shared with other groups and so may hold it back
    /// ([`Node::compact_log`]).
    pub fn shares_log(&self) -> bool {
        self.held_back.is_some()
    }

    /// Keeps this group from holding back the member's shared log: a member's groups share one
    /// log, whose segments go from the front only, each once every group purged its entries in
    /// it, and a quiet group (its few entries never reach the snapshot policy) would keep every
    /// segment on disk. Every `LOG_COMPACTION_CHECK_MS`, once the log has outgrown
    /// `LOG_SEGMENTS_HELD_BACK_MAX` segments and this group's entries hold the oldest back, it
    /// snapshots (if its snapshot does not cover them yet and it has applied them) and then
    /// purges up to them: what openraft does after `--snapshot-every-entries`, sooner. Nothing
    /// it purges is needed: the snapshot covers it.
    pub async fn compact_log(self: Arc<Node>) {
        let Some(held_back) = self.held_back.as_ref() else {
            return;
        };
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(limits::LOG_COMPACTION_CHECK_MS)) => {}
            }
            let Some(upto) = held_back() else {
                continue;
            };
            let (snapshot, applied) = {
                let metrics = self.raft.metrics();
                let m = metrics.borrow_watched();
                (
                    m.snapshot.as_ref().map_or(0, |s| s.index()),
                    m.last_applied.as_ref().map_or(0, |a| a.index()),
                )
            };
            let triggered = if snapshot >= upto {
                tracing::info!(
                    group = self.shape.group,
                    upto,
                    "purging the entries that hold back the member's shared Raft log"
                );
                self.raft.trigger().purge_log(upto).await
            } else if applied >= upto {
                tracing::info!(
                    group = self.shape.group,
                    upto,
                    snapshot,
                    "snapshotting to purge the entries that hold back the member's shared Raft log"
                );
                self.raft.trigger().snapshot().await
            } else {
                // Not applied here yet: a snapshot could not cover them; ask again later.
                continue;
            };
            if let Err(e) = triggered {
                tracing::warn!(group = self.shape.group, error = %e, "log compaction: the Raft core stopped");
                return;
            }
        }
    }

    /// Initializes this group if its founder (`founder_of`) has not made it known here within
    /// `limits::FOUNDING_WAIT_ELECTIONS` election timeouts: the founder is down, and the group
    /// must not wait for it. Returns at once for a group this member founds, or one that is
    /// not new.
    pub async fn found_later(self: Arc<Node>) {
        let Some(nodes) = self.found_later.lock().expect("found_later lock").take() else {
            return;
        };
        let wait = Duration::from_millis(
            self.config.election_timeout_max_ms * limits::FOUNDING_WAIT_ELECTIONS,
        );
        tokio::select! {
            () = self.shutdown.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        if self.raft.is_initialized().await.unwrap_or(true) {
            return;
        }
        tracing::info!(
            group = self.shape.group,
            "the group's founder has not initialized it: initializing it here"
        );
        if let Err(e) = self.raft.initialize(nodes).await {
            tracing::info!("initialize: {e} (another member may have initialized first)");
        }
    }

    /// Leader rebalance (issue #16): while this member leads a group whose preferred leader
    /// ([`founder_of`] over the voters) is another member, and that member has answered within
    /// an election timeout with a log at most `REBALANCE_LAG_ENTRIES_MAX` behind, continuously
    /// for `rebalance_after_ms` in this term, hand it the group (openraft's leader transfer).
    /// So leaderships return to where the cluster spread them after a member comes back. Only
    /// with several groups: a single group has nothing to spread.
    ///
    /// A transfer is an election like any other for the leases: the successor resumes them at
    /// a full TTL after a quorum elected it, and that quorum overlaps the one that confirmed
    /// each renewal the old leader acknowledged, after the renewal arrived (see
    /// `peer::check_leadership_transfer`). While transferring, openraft refuses this leader's
    /// reads and writes (`ForwardToLeader`), so it acknowledges nothing more.
    pub async fn rebalance_leadership(self: Arc<Node>) {
        if self.config.groups == 1 || self.config.rebalance_after_ms == 0 {
            return;
        }
        let settle = Duration::from_millis(self.config.rebalance_after_ms);
        let answering = Duration::from_millis(self.config.election_timeout_min_ms);
        // (term, member) and since when that member has been ready to take over in that term.
        let mut ready: Option<(u64, u64, tokio::time::Instant)> = None;
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(limits::REBALANCE_CHECK_MS)) => {}
            }
            let successor = {
                let metrics = self.raft.metrics();
                let m = metrics.borrow_watched();
                self.preferred_successor(&m, answering)
                    .map(|to| (m.current_term, to))
            };
            let Some((term, to)) = successor else {
                ready = None;
                continue;
            };
            let now = tokio::time::Instant::now();
            let since = match ready {
                Some((t, m, since)) if t == term && m == to => since,
                _ => {
                    ready = Some((term, to, now));
                    continue;
                }
            };
            if now.duration_since(since) < settle {
                continue;
            }
            ready = None;
            tracing::info!(
                group = self.shape.group,
                term,
                successor = to,
                "handing the group to its preferred leader, member {to}"
            );
            self.metrics.leader_transfers.inc();
            self.probe.event(
                self.id,
                self.shape.group,
                ProbeEvent::LeaderTransferStarted { term, to },
            );
            if let Err(e) = self.raft.trigger().transfer_leader(to).await {
                tracing::warn!(group = self.shape.group, "leader transfer: {e}");
                return;
            }
        }
    }

    /// The member this leader should hand the group to now, if any: the group's preferred
    /// leader, when that is not this member, it is a voter, it answered within `answering`,
    /// and its log is at most `REBALANCE_LAG_ENTRIES_MAX` entries behind.
    fn preferred_successor(
        &self,
        m: &openraft::RaftMetrics<TypeConfig>,
        answering: Duration,
    ) -> Option<u64> {
        if m.state != ServerState::Leader {
            return None;
        }
        let voters: Vec<u64> = m.membership_config.membership().voter_ids().collect();
        if voters.len() < 2 {
            return None;
        }
        let preferred = match self.placement.first() {
            // Replica subsets: the member that founded the group, while it is a voter.
            Some((founder, _)) if voters.contains(founder) => *founder,
            _ => founder_of(self.shape.group, voters),
        };
        if preferred == self.id {
            return None;
        }
        let matched = m.replication.as_ref()?.get(&preferred)?.as_ref()?.index;
        let last = m.last_log_index.unwrap_or(0);
        if last.saturating_sub(matched) > limits::REBALANCE_LAG_ENTRIES_MAX {
            return None;
        }
        let acked = m.heartbeat.as_ref()?.get(&preferred)?.as_ref()?;
        (openraft::Instant::elapsed(&**acked) <= answering).then_some(preferred)
    }

    /// The leader's duties, for as long as the node runs, in one task so that their log
    /// writes are ordered: when this node becomes leader, restart (or resume) every lease and
    /// mark every session; while it is leader, write logged renewals for marked sessions, mark
    /// sessions that go unrenewed for half their TTL, and expire sessions whose lease ran out.
    pub async fn lease_duties(self: Arc<Node>, mut renewals: mpsc::Receiver<RenewRequest>) {
        // The server metrics change only with the role, the vote and the membership; the full
        // metrics change with every append, commit and apply, and woke this loop (a scan of
        // every lease) once per entry under load (issue #11's profile).
        let mut metrics = self.raft.server_metrics();
        let mut led_term: Option<u64> = None;
        let mut retry_at: Option<tokio::time::Instant> = None;
        let mut leading = false;
        loop {
            let (leader_now, term) = {
                let m = metrics.borrow_and_update();
                (
                    m.state == ServerState::Leader && m.current_leader == Some(self.id),
                    m.vote.leader_id.term,
                )
            };
            if leading && !leader_now {
                // A leader hears from no leader: its contact stamp dates from before it was
                // elected. It was in touch until now; its successor's appends take over.
                self.leader_contact.heard();
            }
            leading = leader_now;
            if led_term.is_some() && (!leader_now || led_term != Some(term)) {
                // Out of office, or re-elected in a later term: this term's deadlines are not
                // the new term's until it resumes them.
                self.leases.lock().expect("leases lock").stepped_down();
                led_term = None;
            }
            if leader_now && led_term.is_none() && retry_at.is_none_or(|t| self.clock.now() >= t) {
                if self.resume_leases(term).await {
                    led_term = Some(term);
                    retry_at = None;
                } else {
                    retry_at = Some(
                        self.clock.now() + Duration::from_millis(limits::LEASE_WRITE_RETRY_MS),
                    );
                }
            }
            if led_term.is_some() && retry_at.is_none_or(|t| self.clock.now() >= t) {
                self.leases
                    .lock()
                    .expect("leases lock")
                    .mark_stale(self.clock.now());
                let written =
                    self.log_marks().await && self.expire_due().await && self.expire_waits().await;
                // A write that failed (typically "not the leader" in the moment around an
                // election) is retried after a pause, not in a tight loop.
                retry_at = (!written).then(|| {
                    self.clock.now() + Duration::from_millis(limits::LEASE_WRITE_RETRY_MS)
                });
            }
            // Only a leader acts on deadlines (a follower's are stale and would wake it in a
            // busy loop).
            let wake = {
                let now = self.clock.now();
                let cap = now + Duration::from_millis(limits::LEASE_TICK_MS);
                let next = match (led_term, retry_at) {
                    (None, _) => None,
                    (Some(_), Some(t)) => Some(t),
                    (Some(_), None) => self.leases.lock().expect("leases lock").next_deadline(),
                };
                next.map_or(cap, |d| d.clamp(now + Duration::from_millis(1), cap))
            };
            tokio::select! {
                changed = metrics.changed() => if changed.is_err() { return },
                Some(req) = renewals.recv() => {
                    // Every keepalive waiting for a logged renewal goes into one entry: after a
                    // failover every session needs one at once, and one commit per keepalive
                    // would let clients' deadlines pass in the queue.
                    let mut batch = vec![req];
                    let mut sessions = batch[0].sessions.len();
                    while sessions < limits::LEASE_RENEW_BATCH_MAX {
                        match renewals.try_recv() {
                            Ok(more) => {
                                sessions += more.sessions.len();
                                batch.push(more);
                            }
                            Err(_) => break,
                        }
                    }
                    self.renew_through_log(batch).await
                }
                _ = crate::clock::sleep_until(&*self.clock, wake) => {}
                _ = self.shutdown.cancelled() => return,
            }
        }
    }

    /// Keeps the peer address book in step with the Raft membership, for as long as the node
    /// runs. And a single-member cluster restarted on another address records its new address
    /// itself once it leads: nobody else could (with more members, `cluster move` does it).
    pub async fn follow_membership(self: Arc<Node>) {
        let mut metrics = self.raft.server_metrics();
        // Where it listens (and listens for members), unless that is a wildcard (0.0.0.0),
        // which names no host: then its founding `--peers` entry. (Not `--peers` first: a
        // founder moved by `cluster move` keeps its founding list on its command line.)
        let wildcard = self.config.listen.ip().is_unspecified()
            || self
                .config
                .peer_listen
                .is_some_and(|p| p.ip().is_unspecified());
        let advertised = if wildcard {
            self.config
                .members()
                .remove(&self.id)
                .unwrap_or_else(|| self.config.own_addr())
        } else {
            self.config.own_addr()
        };
        loop {
            let (book, moved_alone) = {
                let m = metrics.borrow_and_update();
                let membership = m.membership_config.membership();
                let recorded: BTreeMap<u64, &str> = membership
                    .nodes()
                    .map(|(id, n)| (*id, n.addr.as_str()))
                    .collect();
                let alone = membership.voter_ids().eq([self.id]) && recorded.len() == 1;
                let moved = recorded.get(&self.id).is_some_and(|a| *a != advertised);
                // Members dial each other at the peer part of their addresses.
                let book: BTreeMap<u64, String> = recorded
                    .iter()
                    .map(|(id, a)| (*id, MemberAddr::split(a).peer().to_owned()))
                    .collect();
                let committed =
                    m.committed_membership_config.log_id() == m.membership_config.log_id();
                (
                    book,
                    alone && moved && committed && m.state == ServerState::Leader,
                )
            };
            *self.peer_book.write().expect("address book lock") = book;
            if moved_alone {
                tracing::info!(addr = %advertised, "this member moved: recording its new address");
                if let Err(e) = self.move_member(self.id, advertised.clone()).await {
                    tracing::warn!("recording this member's new address failed, will retry: {e}");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(limits::LEASE_WRITE_RETRY_MS)) => continue,
                        _ = self.shutdown.cancelled() => return,
                    }
                }
            }
            tokio::select! {
                changed = metrics.changed() => if changed.is_err() { return },
                _ = self.shutdown.cancelled() => return,
            }
        }
    }

    /// This node leads `term`: resume every lease, but only once it has applied everything up
    /// to its own first entry of the term. Entries the old leader committed (a mark, a logged
    /// renewal that lifted one) may not be applied here yet when the election is won; a lease
    /// resumed from the table before them would start from a mark already lifted, and the
    /// too-short deadline would be logged as this leader's own mark (issue #9, bug 2). openraft's
    /// read index is that first entry (or a later committed one) and `ensure_linearizable`
    /// returns once it is applied. False if leadership of `term` could not be confirmed.
    async fn resume_leases(&self, term: u64) -> bool {
        if !self.config.plant.resume_before_applied {
            let confirmed = tokio::time::timeout(
                Duration::from_millis(limits::PROPOSE_TIMEOUT_MS),
                self.raft.ensure_linearizable(ReadPolicy::ReadIndex),
            )
            .await;
            match confirmed {
                Ok(Ok(read)) if read.committed_leader_id().term == term => {}
                Ok(Ok(read)) => {
                    tracing::debug!(term, read = %read, "leadership moved on before leases resumed");
                    return false;
                }
                Ok(Err(e)) => {
                    tracing::debug!(term, "cannot confirm leadership to resume leases yet: {e}");
                    return false;
                }
                Err(_) => return false,
            }
        }
        tracing::info!(term, "became leader: resuming every session lease");
        let now = self.clock.now();
        // Read the table with the lease table locked: an entry applied meanwhile then reaches
        // the lease table only after the resume (the observer runs after the state machine
        // released the table), never before it to be undone by it.
        let mut leases = self.leases.lock().expect("leases lock");
        let (live, applied_index): (Vec<_>, u64) = self
            .state
            .read(|t| (t.sessions().collect(), t.last_index()));
        let stale_marks = leases.resume(term, live, now);
        let resumed = if self.probe.wants_resumed_leases() {
            leases.remaining(now)
        } else {
            Vec::new()
        };
        drop(leases);
        self.probe.event(
            self.id,
            self.shape.group,
            ProbeEvent::LeasesResumed {
                term,
                applied_index,
                stale_marks,
                leases: resumed,
            },
        );
        true
    }

    /// Propose the marks this leader made that have not committed yet, in batches. A batch
    /// that fails stays due; it is computed afresh and proposed again later. False on failure.
    async fn log_marks(&self) -> bool {
        loop {
            let marks = self
                .leases
                .lock()
                .expect("leases lock")
                .marks_to_log(self.clock.now());
            if marks.is_empty() {
                return true;
            }
            match self
                .propose(Op::MarkLeases {
                    marks: marks.clone(),
                })
                .await
            {
                Ok(_) => self
                    .leases
                    .lock()
                    .expect("leases lock")
                    .marks_logged(&marks),
                Err(e) => {
                    tracing::debug!("lease marks not committed yet, will retry: {e}");
                    return false;
                }
            }
        }
    }

    /// Renew marked sessions through the log, then in memory; answer with those renewed.
    async fn renew_through_log(&self, batch: Vec<RenewRequest>) {
        let mut ids: Vec<SessionId> = batch
            .iter()
            .flat_map(|r| r.sessions.iter().map(|(id, _)| *id))
            .collect();
        ids.sort();
        ids.dedup();
        let result = match self.propose(Op::RenewLeases { ids }).await {
            Ok(Outcome::LeasesRenewed { ids: live }) => {
                self.metrics.logged_renewals.inc_by(live.len() as u64);
                self.probe.event(
                    self.id,
                    self.shape.group,
                    ProbeEvent::LeasesRenewedThroughLog {
                        sessions: live.clone(),
                    },
                );
                Ok(live)
            }
            Ok(other) => Err(ApiError::Raft(format!("unexpected outcome {other:?}"))),
            Err(e) => Err(e),
        };
        for req in batch {
            let answer = match &result {
                Ok(live) => {
                    let mut leases = self.leases.lock().expect("leases lock");
                    Ok(req
                        .sessions
                        .iter()
                        .filter(|(id, arrived)| {
                            live.binary_search(id).is_ok() && leases.renew_logged(*id, *arrived)
                        })
                        .map(|(id, _)| *id)
                        .collect())
                }
                Err(e) => Err(e.clone()),
            };
            let _ = req.reply.send(answer);
        }
    }

    /// End the waits whose wait timeout has passed on this leader's wall clock. A release
    /// already passes such waiters over; this frees them from their queues (and answers their
    /// long-polls) when no release comes. False if it did not commit.
    async fn expire_waits(&self) -> bool {
        loop {
            let due = self
                .state
                .read(|t| t.next_wait_end_ms())
                .is_some_and(|end| end <= self.clock.wall_ms());
            if !due {
                return true;
            }
            match self.propose(Op::ExpireWaits).await {
                Ok(Outcome::WaitsExpired { count }) => {
                    self.probe.event(
                        self.id,
                        self.shape.group,
                        ProbeEvent::WaitsExpired { count },
                    );
                    if count == 0 {
                        return true;
                    }
                }
                Ok(other) => {
                    tracing::warn!("unexpected outcome of a wait expiry: {other:?}");
                    return true;
                }
                Err(e) => {
                    tracing::debug!("wait expiry not committed yet, will retry: {e}");
                    return false;
                }
            }
        }
    }

    /// Propose the expiry of every session whose lease ran out. False if it did not commit.
    async fn expire_due(&self) -> bool {
        let due = self
            .leases
            .lock()
            .expect("leases lock")
            .take_expired(self.clock.now());
        if due.is_empty() {
            return true;
        }
        match self.propose(Op::ExpireSessions { ids: due.clone() }).await {
            Ok(Outcome::SessionsExpired { ids }) => {
                tracing::info!(sessions = ?ids, "session leases ran out: expired");
                self.probe.event(
                    self.id,
                    self.shape.group,
                    ProbeEvent::SessionsExpired { sessions: ids },
                );
                true
            }
            Ok(other) => {
                tracing::warn!(sessions = ?due, "unexpected outcome of an expiry: {other:?}");
                true
            }
            Err(e) => {
                tracing::debug!(sessions = ?due, "expiry not committed yet, will retry: {e}");
                self.leases.lock().expect("leases lock").expiry_failed(&due);
                false
            }
        }
    }
}

/// Marked sessions that a keepalive found, to renew through the log; answered with the ids
/// renewed.
pub struct RenewRequest {
    pub sessions: Vec<(SessionId, tokio::time::Instant)>,
    pub reply: oneshot::Sender<Result<Vec<SessionId>, ApiError>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A data dir's group count and replica count are fixed when its cluster is founded: a
    /// start with either changed is refused before anything is opened.
    #[test]
    fn a_start_with_another_group_or_replica_count_is_refused() {
        let peers: BTreeMap<u64, String> = (1..=4).map(|i| (i, format!("h:{i}"))).collect();
        let mut config =
            ServerConfig::cluster(2, "127.0.0.1:1".parse().unwrap(), "unused".into(), peers);
        config.groups = 4;
        config.replicas = 3;
        let recorded = DirRecord {
            cluster: ClusterId::founded_by(&config.peers),
            member: Some(2),
            joined: false,
            groups: 4,
            replicas: 3,
        };
        let dir = Path::new("unused");
        assert!(check_record(dir, &recorded, &config).is_ok());
        let every = ServerConfig {
            replicas: 0,
            ..config.clone()
        };
        assert!(matches!(
            check_record(dir, &recorded, &every),
            Err(StartError::ReplicasMismatch {
                recorded: 3,
                given: 0,
                ..
            })
        ));
        let fewer = ServerConfig {
            groups: 2,
            ..config.clone()
        };
        assert!(matches!(
            check_record(dir, &recorded, &fewer),
            Err(StartError::GroupsMismatch { .. })
        ));
        // Member 2 founds group 1 and replicates groups 0, 1 and 3 (placement, founder first).
        let placed: Vec<Vec<u64>> = (0..4)
            .map(|g| {
                placement(&config, g)
                    .into_iter()
                    .map(|(id, _)| id)
                    .collect()
            })
            .collect();
        assert_eq!(
            placed,
            vec![vec![1, 2, 3], vec![2, 3, 4], vec![3, 4, 1], vec![4, 1, 2]]
        );
        assert!(
            placement(&every, 0).is_empty(),
            "every member: no placement"
        );
    }

    #[test]
    fn a_dir_record_round_trips_and_an_old_member_list_keeps_its_cluster() {
        let founders: BTreeMap<u64, String> = [(1, "h:1".to_owned()), (2, "h:2".to_owned())].into();
        let record = DirRecord {
            cluster: ClusterId::founded_by(&founders),
            member: Some(2),
            joined: true,
            groups: 1,
            replicas: 0,
        };
        assert_eq!(DirRecord::decode(&record.encode()), Ok(record.clone()));
        // A dir of a sharded cluster records its group count; one without the line has one.
        let sharded = DirRecord {
            groups: 8,
            ..record.clone()
        };
        assert!(sharded.encode().contains("groups=8\n"));
        assert_eq!(DirRecord::decode(&sharded.encode()), Ok(sharded));
        assert!(!record.encode().contains("groups"));
        // So does a cluster of replica subsets its replica count; one without the line has
        // every member in every group.
        let placed = DirRecord {
            groups: 6,
            replicas: 3,
            ..record.clone()
        };
        assert!(placed.encode().contains("replicas=3\n"));
        assert_eq!(DirRecord::decode(&placed.encode()), Ok(placed));
        assert!(!record.encode().contains("replicas"));
        for bad in ["0", "2", "x"] {
            let text = format!("cluster={}\nreplicas={bad}\n", record.cluster);
            assert!(DirRecord::decode(&text).is_err(), "{text}");
        }
        for bad in ["0", "65", "x"] {
            let text = format!("cluster={}\ngroups={bad}\n", record.cluster);
            assert!(DirRecord::decode(&text).is_err(), "{text}");
        }
        // A data dir of a release before membership changes recorded `1=h:1,2=h:2`: it keeps
        // the cluster (and so the peer fingerprint) it had.
        let old = DirRecord::from_old_members("1=h:1,2=h:2").unwrap();
        assert_eq!(old.cluster, record.cluster);
        assert_eq!((old.member, old.joined), (None, false));
        assert!(DirRecord::decode("cluster=xyz\n").is_err());
        assert!(DirRecord::decode("member=1\n").is_err());
    }

    /// A member's groups share group 0's log (one writer, one fsync per batch); a group that
    /// has a log of its own, made by the build before they shared one, keeps it.
    #[test]
    fn groups_share_one_log_except_those_an_older_build_gave_their_own() {
        let fresh = tempfile::tempdir().unwrap();
        {
            let logs = open_member_logs(fresh.path(), 3).unwrap();
            logs[2].write_meta("k", b"two").unwrap();
            logs[1].write_meta("k", b"one").unwrap();
            assert_eq!(logs[0].read_meta("k").unwrap(), None);
        }
        for g in 1..3 {
            assert!(!crate::config::group_data_dir(fresh.path(), g)
                .join(LOG_DIR)
                .exists());
        }
        let logs = open_member_logs(fresh.path(), 3).unwrap();
        assert_eq!(
            logs[2].read_meta("k").unwrap().as_deref(),
            Some(&b"two"[..])
        );
        assert_eq!(
            logs[1].read_meta("k").unwrap().as_deref(),
            Some(&b"one"[..])
        );
        drop(logs);

        // The older layout: group 1 with `group-1/raft-log`.
        let old = tempfile::tempdir().unwrap();
        let own = crate::config::group_data_dir(old.path(), 1).join(LOG_DIR);
        LogStore::<TypeConfig>::open(&own)
            .unwrap()
            .write_meta("k", b"old one")
            .unwrap();
        {
            let logs = open_member_logs(old.path(), 3).unwrap();
            assert_eq!(
                logs[1].read_meta("k").unwrap().as_deref(),
                Some(&b"old one"[..])
            );
            logs[2].write_meta("k", b"two").unwrap();
            logs[1].write_meta("k2", b"still own").unwrap();
        }
        let reread = LogStore::<TypeConfig>::open(&own).unwrap();
        assert_eq!(
            reread.read_meta("k2").unwrap().as_deref(),
            Some(&b"still own"[..])
        );
        drop(reread);
        let logs = open_member_logs(old.path(), 3).unwrap();
        assert_eq!(
            logs[2].read_meta("k").unwrap().as_deref(),
            Some(&b"two"[..])
        );
        assert!(!crate::config::group_data_dir(old.path(), 2)
            .join(LOG_DIR)
            .exists());
    }

    /// A data dir of a build before the segment log holds `raft-log.redb`: the first open moves
    /// its entries and keys into `raft-log/` and keeps the old file; a second open finds the
    /// segment log and migrates nothing.
    #[tokio::test]
    async fn a_data_dir_with_a_redb_log_is_migrated_once() {
        use latchkey_log_store::VALUE_FORMAT_VERSION;
        use openraft::entry::RaftEntry;
        use openraft::vote::RaftLeaderId;
        use openraft::{RaftLogReader, RaftTypeConfig};
        use redb::TableDefinition;

        let dir = tempfile::tempdir().unwrap();
        let log_id = |i| {
            latchkey_raft::LogId::new(
                <TypeConfig as RaftTypeConfig>::LeaderId::new(1, 1).to_committed(),
                i,
            )
        };
        {
            let db = redb::Database::create(dir.path().join(OLD_LOG_FILE)).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut log = txn
                    .open_table(TableDefinition::<u64, &[u8]>::new("raft_log"))
                    .unwrap();
                for i in 0..=3 {
                    let entry = latchkey_raft::Entry::new_blank(log_id(i));
                    let bytes =
                        latchkey_core::versioned::encode(VALUE_FORMAT_VERSION, &entry).unwrap();
                    log.insert(i, bytes.as_slice()).unwrap();
                }
                let mut meta = txn
                    .open_table(TableDefinition::<&str, &[u8]>::new("app_meta"))
                    .unwrap();
                meta.insert(META_CLUSTER, &b"the record"[..]).unwrap();
            }
            txn.commit().unwrap();
        }
        for open in 1..=2 {
            let mut log = open_log_dir(dir.path()).unwrap();
            let entries = log.try_get_log_entries(..).await.unwrap();
            let ids: Vec<_> = entries.iter().map(|e| e.log_id()).collect();
            assert_eq!(ids, (0..=3).map(log_id).collect::<Vec<_>>(), "open {open}");
            assert_eq!(
                log.read_meta(META_CLUSTER).unwrap().as_deref(),
                Some(&b"the record"[..])
            );
            drop(log);
            assert!(dir.path().join(LOG_DIR).is_dir());
            assert!(!dir.path().join(OLD_LOG_FILE).exists());
            assert!(dir.path().join("raft-log.redb.migrated").is_file());
        }
    }
}
