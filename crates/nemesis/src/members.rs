//! The cluster under test: `latchkey serve` members, each in its own namespace, with their own
//! data directories on the real disk, killed with SIGKILL, paused with SIGSTOP.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use latchkey_client::{Client, ClientConfig, RetryPolicy};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::net::{Host, Net};

/// The client port of every member (each has its own namespace, so they do not collide).
pub const PORT: u16 = 7420;

/// A fixed server bug put back in every member, which the run's checks must catch. Passed as
/// `latchkey serve`'s `LATCHKEY_TEST_PLANT`, which only a debug build of `latchkey` accepts (a
/// release build refuses to start with it set, and the run fails to start: use the debug
/// binary, as CI does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ServerPlant {
    /// A member answers keepalives on its own belief that it leads, without the read-index
    /// round that confirms it with a quorum (`latchkey_server::Plant::renew_without_quorum`):
    /// a deposed leader that still reaches the clients keeps their leases alive alone.
    RenewWithoutQuorum,
}

impl ServerPlant {
    /// Its name in `LATCHKEY_TEST_PLANT`.
    fn env_value(self) -> &'static str {
        match self {
            ServerPlant::RenewWithoutQuorum => "renew-without-quorum",
        }
    }
}

pub struct Member {
    pub id: u64,
    pub host: Host,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    pub paused: bool,
}

impl Member {
    pub fn endpoint(&self) -> String {
        format!("{}:{PORT}", self.host.addr)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    fn pid(&self) -> Option<Pid> {
        self.child.as_ref().map(|c| Pid::from_raw(c.id() as i32))
    }
}

pub struct Members {
    pub list: Vec<Member>,
    latchkey: PathBuf,
    peers: String,
    /// Raft groups the lock namespace is split over (`serve --groups`).
    groups: u32,
    plant: Option<ServerPlant>,
    /// Asks members for their status, from the root namespace.
    probe: Client,
}

impl Members {
    /// Starts one member per member host, founding one cluster, the lock namespace split over
    /// `groups` Raft groups, `plant` put back in each.
    pub fn start(
        net: &Net,
        latchkey: &Path,
        dir: &Path,
        groups: u32,
        plant: Option<ServerPlant>,
    ) -> anyhow::Result<Members> {
        let peers = net
            .members
            .iter()
            .enumerate()
            .map(|(i, h)| format!("{}={}:{PORT}", i + 1, h.addr))
            .collect::<Vec<_>>()
            .join(",");
        let probe = Client::with_config(
            net.members
                .iter()
                .map(|h| format!("{}:{PORT}", h.addr))
                .collect::<Vec<_>>(),
            ClientConfig {
                connect_timeout: Duration::from_millis(500),
                rpc_timeout: Duration::from_millis(1000),
                retry: RetryPolicy {
                    attempts_max: 1,
                    ..RetryPolicy::default()
                },
                auth_token: None,
                batch: false,
                ..ClientConfig::default()
            },
        )?;
        let mut members = Members {
            list: net
                .members
                .iter()
                .enumerate()
                .map(|(i, host)| Member {
                    id: i as u64 + 1,
                    host: host.clone(),
                    data_dir: dir.join(format!("m{}", i + 1)),
                    log: dir.join(format!("m{}.log", i + 1)),
                    child: None,
                    paused: false,
                })
                .collect(),
            latchkey: latchkey.to_owned(),
            peers,
            groups,
            plant,
            probe,
        };
        for i in 0..members.list.len() {
            members.spawn(net, i)?;
        }
        Ok(members)
    }

    fn spawn(&mut self, net: &Net, i: usize) -> anyhow::Result<()> {
        let m = &mut self.list[i];
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)
            .with_context(|| format!("opening {}", m.log.display()))?;
        let mut command = net.command(&m.host, &self.latchkey);
        if let Some(plant) = self.plant {
            command.env("LATCHKEY_TEST_PLANT", plant.env_value());
        }
        let child = command
            .args([
                "serve",
                "--id",
                &m.id.to_string(),
                "--listen",
                &m.endpoint(),
            ])
            .args(["--peers", &self.peers, "--data-dir"])
            .arg(&m.data_dir)
            .args(["--groups", &self.groups.to_string()])
            .env("RUST_LOG", "info,openraft=error")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting member {}", m.id))?;
        m.child = Some(child);
        m.paused = false;
        Ok(())
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.list.iter().map(Member::endpoint).collect()
    }

    fn index(&self, id: u64) -> usize {
        self.list
            .iter()
            .position(|m| m.id == id)
            .expect("a member of the run")
    }

    /// SIGKILL, and waits for the exit.
    pub fn kill9(&mut self, id: u64) -> anyhow::Result<()> {
        let i = self.index(id);
        let m = &mut self.list[i];
        if let Some(mut child) = m.child.take() {
            let _ = child.kill();
            child.wait().context("waiting for a killed member")?;
        }
        m.paused = false;
        Ok(())
    }

    /// Starts a killed member again, on its data directory.
    pub fn restart(&mut self, net: &Net, id: u64) -> anyhow::Result<()> {
        let i = self.index(id);
        if self.list[i].child.is_none() {
            self.spawn(net, i)?;
        }
        Ok(())
    }

    pub fn pause(&mut self, id: u64) -> anyhow::Result<()> {
        let i = self.index(id);
        let m = &mut self.list[i];
        if let Some(pid) = m.pid() {
            kill(pid, Signal::SIGSTOP)?;
            m.paused = true;
        }
        Ok(())
    }

    pub fn resume_all(&mut self) -> anyhow::Result<()> {
        for m in &mut self.list {
            if let (true, Some(pid)) = (m.paused, m.pid()) {
                kill(pid, Signal::SIGCONT)?;
            }
            m.paused = false;
        }
        Ok(())
    }

    /// Whether any member exited by itself (it should not: only the nemesis stops members).
    pub fn exited(&mut self) -> Option<(u64, String)> {
        for m in &mut self.list {
            if let Some(child) = m.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Some((m.id, status.to_string()));
                }
            }
        }
        None
    }

    /// The leader most members that answer agree on, if one of them says it leads.
    pub async fn leader(&self) -> Option<u64> {
        let asks = self
            .list
            .iter()
            .filter(|m| m.is_running() && !m.paused)
            .map(|m| {
                let probe = self.probe.clone();
                let endpoint = m.endpoint();
                async move { probe.node_status(&endpoint).await.ok() }
            });
        let answers = futures::future::join_all(asks).await;
        let mut votes: BTreeMap<u64, (u64, u32)> = BTreeMap::new();
        for s in answers.into_iter().flatten() {
            if s.role == "leader" {
                let v = votes.entry(s.id).or_default();
                v.0 = v.0.max(s.term);
                v.1 += 1;
            }
        }
        // Two members may both say they lead (an old leader cut off): the higher term wins.
        votes
            .into_iter()
            .max_by_key(|(_, (term, _))| *term)
            .map(|(id, _)| id)
    }

    /// Writes every member's own view (role, term, the leader it follows) to `path` every
    /// `every`, one line per round, until the returned task is aborted: the timeline a failed
    /// or slow failover is read from.
    pub fn record_views(
        &self,
        path: &Path,
        start: Duration,
        every: Duration,
    ) -> anyhow::Result<tokio::task::JoinHandle<()>> {
        use std::io::Write as _;
        let mut file =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let probe = self.probe.clone();
        let endpoints = self.endpoints();
        Ok(tokio::spawn(async move {
            loop {
                let asks = endpoints.iter().map(|e| {
                    let probe = probe.clone();
                    async move { probe.node_status(e).await.ok() }
                });
                let views = futures::future::join_all(asks).await;
                let mut line = format!(
                    "{:>9.3}s",
                    crate::record::now().saturating_sub(start).as_secs_f64()
                );
                for (i, v) in views.iter().enumerate() {
                    match v {
                        Some(s) => line.push_str(&format!(
                            "  m{}: {} T{} L{}",
                            i + 1,
                            s.role,
                            s.term,
                            s.leader_id.map_or("-".to_owned(), |l| l.to_string())
                        )),
                        None => line.push_str(&format!("  m{}: no answer", i + 1)),
                    }
                }
                line.push('\n');
                if file.write_all(line.as_bytes()).is_err() {
                    return;
                }
                tokio::time::sleep(every).await;
            }
        }))
    }

    /// Waits until a leader is elected.
    pub async fn wait_leader(&self, within: Duration) -> anyhow::Result<u64> {
        let start = Instant::now();
        loop {
            if let Some(id) = self.leader().await {
                return Ok(id);
            }
            if start.elapsed() > within {
                bail!("no leader within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The tail of every member's log (for a failed run's report).
    pub fn logs_tail(&self, lines: usize) -> String {
        let mut out = String::new();
        for m in &self.list {
            let text = std::fs::read_to_string(&m.log).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            out.push_str(&format!("--- member {} ({}) ---\n", m.id, m.log.display()));
            for l in &all[all.len().saturating_sub(lines)..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

impl Drop for Members {
    fn drop(&mut self) {
        for m in &mut self.list {
            if let Some(mut child) = m.child.take() {
                if m.paused {
                    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGCONT);
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
