//! turmoil's simulated TCP, plugged into tonic on both sides.
//!
//! - [`incoming`]: the accepted connections of a turmoil listener, as the stream
//!   `latchkey_server::run_with` serves.
//! - [`channel`] / [`SimConnector`]: lazily connected tonic channels that dial turmoil TCP, for
//!   the servers' peer traffic and for the client library. Every
//!   channel has HTTP/2 keepalives: turmoil's TCP does not retransmit, so a partition can eat a
//!   segment and wedge a connection that never errors; the keepalive notices and reconnects.
//!   Every channel also backs off its connects, since each failed turmoil connect keeps its
//!   ephemeral port for the rest of the run.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use hyper_util::rt::TokioIo;
use latchkey_server::PeerConnector;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint, Uri};

/// Port every simulated node listens on.
pub const PORT: u16 = 7420;

/// A turmoil TCP stream that tonic's server accepts.
pub struct SimStream(pub turmoil::net::TcpStream);

impl Connected for SimStream {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for SimStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for SimStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// The connections accepted on `listener`, forever.
pub fn incoming(
    listener: turmoil::net::TcpListener,
) -> impl Stream<Item = Result<SimStream, std::io::Error>> {
    futures::stream::unfold(listener, |listener| async move {
        let next = listener.accept().await.map(|(s, _)| SimStream(s));
        Some((next, listener))
    })
}

/// The first wait after a failed connect to one address, before a channel dials it again.
///
/// A connect that fails in turmoil 0.7 (refused by a crashed or restarting node, or lost in a
/// partition and timed out) never frees the ephemeral port it took: `TcpStream::connect`
/// registers the socket before the SYN and removes it only through a `TcpStream` it never
/// makes. tonic redials on every request to an unreachable channel, so a client host that
/// renews hundreds of sessions exhausted its 16,384 ports in one run with 4 groups (seed 227).
/// A backoff per channel bounds the leak to a few ports per second per address, as real gRPC
/// channels back off their connects.
const CONNECT_BACKOFF_MIN: Duration = Duration::from_millis(50);
/// The longest wait between connects to one address: a node that comes back is dialled again
/// within this, well inside an election timeout.
const CONNECT_BACKOFF_MAX: Duration = Duration::from_millis(800);

/// When one channel may dial next; doubled after each failed connect, reset by a success.
#[derive(Debug, Default)]
struct ConnectBackoff {
    failures: u32,
    not_before: Option<tokio::time::Instant>,
}

impl ConnectBackoff {
    fn failed(&mut self) {
        self.failures = self.failures.saturating_add(1);
        let wait = CONNECT_BACKOFF_MIN
            .saturating_mul(1 << self.failures.min(16).saturating_sub(1))
            .min(CONNECT_BACKOFF_MAX);
        self.not_before = Some(tokio::time::Instant::now() + wait);
    }
}

/// One connect in flight: a failure, an error or a drop by tonic's connect timeout, counts
/// against the channel's backoff unless [`Dial::connected`] was called.
struct Dial {
    backoff: Arc<Mutex<ConnectBackoff>>,
    connected: bool,
}

impl Dial {
    fn connected(mut self) {
        self.connected = true;
        *self.backoff.lock().expect("backoff lock") = ConnectBackoff::default();
    }
}

impl Drop for Dial {
    fn drop(&mut self) {
        if !self.connected {
            self.backoff.lock().expect("backoff lock").failed();
        }
    }
}

/// A lazily connected channel to `addr` (`host:port`) over turmoil TCP, with a connect backoff
/// ([`CONNECT_BACKOFF_MIN`]).
pub fn channel(addr: &str) -> Result<Channel, String> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}")).map_err(|e| e.to_string())?;
    let backoff = Arc::new(Mutex::new(ConnectBackoff::default()));
    Ok(endpoint
        .connect_timeout(Duration::from_millis(500))
        .http2_keep_alive_interval(Duration::from_millis(500))
        .keep_alive_timeout(Duration::from_millis(500))
        .keep_alive_while_idle(true)
        .connect_with_connector_lazy(tower::service_fn(move |uri: Uri| {
            let backoff = backoff.clone();
            async move {
                let not_before = backoff.lock().expect("backoff lock").not_before;
                if not_before.is_some_and(|t| tokio::time::Instant::now() < t) {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionRefused,
                        "connect backoff",
                    ));
                }
                let dial = Dial {
                    backoff,
                    connected: false,
                };
                let host = uri.host().unwrap_or_default().to_owned();
                let port = uri.port_u16().unwrap_or(PORT);
                let stream = turmoil::net::TcpStream::connect((host.as_str(), port)).await?;
                dial.connected();
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        })))
}

/// The server's peer connector and the client library's connector in the simulation.
#[derive(Debug, Default, Clone, Copy)]
pub struct SimConnector;

impl PeerConnector for SimConnector {
    fn channel(&self, addr: &str) -> Result<Channel, String> {
        channel(addr)
    }
}

impl latchkey_client::ClientConnector for SimConnector {
    fn channel(&self, uri: &str, _config: &latchkey_client::ClientConfig) -> Channel {
        let addr = uri.strip_prefix("http://").unwrap_or(uri);
        channel(addr).expect("the client validated the endpoint")
    }
}
