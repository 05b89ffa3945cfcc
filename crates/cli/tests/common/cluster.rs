//! A cluster of real `latchkey serve` processes on loopback, with a fault-injecting proxy on
//! every directed peer link.
//!
//! - [`Cluster::start`]: N members on free ports, each with its own data dir; member i dials
//!   member j through proxy `P(i→j)` (`--peer-dial`), clients dial members directly.
//! - Faults: [`Cluster::kill9`], [`Cluster::sigterm`], [`Cluster::pause`] (SIGSTOP),
//!   [`Cluster::resume`], [`Cluster::restart`]; [`Cluster::cut`] one link,
//!   [`Cluster::isolate`] a member (all its links both ways), [`Cluster::heal`].
//! - Membership: [`Cluster::spawn_joining`] starts a new member with `--join` (no proxies on
//!   its links), for `latchkey cluster add`; the founders keep their founding `--peers`.
//! - Observation: [`Cluster::node_status`] (one member's own view), [`Cluster::wait_leader`]
//!   (polls with a deadline, never sleeps blindly).
//!
//! Each member is a [`ServeProcess`], the spawner [`super::Server`] uses too. Every process is
//! killed when the cluster drops; a failing test prints each member's log.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

use super::proxy::{Mode, Proxy};
use super::serve::ServeProcess;
use super::{free_port, run, tail, Output, CLI_TIMEOUT, READY_TIMEOUT};

/// How long a member gets to stop cleanly after SIGTERM.
const SIGTERM_TIMEOUT: Duration = Duration::from_secs(10);

/// Timing of the members. The defaults are the server's.
#[derive(Debug, Clone)]
pub struct Timing {
    pub heartbeat_ms: u64,
    pub election_timeout_ms: (u64, u64),
}

impl Default for Timing {
    fn default() -> Timing {
        Timing {
            heartbeat_ms: latchkey_core::limits::HEARTBEAT_MS_DEFAULT,
            election_timeout_ms: (
                latchkey_core::limits::ELECTION_TIMEOUT_MS_MIN_DEFAULT,
                latchkey_core::limits::ELECTION_TIMEOUT_MS_MAX_DEFAULT,
            ),
        }
    }
}

/// How members reach each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Links {
    /// Through a fault-injecting proxy per directed link (`--peer-dial`).
    Proxied,
    /// At the addresses the membership gives, on the client port.
    Direct,
    /// At the addresses the membership gives, on each member's `--peer-listen` port.
    PeerListen,
}

pub struct Member {
    pub id: u64,
    pub addr: String,
    /// `--peer-listen`, when the member serves its peers on a port of its own.
    pub peer_addr: Option<String>,
    process: ServeProcess,
    /// `Some(cluster id)`: started with `--join`, not as a founder.
    join: Option<String>,
    /// Where it serves the HTTP API (`--http-listen`), if the cluster was started with it.
    pub http_addr: Option<String>,
    /// Where it serves `/metrics` (`--metrics-listen`), if the cluster was started with it.
    pub metrics_addr: Option<String>,
}

pub struct Cluster {
    pub members: Vec<Member>,
    /// `(from, to)` -> the proxy `from` dials `to` through.
    proxies: BTreeMap<(u64, u64), Proxy>,
    timing: Timing,
    /// More `serve` flags every member gets (`{id}` in one stands for the member's id).
    extra_args: Vec<String>,
    /// `--peers` of the founders (the cluster's id is derived from it).
    founding: String,
    dir: TempDir,
}

impl Cluster {
    /// Starts `n` members and waits until they agree on a leader that serves reads.
    pub fn start(n: u64) -> Cluster {
        Cluster::start_with(n, Timing::default())
    }

    pub fn start_with(n: u64, timing: Timing) -> Cluster {
        Cluster::start_inner(n, timing, Links::Proxied, &[], |_, _| {})
    }

    /// [`Cluster::start`], every member also serving the HTTP API on a port of its own
    /// ([`Member::http_addr`]).
    pub fn start_with_http(n: u64) -> Cluster {
        Cluster::start_inner(
            n,
            Timing::default(),
            Links::Proxied,
            &["--http-listen"],
            |_, _| {},
        )
    }

    /// [`Cluster::start_with`], every member with more `serve` flags.
    pub fn start_configured(n: u64, timing: Timing, extra_args: &[&str]) -> Cluster {
        Cluster::start_inner(n, timing, Links::Proxied, extra_args, |_, _| {})
    }

    /// Starts `n` members that each serve their peers on a port of their own (`--peer-listen`,
    /// `--peers ID=CLIENT/PEER,...`), dialing each other directly (no proxies).
    pub fn start_with_peer_listen(n: u64, extra_args: &[&str]) -> Cluster {
        Cluster::start_inner(
            n,
            Timing::default(),
            Links::PeerListen,
            extra_args,
            |_, _| {},
        )
    }

    /// Starts `n` members whose peers dial each other directly, at the addresses the Raft
    /// membership gives (no proxies, no `--peer-dial`): for tests that move members.
    pub fn start_without_proxies(n: u64) -> Cluster {
        Cluster::start_inner(n, Timing::default(), Links::Direct, &[], |_, _| {})
    }

    /// Starts `n` members like [`Cluster::start_with`], but first calls `seed(cluster, id)`
    /// for each member, before its data dir exists (e.g. to restore it from a backup with
    /// this cluster's `--peers`). It runs again for every member if the cluster is started
    /// over on new ports.
    pub fn start_seeded(n: u64, timing: Timing, seed: impl FnMut(&Cluster, u64)) -> Cluster {
        Cluster::start_inner(n, timing, Links::Proxied, &[], seed)
    }

    /// [`Cluster::start_seeded`], every member with more `serve` flags.
    pub fn start_seeded_configured(
        n: u64,
        timing: Timing,
        extra_args: &[&str],
        seed: impl FnMut(&Cluster, u64),
    ) -> Cluster {
        Cluster::start_inner(n, timing, Links::Proxied, extra_args, seed)
    }

    fn start_inner(
        n: u64,
        timing: Timing,
        links: Links,
        extra_args: &[&str],
        mut seed: impl FnMut(&Cluster, u64),
    ) -> Cluster {
        let mut last = String::new();
        // A free port can be taken by someone else before the member binds it: then start
        // over on new ports (the member list is fixed at first start).
        for _ in 0..3 {
            let mut cluster = Cluster::prepare(n, timing.clone(), links, extra_args);
            for id in cluster.ids() {
                seed(&cluster, id);
            }
            for id in cluster.ids() {
                cluster.spawn(id);
            }
            match cluster.wait_healthy(READY_TIMEOUT) {
                Ok(()) => return cluster,
                Err(e) => {
                    last = format!("{e}\n{}", cluster.logs());
                }
            }
        }
        panic!("cluster did not start: {last}");
    }

    /// Members on free ports and their proxies; nothing spawned yet.
    fn prepare(n: u64, timing: Timing, links: Links, extra_args: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let proxied = links == Links::Proxied;
        let members: Vec<Member> = (1..=n)
            .map(|id| Member {
                id,
                addr: format!("127.0.0.1:{}", free_port()),
                peer_addr: (links == Links::PeerListen)
                    .then(|| format!("127.0.0.1:{}", free_port())),
                process: ServeProcess::new(dir.path().join(format!("node-{id}.log"))),
                join: None,
                http_addr: extra_args
                    .contains(&"--http-listen")
                    .then(|| format!("127.0.0.1:{}", free_port())),
                metrics_addr: extra_args
                    .contains(&"--metrics-listen")
                    .then(|| format!("127.0.0.1:{}", free_port())),
            })
            .collect();
        let mut proxies = BTreeMap::new();
        for from in &members {
            for to in &members {
                if proxied && from.id != to.id {
                    proxies.insert((from.id, to.id), Proxy::start(&to.addr));
                }
            }
        }
        let founding = members
            .iter()
            .map(|m| match &m.peer_addr {
                Some(peer) => format!("{}={}/{peer}", m.id, m.addr),
                None => format!("{}={}", m.id, m.addr),
            })
            .collect::<Vec<_>>()
            .join(",");
        Cluster {
            members,
            proxies,
            timing,
            // `--http-listen` (`--metrics-listen`) alone stands for each member's own
            // `--http-listen ADDR` (`--metrics-listen ADDR`).
            extra_args: extra_args
                .iter()
                .filter(|a| **a != "--http-listen" && **a != "--metrics-listen")
                .map(|a| a.to_string())
                .collect(),
            founding,
            dir,
        }
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

    pub fn addr(&self, id: u64) -> String {
        self.member(id).addr.clone()
    }

    /// Every member's client address, comma-separated (for `--endpoints`).
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| m.addr.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `--peers` of this cluster's founders.
    pub fn peers_flag(&self) -> String {
        self.founding.clone()
    }

    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("data-{id}"))
    }

    fn log_path(&self, id: u64) -> PathBuf {
        self.member(id).process.log_path().clone()
    }

    /// A scratch directory for CLI processes.
    pub fn work_dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// The lines of member `id`'s log (all its starts) that contain `pattern`.
    pub fn log_lines(&self, id: u64, pattern: &str) -> Vec<String> {
        std::fs::read_to_string(self.log_path(id))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(pattern))
            .map(str::to_owned)
            .collect()
    }

    /// Every member's log tail, for failure messages.
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                format!(
                    "--- node {} ({}) ---\n{}",
                    m.id,
                    m.addr,
                    tail(&self.log_path(m.id), 40)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn spawn(&mut self, id: u64) {
        let dial = self
            .ids()
            .into_iter()
            .filter(|&j| j != id && self.proxies.contains_key(&(id, j)))
            .map(|j| format!("{j}={}", self.proxies[&(id, j)].addr))
            .collect::<Vec<_>>()
            .join(",");
        let (min, max) = self.timing.election_timeout_ms;
        let mut args: Vec<OsString> = vec![
            "--id".into(),
            id.to_string().into(),
            "--listen".into(),
            self.addr(id).into(),
            "--data-dir".into(),
            self.data_dir(id).into_os_string(),
            "--heartbeat-ms".into(),
            self.timing.heartbeat_ms.to_string().into(),
            "--election-timeout-ms".into(),
            format!("{min}..{max}").into(),
        ];
        match &self.member(id).join {
            Some(cluster) => args.extend(["--join".into(), cluster.into()]),
            None => args.extend(["--peers".into(), self.peers_flag().into()]),
        }
        if !dial.is_empty() {
            args.extend(["--peer-dial".into(), dial.into()]);
        }
        if let Some(peer) = &self.member(id).peer_addr {
            args.extend(["--peer-listen".into(), peer.into()]);
        }
        // `{id}` in a flag stands for the member's id: a file of each member's own (a test
        // that gives members different access-control lists, say).
        args.extend(
            self.extra_args
                .iter()
                .map(|a| OsString::from(a.replace("{id}", &id.to_string()))),
        );
        if let Some(http) = &self.member(id).http_addr {
            args.extend(["--http-listen".into(), http.into()]);
        }
        if let Some(metrics) = &self.member(id).metrics_addr {
            args.extend(["--metrics-listen".into(), metrics.into()]);
        }
        let member = self.member_mut(id);
        let who = format!("node {id} on {}", member.addr);
        member.process.spawn(&who, args);
    }

    /// The cluster's id, as `cluster status` reports it.
    pub fn cluster_id(&self) -> String {
        let status = self.cluster_status().expect("cluster status");
        status["cluster_id"]
            .as_str()
            .unwrap_or_else(|| panic!("no cluster id in {status}"))
            .to_owned()
    }

    /// Starts member `id` with `--join` and an empty data dir on a fresh port (the next id), or
    /// on its old address (an id that was a member: its data dir must be gone). It waits to be
    /// added with `latchkey cluster add`; its links have no proxies. Its address.
    pub fn spawn_joining(&mut self, id: u64) -> String {
        let cluster = self.cluster_id();
        let next = self.members.len() as u64 + 1;
        if id == next {
            self.members.push(Member {
                id,
                addr: format!("127.0.0.1:{}", free_port()),
                peer_addr: None,
                process: ServeProcess::new(self.dir.path().join(format!("node-{id}.log"))),
                join: Some(cluster),
                http_addr: None,
                metrics_addr: None,
            });
        } else {
            assert!(id < next, "member ids are added in order");
            assert!(
                !self.data_dir(id).exists(),
                "member {id}'s data dir is still there"
            );
            self.member_mut(id).join = Some(cluster);
        }
        self.spawn(id);
        self.addr(id)
    }

    /// Starts stopped member `id` again on another port with its data dir (it moved); its
    /// address. For a cluster without proxies (a proxy would go on to the old address).
    pub fn respawn_elsewhere(&mut self, id: u64) -> String {
        assert!(
            self.proxies.is_empty(),
            "a moved member's proxies would dial its old address"
        );
        let addr = format!("127.0.0.1:{}", free_port());
        self.member_mut(id).addr = addr.clone();
        self.spawn(id);
        addr
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.member(id).process.is_running()
    }

    /// SIGKILL, then reap.
    pub fn kill9(&mut self, id: u64) {
        self.member_mut(id).process.kill9();
    }

    /// SIGTERM, then wait (bounded) for the clean exit; SIGKILL if it does not come.
    pub fn sigterm(&mut self, id: u64) {
        if let Err(e) = self.member_mut(id).process.sigterm(SIGTERM_TIMEOUT) {
            panic!("node {id} {e}");
        }
    }

    /// SIGSTOP: the member stops, its connections stay open.
    pub fn pause(&self, id: u64) {
        self.member(id).process.pause();
    }

    /// SIGCONT.
    pub fn resume(&self, id: u64) {
        self.member(id).process.resume();
    }

    /// Starts a stopped member again on its address and data dir (does not wait).
    pub fn restart(&mut self, id: u64) {
        self.spawn(id);
    }

    /// Deletes a stopped member's data dir: it restarts as a new, empty member.
    pub fn wipe(&mut self, id: u64) {
        assert!(!self.is_running(id), "wiping a running member");
        let dir = self.data_dir(id);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).expect("removing the data dir");
        }
    }

    /// Sets the proxy of the link `from → to`.
    pub fn cut(&self, from: u64, to: u64, mode: Mode) {
        self.proxies[&(from, to)].set(mode);
    }

    /// Sets every link from and to `id`.
    pub fn isolate(&self, id: u64, mode: Mode) {
        for ((from, to), proxy) in &self.proxies {
            if *from == id || *to == id {
                proxy.set(mode);
            }
        }
    }

    /// Every link passes again.
    pub fn heal(&self) {
        for proxy in self.proxies.values() {
            proxy.set(Mode::Pass);
        }
    }

    /// Runs `latchkey ARGS` (a client command; add `--endpoints`) to completion.
    pub fn cli(&self, args: &[&str]) -> Output {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        run(&args, self.dir.path(), CLI_TIMEOUT)
    }

    /// `latchkey cluster status --json` against all members, parsed (`None` if it failed).
    pub fn cluster_status(&self) -> Option<Value> {
        let out = self.cli(&[
            "cluster",
            "status",
            "--json",
            "--endpoints",
            &self.endpoints(),
        ]);
        if !out.status.success() {
            return None;
        }
        serde_json::from_str(&out.stdout).ok()
    }

    /// What member `id` says about itself (role, term, indexes), `None` if it does not answer.
    pub fn node_status(&self, id: u64) -> Option<Value> {
        let out = self.cli(&["cluster", "status", "--json", "--endpoints", &self.addr(id)]);
        let report: Value = serde_json::from_str(&out.stdout).ok()?;
        report["members"]
            .as_array()?
            .iter()
            .find(|m| m["addr"] == self.addr(id).as_str() && m["role"] != "unreachable")
            .cloned()
    }

    /// The member that says it leads at the highest term, among those running and not in
    /// `except`, with that term.
    pub fn leader(&self, except: &[u64]) -> Option<(u64, u64)> {
        let status = self.cluster_status()?;
        status["members"]
            .as_array()?
            .iter()
            .filter(|m| m["role"] == "leader")
            .filter_map(|m| Some((m["id"].as_u64()?, m["term"].as_u64()?)))
            .filter(|(id, _)| !except.contains(id) && self.is_running(*id))
            .max_by_key(|(_, term)| *term)
    }

    /// Polls until a member outside `except` leads and serves a read; its id and term.
    pub fn wait_leader(&self, except: &[u64], timeout: Duration) -> (u64, u64) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((id, term)) = self.leader(except) {
                let read = self.cli(&["status", "probe/ready", "--endpoints", &self.addr(id)]);
                if read.status.success() {
                    return (id, term);
                }
            }
            if Instant::now() > deadline {
                panic!(
                    "no leader outside {except:?} within {timeout:?}\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every running member answers, one of them leads, all agree on the term,
    /// and the leader serves a read.
    pub fn wait_healthy(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            for m in &mut self.members {
                if let Some(status) = m.process.exited() {
                    return Err(format!("node {} exited: {status}", m.id));
                }
            }
            if let Some(report) = self.cluster_status() {
                let members = report["members"].as_array().cloned().unwrap_or_default();
                let running: Vec<&Value> = members
                    .iter()
                    .filter(|m| m["id"].as_u64().is_some_and(|id| self.is_running(id)))
                    .collect();
                let all_answer = running.iter().all(|m| m["role"] != "unreachable");
                // With replica subsets (`--replicas`) a member outside group 0 reports itself
                // `outside` it, and health is every group led.
                let subsets = self.extra_args.iter().any(|a| a == "--replicas");
                let terms: std::collections::BTreeSet<u64> = running
                    .iter()
                    .filter(|m| m["role"] != "outside")
                    .filter_map(|m| m["term"].as_u64())
                    .collect();
                let every_group_led = report["groups"]
                    .as_array()
                    .is_some_and(|gs| gs.iter().all(|g| g["leader"].is_u64()));
                if let Some(leader) = report["leader"].as_u64() {
                    if all_answer && terms.len() == 1 && (!subsets || every_group_led) {
                        let read =
                            self.cli(&["status", "probe/ready", "--endpoints", &self.addr(leader)]);
                        if read.status.success() {
                            return Ok(());
                        }
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(format!("not healthy within {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
            // Keep the whole logs of a failed test for a closer look.
            let keep = std::env::temp_dir().join(format!(
                "latchkey-failed-{}-{}",
                std::process::id(),
                self.members[0].addr.replace([':', '.'], "-")
            ));
            if std::fs::create_dir_all(&keep).is_ok() {
                for m in &self.members {
                    let _ =
                        std::fs::copy(self.log_path(m.id), keep.join(format!("node-{}.log", m.id)));
                }
                eprintln!("full logs kept in {}", keep.display());
            }
        }
        for m in &mut self.members {
            m.process.kill9();
        }
    }
}
