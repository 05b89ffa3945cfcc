//! The HTTP API's connections: what a connection tells of its client ([`HttpPeer`]), and the
//! listener axum serves, fed by `tls::accept_loop` (handshake done), which holds each
//! connection to one of `HTTP_CONNECTIONS_MAX` slots and closes it once idle for
//! `HTTP_IDLE_TIMEOUT_MS`.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use latchkey_core::limits;
use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// What a connection presented: the client certificate chain of its TLS session, if any, and
/// its address.
#[derive(Debug, Clone)]
pub(crate) struct HttpPeer {
    pub(super) certs: Option<Arc<[CertificateDer<'static>]>>,
    pub(super) addr: Option<SocketAddr>,
}

/// A connection the HTTP API serves: what it tells about its client.
pub(super) trait HttpConnection: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    fn peer(&self) -> HttpPeer;
}

impl HttpConnection for TcpStream {
    fn peer(&self) -> HttpPeer {
        HttpPeer {
            certs: None,
            addr: self.peer_addr().ok(),
        }
    }
}

impl HttpConnection for tokio_rustls::server::TlsStream<TcpStream> {
    fn peer(&self) -> HttpPeer {
        let (tcp, tls) = self.get_ref();
        HttpPeer {
            certs: tls.peer_certificates().map(Arc::from),
            addr: tcp.peer_addr().ok(),
        }
    }
}

/// A served connection holding one of the `HTTP_CONNECTIONS_MAX` slots until it is dropped, and
/// failing (so that hyper closes it) once it was idle, nothing read or written, for
/// `HTTP_IDLE_TIMEOUT_MS`.
pub(super) struct Counted<IO> {
    io: IO,
    idle: Pin<Box<tokio::time::Sleep>>,
    _slot: OwnedSemaphorePermit,
}

impl<IO> Counted<IO> {
    fn new(io: IO, slot: OwnedSemaphorePermit) -> Counted<IO> {
        Counted {
            io,
            idle: Box::pin(tokio::time::sleep(IDLE)),
            _slot: slot,
        }
    }

    /// After an I/O call: progress restarts the idle clock; no progress fails the connection
    /// once the clock ran out (polling it also arms the wake-up for that moment).
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        match polled {
            Poll::Pending => match self.idle.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "HTTP API connection idle too long",
                ))),
                Poll::Pending => Poll::Pending,
            },
            ready => {
                self.idle.as_mut().reset(tokio::time::Instant::now() + IDLE);
                ready
            }
        }
    }
}

const IDLE: std::time::Duration = std::time::Duration::from_millis(limits::HTTP_IDLE_TIMEOUT_MS);

impl<IO: AsyncRead + Unpin> AsyncRead for Counted<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        self.watch(cx, polled)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Counted<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// The connections `tls::accept_loop` hands over (handshake done), as axum's listener.
pub(super) struct HttpListener<IO> {
    pub(super) incoming: mpsc::Receiver<std::io::Result<IO>>,
    pub(super) slots: Arc<Semaphore>,
}

impl<IO: HttpConnection> Listener for HttpListener<IO> {
    type Io = Counted<IO>;
    type Addr = HttpPeer;

    async fn accept(&mut self) -> (Counted<IO>, HttpPeer) {
        loop {
            let slot = self
                .slots
                .clone()
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            match self.incoming.recv().await {
                Some(Ok(io)) => {
                    let peer = io.peer();
                    return (Counted::new(io, slot), peer);
                }
                Some(Err(e)) => {
                    // EMFILE and the like: back off a little rather than spin (axum's own loop
                    // does the same).
                    tracing::warn!(error = %e, "HTTP API: accepting a connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                // The accept loop ended: only graceful shutdown is left to do.
                None => std::future::pending().await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<HttpPeer> {
        Ok(HttpPeer {
            certs: None,
            addr: None,
        })
    }
}

impl<IO: HttpConnection> Connected<IncomingStream<'_, HttpListener<IO>>> for HttpPeer {
    fn connect_info(stream: IncomingStream<'_, HttpListener<IO>>) -> HttpPeer {
        stream.remote_addr().clone()
    }
}

pub(super) fn local(listener: &TcpListener) -> String {
    listener
        .local_addr()
        .map(|a: SocketAddr| a.to_string())
        .unwrap_or_else(|e| format!("? ({e})"))
}
