//! One run: a cluster of turmoil hosts, clients, the fault schedule, and the final checks.
//!
//! Timeline (true simulation time):
//! 1. `0 .. safety_end`: the safety phase. Clients work; the seeded fault schedule partitions
//!    (both ways and one way), isolates the leader, crashes and restarts nodes (losing unsynced
//!    writes), holds a node's messages (a paused process, seen from the network), drops and
//!    delays messages, crashes client hosts holding a lock (and restarts them), pauses a client
//!    mid-write while holding its messages, and cuts a client off from every node for longer
//!    than its TTL while it works in a critical section. A tenth of the critical sections are
//!    long (1–2.5 TTLs), so faults hit holders whose sessions must stay renewed.
//! 2. `safety_end`: every fault heals: links repaired, held messages delivered, crashed nodes
//!    restarted.
//! 3. The liveness phase: no faults; acquires must be granted.
//! 4. `stop_at`: clients stop starting operations (they keep their sessions and any held
//!    lock). Every node is crashed and restarted at once, then an observer reads every lock.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use latchkey_proto::v1 as pb;
use latchkey_proto::v1::locks_client::LocksClient;
use latchkey_server::{run_with, Env, ServerConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::checkers::{self, CheckConfig, Violation};
use crate::client::{self, ClientControl, ClientSetup, IdleSetup};
use crate::clock::{DriftClock, SeededEntropy, DRIFT_PPM_MAX};
use crate::coverage::Coverage;
use crate::history::{History, Probed, ResumedLeases};
use crate::net::{self, SimConnector, PORT};
use crate::resource::Resource;
use crate::store::{Disk, DiskConfig, SharedDisk, SimLogStore};

/// Everything a run does, derived from its seed.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub seed: u64,
    pub nodes: u64,
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
    /// Run the "lag, catch up by a snapshot, then lead" schedule (see [`LagPlan`]).
    pub lag_then_lead: bool,
    /// The chance that a logged renewal which lifts an old mark is followed by a failover in
    /// which no follower learns that it committed, while the clients cannot reach the new
    /// leader (see [`failover_after_renewal`]), checked at each such renewal.
    pub failover_after_renewal_p: f64,
    /// Raft heartbeat and election timeout range (ms). Half the seeds elect fast (150-300 ms):
    /// a TTL then spans many elections, as the default 15 s TTL does over 1-2 s elections in
    /// production, so a lease a new leader wrongly expires is still live on its client (with
    /// slow elections the failover itself ate most of a 2-3 s lease, and the planted lease bugs
    /// expired only sessions whose clients had given them up already).
    pub heartbeat_ms: u64,
    pub election_timeout_ms: (u64, u64),
    /// Fixed server bugs put back, for the checkers' own tests. Off in every seed.
    pub plant: latchkey_server::Plant,
}

impl RunConfig {
    pub fn from_seed(seed: u64) -> RunConfig {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_c0f1);
        let ttl = Duration::from_millis(rng.random_range(2_000..=3_000));
        RunConfig {
            seed,
            nodes: if rng.random_bool(0.25) { 5 } else { 3 },
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
            plant: latchkey_server::Plant::default(),
        }
        .with_lease_shape(&mut rng)
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
    pub sim_error: Option<String>,
}

impl RunReport {
    pub fn ok(&self) -> bool {
        self.violations.is_empty() && self.sim_error.is_none()
    }
}

fn node_name(id: u64) -> String {
    format!("n{id}")
}

fn client_name(id: u32) -> String {
    format!("c{id}")
}

struct NodeSetup {
    id: u64,
    disk: SharedDisk,
    dir: std::path::PathBuf,
    peers: BTreeMap<u64, String>,
    drift_ppm: i64,
    wall_offset_ms: i64,
    seed: u64,
    lives: Arc<AtomicU64>,
}

fn start_node(sim: &mut turmoil::Sim<'_>, setup: NodeSetup, config: &RunConfig, history: &History) {
    let config = config.clone();
    let history = history.clone();
    let setup = Rc::new(setup);
    sim.host(node_name(setup.id), move || {
        let setup = setup.clone();
        let config = config.clone();
        let history = history.clone();
        async move {
            let life = setup.lives.fetch_add(1, Ordering::Relaxed);
            let seed = setup
                .seed
                .wrapping_add(life.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let listener = turmoil::net::TcpListener::bind(("0.0.0.0", PORT)).await?;
            let store = SimLogStore::open(
                setup.id,
                setup.disk.clone(),
                history.clone(),
                config.disk,
                seed,
            );
            let mut server = ServerConfig::cluster(
                setup.id,
                format!("0.0.0.0:{PORT}").parse().expect("address"),
                setup.dir.clone(),
                setup.peers.clone(),
            );
            server.heartbeat_ms = config.heartbeat_ms;
            server.election_timeout_min_ms = config.election_timeout_ms.0;
            server.election_timeout_max_ms = config.election_timeout_ms.1;
            server.snapshot_every_entries = config.snapshot_every_entries;
            server.log_kept_after_snapshot = config.log_kept_after_snapshot;
            server.plant = latchkey_server::Plant {
                tolerate_log_reversion: config.disk.ack_before_fsync,
                ..config.plant
            };
            let clock = Arc::new(DriftClock::new(setup.drift_ppm, setup.wall_offset_ms));
            let env = Env {
                clock: clock.clone(),
                connector: Arc::new(SimConnector),
                entropy: Arc::new(SeededEntropy::new(seed)),
                probe: Arc::new(HistoryProbe {
                    history: history.clone(),
                    clock,
                }),
            };
            let server = server.validate()?;
            run_with(
                net::incoming(listener),
                server,
                env,
                store,
                std::future::pending(),
            )
            .await
            .map_err(|e| -> Box<dyn std::error::Error> { e.into() })
        }
    });
}

/// Records what the nodes report through the probe, in true time.
struct HistoryProbe {
    history: History,
    /// The node's own clock, to convert the leases it resumed into true time.
    clock: Arc<DriftClock>,
}

impl latchkey_server::Probe for HistoryProbe {
    fn event(&self, node: u64, mut event: latchkey_server::ProbeEvent) {
        let at = crate::clock::true_now();
        if let latchkey_server::ProbeEvent::LeasesResumed { term, leases, .. } = &mut event {
            // Kept apart from `probed`, converted to true time: one element per session.
            let until = std::mem::take(leases)
                .into_iter()
                .map(|(id, left)| (id.0, at + self.clock.true_duration(left)))
                .collect();
            let term = *term;
            self.history.with(|h| {
                h.resumed_leases.push(ResumedLeases {
                    at,
                    node,
                    term,
                    until,
                })
            });
        }
        self.history
            .with(|h| h.probed.push(Probed { at, node, event }));
    }

    fn wants_resumed_leases(&self) -> bool {
        true
    }
}

/// The name of the idle sessions' host.
const IDLE_HOST: &str = "idle";

/// Active faults and when they heal.
struct Faults {
    rng: StdRng,
    log: Vec<String>,
    crashed: BTreeMap<u64, Duration>,
    /// Crashed clients (index) and when their hosts restart.
    crashed_clients: BTreeMap<usize, Duration>,
    /// (a, b, one_way, heal_at)
    cut: Vec<(String, String, bool, Duration)>,
    held: Vec<(String, Duration)>,
    lossy: Vec<(String, String, Duration)>,
    next_at: Duration,
    /// Every host's name (nodes and clients).
    hosts: Vec<String>,
    /// Client cuts drawn but not yet asked for by their client (it asks at its next critical
    /// section): client index -> direction.
    client_cuts: BTreeMap<usize, CutDirection>,
    /// Where the lag-then-lead schedule is.
    lag: LagPlan,
    /// The highest committed index already looked at for lease writes.
    lease_writes_seen: u64,
    /// No failover after a lease write before this (one at a time).
    lease_failover_after: Duration,
    /// The highest index the renewal-then-failover schedule has decided on.
    renewals_seen: u64,
    /// No renewal-then-failover before this.
    renewal_failover_after: Duration,
    /// When the renewal-then-failover schedule next starves the clients (see
    /// [`failover_after_renewal`]).
    starve_clients_at: Duration,
}

/// The "lag, catch up by a snapshot, then lead" schedule: the state a new leader needs to
/// resume a lease from a mark that an installed snapshot no longer has (issue #9, bug 1). A
/// follower applies a new leader's marks, is cut off while the leader lifts them with logged
/// renewals and snapshots past it, comes back and installs the snapshot; then the leader is
/// isolated so that the follower may win (with five nodes, the other followers are cut from
/// each other too, so that only it can gather a majority; with three it races the other one).
#[derive(Debug, Clone, Copy)]
enum LagPlan {
    /// At `next_at`, isolate the leader, so that the next one marks every session.
    Idle { next_at: Duration },
    /// Wait until `until` for a follower to learn that the marks of a term after `old_term`
    /// (the isolated leader's), made after `since`, committed.
    WaitMark {
        old_term: u64,
        since: Duration,
        until: Duration,
    },
    /// Follower `node` is cut off from its peers until `heal_at`.
    Lagging { node: u64, heal_at: Duration },
    /// `node` is back since `since`: wait until `until` for it to install a snapshot.
    CatchingUp {
        node: u64,
        since: Duration,
        until: Duration,
    },
}

#[derive(Debug, Clone, Copy)]
enum CutDirection {
    Both,
    /// The client's messages to the nodes are lost; their answers would arrive.
    FromClient,
    /// The nodes' messages to the client are lost; its requests arrive.
    ToClient,
}

pub fn run(config: &RunConfig) -> RunReport {
    let history = History::default();
    let resource = Resource::new(history.clone());
    let mut rng = StdRng::seed_from_u64(config.seed);
    // openraft's election timeouts and ticker phases come from this thread's RNG (every host
    // runs on it); seed it from the run's seed, without drawing from `rng`, so the run replays.
    latchkey_raft::seed_thread_rng(config.seed ^ 0x6f70_656e_7261_6674);
    let mut sim = turmoil::Builder::new()
        .simulation_duration(Duration::from_secs(600))
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_micros(100))
        .max_message_latency(Duration::from_millis(2))
        .tcp_capacity(1 << 16)
        .rng_seed(rng.random())
        .build();

    let tmp = tempfile::tempdir().expect("temp dir");
    let peers: BTreeMap<u64, String> = (1..=config.nodes)
        .map(|id| (id, format!("{}:{PORT}", node_name(id))))
        .collect();
    let mut disks = BTreeMap::new();
    for id in 1..=config.nodes {
        let disk = Disk::new();
        disks.insert(id, disk.clone());
        start_node(
            &mut sim,
            NodeSetup {
                id,
                disk,
                dir: tmp.path().join(node_name(id)),
                peers: peers.clone(),
                // Server and client clocks drift both ways within the bound, so the worst case
                // of the deadline rule (fast leader, slow client) is covered.
                drift_ppm: rng.random_range(-DRIFT_PPM_MAX..=DRIFT_PPM_MAX),
                wall_offset_ms: rng.random_range(-5_000..=5_000),
                seed: rng.random(),
                lives: Arc::default(),
            },
            config,
            &history,
        );
    }

    let locks: Vec<String> = (0..config.locks).map(|i| format!("lock-{i}")).collect();
    let stop_at = config.stop_at();
    let mut controls = Vec::new();
    for id in 1..=config.clients {
        let control = Arc::new(ClientControl::default());
        controls.push(control.clone());
        let setup = ClientSetup {
            id,
            nodes: peers.values().cloned().collect(),
            locks: locks.clone(),
            ttl: config.ttl,
            drift_ppm: rng.random_range(-DRIFT_PPM_MAX..=DRIFT_PPM_MAX),
            seed: rng.random(),
            stop_at,
            long_holds_until: config.safety,
            work_ms: (5, 150),
        };
        // A host, not a turmoil client, so that it can be crashed like a process; every life
        // runs the same software.
        let (history, resource) = (history.clone(), resource.clone());
        sim.host(client_name(id), move || {
            client::run(
                setup.clone(),
                history.clone(),
                resource.clone(),
                control.clone(),
            )
        });
    }

    if config.idle_sessions > 0 {
        let setup = IdleSetup {
            nodes: peers.values().cloned().collect(),
            sessions: config.idle_sessions,
            ttl: config.ttl,
            drift_ppm: rng.random_range(-DRIFT_PPM_MAX..=DRIFT_PPM_MAX),
            seed: rng.random(),
        };
        let history = history.clone();
        sim.host(IDLE_HOST, move || {
            client::run_idle(setup.clone(), history.clone())
        });
    }

    let mut faults = Faults {
        rng: StdRng::seed_from_u64(rng.random()),
        log: Vec::new(),
        crashed: BTreeMap::new(),
        crashed_clients: BTreeMap::new(),
        cut: Vec::new(),
        held: Vec::new(),
        lossy: Vec::new(),
        next_at: Duration::from_secs(2),
        hosts: (1..=config.nodes)
            .map(node_name)
            .chain((1..=config.clients).map(client_name))
            .chain((config.idle_sessions > 0).then(|| IDLE_HOST.to_owned()))
            .collect(),
        client_cuts: BTreeMap::new(),
        lag: LagPlan::Idle {
            next_at: Duration::from_secs(2),
        },
        lease_writes_seen: 0,
        lease_failover_after: Duration::ZERO,
        renewals_seen: 0,
        renewal_failover_after: Duration::ZERO,
        starve_clients_at: config.ttl,
    };
    let mut crash_rng = StdRng::seed_from_u64(rng.random());
    let final_read: Rc<RefCell<bool>> = Rc::default();
    let mut healed = false;
    let mut restarted_all = false;
    let end = stop_at + Duration::from_secs(15);
    let mut sim_error = None;
    let mut panicked = false;
    let watchdog = Watchdog::start(config.seed);
    let progress = std::env::var_os("LATCHKEY_SIM_PROGRESS").is_some();
    let wall = std::time::Instant::now();
    let mut next_progress = Duration::ZERO;
    let mut logged = 0;
    loop {
        let now = sim.elapsed();
        if progress && now >= next_progress {
            next_progress += Duration::from_secs(1);
            let (events, committed) = history.with(|h| (h.events.len(), h.committed.len()));
            eprintln!(
                "sim {:.0}s wall {:.1}s: {events} events, {committed} committed",
                now.as_secs_f64(),
                wall.elapsed().as_secs_f64()
            );
        }
        if now >= end || *final_read.borrow() {
            break;
        }
        serve_client_requests(&mut sim, &mut faults, config, &controls, now, healed);
        if now < config.safety {
            inject(
                &mut sim,
                &mut faults,
                config,
                &history,
                &disks,
                &controls,
                &mut crash_rng,
                now,
            );
            if config.failover_after_lease_write_p > 0.0
                && matches!(faults.lag, LagPlan::Idle { .. })
            {
                failover_after_lease_write(&mut sim, &mut faults, config, &history, now);
            }
            if config.failover_after_renewal_p > 0.0 && matches!(faults.lag, LagPlan::Idle { .. }) {
                failover_after_renewal(&mut sim, &mut faults, config, &history, now);
            }
            if config.lag_then_lead {
                lag_then_lead(&mut sim, &mut faults, config, &history, now);
            }
        } else if !healed {
            // Client faults armed "at the next write/grant/critical section" that have not
            // fired yet are disarmed too: firing in the liveness phase they would be faults
            // after the heal (a holder paused or killed there legitimately starves waiters).
            for c in &controls {
                c.disarm();
            }
            faults.client_cuts.clear();
            heal_all(&mut sim, &mut faults, config);
            history.with(|h| h.healed_at = Some(now));
            faults
                .log
                .push(format!("{:.3}s heal everything", now.as_secs_f64()));
            healed = true;
        }
        if now >= stop_at + Duration::from_secs(1) && !restarted_all {
            restarted_all = true;
            faults.log.push(format!(
                "{:.3}s crash and restart every node",
                now.as_secs_f64()
            ));
            for (id, disk) in &disks {
                sim.crash(node_name(*id));
                disk.lock().expect("disk lock").crash(&mut crash_rng);
                sim.bounce(node_name(*id));
            }
            let history = history.clone();
            let nodes: Vec<String> = peers.values().cloned().collect();
            let locks = locks.clone();
            let done = final_read.clone();
            sim.client("observer", async move {
                let holders = read_final(&nodes, &locks).await;
                history.with(|h| h.final_holders = holders);
                *done.borrow_mut() = true;
                Ok(())
            });
        }
        if progress && faults.log.len() > logged {
            for l in &faults.log[logged..] {
                eprintln!("fault: {l}");
            }
            logged = faults.log.len();
        }
        watchdog.stepped(now, &faults.log);
        // A panic in any task of a simulated host (turmoil's runtimes shut down on one under
        // tokio_unstable) unwinds out of the step: a failed run, reported with its seed, not
        // a crashed sweep.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.step())) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                sim_error = Some(e.to_string());
                break;
            }
            Err(panic) => {
                sim_error = Some(format!(
                    "a simulated host panicked: {}",
                    panic_message(panic.as_ref())
                ));
                panicked = true;
                break;
            }
        }
    }
    if restarted_all && !*final_read.borrow() && sim_error.is_none() {
        sim_error = Some("the observer could not read the locks after the final restart".into());
    }
    watchdog.stop();
    if panicked {
        // Its runtimes are mid-panic (borrowed cells, half-dropped tasks): dropping them could
        // panic again. Leak this one failed run instead.
        std::mem::forget(sim);
    } else {
        drop(sim);
    }

    let data = history.snapshot();
    let check = CheckConfig {
        settle: config.settle,
        liveness_until: stop_at - Duration::from_millis(client::WAIT_MS * 2),
    };
    // A run cut short by an error still had its safety checked up to there (liveness and
    // the final restart did not happen).
    let violations = if sim_error.is_none() {
        checkers::check_all(&data, &check)
    } else {
        checkers::check_safety(&data)
    };
    let ops = data.operations();
    RunReport {
        config: config.clone(),
        violations,
        faults: faults.log,
        operations: ops.len(),
        grants: ops
            .iter()
            .filter(|o| matches!(o.ret, Some((crate::history::Ret::Granted { .. }, _))))
            .count(),
        committed_entries: data.committed.len(),
        hold_checks_near_expiry: checkers::hold_checks_before_end(&data, Duration::from_secs(1)),
        coverage: Coverage::measure(&data),
        sim_error,
    }
}

/// Reads every lock's holder after the final restart, retrying until a leader answers.
async fn read_final(nodes: &[String], locks: &[String]) -> BTreeMap<String, Option<(u64, u64)>> {
    let mut out = BTreeMap::new();
    let mut i = 0;
    for lock in locks {
        loop {
            let mut c = LocksClient::new(net::channel(&nodes[i % nodes.len()]).expect("address"));
            let mut req = tonic::Request::new(pb::DescribeRequest { name: lock.clone() });
            req.set_timeout(Duration::from_secs(1));
            let answer = tokio::time::timeout(Duration::from_secs(1), c.describe(req)).await;
            if let Ok(Ok(resp)) = answer {
                let info = resp.into_inner().lock.unwrap_or_default();
                out.insert(
                    lock.clone(),
                    info.held.then_some((info.session, info.token)),
                );
                break;
            }
            i += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn inject(
    sim: &mut turmoil::Sim<'_>,
    f: &mut Faults,
    config: &RunConfig,
    history: &History,
    disks: &BTreeMap<u64, SharedDisk>,
    controls: &[Arc<ClientControl>],
    crash_rng: &mut StdRng,
    now: Duration,
) {
    let stamp = |s: String| format!("{:.3}s {s}", now.as_secs_f64());
    // Heal what is due.
    let due: Vec<u64> = f
        .crashed
        .iter()
        .filter(|(_, t)| **t <= now)
        .map(|(id, _)| *id)
        .collect();
    for id in due {
        f.crashed.remove(&id);
        sim.bounce(node_name(id));
        f.log.push(stamp(format!("restart n{id}")));
    }
    f.cut.retain(|(a, b, one_way, t)| {
        if *t > now {
            return true;
        }
        if *one_way {
            sim.repair_oneway(a.as_str(), b.as_str());
        } else {
            sim.repair(a.as_str(), b.as_str());
        }
        false
    });
    f.held.retain(|(n, t)| {
        if *t > now {
            return true;
        }
        for h in f.hosts.iter().filter(|h| *h != n) {
            sim.release(n.as_str(), h.as_str());
        }
        false
    });
    f.lossy.retain(|(a, b, t)| {
        if *t > now {
            return true;
        }
        sim.set_link_fail_rate(a.as_str(), b.as_str(), 0.0);
        sim.set_link_max_message_latency(a.as_str(), b.as_str(), Duration::from_millis(2));
        false
    });
    if now < f.next_at {
        return;
    }
    let (lo, hi) = config.fault_every_ms;
    f.next_at = now + Duration::from_millis(f.rng.random_range(lo..=hi));
    let rng = &mut f.rng;
    let node = rng.random_range(1..=config.nodes);
    let other = (node + rng.random_range(1..config.nodes) - 1) % config.nodes + 1;
    let last = Duration::from_millis(rng.random_range(300..=5_000));
    let (a, b) = (node_name(node), node_name(other));
    let kind = rng.random_range(0..124);
    // While the lag-then-lead plan runs, it alone acts on the nodes: a random partition or
    // crash on top of it in a three-node cluster leaves no majority, and the plan stalls.
    if kind <= 76 && !matches!(f.lag, LagPlan::Idle { .. }) {
        return;
    }
    match kind {
        0..=19 => {
            let one_way = rng.random_bool(0.4);
            if one_way {
                sim.partition_oneway(a.as_str(), b.as_str());
            } else {
                sim.partition(a.as_str(), b.as_str());
            }
            f.log.push(stamp(format!(
                "cut {a} {} {b} for {last:?}",
                if one_way { "->" } else { "<->" }
            )));
            f.cut.push((a, b, one_way, now + last));
        }
        20..=31 => {
            let Some((_, leader)) = history.with(|h| h.leader) else {
                return;
            };
            let l = node_name(leader);
            // Half the time long enough for a new leader to be elected and a full lease to run
            // out under it while the old one, still reachable by clients, believes it leads.
            let last = if rng.random_bool(0.5) {
                config.ttl.mul_f64(rng.random_range(1.5..3.0))
            } else {
                last
            };
            for other in (1..=config.nodes).filter(|o| *o != leader) {
                let o = node_name(other);
                sim.partition(l.as_str(), o.as_str());
                f.cut.push((l.clone(), o, false, now + last));
            }
            f.log.push(stamp(format!(
                "isolate leader {l} from its peers for {last:?}"
            )));
        }
        32..=49 => {
            // Mostly keep a majority up; sometimes take it down too.
            let down = f.crashed.len() as u64;
            if f.crashed.contains_key(&node)
                || (down + 1 > config.nodes / 2 && rng.random_bool(0.8))
            {
                return;
            }
            sim.crash(a.as_str());
            let lost = disks[&node].lock().expect("disk lock").crash(crash_rng);
            f.crashed.insert(node, now + last);
            f.log.push(stamp(format!(
                "crash {a} ({lost} unsynced writes lost) for {last:?}"
            )));
        }
        50..=61 => {
            for h in f.hosts.iter().filter(|h| **h != a) {
                sim.hold(a.as_str(), h.as_str());
            }
            f.held.push((a.clone(), now + last));
            f.log.push(stamp(format!(
                "pause {a} (hold all its messages) for {last:?}"
            )));
        }
        62..=76 => {
            let rate = rng.random_range(0.01..0.2);
            let delay = Duration::from_millis(rng.random_range(5..=300));
            sim.set_link_fail_rate(a.as_str(), b.as_str(), rate);
            sim.set_link_max_message_latency(a.as_str(), b.as_str(), delay);
            f.log.push(stamp(format!(
                "lossy link {a}<->{b}: loss {rate:.2}, delay up to {delay:?}, for {last:?}"
            )));
            f.lossy.push((a, b, now + last));
        }
        77..=88 => {
            let c = rng.random_range(0..controls.len());
            let pause = config.ttl.as_millis() as u64 * rng.random_range(12..=30) / 10;
            controls[c].pause_ms.store(pause, Ordering::Relaxed);
            f.log.push(stamp(format!(
                "pause client c{} for {pause} ms at its next write",
                c + 1
            )));
        }
        100..=123 => {
            let c = rng.random_range(0..controls.len());
            if f.client_cuts.contains_key(&c) {
                return;
            }
            let ms = config.ttl.as_millis() as u64 * rng.random_range(12..=25) / 10;
            let direction = match rng.random_range(0..10) {
                0..=4 => CutDirection::Both,
                5..=7 => CutDirection::FromClient,
                _ => CutDirection::ToClient,
            };
            controls[c].cut_ms.store(ms, Ordering::Relaxed);
            f.client_cuts.insert(c, direction);
            f.log.push(stamp(format!(
                "cut client c{} off from every node ({direction:?}) for {ms} ms at its next \
                 critical section",
                c + 1
            )));
        }
        _ => {
            let c = rng.random_range(0..controls.len());
            controls[c]
                .crash
                .store(true, std::sync::atomic::Ordering::Relaxed);
            f.log
                .push(stamp(format!("kill client c{} at its next grant", c + 1)));
        }
    }
}

/// Cuts `node` off from every other node until `now + last`.
fn isolate(sim: &mut turmoil::Sim<'_>, f: &mut Faults, nodes: u64, node: u64, heal_at: Duration) {
    let n = node_name(node);
    for other in (1..=nodes).filter(|o| *o != node) {
        let o = node_name(other);
        sim.partition(n.as_str(), o.as_str());
        f.cut.push((n.clone(), o, false, heal_at));
    }
}

/// The current leader, if it is up.
fn live_leader(f: &Faults, history: &History) -> Option<(u64, u64)> {
    history
        .with(|h| h.leader)
        .filter(|(_, node)| !f.crashed.contains_key(node))
}

/// Isolates the leader right after it committed a `MarkLeases` or a
/// `RenewLeases`, with the run's chance: the next leader may have the entry in its log but not
/// know it committed, so not have applied it when it wins (issue #9, bug 2 needs that).
fn failover_after_lease_write(
    sim: &mut turmoil::Sim<'_>,
    f: &mut Faults,
    config: &RunConfig,
    history: &History,
    now: Duration,
) {
    let Some(leader) = live_leader(f, history) else {
        return;
    };
    let from = f.lease_writes_seen + 1;
    let (last, write) = history.with(|h| {
        let last = h.committed.last_key_value().map_or(0, |(i, _)| *i);
        let write = h
            .committed
            .range(from..)
            .filter(|(_, c)| c.leader == leader)
            .find_map(|(i, c)| match c.op {
                Some(latchkey_core::Op::MarkLeases { .. }) => Some((*i, "MarkLeases")),
                Some(latchkey_core::Op::RenewLeases { .. }) => Some((*i, "RenewLeases")),
                _ => None,
            });
        (last, write)
    });
    f.lease_writes_seen = f.lease_writes_seen.max(last);
    let Some((index, kind)) = write else {
        return;
    };
    if now < f.lease_failover_after || !f.rng.random_bool(config.failover_after_lease_write_p) {
        return;
    }
    // Short: long enough for an election, and the next leader may be isolated right after its
    // own first lease writes, so that failovers chain (each new leader resumes from the marks
    // the last one logged, their unrenewed times adding up).
    let last = Duration::from_millis(f.rng.random_range(600..=1_500));
    f.lease_failover_after = now + Duration::from_millis(300);
    let l = leader.1;
    isolate(sim, f, config.nodes, l, now + last);
    f.log.push(format!(
        "{:.3}s isolate leader n{l} from its peers right after it committed {kind} (entry \
         {index}), for {last:?}",
        now.as_secs_f64()
    ));
}

/// The "logged renewal, then failover" schedule: the state issue #9's bug 2 needs. A leader
/// commits a `RenewLeases` that lifts a mark, and acknowledges it to the clients, whose
/// deadlines now stand; no follower learns that it committed (the leader's messages to its
/// peers are cut the moment the followers hold the entry, while their acknowledgements still
/// reach it), so the next leader has it in its log unapplied when it wins. The clients' own
/// messages are lost for most of a TTL meanwhile (their answers still arrive), so no keepalive
/// of theirs reaches the new leader to renew the lease afresh: only the lease the new leader
/// resumed stands between them and an expiry, and it must not end before their deadlines.
///
/// Only a renewal that lifts a mark which has stood for more than a quarter TTL can show a
/// lease resumed too early: resumed from a younger mark, the lease would still outlast the
/// client's deadline (TTL minus a margin of TTL/5). Marks made as a leader takes office are
/// lifted within TTL/3 (the clients renew that often), mostly younger; so from time to time the
/// schedule first loses the clients' messages for a little over half a TTL (their deadlines
/// stand), long enough for the leader to mark their sessions unrenewed for TTL/2, and their
/// next keepalives lift those marks through the log.
fn failover_after_renewal(
    sim: &mut turmoil::Sim<'_>,
    f: &mut Faults,
    config: &RunConfig,
    history: &History,
    now: Duration,
) {
    if now < f.renewal_failover_after {
        return;
    }
    let ttl = config.ttl;
    if now >= f.starve_clients_at {
        f.starve_clients_at = now + ttl.mul_f64(f.rng.random_range(3.0..5.0));
        let starve = ttl.mul_f64(f.rng.random_range(0.55..0.65));
        cut_clients_messages(sim, f, config, now + starve);
        f.log.push(format!(
            "{:.3}s renewal-then-failover: lose every client's messages to the nodes for \
             {starve:?}, so that the leader marks their sessions",
            now.as_secs_f64()
        ));
        return;
    }
    let Some(leader) = live_leader(f, history) else {
        return;
    };
    // Followers that must hold the entry for it to commit (with the leader, a majority).
    let followers_needed = (config.nodes / 2) as usize;
    let found = history.with(|h| {
        let (index, ids) = h
            .appended
            .range((f.renewals_seen + 1, 0, 0)..)
            .filter(|(_, a)| a.leader == leader)
            .find_map(|(_, a)| match &a.op {
                Some(latchkey_core::Op::RenewLeases { ids }) => Some((a.index, ids.clone())),
                _ => None,
            })?;
        let holding = h
            .last_appended
            .iter()
            .filter(|(n, (last, by))| **n != leader.1 && *by == leader && *last >= index)
            .count();
        if holding < followers_needed {
            // Not replicated yet: look again next step.
            return None;
        }
        // Decided either way from here.
        let known_committed = h
            .commit_checked
            .iter()
            .any(|(n, (_, c))| *n != leader.1 && *c >= index);
        // The mark each renewed session carried before this renewal: the newest lease write
        // for it below `index` (a renewal there means no mark stood).
        let mut pending: std::collections::BTreeSet<_> = ids.iter().copied().collect();
        let mut oldest_mark = Duration::ZERO;
        for (_, c) in h.committed.range(..index).rev() {
            if pending.is_empty() {
                break;
            }
            match &c.op {
                Some(latchkey_core::Op::MarkLeases { marks }) => {
                    for (id, unrenewed_ms) in marks {
                        if pending.remove(id) {
                            let stood = now.saturating_sub(c.known_at)
                                + Duration::from_millis(*unrenewed_ms);
                            oldest_mark = oldest_mark.max(stood);
                        }
                    }
                }
                Some(latchkey_core::Op::RenewLeases { ids }) => {
                    for id in ids {
                        pending.remove(id);
                    }
                }
                _ => {}
            }
        }
        Some((
            index,
            !known_committed && oldest_mark * 4 > ttl,
            oldest_mark,
        ))
    });
    let Some((index, eligible, oldest_mark)) = found else {
        return;
    };
    f.renewals_seen = index;
    if !eligible || !f.rng.random_bool(config.failover_after_renewal_p) {
        return;
    }
    // One at a time, with room between them for the clients to come back.
    f.renewal_failover_after = now + ttl * 2;
    // Until about the clients' own deadlines (TTL minus the margin, from their last renewal),
    // and the old leader as long: back earlier, it could win the next election and resume
    // from the renewal it applied, ending the new leader's term before its leases run out.
    let cut = ttl.mul_f64(f.rng.random_range(0.8..1.0));
    let l = node_name(leader.1);
    for other in (1..=config.nodes).filter(|o| *o != leader.1).map(node_name) {
        sim.partition_oneway(l.as_str(), other.as_str());
        f.cut.push((l.clone(), other, true, now + cut));
    }
    cut_clients_messages(sim, f, config, now + cut);
    f.log.push(format!(
        "{:.3}s renewal-then-failover: for {cut:?}, cut the messages of leader n{} to its \
         peers once its followers held RenewLeases (entry {index}, lifting a mark that stood \
         {oldest_mark:?}), and every client's messages to the nodes",
        now.as_secs_f64(),
        leader.1
    ));
}

/// Loses every client host's messages to the nodes until `heal_at` (their answers arrive).
fn cut_clients_messages(
    sim: &mut turmoil::Sim<'_>,
    f: &mut Faults,
    config: &RunConfig,
    heal_at: Duration,
) {
    let nodes: Vec<String> = (1..=config.nodes).map(node_name).collect();
    let clients: Vec<String> = f
        .hosts
        .iter()
        .filter(|h| !nodes.contains(h))
        .cloned()
        .collect();
    for c in &clients {
        for n in &nodes {
            sim.partition_oneway(c.as_str(), n.as_str());
            f.cut.push((c.clone(), n.clone(), true, heal_at));
        }
    }
}

/// One step of [`LagPlan`].
fn lag_then_lead(
    sim: &mut turmoil::Sim<'_>,
    f: &mut Faults,
    config: &RunConfig,
    history: &History,
    now: Duration,
) {
    let stamp = format!("{:.3}s", now.as_secs_f64());
    let restart = |f: &mut Faults| LagPlan::Idle {
        next_at: now + Duration::from_millis(f.rng.random_range(1_000..=4_000)),
    };
    f.lag = match f.lag {
        LagPlan::Idle { next_at } if now >= next_at => {
            let Some((old_term, l)) = live_leader(f, history) else {
                return;
            };
            // Long enough for an election, short enough to keep most of the run for the rest.
            let last = Duration::from_millis(f.rng.random_range(700..=1_500));
            isolate(sim, f, config.nodes, l, now + last);
            f.log.push(format!(
                "{stamp} lag-then-lead: isolate leader n{l} for {last:?}, so that a new one marks every session"
            ));
            LagPlan::WaitMark {
                old_term,
                since: now,
                until: now + Duration::from_secs(5),
            }
        }
        LagPlan::WaitMark { until, .. } if now >= until => restart(f),
        LagPlan::WaitMark {
            old_term, since, ..
        } => {
            let Some(leader) = live_leader(f, history).filter(|l| l.0 > old_term) else {
                return;
            };
            // A follower that knows a mark of this term committed (so applies it now).
            let lagger = history.with(|h| {
                let mark = h.committed.iter().find(|(i, c)| {
                    c.leader == leader
                        && matches!(c.op, Some(latchkey_core::Op::MarkLeases { .. }))
                        && h.appended
                            .get(&(**i, leader.0, leader.1))
                            .is_some_and(|a| a.first_at >= since)
                })?;
                let index = *mark.0;
                (1..=config.nodes).find(|n| {
                    *n != leader.1
                        && !f.crashed.contains_key(n)
                        && h.commit_checked.get(n).is_some_and(|&(_, c)| c >= index)
                })
            });
            let Some(node) = lagger else {
                return;
            };
            // Long enough for the leader to lift the marks by logged renewals and snapshot
            // past them, and for the follower's stale marks to be older than a TTL.
            let last = config.ttl.mul_f64(f.rng.random_range(1.0..1.5));
            isolate(sim, f, config.nodes, node, now + last);
            f.log.push(format!(
                "{stamp} lag-then-lead: cut n{node} off from its peers for {last:?}, right after \
                 it applied the marks of term {}",
                leader.0
            ));
            LagPlan::Lagging {
                node,
                heal_at: now + last,
            }
        }
        LagPlan::Lagging { node, heal_at } if now >= heal_at => LagPlan::CatchingUp {
            node,
            since: heal_at,
            until: now + Duration::from_secs(3),
        },
        LagPlan::CatchingUp { until, .. } if now >= until => restart(f),
        LagPlan::CatchingUp { node, since, until } => {
            let installed = history.with(|h| {
                h.probed
                    .iter()
                    .rev()
                    .take_while(|p| p.at >= since)
                    .any(|p| {
                        p.node == node
                            && matches!(
                                p.event,
                                latchkey_server::ProbeEvent::SnapshotInstalled { .. }
                            )
                    })
            });
            let leader = live_leader(f, history);
            match leader {
                Some((_, l)) if installed && l != node => {
                    let last = config.ttl.mul_f64(f.rng.random_range(1.0..2.0));
                    isolate(sim, f, config.nodes, l, now + last);
                    // The other followers cannot elect one of them without `node`.
                    let others: Vec<u64> = (1..=config.nodes)
                        .filter(|o| *o != l && *o != node)
                        .collect();
                    if others.len() > 1 {
                        for (i, a) in others.iter().enumerate() {
                            for b in &others[i + 1..] {
                                let (a, b) = (node_name(*a), node_name(*b));
                                sim.partition(a.as_str(), b.as_str());
                                f.cut.push((a, b, false, now + last));
                            }
                        }
                    }
                    f.log.push(format!(
                        "{stamp} lag-then-lead: n{node} installed a snapshot; isolate leader n{l} \
                         for {last:?} so that n{node} may lead"
                    ));
                    restart(f)
                }
                _ => LagPlan::CatchingUp { node, since, until },
            }
        }
        other => other,
    };
}

/// Carries out what clients asked for at their critical sections (cut me off, hold my
/// messages, crash me) and restarts crashed clients that are due. Runs every step: a client
/// may ask in the step the faults heal; after the heal, a crash it asked for restarts at once.
fn serve_client_requests(
    sim: &mut turmoil::Sim<'_>,
    f: &mut Faults,
    config: &RunConfig,
    controls: &[Arc<ClientControl>],
    now: Duration,
    healed: bool,
) {
    let stamp = |s: String| format!("{:.3}s {s}", now.as_secs_f64());
    let due: Vec<usize> = f
        .crashed_clients
        .iter()
        .filter(|(_, t)| **t <= now || healed)
        .map(|(i, _)| *i)
        .collect();
    for i in due {
        f.crashed_clients.remove(&i);
        let c = client_name(i as u32 + 1);
        sim.bounce(c.as_str());
        f.log.push(stamp(format!("restart client {c}")));
    }
    for (i, control) in controls.iter().enumerate() {
        let c = client_name(i as u32 + 1);
        if control.crash_now.swap(false, Ordering::Relaxed) {
            sim.crash(c.as_str());
            let down = Duration::from_millis(f.rng.random_range(200..=3_000));
            f.crashed_clients
                .insert(i, if healed { now } else { now + down });
            f.log.push(stamp(format!(
                "kill client {c} (holding a lock); restart after {down:?}"
            )));
        }
        let ms = control.pause_now_ms.swap(0, Ordering::Relaxed);
        if ms > 0 && !healed {
            for h in f.hosts.iter().filter(|h| **h != c) {
                sim.hold(c.as_str(), h.as_str());
            }
            f.held.push((c.clone(), now + Duration::from_millis(ms)));
            f.log.push(stamp(format!(
                "pause client {c} for {ms} ms (hold its messages), between its read and write"
            )));
        }
    }
    // Cut off the clients that asked for it (they reached the critical section of a cut drawn
    // earlier).
    for (i, control) in controls.iter().enumerate() {
        let ms = control.cut_now_ms.swap(0, Ordering::Relaxed);
        if ms == 0 || healed {
            continue;
        }
        let direction = f.client_cuts.remove(&i).unwrap_or(CutDirection::Both);
        let c = client_name(i as u32 + 1);
        let heal_at = now + Duration::from_millis(ms);
        for n in (1..=config.nodes).map(node_name) {
            match direction {
                CutDirection::Both => {
                    sim.partition(c.as_str(), n.as_str());
                    f.cut.push((c.clone(), n, false, heal_at));
                }
                CutDirection::FromClient => {
                    sim.partition_oneway(c.as_str(), n.as_str());
                    f.cut.push((c.clone(), n, true, heal_at));
                }
                CutDirection::ToClient => {
                    sim.partition_oneway(n.as_str(), c.as_str());
                    f.cut.push((n, c.clone(), true, heal_at));
                }
            }
        }
        f.log.push(stamp(format!(
            "cut client {c} off from every node ({direction:?}) for {ms} ms, in its critical \
             section"
        )));
    }
}

fn heal_all(sim: &mut turmoil::Sim<'_>, f: &mut Faults, config: &RunConfig) {
    for (id, _) in std::mem::take(&mut f.crashed) {
        sim.bounce(node_name(id));
    }
    for (a, b, _, _) in std::mem::take(&mut f.cut) {
        sim.repair(a.as_str(), b.as_str());
    }
    for (n, _) in std::mem::take(&mut f.held) {
        for h in f.hosts.iter().filter(|h| **h != n) {
            sim.release(n.as_str(), h.as_str());
        }
    }
    for (a, b, _) in std::mem::take(&mut f.lossy) {
        sim.set_link_fail_rate(a.as_str(), b.as_str(), 0.0);
        sim.set_link_max_message_latency(a.as_str(), b.as_str(), Duration::from_millis(2));
    }
    let _ = config;
}

/// Wall-clock time one simulation step may take before the run is declared livelocked: some
/// host keeps itself busy without letting simulated time advance (a task that spins). In a real
/// process that is a core burning at 100 %.
const STEP_WALL_MAX: Duration = Duration::from_secs(60);

/// Fails the run (and the process: a step cannot be interrupted) when a step never returns.
/// Steps taken, the simulated time, the faults so far, and whether the run ended.
type WatchState = (u64, Duration, Vec<String>, bool);

struct Watchdog {
    state: Arc<std::sync::Mutex<WatchState>>,
}

impl Watchdog {
    fn start(seed: u64) -> Watchdog {
        let state: Arc<std::sync::Mutex<WatchState>> = Arc::new(std::sync::Mutex::new((
            0,
            Duration::ZERO,
            Vec::new(),
            false,
        )));
        let watched = state.clone();
        std::thread::spawn(move || {
            let mut last = (u64::MAX, std::time::Instant::now());
            loop {
                std::thread::sleep(Duration::from_millis(500));
                let s = watched.lock().expect("watchdog lock");
                if s.3 {
                    return;
                }
                if s.0 != last.0 {
                    last = (s.0, std::time::Instant::now());
                } else if last.1.elapsed() > STEP_WALL_MAX {
                    eprintln!(
                        "=== latchkey-sim: seed {seed} FAILED ===\nreplay: {}\nviolation: [livelock] \
                         a host spun for {STEP_WALL_MAX:?} of wall time without letting simulated \
                         time pass, at simulated time {:.3}s\nfaults:",
                        crate::sweep::replay_command(seed),
                        s.1.as_secs_f64()
                    );
                    for f in &s.2 {
                        eprintln!("  {f}");
                    }
                    std::process::exit(3);
                }
            }
        });
        Watchdog { state }
    }

    fn stepped(&self, now: Duration, faults: &[String]) {
        let mut s = self.state.lock().expect("watchdog lock");
        s.0 += 1;
        s.1 = now;
        if s.2.len() != faults.len() {
            s.2 = faults.to_vec();
        }
    }

    fn stop(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.3 = true;
        }
    }
}

impl Drop for Watchdog {
    /// Also when a run unwinds: a panicking run must not look like a livelock.
    fn drop(&mut self) {
        self.stop();
    }
}

/// The message of a caught panic.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(s), _) => (*s).to_owned(),
        (_, Some(s)) => s.clone(),
        _ => "(not a string)".to_owned(),
    }
}
