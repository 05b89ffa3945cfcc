//! `bench --cluster N`: N real `latchkey serve` processes (this very binary) on 127.0.0.1
//! free ports, each with its own data dir (real disk, fsync on, default timing) and its own
//! `--metrics-listen` port, in a temporary directory removed afterwards.
//!
//! No member outlives the bench: every process is killed when the [`BenchCluster`] drops (an
//! error, a panic, or Ctrl-C, which the bench turns into an early return), and each member is
//! started with a parent-death signal so that even a `kill -9` of the bench takes it down.

use std::fs::OpenOptions;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use latchkey_client::Client;
use tempfile::TempDir;

use super::scrape;

/// How long a fresh cluster gets to elect a leader that serves reads.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Poll interval of the health checks (each poll is a few status calls).
const POLL: Duration = Duration::from_millis(50);
/// Starts on new ports when a picked port was taken by someone else before the member bound it.
const START_ATTEMPTS: usize = 3;
/// Lines of a member's log shown when it fails.
const LOG_TAIL_LINES: usize = 30;

struct Member {
    id: u64,
    addr: String,
    metrics_addr: String,
    child: Option<Child>,
    /// CPU seconds of this member's earlier processes (killed and restarted by failover).
    retired_cpu_s: f64,
}

pub struct BenchCluster {
    members: Vec<Member>,
    /// `serve --groups` of every member.
    groups: u32,
    /// `serve --replicas` of every member.
    replicas: u32,
    /// `serve --coalesce` of every member (false with the bench's `--no-coalesce`).
    coalesce: bool,
    dir: TempDir,
    exe: PathBuf,
    /// For status calls pinned to one member.
    status: Client,
}

/// A port nobody listened on a moment ago.
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// The processes the bench starts (members, election candidates) are its own: a config file
/// or `LATCHKEY_*` settings the bench was started with (`LATCHKEY_CONFIG`, `LATCHKEY_ACL`,
/// `LATCHKEY_ENDPOINTS`, ...) are not theirs, and they log at their own default level, whatever
/// `RUST_LOG` the bench was given.
pub(super) fn without_the_benchs_settings(command: &mut Command) {
    command.env_remove("RUST_LOG");
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("LATCHKEY_") {
            command.env_remove(key);
        }
    }
}

/// Gives a process the bench starts (a member, an election candidate) a parent-death signal,
/// so that even a `kill -9` of the bench takes it down.
pub(super) fn die_with_the_bench(command: &mut Command) {
    // SAFETY: prctl(PR_SET_PDEATHSIG) and getppid are async-signal-safe and touch no
    // memory of the parent. The signal fires when the *thread* that spawned the process
    // exits: they are spawned from the bench's main future, whose thread lives as long
    // as the bench. A bench that dies between the fork and the prctl sends no signal (the
    // child was already orphaned): the child then sees another parent and does not exec
    // (prctl(2)); before this check such a member outlived a bench killed -9 as it started.
    let bench = nix::unistd::getpid();
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)?;
            if nix::unistd::getppid() != bench {
                return Err(std::io::Error::other(
                    "the bench exited as this process started",
                ));
            }
            Ok(())
        });
    }
}

impl BenchCluster {
    /// Starts `n` members and waits until a leader serves reads.
    pub async fn start(
        n: usize,
        groups: u32,
        replicas: u32,
        coalesce: bool,
    ) -> anyhow::Result<BenchCluster> {
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            let mut cluster = BenchCluster::spawn_all(n, groups, replicas, coalesce)?;
            match cluster.wait_healthy(START_TIMEOUT).await {
                Ok(_) => return Ok(cluster),
                Err(e) => last = Some(e.context(cluster.logs())),
            }
        }
        Err(last
            .expect("at least one attempt")
            .context("the bench cluster did not start"))
    }

    fn spawn_all(
        n: usize,
        groups: u32,
        replicas: u32,
        coalesce: bool,
    ) -> anyhow::Result<BenchCluster> {
        let dir = tempfile::Builder::new()
            .prefix("latchkey-bench-")
            .tempdir()
            .context("creating the cluster's temporary directory")?;
        let members = (1..=n as u64)
            .map(|id| {
                Ok(Member {
                    id,
                    addr: format!("127.0.0.1:{}", free_port()?),
                    metrics_addr: format!("127.0.0.1:{}", free_port()?),
                    child: None,
                    retired_cpu_s: 0.0,
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let status = Client::with_config(
            members.iter().map(|m| m.addr.clone()),
            latchkey_client::ClientConfig::default(),
        )?;
        let mut cluster = BenchCluster {
            members,
            groups,
            replicas,
            coalesce,
            dir,
            exe: std::env::current_exe().context("locating the latchkey binary")?,
            status,
        };
        for id in cluster.ids() {
            cluster.spawn(id)?;
        }
        Ok(cluster)
    }

    pub fn ids(&self) -> Vec<u64> {
        self.members.iter().map(|m| m.id).collect()
    }

    fn member(&self, id: u64) -> &Member {
        &self.members[(id - 1) as usize]
    }

    fn member_mut(&mut self, id: u64) -> &mut Member {
        &mut self.members[(id - 1) as usize]
    }

    /// Every member's client address.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.addr.clone()).collect()
    }

    /// `(id, metrics address)` of every member.
    pub fn metrics_addrs(&self) -> Vec<(u64, String)> {
        self.members
            .iter()
            .map(|m| (m.id, m.metrics_addr.clone()))
            .collect()
    }

    fn log_path(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node-{id}.log"))
    }

    /// Starts member `id` on its address and data dir (does not wait for it).
    fn spawn(&mut self, id: u64) -> anyhow::Result<()> {
        let peers = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.id, m.addr))
            .collect::<Vec<_>>()
            .join(",");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(id))
            .context("opening a member's log")?;
        let data_dir = self.dir.path().join(format!("data-{id}"));
        let m = self.member(id);
        let mut command = Command::new(&self.exe);
        command
            .arg("serve")
            .args(["--id", &id.to_string()])
            .args(["--listen", &m.addr])
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--peers", &peers])
            .args(["--metrics-listen", &m.metrics_addr])
            .args(["--groups", &self.groups.to_string()])
            .args(["--replicas", &self.replicas.to_string()])
            .args(["--coalesce", if self.coalesce { "true" } else { "false" }])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        without_the_benchs_settings(&mut command);
        die_with_the_bench(&mut command);
        let child = command
            .spawn()
            .with_context(|| format!("starting member {id}"))?;
        self.member_mut(id).child = Some(child);
        Ok(())
    }

    pub fn pid(&self, id: u64) -> Option<u32> {
        self.member(id).child.as_ref().map(Child::id)
    }

    /// CPU seconds used by member `id` since it first started, over all its processes.
    pub fn cpu_s(&self, id: u64) -> Option<f64> {
        let m = self.member(id);
        let current = match self.pid(id) {
            Some(pid) => scrape::cpu_s(&pid.to_string())?,
            None => 0.0,
        };
        Some(m.retired_cpu_s + current)
    }

    /// SIGKILL member `id` and reap it, keeping the CPU time it used.
    pub fn kill9(&mut self, id: u64) {
        let used = self.pid(id).and_then(|pid| scrape::cpu_s(&pid.to_string()));
        let m = self.member_mut(id);
        if let Some(mut child) = m.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        m.retired_cpu_s += used.unwrap_or(0.0);
    }

    /// Starts a killed member again on the same address, metrics port and data dir.
    pub fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        anyhow::ensure!(self.pid(id).is_none(), "member {id} is still running");
        self.spawn(id)
    }

    /// Waits until every running member answers, they agree on the term, one leads, and the
    /// leader serves a read; the leader's id.
    pub async fn wait_healthy(&mut self, timeout: Duration) -> anyhow::Result<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            for m in &mut self.members {
                if let Some(child) = m.child.as_mut() {
                    if let Ok(Some(status)) = child.try_wait() {
                        m.child = None;
                        anyhow::bail!("member {} exited: {status}", m.id);
                    }
                }
            }
            if let Some(leader) = self.healthy_leader().await {
                return Ok(leader);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "no healthy cluster within {timeout:?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    async fn healthy_leader(&self) -> Option<u64> {
        let mut terms = std::collections::BTreeSet::new();
        let mut leader = None;
        for m in self.members.iter().filter(|m| m.child.is_some()) {
            let s = self.status.node_status(&m.addr).await.ok()?;
            // With replica subsets a member outside group 0 reports itself `outside` it; the
            // others must agree on group 0's term.
            if s.role == "outside" {
                continue;
            }
            terms.insert(s.term);
            if s.role == "leader" {
                leader = Some(m.id);
            }
        }
        let leader = leader.filter(|_| terms.len() == 1)?;
        // A read goes through the leader's ReadIndex: it serves once its term is committed.
        let read = Client::connect([self.member(leader).addr.clone()])
            .await
            .ok()?;
        tokio::time::timeout(Duration::from_secs(5), read.describe("bench/ready"))
            .await
            .ok()?
            .ok()?;
        Some(leader)
    }

    /// The tail of every member's log, for error messages.
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                let text = std::fs::read_to_string(self.log_path(m.id)).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                format!(
                    "--- member {} ({}) ---\n{}",
                    m.id,
                    m.addr,
                    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for BenchCluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut child) = m.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
