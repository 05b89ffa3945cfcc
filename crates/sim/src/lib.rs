//! A seeded simulation of a whole latchkey cluster in one process, with history checkers.
//!
//! Layout:
//! - [`sim`]: one run (`Run`, in phases: setup, fault, heal, restart, check): turmoil hosts
//!   running `latchkey_server::run_with`, simulated clients, the final restart, then the
//!   checkers.
//! - [`faults`]: the fault schedules (random, failover after a lease write or a logged renewal,
//!   lag-then-lead), their injection and healing, through one context (`FaultCtx`).
//! - [`net`]: turmoil TCP under tonic (server incoming stream, client and peer channels).
//! - [`store`]: the fault-injecting in-memory log store (unsynced writes lost on a crash).
//! - [`clock`]: per-host drifting clocks and seeded entropy.
//! - [`client`]: a simulated client: `latchkey_client` itself on a crashable host, doing
//!   read-modify-writes under locks; what it records; the client faults.
//! - [`resource`]: the fenced resource (`latchkey_fence::MemoryGate` over counters).
//! - [`history`]: what happened, in true simulation time (and what the nodes' probe reported).
//! - [`coverage`]: the lease states a run reached, counted (CI asserts its seeds reach each).
//! - [`checkers`]: one invariant per file.
//! - [`sweep`]: running many seeds and reporting a failure with the command that replays it.
//!
//! Determinism: a run's seed derives the cluster and workload shape, the fault schedule, every
//! host's clock drift, the servers' entropy, the clients' jitter (`ClientEnv::seed`), turmoil's
//! network randomness, openraft's election timeouts (`latchkey_raft::seed_thread_rng`) and,
//! with `--cfg tokio_unstable` (set in the repository's `.cargo/config.toml`), tokio's choice
//! among ready `select!` branches. Then a seed replays exactly: the same interleaving, the same
//! history. Without that cfg (a `RUSTFLAGS` variable replaces the config's flags) a replay
//! repeats the faults and the workload but may interleave differently, and a failure report
//! says so.

pub mod checkers;
pub mod client;
pub mod clock;
pub mod coverage;
pub mod faults;
pub mod history;
pub mod net;
pub mod resource;
pub mod sim;
pub mod store;
pub mod sweep;

pub use sim::{run, GroupReport, RunConfig, RunReport};
