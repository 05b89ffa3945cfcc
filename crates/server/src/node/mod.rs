//! The node and its groups: the domain layer between the APIs and the Raft log.
//!
//! - this file: [`Node`], one member of one Raft group, and its start-up (below);
//!   `data_dir.rs`: the data dir's record, its logs, and who founds each group;
//!   `duties.rs`: the tasks the node runs for as long as it lives (the lease task among them).
//! - [`ops`]: the node's operations in domain types (propose, linearizable read, acquire,
//!   keepalive, the operator's calls), which both APIs and the lease task call, with
//!   `Node::authorize`, the one access check of both APIs.
//! - [`membership`]: membership changes (add, remove, move) and the node's status and role.
//! - [`groups`]: with `--groups G`, one `Node` per group and which group a request goes to.
//! - [`backup`]: the backup file of a group's table, and the restore that seeds a new data dir.
//!
//! Inside the folder the files extend `Node` (`impl Node` blocks) and use this file, never
//! the other way round: `Node` reaches its member's other groups through [`OtherGroups`], which
//! `groups.rs` implements.
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
//! The tasks a node runs for as long as it lives are in `duties.rs`, each documented on its
//! function: [`Node::lease_duties`] (the lease task: every lease log write comes from it, so
//! their log order is the order they were decided in; it wakes on openraft's *server* metrics,
//! which change with role and vote, on renewals and on its deadlines, never once per entry),
//! [`Node::follow_membership`] (the peer address book in step with the membership),
//! [`Node::compact_log`] (only for a log shared by groups) and [`Node::rebalance_leadership`]
//! (only with several groups).

pub mod backup;
pub mod data_dir;
mod delays;
mod duties;
mod gather;
pub mod groups;
pub mod membership;
pub mod ops;

pub use data_dir::StartError;
use data_dir::{
    bad_record, check_record, data_dir_error, founder_of, named_cluster, placement,
    read_record_file, DirRecord, CLUSTER_FILE, META_CLUSTER, META_MEMBERS_OLD, RESTORE_MARKER,
    SNAPSHOT_DIR,
};
pub(crate) use data_dir::{founder_record, members_text, open_member_logs};

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use latchkey_core::{limits, GroupShape, IdentityUsage, SessionId};
use tokio::sync::{mpsc, oneshot};

use crate::error::ApiError;
use crate::observe::metrics::Metrics;
use latchkey_log_store::LogStore;
use latchkey_raft::{LockStateMachine, Raft, StateHandle, TypeConfig};
use openraft::BasicNode;
use tokio_util::sync::CancellationToken;

use crate::clock::{SharedClock, SharedEntropy};
use crate::cluster::peer::AddressBook;
use crate::cluster::peer_auth::ClusterId;
use crate::config::{NodeEnv, ServerConfig};
use crate::lease::leases::Leases;
use crate::lease::waiters::{Observer, Waiters};

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

/// What the groups of one member share: its metrics, the token that ends its serving, and
/// the member's [`Groups`](groups::Groups).
#[derive(Clone)]
pub struct MemberShared {
    pub metrics: Arc<Metrics>,
    /// Cancelled when the member begins to shut down; every group's long-polls end on it.
    pub shutdown: CancellationToken,
    /// The member's groups, set once by `Groups::new` when every group's node has started.
    pub groups: MemberGroups,
    /// Each identity's quota-counted acquires between their check and their entry's apply
    /// (`Node::acquire`), over all the member's groups.
    pub quota_in_flight: Arc<QuotaInFlight>,
}

/// Quota-counted requests checked but not yet applied, per identity (`Node::acquire`): a
/// quota check counts them with what the tables hold, so that calls of one identity that run
/// at once (a `Batch` call's operations, concurrent calls on its connections) cannot each
/// pass on the same count. A request sent again while in flight (a retry racing its first
/// attempt, same session and seq) shares its first attempt's place and is counted once. An
/// identity has an entry only while it has such a request in flight: at most the member's
/// calls in flight.
#[derive(Default)]
pub struct QuotaInFlight(Mutex<std::collections::HashMap<String, InFlight>>);

/// One identity's requests in flight: what they add to its counts, and each request's
/// attempts in flight (by session and seq).
#[derive(Default)]
struct InFlight {
    usage: IdentityUsage,
    requests: std::collections::HashMap<(SessionId, u64), usize>,
}

/// One request's place in [`QuotaInFlight`], given back when dropped (after its entry
/// applied, or when the call ends without one: also when it is cancelled before its entry
/// applied, which docs/securing.md names as an overshoot).
pub struct QuotaReservation {
    in_flight: Arc<QuotaInFlight>,
    identity: String,
    request: (SessionId, u64),
    waiting: usize,
    delays: usize,
}

impl QuotaInFlight {
    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, InFlight>> {
        // Nothing panics while holding it; a poisoned map is still consistent.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reserves `waiting` and `delays` for request `request` of `identity` if `fits` accepts
    /// `usage` (its tables' count, read by the caller before: the scan runs outside this
    /// lock) plus what the identity has in flight; an attempt of a request already in flight
    /// shares its place, unchecked.
    pub fn reserve<E>(
        self: &Arc<Self>,
        identity: &str,
        request: (SessionId, u64),
        usage: IdentityUsage,
        waiting: usize,
        delays: usize,
        fits: impl FnOnce(&IdentityUsage) -> Result<(), E>,
    ) -> Result<QuotaReservation, E> {
        let mut map = self.map();
        let mine = map.get(identity);
        let (waiting, delays) = match mine.and_then(|m| m.requests.get(&request)) {
            Some(_) => (0, 0),
            None => {
                let mut total = usage;
                if let Some(mine) = mine {
                    total.waiting += mine.usage.waiting;
                    total.delays += mine.usage.delays;
                }
                fits(&total)?;
                (waiting, delays)
            }
        };
        let mine = map.entry(identity.to_owned()).or_default();
        mine.usage.waiting += waiting;
        mine.usage.delays += delays;
        *mine.requests.entry(request).or_default() += 1;
        Ok(QuotaReservation {
            in_flight: self.clone(),
            identity: identity.to_owned(),
            request,
            waiting,
            delays,
        })
    }
}

impl Drop for QuotaReservation {
    fn drop(&mut self) {
        let mut map = self.in_flight.map();
        if let Some(mine) = map.get_mut(&self.identity) {
            mine.usage.waiting -= self.waiting;
            mine.usage.delays -= self.delays;
            if let Some(n) = mine.requests.get_mut(&self.request) {
                *n -= 1;
                if *n == 0 {
                    mine.requests.remove(&self.request);
                }
            }
            if mine.requests.is_empty() {
                map.remove(&self.identity);
            }
        }
    }
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
            quota_in_flight: Arc::default(),
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
    /// The member's quota reservations ([`MemberShared::quota_in_flight`]).
    pub(crate) quota_in_flight: Arc<QuotaInFlight>,
    /// Client operations gathered for this node's next entry (`gather.rs`, issue #35).
    gather: gather::Gather,
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
        sm.set_table_plant(config.plant.table);
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
            .with_group(shape, config.replicas)
            .with_http_addr(config.http_advertise()),
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
            quota_in_flight: member.quota_in_flight.clone(),
            gather: gather::Gather::default(),
        });
        Ok((node, renew_rx))
    }

    /// Whether this group's log is shared with other groups and so may hold it back
    /// ([`Node::compact_log`]).
    pub fn shares_log(&self) -> bool {
        self.held_back.is_some()
    }
}

/// Marked sessions that a keepalive found, to renew through the log; answered with the ids
/// renewed.
pub struct RenewRequest {
    pub sessions: Vec<(SessionId, tokio::time::Instant)>,
    pub reply: oneshot::Sender<Result<Vec<SessionId>, ApiError>>,
}
