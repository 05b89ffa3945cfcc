//! A simulated client: the real client library (`latchkey_client`) doing read-modify-writes
//! under locks against the fenced resource, every step recorded.
//!
//! Each client is a turmoil *host*, so the harness can crash it like a process. Its software
//! builds a [`latchkey_client::Client`] through the library's seams ([`ClientEnv`]): turmoil's
//! TCP, a [`DriftClock`] of its own, and a seeded jitter generator. Sessions, renewals, leader
//! routing, retries (one sequence number per logical request), the deadline rule (send time of
//! the last acknowledged renewal + TTL − safety margin, on this host's drifting clock) and
//! `LockGuard::is_lost` are the library's, unchanged. The client only decides what to record:
//!
//! - an Acquire is granted (`Ok(guard)`), or indeterminate (a wait that timed out, a lost
//!   session, no leader within the budget): the server may still grant it, so the client drops
//!   the session (the library closes it, or the server expires it) and starts a new one, a new
//!   actor for the checkers;
//! - a Release is `Released`, `NotHolder` (`Error::NotHeld`) or indeterminate (same as above);
//! - before reading the resource, before writing it and every 50–100 ms of a long critical
//!   section, the client asks its guard whether the lock may be lost: a `HoldCheck` event if
//!   not (judged by the deadline checker), a `Lost` event if so, and the section ends.
//!
//! Each lock name is taken one way ([`LockUse`]): as a mutex, as a read-write lock (each acquire
//! a reader or a writer, drawn), or as a semaphore of N permits; the critical section does on
//! the resource what its mode allows (see `resource.rs`).
//!
//! Faults the harness arms through [`ClientControl`], each at the client's next grant or
//! critical section, so that they hit a holder:
//! - *kill*: right after a grant the client asks the harness to crash its host (every task,
//!   renewals included, dies; no CloseSession), and the harness restarts it later;
//! - *pause*: between reading and writing the resource the client stops for 1.2–3 TTLs, and
//!   the harness holds every message between it and the nodes meanwhile (a paused process,
//!   seen from the network); it then writes without looking at its guard, as a process
//!   resuming from a GC pause would, so only the fence can stop the write;
//! - *long holds* (not a fault): in the safety phase a tenth of the critical sections last 1–2.5
//!   TTLs, renewals running, so that faults hit holders whose sessions must stay renewed;
//! - *partition*: in its critical section the harness cuts it off from every node (both ways
//!   or one way) for 1.2–2.5 TTLs while it keeps working and checking its guard.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use latchkey_client::{Client, ClientConfig, ClientEnv, Error, LockGuard, RetryPolicy, Session};
use latchkey_core::Mode;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::clock::{true_now, DriftClock};
use crate::history::{Actor, ElectionKind, ElectionRet, Event, History, OpKind, Ret};
use crate::net::SimConnector;
use crate::resource::Resource;

/// How long one Acquire waits in the queue.
pub const WAIT_MS: u64 = 3_000;
/// The share of critical sections in the safety phase that are long.
const LONG_HOLD_P: f64 = 0.1;

#[derive(Debug, Clone)]
pub struct ClientSetup {
    pub id: u32,
    pub nodes: Vec<String>,
    pub locks: Vec<String>,
    /// How each of `locks` is taken (a mutex, a read-write lock, a semaphore), in order.
    pub uses: Vec<LockUse>,
    pub ttl: Duration,
    pub drift_ppm: i64,
    pub seed: u64,
    /// True time after which no new operation starts.
    pub stop_at: Duration,
    /// True time until which some critical sections are long (the safety phase): 1–2.5 TTLs,
    /// renewals running, the guard asked every 50–100 ms. After it they would starve waiters.
    pub long_holds_until: Duration,
    pub work_ms: (u64, u64),
    /// Whether some mutex acquires ask for a lock-delay ([`LockDelays`],
    /// `RunConfig::lock_delay`).
    pub lock_delay: bool,
    /// Whether the client campaigns in [`ELECTION`] ([`Elections`], `RunConfig::elections`).
    pub elections: bool,
    /// Whether the client's library batches its operations (`ClientConfig::batch`,
    /// `RunConfig::client_batch`); with it the host runs `BATCH_WORKERS` sessions at once.
    pub batch: bool,
}

/// The lock-delays the clients ask for under `RunConfig::lock_delay` (issue #32 item 4): this
/// share of mutex acquires asks for a delay drawn from `MS`. Drawn from a generator of their
/// own ([`LockDelays::for_life`]), so that the workload's own draws are those of the same
/// seed without delays, and a run without them draws nothing.
pub struct LockDelays {
    rng: StdRng,
}

impl LockDelays {
    /// The share of mutex acquires that ask for a delay.
    pub const P: f64 = 0.5;
    /// The delays asked for (ms): a few seconds, well inside a run's settle and liveness
    /// phases, and about a client's 3 s wait (`WAIT_MS`), so that a waiter queued when the
    /// delay starts is often still there when it ends.
    pub const MS: std::ops::RangeInclusive<u64> = 1_000..=3_000;

    /// The delays of one life of a client's host, or none without `RunConfig::lock_delay`.
    fn for_life(setup: &ClientSetup, life: u64) -> Option<LockDelays> {
        setup.lock_delay.then(|| LockDelays {
            rng: StdRng::seed_from_u64(
                (setup.seed ^ 0xde1a_75ee_d000_0000).wrapping_add(life.wrapping_mul(0x9e37_79b9)),
            ),
        })
    }

    /// The delay the next acquire of a name taken as `use_` asks for (zero: none). Only a
    /// mutex takes one.
    fn draw(&mut self, use_: LockUse) -> Duration {
        // Both drawn for every acquire, so that the draws do not shift with the kinds of names.
        let (ask, ms) = (
            self.rng.random_bool(Self::P),
            self.rng.random_range(Self::MS),
        );
        if use_ == LockUse::Mutex && ask {
            Duration::from_millis(ms)
        } else {
            Duration::ZERO
        }
    }
}

/// The election the clients campaign in under `RunConfig::elections`: one name, as a service
/// has one leader.
pub const ELECTION: &str = "election";

/// The election workload under `RunConfig::elections` (issue #32 item 1): at a share of its
/// steps a client reads the leader, at another it campaigns (a 3 s wait, as an acquire's); once
/// it leads (in the safety phase sometimes for 1-2.5 TTLs first, asking its leadership every
/// 50-100 ms) it proclaims 1-3 new values, asking its leadership before each, then resigns (and
/// now and then proclaims once more under the ended term, as a proclaim the network delayed
/// past the resign would arrive: the server must refuse it). The harness's faults hit leaders
/// as they hit holders: a kill right after the grant, a pause between two proclaims, after
/// which the leader proclaims without asking. Drawn from a generator of its own
/// ([`Elections::for_life`]), like [`LockDelays`], and nothing is drawn without it.
pub struct Elections {
    rng: StdRng,
    /// Values made so far in this life: with the actor, each value names its maker, so a read
    /// names the campaign or proclaim it came from.
    made: u64,
}

impl Elections {
    /// The share of a client's steps at which it campaigns (instead of taking a lock).
    pub const CAMPAIGN_P: f64 = 0.25;
    /// The share of a client's steps that begin with a read of the leader.
    pub const READ_P: f64 = 0.3;
    /// The share of resigns followed by a late proclaim under the ended term.
    pub const LATE_PROCLAIM_P: f64 = 0.5;
    /// The share of terms in the safety phase that are long (1-2.5 TTLs, the leader asking
    /// every 50-100 ms), as a long hold of a lock: so that failovers meet leaders.
    pub const LONG_TERM_P: f64 = 0.3;

    /// The elections of one life of a client's host, or none without `RunConfig::elections`.
    fn for_life(setup: &ClientSetup, life: u64) -> Option<Elections> {
        setup.elections.then(|| Elections {
            rng: StdRng::seed_from_u64(
                (setup.seed ^ 0xe1ec_7000_0000_0000).wrapping_add(life.wrapping_mul(0x9e37_79b9)),
            ),
            made: 0,
        })
    }

    /// A value no other operation of the run has.
    fn value(&mut self, actor: Actor) -> String {
        self.made += 1;
        format!("c{}.g{}.{}", actor.client, actor.generation, self.made)
    }
}

/// How the clients take a lock name (issue #32). A name is always taken the same way, so no
/// acquire is refused for its kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LockUse {
    Mutex,
    /// A read-write lock: each acquire a reader, with this chance, or a writer.
    ReadWrite {
        reader_p: f64,
    },
    /// A semaphore of this many permits.
    Semaphore {
        permits: u32,
    },
}

impl LockUse {
    /// The mode of the next acquire (a read-write lock draws one; the others draw nothing, so
    /// a run of mutexes makes the draws it made before issue #32).
    fn mode(self, rng: &mut StdRng) -> Mode {
        match self {
            LockUse::Mutex => Mode::Exclusive,
            LockUse::ReadWrite { reader_p } if rng.random_bool(reader_p) => Mode::Shared,
            LockUse::ReadWrite { .. } => Mode::Exclusive,
            LockUse::Semaphore { permits } => Mode::Permits(permits),
        }
    }
}

/// Faults the harness arms for a client, and the client's requests to the harness. Shared by
/// every life of the client's host.
#[derive(Debug, Default)]
pub struct ClientControl {
    /// At the next critical section, pause for this many milliseconds (0: none).
    pub pause_ms: AtomicU64,
    /// The client's request to the harness: hold my messages now, for this many milliseconds.
    pub pause_now_ms: AtomicU64,
    /// At the next grant, die.
    pub crash: AtomicBool,
    /// The client's request to the harness: crash my host now.
    pub crash_now: AtomicBool,
    /// At the next critical section, be cut off from every node for this many milliseconds
    /// (0: none).
    pub cut_ms: AtomicU64,
    /// The client's request to the harness: cut me off now, for this many milliseconds.
    pub cut_now_ms: AtomicU64,
    /// Sessions started by every life of this client so far (the actor generations).
    generation: AtomicU32,
    /// Lives of the host so far.
    lives: AtomicU32,
}

impl ClientControl {
    /// Disarms every fault not fired yet (the faults heal).
    pub fn disarm(&self) {
        self.pause_ms.store(0, Ordering::Relaxed);
        self.pause_now_ms.store(0, Ordering::Relaxed);
        self.crash.store(false, Ordering::Relaxed);
        self.cut_ms.store(0, Ordering::Relaxed);
        self.cut_now_ms.store(0, Ordering::Relaxed);
    }
}

/// The library's settings for the simulation: short attempts, as on a fast network; the
/// operations batched with `batch` (`RunConfig::client_batch`).
fn config(batch: bool) -> ClientConfig {
    ClientConfig {
        connect_timeout: Duration::from_millis(500),
        rpc_timeout: Duration::from_secs(1),
        retry: RetryPolicy {
            attempts_max: 20,
            elapsed_max: Duration::from_secs(5),
            // As before the fail-fast budget: the seeds' schedules stay what they were.
            unreachable_max: Duration::from_secs(5),
            backoff_initial: Duration::from_millis(20),
            backoff_max: Duration::from_millis(500),
        },
        auth_token: None,
        batch,
        batch_calls_in_flight: latchkey_core::limits::SIM_CLIENT_BATCH_CALLS_IN_FLIGHT,
    }
}

/// Counts the client's `Batch` calls of two or more operations in the history (the reach of
/// `RunConfig::client_batch`, `HistoryData::client_batches_of_several`).
fn batch_sent(history: &History) -> Option<latchkey_client::BatchSent> {
    let history = history.clone();
    Some(Arc::new(move |ops: usize| {
        if ops >= 2 {
            history.with(|h| h.client_batches_of_several += 1);
        }
    }))
}

/// What the client does after a step of a critical section.
enum Next {
    /// The next operation, in the same session.
    Continue,
    /// Drop the session and start another.
    NewSession,
    /// The run is over: keep the session and the lock (the final check looks for the holder
    /// after the cluster restarts).
    Keep(LockGuard),
}

/// One life of the client's host, as turmoil host software. It never returns: after
/// `stop_at` it keeps its session and any lock it holds until the simulation ends.
pub async fn run(
    setup: ClientSetup,
    history: History,
    resource: Resource,
    control: Arc<ClientControl>,
) -> turmoil::Result {
    let life = control.lives.fetch_add(1, Ordering::Relaxed) as u64;
    let mut rng = StdRng::seed_from_u64(setup.seed.wrapping_add(life.wrapping_mul(0x9e37_79b9)));
    // A restarted process has a new monotonic clock; the drift is the machine's.
    let clock = Arc::new(DriftClock::new(setup.drift_ppm, 0));
    let env = ClientEnv {
        clock: clock.clone(),
        connector: Arc::new(SimConnector),
        seed: Some(rng.random()),
        batch_sent: batch_sent(&history),
    };
    let client = Client::with_env(setup.nodes.iter().cloned(), config(setup.batch), env)?;
    let delays = LockDelays::for_life(&setup, life);
    let elections = Elections::for_life(&setup, life);
    let host = Host {
        setup: &setup,
        history: &history,
        resource: &resource,
        control: &control,
        client: &client,
        clock: &clock,
    };
    let first = host.sessions(rng, delays, elections);
    if setup.batch {
        // The other sessions of the host (`RunConfig::client_batch`): the plain lock workload,
        // each from a generator of its own, so that the first session draws what it would
        // alone.
        let others = (1..crate::config::BATCH_WORKERS as u64).map(|k| {
            let seed = (setup.seed ^ 0xba7c_4000_0000_0000)
                .wrapping_add(k)
                .wrapping_add(life.wrapping_mul(0x9e37_79b9));
            host.sessions(StdRng::seed_from_u64(seed), None, None)
        });
        futures::future::join(first, futures::future::join_all(others)).await;
    } else {
        first.await;
    }
    std::future::pending::<()>().await;
    Ok(())
}

/// What one life of a client's host shares among its sessions.
struct Host<'a> {
    setup: &'a ClientSetup,
    history: &'a History,
    resource: &'a Resource,
    control: &'a ClientControl,
    client: &'a Client,
    clock: &'a Arc<DriftClock>,
}

impl Host<'_> {
    /// Sessions one after another, each worked until it must be dropped, until the run is
    /// over (or kept to the end: `Next::Keep`, which never returns).
    async fn sessions(
        &self,
        mut rng: StdRng,
        mut delays: Option<LockDelays>,
        mut elections: Option<Elections>,
    ) {
        let Host {
            setup,
            history,
            resource,
            control,
            client,
            clock,
        } = *self;
        while true_now() < setup.stop_at {
            let session = match client.session(setup.ttl).await {
                Ok(s) => s,
                Err(_) => {
                    // No leader within the budget (the safety phase): try again.
                    tokio::time::sleep(Duration::from_millis(rng.random_range(50..200))).await;
                    continue;
                }
            };
            let actor = Actor {
                client: setup.id,
                generation: control.generation.fetch_add(1, Ordering::Relaxed) + 1,
            };
            let worker = Worker {
                setup,
                history,
                resource,
                control,
                client,
            };
            let mut draws = Draws {
                rng: &mut rng,
                delays: &mut delays,
                elections: &mut elections,
            };
            let next = tokio::select! {
                next = work(&worker, &mut draws, actor, &session) => next,
                never = watch_deadlines(history, clock, std::slice::from_ref(&session)) => match never {},
            };
            match next {
                Next::Keep(guard) => {
                    // Hold on to both until the simulation ends (the lease oracle still judges
                    // the session).
                    let never =
                        watch_deadlines(history, clock, std::slice::from_ref(&session)).await;
                    drop((guard, session, never));
                }
                Next::NewSession | Next::Continue => {}
            }
            // Dropping the session closes it on the server, best effort; if that fails, it expires.
        }
    }
}

/// What one life of a client works with.
struct Worker<'a> {
    setup: &'a ClientSetup,
    history: &'a History,
    resource: &'a Resource,
    control: &'a ClientControl,
    client: &'a Client,
}

/// The generators one life of a client draws from: the workload's, and those of the workloads
/// a run may add (each its own, so that a run without them draws what it drew before).
struct Draws<'a> {
    rng: &'a mut StdRng,
    delays: &'a mut Option<LockDelays>,
    elections: &'a mut Option<Elections>,
}

/// Operations in one session, until it must be dropped or the run is over.
async fn work(w: &Worker<'_>, draws: &mut Draws<'_>, actor: Actor, session: &Session) -> Next {
    let Worker { setup, history, .. } = *w;
    let Draws {
        rng,
        delays,
        elections,
    } = draws;
    while true_now() < setup.stop_at {
        if session.is_lost() {
            history.event(Event::Lost {
                actor,
                session: session.id(),
                at: true_now(),
            });
            return Next::NewSession;
        }
        if let Some(e) = elections.as_mut() {
            // Both drawn at every step, so that the draws do not shift with what happens.
            let (read, campaign) = (
                e.rng.random_bool(Elections::READ_P),
                e.rng.random_bool(Elections::CAMPAIGN_P),
            );
            if read {
                read_leader(w, actor, session.id()).await;
            }
            if campaign {
                match elect(w, e, actor, session).await {
                    Next::Continue => continue,
                    other => return other,
                }
            }
        }
        let which = rng.random_range(0..setup.locks.len());
        let lock = setup.locks[which].clone();
        let mode = setup.uses[which].mode(rng);
        // With several Raft groups a lock is held by the session of its group (registered
        // there on the group's first lock, here), and the operation is that session's.
        let holder = match session.session_id_for(&lock).await {
            Ok(id) => id,
            Err(Error::InvalidArgument { message }) | Err(Error::Protocol(message)) => {
                panic!("client {}: CreateSession refused: {message}", setup.id)
            }
            Err(_) => return Next::NewSession,
        };
        let delay = (delays.as_mut()).map_or(Duration::ZERO, |d| d.draw(setup.uses[which]));
        let op = history.invoke_acquire(actor, holder, &lock, mode, true_now());
        if !delay.is_zero() {
            history.with(|h| h.delays.insert(op, delay));
        }
        let request = match mode {
            Mode::Exclusive if !delay.is_zero() => session.lock(lock.as_str()).lock_delay(delay),
            Mode::Exclusive => session.lock(lock.as_str()),
            Mode::Shared => session.lock(lock.as_str()).shared(),
            Mode::Permits(n) => session.lock(lock.as_str()).permits(n),
        };
        let guard = match request.wait(Some(Duration::from_millis(WAIT_MS))).await {
            Ok(guard) => guard,
            Err(Error::InvalidArgument { message }) | Err(Error::Protocol(message)) => {
                panic!("client {}: Acquire refused: {message}", setup.id)
            }
            // Timed out, session lost, no leader: the server may still grant it later.
            Err(_) => return Next::NewSession,
        };
        let token = guard.token();
        history.ret(op, Ret::Granted { token }, true_now());
        match critical_section(w, rng, actor, guard, mode).await {
            Next::Continue => {}
            other => return other,
        }
        let think = rng.random_range(0..=setup.work_ms.1);
        tokio::time::sleep(Duration::from_millis(think)).await;
    }
    Next::Continue
}

/// A read of the election's leader, recorded with what it said (an error: indeterminate).
async fn read_leader(w: &Worker<'_>, actor: Actor, session: u64) {
    let history = w.history;
    let i = history.election_invoke(actor, session, ELECTION, ElectionKind::Read, true_now());
    if let Ok(leader) = w.client.leader(ELECTION).await {
        let leader = leader.map(|l| {
            (
                l.session,
                l.token,
                String::from_utf8_lossy(&l.value).into_owned(),
            )
        });
        history.election_ret(i, ElectionRet::Leader(leader), true_now());
    }
}

/// One campaign in [`ELECTION`] and, if it wins, the term (see [`Elections`]).
async fn elect(w: &Worker<'_>, e: &mut Elections, actor: Actor, session: &Session) -> Next {
    let Worker {
        setup,
        history,
        control,
        ..
    } = *w;
    let holder = match session.session_id_for(ELECTION).await {
        Ok(id) => id,
        Err(Error::InvalidArgument { message }) | Err(Error::Protocol(message)) => {
            panic!("client {}: CreateSession refused: {message}", setup.id)
        }
        Err(_) => return Next::NewSession,
    };
    let value = e.value(actor);
    let campaign = ElectionKind::Campaign {
        value: value.clone(),
    };
    let i = history.election_invoke(actor, holder, ELECTION, campaign, true_now());
    let wait = Some(Duration::from_millis(WAIT_MS));
    let leadership = match session.campaign_within(ELECTION, value, wait).await {
        Ok(l) => l,
        Err(Error::InvalidArgument { message }) | Err(Error::Protocol(message)) => {
            panic!("client {}: Campaign refused: {message}", setup.id)
        }
        // Timed out, session lost, no leader: the server may still make it lead later.
        Err(_) => return Next::NewSession,
    };
    let token = leadership.token();
    history.election_ret(i, ElectionRet::Leads { token }, true_now());
    if control.crash.swap(false, Ordering::Relaxed) {
        // Killed as a leader: its session expires, and the next candidate leads.
        control.crash_now.store(true, Ordering::Relaxed);
        std::future::pending::<()>().await;
    }
    let term = Term {
        w,
        actor,
        session: holder,
        token,
    };
    let (long, ttls) = (
        e.rng.random_bool(Elections::LONG_TERM_P),
        e.rng.random_range(1.0..2.5),
    );
    if long && true_now() < setup.long_holds_until {
        let until = true_now() + setup.ttl.mul_f64(ttls);
        while true_now() < until {
            let step = e.rng.random_range(50..=100);
            tokio::time::sleep(Duration::from_millis(step)).await;
            if !term.leading(&leadership) {
                return Next::NewSession;
            }
        }
    }
    for _ in 0..e.rng.random_range(1..=3) {
        let think = e.rng.random_range(50..=300);
        tokio::time::sleep(Duration::from_millis(think)).await;
        let pause_ms = control.pause_ms.swap(0, Ordering::Relaxed);
        if pause_ms > 0 {
            // Paused as a leader, it resumes and proclaims without asking its leadership:
            // only the server's check of the term's token can refuse it.
            control.pause_now_ms.store(pause_ms, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
            term.proclaim(e.value(actor), |v| leadership.proclaim(v))
                .await;
            return Next::NewSession;
        }
        if !term.leading(&leadership) {
            return Next::NewSession;
        }
        let proclaimed = term.proclaim(e.value(actor), |v| leadership.proclaim(v));
        if proclaimed.await != Some(true) {
            return Next::NewSession;
        }
    }
    let late = e.rng.random_bool(Elections::LATE_PROCLAIM_P);
    if !term.leading(&leadership) {
        return Next::NewSession;
    }
    let resign = ElectionKind::Resign { token };
    let i = history.election_invoke(actor, holder, ELECTION, resign, true_now());
    let (resigned, ended) = leadership.resign_keeping_term().await;
    match resigned {
        Ok(()) => history.election_ret(i, ElectionRet::Resigned, true_now()),
        Err(Error::NotHeld { .. }) => history.election_ret(i, ElectionRet::NotHeld, true_now()),
        Err(Error::InvalidArgument { message }) | Err(Error::Protocol(message)) => {
            panic!("client {}: Resign refused: {message}", setup.id)
        }
        Err(_) => return Next::NewSession,
    }
    if late {
        term.proclaim(e.value(actor), |v| ended.proclaim(v)).await;
    }
    Next::Continue
}

/// One term of a leader, as its client records it.
struct Term<'a> {
    w: &'a Worker<'a>,
    actor: Actor,
    session: u64,
    token: u64,
}

impl Term<'_> {
    /// Records whether the leader, asking its leadership, still leads; false if it may not.
    fn leading(&self, leadership: &latchkey_client::Leadership) -> bool {
        let (history, at) = (self.w.history, true_now());
        if leadership.is_lost() {
            let lost = Event::Lost {
                actor: self.actor,
                session: self.session,
                at,
            };
            history.event(lost);
            return false;
        }
        let leading = ElectionKind::Leading { token: self.token };
        let i = history.election_invoke(self.actor, self.session, ELECTION, leading, at);
        history.election_ret(i, ElectionRet::Leading, at);
        true
    }

    /// Proclaims `value` under the term's token through `send`, recorded: `Some(true)` if the
    /// server acknowledged it, `Some(false)` if it refused it (the term had ended), `None` if
    /// the answer says neither.
    async fn proclaim<F>(&self, value: String, send: impl FnOnce(String) -> F) -> Option<bool>
    where
        F: std::future::Future<Output = Result<(), Error>>,
    {
        let history = self.w.history;
        let kind = ElectionKind::Proclaim {
            token: self.token,
            value: value.clone(),
        };
        let i = history.election_invoke(self.actor, self.session, ELECTION, kind, true_now());
        match send(value).await {
            Ok(()) => {
                history.election_ret(i, ElectionRet::Proclaimed, true_now());
                Some(true)
            }
            Err(Error::Conflict { .. }) => {
                history.election_ret(i, ElectionRet::NotLeader, true_now());
                Some(false)
            }
            Err(Error::InvalidArgument { message }) | Err(Error::Protocol(message)) => {
                panic!("client {}: Proclaim refused: {message}", self.w.setup.id)
            }
            Err(_) => None,
        }
    }
}

/// Read-modify-write of the resource under `guard`, then the release.
async fn critical_section(
    w: &Worker<'_>,
    rng: &mut StdRng,
    actor: Actor,
    guard: LockGuard,
    mode: Mode,
) -> Next {
    let Worker {
        setup,
        history,
        resource,
        control,
        ..
    } = *w;
    let (lock, token) = (guard.name().to_owned(), guard.token());
    if control.crash.swap(false, Ordering::Relaxed) {
        // Ask to be killed while holding the lock; the harness crashes the host at its next
        // step, which cancels this task and every other of this process.
        control.crash_now.store(true, Ordering::Relaxed);
        std::future::pending::<()>().await;
    }
    if !hold_check(history, actor, &guard) {
        return Next::NewSession;
    }
    let Some(read) = resource.begin(actor, &lock, token, mode) else {
        // A newer holder wrote already: the lock is lost, whatever the guard says.
        return Next::NewSession;
    };
    let cut_ms = control.cut_ms.swap(0, Ordering::Relaxed);
    if cut_ms > 0 {
        // Cut off mid-critical-section: keep working, checking the guard often, and stop at
        // once when it says the lock may be lost.
        control.cut_now_ms.store(cut_ms, Ordering::Relaxed);
        if !keep_working(history, actor, &guard, rng, Duration::from_millis(cut_ms)).await {
            return Next::NewSession;
        }
    } else if true_now() < setup.long_holds_until && rng.random_bool(LONG_HOLD_P) {
        // A long holder (a leader elected through the lock, a long job): its session must stay
        // renewed through whatever the faults do, or the guard must say so in time.
        let hold = setup.ttl.mul_f64(rng.random_range(1.0..2.5));
        if !keep_working(history, actor, &guard, rng, hold).await {
            return Next::NewSession;
        }
    }
    let pause_ms = control.pause_ms.swap(0, Ordering::Relaxed);
    if pause_ms > 0 {
        control.pause_now_ms.store(pause_ms, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        // Resumed mid-write, without looking at the guard: only the fence can stop it.
        resource.end(actor, &lock, token, read, mode);
        return Next::NewSession;
    }
    let work = rng.random_range(setup.work_ms.0..=setup.work_ms.1);
    tokio::time::sleep(Duration::from_millis(work)).await;
    if !hold_check(history, actor, &guard) {
        return Next::NewSession;
    }
    if !resource.end(actor, &lock, token, read, mode) {
        return Next::NewSession;
    }
    if true_now() >= setup.stop_at {
        return Next::Keep(guard);
    }
    let session = guard.session_id();
    let op = history.invoke(actor, session, &lock, OpKind::Release { token }, true_now());
    match guard.release().await {
        Ok(()) => history.ret(op, Ret::Released, true_now()),
        Err(Error::NotHeld { .. }) => history.ret(op, Ret::NotHolder, true_now()),
        Err(Error::InvalidArgument { message }) | Err(Error::Protocol(message)) => {
            panic!("client {}: Release refused: {message}", setup.id)
        }
        // Indeterminate: the session is lost or no leader answered in the budget.
        Err(_) => return Next::NewSession,
    }
    Next::Continue
}

/// Works under `guard` for `how_long`, asking it every 50–100 ms; false as soon as it says the
/// lock may be lost.
async fn keep_working(
    history: &History,
    actor: Actor,
    guard: &LockGuard,
    rng: &mut StdRng,
    how_long: Duration,
) -> bool {
    let until = true_now() + how_long;
    while true_now() < until {
        let step = rng.random_range(50..=100);
        tokio::time::sleep(Duration::from_millis(step)).await;
        if !hold_check(history, actor, guard) {
            return false;
        }
    }
    true
}

/// Records whether the client, asking its guard, still holds the lock; false if it may not.
fn hold_check(history: &History, actor: Actor, guard: &LockGuard) -> bool {
    let at = true_now();
    if guard.is_lost() {
        history.event(Event::Lost {
            actor,
            session: guard.session_id(),
            at,
        });
        false
    } else {
        history.event(Event::HoldCheck {
            actor,
            session: guard.session_id(),
            lock: guard.name().to_owned(),
            token: guard.token(),
            at,
        });
        true
    }
}

/// How often a client records its sessions' lease deadlines for the lease oracle. A renewal is
/// acknowledged every TTL / 3 (at least 333 ms); a deadline seen late only makes the oracle
/// judge against an earlier one (weaker, never wrong).
const DEADLINE_SAMPLE_MS: u64 = 50;

/// Records, for ever, every new lease deadline the library computes for `sessions`, in true
/// time (the lease oracle judges expiries against them).
async fn watch_deadlines(
    history: &History,
    clock: &DriftClock,
    sessions: &[Session],
) -> std::convert::Infallible {
    // By group session (one per session in a cluster of one group): each lock's lease is its
    // group session's, judged against that session's own deadline.
    let mut seen = std::collections::BTreeMap::new();
    loop {
        for s in sessions {
            for (id, deadline) in s.group_deadlines() {
                if seen.insert(id, deadline) != Some(deadline) {
                    history.client_deadline(id, clock.true_time(deadline));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(DEADLINE_SAMPLE_MS)).await;
    }
}

/// A host of idle sessions: they hold nothing and only keep alive, through the library's
/// renewal tasks (one per session), so that every failover makes the new leader mark them all
/// and renew them all through the log (a storm of `RenewLeases`), and the lease oracle judges
/// many leases at once.
#[derive(Debug, Clone)]
pub struct IdleSetup {
    pub nodes: Vec<String>,
    pub sessions: usize,
    pub ttl: Duration,
    pub drift_ppm: i64,
    pub seed: u64,
    /// With several Raft groups, a lock name of each group but group 0: every idle session
    /// joins every group (`Session::session_id_for`), so that each group's failovers mark and
    /// renew hundreds of sessions. Empty with one group.
    pub joins: Vec<String>,
}

/// Sessions created at once by the idle host.
const IDLE_CREATES_IN_FLIGHT: usize = 32;

/// The idle host's software: create the sessions, then watch their deadlines; a lost session
/// (its lease ran out while the cluster could not be reached) is replaced.
pub async fn run_idle(setup: IdleSetup, history: History) -> turmoil::Result {
    use futures::StreamExt;
    let clock = Arc::new(DriftClock::new(setup.drift_ppm, 0));
    let env = ClientEnv {
        clock: clock.clone(),
        connector: Arc::new(SimConnector),
        seed: Some(setup.seed),
        batch_sent: None,
    };
    // Idle sessions only renew (in KeepAlive batches): nothing of theirs rides a Batch call.
    let client = Client::with_env(setup.nodes.iter().cloned(), config(false), env)?;
    let create = || {
        let client = client.clone();
        let ttl = setup.ttl;
        let joins = &setup.joins;
        async move {
            loop {
                if let Ok(s) = client.session(ttl).await {
                    // A group it could not join now is joined by none: the session still
                    // renews in the groups it did join.
                    for name in joins {
                        if s.session_id_for(name).await.is_err() {
                            break;
                        }
                    }
                    return s;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let mut sessions: Vec<Session> = futures::stream::iter(0..setup.sessions)
        .map(|_| create())
        .buffer_unordered(IDLE_CREATES_IN_FLIGHT)
        .collect()
        .await;
    loop {
        tokio::select! {
            never = watch_deadlines(&history, &clock, &sessions) => match never {},
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        let lost: Vec<usize> = (0..sessions.len())
            .filter(|i| sessions[*i].is_lost())
            .collect();
        let fresh: Vec<Session> = futures::stream::iter(&lost)
            .map(|_| create())
            .buffer_unordered(IDLE_CREATES_IN_FLIGHT)
            .collect()
            .await;
        for (i, s) in lost.into_iter().zip(fresh) {
            sessions[i] = s;
        }
    }
}
