//! The process-pause scenario: a lock holder pauses past its lease, and the resource refuses its
//! late write. Shared by the example (`main.rs`, which narrates it) and by
//! `tests/fencing_pause.rs` (which asserts every step of the [`Report`]).
//!
//! Cast:
//! - a latchkey node: in-process (`latchkey_testkit::Node`: `latchkey_server::run` on a
//!   loopback port, data in a temp dir), or the cluster at `Config::endpoints`;
//! - the resource: the fenced key-value example service of `latchkey-fence`
//!   (`latchkey_testkit::FencedResource`: in-process, on a thread), which demands a fencing
//!   token with every write;
//! - worker A: a separate OS process (this program again, with [`WORKER_ENV`] set; see
//!   [`worker_a`]), so that SIGSTOP freezes all of it, its session renewals included;
//! - worker B: a session in this process.
//!
//! Worker A reports on its stdout, one `@a ...` line per event, and waits on its stdin for the
//! word to send its stale write. The orchestrator gives that word only after A has reported
//! `lost()`: the point is that the client library's report does not help a write that was
//! already on its way (a pause can fall between any check and the write), and the token does.

// This file is compiled into the example and into a test; each uses a different part.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use latchkey_client::{fencing_headers, Client, LockGuard};
use latchkey_fence::HIGHEST_HEADER;
use latchkey_testkit::{wait_until_async, FencedResource, Node};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// Set in worker A's environment: the program runs [`worker_a`] instead of the scenario.
pub const WORKER_ENV: &str = "LATCHKEY_PAUSE_WORKER";
// Worker A's parameters, also passed in its environment.
const ENDPOINTS_ENV: &str = "LATCHKEY_PAUSE_ENDPOINTS";
const RESOURCE_ENV: &str = "LATCHKEY_PAUSE_RESOURCE";
const LOCK_ENV: &str = "LATCHKEY_PAUSE_LOCK";
const KEY_ENV: &str = "LATCHKEY_PAUSE_KEY";
const TTL_MS_ENV: &str = "LATCHKEY_PAUSE_TTL_MS";

/// Marks worker A's report lines; anything else on its stdout (a test harness's chatter) is
/// ignored.
const A_PREFIX: &str = "@a ";

/// Bound on every single step that should take a second or two; generous for a loaded machine.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on one HTTP exchange with the resource.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

pub const A_VALUE: &str = "written by A";
pub const B_VALUE: &str = "written by B";
pub const A_STALE_VALUE: &str = "written by A after its pause";

/// How to run the scenario.
pub struct Config {
    /// A running cluster to use; `None` starts a node in-process.
    pub endpoints: Option<Vec<String>>,
    /// The lease of both workers' sessions.
    pub ttl: Duration,
    /// The lock guarding `key` at the resource.
    pub lock: String,
    pub key: String,
    /// How to start this program again as worker A ([`WORKER_ENV`] and the parameters are
    /// added to its environment).
    pub worker: std::process::Command,
}

/// Everything the scenario observed, in order.
#[derive(Debug, Default)]
pub struct Report {
    /// A's session and fencing token.
    pub a_session: u64,
    pub t1: u64,
    /// The resource's answer to A's write before the pause.
    pub a_first_write: u16,
    /// From SIGSTOP of A to B's grant.
    pub paused_for: Duration,
    /// B's fencing token.
    pub t2: u64,
    /// The resource's answer to B's write.
    pub b_write: u16,
    /// Why A's client library said the lock was lost.
    pub a_lost_reason: String,
    /// Whether A's `guard.is_lost()` was already true when A sent its stale write.
    pub a_lost_before_write: bool,
    /// The resource's answer to A's stale write, and the highest token it named.
    pub a_stale_write: u16,
    pub a_stale_highest: Option<u64>,
    /// A's report lines, in the order A printed them.
    pub a_log: Vec<String>,
    /// Every write the resource saw: (status, token).
    pub resource_log: Vec<(u16, Option<u64>)>,
    /// The value at the end.
    pub final_value: Option<String>,
    /// A's exit status.
    pub a_exit_ok: bool,
}

impl Report {
    /// The property the scenario shows, as one verdict.
    pub fn check(&self) -> anyhow::Result<()> {
        ensure!(
            self.a_first_write == 200,
            "A's first write was not accepted"
        );
        ensure!(self.t2 > self.t1, "token t2 {} <= t1 {}", self.t2, self.t1);
        ensure!(self.b_write == 200, "B's write was not accepted");
        ensure!(
            self.a_lost_before_write,
            "A had not seen lost() when it wrote"
        );
        ensure!(
            self.a_stale_write == 409,
            "A's stale write was not rejected"
        );
        ensure!(
            self.a_stale_highest == Some(self.t2),
            "rejection did not name t2"
        );
        ensure!(
            self.final_value.as_deref() == Some(B_VALUE),
            "the store does not hold B's value"
        );
        Ok(())
    }
}

/// Whether this process was started as worker A.
pub fn is_worker() -> bool {
    std::env::var_os(WORKER_ENV).is_some()
}

/// Runs the scenario, telling each step to `say`.
pub async fn run(config: &Config, say: &(dyn Fn(&str) + Sync)) -> anyhow::Result<Report> {
    let mut report = Report::default();
    say("latchkey pause scenario: a lock holder pauses past its lease, and the resource refuses its late write.");
    say("");

    let (node, endpoints) = match &config.endpoints {
        Some(endpoints) => {
            say(&format!(
                "setup: latchkey cluster at {}",
                endpoints.join(",")
            ));
            (None, endpoints.clone())
        }
        None => {
            let node = Node::start().await?;
            say(&format!(
                "setup: a latchkey node on {} (in this process, data in a temporary directory)",
                node.endpoint()
            ));
            let endpoints = vec![node.endpoint()];
            (Some(node), endpoints)
        }
    };
    let mut resource = FencedResource::start()?;
    say(&format!(
        "setup: the resource, a fenced key-value store on http://{}: every write must carry the \
         headers latchkey-lock and latchkey-token, and a token lower than one already seen is refused",
        resource.addr
    ));
    say(&format!(
        "setup: lock {:?} guards key {:?}; both workers' sessions have a TTL of {:?}",
        config.lock, config.key, config.ttl
    ));
    say("");

    // 1. A takes the lock and writes.
    let mut a = WorkerA::spawn(config, &endpoints, resource.addr)?;
    let (t1, a_session) = match a.next().await? {
        AEvent::Granted { token, session } => (token, session),
        other => bail!("worker A: expected a grant, got {other:?}"),
    };
    report.t1 = t1;
    report.a_session = a_session;
    say(&format!(
        "1. Worker A (a separate process, pid {}) takes the lock in session {a_session}: token t1 = {t1}",
        a.pid
    ));
    match a.next().await? {
        AEvent::Wrote { status, .. } => report.a_first_write = status,
        other => bail!("worker A: expected its first write, got {other:?}"),
    }
    say(&format!("   A writes {A_VALUE:?} with token {t1}"));
    tell(&mut resource, say);
    match a.next().await? {
        AEvent::Ready => {}
        other => bail!("worker A: expected ready, got {other:?}"),
    }

    // 2. B queues.
    let client_b = Client::connect(endpoints.clone()).await?;
    let session_b = client_b.session(config.ttl).await?;
    let session_b_id = session_b.id();
    let lock = config.lock.clone();
    let b_wait = tokio::spawn(async move {
        let guard = session_b.lock(lock).wait(Some(STEP_TIMEOUT)).await;
        (session_b, guard)
    });
    wait_until_async("B to queue for the lock", STEP_TIMEOUT, || async {
        matches!(client_b.describe(&config.lock).await, Ok(info) if info.waiters >= 1)
    })
    .await?;
    say(&format!(
        "2. Worker B (session {session_b_id}) asks for the lock and waits in its queue."
    ));

    // 3. A freezes.
    a.signal(Signal::SIGSTOP)?;
    let paused_at = Instant::now();
    say("3. A freezes (SIGSTOP) with its next write prepared: the whole process stops, and with it \
         the renewals of its session.");

    // 4. The lease runs out; B gets the lock and writes.
    let (session_b, guard_b) = tokio::time::timeout(STEP_TIMEOUT + STEP_TIMEOUT, b_wait)
        .await
        .context("B was not granted the lock")??;
    let guard_b = guard_b.context("B's wait for the lock")?;
    report.paused_for = paused_at.elapsed();
    report.t2 = guard_b.token();
    say(&format!(
        "4. A's lease runs out on the server ({:.1} s after the pause) and B is granted the lock: \
         token t2 = {} (> t1 = {t1})",
        report.paused_for.as_secs_f64(),
        report.t2
    ));
    let reply = put(resource.addr, &config.key, &guard_b, B_VALUE).await?;
    report.b_write = reply.status;
    say(&format!("   B writes {B_VALUE:?} with token {}", report.t2));
    tell(&mut resource, say);

    // 5. A resumes; its client library reports the loss.
    a.signal(Signal::SIGCONT)?;
    say(
        "5. A resumes (SIGCONT). Its client library sees that the lease deadline passed while it \
         was frozen:",
    );
    match a.next().await? {
        AEvent::Lost(why) => {
            say(&format!("   A: guard.lost() completed: {why}"));
            report.a_lost_reason = why;
        }
        other => bail!("worker A: expected lost(), got {other:?}"),
    }

    // 6. A sends the write it prepared before the pause.
    a.go().await?;
    say(&format!(
        "6. But A was frozen after its last check, with the write on its way: it sends it now, \
         with its old token t1 = {t1}"
    ));
    match a.next().await? {
        AEvent::Wrote {
            status,
            highest,
            lost_before_write,
        } => {
            report.a_stale_write = status;
            report.a_stale_highest = highest;
            report.a_lost_before_write = lost_before_write;
        }
        other => bail!("worker A: expected its stale write, got {other:?}"),
    }
    tell(&mut resource, say);
    say(&format!(
        "   A gets {} {} (latchkey-highest: {}): it must stop acting as the holder.",
        report.a_stale_write,
        if report.a_stale_write == 409 {
            "Conflict"
        } else {
            "(not the expected 409 Conflict)"
        },
        report
            .a_stale_highest
            .map_or_else(|| "none".to_owned(), |h| h.to_string())
    ));
    report.a_exit_ok = a.wait().await?;
    report.a_log = a.log.clone();

    // 7. The store kept B's write.
    report.final_value = get(resource.addr, &config.key).await?;
    say(&format!(
        "7. The store holds {:?}: B's write survived A's late one.",
        report.final_value.as_deref().unwrap_or("<nothing>")
    ));
    say("");
    say(
        "The lock alone could not stop A: it was paused after its last check. The fencing token \
         let the resource refuse the late write.",
    );

    guard_b.release().await.context("B's release")?;
    session_b.close().await.context("closing B's session")?;
    report.resource_log = resource
        .stop()?
        .into_iter()
        .map(|a| (a.status, a.token))
        .collect();
    if let Some(node) = node {
        node.stop().await?;
    }
    Ok(report)
}

/// Says what the resource did with the writes since the last call.
fn tell(resource: &mut FencedResource, say: &(dyn Fn(&str) + Sync)) {
    for attempt in resource.new_attempts() {
        say(&format!("     resource: {}", attempt.line));
    }
}

/// What worker A reports.
#[derive(Debug)]
enum AEvent {
    Granted {
        token: u64,
        session: u64,
    },
    Wrote {
        status: u16,
        highest: Option<u64>,
        lost_before_write: bool,
    },
    Ready,
    Lost(String),
}

/// Worker A as seen from the orchestrator.
struct WorkerA {
    child: Child,
    pid: u32,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    log: Vec<String>,
}

impl WorkerA {
    fn spawn(config: &Config, endpoints: &[String], resource: SocketAddr) -> anyhow::Result<Self> {
        let mut command = tokio::process::Command::from(clone_command(&config.worker));
        command
            .env(WORKER_ENV, "a")
            .env(ENDPOINTS_ENV, endpoints.join(","))
            .env(RESOURCE_ENV, resource.to_string())
            .env(LOCK_ENV, &config.lock)
            .env(KEY_ENV, &config.key)
            .env(TTL_MS_ENV, config.ttl.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().context("starting worker A")?;
        let pid = child.id().context("worker A's pid")?;
        let stdin = child.stdin.take().context("worker A's stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("worker A's stdout")?).lines();
        Ok(WorkerA {
            child,
            pid,
            stdin,
            stdout,
            log: Vec::new(),
        })
    }

    /// A's next report line.
    async fn next(&mut self) -> anyhow::Result<AEvent> {
        loop {
            let line = tokio::time::timeout(STEP_TIMEOUT, self.stdout.next_line())
                .await
                .context("worker A said nothing for too long")??
                .context("worker A's output ended (did it fail? see its stderr)")?;
            // Not necessarily at the start: a test harness may have begun the line.
            let Some(at) = line.find(A_PREFIX) else {
                continue;
            };
            let report = &line[at + A_PREFIX.len()..];
            self.log.push(report.to_owned());
            return parse_event(report);
        }
    }

    fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        let pid = i32::try_from(self.pid).context("pid")?;
        kill(Pid::from_raw(pid), signal).with_context(|| format!("{signal} to worker A"))
    }

    /// Tells A to send its prepared write.
    async fn go(&mut self) -> anyhow::Result<()> {
        self.stdin.write_all(b"go\n").await?;
        self.stdin.flush().await?;
        Ok(())
    }

    /// Waits for A to exit; whether it exited successfully.
    async fn wait(&mut self) -> anyhow::Result<bool> {
        let status = tokio::time::timeout(STEP_TIMEOUT, self.child.wait())
            .await
            .context("worker A did not exit")??;
        Ok(status.success())
    }
}

fn parse_event(report: &str) -> anyhow::Result<AEvent> {
    let mut words = report.split(' ');
    let event = match words.next() {
        Some("granted") => AEvent::Granted {
            token: words.next().context("token")?.parse()?,
            session: words.next().context("session")?.parse()?,
        },
        Some("wrote") => AEvent::Wrote {
            status: words.next().context("status")?.parse()?,
            highest: match words.next().context("highest")? {
                "-" => None,
                h => Some(h.parse()?),
            },
            lost_before_write: words.next().context("lost")?.parse()?,
        },
        Some("ready") => AEvent::Ready,
        Some("lost") => AEvent::Lost(report["lost ".len().min(report.len())..].to_owned()),
        _ => bail!("worker A: unexpected report {report:?}"),
    };
    Ok(event)
}

/// `std::process::Command` is not `Clone`; copy what a caller may have set.
fn clone_command(command: &std::process::Command) -> std::process::Command {
    let mut copy = std::process::Command::new(command.get_program());
    copy.args(command.get_args());
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => copy.env(key, value),
            None => copy.env_remove(key),
        };
    }
    if let Some(dir) = command.get_current_dir() {
        copy.current_dir(dir);
    }
    copy
}

/// Worker A's side: run when [`is_worker`]. Takes the lock, writes, says `ready`, and waits for
/// the word (a line on stdin) to send its next write; meanwhile reports `lost()` the moment
/// its client library does.
pub fn worker_a() -> anyhow::Result<()> {
    let var = |name: &str| std::env::var(name).with_context(|| format!("{name} is not set"));
    let endpoints: Vec<String> = var(ENDPOINTS_ENV)?.split(',').map(str::to_owned).collect();
    let resource: SocketAddr = var(RESOURCE_ENV)?.parse()?;
    let (lock, key) = (var(LOCK_ENV)?, var(KEY_ENV)?);
    let ttl = Duration::from_millis(var(TTL_MS_ENV)?.parse()?);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?
        .block_on(async move {
            let client = Client::connect(endpoints).await?;
            let session = client.session(ttl).await?;
            let guard = session.lock(lock).wait(Some(STEP_TIMEOUT)).await?;
            report(&format!("granted {} {}", guard.token(), session.id()));

            let first = put(resource, &key, &guard, A_VALUE).await?;
            report(&format!(
                "wrote {} {} {}",
                first.status,
                first
                    .highest
                    .map_or_else(|| "-".to_owned(), |h| h.to_string()),
                guard.is_lost()
            ));

            // The last check before the pause: still the holder.
            ensure!(!guard.is_lost(), "lost the lock before the pause");
            report("ready");

            let mut go = tokio::task::spawn_blocking(|| {
                let mut line = String::new();
                std::io::stdin().read_line(&mut line).map(|_| line)
            });
            let lost = guard.lost();
            tokio::pin!(lost);
            let mut lost_reported = false;
            loop {
                tokio::select! {
                    _ = &mut lost, if !lost_reported => {
                        lost_reported = true;
                        report(&format!("lost {}", guard.lost_reason().unwrap_or_default()));
                    }
                    line = &mut go => {
                        line??;
                        break;
                    }
                }
            }

            // The write that was on its way when A froze: no new check, as in real life.
            let lost_before_write = guard.is_lost();
            let stale = put(resource, &key, &guard, A_STALE_VALUE).await?;
            report(&format!(
                "wrote {} {} {lost_before_write}",
                stale.status,
                stale
                    .highest
                    .map_or_else(|| "-".to_owned(), |h| h.to_string()),
            ));

            // The session is gone on the server; closing is a courtesy with a short bound.
            drop(guard);
            let _ = tokio::time::timeout(Duration::from_secs(3), session.close()).await;
            Ok(())
        })
}

fn report(line: &str) {
    println!("{A_PREFIX}{line}");
}

/// The resource's answer to a write.
pub struct Reply {
    pub status: u16,
    /// The `latchkey-highest` header of a rejection.
    pub highest: Option<u64>,
    pub body: String,
}

/// `PUT /kv/KEY` with the guard's fencing headers: the client-side half of fencing.
async fn put(
    resource: SocketAddr,
    key: &str,
    guard: &LockGuard,
    value: &str,
) -> anyhow::Result<Reply> {
    http(resource, "PUT", key, &fencing_headers(guard), value).await
}

async fn get(resource: SocketAddr, key: &str) -> anyhow::Result<Option<String>> {
    let reply = http(resource, "GET", key, &[], "").await?;
    match reply.status {
        200 => Ok(Some(reply.body)),
        404 => Ok(None),
        status => bail!("GET /kv/{key}: {status} {}", reply.body),
    }
}

/// One HTTP/1.1 exchange (the service closes the connection after each answer).
async fn http(
    resource: SocketAddr,
    method: &str,
    key: &str,
    headers: &[(&'static str, String)],
    body: &str,
) -> anyhow::Result<Reply> {
    let exchange = async {
        let mut request = format!(
            "{method} /kv/{key} HTTP/1.1\r\nhost: {resource}\r\ncontent-length: {}\r\n",
            body.len()
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        request.push_str(body);
        let mut stream = tokio::net::TcpStream::connect(resource).await?;
        stream.set_nodelay(true)?;
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        anyhow::Ok(String::from_utf8(answer)?)
    };
    let answer = tokio::time::timeout(HTTP_TIMEOUT, exchange)
        .await
        .context("the resource did not answer")??;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .context("malformed HTTP answer")?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no HTTP status")?;
    let highest = head.split("\r\n").skip(1).find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case(HIGHEST_HEADER)
            .then(|| value.trim().parse().ok())
            .flatten()
    });
    Ok(Reply {
        status,
        highest,
        body: body.to_owned(),
    })
}
