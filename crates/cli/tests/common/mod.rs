//! Process test harness: real `latchkey` servers and clients as child processes.
//!
//! - [`serve::ServeProcess`]: one `latchkey serve` child with its log, the one spawner of
//!   servers that [`Server`] and [`cluster::Cluster`] share.
//! - [`Server`]: `latchkey serve` on a free port with its own data directory; kill -9, pause
//!   (SIGSTOP), resume and restart on the same port and directory.
//! - [`Proc`]: any `latchkey` client command in its own process group, so that the whole tree
//!   (the CLI and the COMMAND it runs) can be paused or killed at once.
//! - [`wait_until`] (`latchkey_testkit`'s): polls a condition with a deadline; tests
//!   synchronise on events this way, never on sleeps.
//!
//! - [`cluster::Cluster`]: N members with fault-injecting proxies on their peer links
//!   ([`proxy::Proxy`]).
//! - [`walkthrough`]: a shell walkthrough of the book (`docs/`) run as written, on free ports.
//! - [`rpc`]: in-process observation: a tokio runtime, raw gRPC clients pinned to one member,
//!   every member's own status at once.
//!
//! Every child is killed when its handle drops, also when a test panics (a failing test then
//! prints the server's log).

// Each test binary uses a different part of the harness.
#![allow(dead_code)]

pub mod cluster;
pub mod proxy;
pub mod rpc;
pub mod serve;
pub mod walkthrough;

use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serve::ServeProcess;
use tempfile::TempDir;

/// How long a server gets to start and elect itself.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a short CLI command (`status`, `cluster status`) may take.
pub const CLI_TIMEOUT: Duration = Duration::from_secs(20);
/// The one `wait_until` of latchkey's tests, and its poll interval.
#[allow(unused_imports)] // each test binary uses a different part of the harness
pub use latchkey_testkit::{wait_until, POLL};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_latchkey")
}

/// A port nobody listened on a moment ago, outside the kernel's ephemeral range (see
/// [`latchkey_testkit::ports`]). Another test may still take it before the server binds;
/// [`Server::start`] retries with a new one then.
#[allow(unused_imports)] // each test binary uses a different part of the harness
pub use latchkey_testkit::free_port;

/// `GET path` on `addr` (HTTP/1.1, one connection): the status code and body, or `None` if it
/// did not answer.
#[allow(dead_code)] // each test binary uses a different part of the harness
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::Write as _;
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).ok()?;
    let status = reply.split(' ').nth(1)?.parse().ok()?;
    let body = reply.split_once("\r\n\r\n")?.1.to_owned();
    Some((status, body))
}

/// One HTTP/1.1 answer: its status, headers (names lowercased) and body.
#[derive(Debug)]
pub struct HttpReply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpReply {
    /// The body as JSON; panics (naming the reply) when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("the body is not JSON ({e}): {self:?}"))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `METHOD path` on `addr` with `headers` and a JSON `body`, over one HTTP/1.1 connection
/// closed after the answer, waiting at most `timeout` for it (a long-polling acquire takes up
/// to `ACQUIRE_POLL_MS_MAX`). `Err` says what failed.
pub fn http_call(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
    timeout: Duration,
) -> Result<HttpReply, String> {
    use std::io::Write as _;
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let mut request = format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(body) = body {
        request.push_str(&format!(
            "content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        ));
    } else {
        request.push_str("\r\n");
    }
    s.write_all(request.as_bytes())
        .map_err(|e| format!("send to {addr}: {e}"))?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)
        .map_err(|e| format!("read from {addr}: {e} (so far: {reply:?})"))?;
    let (head, body) = reply
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no end of headers in {reply:?}"))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line in {reply:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    if headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"))
    {
        return Err(format!(
            "a chunked reply, which this client does not decode: {reply:?}"
        ));
    }
    Ok(HttpReply {
        status,
        headers,
        body: body.to_owned(),
    })
}

fn read(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    text
}

/// The last `n` lines of a file, for failure messages.
pub(crate) fn tail(path: &Path, n: usize) -> String {
    let text = read(path);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

pub(crate) fn signal(pid: i32, sig: Signal) {
    let _ = kill(Pid::from_raw(pid), sig);
}

/// A single-member `latchkey serve` process.
pub struct Server {
    pub addr: String,
    dir: TempDir,
    process: ServeProcess,
    /// More `serve` flags, after the address and data dir.
    extra_args: Vec<String>,
}

impl Server {
    /// Starts a server on a free port and waits until it answers as leader.
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// [`Server::start`] with more `serve` flags.
    pub fn start_with(extra_args: &[&str]) -> Server {
        Server::start_with_env(extra_args, &[])
    }

    /// [`Server::start_with`], the server's processes with more environment variables.
    pub fn start_with_env(extra_args: &[&str], envs: &[(&str, &str)]) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut last_error = String::new();
        let mut process = ServeProcess::new(dir.path().join("server.log"));
        process.envs = envs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut server = Server {
            addr: String::new(),
            process,
            dir,
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
        };
        for _ in 0..5 {
            server.addr = format!("127.0.0.1:{}", free_port());
            server.spawn();
            match server.wait_ready() {
                Ok(()) => return server,
                Err(e) => {
                    // Most likely the port was taken meanwhile: try another.
                    last_error = e;
                    server.kill9();
                }
            }
        }
        panic!("server did not start: {last_error}\n{}", server.log_tail());
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn log_tail(&self) -> String {
        self.process.log_tail(60)
    }

    fn spawn(&mut self) {
        let data_dir = self.data_dir();
        let mut args: Vec<&OsStr> = vec![
            "--listen".as_ref(),
            self.addr.as_ref(),
            "--data-dir".as_ref(),
            data_dir.as_os_str(),
        ];
        args.extend(self.extra_args.iter().map(OsStr::new));
        self.process
            .spawn(&format!("the server on {}", self.addr), args);
    }

    /// Waits until the node answers NodeStatus as leader and serves a read.
    pub fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.process.exited() {
                return Err(format!("server exited during start-up: {status}"));
            }
            let out = self.cli(&["cluster", "status", "--json"]);
            if out.status.success() {
                let report: serde_json::Value = serde_json::from_str(&out.stdout)
                    .map_err(|e| format!("{e}: {}", out.stdout))?;
                if !report["leader"].is_null()
                    && self.cli(&["status", "probe/ready"]).status.success()
                {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "not ready within {READY_TIMEOUT:?}: {}",
                    out.stderr
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL, then reap.
    pub fn kill9(&mut self) {
        self.process.kill9();
    }

    /// Starts again on a new port with the same data directory (the node moved), and waits
    /// until it is ready; its new address.
    pub fn restart_elsewhere(&mut self) -> String {
        self.addr = format!("127.0.0.1:{}", free_port());
        self.restart();
        self.addr.clone()
    }

    /// Starts again on the same port and data directory, and waits until it is ready.
    pub fn restart(&mut self) {
        self.spawn();
        if let Err(e) = self.wait_ready() {
            panic!("restart failed: {e}\n{}", self.log_tail());
        }
    }

    pub fn pid(&self) -> i32 {
        self.process.pid()
    }

    /// SIGSTOP: the node stops answering, but its connections stay open.
    pub fn pause(&mut self) {
        self.process.pause();
    }

    /// SIGCONT.
    pub fn resume(&mut self) {
        self.process.resume();
    }

    /// Runs a short `latchkey` client command against this server, bounded by [`CLI_TIMEOUT`].
    pub fn cli(&self, args: &[&str]) -> Output {
        run(&self.with_endpoints(args), self.dir.path(), CLI_TIMEOUT)
    }

    /// `args` with `--endpoints ADDR` added: at the end, or before `--` if there is one
    /// (clap takes a subcommand's options anywhere before `--`).
    fn with_endpoints(&self, args: &[&str]) -> Vec<String> {
        let at = args.iter().position(|a| *a == "--").unwrap_or(args.len());
        let mut full: Vec<String> = args[..at].iter().map(|s| s.to_string()).collect();
        full.push("--endpoints".into());
        full.push(self.addr.clone());
        full.extend(args[at..].iter().map(|s| s.to_string()));
        full
    }

    /// `latchkey status --json NAME`, parsed.
    pub fn status(&self, name: &str) -> serde_json::Value {
        let out = self.cli(&["status", "--json", name]);
        assert!(
            out.status.success(),
            "status {name} failed: {}\n{}",
            out.stderr,
            self.log_tail()
        );
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {:?}", out.stdout))
    }

    /// Starts `latchkey lock [options] NAME -- sh -c SCRIPT` in `dir`.
    pub fn lock(&self, name: &str, options: &[&str], script: &str, dir: &Path) -> Proc {
        let mut args = vec!["lock".to_string(), "--endpoints".into(), self.addr.clone()];
        args.extend(options.iter().map(|s| s.to_string()));
        args.extend([
            name.into(),
            "--".into(),
            "sh".into(),
            "-c".into(),
            script.into(),
        ]);
        Proc::spawn(&args, dir)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- server log ({}) ---\n{}", self.addr, self.log_tail());
        }
        self.process.kill9();
    }
}

/// What a finished short command printed.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `latchkey ARGS` in `dir` to completion, killing it after `timeout`.
pub fn run(args: &[String], dir: &Path, timeout: Duration) -> Output {
    let mut proc = Proc::spawn(args, dir);
    let status = proc.wait(timeout);
    Output {
        status,
        stdout: proc.stdout(),
        stderr: proc.stderr(),
    }
}

static PROC_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A `latchkey` client process, leader of its own process group. Killed (the whole group)
/// on drop.
pub struct Proc {
    child: Child,
    pub args: Vec<String>,
    out: PathBuf,
    err: PathBuf,
    status: Option<ExitStatus>,
}

impl Proc {
    pub fn spawn(args: &[String], dir: &Path) -> Proc {
        Proc::spawn_with(args, dir, |_| {})
    }

    /// [`Proc::spawn`], with `configure` applied last to the command (extra environment for
    /// COMMAND, a piped stdin, ...).
    pub fn spawn_with(args: &[String], dir: &Path, configure: impl FnOnce(&mut Command)) -> Proc {
        let id = PROC_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let out = dir.join(format!(".proc-{}-{id}.out", std::process::id()));
        let err = dir.join(format!(".proc-{}-{id}.err", std::process::id()));
        let mut command = Command::new(bin());
        command
            .args(args)
            .current_dir(dir)
            .env_remove("LATCHKEY_ENDPOINTS")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(File::create(&out).expect("stdout file"))
            .stderr(File::create(&err).expect("stderr file"))
            .process_group(0);
        configure(&mut command);
        let child = command.spawn().expect("spawning latchkey");
        Proc {
            child,
            args: args.to_vec(),
            out,
            err,
            status: None,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The write end of the process's stdin, if it was spawned with a piped one (taken once).
    pub fn take_stdin(&mut self) -> Option<std::process::ChildStdin> {
        self.child.stdin.take()
    }

    /// Sends `sig` to the whole group (the CLI and its COMMAND).
    pub fn signal_group(&self, sig: Signal) {
        let _ = kill(Pid::from_raw(-self.pid()), sig);
    }

    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait");
        }
        self.status
    }

    /// Waits for the exit; panics (printing its stderr) after `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_status() {
                return status;
            }
            if Instant::now() >= deadline {
                self.signal_group(Signal::SIGKILL);
                panic!(
                    "latchkey {:?} still running after {timeout:?}; stderr:\n{}",
                    self.args,
                    self.stderr()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits for the exit and returns its code; panics if it died by a signal.
    pub fn wait_code(&mut self, timeout: Duration) -> i32 {
        let status = self.wait(timeout);
        status.code().unwrap_or_else(|| {
            panic!(
                "latchkey {:?} died by signal {:?}; stderr:\n{}",
                self.args,
                status.signal(),
                self.stderr()
            )
        })
    }

    pub fn stdout(&self) -> String {
        read(&self.out)
    }

    pub fn stderr(&self) -> String {
        read(&self.err)
    }
}

/// The pids of `parent`'s children, from `/proc`.
fn children(parent: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = read(Path::new(&format!("/proc/{pid}/stat")));
            // "pid (comm) state ppid ...": fields after the last ')'.
            let ppid = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
            ppid == Some(parent)
        })
        .collect()
}

impl Drop for Proc {
    fn drop(&mut self) {
        // `latchkey lock` runs COMMAND in a group of its own (led by COMMAND): kill those
        // groups while COMMAND is still known as the CLI's child.
        if self.status.is_none() {
            for child in children(self.pid()) {
                let _ = kill(Pid::from_raw(-child), Signal::SIGKILL);
            }
        }
        // The group outlives its leader when COMMAND is still running: kill it in any case.
        self.signal_group(Signal::SIGKILL);
        if self.status.is_none() {
            let _ = self.child.wait();
        }
    }
}

/// A scratch directory for a test's COMMANDs: the files they write and wait for.
pub struct Work {
    pub dir: TempDir,
}

impl Work {
    pub fn new() -> Work {
        Work {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The lines of a file (none if it does not exist yet).
    pub fn lines(&self, name: &str) -> Vec<String> {
        read(&self.path(name)).lines().map(str::to_owned).collect()
    }

    /// Creates an empty file (the signal a holding COMMAND waits for).
    pub fn touch(&self, name: &str) {
        File::create(self.path(name)).expect("touch");
    }
}

/// Parses a line `TAG TOKEN` written by a COMMAND as `echo TAG $LATCHKEY_TOKEN`.
pub fn token_of(line: &str) -> u64 {
    line.split_whitespace()
        .nth(1)
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no token in {line:?}"))
}

/// A lock name of each Raft group of `groups` (`lock-N`, the first that hashes there by
/// `latchkey_core::group_of`), in group order.
pub fn names_by_group(groups: u32) -> Vec<String> {
    (0..groups)
        .map(|g| {
            (0..)
                .map(|i| format!("lock-{i}"))
                .find(|n| latchkey_core::group_of(n, groups) == g)
                .expect("some name hashes to every group")
        })
        .collect()
}

/// The hex SHA-256 of a bearer token, as an access-control list's `token_sha256` holds it.
pub fn sha256_hex(token: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
