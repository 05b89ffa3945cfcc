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
//! # Sending the fencing token to the resource
//!
//! A lock cannot stop a holder that paused past its lease from writing; the resource can, if
//! every write carries the grant's token (docs/fencing-recipes.md). Over HTTP, send
//! [`fencing_headers`] (`latchkey-lock` and `latchkey-token`, what `latchkey_fence`'s gate and
//! example service read) with every write; for SQL, bind the token in a conditional update:
//!
//! ```no_run
//! # async fn demo(session: &latchkey_client::Session) -> Result<(), Box<dyn std::error::Error>> {
//! let guard = session.lock("orders").wait(None).await?;
//!
//! // HTTP: one header per pair, whatever the HTTP client
//! // (reqwest: `request = request.header(name, value)`).
//! let mut request = String::from("PUT /kv/total HTTP/1.1\r\ncontent-length: 2\r\n");
//! for (name, value) in latchkey_client::fencing_headers(&guard) {
//!     request.push_str(&format!("{name}: {value}\r\n"));
//! }
//!
//! // SQL: the token as a parameter of the fenced update; SQL integers are signed, so refuse a
//! // token that does not fit rather than let it wrap (`latchkey_fence::sql::token_to_sql`).
//! let sql = "UPDATE accounts SET total = $2, fence = $3 WHERE id = $1 AND fence <= $3";
//! let token = i64::try_from(guard.token())?;
//! // 0 rows updated and `fence > token` on re-read: stale, a newer holder has written; stop.
//! # let _ = (sql, token);
//! # Ok(()) }
//! ```
//!
//! The `pause_scenario` example (`cargo run -p latchkey-client --example pause_scenario`)
//! shows a paused holder's late write refused this way.
//!
//! Layout:
//! - [`client`]: [`Client`]: endpoints, leader hints, and the retry loop every RPC goes
//!   through (a mutating request keeps its sequence number across retries).
//! - [`session`]: [`Session`]: a lease renewed by one background task, and the client-side
//!   deadline (`last acknowledged renewal's send instant + TTL - safety margin`).
//! - [`lock`]: [`LockRequest`] and [`LockGuard`], with the fencing-header helpers.
//! - [`election`]: [`Leadership`] ([`Session::campaign`]), [`Client::leader`] and
//!   [`Client::observe`]: leader election on an exclusive lock with a published value.
//! - [`types`]: plain answers of the read-only calls (no protobuf types in this API).
//! - [`error`]: [`Error`], and the one mapping from gRPC statuses.
//! - [`retry`]: [`RetryPolicy`] and the jittered exponential backoff.
//! - [`watch`]: [`Watch`], a stream of lock changes that resumes on another member.
//! - [`env`]: [`ClientEnv`], the seams for time, connections and jitter (the simulation runs
//!   this library through them).
//! - `keepalive`: the sessions of one [`Client`] renew in shared `KeepAlive` batches, one
//!   request per member per renewal; `tls`: [`ClientTls`] for `https://` endpoints.
//!
//! Raft groups (issue #16): the client learns the group count from the first `CreateSession`
//! answer, or asks `NodeStatus` once when it reads before it locks. A [`Session`] is group 0's
//! session plus one per other group, made at that group's first lock, sharing one `lost` and
//! renewing on group 0's schedule; the [`Client`] keeps a leader per group, and makes a
//! membership change in each group in turn ([`Error::MembershipIncomplete`] when one fails part
//! way). A leader hint is not followed for a while to a member that just refused the client:
//! followers name a dead leader until the next election.

mod batch;
pub mod client;
pub mod election;
pub mod env;
pub mod error;
mod keepalive;
pub mod lock;
pub mod retry;
pub mod session;
pub mod tls;
pub mod types;
pub mod watch;

pub use client::{AuthToken, Client, ClientConfig};
pub use election::{EndedTerm, Leader, Leadership, Observe};
pub use env::{
    BatchSent, BootClock, ClientClock, ClientConnector, ClientEnv, SystemClock, TcpConnector,
};
pub use error::Error;
pub use latchkey_core::{Mode, SessionOwner};
pub use latchkey_core::{WatchEvent, WatchKind};
pub use lock::{
    fencing_header, fencing_headers, LockGuard, LockRequest, LOCK_HEADER, TOKEN_HEADER,
};
pub use retry::RetryPolicy;
pub use session::{safety_margin, Session, SAFETY_MARGIN_MIN};
pub use tls::{ClientTls, TlsConnector};
pub use types::{
    describe_session, human_duration, AuditEntry, Backup, GroupStatus, GroupVoters, Holder,
    LockInfo, LockList, Member, NodeStatus, SessionOptions, Waiter,
};
pub use watch::{Watch, WatchItem};
