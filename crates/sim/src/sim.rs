//! One run: a cluster of turmoil hosts, clients, the fault schedules, and the final checks.
//!
//! A [`Run`] goes through its phases as methods: `setup` (hosts, clients and the fault
//! schedules, all drawn from the seed), `drive` (steps the simulation, calling `fault`, `heal`
//! and `restart` at their times), then `check` (the checkers on the history). The fault
//! schedules themselves live in [`crate::faults`], what a run is and reports
//! ([`RunConfig`], [`RunReport`]) in [`crate::config`], the step watchdog in `watchdog.rs`.
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
use latchkey_server::{run_with, NodeEnv, ServerConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::checkers::{self, CheckConfig};
use crate::client::{self, ClientControl, ClientSetup, IdleSetup, LockUse};
use crate::clock::{DriftClock, SeededEntropy, DRIFT_PPM_MAX};
use crate::coverage::Coverage;
use crate::faults::{FaultCtx, Faults};
use crate::history::{History, HistoryData, Probed, ResumedLeases};
use crate::net::{self, SimConnector, PORT};
use crate::resource::Resource;
use crate::store::{Disk, SharedDisk, SimLogStore};
use crate::trace::Trace;

use crate::config::{client_name, node_name};
pub use crate::config::{GroupReport, RunConfig, RunReport};
use crate::watchdog::{panic_message, Watchdog};

struct NodeSetup {
    id: u64,
    /// One per Raft group.
    disks: Vec<SharedDisk>,
    dir: std::path::PathBuf,
    peers: BTreeMap<u64, String>,
    drift_ppm: i64,
    wall_offset_ms: i64,
    seed: u64,
    lives: Arc<AtomicU64>,
}

/// Starts node `setup.id`, recording each group's log into that group's history (`logs`, by
/// group).
fn start_node(sim: &mut turmoil::Sim<'_>, setup: NodeSetup, config: &RunConfig, logs: &[History]) {
    let config = config.clone();
    let logs = logs.to_vec();
    let setup = Rc::new(setup);
    sim.host(node_name(setup.id), move || {
        let setup = setup.clone();
        let config = config.clone();
        let logs = logs.clone();
        async move {
            let life = setup.lives.fetch_add(1, Ordering::Relaxed);
            let seed = setup
                .seed
                .wrapping_add(life.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let listener = turmoil::net::TcpListener::bind(("0.0.0.0", PORT)).await?;
            // Group 0's store draws from the node's seed as a cluster of one group does.
            let stores: Vec<SimLogStore> = setup
                .disks
                .iter()
                .zip(&logs)
                .enumerate()
                .map(|(group, (disk, log))| {
                    let group_seed = seed ^ (group as u64).wrapping_mul(0xa076_1d64_78bd_642f);
                    SimLogStore::open(setup.id, disk.clone(), log.clone(), config.disk, group_seed)
                })
                .collect();
            let mut server = ServerConfig::cluster(
                setup.id,
                format!("0.0.0.0:{PORT}").parse().expect("address"),
                setup.dir.clone(),
                setup.peers.clone(),
            );
            server.groups = config.groups;
            server.replicas = config.replicas;
            server.heartbeat_ms = config.heartbeat_ms;
            server.election_timeout_min_ms = config.election_timeout_ms.0;
            server.election_timeout_max_ms = config.election_timeout_ms.1;
            server.snapshot_every_entries = config.snapshot_every_entries;
            server.log_kept_after_snapshot = config.log_kept_after_snapshot;
            server.rebalance_after_ms = config.rebalance_after_ms;
            // Batch entries (issue #35) in half the seeds (`RunConfig::coalesce`): the
            // checkers and the coverage read a batch's operations each as an entry of its own
            // (`history::ops_in`).
            server.coalesce = config.coalesce;
            server.plant = latchkey_server::Plant {
                tolerate_log_reversion: config.disk.ack_before_fsync,
                ..config.plant
            };
            let clock = Arc::new(DriftClock::new(setup.drift_ppm, setup.wall_offset_ms));
            let env = NodeEnv {
                clock: clock.clone(),
                connector: Arc::new(SimConnector),
                entropy: Arc::new(SeededEntropy::new(seed)),
                probe: Arc::new(HistoryProbe {
                    logs: logs.clone(),
                    clock,
                }),
            };
            let server = server.validate()?;
            run_with(
                net::incoming(listener),
                None,
                server,
                env,
                stores,
                std::future::pending(),
            )
            .await
            .map_err(|e| -> Box<dyn std::error::Error> { e.into() })
        }
    });
}

/// Records what the nodes report through the probe, in true time, into the history of the
/// group that reported it.
struct HistoryProbe {
    logs: Vec<History>,
    /// The node's own clock, to convert the leases it resumed into true time.
    clock: Arc<DriftClock>,
}

impl latchkey_server::Probe for HistoryProbe {
    fn event(&self, node: u64, group: u32, mut event: latchkey_server::ProbeEvent) {
        let at = crate::clock::true_now();
        let history = &self.logs[group as usize];
        if let latchkey_server::ProbeEvent::LeasesResumed { term, leases, .. } = &mut event {
            // Kept apart from `probed`, converted to true time: one element per session.
            let until = std::mem::take(leases)
                .into_iter()
                .map(|(id, left)| (id.0, at + self.clock.true_duration(left)))
                .collect();
            let term = *term;
            history.with(|h| {
                h.resumed_leases.push(ResumedLeases {
                    at,
                    node,
                    term,
                    until,
                })
            });
        }
        history.with(|h| h.probed.push(Probed { at, node, event }));
    }

    fn wants_resumed_leases(&self) -> bool {
        true
    }

    fn wants_keepalives(&self) -> bool {
        true
    }
}

/// The name of the idle sessions' host.
const IDLE_HOST: &str = "idle";

/// One run in progress: the simulated cluster and what its phases share. The phases, in
/// order: [`Run::setup`] (hosts, clients, the fault schedules, all drawn from the seed), then
/// [`Run::drive`] steps the simulation, calling [`Run::fault`] in the safety phase,
/// [`Run::heal`] once at its end and [`Run::restart`] after the clients stopped, and
/// [`Run::check`] runs the checkers on the history.
struct Run<'c> {
    config: &'c RunConfig,
    sim: turmoil::Sim<'static>,
    /// The clients' operations, the resource's decisions, and group 0's log.
    history: History,
    /// By Raft group, what its members logged and probed: `logs[0]` is `history` itself.
    logs: Vec<History>,
    /// The nodes' data dirs, removed when the run ends.
    data: tempfile::TempDir,
    peers: BTreeMap<u64, String>,
    /// By node: its disks, one per Raft group.
    disks: BTreeMap<u64, Vec<SharedDisk>>,
    locks: Vec<String>,
    controls: Vec<Arc<ClientControl>>,
    faults: Faults,
    /// Draws which unsynced writes a crashed node's disk loses.
    crash_rng: StdRng,
    /// Set by the observer once it has read every lock after the final restart.
    final_read: Rc<RefCell<bool>>,
    healed: bool,
    restarted_all: bool,
    stop_at: Duration,
    /// Wall time the run stops for at every whole simulated second ([`run_slowed`]).
    wall_pause: Option<Duration>,
}

/// How the stepping ended.
#[derive(Default)]
struct Ended {
    sim_error: Option<String>,
    /// A simulated host panicked: the simulation's runtimes are mid-panic.
    panicked: bool,
}

pub fn run(config: &RunConfig) -> RunReport {
    let mut run = Run::setup(config);
    let ended = run.drive();
    run.check(ended)
}

/// [`run`] on a machine made slow: the run stops for `pause` of wall time at every whole second
/// of simulated time. A run is a function of its seed alone, so the report is the same, trace
/// hash included (`tests/seeds.rs` holds it to that); code that reads the machine's clock where
/// it should read the simulated one (h2 did: vendor/README.md) makes it differ.
pub fn run_slowed(config: &RunConfig, pause: Duration) -> RunReport {
    let mut run = Run::setup(config);
    run.wall_pause = Some(pause);
    let ended = run.drive();
    run.check(ended)
}

impl<'c> Run<'c> {
    /// Builds the cluster, the clients and the fault schedules. Every seeded draw of the run's
    /// shape is made here, in a fixed order: turmoil's seed, each node's clock and entropy, each
    /// client's clock and jitter, the idle host's, the fault RNG, the crash RNG.
    fn setup(config: &'c RunConfig) -> Run<'c> {
        assert!(config.groups >= 1, "a cluster has at least one group");
        let history = History::default();
        let logs: Vec<History> = std::iter::once(history.clone())
            .chain((1..config.groups).map(|_| History::default()))
            .collect();
        let resource = Resource::new(history.clone());
        let mut rng = StdRng::seed_from_u64(config.seed);
        // openraft's election timeouts and ticker phases come from this thread's RNG (every
        // host runs on it); seed it from the run's seed, without drawing from `rng`, so the run
        // replays.
        latchkey_raft::seed_thread_rng(config.seed ^ 0x6f70_656e_7261_6674);
        let mut sim = turmoil::Builder::new()
            .simulation_duration(Duration::from_secs(600))
            .tick_duration(Duration::from_millis(1))
            .min_message_latency(Duration::from_micros(100))
            .max_message_latency(Duration::from_millis(2))
            .tcp_capacity(1 << 16)
            .rng_seed(rng.random())
            .build();

        let data = tempfile::tempdir().expect("temp dir");
        let peers: BTreeMap<u64, String> = (1..=config.nodes)
            .map(|id| (id, format!("{}:{PORT}", node_name(id))))
            .collect();
        let mut disks = BTreeMap::new();
        for id in 1..=config.nodes {
            let node_disks: Vec<SharedDisk> = (0..config.groups).map(|_| Disk::new()).collect();
            disks.insert(id, node_disks.clone());
            start_node(
                &mut sim,
                NodeSetup {
                    id,
                    disks: node_disks,
                    dir: data.path().join(node_name(id)),
                    peers: peers.clone(),
                    // Server and client clocks drift both ways within the bound, so the worst
                    // case of the deadline rule (fast leader, slow client) is covered.
                    drift_ppm: rng.random_range(-DRIFT_PPM_MAX..=DRIFT_PPM_MAX),
                    wall_offset_ms: rng.random_range(-5_000..=5_000),
                    seed: rng.random(),
                    lives: Arc::default(),
                },
                config,
                &logs,
            );
        }

        let (locks, uses) = lock_uses(config);
        let stop_at = config.stop_at();
        let mut controls = Vec::new();
        for id in 1..=config.clients {
            let control = Arc::new(ClientControl::default());
            controls.push(control.clone());
            let setup = ClientSetup {
                id,
                nodes: peers.values().cloned().collect(),
                locks: locks.clone(),
                uses: uses.clone(),
                ttl: config.ttl,
                drift_ppm: rng.random_range(-DRIFT_PPM_MAX..=DRIFT_PPM_MAX),
                seed: rng.random(),
                stop_at,
                long_holds_until: config.safety,
                work_ms: (5, 150),
                lock_delay: config.lock_delay,
                elections: config.elections,
                batch: config.client_batch,
            };
            // A host, not a turmoil client, so that it can be crashed like a process; every
            // life runs the same software.
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
                joins: if config.groups > 1 {
                    one_lock_per_group(&locks, config.groups)
                } else {
                    Vec::new()
                },
            };
            let history = history.clone();
            sim.host(IDLE_HOST, move || {
                client::run_idle(setup.clone(), history.clone())
            });
        }

        let hosts = (1..=config.nodes)
            .map(node_name)
            .chain((1..=config.clients).map(client_name))
            .chain((config.idle_sessions > 0).then(|| IDLE_HOST.to_owned()))
            .collect();
        let faults = Faults::new(StdRng::seed_from_u64(rng.random()), config, hosts);
        let crash_rng = StdRng::seed_from_u64(rng.random());
        Run {
            config,
            sim,
            history,
            logs,
            data,
            peers,
            disks,
            locks,
            controls,
            faults,
            crash_rng,
            final_read: Rc::default(),
            healed: false,
            restarted_all: false,
            stop_at,
            wall_pause: None,
        }
    }

    /// The fault schedules' view of this step. The schedules that follow a leader follow one
    /// Raft group's log per run, group `seed % groups` ([`RunConfig::targeted_group`]), so
    /// that across seeds every group meets them (with one group, group 0's, as before).
    fn faulting(&mut self, now: Duration) -> FaultCtx<'_, 'static> {
        FaultCtx {
            sim: &mut self.sim,
            faults: &mut self.faults,
            config: self.config,
            history: &self.logs[self.config.targeted_group() as usize],
            disks: &self.disks,
            controls: &self.controls,
            crash_rng: &mut self.crash_rng,
            now,
        }
    }

    /// Steps the simulation until the observer has read every lock after the final restart,
    /// an error or panic ends it, or the time runs out.
    fn drive(&mut self) -> Ended {
        let end = self.stop_at + Duration::from_secs(15);
        let mut ended = Ended::default();
        let watchdog = Watchdog::start(self.config.seed, self.config.groups, self.config.replicas);
        let progress = std::env::var_os("LATCHKEY_SIM_PROGRESS").is_some();
        let wall = std::time::Instant::now();
        let mut next_progress = Duration::ZERO;
        let mut next_pause = Duration::from_secs(1);
        let mut logged = 0;
        loop {
            let now = self.sim.elapsed();
            if progress && now >= next_progress {
                next_progress += Duration::from_secs(1);
                let (events, committed) =
                    self.history.with(|h| (h.events.len(), h.committed.len()));
                eprintln!(
                    "sim {:.0}s wall {:.1}s: {events} events, {committed} committed",
                    now.as_secs_f64(),
                    wall.elapsed().as_secs_f64()
                );
            }
            if now >= end || *self.final_read.borrow() {
                break;
            }
            if let Some(pause) = self.wall_pause.filter(|_| now >= next_pause) {
                next_pause += Duration::from_secs(1);
                std::thread::sleep(pause);
            }
            let healed = self.healed;
            self.faulting(now).serve_client_requests(healed);
            if now < self.config.safety {
                self.fault(now);
            } else if !self.healed {
                self.heal(now);
            }
            if now >= self.stop_at + Duration::from_secs(1) && !self.restarted_all {
                self.restart(now);
            }
            let log = &self.faults.log;
            if progress && log.len() > logged {
                for l in &log[logged..] {
                    eprintln!("fault: {l}");
                }
                logged = log.len();
            }
            watchdog.stepped(now, log);
            // A panic in any task of a simulated host (turmoil's runtimes shut down on one
            // under tokio_unstable) unwinds out of the step: a failed run, reported with its
            // seed, not a crashed sweep.
            let sim = &mut self.sim;
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.step())) {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    ended.sim_error = Some(e.to_string());
                    break;
                }
                Err(panic) => {
                    ended.sim_error = Some(format!(
                        "a simulated host panicked: {}",
                        panic_message(panic.as_ref())
                    ));
                    ended.panicked = true;
                    break;
                }
            }
        }
        if self.restarted_all && !*self.final_read.borrow() && ended.sim_error.is_none() {
            ended.sim_error =
                Some("the observer could not read the locks after the final restart".into());
        }
        watchdog.stop();
        ended
    }

    /// A step of the safety phase: the fault schedules.
    fn fault(&mut self, now: Duration) {
        self.faulting(now).safety_step();
    }

    /// The end of the safety phase: every fault heals, for the liveness phase.
    fn heal(&mut self, now: Duration) {
        self.faulting(now).heal_all();
        self.history.with(|h| h.healed_at = Some(now));
        self.faults
            .log
            .push(format!("{:.3}s heal everything", now.as_secs_f64()));
        self.healed = true;
    }

    /// After the clients stopped: every node crashes (losing unsynced writes) and restarts at
    /// once, then an observer reads every lock.
    fn restart(&mut self, now: Duration) {
        self.restarted_all = true;
        self.faults.log.push(format!(
            "{:.3}s crash and restart every node",
            now.as_secs_f64()
        ));
        for (id, disks) in &self.disks {
            self.sim.crash(node_name(*id));
            crate::store::crash_node(disks, &mut self.crash_rng);
            self.sim.bounce(node_name(*id));
        }
        let history = self.history.clone();
        let nodes: Vec<String> = self.peers.values().cloned().collect();
        let locks = self.locks.clone();
        let done = self.final_read.clone();
        self.sim.client("observer", async move {
            let holders = read_final(&nodes, &locks).await;
            history.with(|h| h.final_holders = holders);
            *done.borrow_mut() = true;
            Ok(())
        });
    }

    /// Ends the simulation and runs the checkers on the history.
    fn check(self, ended: Ended) -> RunReport {
        let Run {
            config,
            sim,
            history,
            logs,
            data: _data_dirs,
            faults,
            stop_at,
            ..
        } = self;
        if ended.panicked {
            // Its runtimes are mid-panic (borrowed cells, half-dropped tasks): dropping them
            // could panic again. Leak this one failed run instead.
            std::mem::forget(sim);
        } else {
            drop(sim);
        }

        let data = history.snapshot();
        let check = CheckConfig {
            settle: config.settle,
            liveness_until: stop_at - Duration::from_millis(client::WAIT_MS * 2),
        };
        // Each group's safety checkers see its log and its locks' operations: a group is a
        // lock service of its own, and every invariant is per lock (tokens of two groups are
        // not comparable). `logs[0]` is `history` itself. Liveness is judged once, over
        // every lock: a client that moved on to another group's locks was not left waiting.
        let by_group: Vec<HistoryData> = if config.groups == 1 {
            vec![history.snapshot()]
        } else {
            logs.iter()
                .enumerate()
                .map(|(g, log)| data.of_group(&log.snapshot(), g as u32, config.groups))
                .collect()
        };
        let mut violations = Vec::new();
        let mut coverage = Coverage::default();
        let mut group_reports = Vec::new();
        let (mut committed_entries, mut hold_checks_near_expiry) = (0, 0);
        for (g, h) in by_group.iter().enumerate() {
            violations.extend(checkers::check_safety(h).into_iter().map(|mut v| {
                if config.groups > 1 {
                    v.message = format!("group {g}: {}", v.message);
                }
                v
            }));
            let reached = Coverage::measure(h);
            coverage.add(&reached);
            committed_entries += h.committed.len();
            group_reports.push(GroupReport {
                grants: granted(&h.operations()),
                committed_entries: h.committed.len(),
                coverage: reached,
            });
            hold_checks_near_expiry += checkers::hold_checks_before_end(h, Duration::from_secs(1));
        }
        // The clients' batches are the run's, not a group's.
        coverage.client_batches_of_several = data.client_batches_of_several;
        // A run cut short by an error still had its safety checked up to there (liveness and
        // the final restart did not happen); liveness only runs on a safe history.
        if ended.sim_error.is_none() && violations.is_empty() {
            violations.extend(checkers::check_liveness(&data, &check));
        }
        // Every group's operations: the client events of all groups are in `history`.
        let ops = history.with(|h| h.operations());
        let trace_hash = trace(config, &faults.log, &logs, &ended);
        RunReport {
            config: config.clone(),
            violations,
            faults: faults.log,
            operations: ops.len(),
            grants: granted(&ops),
            committed_entries,
            hold_checks_near_expiry,
            coverage,
            by_group: group_reports,
            sim_error: ended.sim_error,
            trace_hash,
        }
    }
}

/// The election plants (issue #32 item 1), each with its field's name: off, the trace leaves
/// them out, as it leaves out the fields added after the CI seeds were chosen.
type PlantField = (fn(&latchkey_core::TablePlant) -> bool, &'static str);
const ELECTION_PLANTS: [PlantField; 4] = [
    (|p| p.proclaim_past_term, "proclaim_past_term"),
    (|p| p.refused_proclaim_applied, "refused_proclaim_applied"),
    (|p| p.proclaim_kept_old_value, "proclaim_kept_old_value"),
    (
        |p| p.leader_hidden_while_contended,
        "leader_hidden_while_contended",
    ),
];

/// The configuration as the trace shows it: its `Debug` text without the fields added after
/// the CI seeds were chosen while they are off (the lock-delay and election workloads and
/// their plants), so
/// that every earlier seed's trace, and its trace hash, stays what it was.
fn config_line(config: &RunConfig) -> String {
    let mut line = format!("{config:?}");
    if !config.lock_delay {
        line = line.replacen(", lock_delay: false", "", 1);
    }
    if !config.plant.delay_ends_early {
        line = line.replacen(", delay_ends_early: false", "", 1);
    }
    if !config.plant.batch_answers_reversed {
        line = line.replacen(", batch_answers_reversed: false", "", 1);
    }
    if !config.elections {
        line = line.replacen(", elections: false", "", 1);
    }
    if !config.coalesce {
        line = line.replacen(", coalesce: false", "", 1);
    }
    if !config.client_batch {
        line = line.replacen(", client_batch: false", "", 1);
    }
    for (set, field) in ELECTION_PLANTS
        .iter()
        .map(|(get, f)| (get(&config.plant.table), f))
    {
        if !set {
            line = line.replacen(&format!(", {field}: false"), "", 1);
        }
    }
    line
}

/// The hash of the run's trace ([`crate::trace`]): its configuration, faults, every group's history
/// and how it ended. With `LATCHKEY_SIM_TRACE=DIR` the trace is also written to a file there.
fn trace(config: &RunConfig, faults: &[String], logs: &[History], ended: &Ended) -> u64 {
    let dir = std::env::var_os(crate::trace::TRACE_DIR_VAR);
    let mut trace = Trace::new(dir.is_some());
    trace.line(&format!("config {}", config_line(config)));
    for f in faults {
        trace.line(&format!("fault {f}"));
    }
    for (g, log) in logs.iter().enumerate() {
        trace.history(&format!("group {g}"), &log.snapshot());
    }
    trace.line(&format!("ended {:?}", ended.sim_error));
    let hash = trace.hash();
    if let (Some(dir), Some(text)) = (dir, trace.text()) {
        let path = std::path::Path::new(&dir).join(format!(
            "seed-{}-groups-{}-{hash:016x}.trace",
            config.seed, config.groups
        ));
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("latchkey-sim: could not write {}: {e}", path.display());
        }
    }
    hash
}

/// How many of `ops` were granted.
fn granted(ops: &[crate::history::Operation]) -> usize {
    ops.iter()
        .filter(|o| matches!(o.ret, Some((crate::history::Ret::Granted { .. }, _))))
        .count()
}

/// The locks the clients take: `lock-0`, `lock-1`, … (`count` of them), and with several Raft
/// groups as many more as it takes for every group to have at least one, so that every
/// group's checkers judge some operations.
fn lock_names(count: usize, groups: u32) -> Vec<String> {
    let mut names = Vec::new();
    let mut covered = std::collections::BTreeSet::new();
    for i in 0..LOCK_NAMES_TRIED_MAX {
        if names.len() >= count && covered.len() == groups as usize {
            return names;
        }
        let name = format!("lock-{i}");
        let fresh = covered.insert(latchkey_core::group_of(&name, groups));
        if names.len() < count || fresh {
            names.push(name);
        }
    }
    panic!("{LOCK_NAMES_TRIED_MAX} lock names did not cover {groups} groups");
}

/// The run's lock names ([`lock_names`]), then with [`RunConfig::primitives`] a read-write
/// lock `rw-0` and a semaphore `sem-0`, and how the clients take each.
fn lock_uses(config: &RunConfig) -> (Vec<String>, Vec<LockUse>) {
    let mut locks = lock_names(config.locks, config.groups);
    let mut uses = vec![LockUse::Mutex; locks.len()];
    if let Some(p) = config.primitives {
        locks.push("rw-0".to_owned());
        uses.push(LockUse::ReadWrite {
            reader_p: p.reader_p,
        });
        locks.push("sem-0".to_owned());
        uses.push(LockUse::Semaphore { permits: p.permits });
    }
    (locks, uses)
}

/// Of `locks`, the first of each group but group 0 (where a session starts), in group order.
fn one_lock_per_group(locks: &[String], groups: u32) -> Vec<String> {
    let mut by_group = BTreeMap::new();
    for name in locks {
        let g = latchkey_core::group_of(name, groups);
        if g != 0 {
            by_group.entry(g).or_insert_with(|| name.clone());
        }
    }
    by_group.into_values().collect()
}

/// Names tried to cover every group with a lock: the hash spreads names evenly, so covering
/// `GROUPS_MAX` (64) groups takes about 64 · ln 64 ≈ 270 names (the coupon collector).
const LOCK_NAMES_TRIED_MAX: usize = 100_000;

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

#[cfg(test)]
mod tests {
    use super::{config_line, RunConfig};

    /// A seed's configuration without lock-delays or elections traces as it did before they
    /// existed (its trace hash unchanged); with them, or with their plants, the trace says so.
    #[test]
    fn the_trace_names_the_lock_delay_and_election_fields_only_when_set() {
        for seed in 0..8 {
            let mut config = RunConfig::from_seed(seed);
            config.coalesce = false;
            config.client_batch = false;
            let line = config_line(&config);
            let fields = [
                "lock_delay",
                "delay_ends_early",
                "elections",
                "coalesce",
                "client_batch",
                "batch_answers_reversed",
                "proclaim_past_term",
                "refused_proclaim_applied",
                "proclaim_kept_old_value",
                "leader_hidden_while_contended",
            ];
            for field in fields {
                assert!(!line.contains(field), "{line}");
            }
            let mut old = format!("{config:?}");
            for field in fields {
                old = old.replace(&format!(", {field}: false"), "");
            }
            assert_eq!(old, line);
            config.lock_delay = true;
            config.plant.delay_ends_early = true;
            config.plant.batch_answers_reversed = true;
            config.elections = true;
            config.coalesce = true;
            config.client_batch = true;
            config.plant.table.proclaim_past_term = true;
            config.plant.table.refused_proclaim_applied = true;
            config.plant.table.proclaim_kept_old_value = true;
            config.plant.table.leader_hidden_while_contended = true;
            let line = config_line(&config);
            for field in fields {
                assert!(line.contains(&format!("{field}: true")), "{line}");
            }
        }
    }
}
