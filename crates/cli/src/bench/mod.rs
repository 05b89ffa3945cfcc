//! `latchkey bench`: the load generator whose figures this project quotes.
//!
//! Layout:
//! - this file: flags -> [`Plan`] (checked once), the target (an existing cluster, or one of
//!   [`cluster`]'s own), the measured [`Window`] (server metrics and CPU scraped at both
//!   ends), the progress line, and the exit status;
//! - [`workloads`]: uncontended, contended, herd, hold, failover, semaphore;
//! - [`election`]: real `latchkey elect` processes, the leader's killed -9;
//! - [`cluster`]: `--cluster N`, real `latchkey serve` processes on loopback;
//! - [`scrape`]: `/metrics` over HTTP, CPU and memory from `/proc`;
//! - [`report`]: the [`report::Report`], as JSON or a table.
//!
//! Every figure covers the measured window only: sessions are opened (and, for hold, the
//! locks taken) before the warm-up, and an operation counts if it completes inside the window.

mod cluster;
mod election;
mod report;
mod scrape;
mod workloads;

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use latchkey_core::limits::{
    BENCH_CLIENTS_MAX, BENCH_ELECTION_CANDIDATES_MAX, BENCH_ELECTION_ROUNDS_MAX,
    BENCH_FAILOVER_ROUNDS_MAX, BENCH_HERD_CLIENTS_DEFAULT, BENCH_HOLD_LOCKS_MAX,
    HOLDERS_PER_LOCK_MAX, LOCKS_PER_SESSION_MAX, WAITERS_PER_LOCK_MAX,
};

use self::cluster::BenchCluster;
use self::report::{Cpu, NodeCpu, ServerFigures};
use self::scrape::Samples;
use self::workloads::{Phase, Stats};
use crate::BenchArgs;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Each client acquires and releases its own lock.
    Uncontended,
    /// All clients take turns on one lock (FIFO queue on the server).
    Contended,
    /// Like contended, with many waiters (500 unless --clients).
    Herd,
    /// Sessions hold --locks locks idle, renewing.
    Hold,
    /// Uncontended load while the leader is killed -9 and restarted, --rounds times.
    Failover,
    /// All clients take turns on one semaphore of --permits permits (issue #32): at most that
    /// many hold one at once, the rest wait in its FIFO queue.
    Semaphore,
    /// --clients (3 unless given) `latchkey elect` processes campaign for one name, each
    /// COMMAND a shell that records its start; the leader's process is killed -9, --rounds
    /// times: kill -> the next leader's COMMAND start (about the --ttl, 3 s unless given: a
    /// killed leader leads until its session expires). --duration and --warmup are not used.
    Election,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Uncontended => "uncontended",
            Workload::Contended => "contended",
            Workload::Herd => "herd",
            Workload::Hold => "hold",
            Workload::Failover => "failover",
            Workload::Semaphore => "semaphore",
            Workload::Election => "election",
        }
    }

    fn default_clients(self) -> usize {
        match self {
            Workload::Uncontended | Workload::Contended | Workload::Semaphore => 64,
            Workload::Herd => BENCH_HERD_CLIENTS_DEFAULT,
            Workload::Hold => 100,
            // Light load: the figure is the failover, not the throughput.
            Workload::Failover => 8,
            // A leader and a queue behind it.
            Workload::Election => 3,
        }
    }

    fn default_ttl(self) -> Duration {
        match self {
            // The figure is about one lease: a short one keeps rounds short.
            Workload::Election => Duration::from_secs(3),
            _ => Duration::from_secs(15),
        }
    }
}

/// `--cluster`: 1, 3, 5, 6, 7 or 9 members. An even count below six tolerates no more
/// failures than the odd one below it; six and more are for `--replicas` (groups placed on
/// subsets of the members, whose group size, not the member count, sets the quorum).
pub fn parse_cluster_size(text: &str) -> Result<usize, String> {
    match text.trim() {
        "1" => Ok(1),
        "3" => Ok(3),
        "5" => Ok(5),
        "6" => Ok(6),
        "7" => Ok(7),
        "9" => Ok(9),
        _ => Err(format!(
            "{text:?}: the bench starts 1, 3, 5, 6, 7 or 9 members"
        )),
    }
}

/// The checked flags.
#[derive(Debug, Clone)]
pub struct Plan {
    pub workload: Workload,
    pub clients: usize,
    /// The `Client`s (connections) the clients' sessions are spread over: 1 to `clients`.
    pub connections: usize,
    /// The clients send their operations in `Batch` calls (`--batch`).
    pub batch: bool,
    /// With `batch`, the `Batch` calls each client has in flight to one member
    /// (`--batch-in-flight`; the library's default unless given).
    pub batch_in_flight: usize,
    pub duration: Duration,
    pub warmup: Duration,
    pub ttl: Duration,
    pub cluster: Option<usize>,
    /// `--groups` of the bench's own cluster.
    pub groups: u32,
    /// `--replicas` of the bench's own cluster (0: every member in every group).
    pub replicas: u32,
    pub locks: usize,
    pub rounds: u32,
    /// semaphore: the semaphore's permits, and how long each grant is held.
    pub permits: u32,
    pub hold: Duration,
    pub prefix: String,
    pub json: bool,
}

impl Plan {
    fn from_args(args: &BenchArgs) -> anyhow::Result<Plan> {
        let workload = args.workload;
        let clients = args.clients.unwrap_or(workload.default_clients());
        let ttl = args.ttl.unwrap_or(workload.default_ttl());
        anyhow::ensure!(
            (1..=BENCH_CLIENTS_MAX).contains(&clients),
            "--clients must be 1 to {BENCH_CLIENTS_MAX}"
        );
        let connections = args.connections.unwrap_or(clients);
        anyhow::ensure!(
            (1..=clients).contains(&connections),
            "--connections must be 1 to --clients ({clients})"
        );
        anyhow::ensure!(
            !args.batch || workload != Workload::Election,
            "--batch is not for --workload election: each candidate is a process of its own"
        );
        anyhow::ensure!(
            args.connections.is_none() || workload != Workload::Election,
            "--connections is not for --workload election: each candidate is a process of its own"
        );
        anyhow::ensure!(!args.duration.is_zero(), "--duration must be above 0");
        if matches!(
            workload,
            Workload::Contended | Workload::Herd | Workload::Semaphore
        ) {
            anyhow::ensure!(
                clients <= WAITERS_PER_LOCK_MAX,
                "--clients {clients} is above the server's waiters per lock ({WAITERS_PER_LOCK_MAX})"
            );
        }
        latchkey_core::groups::check_groups(args.groups)
            .map_err(|e| anyhow::anyhow!("--groups: {e}"))?;
        anyhow::ensure!(
            args.groups == 1 || args.cluster.is_some(),
            "--groups starts the bench's own cluster with that many Raft groups: give --cluster too"
        );
        if let Some(n) = args.cluster {
            latchkey_core::groups::check_replicas(args.replicas, n, args.groups)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            anyhow::ensure!(
                n <= 5 || args.replicas != 0,
                "--cluster {n} is for groups on replica subsets: give --replicas too"
            );
        }
        anyhow::ensure!(
            args.replicas == 0 || args.cluster.is_some(),
            "--replicas places the bench's own cluster's groups: give --cluster too"
        );
        if workload == Workload::Hold {
            anyhow::ensure!(
                (1..=BENCH_HOLD_LOCKS_MAX).contains(&args.locks),
                "--locks must be 1 to {BENCH_HOLD_LOCKS_MAX}"
            );
            anyhow::ensure!(
                args.locks <= clients * LOCKS_PER_SESSION_MAX,
                "--locks {} over {clients} sessions is above the server's {LOCKS_PER_SESSION_MAX} locks per session; add --clients",
                args.locks
            );
        }
        if workload == Workload::Semaphore {
            anyhow::ensure!(
                (1..=HOLDERS_PER_LOCK_MAX).contains(&(args.permits as usize)),
                "--permits must be 1 to {HOLDERS_PER_LOCK_MAX}"
            );
            anyhow::ensure!(
                args.hold < ttl,
                "--hold must be shorter than --ttl (a holder must renew)"
            );
        }
        if workload == Workload::Failover {
            anyhow::ensure!(
                matches!(args.cluster, Some(3 | 5)),
                "--workload failover needs --cluster 3 or 5 (it kills and restarts members)"
            );
            anyhow::ensure!(
                (1..=BENCH_FAILOVER_ROUNDS_MAX).contains(&args.rounds),
                "--rounds must be 1 to {BENCH_FAILOVER_ROUNDS_MAX}"
            );
        }
        if workload == Workload::Election {
            anyhow::ensure!(
                (2..=BENCH_ELECTION_CANDIDATES_MAX).contains(&clients),
                "--clients (candidates) must be 2 to {BENCH_ELECTION_CANDIDATES_MAX} for \
                 --workload election: the next leader is one of the others"
            );
            anyhow::ensure!(
                (1..=BENCH_ELECTION_ROUNDS_MAX).contains(&args.rounds),
                "--rounds must be 1 to {BENCH_ELECTION_ROUNDS_MAX}"
            );
        }
        Ok(Plan {
            workload,
            clients,
            connections,
            batch: args.batch,
            batch_in_flight: args.batch_in_flight.map_or(
                latchkey_core::limits::CLIENT_BATCH_CALLS_IN_FLIGHT_DEFAULT,
                |k| k as usize,
            ),
            duration: args.duration,
            warmup: args.warmup,
            ttl,
            cluster: args.cluster,
            groups: args.groups,
            replicas: args.replicas,
            locks: args.locks,
            rounds: args.rounds,
            permits: args.permits,
            hold: args.hold,
            prefix: args.prefix.clone(),
            json: args.json,
        })
    }
}

/// Where the load goes, and where its metrics are read.
pub struct Target {
    /// The endpoints, with how to connect to them: the bench's `--ca`, `--cert`/`--key` and
    /// `--auth-token` for an existing cluster, none for the bench's own.
    pub connect: crate::Endpoints,
    /// `(member id, metrics address)`; empty when unknown.
    pub metrics: Vec<(u64, String)>,
}

impl Target {
    pub fn endpoints(&self) -> &[String] {
        &self.connect.endpoints
    }

    /// A client of the target, connected as the bench's options say.
    pub fn client(&self) -> anyhow::Result<latchkey_client::Client> {
        Ok(self.connect.client()?)
    }

    /// A client of the target whose sessions' operations ride `Batch` calls with `Some(K)`, K
    /// of them in flight to one member.
    pub fn client_batching(&self, batch: Option<usize>) -> anyhow::Result<latchkey_client::Client> {
        Ok(self.connect.client_batching(batch)?)
    }

    /// The flags that give a `latchkey` child process the target's TLS files; the auth token
    /// goes in its environment instead ([`Target::auth_token`]), off its command line.
    pub fn tls_args(&self) -> Vec<String> {
        let c = &self.connect;
        let files = [("--ca", &c.ca), ("--cert", &c.cert), ("--key", &c.key)];
        files
            .into_iter()
            .filter_map(|(flag, file)| {
                Some([flag.to_owned(), file.as_ref()?.display().to_string()])
            })
            .flatten()
            .collect()
    }

    pub fn auth_token(&self) -> Option<&str> {
        self.connect.auth_token.as_deref()
    }
}

/// What the bench reads at one end of the window.
pub struct Snapshot {
    at: Instant,
    bench_cpu_s: Option<f64>,
    /// Per member: its CPU seconds (only for the bench's own cluster).
    server_cpu_s: Vec<(u64, f64)>,
    /// Per member: its metrics, `None` if the scrape failed.
    samples: Vec<(u64, Option<Samples>)>,
}

impl Snapshot {
    pub async fn take(target: &Target, cluster: Option<&BenchCluster>) -> Snapshot {
        let mut samples = Vec::with_capacity(target.metrics.len());
        for (id, addr) in &target.metrics {
            let scraped = scrape::scrape(addr).await;
            if let Err(e) = &scraped {
                tracing::warn!(member = id, error = %e, "metrics not read");
            }
            samples.push((*id, scraped.ok()));
        }
        let server_cpu_s = cluster
            .map(|c| {
                c.ids()
                    .into_iter()
                    .filter_map(|id| Some((id, c.cpu_s(id)?)))
                    .collect()
            })
            .unwrap_or_default();
        Snapshot {
            at: Instant::now(),
            bench_cpu_s: scrape::cpu_s("self"),
            server_cpu_s,
            samples,
        }
    }
}

/// The measured window, between two snapshots.
pub struct Window {
    pub before: Snapshot,
    pub after: Snapshot,
    /// Metrics of members read just before the bench killed them (failover), in order: a
    /// restarted member counts from zero, so what its earlier processes counted is here.
    pub kills: Vec<(u64, Option<Samples>)>,
}

/// Calls the bench makes to watch the cluster, never as part of a workload.
const BENCH_OWN_METHODS: [&str; 2] = ["node_status", "describe"];
/// The count of a member's log group commits (each one `write` and one `fdatasync`).
const LOG_COMMITS: &str = "latchkey_fsync_seconds_count";

/// A counter's growth; a member restarted in between (failover) counts from zero again.
/// The servers' counts of applied entries with a command and of their operations (a batch
/// entry's each count, issue #35).
const ENTRIES_APPLIED: &str = "latchkey_entries_applied_total";
const OPERATIONS_APPLIED: &str = "latchkey_operations_applied_total";

fn counter_delta(before: f64, after: f64) -> f64 {
    if after >= before {
        after - before
    } else {
        after
    }
}

impl Window {
    pub fn seconds(&self) -> f64 {
        (self.after.at - self.before.at).as_secs_f64().max(1e-9)
    }

    /// Requests and log entries in the window, per op; `None` unless every member was read
    /// at both ends.
    pub fn server_figures(&self, ops: u64) -> Option<ServerFigures> {
        if self.before.samples.is_empty() {
            return None;
        }
        let mut by_method: BTreeMap<String, u64> = BTreeMap::new();
        let (mut last_before, mut last_after) = (0f64, 0f64);
        let mut group_last: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
        let mut log_commits = 0u64;
        // Entries with a command and their operations, as the member that applied the most
        // counted them (every member applies every committed entry; the leader has).
        let (mut entries_applied, mut operations_applied) = (0f64, 0f64);
        for ((id, before), (_, after)) in self.before.samples.iter().zip(&self.after.samples) {
            let (before, after) = (before.as_ref()?, after.as_ref()?);
            let applied = |name: &str| {
                counter_delta(
                    before.get(name).unwrap_or(0.0),
                    after.get(name).unwrap_or(0.0),
                )
            };
            if applied(ENTRIES_APPLIED) > entries_applied {
                entries_applied = applied(ENTRIES_APPLIED);
                operations_applied = applied(OPERATIONS_APPLIED);
            }
            // The member's processes in the window, each with its first and last reading:
            // the first from the window's start, every later one from zero.
            let mut ends: Vec<&Samples> = Vec::new();
            for (_, killed) in self.kills.iter().filter(|(k, _)| k == id) {
                ends.push(killed.as_ref()?);
            }
            ends.push(after);
            let mut start = before.requests();
            let mut commits_start = before.get(LOG_COMMITS).unwrap_or(0.0);
            for end in ends {
                for (method, n) in end.requests() {
                    let delta = counter_delta(start.get(&method).copied().unwrap_or(0.0), n) as u64;
                    if delta > 0 {
                        *by_method.entry(method).or_default() += delta;
                    }
                }
                log_commits +=
                    counter_delta(commits_start, end.get(LOG_COMMITS).unwrap_or(0.0)) as u64;
                start = Default::default();
                commits_start = 0.0;
            }
            // The leader's log is the longest; a follower's can only trail it. With several
            // groups, each group's log (their entries add up).
            let index = "latchkey_raft_last_log_index";
            last_before = last_before.max(before.get(index).unwrap_or(0.0));
            last_after = last_after.max(after.get(index).unwrap_or(0.0));
            for (group, last) in before.group_last_log_index() {
                let e = group_last.entry(group).or_insert((0.0, 0.0));
                e.0 = f64::max(e.0, last);
            }
            for (group, last) in after.group_last_log_index() {
                let e = group_last.entry(group).or_insert((0.0, 0.0));
                e.1 = f64::max(e.1, last);
            }
        }
        if !group_last.is_empty() {
            last_before = group_last.values().map(|(b, _)| b).sum();
            last_after = group_last.values().map(|(_, a)| a).sum();
        }
        // The bench's own health checks (status, and a read through the leader) are listed
        // by method but are not the workload's requests.
        let requests: u64 = by_method
            .iter()
            .filter(|(m, _)| !BENCH_OWN_METHODS.contains(&m.as_str()))
            .map(|(_, n)| n)
            .sum();
        let log_entries = (last_after - last_before).max(0.0) as u64;
        let per_op = |n: u64| n as f64 / ops.max(1) as f64;
        Some(ServerFigures {
            requests,
            requests_per_op: per_op(requests),
            log_entries,
            log_entries_per_op: per_op(log_entries),
            operations_per_entry: (entries_applied > 0.0)
                .then(|| operations_applied / entries_applied),
            log_commits,
            log_commits_per_s: log_commits as f64 / self.seconds(),
            keepalive_requests_per_s: by_method.get("keep_alive").copied().unwrap_or(0) as f64
                / self.seconds(),
            requests_by_method: by_method,
        })
    }

    pub fn cpu(&self) -> Cpu {
        let wall = self.seconds();
        let bench = match (self.before.bench_cpu_s, self.after.bench_cpu_s) {
            (Some(b), Some(a)) => a - b,
            _ => 0.0,
        };
        let servers = self
            .after
            .server_cpu_s
            .iter()
            .filter_map(|&(id, after)| {
                let before = self.before.server_cpu_s.iter().find(|(i, _)| *i == id)?.1;
                let cpu_s = (after - before).max(0.0);
                Some(NodeCpu {
                    id,
                    cpu_s,
                    cpu_fraction: cpu_s / wall,
                })
            })
            .collect();
        Cpu {
            bench_cpu_s: bench,
            bench_cpu_fraction: bench / wall,
            servers,
        }
    }
}

/// Stops the progress line when dropped.
pub struct Progress(Option<tokio::task::JoinHandle<()>>);

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
            eprint!("\r\x1b[K");
        }
    }
}

/// A live line on stderr, once a second, when stderr is a terminal.
pub fn progress(plan: &Plan, stats: Arc<Stats>) -> Progress {
    if !std::io::stderr().is_terminal() {
        return Progress(None);
    }
    let workload = plan.workload.name();
    let rounds = plan.rounds;
    Progress(Some(tokio::spawn(async move {
        let started = Instant::now();
        let mut last = 0;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        loop {
            tick.tick().await;
            let done = stats.progress.load(Ordering::Relaxed);
            let phase = match stats.phase() {
                Phase::WarmUp => "warm-up",
                Phase::Measuring => "measuring",
                Phase::Stopped => "stopping",
            };
            let round = stats.round.load(Ordering::Relaxed);
            eprint!(
                "\r\x1b[K{}",
                progress_line(
                    workload,
                    phase,
                    (round > 0).then_some((round, rounds)),
                    started.elapsed(),
                    done,
                    done - last
                )
            );
            last = done;
        }
    })))
}

/// The progress line: the workload, its phase (and the failover round under way, of how
/// many), the time, the operations so far and in the last second.
fn progress_line(
    workload: &str,
    phase: &str,
    round: Option<(u64, u32)>,
    elapsed: Duration,
    done: u64,
    per_s: u64,
) -> String {
    let round = round.map_or_else(String::new, |(r, of)| format!(" (round {r} of {of})"));
    format!(
        "{workload}: {phase}{round}, {:.0} s, {done} ops, {per_s} ops/s",
        elapsed.as_secs_f64()
    )
}

#[cfg(test)]
mod progress_tests {
    use super::*;

    /// Issue #33: the failover bench's progress line says which round it is in.
    #[test]
    fn the_progress_line_names_the_failover_round() {
        let line = progress_line(
            "failover",
            "measuring",
            Some((2, 3)),
            Duration::from_secs(7),
            900,
            120,
        );
        assert_eq!(
            line,
            "failover: measuring (round 2 of 3), 7 s, 900 ops, 120 ops/s"
        );
        let line = progress_line("uncontended", "warm-up", None, Duration::from_secs(1), 5, 5);
        assert_eq!(line, "uncontended: warm-up, 1 s, 5 ops, 5 ops/s");
    }
}

/// One connection per client: raise the open-files limit to its hard cap (no privilege
/// needed); the spawned members inherit it.
fn raise_open_files_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

/// Ctrl-C, SIGTERM or `--timeout` end the run early (`main`'s `bounded`): dropping it stops the
/// clients and the cluster.
pub async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    // A plan the flags cannot make is a usage error (exit 2), like a flag clap refuses.
    let plan = Plan::from_args(&args).map_err(|e| crate::Stopped::Usage(format!("{e:#}")))?;
    raise_open_files_limit();
    run(&plan, &args).await
}

async fn run(plan: &Plan, args: &BenchArgs) -> anyhow::Result<()> {
    let mut cluster = match plan.cluster {
        Some(n) => {
            Some(BenchCluster::start(n, plan.groups, plan.replicas, !args.no_coalesce).await?)
        }
        None => None,
    };
    let target = match &cluster {
        Some(c) => Target {
            connect: crate::Endpoints {
                endpoints: c.endpoints(),
                ca: None,
                cert: None,
                key: None,
                auth_token: None,
            },
            metrics: c.metrics_addrs(),
        },
        None => Target {
            connect: args.endpoints.clone(),
            metrics: (1..).zip(args.metrics_endpoints.iter().cloned()).collect(),
        },
    };
    let report = match plan.workload {
        Workload::Uncontended => workloads::uncontended(plan, &target, cluster.as_ref()).await?,
        Workload::Contended | Workload::Herd => {
            workloads::contended(plan, &target, cluster.as_ref()).await?
        }
        Workload::Hold => workloads::hold(plan, &target, cluster.as_ref()).await?,
        Workload::Semaphore => workloads::semaphore(plan, &target, cluster.as_ref()).await?,
        Workload::Election => election::election(plan, &target, cluster.as_ref()).await?,
        Workload::Failover => {
            let cluster = cluster.as_mut().expect("checked by Plan::from_args");
            workloads::failover(plan, &target, cluster).await?
        }
    };
    if plan.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.table());
    }
    anyhow::ensure!(
        report.holders_over_permits.unwrap_or(0) == 0,
        "{} grants found more holders of the semaphore than its {} permits",
        report.holders_over_permits.unwrap_or(0),
        plan.permits
    );
    anyhow::ensure!(
        report.token_violations == 0,
        "{} grants carried a fencing token not above the last acknowledged one of their lock",
        report.token_violations
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_sizes_are_odd_or_for_replica_subsets_and_small() {
        assert_eq!(parse_cluster_size("3"), Ok(3));
        assert_eq!(parse_cluster_size("6"), Ok(6));
        for bad in ["0", "2", "4", "8", "10", "x", ""] {
            assert!(parse_cluster_size(bad).is_err(), "{bad:?}");
        }
    }

    fn snapshot(samples: Vec<(u64, &str)>) -> Snapshot {
        Snapshot {
            at: Instant::now(),
            bench_cpu_s: None,
            server_cpu_s: Vec::new(),
            samples: samples
                .into_iter()
                .map(|(id, text)| (id, Some(scrape::parse(text))))
                .collect(),
        }
    }

    /// The failover bench reported 0.03 requests per pair: a killed leader's counts died
    /// with it, and its restarted process counted from zero.
    #[test]
    fn a_killed_members_requests_before_the_kill_still_count() {
        let acquires = |n: u32| format!("latchkey_requests_total{{method=\"acquire\"}} {n}\n");
        let before = snapshot(vec![(1, &acquires(10)), (2, &acquires(5))]);
        let after = snapshot(vec![(1, &acquires(20)), (2, &acquires(8))]);
        let window = Window {
            before,
            after,
            // Member 1 counted 40 more before its kill, then 20 after its restart.
            kills: vec![(1, Some(scrape::parse(&acquires(50))))],
        };
        let figures = window.server_figures(63).expect("all members read");
        assert_eq!(figures.requests, 40 + 20 + 3);
        assert_eq!(figures.requests_per_op, 1.0);
    }

    /// Issue #35: operations per entry, from the applied counters of the member that applied
    /// the most (a follower that missed the window's end counts fewer).
    #[test]
    fn operations_per_entry_come_from_the_applied_counters() {
        let applied = |e: u32, o: u32| {
            format!("latchkey_entries_applied_total {e}\nlatchkey_operations_applied_total {o}\n")
        };
        let window = Window {
            before: snapshot(vec![(1, &applied(10, 10)), (2, &applied(10, 10))]),
            after: snapshot(vec![(1, &applied(30, 90)), (2, &applied(20, 50))]),
            kills: vec![],
        };
        let figures = window.server_figures(80).expect("all members read");
        assert_eq!(figures.operations_per_entry, Some(4.0));
        let old_servers = || snapshot(vec![(1, "latchkey_raft_last_log_index 3\n")]);
        let window = Window {
            before: old_servers(),
            after: old_servers(),
            kills: vec![],
        };
        assert_eq!(window.server_figures(1).unwrap().operations_per_entry, None);
    }

    #[test]
    fn a_restarted_member_counts_from_zero() {
        assert_eq!(counter_delta(10.0, 25.0), 15.0);
        assert_eq!(counter_delta(10.0, 4.0), 4.0);
    }
}
