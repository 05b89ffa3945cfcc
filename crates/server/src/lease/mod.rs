//! Session leases and the calls that wait on them.
//!
//! - [`leases`]: session deadlines on the leader's monotonic clock ([`leases::Leases`]).
//! - [`waiters`]: long-polling acquire calls, woken by the apply observer
//!   ([`waiters::Waiters`]).
//!
//! Must not depend on the node, the cluster or the APIs: the node drives these.

pub mod leases;
pub mod waiters;
