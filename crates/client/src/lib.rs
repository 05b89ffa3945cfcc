//! The latchkey client library.
//!
//! ```no_run
//! # async fn demo() -> Result<(), latchkey_client::Error> {
//! use std::time::Duration;
//! let client = latchkey_client::Client::connect(["127.0.0.1:7420"]).await?;
//! let session = client.session(Duration::from_secs(15)).await?;
//! let guard = session.lock("reports/daily").wait(Some(Duration::from_secs(30))).await?;
//! // Send guard.token() with every write; stop when guard.lost() completes.
//! guard.release().await?;
//! session.close().await?;
//! # Ok(()) }
//! ```
//!
//! Layout:
//! - [`client`]: [`Client`]: endpoints, leader hints, and the retry loop every RPC goes
//!   through (a mutating request keeps its sequence number across retries).
//! - [`session`]: [`Session`]: a lease renewed by one background task, and the client-side
//!   deadline (`last acknowledged renewal's send instant + TTL - safety margin`).
//! - [`lock`]: [`LockRequest`] and [`LockGuard`], with the fencing-header helpers.
//! - [`types`]: plain answers of the read-only calls (no protobuf types in this API).
//! - [`error`]: [`Error`], and the one mapping from gRPC statuses.
//! - [`retry`]: [`RetryPolicy`] and the jittered exponential backoff.

pub mod client;
pub mod error;
pub mod lock;
pub mod retry;
pub mod session;
pub mod types;

pub use client::{Client, ClientConfig};
pub use error::Error;
pub use lock::{
    fencing_header, fencing_headers, LockGuard, LockRequest, LOCK_HEADER, TOKEN_HEADER,
};
pub use retry::RetryPolicy;
pub use session::{safety_margin, Session, SAFETY_MARGIN_MIN};
pub use types::{Holder, LockInfo, LockList, Member, NodeStatus};
