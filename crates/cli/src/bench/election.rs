//! `bench --workload election`: `--clients` real `latchkey elect` processes (this very binary)
//! campaign for one name. Each one's COMMAND is a shell that appends its start (candidate,
//! process group, the time, `LATCHKEY_TOKEN`) to a file the bench reads, then sleeps. Round
//! after round the bench SIGKILLs the leading candidate's `elect` process, then COMMAND's
//! process group (the killed `elect` cannot stop it any more), and times the kill to the next
//! leader's COMMAND start, read from that start's own record; then it starts a new candidate,
//! so that as many keep campaigning.
//!
//! The figure is about the candidates' session TTL (`--ttl`, 3 s by default here): a killed
//! process's session, and its leadership with it, lives until its lease expires, a TTL after
//! the leader last heard from it; then the first candidate of the FIFO queue is granted, learns
//! it and starts COMMAND (docs/PERFORMANCE.md has the figures).
//!
//! No process outlives the bench. The candidates get the members' parent-death signal; the
//! bench is a child subreaper, so a killed candidate's COMMAND becomes its child and is reaped
//! with its whole group; [`Candidates`] stops every candidate at the end (SIGTERM, which
//! `elect` forwards to COMMAND) and, dropped on an error or Ctrl-C, kills them all. It signals
//! a COMMAND's process group only while one of its processes is the bench's own child
//! ([`ours`]): a group whose processes an `elect` already reaped has an id any process may
//! have since.
//!
//! The candidates connect as the bench does: the bench's `--ca`, `--cert` and `--key` on their
//! command line, its `--auth-token` in their environment (`LATCHKEY_AUTH_TOKEN`).

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use latchkey_client::Client;
use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tempfile::TempDir;

use super::cluster::{die_with_the_bench, without_the_benchs_settings, BenchCluster};
use super::report::{ElectionFigures, Percentiles, Report};
use super::workloads::{histogram, us, Phase, Stats};
use super::{Plan, Snapshot, Target, Window};

/// How long the first candidates get to open their sessions, one to lead and the rest to queue.
const SETUP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a new candidate gets to join the queue before the next kill.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(60);
/// Beyond the TTL: how long after a kill the next leader's COMMAND may take to start.
const NEXT_LEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// Poll interval of the starts file (the figure is each start's own timestamp, not the poll's).
const POLL: Duration = Duration::from_millis(10);
/// Poll interval of the election's queue (`describe` calls).
const QUEUE_POLL: Duration = Duration::from_millis(50);
/// How long candidates get to exit after SIGTERM at the end before they are killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a SIGKILLed process group gets to be gone.
const REAP_TIMEOUT: Duration = Duration::from_secs(10);
/// Lines of a candidate's log shown when it fails.
const LOG_TAIL_LINES: usize = 20;

/// Every candidate's COMMAND: `$1` the candidate's number, `$2` the starts file, `$3` the
/// bench's pid, `$4` at most how many seconds to run. Its first act appends one line (a single
/// short `O_APPEND` write: lines never interleave); then it sleeps a second at a time while the
/// bench lives, so that even after a `kill -9` of the bench (whose candidates the parent-death
/// signal ends, but not their COMMANDs' groups) it ends within a second. Its group has two
/// processes (the shell and its `sleep`), as a real COMMAND's often has.
const COMMAND: &str = r#"printf '%s %s %s %s\n' "$1" "$$" "$(date +%s%N)" "$LATCHKEY_TOKEN" >> "$2"
n=0; while [ "$n" -lt "$4" ] && kill -0 "$3" 2>/dev/null; do sleep 1; n=$((n + 1)); done"#;

/// One line of the starts file: a candidate's COMMAND started (it led).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Start {
    candidate: u32,
    /// COMMAND's process group (the shell is its leader).
    group: i32,
    /// When it started, in nanoseconds since the Unix epoch (`date +%s%N`).
    at_ns: u64,
    /// Its term: the grant's fencing token.
    token: u64,
}

/// The complete lines of the starts file, in order (a last line without its newline is still
/// being written, and is left for the next read).
fn parse_starts(text: &str) -> anyhow::Result<Vec<Start>> {
    let complete = match text.rfind('\n') {
        Some(end) => &text[..end],
        None => return Ok(Vec::new()),
    };
    complete
        .lines()
        .map(|line| {
            parse_start(line).with_context(|| {
                format!(
                    "a COMMAND's start record {line:?} is not 'CANDIDATE PGID NANOSECONDS TOKEN' \
                     (does this system's `date` know %N?)"
                )
            })
        })
        .collect()
}

fn parse_start(line: &str) -> Option<Start> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    match fields[..] {
        [candidate, group, at_ns, token] => Some(Start {
            candidate: candidate.parse().ok()?,
            group: group.parse().ok()?,
            at_ns: at_ns.parse().ok()?,
            token: token.parse().ok()?,
        }),
        _ => None,
    }
}

fn now_ns() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
}

/// One `latchkey elect` process.
struct Candidate {
    number: u32,
    child: Child,
}

/// The candidate processes, their COMMANDs' groups and the directory of their files.
struct Candidates {
    exe: PathBuf,
    /// `elect`'s arguments before COMMAND's (endpoints, TTL, TLS files, the name).
    elect_args: Vec<String>,
    /// The bench's `--auth-token`, which each `elect` gets in `LATCHKEY_AUTH_TOKEN`.
    auth_token: Option<String>,
    /// How long a COMMAND runs at most: longer than the whole run, and bounded.
    command_s_max: u64,
    running: Vec<Candidate>,
    next_number: u32,
    /// COMMAND process groups that started and are not known to be gone (each is signalled
    /// only while one of its processes is the bench's child: [`ours`]).
    groups: BTreeSet<i32>,
    /// Every start read so far, and how many of them [`Candidates::next_start`] returned.
    starts: Vec<Start>,
    starts_taken: usize,
    dir: TempDir,
}

impl Candidates {
    fn new(
        plan: &Plan,
        target: &Target,
        name: &str,
        command_s_max: u64,
    ) -> anyhow::Result<Candidates> {
        let dir = tempfile::Builder::new()
            .prefix("latchkey-bench-election-")
            .tempdir()
            .context("creating the candidates' temporary directory")?;
        let mut elect_args = vec![
            "elect".to_owned(),
            "--endpoints".to_owned(),
            target.endpoints().join(","),
            "--ttl".to_owned(),
            format!("{}ms", plan.ttl.as_millis()),
        ];
        elect_args.extend(target.tls_args());
        elect_args.push(name.to_owned());
        Ok(Candidates {
            exe: std::env::current_exe().context("locating the latchkey binary")?,
            elect_args,
            auth_token: target.auth_token().map(str::to_owned),
            command_s_max,
            running: Vec::new(),
            next_number: 1,
            groups: BTreeSet::new(),
            starts: Vec::new(),
            starts_taken: 0,
            dir,
        })
    }

    fn starts_path(&self) -> PathBuf {
        self.dir.path().join("starts")
    }

    fn log_path(&self, number: u32) -> PathBuf {
        self.dir.path().join(format!("candidate-{number}.log"))
    }

    /// Starts one more candidate (does not wait for it to campaign).
    fn start(&mut self) -> anyhow::Result<()> {
        let number = self.next_number;
        self.next_number += 1;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(number))
            .context("opening a candidate's log")?;
        let mut command = Command::new(&self.exe);
        command
            .args(&self.elect_args)
            .args(["--value", &format!("candidate-{number}")])
            .args(["--", "sh", "-c", COMMAND, "latchkey-bench-candidate"])
            .arg(number.to_string())
            .arg(self.starts_path())
            .arg(std::process::id().to_string())
            .arg(self.command_s_max.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        without_the_benchs_settings(&mut command);
        if let Some(token) = &self.auth_token {
            // In the environment, not on the command line other users can read.
            command.env("LATCHKEY_AUTH_TOKEN", token);
        }
        die_with_the_bench(&mut command);
        let child = command
            .spawn()
            .with_context(|| format!("starting candidate {number}"))?;
        self.running.push(Candidate { number, child });
        Ok(())
    }

    /// An error if a candidate exited (none does unless killed), with its log.
    fn check_running(&mut self) -> anyhow::Result<()> {
        for c in &mut self.running {
            if let Ok(Some(status)) = c.child.try_wait() {
                let number = c.number;
                self.running.retain(|c| c.number != number);
                anyhow::bail!(
                    "candidate {number} exited: {status}\n{}",
                    self.log_tail(number)
                );
            }
        }
        Ok(())
    }

    fn log_tail(&self, number: u32) -> String {
        let text = std::fs::read_to_string(self.log_path(number)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "--- candidate {number} ---\n{}",
            lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
        )
    }

    /// Reads the starts file again: every new start's COMMAND group is one to stop.
    fn refresh(&mut self) -> anyhow::Result<()> {
        let text = match std::fs::read_to_string(self.starts_path()) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).context("reading the candidates' starts"),
        };
        let starts = parse_starts(&text)?;
        for start in starts.iter().skip(self.starts.len()) {
            self.groups.insert(start.group);
        }
        self.starts = starts;
        Ok(())
    }

    /// The next COMMAND start after those already taken, waiting at most `timeout`.
    async fn next_start(&mut self, timeout: Duration) -> anyhow::Result<Start> {
        let deadline = Instant::now() + timeout;
        loop {
            self.refresh()?;
            if let Some(&start) = self.starts.get(self.starts_taken) {
                self.starts_taken += 1;
                return Ok(start);
            }
            self.check_running()?;
            if Instant::now() >= deadline {
                let logs: Vec<String> = self
                    .running
                    .iter()
                    .map(|c| self.log_tail(c.number))
                    .collect();
                anyhow::bail!(
                    "no candidate's COMMAND started within {timeout:?}\n{}",
                    logs.join("\n")
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until `leader` holds the election (by the servers' own account) and every other
    /// candidate waits in its queue.
    async fn wait_queued(
        &mut self,
        client: &Client,
        name: &str,
        leader: &Start,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let waiters = self.running.len() - 1;
        loop {
            self.check_running()?;
            let last = match client.describe(name).await {
                Ok(info) => {
                    let holder = info.holder.as_ref().map(|h| h.token);
                    if holder == Some(leader.token) && info.waiters as usize == waiters {
                        return Ok(());
                    }
                    format!("holder token {holder:?}, {} waiting", info.waiters)
                }
                Err(e) => e.to_string(),
            };
            anyhow::ensure!(
                Instant::now() < deadline,
                "candidate {} (token {}) did not lead with {waiters} candidates queued within \
                 {timeout:?} (last: {last})",
                leader.candidate,
                leader.token
            );
            tokio::time::sleep(QUEUE_POLL).await;
        }
    }

    /// SIGKILL candidate `number`'s `elect` process and reap it; the time just before the kill
    /// (nanoseconds since the epoch).
    fn kill9(&mut self, number: u32) -> anyhow::Result<u64> {
        let at = self
            .running
            .iter()
            .position(|c| c.number == number)
            .with_context(|| format!("candidate {number} is not running"))?;
        let mut c = self.running.remove(at);
        let killed_ns = now_ns();
        c.child
            .kill()
            .with_context(|| format!("killing candidate {number}"))?;
        c.child
            .wait()
            .with_context(|| format!("reaping candidate {number}"))?;
        Ok(killed_ns)
    }

    /// SIGKILL a COMMAND's process group and reap its processes (the bench's children by then,
    /// as a subreaper, once their `elect` is gone); an error if any is still there. A group
    /// with no process that is the bench's child is left alone: its processes are gone (an
    /// `elect` reaped its shell), and its id may since be any process's ([`ours`]).
    async fn kill_group(&mut self, group: i32) -> anyhow::Result<()> {
        self.groups.remove(&group);
        if !ours(group) {
            return Ok(());
        }
        let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
        let deadline = Instant::now() + REAP_TIMEOUT;
        while !reap_group(group) {
            anyhow::ensure!(
                Instant::now() < deadline,
                "COMMAND's process group {group} was still there {REAP_TIMEOUT:?} after SIGKILL"
            );
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }

    /// The end of a run: SIGTERM to every candidate (a leader's `elect` forwards it to COMMAND
    /// and waits for it; the others stop waiting), SIGKILL to those still running after
    /// [`STOP_TIMEOUT`], then every COMMAND group still there is killed and reaped.
    async fn stop(mut self) -> anyhow::Result<()> {
        for c in &self.running {
            let _ = kill(Pid::from_raw(c.child.id() as i32), Signal::SIGTERM);
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while !self.running.is_empty() && Instant::now() < deadline {
            self.running
                .retain_mut(|c| !matches!(c.child.try_wait(), Ok(Some(_)) | Err(_)));
            tokio::time::sleep(POLL).await;
        }
        for mut c in std::mem::take(&mut self.running) {
            tracing::warn!(
                candidate = c.number,
                "still running {STOP_TIMEOUT:?} after SIGTERM"
            );
            let _ = c.child.kill();
            let _ = c.child.wait();
        }
        // A waiting candidate may have been granted (and started COMMAND) as the leader
        // stopped, before its own SIGTERM arrived.
        self.refresh()?;
        for group in self.groups.clone() {
            self.kill_group(group).await?;
        }
        Ok(())
    }
}

/// Whether a process of COMMAND's process `group` is the bench's child, running or exited but
/// not yet reaped (asked with `WNOWAIT`: nothing is reaped). Only then may the bench signal the
/// group: a group id stays its group's while any member exists, a zombie included, so it
/// cannot have been reused. With every `elect` gone, each of COMMAND's processes is the
/// bench's child (a subreaper's) or the child of one that is, so a group with none is empty.
fn ours(group: i32) -> bool {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    !matches!(
        waitid(Id::PGid(Pid::from_raw(group)), flags),
        Err(Errno::ECHILD)
    )
}

/// Reaps every process of `group` that is the bench's child and has exited (without waiting);
/// true once none of the group is the bench's child (see [`ours`]: the group is gone).
fn reap_group(group: i32) -> bool {
    loop {
        match waitpid(Pid::from_raw(-group), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return false,
            Err(Errno::ECHILD) => return true,
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(_) => return false,
        }
    }
}

impl Drop for Candidates {
    /// An error or Ctrl-C: kill everything at once (a clean end went through [`Candidates::stop`]).
    fn drop(&mut self) {
        for c in &mut self.running {
            let _ = c.child.kill();
            let _ = c.child.wait();
        }
        let _ = self.refresh();
        let deadline = Instant::now() + REAP_TIMEOUT;
        for &group in self.groups.iter().filter(|&&g| ours(g)) {
            let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
            while !reap_group(group) && Instant::now() < deadline {
                std::thread::sleep(POLL);
            }
        }
    }
}

pub async fn election(
    plan: &Plan,
    target: &Target,
    cluster: Option<&BenchCluster>,
) -> anyhow::Result<Report> {
    // A killed candidate's COMMAND then becomes the bench's child, which it can reap.
    nix::sys::prctl::set_child_subreaper(true).context("becoming a child subreaper")?;
    let name = format!("{}election", plan.prefix);
    let client = target.client()?;
    let per_round = plan.ttl + QUEUE_TIMEOUT + NEXT_LEADER_TIMEOUT + REAP_TIMEOUT;
    let command_s_max = (SETUP_TIMEOUT + per_round * plan.rounds + STOP_TIMEOUT).as_secs();
    let mut candidates = Candidates::new(plan, target, &name, command_s_max)?;
    for _ in 0..plan.clients {
        candidates.start()?;
    }
    let stats = Arc::new(Stats::new());
    stats.set_phase(Phase::Measuring);
    let _progress = super::progress(plan, stats.clone());
    let setup = Instant::now();
    let mut leader = candidates.next_start(SETUP_TIMEOUT).await?;
    candidates
        .wait_queued(
            &client,
            &name,
            &leader,
            SETUP_TIMEOUT.saturating_sub(setup.elapsed()),
        )
        .await?;
    let before = Snapshot::take(target, cluster).await;
    let mut kill_to_command = histogram();
    let mut kill_to_command_ms = Vec::with_capacity(plan.rounds as usize);
    for round in 1..=plan.rounds {
        stats.round.store(u64::from(round), Ordering::Relaxed);
        if round > 1 {
            candidates
                .wait_queued(&client, &name, &leader, QUEUE_TIMEOUT)
                .await
                .with_context(|| format!("round {round}"))?;
        }
        let killed_ns = candidates.kill9(leader.candidate)?;
        candidates.kill_group(leader.group).await?;
        let next = candidates
            .next_start(plan.ttl + NEXT_LEADER_TIMEOUT)
            .await
            .with_context(|| {
                format!(
                    "round {round}: after the kill of candidate {}",
                    leader.candidate
                )
            })?;
        anyhow::ensure!(
            next.candidate != leader.candidate,
            "round {round}: killed candidate {}'s COMMAND started again",
            leader.candidate
        );
        // Each new term's token is above every earlier one.
        if next.token <= leader.token {
            stats.violation();
        }
        let took = Duration::from_nanos(next.at_ns.saturating_sub(killed_ns));
        kill_to_command.saturating_record(us(took).max(1));
        kill_to_command_ms.push(took.as_secs_f64() * 1e3);
        stats.progress.fetch_add(1, Ordering::Relaxed);
        // The new candidate starts after the measurement, so that its start-up is not in it.
        candidates.start()?;
        leader = next;
    }
    stats.set_phase(Phase::Stopped);
    let after = Snapshot::take(target, cluster).await;
    candidates.stop().await?;
    let window = Window {
        before,
        after,
        kills: Vec::new(),
    };
    let mut report = stats.report(plan, "failover", &window);
    // No warm-up: the window starts once the first leader leads with the others queued.
    report.warmup_s = 0.0;
    report.ops = u64::from(plan.rounds);
    report.ops_per_s = report.ops as f64 / window.seconds();
    report.server = window.server_figures(report.ops);
    report.election = Some(ElectionFigures {
        candidates: plan.clients,
        rounds: plan.rounds,
        ttl_ms: u64::try_from(plan.ttl.as_millis()).unwrap_or(u64::MAX),
        kill_to_command: Percentiles::of(&kill_to_command).expect("one round at least"),
        kill_to_command_ms,
    });
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_are_read_from_complete_lines_only() {
        let text = "2 4411 1796613919156282701 7\n1 4420 1796613922156282701 9\n3 44";
        assert_eq!(
            parse_starts(text).unwrap(),
            [
                Start {
                    candidate: 2,
                    group: 4411,
                    at_ns: 1_796_613_919_156_282_701,
                    token: 7
                },
                Start {
                    candidate: 1,
                    group: 4420,
                    at_ns: 1_796_613_922_156_282_701,
                    token: 9
                },
            ]
        );
        assert_eq!(parse_starts("").unwrap(), []);
        assert_eq!(parse_starts("1 2 3").unwrap(), []);
    }

    /// A process group the bench does not own: `sleep` in a session of its own, whose shell
    /// parent exited at once, so that it is nobody's child here. Answers its group id.
    fn a_strangers_group() -> i32 {
        let out = Command::new("sh")
            .args(["-c", "setsid sleep 30 </dev/null >/dev/null 2>&1 & echo $!"])
            .output()
            .expect("sh");
        let pid: i32 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("a pid");
        // setsid only forks if it leads a group, which a background job does not.
        let deadline = Instant::now() + REAP_TIMEOUT;
        while nix::unistd::getpgid(Some(Pid::from_raw(pid))) != Ok(Pid::from_raw(pid)) {
            assert!(Instant::now() < deadline, "{pid} never led its own group");
            std::thread::sleep(POLL);
        }
        pid
    }

    /// `stop` killed every COMMAND group it had read a start of, also one whose shell an
    /// `elect` had already reaped: that group id could since belong to any process. Here it
    /// is a stranger's group, recorded as a start, which the bench must leave alone.
    #[tokio::test]
    async fn stop_kills_no_group_that_is_not_the_benchs() {
        let stranger = a_strangers_group();
        let dir = tempfile::tempdir().expect("temp dir");
        let candidates = Candidates {
            exe: PathBuf::from("latchkey"),
            elect_args: Vec::new(),
            auth_token: None,
            command_s_max: 1,
            running: Vec::new(),
            next_number: 2,
            groups: BTreeSet::new(),
            starts: Vec::new(),
            starts_taken: 0,
            dir,
        };
        let line = format!("1 {stranger} {} 7\n", now_ns());
        std::fs::write(candidates.starts_path(), line).expect("starts");
        let stopped = candidates.stop().await;
        // Alive and not a zombie (a killed process its new parent has not reaped yet).
        let stat = std::fs::read_to_string(format!("/proc/{stranger}/stat")).unwrap_or_default();
        let alive = stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'));
        let _ = kill(Pid::from_raw(stranger), Signal::SIGKILL);
        stopped.expect("stop");
        assert!(
            alive,
            "stop killed process group {stranger}, which was not the bench's"
        );
    }

    /// A `date` without %N prints it literally: a clear error, not a figure from garbage.
    #[test]
    fn a_start_record_without_nanoseconds_is_an_error() {
        let e = parse_starts("1 4411 1796613919%N 7\n").unwrap_err();
        assert!(format!("{e:#}").contains("%N"), "{e:#}");
    }
}
