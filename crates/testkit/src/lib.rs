//! Test support shared by latchkey's crates (`publish = false`; a dev-dependency only, so none of
//! it reaches the shipped binary or a library).
//!
//! Layout:
//! - [`counting_alloc`]: a global allocator that counts live bytes, for the memory budget
//!   tests.
//! - [`conformance`]: the Rust client's conformance agent (`docs/conformance.md`), which
//!   the one conformance suite (`crates/cli/tests/conformance.rs`) drives like the other
//!   languages' agents.
//! - [`node`]: [`Node`], one latchkey node served in this process (`latchkey_server::run` on a
//!   loopback port) for the server's API tests and the client's pause scenario.
//! - [`ports`]: [`free_port`], a loopback port outside the kernel's ephemeral range, for the
//!   servers tests start.
//! - [`wait`]: [`wait_until`] and [`wait_until_async`], the one way tests wait for an event:
//!   poll a condition with a deadline, never a bare sleep.
//! - [`fenced_kv`]: the fenced key-value example service of `latchkey-fence` (its file,
//!   compiled here, not a copy), and [`FencedResource`], that service on a thread of its own
//!   recording every write attempt: the protected resource of the fencing tests.
//!
//! The process tests' harness (real `latchkey serve` processes, killed and paused) stays in
//! `crates/cli/tests/common`: it needs the binary Cargo builds for those tests.

pub mod conformance;
pub mod counting_alloc;
pub mod node;
pub mod ports;
pub mod resource;
pub mod wait;

/// The fenced key-value service of the `fenced_kv` example. Compiled from the example's own
/// file so that the tests exercise exactly what the docs tell a user to run, without making the
/// service a part of the fence library.
#[path = "../../fence/examples/fenced_kv/service.rs"]
pub mod fenced_kv;

pub use node::{counter, scrape_metrics, Node};
pub use ports::free_port;
pub use resource::{Attempt, FencedResource};
pub use wait::{wait_until, wait_until_async, TimedOut, POLL};
