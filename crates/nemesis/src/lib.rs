//! A Jepsen-style nemesis on real processes (issue #34): `latchkey serve` members and client
//! workers, each in its own network namespace on one bridge, under real partitions (blackhole
//! routes, links set down), kill -9 and restart, SIGSTOP of members and of clients, wall-clock
//! steps (libfaketime); every operation recorded with the machine's one boot clock, and the
//! history checked.
//!
//! What it sees that the simulation (`crates/sim`) cannot: real TCP (a partition drops packets
//! silently, connections stay half-open, HTTP/2 keepalives time out), real timers and
//! scheduling, real fsync, a process stopped by the kernel. What the simulation sees that it
//! cannot: the members' logs and leases from inside (the linearizability and lease checks need
//! them), and thousands of seeds a minute. See `check` for what a run is judged by.
//!
//! - [`net`]: namespaces, bridge, and the network faults.
//! - [`members`]: the cluster's processes.
//! - [`worker`]: a client process (the Rust client) writing its history.
//! - [`cli_worker`]: a client process running the real CLI, `latchkey lock NAME -- COMMAND`.
//! - [`resource`]: the fenced counter the workers write through their locks.
//! - [`postgres`]: a real PostgreSQL, written through `docs/fencing.md`'s SQL recipe.
//! - [`record`]: the history's format and its reading into the simulation's history type.
//! - [`schedule`]: the faults and when.
//! - [`check`]: the checks of a run.
//! - [`run`]: one run, start to summary.
//!
//! Needs root (namespaces). One run per machine at a time: it owns every `lkn-` namespace.

pub mod check;
pub mod cli_worker;
pub mod limits;
pub mod members;
pub mod net;
pub mod postgres;
pub mod record;
pub mod resource;
pub mod run;
pub mod schedule;
pub mod worker;
