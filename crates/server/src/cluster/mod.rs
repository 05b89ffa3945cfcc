//! Members talking to each other.
//!
//! - [`peer`]: the peer protocol's wire format, with its sides in `peer/`: `admission.rs` (the
//!   one door of every message and stream item), `service.rs` (the `RaftPeer` gRPC service)
//!   and `network.rs` (the network client openraft uses to call it).
//! - [`peer_auth`]: who may speak the peer protocol (cluster id, member certificate, MAC).
//! - [`member_addr`]: a member's recorded address, `CLIENT` or `CLIENT/PEER`.
//! - [`leader_contact`]: when this member last heard from its group's leader.
//!
//! Protobuf's peer messages stop here. Must not depend on the node or the client APIs: the
//! node hands the cluster what it needs (a Raft handle per group) when it starts.

pub mod leader_contact;
pub mod member_addr;
pub mod peer;
pub mod peer_auth;
