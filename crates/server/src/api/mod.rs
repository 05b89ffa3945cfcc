//! The client-facing APIs: translators from a wire format to the node's operations
//! (`crate::node::ops`) and back. Protobuf and HTTP types stop here.
//!
//! - `calls`: the calls a batch may carry (acquire, release, close, keepalive) and the batch
//!   call, run once for both APIs: each translates its request to a `calls::Call` and back.
//! - `service`: the `Locks` gRPC service ([`service::LocksService`]).
//! - [`http`]: the HTTP/JSON API (`--http-listen`), a second translator beside `service`, with
//!   the same access check; [`http::ROUTES`] is its list of routes; `ui/` is the page it serves;
//!   [`http::cross_site`], its guard against cross-site requests.
//!
//! The errors' gRPC statuses and HTTP bodies are not made here but in `crate::error`, since
//! the node's operations and the access check already answer in `ApiError`. Must not be
//! depended on by anything below it: the node, the cluster, leases, access control.

mod calls;
pub mod http;
pub mod service;
