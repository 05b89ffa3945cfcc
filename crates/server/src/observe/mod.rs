//! What a member shows of itself and of its locks: Prometheus metrics with `/healthz` and
//! `/readyz` ([`metrics`]), refused clients and peer RPCs counted and logged ([`refusals`]), and
//! the member's recent lock changes with its live watch streams ([`watch`]).
//!
//! Each is fed by the layers above it (the node, the lease task, the access check) and depends
//! on none of them.

pub mod metrics;
pub mod refusals;
pub mod watch;
