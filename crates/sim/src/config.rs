//! What a run is (a [`RunConfig`], everything derived from its seed), what it found (a
//! [`RunReport`]), the hosts' names, and the command that replays a seed. The phases that use
//! them are in `sim.rs`, the fault schedules in `faults.rs`.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::checkers::Violation;
use crate::client;
use crate::coverage::Coverage;
use crate::store::DiskConfig;

/// Everything a run does, derived from its seed.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub seed: u64,
    pub nodes: u64,
    /// Raft groups (`latchkey serve --groups`, issue #16): 1 in every seed's own shape (set by
    /// `latchkey-sim --groups G`, and by the CI seeds of several groups). With more, every
    /// node is a member of every group, each group has its own log (and disk) per node, and
    /// the checkers run per group, over that group's log and its locks' operations.
    pub groups: u32,
    pub clients: u32,
    pub locks: usize,
    pub ttl: Duration,
    pub safety: Duration,
    pub settle: Duration,
    pub liveness: Duration,
    pub snapshot_every_entries: u64,
    /// Entries a node keeps in its log behind a snapshot (openraft's
    /// `max_in_snapshot_log_to_keep`): few, so that a follower cut off for a while catches up
    /// by a snapshot install, the state the lease rebuild after an install exists for.
    pub log_kept_after_snapshot: u64,
    pub disk: DiskConfig,
    /// Mean time between two faults in the safety phase.
    pub fault_every_ms: (u64, u64),
    /// Sessions of the idle host (0: no such host): they only keep alive, so that every
    /// failover forces a storm of logged renewals. See [`IDLE_SESSIONS`] for why not thousands.
    pub idle_sessions: usize,
    /// The chance that the leader is isolated right after it commits a lease write
    /// (`MarkLeases` or `RenewLeases`), checked at each such commit, at most once per 300 ms:
    /// the new leader may then not have applied it yet when it wins.
    pub failover_after_lease_write_p: f64,
    /// Run the "lag, catch up by a snapshot, then lead" schedule (see [`crate::faults::LagPlan`]).
    pub lag_then_lead: bool,
    /// The chance that a logged renewal which lifts an old mark is followed by a failover in
    /// which no follower learns that it committed, while the clients cannot reach the new
    /// leader (see [`crate::faults::FaultCtx::failover_after_renewal`]), checked at each such renewal.
    pub failover_after_renewal_p: f64,
    /// Raft heartbeat and election timeout range (ms). Half the seeds elect fast (150-300 ms):
    /// a TTL then spans many elections, as the default 15 s TTL does over 1-2 s elections in
    /// production, so a lease a new leader wrongly expires is still live on its client (with
    /// slow elections the failover itself ate most of a 2-3 s lease, and the planted lease bugs
    /// expired only sessions whose clients had given them up already).
    pub heartbeat_ms: u64,
    pub election_timeout_ms: (u64, u64),
    /// With several groups, how long a group's preferred leader must be caught up before its
    /// leader hands the group back (`ServerConfig::rebalance_after_ms`): shorter than the
    /// server's default so that a node restarted in the fault phase takes its groups back
    /// within the run, and leader transfers meet the faults and the lease checkers.
    pub rebalance_after_ms: u64,
    /// Replicas per group (`ServerConfig::replicas`, issue #16's groups across machines): 0,
    /// every node in every group (a seed's own shape); R places each group on R of the nodes
    /// (`replicas_of`), so that clients meet members outside a group, which send them on to a
    /// replica, and the fault plans that follow a leader work within its group's voters.
    pub replicas: u32,
    /// Read-write locks and semaphores (issue #32): besides its mutexes, the run's clients
    /// take one name as a read-write lock and one as a semaphore of this many permits. In half
    /// the seeds' own shapes (drawn last, so the other half run as they did before).
    pub primitives: Option<Primitives>,
    /// Fixed server bugs put back, for the checkers' own tests. Off in every seed.
    pub plant: latchkey_server::Plant,
    /// Lock-delays (issue #32 item 4): half the clients' mutex acquires ask for a delay of
    /// 1-3 s (`client::LockDelays`), judged by the `lock_delay` checker. Off in every seed's
    /// own shape (set by `latchkey-sim --lock-delay` and the CI seeds with delays), so that
    /// every seed replays as it did before: the draws come from a generator of their own, and
    /// the trace leaves the field out while it is off (`sim.rs`).
    pub lock_delay: bool,
    /// Elections (issue #32 item 1): besides their locks, the clients campaign in one election
    /// ([`client::ELECTION`]); its leader proclaims, resigns or dies, the others wait, and every
    /// client reads the leader now and then (`client::Elections`), judged by the `election`
    /// checker. Off in every seed's own shape (set by `latchkey-sim --elections` and the CI
    /// seeds with elections), like `lock_delay`: its draws come from a generator of its own,
    /// and the trace leaves the field out while it is off.
    pub elections: bool,
    /// The leader's coalescing of client operations into `Op::Batch` entries (issue #35,
    /// `ServerConfig::coalesce`): on in the odd seeds, off in the even ones. Decided by the
    /// seed's parity, not drawn from its generator, so that every other draw of a seed stays
    /// what it was; the even seeds run exactly as before (the trace leaves the field out while
    /// it is off, `sim.rs`). `latchkey-sim --coalesce` / `--no-coalesce` set it for every seed.
    pub coalesce: bool,
    /// The clients' coalescing of their operations into `Batch` calls (issue #35,
    /// `ClientConfig::batch`, off by default in the library): on in the seeds whose second bit
    /// is set (`seed / 2` odd), so that with [`Self::coalesce`]'s parity every combination of
    /// the two occurs in any four consecutive seeds. Decided by the seed, not drawn from its
    /// generator, like `coalesce`. With it, each client host runs [`BATCH_WORKERS`] sessions
    /// at once over its one `Client` (a batch of two or more needs four operations at once:
    /// `SIM_CLIENT_BATCH_CALLS_IN_FLIGHT`, two, in flight and two waiting), the extra ones from a generator of their own; without it,
    /// the run is what it was (the trace leaves the field out). `latchkey-sim --client-batch`
    /// / `--no-client-batch` set it for every seed.
    pub client_batch: bool,
}

/// Sessions a client host runs at once over its `Client` with [`RunConfig::client_batch`].
pub const BATCH_WORKERS: usize = 4;

/// The read-write lock and semaphore of a run (see [`RunConfig::primitives`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Primitives {
    /// The chance that an acquire of the read-write lock is a reader's.
    pub reader_p: f64,
    /// The semaphore's permits: few, so that its holders meet its bound under 3-4 clients.
    pub permits: u32,
}

impl Primitives {
    /// What `latchkey-sim --primitives` gives a seed whose own shape has none.
    pub const GIVEN: Primitives = Primitives {
        reader_p: 0.6,
        permits: 2,
    };
}

impl RunConfig {
    /// The Raft group whose leader the fault schedules that follow a leader follow: `seed %
    /// groups` (0 with one group), so that a sweep drives every group through them.
    pub fn targeted_group(&self) -> u32 {
        (self.seed % u64::from(self.groups.max(1))) as u32
    }

    /// Group `group`'s voters by id (the sim changes no membership): every node, or its
    /// replicas with replica subsets.
    pub fn group_voters(&self, group: u32) -> Vec<u64> {
        let mut voters = latchkey_core::groups::replicas_of(group, 1..=self.nodes, self.replicas);
        voters.sort_unstable();
        voters
    }

    pub fn from_seed(seed: u64) -> RunConfig {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_c0f1);
        let ttl = Duration::from_millis(rng.random_range(2_000..=3_000));
        RunConfig {
            seed,
            nodes: if rng.random_bool(0.25) { 5 } else { 3 },
            groups: 1,
            clients: rng.random_range(3..=4),
            locks: rng.random_range(1..=2),
            ttl,
            safety: Duration::from_secs(rng.random_range(15..=25)),
            // Leases of clients that died in the faults run out (a pause lasts up to 3 TTLs and
            // a new leader restarts a lease at a full TTL), and an election completes.
            settle: ttl * 4 + Duration::from_secs(3),
            liveness: Duration::from_secs(8),
            snapshot_every_entries: rng.random_range(10..=60),
            log_kept_after_snapshot: 0,
            disk: DiskConfig {
                fsync_ms: (1, rng.random_range(2..=10)),
                ack_before_fsync: false,
            },
            fault_every_ms: (300, rng.random_range(800..=2_500)),
            idle_sessions: 0,
            failover_after_lease_write_p: 0.0,
            lag_then_lead: false,
            failover_after_renewal_p: 0.0,
            heartbeat_ms: 100,
            election_timeout_ms: (500, 1_000),
            rebalance_after_ms: 2_000,
            replicas: 0,
            primitives: None,
            plant: latchkey_server::Plant::default(),
            lock_delay: false,
            elections: false,
            coalesce: seed % 2 == 1,
            client_batch: (seed / 2) % 2 == 1,
        }
        .with_lease_shape(&mut rng)
        .with_primitives(&mut rng)
    }

    /// Drawn after everything else, so that a seed without them is the run it was before.
    fn with_primitives(mut self, rng: &mut StdRng) -> RunConfig {
        if rng.random_bool(0.5) {
            self.primitives = Some(Primitives {
                reader_p: rng.random_range(0.5..0.8),
                permits: rng.random_range(2..=3),
            });
        }
        self
    }

    /// The lease-related shape, drawn after the rest so that adding it left the older fields
    /// of each seed as they were.
    fn with_lease_shape(mut self, rng: &mut StdRng) -> RunConfig {
        self.log_kept_after_snapshot = rng.random_range(0..=20);
        self.idle_sessions = if rng.random_bool(0.3) {
            rng.random_range(IDLE_SESSIONS)
        } else {
            0
        };
        self.failover_after_lease_write_p = rng.random_range(0.05..0.3);
        self.lag_then_lead = rng.random_bool(0.6);
        if rng.random_bool(0.5) {
            self.heartbeat_ms = 40;
            self.election_timeout_ms = (150, 300);
            // And a longer lease: a failover (pre-vote waits out the followers' leader lease,
            // so about two election timeouts, plus the new leader's read-index round) must
            // leave the clients' deadlines standing, or a lease a new leader wrongly expires
            // was already given up by its client and nothing can tell the bug from the rule.
            self.ttl = Duration::from_millis(rng.random_range(4_000..=6_000));
            self.settle = self.ttl * 4 + Duration::from_secs(3);
        }
        // Drawn last, so that the draws above stayed as they were for every seed.
        self.failover_after_renewal_p = rng.random_range(0.3..0.8);
        self
    }

    pub(crate) fn stop_at(&self) -> Duration {
        self.safety + self.settle + self.liveness + Duration::from_millis(client::WAIT_MS * 2)
    }
}

/// How many idle sessions a run with an idle host has. Before keepalives were batched (the
/// client's sessions share one KeepAlive, the leader's logged renewals share one entry), 200-500
/// sessions on one client were mostly lost even without a failover (seed 19); hundreds now
/// renew, and every failover makes them a storm of logged renewals.
const IDLE_SESSIONS: std::ops::RangeInclusive<usize> = 100..=600;

/// The outcome of one run.
#[derive(Debug)]
pub struct RunReport {
    pub config: RunConfig,
    pub violations: Vec<Violation>,
    /// Faults injected, in order, for the failure report.
    pub faults: Vec<String>,
    pub operations: usize,
    pub grants: usize,
    pub committed_entries: usize,
    /// Hold checks within a second before their session's expiry was proposed: evidence that
    /// the deadline checker judged close calls.
    pub hold_checks_near_expiry: usize,
    /// The lease states the run reached.
    pub coverage: Coverage,
    /// By Raft group (one element in a cluster of one group): what each group's checkers
    /// judged, so that a run of several groups can show that every group was exercised.
    pub by_group: Vec<GroupReport>,
    pub sim_error: Option<String>,
    /// A hash of everything the run recorded ([`crate::trace`]): one seed, one trace hash,
    /// on every machine.
    pub trace_hash: u64,
}

/// What one Raft group's share of a run held.
#[derive(Debug, Clone, Default)]
pub struct GroupReport {
    /// Acquires of the group's locks that were granted.
    pub grants: usize,
    pub committed_entries: usize,
    pub coverage: Coverage,
}

impl RunReport {
    pub fn ok(&self) -> bool {
        self.violations.is_empty() && self.sim_error.is_none()
    }
}

pub(crate) fn node_name(id: u64) -> String {
    format!("n{id}")
}

pub(crate) fn client_name(id: u32) -> String {
    format!("c{id}")
}

/// The command that replays `seed` (in a cluster of `groups` Raft groups of `replicas`
/// replicas each, 0: every node).
pub fn replay_command(seed: u64, groups: u32, replicas: u32) -> String {
    let groups = if groups == 1 {
        String::new()
    } else {
        format!(" --groups {groups}")
    };
    let replicas = if replicas == 0 {
        String::new()
    } else {
        format!(" --replicas {replicas}")
    };
    format!("cargo run --release -p latchkey-sim -- --reproduce {seed}{groups}{replicas}")
}
