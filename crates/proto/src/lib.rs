//! Generated protobuf and gRPC types of the latchkey wire API (`proto/latchkey.proto`).
//!
//! Only the server and client crates use these; the core has its own types. The metadata keys
//! below are part of the API: the server sets them on errors and the client reads them.

#![allow(clippy::all)]

pub mod v1 {
    tonic::include_proto!("latchkey.v1");
}

/// Response metadata: a stable kebab-case error reason.
pub const ERROR_REASON_KEY: &str = "latchkey-error";
/// Response metadata on `UNAVAILABLE`: the id of the leader this node believes in.
pub const LEADER_ID_KEY: &str = "latchkey-leader-id";
/// Response metadata on `UNAVAILABLE`: the client address of that leader.
pub const LEADER_ADDR_KEY: &str = "latchkey-leader-addr";
/// Response metadata on an error of a cluster of several Raft groups: the group the error
/// (and its leader hint) is about (issue #16).
pub const GROUP_KEY: &str = "latchkey-group";
