//! A seeded simulation of a whole latchkey cluster in one process, with history checkers.
//!
//! Layout:
//! - [`sim`]: one run (`Run`, in phases: setup, fault, heal, restart, check): turmoil hosts
//!   running `latchkey_server::run_with`, simulated clients, the final restart, then the
//!   checkers. What a run is and what it found ([`config::RunConfig`],
//!   [`config::RunReport`], re-exported by `sim`) are in [`config`], with the command that
//!   replays a seed; `watchdog` fails a run whose step never returns.
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
//! - [`trace`]: a run's trace and fingerprint (`LATCHKEY_SIM_TRACE=DIR` writes the trace).
//!
//! Determinism: a run's seed derives the cluster and workload shape, the fault schedule, every
//! host's clock drift, the servers' entropy, the clients' jitter (`ClientEnv::seed`), turmoil's
//! network randomness, openraft's election timeouts (`latchkey_raft::seed_thread_rng`) and,
//! with `--cfg tokio_unstable` (set in the repository's `.cargo/config.toml`), tokio's choice
//! among ready `select!` branches. Then a seed replays exactly: the same interleaving, the same
//! history. Without that cfg (a `RUSTFLAGS` variable replaces the config's flags) a replay
//! repeats the faults and the workload but may interleave differently, and a failure report
//! says so.
//!
//! What CI asserts (`tests/seeds.rs`, which names each seed and why it was chosen): the CI
//! seeds pass every checker, carried out every kind of client fault, judged the deadline rule
//! near an expiry, and reached every lease state a known bug needs ([`coverage`], counted from
//! the server's `Probe` events). A seed with a bug planted must be caught: the log store
//! acknowledging appends before their fsync (run with openraft's `allow_log_reversion`, so that
//! the checkers, not an openraft panic, judge it), and the lease bugs of issue #9 (`Plant`,
//! `--plant stale-mark|resume-early|renew-without-quorum`). Reaching a plant's state is not
//! always harm, so the tests count the state and run their seeds until one is caught in it.
//! Issue #32's read-write locks and semaphores (`RunConfig::primitives`, half the seeds) are
//! judged by the `holders`, `fifo`, `fencing_order` and `no_overlap` checkers; their CI seeds
//! must hold a reader, a writer and a permit across a failover ([`coverage`]), and each
//! planted bug of the lock table (`latchkey_core::TablePlant`, `--plant permit-freed-twice|
//! reader-past-writer|writer-beside-readers|writer-token-reused`) must be caught.
//! Lock-delays (issue #32 item 4, `RunConfig::lock_delay`, off in every seed's own shape so
//! that the seeds above replay as they were chosen; `latchkey-sim --lock-delay`): half the
//! clients' mutex acquires ask for a 1-3 s delay, and the `lock_delay` checker judges that no
//! grant of a name starts during the delay of a grant lost to its session's expiry (counted
//! from the expiry's proposal, less the clock drift the design allows). Its CI seeds must grant
//! a waiter after a delay, and the planted early end of a delay (`Plant::delay_ends_early`,
//! `--plant delay-ends-early`: the leader ends it at half its length) must be caught.
//! Elections (issue #32 item 1, `RunConfig::elections`, off in every seed's own shape for the
//! same reason; `latchkey-sim --elections`): the clients also campaign in one election, its
//! leader proclaims, resigns (now and then proclaiming once more under the ended term) or
//! dies, and every client reads the leader now and then; the `election` checker judges one
//! leader at a time, rising tokens, proclaims acknowledged only within their term, and reads
//! of the current term's values: never a refused proclaim's, never one an acknowledged
//! proclaim replaced before the read began, never "no leader" while a term surely lasted. Its
//! CI seeds must hold a term across a failover and reach each read check, and the planted
//! proclaim past its term (`TablePlant::proclaim_past_term`, `--plant proclaim-past-term`),
//! refused proclaim applied, proclaim that kept the old value and leader hidden while
//! contended (`--plant refused-proclaim-applied|proclaim-kept-old-value|
//! leader-hidden-while-contended`) must be caught.
//! Batch entries (issue #35, `RunConfig::coalesce`: the leader's coalescing, on in the odd
//! seeds by the seed's parity, drawn from no generator, so the even seeds replay as before;
//! `latchkey-sim --coalesce|--no-coalesce`): every reader of appended or committed entries'
//! operations (the checkers, the coverage, the fault plans) reads a batch's operations each as
//! an entry of its own at the batch's index (`history::ops_in`); the CI seeds must commit
//! batch entries of several operations ([`coverage`]), and the planted batch answered in
//! reverse (`Plant::batch_answers_reversed`, `--plant batch-answers-reversed`) must be caught.
//!
//! Several Raft groups (`--groups G`, `RunConfig::groups`, 1 in every seed's own shape, so
//! older seeds replay as they did): every node runs every group, each with its own log and
//! disk per node (a node's crash hits all of them) and its own history; the clients'
//! operations are recorded once, by group session, and the safety checkers run per group
//! (`HistoryData::of_group`; violations say `group g:`), since tokens of two groups are not
//! comparable; liveness is judged once over every lock. The fault schedules that follow a
//! leader follow group `seed % G` (`RunConfig::targeted_group`). With replica subsets
//! (`RunConfig::replicas`) each group is placed on R of five nodes and the fault plans that
//! reason about a quorum use the targeted group's voters (`RunConfig::group_voters`).
//!
//! `cargo run --profile sweep -p latchkey-sim -- --seeds N` sweeps and sums the counts
//! (`scripts/sweep.py run N` on every core); `-- --reproduce SEED` replays one.

pub mod checkers;
pub mod client;
pub mod clock;
pub mod config;
pub mod coverage;
pub mod faults;
pub mod history;
pub mod net;
pub mod resource;
pub mod sim;
pub mod store;
pub mod sweep;
pub mod trace;
mod watchdog;

pub use sim::{run, run_slowed, GroupReport, RunConfig, RunReport};
