//! The workloads. Each client is its own [`Client`] (its own connection) with its own session,
//! opened before the warm-up; the loops then run through three [`Phase`]s, and an operation
//! counts only if it *completes* while the phase is `Measuring`.
//!
//! - uncontended: client i loops acquire -> release on its own lock `PREFIX u/i`.
//! - contended / herd: every client loops on one lock; each acquire queues on the server (FIFO)
//!   until the holder releases. A shared record of the last grant, read and written only while
//!   holding the lock, checks that tokens strictly increase and counts handoffs to another
//!   client.
//! - hold: M sessions take K locks, then idle and renew through the window.
//! - failover: uncontended load from a few clients while the leader is killed and restarted,
//!   round after round; a probe times kill -> first grant of a request sent after the kill.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use latchkey_client::{Client, Error, LockGuard, Session};
use tokio::task::JoinSet;

use super::cluster::BenchCluster;
use super::report::{FailoverFigures, GroupOps, HoldFigures, NodeMemory, Percentiles, Report};
use super::{Plan, Target, Window};

/// Longest single acquire: a contended wait is as long as the queue ahead of it, which a full
/// queue of a slow (debug) server takes tens of seconds to serve.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause of a client after an error, so a persistent failure does not spin.
const ERROR_BACKOFF: Duration = Duration::from_millis(50);
/// How long the clients get to finish their last operation once the window closed (a
/// contended queue drains one handoff per client).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the hold workload's fill checks that it still makes progress.
const FILL_PROGRESS_CHECK: Duration = Duration::from_secs(1);
/// How long opening every client's session may take.
const SETUP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the probe may try to get a grant after a leader was killed.
const FAILOVER_GRANT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the cluster gets to be whole again after a killed member restarted.
const FAILOVER_HEAL_TIMEOUT: Duration = Duration::from_secs(60);
/// Each attempt of the failover probe waits at most this long before trying a new name.
const PROBE_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// Histogram range: 1 µs to 10 min, 3 significant digits.
const LATENCY_US_MAX: u64 = 600_000_000;

/// Where the loops are: only operations completing in `Measuring` count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    WarmUp = 0,
    Measuring = 1,
    Stopped = 2,
}

/// What every client loop shares: the phase and the tallies.
pub struct Stats {
    phase: AtomicU8,
    acquire: Mutex<Histogram<u64>>,
    release: Mutex<Histogram<u64>>,
    /// Operations completed in the window.
    ops: AtomicU64,
    /// Operations completed since the loops started (the progress line).
    pub progress: AtomicU64,
    /// The failover round under way, from 1 (0: none; the progress line).
    pub round: AtomicU64,
    other_client: AtomicU64,
    violations: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
    /// Operations completed in the window by Raft group of their lock (uncontended, with
    /// `--groups`).
    group_ops: Mutex<BTreeMap<u32, u64>>,
}

pub(super) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("valid histogram bounds")
}

pub(super) fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Stats {
    pub fn new() -> Stats {
        Stats {
            phase: AtomicU8::new(Phase::WarmUp as u8),
            acquire: Mutex::new(histogram()),
            release: Mutex::new(histogram()),
            ops: AtomicU64::new(0),
            progress: AtomicU64::new(0),
            round: AtomicU64::new(0),
            other_client: AtomicU64::new(0),
            violations: AtomicU64::new(0),
            group_ops: Mutex::new(BTreeMap::new()),
            errors: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::WarmUp,
            1 => Phase::Measuring,
            _ => Phase::Stopped,
        }
    }

    pub fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Release);
    }

    fn measuring(&self) -> bool {
        self.phase() == Phase::Measuring
    }

    fn stopped(&self) -> bool {
        self.phase() == Phase::Stopped
    }

    fn record_acquire(&self, d: Duration) {
        let mut h = self.acquire.lock().expect("histogram lock");
        h.saturating_record(us(d).max(1));
    }

    fn record_release(&self, d: Duration) {
        let mut h = self.release.lock().expect("histogram lock");
        h.saturating_record(us(d).max(1));
    }

    fn error(&self, e: &Error) {
        *self
            .errors
            .lock()
            .expect("errors lock")
            .entry(error_kind(e).to_owned())
            .or_default() += 1;
    }

    fn error_count(&self) -> u64 {
        self.errors.lock().expect("errors lock").values().sum()
    }

    pub(super) fn violation(&self) {
        self.violations.fetch_add(1, Ordering::Relaxed);
    }

    /// The report's common figures; the workload fills in the rest.
    pub(super) fn report(&self, plan: &Plan, op: &'static str, window: &Window) -> Report {
        let errors = self.errors.lock().expect("errors lock").clone();
        let ops = self.ops.load(Ordering::Relaxed);
        Report {
            workload: plan.workload.name().to_owned(),
            clients: plan.clients,
            connections: plan.connections,
            batch: plan.batch,
            cluster: plan.cluster,
            warmup_s: plan.warmup.as_secs_f64(),
            window_s: window.seconds(),
            op,
            ops,
            ops_per_s: ops as f64 / window.seconds(),
            acquire: Percentiles::of(&self.acquire.lock().expect("histogram lock")),
            release: Percentiles::of(&self.release.lock().expect("histogram lock")),
            handoffs_to_other_client: None,
            token_violations: self.violations.load(Ordering::Relaxed),
            permits: None,
            holders_over_permits: None,
            errors_total: errors.values().sum(),
            errors,
            server: window.server_figures(ops),
            cpu: window.cpu(),
            hold: None,
            failover: None,
            election: None,
            groups: {
                let seconds = window.seconds();
                let by_group = self.group_ops.lock().expect("group ops lock");
                by_group
                    .iter()
                    .map(|(&group, &ops)| GroupOps {
                        group,
                        ops,
                        ops_per_s: ops as f64 / seconds,
                    })
                    .collect()
            },
        }
    }
}

/// The variant of a client error, as the report counts it.
fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::InvalidArgument { .. } => "invalid_argument",
        Error::SessionNotFound { .. } => "session_not_found",
        Error::SessionLost { .. } => "session_lost",
        Error::NotHeld { .. } => "not_held",
        Error::LimitReached { .. } => "limit_reached",
        Error::Conflict { .. } => "conflict",
        Error::WaitTimedOut { .. } => "wait_timed_out",
        Error::Held { .. } => "held",
        Error::Unavailable { .. } => "unavailable",
        Error::Transport { .. } => "transport",
        Error::Tls { .. } => "tls",
        Error::PermissionDenied { .. } => "permission_denied",
        Error::Protocol(_) => "protocol",
        Error::Server { .. } => "server",
        Error::MembershipIncomplete { .. } => "membership_incomplete",
    }
}

/// One client: its own session, over its own connection or one it shares (`--connections`).
struct Worker {
    index: usize,
    client: Client,
    session: Session,
}

/// Opens `n` clients and their sessions, all at once: the sessions spread evenly over
/// `plan.connections` connections (`Client`s, connected as the bench's options say: TLS, auth
/// token); with one connection per client, as by default, each its own.
async fn open_workers(plan: &Plan, target: &Target, n: usize) -> anyhow::Result<Vec<Worker>> {
    let clients = (0..plan.connections.clamp(1, n.max(1)))
        .map(|_| target.client_batching(plan.batch.then_some(plan.batch_in_flight)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut set = JoinSet::new();
    for index in 0..n {
        let client = clients[index % clients.len()].clone();
        let ttl = plan.ttl;
        set.spawn(async move {
            let session = client.session(ttl).await?;
            anyhow::Ok(Worker {
                index,
                client,
                session,
            })
        });
    }
    let mut workers = Vec::with_capacity(n);
    let deadline = tokio::time::Instant::now() + SETUP_TIMEOUT;
    while let Some(joined) = tokio::time::timeout_at(deadline, set.join_next())
        .await
        .map_err(|_| anyhow::anyhow!("opening {n} sessions took over {SETUP_TIMEOUT:?}"))?
    {
        workers.push(
            joined
                .context("a setup task failed")?
                .context("opening a session")?,
        );
    }
    workers.sort_by_key(|w| w.index);
    Ok(workers)
}

/// A session replaced after it was lost (the loop goes on with a new one).
async fn renew_session(stats: &Stats, w: &mut Worker, ttl: Duration) {
    if !w.session.is_lost() {
        return;
    }
    match w.client.session(ttl).await {
        Ok(s) => w.session = s,
        Err(e) => {
            stats.error(&e);
            tokio::time::sleep(ERROR_BACKOFF).await;
        }
    }
}

/// Waits for the loops to end after the window closed; aborts those that do not in time.
async fn drain(set: &mut JoinSet<Worker>) -> Vec<Worker> {
    let deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
    let mut workers = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, set.join_next()).await {
            Ok(Some(Ok(w))) => workers.push(w),
            Ok(Some(Err(e))) => tracing::warn!(error = %e, "a bench client task failed"),
            Ok(None) => break,
            Err(_) => {
                tracing::warn!("{} clients still busy after {DRAIN_TIMEOUT:?}", set.len());
                set.shutdown().await;
                break;
            }
        }
    }
    workers
}

/// Closes the sessions (not measured), each bounded by the client's own retry budget.
async fn close_all(workers: Vec<Worker>) {
    let mut set = JoinSet::new();
    for w in workers {
        set.spawn(async move {
            let _ = w.session.close().await;
        });
    }
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while set.join_next().await.is_some() {}
    })
    .await;
}

/// One acquire of a workload loop: on failure the error is counted and the loop backs off
/// before its next try.
async fn acquire(stats: &Stats, w: &Worker, name: &str) -> Option<LockGuard> {
    match w.session.lock(name).wait(Some(ACQUIRE_TIMEOUT)).await {
        Ok(g) => Some(g),
        Err(e) => {
            stats.error(&e);
            tokio::time::sleep(ERROR_BACKOFF).await;
            None
        }
    }
}

/// Acquire -> release on the worker's own lock until stopped. Every grant's token must be
/// above the last one this worker saw acknowledged for the lock (across failovers too).
async fn uncontended_loop(
    stats: Arc<Stats>,
    mut w: Worker,
    name: String,
    ttl: Duration,
    group: Option<u32>,
) -> Worker {
    let mut last_token = 0u64;
    while !stats.stopped() {
        renew_session(&stats, &mut w, ttl).await;
        let started = Instant::now();
        let Some(guard) = acquire(&stats, &w, &name).await else {
            continue;
        };
        let granted = Instant::now();
        let in_window = stats.measuring();
        if in_window {
            stats.record_acquire(granted - started);
        }
        if guard.token() <= last_token {
            stats.violation();
        }
        last_token = guard.token();
        let released = guard.release().await;
        let done = Instant::now();
        match released {
            Ok(()) => {
                stats.progress.fetch_add(1, Ordering::Relaxed);
                if stats.measuring() {
                    stats.record_release(done - granted);
                    stats.ops.fetch_add(1, Ordering::Relaxed);
                    if let Some(group) = group {
                        *stats
                            .group_ops
                            .lock()
                            .expect("group ops lock")
                            .entry(group)
                            .or_default() += 1;
                    }
                }
            }
            Err(e) => stats.error(&e),
        }
    }
    w
}

/// The last grant of the contended lock: written only by its holder.
#[derive(Default)]
struct LastGrant {
    token: u64,
    client: Option<usize>,
}

async fn contended_loop(
    stats: Arc<Stats>,
    last: Arc<Mutex<LastGrant>>,
    mut w: Worker,
    name: String,
    ttl: Duration,
) -> Worker {
    while !stats.stopped() {
        renew_session(&stats, &mut w, ttl).await;
        let started = Instant::now();
        let Some(guard) = acquire(&stats, &w, &name).await else {
            continue;
        };
        let granted = Instant::now();
        let in_window = stats.measuring();
        {
            let mut last = last.lock().expect("last grant lock");
            if guard.token() <= last.token {
                stats.violation();
            }
            if in_window {
                stats.record_acquire(granted - started);
                stats.ops.fetch_add(1, Ordering::Relaxed);
                if last.client.is_some_and(|c| c != w.index) {
                    stats.other_client.fetch_add(1, Ordering::Relaxed);
                }
            }
            *last = LastGrant {
                token: guard.token(),
                client: Some(w.index),
            };
        }
        stats.progress.fetch_add(1, Ordering::Relaxed);
        let released = guard.release().await;
        match released {
            Ok(()) if stats.measuring() => stats.record_release(granted.elapsed()),
            Ok(()) => {}
            Err(e) => stats.error(&e),
        }
    }
    w
}

/// Runs the loops of `workers` through warm-up and window; returns the window and the
/// workers back.
async fn timed<F, Fut>(
    plan: &Plan,
    target: &Target,
    cluster: Option<&BenchCluster>,
    stats: &Arc<Stats>,
    workers: Vec<Worker>,
    body: F,
) -> anyhow::Result<(Window, Vec<Worker>)>
where
    F: Fn(Worker) -> Fut,
    Fut: std::future::Future<Output = Worker> + Send + 'static,
{
    let mut set = JoinSet::new();
    for w in workers {
        set.spawn(body(w));
    }
    let _progress = super::progress(plan, stats.clone());
    tokio::time::sleep(plan.warmup).await;
    let before = super::Snapshot::take(target, cluster).await;
    stats.set_phase(Phase::Measuring);
    tokio::time::sleep(plan.duration).await;
    stats.set_phase(Phase::Stopped);
    let after = super::Snapshot::take(target, cluster).await;
    let workers = drain(&mut set).await;
    let window = Window {
        before,
        after,
        kills: Vec::new(),
    };
    Ok((window, workers))
}

pub async fn uncontended(
    plan: &Plan,
    target: &Target,
    cluster: Option<&BenchCluster>,
) -> anyhow::Result<Report> {
    let workers = open_workers(plan, target, plan.clients).await?;
    let stats = Arc::new(Stats::new());
    let (prefix, ttl, groups) = (plan.prefix.clone(), plan.ttl, plan.groups);
    let (window, workers) = timed(plan, target, cluster, &stats, workers, |w| {
        let name = format!("{prefix}u/{}", w.index);
        let group = (groups > 1).then(|| latchkey_core::group_of(&name, groups));
        uncontended_loop(stats.clone(), w, name, ttl, group)
    })
    .await?;
    close_all(workers).await;
    Ok(stats.report(plan, "pair", &window))
}

/// contended and herd: every client on one lock.
pub async fn contended(
    plan: &Plan,
    target: &Target,
    cluster: Option<&BenchCluster>,
) -> anyhow::Result<Report> {
    let workers = open_workers(plan, target, plan.clients).await?;
    let stats = Arc::new(Stats::new());
    let last = Arc::new(Mutex::new(LastGrant::default()));
    let name = format!("{}{}", plan.prefix, plan.workload.name());
    let ttl = plan.ttl;
    let (window, workers) = timed(plan, target, cluster, &stats, workers, |w| {
        contended_loop(stats.clone(), last.clone(), w, name.clone(), ttl)
    })
    .await?;
    close_all(workers).await;
    let mut report = stats.report(plan, "handoff", &window);
    report.handoffs_to_other_client = Some(stats.other_client.load(Ordering::Relaxed));
    Ok(report)
}

/// Acquire a permit -> release on one semaphore, by every client. Each grant counts the
/// clients that hold a permit (from its answer to its release's request, so never more than
/// the server's holders): above the permits is a violation. Permit grants of one name come
/// at once and answer in any order, so their tokens are not compared across clients.
async fn semaphore_loop(
    stats: Arc<Stats>,
    holding: Arc<(AtomicUsize, AtomicU64)>,
    mut w: Worker,
    name: String,
    (permits, hold): (u32, Duration),
    ttl: Duration,
) -> Worker {
    let mut last_token = 0u64;
    while !stats.stopped() {
        renew_session(&stats, &mut w, ttl).await;
        let started = Instant::now();
        let guard = match w
            .session
            .acquire_permit(name.as_str(), permits)
            .wait(Some(ACQUIRE_TIMEOUT))
            .await
        {
            Ok(g) => g,
            Err(e) => {
                stats.error(&e);
                tokio::time::sleep(ERROR_BACKOFF).await;
                continue;
            }
        };
        let granted = Instant::now();
        let (holders, over) = &*holding;
        if holders.fetch_add(1, Ordering::SeqCst) + 1 > permits as usize {
            over.fetch_add(1, Ordering::Relaxed);
        }
        // This client's own grants of the name follow one another.
        if guard.token() <= last_token {
            stats.violation();
        }
        last_token = guard.token();
        if stats.measuring() {
            stats.record_acquire(granted - started);
            stats.ops.fetch_add(1, Ordering::Relaxed);
        }
        stats.progress.fetch_add(1, Ordering::Relaxed);
        if !hold.is_zero() {
            tokio::time::sleep(hold).await;
        }
        holders.fetch_sub(1, Ordering::SeqCst);
        match guard.release().await {
            Ok(()) if stats.measuring() => stats.record_release(granted.elapsed()),
            Ok(()) => {}
            Err(e) => stats.error(&e),
        }
    }
    w
}

pub async fn semaphore(
    plan: &Plan,
    target: &Target,
    cluster: Option<&BenchCluster>,
) -> anyhow::Result<Report> {
    let workers = open_workers(plan, target, plan.clients).await?;
    let stats = Arc::new(Stats::new());
    let holding = Arc::new((AtomicUsize::new(0), AtomicU64::new(0)));
    let name = format!("{}{}", plan.prefix, plan.workload.name());
    let (ttl, permits, hold) = (plan.ttl, plan.permits, plan.hold);
    let (window, workers) = timed(plan, target, cluster, &stats, workers, |w| {
        semaphore_loop(
            stats.clone(),
            holding.clone(),
            w,
            name.clone(),
            (permits, hold),
            ttl,
        )
    })
    .await?;
    close_all(workers).await;
    let mut report = stats.report(plan, "grant", &window);
    report.permits = Some(permits);
    report.holders_over_permits = Some(holding.1.load(Ordering::Relaxed));
    Ok(report)
}

/// Resident memory of every member (empty without a cluster of the bench's own).
fn memory(cluster: Option<&BenchCluster>) -> Vec<(u64, u64)> {
    let Some(cluster) = cluster else {
        return Vec::new();
    };
    cluster
        .ids()
        .into_iter()
        .filter_map(|id| Some((id, super::scrape::rss_bytes(cluster.pid(id)?)?)))
        .collect()
}

pub async fn hold(
    plan: &Plan,
    target: &Target,
    cluster: Option<&BenchCluster>,
) -> anyhow::Result<Report> {
    let workers = open_workers(plan, target, plan.clients).await?;
    let sessions: Vec<Arc<Session>> = workers.into_iter().map(|w| Arc::new(w.session)).collect();
    let stats = Arc::new(Stats::new());
    let rss_before = memory(cluster);
    // Fill: a pool of tasks takes lock numbers in turn; lock j belongs to session j mod M.
    let fill_started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let guards: Arc<Mutex<Vec<LockGuard>>> = Arc::new(Mutex::new(Vec::with_capacity(plan.locks)));
    let mut set = JoinSet::new();
    let in_flight = latchkey_core::limits::BENCH_HOLD_FILL_IN_FLIGHT_MAX.min(plan.locks);
    for _ in 0..in_flight {
        let (next, guards, stats, sessions) = (
            next.clone(),
            guards.clone(),
            stats.clone(),
            sessions.clone(),
        );
        let (locks, prefix) = (plan.locks, plan.prefix.clone());
        set.spawn(async move {
            loop {
                let j = next.fetch_add(1, Ordering::Relaxed);
                if j >= locks {
                    return;
                }
                let session = &sessions[j % sessions.len()];
                let started = Instant::now();
                match session
                    .lock(format!("{prefix}hold/{j}"))
                    .wait(Some(ACQUIRE_TIMEOUT))
                    .await
                {
                    Ok(g) => {
                        stats.record_acquire(started.elapsed());
                        stats.progress.fetch_add(1, Ordering::Relaxed);
                        guards.lock().expect("guards lock").push(g);
                    }
                    Err(e) => stats.error(&e),
                }
            }
        });
    }
    // A million locks take minutes to acquire: the fill fails only when it stops making
    // progress (no grant and no error for an acquire's whole timeout), not after a fixed time.
    let mut last_progress = (stats.progress.load(Ordering::Relaxed), Instant::now());
    loop {
        match tokio::time::timeout(FILL_PROGRESS_CHECK, set.join_next()).await {
            Ok(Some(joined)) => joined.context("a fill task failed")?,
            Ok(None) => break,
            Err(_) => {
                let done = stats.progress.load(Ordering::Relaxed) + stats.error_count();
                if done != last_progress.0 {
                    last_progress = (done, Instant::now());
                } else if last_progress.1.elapsed() > ACQUIRE_TIMEOUT + DRAIN_TIMEOUT {
                    anyhow::bail!(
                        "acquiring {} locks stopped making progress at {done}",
                        plan.locks
                    );
                }
            }
        }
    }
    let fill_s = fill_started.elapsed().as_secs_f64();
    let held = guards.lock().expect("guards lock").len() as u64;
    // Idle: only the sessions' keepalives run.
    let _progress = super::progress(plan, stats.clone());
    tokio::time::sleep(plan.warmup).await;
    let before = super::Snapshot::take(target, cluster).await;
    stats.set_phase(Phase::Measuring);
    tokio::time::sleep(plan.duration).await;
    stats.set_phase(Phase::Stopped);
    let after = super::Snapshot::take(target, cluster).await;
    let rss_after = memory(cluster);
    let window = Window {
        before,
        after,
        kills: Vec::new(),
    };
    // Sessions first: closing one releases its locks at once, and the guards' background
    // releases are then abandoned.
    let sessions: Vec<Session> = sessions.into_iter().filter_map(Arc::into_inner).collect();
    let mut set = JoinSet::new();
    for s in sessions {
        set.spawn(async move {
            let _ = s.close().await;
        });
    }
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while set.join_next().await.is_some() {}
    })
    .await;
    drop(guards);

    // The window has no acquires: ops are the held locks, so the server figures read "per
    // held lock" (keepalive traffic must not grow with them).
    let mut report = stats.report(plan, "held lock", &window);
    report.ops = held;
    report.ops_per_s = held as f64 / fill_s;
    report.server = window.server_figures(held);
    report.hold = Some(HoldFigures {
        locks: held,
        sessions: plan.clients as u64,
        fill_s,
        memory: rss_before
            .iter()
            .filter_map(|&(id, before)| {
                let after = rss_after.iter().find(|(i, _)| *i == id)?.1;
                Some(NodeMemory {
                    id,
                    rss_before_bytes: before,
                    rss_after_bytes: after,
                    bytes_per_lock: (after as f64 - before as f64) / held.max(1) as f64,
                })
            })
            .collect(),
    });
    Ok(report)
}

/// The failover probe's lock name for one attempt: a name of group 0, the group whose leader
/// `wait_healthy` names and the round kills, so that with several groups the grant measured
/// is the one the failover held up (a name of another group, led by a live member, would be
/// granted at once).
fn probe_name(prefix: &str, groups: u32, round: u32, attempt: u32) -> String {
    // Jump hashing puts a name in group 0 with probability 1/G (G <= 64): 10,000 tries all
    // miss with probability below 1e-60.
    (0u32..10_000)
        .map(|salt| format!("{prefix}probe/{round}/{attempt}/{salt}"))
        .find(|name| latchkey_core::group_of(name, groups) == 0)
        .expect("a name of group 0 among 10,000")
}

pub async fn failover(
    plan: &Plan,
    target: &Target,
    cluster: &mut BenchCluster,
) -> anyhow::Result<Report> {
    let workers = open_workers(plan, target, plan.clients).await?;
    let probe = target.client()?;
    let probe_session = probe
        .session(plan.ttl)
        .await
        .context("the probe's session")?;
    let stats = Arc::new(Stats::new());
    let mut set = JoinSet::new();
    for w in workers {
        let name = format!("{}u/{}", plan.prefix, w.index);
        set.spawn(uncontended_loop(stats.clone(), w, name, plan.ttl, None));
    }
    let _progress = super::progress(plan, stats.clone());
    tokio::time::sleep(plan.warmup).await;
    let before = super::Snapshot::take(target, Some(cluster)).await;
    stats.set_phase(Phase::Measuring);
    let load_per_round = plan.duration / plan.rounds;
    let mut kill_to_grant_ms = Vec::new();
    let mut kills = Vec::new();
    for round in 0..plan.rounds {
        stats.round.store(u64::from(round) + 1, Ordering::Relaxed);
        tokio::time::sleep(load_per_round).await;
        let leader = cluster
            .wait_healthy(FAILOVER_HEAL_TIMEOUT)
            .await
            .with_context(|| format!("round {round}: no leader before the kill"))?;
        // Its counters die with it: read them first (what it counts in the next
        // milliseconds is lost).
        let addr = target.metrics.iter().find(|(id, _)| *id == leader);
        let last = match addr {
            Some((_, addr)) => super::scrape::scrape(addr).await.ok(),
            None => None,
        };
        kills.push((leader, last));
        cluster.kill9(leader);
        let killed = Instant::now();
        let mut granted = None;
        for attempt in 0u32.. {
            if killed.elapsed() > FAILOVER_GRANT_TIMEOUT {
                break;
            }
            // A fresh name each attempt: its grant can only come from a proposal made after
            // the kill.
            let name = probe_name(&plan.prefix, plan.groups, round, attempt);
            match probe_session
                .lock(name)
                .wait(Some(PROBE_ATTEMPT_TIMEOUT))
                .await
            {
                Ok(g) => {
                    granted = Some(killed.elapsed());
                    let _ = g.release().await;
                    break;
                }
                Err(Error::SessionLost { .. }) => {
                    anyhow::bail!("round {round}: the probe's session was lost in the failover")
                }
                Err(_) => continue,
            }
        }
        let took = granted.with_context(|| {
            format!("round {round}: no grant within {FAILOVER_GRANT_TIMEOUT:?} of the kill")
        })?;
        kill_to_grant_ms.push(took.as_secs_f64() * 1e3);
        cluster.restart(leader)?;
        cluster
            .wait_healthy(FAILOVER_HEAL_TIMEOUT)
            .await
            .with_context(|| format!("round {round}: member {leader} did not rejoin"))?;
    }
    stats.set_phase(Phase::Stopped);
    let after = super::Snapshot::take(target, Some(cluster)).await;
    let workers = drain(&mut set).await;
    close_all(workers).await;
    let _ = probe_session.close().await;
    let window = Window {
        before,
        after,
        kills,
    };
    let mut report = stats.report(plan, "pair", &window);
    let mut sorted = kill_to_grant_ms.clone();
    sorted.sort_by(f64::total_cmp);
    report.failover = Some(FailoverFigures {
        rounds: plan.rounds,
        kill_to_grant_min_ms: sorted[0],
        kill_to_grant_median_ms: sorted[sorted.len() / 2],
        kill_to_grant_max_ms: sorted[sorted.len() - 1],
        kill_to_grant_ms,
    });
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::probe_name;

    #[test]
    fn the_failover_probe_locks_names_of_group_0_only() {
        for groups in [1, 2, 4, 8, 64] {
            let names: std::collections::BTreeSet<String> = (0..3)
                .flat_map(|round| (0..20).map(move |attempt| (round, attempt)))
                .map(|(round, attempt)| probe_name("bench/", groups, round, attempt))
                .collect();
            assert_eq!(names.len(), 60, "a fresh name each attempt");
            for name in names {
                assert_eq!(
                    latchkey_core::group_of(&name, groups),
                    0,
                    "{name} of {groups}"
                );
            }
        }
    }
}
