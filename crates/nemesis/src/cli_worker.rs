//! A client worker that is the real CLI: `latchkey lock NAME -- COMMAND`, run again and again,
//! its COMMAND the critical section ([`hold`]), every step written to the worker's history
//! with the worker's own boot-clock times, as [`crate::worker`] writes the Rust client's.
//!
//! Each `latchkey lock` is a session of its own, so each is one generation (a thread, to the
//! checkers). The CLI does not tell COMMAND its session id: the history names each invocation's
//! session [`cli_session`], a number no server gives (ids are counted from 1), unique per
//! worker and generation; the checks only compare sessions for equality.
//!
//! What is recorded, and by whom (both append to one file, one `write` per line; the loop
//! waits for `latchkey lock` to end before it writes again):
//! - the loop: the acquire's invoke before it starts `latchkey lock`; after it ends, by its exit
//!   status: 0 the release answered (unless the CLI warned that the release failed: then the
//!   release is left unanswered, its outcome unknown), 3 the wait timed out (not granted), 4
//!   the lock may have been lost (lost); anything else leaves what was in flight unanswered.
//! - COMMAND ([`hold`]), started by the CLI once granted: the grant with `LATCHKEY_TOKEN`, as
//!   learned at its start; a hold check; `BEGIN` at the fenced resource; the hold; a hold check;
//!   `COMMIT`; the PostgreSQL row through the book's recipe (with `--postgres`); then the
//!   release's invoke, as it exits (the CLI releases when COMMAND ends). Its hold checks ask
//!   nothing: the CLI's promise is that COMMAND is stopped (SIGTERM, then SIGKILL within half
//!   the safety margin) before the lock can be lost, and a hold check recorded by a COMMAND
//!   that outlives its lock is what `hold_overlap` must then catch.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

use anyhow::{bail, Context};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::record::{now, WorkerEvent, WorkerRet};
use crate::resource::Conn;

/// A bug planted in `latchkey lock` itself (a debug build reads it from
/// `LATCHKEY_TEST_PLANT`, `crates/cli/src/lock.rs`), which the checks must catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CliPlant {
    /// `latchkey lock` leaves COMMAND running when its lock may be lost, and reports the
    /// loss only when COMMAND ends.
    IgnoreDeadline,
}

impl CliPlant {
    /// Its name in `LATCHKEY_TEST_PLANT`.
    pub fn env_value(self) -> &'static str {
        match self {
            CliPlant::IgnoreDeadline => "cli-ignores-deadline",
        }
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct CliWorkerArgs {
    /// This worker's number (its actor in the history).
    #[arg(long)]
    pub client: u32,
    /// The `latchkey` binary whose `lock` command this worker runs.
    #[arg(long)]
    pub latchkey: PathBuf,
    /// The cluster, HOST:PORT,...
    #[arg(long, value_delimiter = ',', required = true)]
    pub endpoints: Vec<String>,
    /// The fenced resource.
    #[arg(long)]
    pub resource: SocketAddr,
    /// The lock names, NAME,...
    #[arg(long, value_delimiter = ',', required = true)]
    pub locks: Vec<String>,
    /// Where to write the history (JSON lines).
    #[arg(long)]
    pub history: PathBuf,
    #[arg(long)]
    pub seed: u64,
    /// The session's lease, in milliseconds (`latchkey lock --ttl`).
    #[arg(long)]
    pub ttl_ms: u64,
    /// How long the critical section lasts between its read and its write, in milliseconds.
    #[arg(long)]
    pub hold_ms: u64,
    /// How long an acquire waits, in milliseconds (`latchkey lock --wait`).
    #[arg(long)]
    pub wait_ms: u64,
    /// The PostgreSQL resource, HOST:PORT.
    #[arg(long)]
    pub postgres: Option<String>,
}

/// COMMAND of one `latchkey lock`: the critical section.
#[derive(Debug, Clone, clap::Args)]
pub struct HoldArgs {
    #[arg(long)]
    pub client: u32,
    #[arg(long)]
    pub history: PathBuf,
    /// The acquire's operation id (the release is the next).
    #[arg(long)]
    pub id: u64,
    #[arg(long)]
    pub generation: u32,
    #[arg(long)]
    pub resource: SocketAddr,
    #[arg(long)]
    pub hold_ms: u64,
    #[arg(long)]
    pub postgres: Option<String>,
}

/// The session a history names for generation `generation` of CLI worker `client`: above any
/// id a server gives in a run (they are counted from 1), and unique per worker and generation.
pub fn cli_session(client: u32, generation: u32) -> u64 {
    (1 << 62) | (u64::from(client) << 32) | u64::from(generation)
}

/// Appends events to a history that another process appends to as well.
struct Appender {
    file: File,
    events: usize,
}

impl Appender {
    fn open(path: &Path) -> anyhow::Result<Appender> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(Appender { file, events: 0 })
    }

    fn write(&mut self, ev: WorkerEvent) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.events < crate::limits::WORKER_EVENTS_MAX,
            "the history reached its bound of {} events",
            crate::limits::WORKER_EVENTS_MAX
        );
        self.events += 1;
        let mut line = serde_json::to_string(&ev)?;
        line.push('\n');
        // One write per event (O_APPEND): lines of the two writers never interleave.
        self.file.write_all(line.as_bytes())?;
        Ok(())
    }
}

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

static STOP: AtomicBool = AtomicBool::new(false);
/// The `latchkey lock` running now (0: none).
static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_term(_: nix::libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
    let child = CHILD.load(Ordering::SeqCst);
    if child > 0 {
        // kill(2) is async-signal-safe. `latchkey lock` ends at once if COMMAND has not
        // started (exit 143), or forwards it to COMMAND and releases when COMMAND ends.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
}

/// Runs `latchkey lock` again and again until SIGTERM, which it forwards to the `latchkey
/// lock` under way.
pub fn main(args: CliWorkerArgs) -> anyhow::Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    unsafe {
        sigaction(
            Signal::SIGTERM,
            &SigAction::new(
                SigHandler::Handler(on_term),
                SaFlags::empty(),
                SigSet::empty(),
            ),
        )?;
    }
    File::create(&args.history).with_context(|| format!("creating {}", args.history.display()))?;
    let mut history = Appender::open(&args.history)?;
    let exe = std::env::current_exe().context("finding the nemesis binary")?;
    let mut rng = StdRng::seed_from_u64(args.seed);
    let mut next_id = 0u64;
    let mut generation = 0u32;
    while !STOP.load(Ordering::SeqCst) {
        generation += 1;
        let session = cli_session(args.client, generation);
        let lock = args.locks[rng.random_range(0..args.locks.len())].clone();
        let id = next_id + 1;
        next_id += 2;
        history.write(WorkerEvent::Invoke {
            id,
            generation,
            session,
            lock: lock.clone(),
            token: None,
            at: ns(now()),
        })?;
        let mut cmd = Command::new(&args.latchkey);
        cmd.arg("lock")
            .args(["--endpoints", &args.endpoints.join(",")])
            .args(["--ttl", &format!("{}ms", args.ttl_ms)])
            .args(["--wait", &format!("{}ms", args.wait_ms)])
            .args(["--owner", &format!("nemesis cli worker {}", args.client)])
            .arg(&lock)
            .arg("--")
            .arg(&exe)
            .args(["hold", "--client", &args.client.to_string()])
            .arg("--history")
            .arg(&args.history)
            .args(["--id", &id.to_string()])
            .args(["--generation", &generation.to_string()])
            .args(["--resource", &args.resource.to_string()])
            .args(["--hold-ms", &args.hold_ms.to_string()]);
        if let Some(pg) = &args.postgres {
            cmd.args(["--postgres", pg]);
        }
        // SAFETY: the closure runs in the child between fork and exec and makes one
        // async-signal-safe system call (prctl): a worker killed by the run takes its
        // `latchkey lock` with it.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting latchkey lock")?;
        CHILD.store(child.id() as i32, Ordering::SeqCst);
        // A SIGTERM that came before the store was not forwarded: it is seen here.
        if STOP.load(Ordering::SeqCst) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let out = child.wait_with_output();
        CHILD.store(0, Ordering::SeqCst);
        let out = out.context("waiting for latchkey lock")?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        // The worker's log (its own stderr) keeps what the CLI said.
        eprint!("{stderr}");
        match out.status.code() {
            Some(0) if !stderr.contains("warning: releasing lock") => {
                history.write(WorkerEvent::Return {
                    id: id + 1,
                    ret: WorkerRet::Released,
                    at: ns(now()),
                })?;
            }
            Some(3) => history.write(WorkerEvent::Return {
                id,
                ret: WorkerRet::NotGranted,
                at: ns(now()),
            })?,
            Some(4) => history.write(WorkerEvent::Lost {
                generation,
                session,
                at: ns(now()),
            })?,
            // Unknown: what was in flight stays unanswered; the next is a new generation.
            _ => eprintln!(
                "cli worker {}: latchkey lock {lock:?} ended with {}",
                args.client, out.status
            ),
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(0..50)));
    }
    Ok(())
}

/// COMMAND under `latchkey lock`: the critical section (see the module comment).
pub fn hold(args: HoldArgs) -> anyhow::Result<()> {
    let at = now();
    let token: u64 = match std::env::var("LATCHKEY_TOKEN").map(|t| t.parse()) {
        Ok(Ok(token)) => token,
        _ => bail!("LATCHKEY_TOKEN is missing or not a number: run me under `latchkey lock`"),
    };
    let lock = std::env::var("LATCHKEY_LOCK").context("LATCHKEY_LOCK is missing")?;
    let session = cli_session(args.client, args.generation);
    let mut history = Appender::open(&args.history)?;
    history.write(WorkerEvent::Return {
        id: args.id,
        ret: WorkerRet::Granted { token },
        at: ns(at),
    })?;
    let check = |history: &mut Appender| {
        history.write(WorkerEvent::HoldCheck {
            generation: args.generation,
            session,
            lock: lock.clone(),
            token,
            at: ns(now()),
        })
    };
    check(&mut history)?;
    let who = format!("{} {} {lock} {token}", args.client, args.generation);
    let mut resource = Conn::new(args.resource);
    let read = resource.call(&format!("BEGIN {who}")).unwrap_or_else(|e| {
        eprintln!("hold: resource: {e:#}");
        None
    });
    std::thread::sleep(Duration::from_millis(args.hold_ms));
    check(&mut history)?;
    if let Some(read) = read {
        if let Err(e) = resource.call(&format!("COMMIT {who} {}", read + 1)) {
            eprintln!("hold: resource: {e:#}");
        }
    }
    if let Some(addr) = &args.postgres {
        let written = crate::postgres::write(addr, &lock, &who, token);
        history.write(WorkerEvent::Postgres {
            lock: lock.clone(),
            token,
            written,
            at: ns(now()),
        })?;
    }
    history.write(WorkerEvent::Invoke {
        id: args.id + 1,
        generation: args.generation,
        session,
        lock,
        token: Some(token),
        at: ns(now()),
    })?;
    Ok(())
}
