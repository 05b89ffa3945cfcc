//! Every bound of the nemesis, with its reason.

use std::time::Duration;

/// Members of the cluster under test. Addresses are `10.88.0.{1..}`; more than 7 members
/// (Raft's usual maximum) tests nothing a 5-member cluster does not.
pub const MEMBERS_MAX: u32 = 7;
/// Client workers (`--workers` and `--cli-workers` together), each in its own namespace at
/// `10.88.0.{101..}`. More than 2 cores can keep
/// busy measures the machine, not the lock service.
pub const WORKERS_MAX: u32 = 16;
/// Lock names the workers contend for. Few names make many handovers; one name per worker
/// would test nothing.
pub const LOCKS_MAX: u32 = 16;
/// Events one worker may write to its history. A worker does a few operations a second; an
/// hour's run is well under this, and the checkers hold whole histories in memory.
pub const WORKER_EVENTS_MAX: usize = 1_000_000;
/// One line of a worker's history or of the resource protocol: a lock name is at most 512
/// bytes (the server's limit) and the rest is numbers.
pub const LINE_BYTES_MAX: usize = 4096;
/// Connections the fenced resource serves at once: one per worker, with room for
/// reconnections while old ones close.
pub const RESOURCE_CONNECTIONS_MAX: usize = 4 * WORKERS_MAX as usize;
/// Rounds of `docs/fencing.md`'s PostgreSQL recipe for one write: a round that finds a
/// concurrent write in between retries; more than a few means the harness is wrong, and the
/// write is reported failed rather than looping.
pub const POSTGRES_WRITE_ATTEMPTS_MAX: u32 = 5;
/// How long a member gets to start and the cluster to elect a leader.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Faults one run may schedule: a fault lasts at least a second, so even a day's run is under
/// this; the schedule is held in memory and printed.
pub const FAULTS_MAX: usize = 100_000;
/// How long a worker pause waits for the worker to be inside its critical section before it
/// pauses it anyway.
pub const PAUSE_AIM_TIMEOUT: Duration = Duration::from_secs(5);
/// How recently a holder must have made its first hold check for a split
/// (`FaultKind::SplitLeaderMinority`) or a worker's isolation (`FaultKind::IsolateWorker`) to
/// be aimed at it: its whole critical section is then still ahead of it, so the cluster
/// expires its session (after an election, for a split) before it acts as the holder again.
/// A fifth of a second is a few scheduler turns after its grant.
pub const AIM_FRESH: Duration = Duration::from_millis(200);
/// A worker's critical section (`--hold-ms`). The liveness phase grows with it (twice); a
/// critical section of more than a minute tests nothing a shorter one does not.
pub const HOLD_MAX: Duration = Duration::from_secs(60);
/// How long a killed or stopped process gets to exit after SIGKILL before the run reports it.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a clock strobe (`FaultKind::ClockStrobe`) flips a host's clock file. libfaketime
/// re-reads the file only when its cache runs out (`FAKETIME_CACHE_DURATION=1`, see `net.rs`):
/// a process under the same preload saw its wall clock move +300 s, then -300 s, in steps of
/// about two seconds while the file flipped every 200 ms. Faster flips would show no more.
pub const CLOCK_STROBE_FLIP: Duration = Duration::from_millis(200);
