//! Members talking to each other.
//!
//! - [`peer`]: the `RaftPeer` gRPC service (with its admission of every message and stream
//!   item, `peer/admission.rs`) and the network client openraft uses to call it.
//! - [`peer_auth`]: who may speak the peer protocol (cluster id, member certificate, MAC).
//! - [`member_addr`]: a member's recorded address, `CLIENT` or `CLIENT/PEER`.
//! - [`leader_contact`]: when this member last heard from its group's leader.
//!
//! `peer.rs` is the one file of the crate over 1,000 lines (about 1,860): the peer service, its
//! checks of what a message says and the network client share the wire format and its MACs,
//! and the file was being changed on another branch (the attack matrix, issue #31) when the
//! crate took its folders, so it moved whole; the service and the client are the seam to split
//! it at.
//!
//! Protobuf's peer messages stop here. Must not depend on the node or the client APIs: the
//! node hands the cluster what it needs (a Raft handle per group) when it starts.

pub mod leader_contact;
pub mod member_addr;
pub mod peer;
pub mod peer_auth;
