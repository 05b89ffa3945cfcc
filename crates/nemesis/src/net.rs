//! The network: one namespace per host, all on one bridge, and the faults made on it.
//!
//! ```text
//!   root namespace: bridge lkn-br 10.88.0.254 (the fenced resources, the nemesis itself)
//!     |-- veth lkn-m1 -- namespace lkn-m1: eth0 10.88.0.1     (member 1)
//!     |-- veth lkn-m2 -- namespace lkn-m2: eth0 10.88.0.2     (member 2)
//!     |-- veth lkn-c1 -- namespace lkn-c1: eth0 10.88.0.101   (worker 1)
//!     ...
//! ```
//!
//! Faults are made two ways, both real kernel paths (the kernel here has no `netem` and no
//! packet filter):
//! - a **blackhole route** in one host's namespace for another host's address: that host's
//!   packets to the other are dropped as they leave, the other direction still flows. One
//!   route is an asymmetric cut; a pair is a symmetric one. A TCP connection already open
//!   across it retransmits into the void, as across a failed switch; a new one from that host
//!   fails at once (`EINVAL`), so new connections see a refusal rather than silence.
//! - a **link set down** on the bridge side of a host's veth: the host is cut from everyone,
//!   clients and the nemesis included.
//!
//! Every name starts with `lkn-`; [`Net::create`] first removes what a killed run left, and
//! dropping the [`Net`] removes everything. One run at a time per machine: the names are
//! fixed, so [`Net::create`] holds an exclusive `flock` on [`LOCK_FILE`] for the run.

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};

const BRIDGE: &str = "lkn-br";
const PREFIX: &str = "lkn-";
/// The address of the root namespace on the bridge: the fenced resource listens there.
pub const ROOT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 254);
/// Held exclusively for a run's lifetime (the namespace names are fixed).
pub const LOCK_FILE: &str = "/run/latchkey-nemesis.lock";

/// One host: a network namespace with one address on the bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// The namespace's name, also the bridge-side veth's name: `lkn-m1`, `lkn-c2`.
    pub name: String,
    pub addr: Ipv4Addr,
}

/// Debian's libfaketime (package `libfaketime`): preloaded into every member and worker, it
/// offsets their wall clock by what their clock file says ([`Net::step_clock`]).
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The namespaces, veths and bridge of one run, and each host's clock. Removed on drop.
pub struct Net {
    pub members: Vec<Host>,
    pub clients: Vec<Host>,
    /// Where the hosts' clock files are, when libfaketime is installed.
    clocks: Option<PathBuf>,
    _lock: nix::fcntl::Flock<File>,
}

/// Runs `ip ARGS`, failing with its stderr.
fn ip(args: &[&str]) -> anyhow::Result<()> {
    ip_output(args).map(drop)
}

/// Runs `ip ARGS` and returns what it printed, failing with its stderr.
fn ip_output(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running `ip` (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Removes every `lkn-` namespace, veth and the bridge (also what an earlier, killed run left).
///
/// A namespace whose name is deleted lives on while the kernel still holds it (sockets of
/// killed processes being torn down), and its veth's peer stays on the bridge until then; so
/// the bridge side of each veth is deleted first (which deletes both ends). Each step is tried
/// even if one before it failed; the first error is returned.
fn remove_stale() -> anyhow::Result<()> {
    let mut first: anyhow::Result<()> = Ok(());
    let mut keep = |r: anyhow::Result<()>| {
        if first.is_ok() {
            first = r;
        }
    };
    for line in ip_output(&["-o", "link", "show"])?.lines() {
        let name = line
            .split(':')
            .nth(1)
            .map(|n| n.trim().split('@').next().unwrap_or(""))
            .unwrap_or("");
        if name.starts_with(PREFIX) && name != BRIDGE {
            keep(ip(&["link", "delete", name]));
        }
    }
    for line in ip_output(&["netns", "list"])?.lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        if name.starts_with(PREFIX) {
            // What a killed run left running inside (its processes die with their parent,
            // `Net::command`, unless something kept them).
            for pid in ip_output(&["netns", "pids", name])
                .unwrap_or_default()
                .lines()
            {
                if let Ok(pid) = pid.trim().parse::<i32>() {
                    let pid = nix::unistd::Pid::from_raw(pid);
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                }
            }
            keep(ip(&["netns", "delete", name]));
        }
    }
    if ip(&["link", "show", BRIDGE]).is_ok() {
        keep(ip(&["link", "delete", BRIDGE]));
    }
    first
}

impl Net {
    /// Creates `members` member hosts and `clients` client hosts on a fresh bridge, their
    /// clock files (if libfaketime is installed) in `dir`.
    pub fn create(members: u32, clients: u32, dir: &Path) -> anyhow::Result<Net> {
        if !nix::unistd::geteuid().is_root() {
            bail!("the nemesis needs root: it creates network namespaces (run it as root)");
        }
        let file = File::create(LOCK_FILE).with_context(|| format!("creating {LOCK_FILE}"))?;
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .with_context(|| format!("locking {LOCK_FILE}"))?;
        remove_stale()?;
        let net = Net {
            members: (1..=members)
                .map(|i| Host {
                    name: format!("{PREFIX}m{i}"),
                    addr: Ipv4Addr::new(10, 88, 0, i as u8),
                })
                .collect(),
            clients: (1..=clients)
                .map(|i| Host {
                    name: format!("{PREFIX}c{i}"),
                    addr: Ipv4Addr::new(10, 88, 0, 100 + i as u8),
                })
                .collect(),
            clocks: Path::new(LIBFAKETIME).exists().then(|| dir.to_owned()),
            _lock: lock,
        };
        for host in net.members.iter().chain(&net.clients) {
            net.step_clock(host, 0)?;
        }
        ip(&["link", "add", BRIDGE, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{ROOT_ADDR}/24"), "dev", BRIDGE])?;
        ip(&["link", "set", BRIDGE, "up"])?;
        for host in net.members.iter().chain(&net.clients) {
            let n = host.name.as_str();
            ip(&["netns", "add", n])?;
            ip(&[
                "link", "add", n, "type", "veth", "peer", "name", "eth0", "netns", n,
            ])?;
            ip(&["link", "set", n, "master", BRIDGE])?;
            ip(&["link", "set", n, "up"])?;
            ip(&[
                "-n",
                n,
                "addr",
                "add",
                &format!("{}/24", host.addr),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", n, "link", "set", "eth0", "up"])?;
            ip(&["-n", n, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// `program ARGS` to run inside `host`'s namespace. It is killed when the thread that
    /// started it ends (`PR_SET_PDEATHSIG`, kept across `ip`'s exec), so a nemesis killed
    /// mid-run leaves no member or worker behind; a run starts every process from its one
    /// thread.
    pub fn command(&self, host: &Host, program: &std::path::Path) -> Command {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &host.name]).arg(program);
        // The wall clock (CLOCK_REALTIME) only: monotonic and boot clocks, which timers,
        // leases and the histories use, are left alone, as a real clock step leaves them.
        // The file is read again at most a second after it changes.
        if let Some(dir) = &self.clocks {
            c.env("LD_PRELOAD", LIBFAKETIME)
                .env("FAKETIME_TIMESTAMP_FILE", clock_file(dir, host))
                .env("FAKETIME_CACHE_DURATION", "1")
                .env("DONT_FAKE_MONOTONIC", "1");
        }
        // SAFETY: the closure runs in the child between fork and exec and makes one
        // async-signal-safe system call (prctl).
        unsafe {
            c.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        c
    }

    /// `from` can no longer send to `to` (packets dropped silently as they leave `from`).
    pub fn cut(&self, from: &Host, to: &Host) -> anyhow::Result<()> {
        ip(&[
            "-n",
            &from.name,
            "route",
            "add",
            "blackhole",
            &format!("{}/32", to.addr),
        ])
    }

    /// `a` and `b` can no longer reach each other.
    pub fn cut_both(&self, a: &Host, b: &Host) -> anyhow::Result<()> {
        self.cut(a, b)?;
        self.cut(b, a)
    }

    /// `host`'s link to the bridge goes down: nobody reaches it, it reaches nobody.
    pub fn link_down(&self, host: &Host) -> anyhow::Result<()> {
        ip(&["link", "set", &host.name, "down"])
    }

    /// Whether clock faults can be made (libfaketime is installed).
    pub fn has_clocks(&self) -> bool {
        self.clocks.is_some()
    }

    /// `host`'s wall clock runs `secs` ahead of the machine's (behind if negative), seen by
    /// its processes within a second. A step, as an NTP correction or an operator's `date -s`
    /// makes one.
    pub fn step_clock(&self, host: &Host, secs: i64) -> anyhow::Result<()> {
        let Some(dir) = &self.clocks else {
            return Ok(());
        };
        write_clock(&clock_file(dir, host), secs)
    }

    /// The clock files of `hosts`, for a task that steps them on its own ([`write_clock`]);
    /// empty without libfaketime.
    pub fn clock_files(&self, hosts: &[Host]) -> Vec<PathBuf> {
        match &self.clocks {
            Some(dir) => hosts.iter().map(|h| clock_file(dir, h)).collect(),
            None => Vec::new(),
        }
    }

    /// Every cut removed, every link up, every clock back to the machine's.
    pub fn heal(&self) -> anyhow::Result<()> {
        for host in self.members.iter().chain(&self.clients) {
            ip(&["-n", &host.name, "route", "flush", "type", "blackhole"])?;
            ip(&["link", "set", &host.name, "up"])?;
            self.step_clock(host, 0)?;
        }
        Ok(())
    }
}

/// Sets the clock in `file` to `secs` ahead of the machine's (behind if negative), replaced
/// atomically so that libfaketime never reads half a line.
pub fn write_clock(file: &Path, secs: i64) -> anyhow::Result<()> {
    let tmp = file.with_extension("new");
    std::fs::write(&tmp, format!("{secs:+}\n"))?;
    std::fs::rename(&tmp, file)?;
    Ok(())
}

fn clock_file(dir: &Path, host: &Host) -> PathBuf {
    dir.join(format!("clock-{}", host.name))
}

impl Drop for Net {
    fn drop(&mut self) {
        if let Err(e) = remove_stale() {
            eprintln!("nemesis: removing the namespaces failed: {e:#}");
        }
    }
}
