//! turmoil's simulated TCP, plugged into tonic on both sides.
//!
//! - [`incoming`]: the accepted connections of a turmoil listener, as the stream
//!   `latchkey_server::run_with` serves.
//! - [`channel`] / [`SimConnector`]: lazily connected tonic channels that dial turmoil TCP, for
//!   the servers' peer traffic and for the client library. Every
//!   channel has HTTP/2 keepalives: turmoil's TCP does not retransmit, so a partition can eat a
//!   segment and wedge a connection that never errors; the keepalive notices and reconnects.

use std::pin::Pin;
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

/// A lazily connected channel to `addr` (`host:port`) over turmoil TCP.
pub fn channel(addr: &str) -> Result<Channel, String> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}")).map_err(|e| e.to_string())?;
    Ok(endpoint
        .connect_timeout(Duration::from_millis(500))
        .http2_keep_alive_interval(Duration::from_millis(500))
        .keep_alive_timeout(Duration::from_millis(500))
        .keep_alive_while_idle(true)
        .connect_with_connector_lazy(tower::service_fn(|uri: Uri| async move {
            let host = uri.host().unwrap_or_default().to_owned();
            let port = uri.port_u16().unwrap_or(PORT);
            let stream = turmoil::net::TcpStream::connect((host.as_str(), port)).await?;
            Ok::<_, std::io::Error>(TokioIo::new(stream))
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
