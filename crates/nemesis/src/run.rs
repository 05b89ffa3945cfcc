//! One run: the network, the members, the resource and the workers; the schedule of faults;
//! then the histories, checked, and a summary.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use latchkey_sim::checkers::{CheckConfig, Violation};
use latchkey_sim::history::{Event, HistoryData, Ret};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::limits;
use crate::members::{Members, ServerPlant};
use crate::net::{Net, ROOT_ADDR};
use crate::postgres::{Postgres, Written};
use crate::record::{self, now};
use crate::resource::Resource;
use crate::schedule::{Fault, FaultKind};
use crate::worker::Plant;

/// What to run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The `latchkey` binary the members run.
    pub latchkey: PathBuf,
    pub members: u32,
    pub workers: u32,
    /// Workers running `latchkey lock` (`crate::cli_worker`), after the `workers` in the
    /// client hosts; a worker pause stops only the others.
    pub cli_workers: u32,
    pub locks: u32,
    /// Raft groups: with several, "the leader" a fault hits is the one member status names
    /// (group 0's), while the other groups' leaders fail over, or not, on their own.
    pub groups: u32,
    pub faults: Vec<Fault>,
    pub seed: u64,
    /// The workers' session lease.
    pub ttl: Duration,
    pub plant: Option<Plant>,
    /// A bug planted in the members (`latchkey serve`, debug builds only).
    pub server_plant: Option<ServerPlant>,
    /// A bug planted in the CLI workers' `latchkey lock` (a debug build's).
    pub cli_plant: Option<crate::cli_worker::CliPlant>,
    /// How long a worker's critical section lasts between its two hold checks.
    pub hold: Duration,
    /// After the last fault heals: the cluster's time to settle (dead sessions' leases run
    /// out), then the time in which every acquire must be granted.
    pub settle: Duration,
    pub liveness: Duration,
    /// Where to keep the logs and histories; a temporary directory (kept if the run fails)
    /// if not given.
    pub dir: Option<PathBuf>,
    /// Also run a PostgreSQL that every critical section writes through `docs/fencing.md`'s
    /// recipe ([`crate::postgres`]).
    pub postgres: bool,
}

/// What a run saw.
#[derive(Debug)]
pub struct Report {
    pub dir: PathBuf,
    pub faults: BTreeMap<FaultKind, u32>,
    /// Per fault kind, the longest time without any grant, from the fault's start to 10 s
    /// after its heal or the next fault's start, whichever is first (how long the clients
    /// waited through it).
    pub longest_gap: BTreeMap<FaultKind, Duration>,
    pub operations: usize,
    pub grants: usize,
    /// Grants to the workers running `latchkey lock` (`None`: there were none).
    pub cli_grants: Option<usize>,
    pub releases: usize,
    pub not_granted: usize,
    pub lost: usize,
    pub resource_accepted: usize,
    pub resource_refused: usize,
    /// The workers' PostgreSQL writes by outcome, and the writes its log shows (`None`: no
    /// PostgreSQL in this run).
    pub postgres: Option<(BTreeMap<Written, usize>, usize)>,
    pub violations: Vec<Violation>,
    /// Faults that could not be made as scheduled (e.g. no leader to isolate), with why.
    pub skipped: Vec<String>,
    pub log: String,
}

impl Report {
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "fault                   count  longest time without a grant"
        );
        for (kind, n) in &self.faults {
            let gap = self.longest_gap.get(kind).copied().unwrap_or_default();
            let _ = writeln!(
                s,
                "{:<24}{n:>5}  {:.1}s",
                format!("{kind:?}"),
                gap.as_secs_f64()
            );
        }
        let _ = writeln!(
            s,
            "operations {}, grants {}, releases {}, waits not granted {}, sessions lost {}",
            self.operations, self.grants, self.releases, self.not_granted, self.lost
        );
        if let Some(n) = self.cli_grants {
            let _ = writeln!(s, "grants to `latchkey lock` workers: {n}");
        }
        let _ = writeln!(
            s,
            "resource: {} accepted, {} refused (stale tokens)",
            self.resource_accepted, self.resource_refused
        );
        if let Some((outcomes, logged)) = &self.postgres {
            let n = |w| outcomes.get(&w).copied().unwrap_or(0);
            let _ = writeln!(
                s,
                "postgres: {} written, {} refused as stale, {} failed (unknown); {logged} in its log",
                n(Written::Written),
                n(Written::Stale),
                n(Written::Failed)
            );
        }
        for skip in &self.skipped {
            let _ = writeln!(s, "skipped: {skip}");
        }
        let _ = writeln!(s, "violations: {}", self.violations.len());
        for v in self.violations.iter().take(20) {
            let _ = writeln!(s, "  {v}");
        }
        let _ = writeln!(s, "logs and histories: {}", self.dir.display());
        s
    }
}

struct Worker {
    pid: Option<Child>,
    history: PathBuf,
    paused: bool,
}

/// Dropped in field order after `Drop::drop` (which kills the workers): the members, then the
/// network, whose namespaces and lock go last.
struct Run<'a> {
    config: &'a RunConfig,
    members: Members,
    workers: Vec<Worker>,
    killed: Vec<u64>,
    rng: StdRng,
    start: Duration,
    log: String,
    skipped: Vec<String>,
    /// A clock strobe under way (`FaultKind::ClockStrobe`), stopped by `heal`.
    strobe: Option<Strobe>,
    net: Net,
}

/// A task flipping clock files until stopped. `stopped` is taken around each round of writes,
/// so that once `heal` has set it no write of the task can land after heal's own.
struct Strobe {
    stopped: Arc<Mutex<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl Strobe {
    /// Flips `files` between `secs` ahead and `secs` behind every `CLOCK_STROBE_FLIP`, file
    /// `i` in the phase of its index.
    fn start(files: Vec<PathBuf>, secs: i64) -> Strobe {
        let stopped = Arc::new(Mutex::new(false));
        let flag = stopped.clone();
        let task = tokio::spawn(async move {
            for tick in 0u64.. {
                tokio::time::sleep(limits::CLOCK_STROBE_FLIP).await;
                let stopped = flag.lock().expect("strobe lock");
                if *stopped {
                    return;
                }
                for (i, file) in files.iter().enumerate() {
                    let ahead = (tick + i as u64) % 2 == 0;
                    // A failed write leaves that clock where it was; heal resets every one.
                    let _ = crate::net::write_clock(file, if ahead { secs } else { -secs });
                }
            }
        });
        Strobe { stopped, task }
    }

    /// Stops the flips; none lands after this returns.
    fn stop(self) {
        drop(self);
    }
}

/// A run that ends without healing (an error mid-fault) stops its strobe too.
impl Drop for Strobe {
    fn drop(&mut self) {
        if let Ok(mut stopped) = self.stopped.lock() {
            *stopped = true;
        }
        self.task.abort();
    }
}

impl Run<'_> {
    fn note(&mut self, what: &str) {
        let line = format!(
            "{:>9.3}s {what}",
            now().saturating_sub(self.start).as_secs_f64()
        );
        println!("{line}");
        self.log.push_str(&line);
        self.log.push('\n');
    }

    async fn leader(&mut self) -> Option<u64> {
        let found = self.members.leader().await;
        if found.is_none() {
            self.skipped.push(format!(
                "at {:.1}s no member said it led",
                now().saturating_sub(self.start).as_secs_f64()
            ));
        }
        found
    }

    async fn apply(&mut self, kind: FaultKind) -> anyhow::Result<()> {
        if kind == FaultKind::PauseWorker {
            return self.pause_worker().await;
        }
        if kind == FaultKind::IsolateWorker {
            return self.isolate_worker().await;
        }
        let step = |rng: &mut StdRng| {
            let secs: i64 = rng.random_range(60..=600);
            if rng.random_bool(0.5) {
                secs
            } else {
                -secs
            }
        };
        if matches!(
            kind,
            FaultKind::ClockJumpLeader | FaultKind::ClockJumpWorkers | FaultKind::ClockStrobe
        ) && !self.net.has_clocks()
        {
            self.skipped.push(format!(
                "{kind:?}: no libfaketime ({})",
                crate::net::LIBFAKETIME
            ));
            return Ok(());
        }
        if kind == FaultKind::ClockJumpWorkers {
            let secs = step(&mut self.rng);
            for c in self.net.clients.clone() {
                self.net.step_clock(&c, secs)?;
            }
            self.note(&format!("  (workers' clocks {secs:+}s)"));
            return Ok(());
        }
        if kind == FaultKind::SplitLeaderMinority {
            // Aimed like a worker pause: a split that catches a holder between its two hold
            // checks, with its whole critical section still ahead, lets the majority elect
            // and expire sessions before the holder acts again, which is when a deposed
            // leader that still renews leases (`--server-plant renew-without-quorum`) shows.
            let holder = self.aim(|_| true, Some(limits::AIM_FRESH)).await;
            self.note(&match holder {
                Some(w) => format!("  (aimed: worker {} holds a lock)", w + 1),
                None => "  (no worker was seen holding a lock)".to_owned(),
            });
        }
        let Some(leader) = self.leader().await else {
            return Ok(());
        };
        let li = (leader - 1) as usize;
        let lhost = self.net.members[li].clone();
        let others: Vec<_> = (0..self.net.members.len()).filter(|&i| i != li).collect();
        match kind {
            FaultKind::IsolateLeader => self.net.link_down(&lhost)?,
            FaultKind::SplitLeaderMinority => {
                let minority = self.net.members.len().saturating_sub(1) / 2;
                let (with_leader, rest) = others.split_at(minority.saturating_sub(1));
                let mut side: Vec<usize> = vec![li];
                side.extend(with_leader);
                for &a in &side {
                    for &b in rest {
                        self.net
                            .cut_both(&self.net.members[a].clone(), &self.net.members[b].clone())?;
                    }
                }
            }
            FaultKind::Bridge => {
                let f = others[self.rng.random_range(0..others.len())];
                self.net.cut_both(&lhost, &self.net.members[f].clone())?;
            }
            FaultKind::AsymmetricLeader => {
                for &f in &others {
                    self.net.cut(&lhost, &self.net.members[f].clone())?;
                }
            }
            FaultKind::ClientCutFromLeader => {
                for c in self.net.clients.clone() {
                    self.net.cut_both(&c, &lhost)?;
                }
            }
            FaultKind::KillLeader => {
                self.members.kill9(leader)?;
                self.killed.push(leader);
            }
            FaultKind::PauseLeader => self.members.pause(leader)?,
            FaultKind::ClockJumpLeader => {
                let secs = step(&mut self.rng);
                self.net.step_clock(&lhost, secs)?;
                self.note(&format!("  (clock {secs:+}s)"));
            }
            FaultKind::ClockStrobe => {
                let secs = step(&mut self.rng).abs();
                let mut hosts = vec![lhost.clone()];
                hosts.extend(self.net.clients.iter().cloned());
                let files = self.net.clock_files(&hosts);
                self.strobe = Some(Strobe::start(files, secs));
                self.note(&format!(
                    "  (leader's and workers' clocks flip between +{secs}s and -{secs}s every {} ms)",
                    limits::CLOCK_STROBE_FLIP.as_millis()
                ));
            }
            FaultKind::PauseWorker | FaultKind::IsolateWorker | FaultKind::ClockJumpWorkers => {
                unreachable!("handled above")
            }
        }
        self.note(&format!("  (leader was member {leader})"));
        Ok(())
    }

    /// Stops a worker while it is inside its critical section, between its two hold checks
    /// (see [`critical_section_entered`]), or after [`limits::PAUSE_AIM_TIMEOUT`]
    /// wherever it is.
    async fn pause_worker(&mut self) -> anyhow::Result<()> {
        // The Rust client's workers: stopping a CLI worker's loop would stop no lock holder.
        if self.config.workers == 0 {
            self.skipped
                .push("PauseWorker: no worker of the Rust client to stop".to_owned());
            return Ok(());
        }
        let w = self.rng.random_range(0..self.config.workers as usize);
        self.aim(|i| i == w, None).await;
        if let Some(child) = &self.workers[w].pid {
            kill(Pid::from_raw(child.id() as i32), Signal::SIGSTOP)?;
            self.workers[w].paused = true;
        }
        self.note(&format!("  (worker {} stopped)", w + 1));
        Ok(())
    }

    /// Cuts the first worker (of either kind) seen just after it entered its critical section
    /// (see [`critical_section_entered`], [`limits::AIM_FRESH`]), or after
    /// [`limits::PAUSE_AIM_TIMEOUT`] wherever it is: its process runs on, unable to renew.
    async fn isolate_worker(&mut self) -> anyhow::Result<()> {
        let any = self.rng.random_range(0..self.workers.len());
        let aimed = self.aim(|_| true, Some(limits::AIM_FRESH)).await;
        let w = aimed.unwrap_or(any);
        let host = self.net.clients[w].clone();
        self.net.link_down(&host)?;
        self.note(&format!(
            "  (worker {} cut off{})",
            w + 1,
            if aimed.is_some() {
                ", inside its critical section"
            } else {
                ""
            }
        ));
        Ok(())
    }

    /// Waits until one of the workers `which` accepts is between the two hold checks of a
    /// critical section (see [`critical_section_entered`]), entered at most `fresh`
    /// ago if given, for at most [`limits::PAUSE_AIM_TIMEOUT`]; that worker, or `None` when
    /// the time ran out.
    async fn aim(&self, which: impl Fn(usize) -> bool, fresh: Option<Duration>) -> Option<usize> {
        let aim = Instant::now();
        while aim.elapsed() < limits::PAUSE_AIM_TIMEOUT {
            for (i, w) in self.workers.iter().enumerate().filter(|(i, _)| which(*i)) {
                let entered = critical_section_entered(&history_tail(&w.history));
                if entered.is_some_and(|at| fresh.is_none_or(|f| now().saturating_sub(at) <= f)) {
                    return Some(i);
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        None
    }

    fn heal(&mut self) -> anyhow::Result<()> {
        if let Some(strobe) = self.strobe.take() {
            strobe.stop();
        }
        self.net.heal()?;
        self.members.resume_all()?;
        for id in std::mem::take(&mut self.killed) {
            self.members.restart(&self.net, id)?;
        }
        for w in &mut self.workers {
            if let (true, Some(child)) = (w.paused, &w.pid) {
                kill(Pid::from_raw(child.id() as i32), Signal::SIGCONT)?;
            }
            w.paused = false;
        }
        Ok(())
    }

    fn spawn_workers(
        &mut self,
        resource: SocketAddr,
        postgres: Option<&str>,
        dir: &Path,
    ) -> anyhow::Result<()> {
        let exe = std::env::current_exe().context("finding the nemesis binary")?;
        let locks: Vec<String> = (1..=self.config.locks)
            .map(|i| format!("nemesis/{i}"))
            .collect();
        let endpoints = self.members.endpoints().join(",");
        for (i, host) in self.net.clients.clone().iter().enumerate() {
            let client = i as u32 + 1;
            let history = dir.join(format!("w{client}.jsonl"));
            let log = std::fs::File::create(dir.join(format!("w{client}.log")))?;
            let mut cmd = self.net.command(host, &exe);
            let seed = (self.config.seed ^ u64::from(client)).to_string();
            if client <= self.config.workers {
                cmd.args(["worker", "--client", &client.to_string()])
                    .args(["--ttl", &format!("{}ms", self.config.ttl.as_millis())])
                    .args(["--hold", &format!("{}ms", self.config.hold.as_millis())])
                    .args(["--wait", "10000ms"]);
                if let Some(Plant::IgnoreDeadline) = self.config.plant {
                    cmd.args(["--plant", "ignore-deadline"]);
                }
            } else {
                if let Some(plant) = self.config.cli_plant {
                    cmd.env("LATCHKEY_TEST_PLANT", plant.env_value());
                }
                cmd.args(["cli-worker", "--client", &client.to_string()])
                    .arg("--latchkey")
                    .arg(&self.config.latchkey)
                    .args(["--ttl-ms", &self.config.ttl.as_millis().to_string()])
                    .args(["--hold-ms", &self.config.hold.as_millis().to_string()])
                    .args(["--wait-ms", "10000"]);
            }
            cmd.args([
                "--endpoints",
                &endpoints,
                "--resource",
                &resource.to_string(),
            ])
            .args(["--locks", &locks.join(",")])
            .arg("--history")
            .arg(&history)
            .args(["--seed", &seed]);
            if let Some(postgres) = postgres {
                cmd.args(["--postgres", postgres]);
            }
            let child = cmd
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("starting a worker")?;
            self.workers.push(Worker {
                pid: Some(child),
                history,
                paused: false,
            });
        }
        Ok(())
    }

    /// A worker that exited before the run stopped it, with its log's tail: a run whose
    /// workers died would judge an empty history and find nothing wrong.
    fn worker_exited(&mut self, dir: &Path) -> Option<String> {
        for (i, w) in self.workers.iter_mut().enumerate() {
            if let Some(Ok(Some(status))) = w.pid.as_mut().map(Child::try_wait) {
                let log = std::fs::read_to_string(dir.join(format!("w{}.log", i + 1)))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(10).collect();
                return Some(format!(
                    "worker {} exited by itself ({status}):\n{}",
                    i + 1,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ));
            }
        }
        None
    }

    /// SIGTERM to every worker, then SIGKILL to those still running after
    /// [`limits::EXIT_TIMEOUT`].
    async fn stop_workers(&mut self) {
        for w in &self.workers {
            if let Some(child) = &w.pid {
                let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            }
        }
        let deadline = Instant::now() + limits::EXIT_TIMEOUT;
        for w in &mut self.workers {
            if let Some(mut child) = w.pid.take() {
                while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Drop for Run<'_> {
    fn drop(&mut self) {
        for w in &mut self.workers {
            if let Some(mut child) = w.pid.take() {
                let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGCONT);
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Runs `config` and checks its history.
pub fn run(config: &RunConfig) -> anyhow::Result<Report> {
    if config.members == 0 || config.members > limits::MEMBERS_MAX {
        bail!("--members must be 1..={}", limits::MEMBERS_MAX);
    }
    if config.workers > limits::WORKERS_MAX {
        bail!("--workers must be at most {}", limits::WORKERS_MAX);
    }
    if config.workers + config.cli_workers == 0 {
        bail!("a run needs a worker: give --workers or --cli-workers");
    }
    if config.cli_workers > limits::WORKERS_MAX - config.workers {
        bail!(
            "--workers and --cli-workers together must be at most {}",
            limits::WORKERS_MAX
        );
    }
    if config.locks == 0 || config.locks > limits::LOCKS_MAX {
        bail!("--locks must be 1..={}", limits::LOCKS_MAX);
    }
    if config.hold > limits::HOLD_MAX {
        bail!("--hold-ms must be at most {}", limits::HOLD_MAX.as_millis());
    }
    let temp = match &config.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            None
        }
        None => Some(
            tempfile::Builder::new()
                .prefix("latchkey-nemesis-")
                .tempdir()?,
        ),
    };
    let dir = match (&temp, &config.dir) {
        (Some(t), _) => t.path().to_owned(),
        (None, Some(d)) => d.clone(),
        (None, None) => unreachable!("one of the two is set above"),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(run_in(config, &dir));
    let keep = match &result {
        Ok(r) => !r.violations.is_empty(),
        Err(_) => true,
    };
    if let (Some(temp), true) = (temp, keep) {
        // A failed run keeps its logs.
        let kept = temp.keep();
        eprintln!(
            "nemesis: kept the logs of the failed run in {}",
            kept.display()
        );
    }
    result
}

async fn run_in(config: &RunConfig, dir: &Path) -> anyhow::Result<Report> {
    let start = now();
    let net = Net::create(config.members, config.workers + config.cli_workers, dir)?;
    let members = Members::start(
        &net,
        &config.latchkey,
        dir,
        config.groups,
        config.server_plant,
    )?;
    let mut run = Run {
        config,
        net,
        members,
        workers: Vec::new(),
        killed: Vec::new(),
        rng: StdRng::seed_from_u64(config.seed),
        start,
        log: String::new(),
        skipped: Vec::new(),
        strobe: None,
    };
    let leader = run
        .members
        .wait_leader(limits::READY_TIMEOUT)
        .await
        .with_context(|| format!("the cluster did not start\n{}", run.members.logs_tail(20)))?;
    run.note(&format!("cluster up, member {leader} leads"));
    let views =
        run.members
            .record_views(&dir.join("views.log"), start, Duration::from_millis(250))?;
    let resource = Resource::start(SocketAddr::new(ROOT_ADDR.into(), 7500), start)?;
    let postgres = match config.postgres {
        true => Some(
            Postgres::start(
                dir,
                &ROOT_ADDR.to_string(),
                7501,
                &run.net.clients.iter().map(|c| c.addr).collect::<Vec<_>>(),
            )
            .context("starting PostgreSQL (--no-postgres runs without it)")?,
        ),
        false => None,
    };
    run.spawn_workers(
        resource.addr,
        postgres.as_ref().map(Postgres::addr).as_deref(),
        dir,
    )?;
    let workload = Instant::now();
    run.note(&format!(
        "{} workers started ({} of them running `latchkey lock`)",
        config.workers + config.cli_workers,
        config.cli_workers
    ));

    let mut healed = Duration::ZERO;
    let mut windows: Vec<(FaultKind, Duration, Duration)> = Vec::new();
    let mut counts: BTreeMap<FaultKind, u32> = BTreeMap::new();
    for (i, fault) in config.faults.iter().enumerate() {
        tokio::time::sleep((workload + fault.at).saturating_duration_since(Instant::now())).await;
        if let Some((id, status)) = run.members.exited() {
            bail!(
                "member {id} exited by itself ({status})\n{}",
                run.members.logs_tail(30)
            );
        }
        if let Some(why) = run.worker_exited(dir) {
            bail!("{why}");
        }
        run.note(&format!(
            "fault {:?} for {:.1}s",
            fault.kind,
            fault.lasts.as_secs_f64()
        ));
        let from = now().saturating_sub(start);
        run.apply(fault.kind).await?;
        *counts.entry(fault.kind).or_default() += 1;
        tokio::time::sleep(fault.lasts).await;
        run.heal()?;
        healed = now().saturating_sub(start);
        let next = config.faults.get(i + 1).map_or(Duration::MAX, |n| {
            (workload + n.at)
                .saturating_duration_since(Instant::now())
                .saturating_add(healed)
        });
        windows.push((
            fault.kind,
            from,
            (healed + Duration::from_secs(10)).min(next),
        ));
        run.note("healed");
    }
    if healed == Duration::ZERO {
        healed = now().saturating_sub(start);
    }
    tokio::time::sleep(config.settle + config.liveness).await;
    let end = now().saturating_sub(start);
    views.abort();
    if let Some(why) = run.worker_exited(dir) {
        bail!("{why}");
    }
    run.note("stopping the workers");
    run.stop_workers().await;

    let mut h = HistoryData::default();
    h.resource = resource.stop();
    h.healed_at = Some(healed);
    let mut outcomes = BTreeMap::new();
    for (i, w) in run.workers.iter().enumerate() {
        record::read_worker(&w.history, i as u32 + 1, start, &mut h, &mut outcomes)?;
    }
    let postgres = match postgres {
        Some(pg) => {
            let accepted = pg
                .accepted()
                .context("reading PostgreSQL's log of writes")?;
            Some((outcomes, accepted))
        }
        None => None,
    };
    record::sort_events(&mut h);
    let check = CheckConfig {
        settle: config.settle,
        // Acquires invoked in the last wait of the run may not have been answered.
        liveness_until: end.saturating_sub(Duration::from_secs(11)),
    };
    let mut violations = crate::check::check(&h, &check);
    if let Some((_, accepted)) = &postgres {
        violations.extend(
            crate::postgres::fence_went_down(accepted)
                .into_iter()
                .map(|message| Violation {
                    checker: "postgres_fence",
                    message,
                }),
        );
    }
    let grants: Vec<Duration> = h
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Return {
                ret: Ret::Granted { .. },
                at,
                ..
            } => Some(*at),
            _ => None,
        })
        .collect();
    if grants.is_empty() {
        violations.push(Violation {
            checker: "progress",
            message: "no acquire was granted in the whole run".into(),
        });
    }
    let mut longest_gap = BTreeMap::new();
    for (kind, from, to) in windows {
        let gap = longest_gap_in(&grants, from, to);
        let g = longest_gap.entry(kind).or_insert(Duration::ZERO);
        *g = (*g).max(gap);
    }
    let count = |f: &dyn Fn(&Event) -> bool| h.events.iter().filter(|e| f(e)).count();
    Ok(Report {
        dir: dir.to_owned(),
        faults: counts,
        longest_gap,
        operations: count(&|e| matches!(e, Event::Invoke { .. })),
        grants: grants.len(),
        cli_grants: (config.cli_workers > 0).then(|| {
            count(&|e| {
                matches!(e, Event::Return { id, ret: Ret::Granted { .. }, .. }
                    if record::client_of(*id) > config.workers)
            })
        }),
        releases: count(&|e| {
            matches!(
                e,
                Event::Return {
                    ret: Ret::Released,
                    ..
                }
            )
        }),
        not_granted: count(&|e| {
            matches!(
                e,
                Event::Return {
                    ret: Ret::NotGranted,
                    ..
                }
            )
        }),
        lost: count(&|e| matches!(e, Event::Lost { .. })),
        resource_accepted: h.resource.iter().filter(|o| o.accepted).count(),
        resource_refused: h.resource.iter().filter(|o| !o.accepted).count(),
        postgres: postgres.map(|(outcomes, accepted)| (outcomes, accepted.len())),
        violations,
        skipped: std::mem::take(&mut run.skipped),
        log: std::mem::take(&mut run.log),
    })
}

/// When the worker whose history is `text` entered the critical section it is in (its first
/// hold check, on [`record::now`]), if it is between the two hold checks of one: its last event
/// the first hold check, right after the grant. Stopped there, it resumes to act as the holder
/// once more (its second hold check, its writes), which is what a pause must test; stopped
/// after the second, it only writes (the book's PostgreSQL recipe takes a few `psql` runs
/// there) and releases, and a client that ignores its deadline goes unseen by `hold_overlap`.
fn critical_section_entered(text: &str) -> Option<Duration> {
    let mut last = text.lines().rev();
    let (Some(hold), Some(before)) = (last.next(), last.next()) else {
        return None;
    };
    if !before.contains("\"granted\"") {
        return None;
    }
    match serde_json::from_str(hold) {
        Ok(record::WorkerEvent::HoldCheck { at, .. }) => Some(Duration::from_nanos(at)),
        _ => None,
    }
}

/// The last lines of a worker's history (at least two whole lines: each is at most
/// [`limits::LINE_BYTES_MAX`]), read from its end: an hour's history is megabytes, and an aim
/// reads it every 10 ms. Empty if it cannot be read yet.
fn history_tail(path: &Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let want = 3 * limits::LINE_BYTES_MAX as u64;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if file
        .seek(SeekFrom::Start(len.saturating_sub(want)))
        .is_err()
    {
        return String::new();
    }
    let mut bytes = Vec::new();
    let _ = file.take(want).read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The longest time within `from..to` with no grant in `grants` (sorted).
fn longest_gap_in(grants: &[Duration], from: Duration, to: Duration) -> Duration {
    let mut last = from;
    let mut gap = Duration::ZERO;
    for &g in grants.iter().filter(|&&g| g > from && g < to) {
        gap = gap.max(g - last);
        last = g;
    }
    gap.max(to.saturating_sub(last))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_aims_between_the_two_hold_checks() {
        let granted = r#"{"ev":"return","id":7,"ret":{"granted":{"token":40}},"at":1}"#;
        let hold = r#"{"ev":"hold_check","generation":1,"session":3,"lock":"a","token":40,"at":2}"#;
        assert_eq!(
            critical_section_entered(&format!("{granted}\n{hold}\n")),
            Some(Duration::from_nanos(2))
        );
        assert_eq!(
            critical_section_entered(&format!("{granted}\n{hold}\n{hold}\n")),
            None
        );
        assert_eq!(critical_section_entered(&format!("{granted}\n")), None);
        assert_eq!(critical_section_entered(""), None);
    }

    #[test]
    fn the_longest_gap_counts_from_the_fault_to_the_window_end() {
        let s = Duration::from_secs;
        let grants = [s(1), s(12), s(13), s(19)];
        assert_eq!(longest_gap_in(&grants, s(10), s(20)), s(6));
        assert_eq!(longest_gap_in(&grants, s(2), s(11)), s(9));
    }
}
