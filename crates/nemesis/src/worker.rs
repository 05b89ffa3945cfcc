//! A client worker: its own process in its own namespace, taking locks with the Rust client
//! and writing through them to the fenced resource, every step written to its history.
//!
//! One session at a time; a session's operations are one "generation" (a thread, to the
//! linearizability checker). An operation left without an answer (the worker could not tell
//! whether it took effect) or a lost session ends the generation; the next opens a new session.
//!
//! The critical section: a hold check, `BEGIN` (read the counter), a pause of `hold`, a hold
//! check, `COMMIT` (write it plus one), the PostgreSQL row written through the book's recipe (with
//! `--postgres`), then the release. A hold check reads the time first
//! and then asks the guard whether the lock may be lost (exact after a pause: the client
//! compares its own deadline with its boot clock); only if not does it record that it held
//! the lock at that time. The planted bug [`Plant::IgnoreDeadline`] records it without asking.

use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use latchkey_client::{Client, ClientConfig, Error, LockGuard, Session};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::record::{now, WorkerEvent, WorkerRet};
use crate::resource::Conn;

/// A bug planted in the worker, which the run's checkers must catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Plant {
    /// The worker acts as the holder without checking its lease deadline (an application that
    /// ignores `LockGuard::is_lost`).
    IgnoreDeadline,
}

#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// This worker's number (its actor in the history).
    #[arg(long)]
    pub client: u32,
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
    /// The session's lease.
    #[arg(long, value_parser = humantime_ms)]
    pub ttl: Duration,
    /// How long the critical section lasts between its read and its write.
    #[arg(long, value_parser = humantime_ms)]
    pub hold: Duration,
    /// How long an acquire waits.
    #[arg(long, value_parser = humantime_ms)]
    pub wait: Duration,
    #[arg(long, value_enum)]
    pub plant: Option<Plant>,
    /// The PostgreSQL resource, HOST:PORT: each critical section also writes its lock's row
    /// through `docs/fencing.md`'s recipe under its token.
    #[arg(long)]
    pub postgres: Option<String>,
}

fn humantime_ms(s: &str) -> Result<Duration, String> {
    s.strip_suffix("ms")
        .and_then(|n| n.parse().ok())
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{s:?}: give milliseconds, e.g. 300ms"))
}

struct History {
    file: File,
    events: usize,
}

impl History {
    fn write(&mut self, ev: WorkerEvent) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.events < crate::limits::WORKER_EVENTS_MAX,
            "the history reached its bound of {} events",
            crate::limits::WORKER_EVENTS_MAX
        );
        self.events += 1;
        let mut line = serde_json::to_string(&ev)?;
        line.push('\n');
        // One write per event, unbuffered: a kill -9 loses at most the line being written.
        self.file.write_all(line.as_bytes())?;
        Ok(())
    }
}

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// Runs the worker until SIGTERM (it then ends its current operation and closes its session).
pub fn main(args: WorkerArgs) -> anyhow::Result<()> {
    // The client's log (renewals failing, routes moving) in the worker's log, on demand:
    // `RUST_LOG=latchkey_client=debug` in the nemesis' environment reaches every worker.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::spawn(async move {
            term.recv().await;
            stop.store(true, Ordering::SeqCst);
        });
    }
    let mut history = History {
        file: File::create(&args.history)
            .with_context(|| format!("creating {}", args.history.display()))?,
        events: 0,
    };
    let client = Client::with_config(args.endpoints.clone(), ClientConfig::default())?;
    let mut resource = Conn::new(args.resource);
    let mut rng = StdRng::seed_from_u64(args.seed);
    let mut w = Worker {
        args: &args,
        history: &mut history,
        resource: &mut resource,
        next_id: 0,
        generation: 0,
    };
    while !stop.load(Ordering::SeqCst) {
        w.generation += 1;
        let session = match client.session(args.ttl).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("worker {}: no session: {e}", args.client);
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        while !stop.load(Ordering::SeqCst) {
            let lock = args.locks[rng.random_range(0..args.locks.len())].clone();
            match w.one_lock(&session, &lock).await? {
                Next::Continue => {}
                Next::NewSession => break,
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..50))).await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), session.close()).await;
    }
    Ok(())
}

enum Next {
    Continue,
    /// The generation ended: its session is lost, or an operation's outcome is unknown.
    NewSession,
}

struct Worker<'a> {
    args: &'a WorkerArgs,
    history: &'a mut History,
    resource: &'a mut Conn,
    next_id: u64,
    generation: u32,
}

impl Worker<'_> {
    fn invoke(&mut self, session: u64, lock: &str, token: Option<u64>) -> anyhow::Result<u64> {
        self.next_id += 1;
        self.history.write(WorkerEvent::Invoke {
            id: self.next_id,
            generation: self.generation,
            session,
            lock: lock.to_owned(),
            token,
            at: ns(now()),
        })?;
        Ok(self.next_id)
    }

    fn answer(&mut self, id: u64, ret: WorkerRet) -> anyhow::Result<()> {
        self.history.write(WorkerEvent::Return {
            id,
            ret,
            at: ns(now()),
        })
    }

    fn lost(&mut self, session: u64) -> anyhow::Result<Next> {
        self.history.write(WorkerEvent::Lost {
            generation: self.generation,
            session,
            at: ns(now()),
        })?;
        Ok(Next::NewSession)
    }

    /// Whether the worker still holds `guard`'s lock, recorded as a hold check if so.
    fn hold_check(&mut self, guard: &LockGuard) -> anyhow::Result<bool> {
        let at = now();
        if self.args.plant != Some(Plant::IgnoreDeadline) && guard.is_lost() {
            return Ok(false);
        }
        self.history.write(WorkerEvent::HoldCheck {
            generation: self.generation,
            session: guard.session_id(),
            lock: guard.name().to_owned(),
            token: guard.token(),
            at: ns(at),
        })?;
        Ok(true)
    }

    fn resource(&mut self, request: String) -> Option<u64> {
        match self.resource.call(&request) {
            Ok(answer) => answer,
            Err(e) => {
                eprintln!("worker {}: resource: {e:#}", self.args.client);
                None
            }
        }
    }

    async fn one_lock(&mut self, session: &Session, lock: &str) -> anyhow::Result<Next> {
        let sid = session.id();
        let id = self.invoke(sid, lock, None)?;
        let guard = match session.lock(lock).wait(Some(self.args.wait)).await {
            Ok(guard) => guard,
            Err(Error::WaitTimedOut { .. } | Error::Held { .. }) => {
                self.answer(id, WorkerRet::NotGranted)?;
                return Ok(Next::Continue);
            }
            Err(Error::SessionLost { .. } | Error::SessionNotFound { .. }) => {
                return self.lost(sid);
            }
            Err(e) => {
                eprintln!("worker {}: acquire {lock:?}: {e}", self.args.client);
                return Ok(Next::NewSession);
            }
        };
        let token = guard.token();
        self.answer(id, WorkerRet::Granted { token })?;
        let who = format!("{} {} {lock} {token}", self.args.client, self.generation);
        if !self.hold_check(&guard)? {
            return self.lost(sid);
        }
        let read = self.resource(format!("BEGIN {who}"));
        tokio::time::sleep(self.args.hold).await;
        if !self.hold_check(&guard)? {
            return self.lost(sid);
        }
        if let Some(read) = read {
            self.resource(format!("COMMIT {who} {}", read + 1));
        }
        if let Some(addr) = self.args.postgres.clone() {
            let (row, value) = (lock.to_owned(), who.clone());
            // psql runs off the runtime's thread, which the client's keepalives share.
            let written = tokio::task::spawn_blocking(move || {
                crate::postgres::write(&addr, &row, &value, token)
            })
            .await?;
            self.history.write(WorkerEvent::Postgres {
                lock: lock.to_owned(),
                token,
                written,
                at: ns(now()),
            })?;
        }
        let id = self.invoke(sid, lock, Some(token))?;
        match guard.release().await {
            Ok(()) => self.answer(id, WorkerRet::Released)?,
            Err(Error::NotHeld { .. }) => self.answer(id, WorkerRet::NotHolder)?,
            Err(Error::SessionLost { .. } | Error::SessionNotFound { .. }) => {
                return self.lost(sid);
            }
            Err(e) => {
                eprintln!("worker {}: release {lock:?}: {e}", self.args.client);
                return Ok(Next::NewSession);
            }
        }
        Ok(Next::Continue)
    }
}
