//! TLS for clients and members (issue #13): the server's certificate, reloadable without a
//! restart, the accept path that tells a client speaking the wrong protocol so, and the mTLS
//! connector members dial each other with.
//!
//! The accept is done here rather than by tonic's `ServerTlsConfig` for three reasons: the
//! certificate comes from a [`ResolvesServerCert`] whose key can be swapped (rotation), the first
//! byte of a connection is peeked to answer a plaintext client with an explanation instead of a
//! handshake error it cannot read, and a failed handshake must cost only that connection (logged
//! at debug: port scanners and health checks would otherwise flood the log).

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use latchkey_core::limits;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::rustls;
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::peer::PeerConnector;

/// What a TLS client reads from a plaintext latchkey port, in place of a TLS record; a client
/// reports it (its TLS library calls it an invalid content type) as "the server does not speak
/// TLS".
pub const NOT_TLS_BANNER: &[u8] = b"latchkey: this server does not speak TLS: use http://\r\n";

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The PEM files a TLS server is configured with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA that signs members' and clients' certificates: with it, every connection must
    /// present a certificate it signed (mTLS).
    pub ca: Option<PathBuf>,
}

/// A server's TLS: its current certificate (swappable), the acceptor built around it, and the
/// client configuration members dial each other with.
pub struct ServerTls {
    files: TlsFiles,
    current: Arc<CurrentCert>,
    /// gRPC's (ALPN `h2`) and the HTTP API's (ALPN `http/1.1`): one configuration otherwise,
    /// the same certificate and client verification.
    acceptor: TlsAcceptor,
    http_acceptor: TlsAcceptor,
    /// The CA's certificates in PEM, for dialing members.
    ca_pem: Option<Vec<u8>>,
    /// Modification times of the cert and key files when last loaded.
    loaded_mtimes: std::sync::Mutex<(Option<SystemTime>, Option<SystemTime>)>,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// The certificate and key being served, and their PEM (a member presents the same pair as its
/// client identity when it dials another).
struct Pair {
    certified: Arc<CertifiedKey>,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

/// The [`ResolvesServerCert`] that serves whatever pair was loaded last.
struct CurrentCert(RwLock<Pair>);

impl fmt::Debug for CurrentCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CurrentCert")
    }
}

impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.0
                .read()
                .expect("certificate lock poisoned")
                .certified
                .clone(),
        )
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads a PEM file, bounded in size, naming the file in the error.
fn read_pem(what: &str, path: &Path) -> Result<Vec<u8>, String> {
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("cannot read the {what} file {}: {e}", path.display()))?;
    if meta.len() > limits::TLS_PEM_FILE_BYTES_MAX {
        return Err(format!(
            "the {what} file {} has {} bytes, more than a PEM file of certificates or a key \
             ({} at most)",
            path.display(),
            meta.len(),
            limits::TLS_PEM_FILE_BYTES_MAX
        ));
    }
    std::fs::read(path).map_err(|e| format!("cannot read the {what} file {}: {e}", path.display()))
}

fn certs(what: &str, path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the {what} file {} is not PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "the {what} file {} holds no certificate (expected -----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(certs)
}

/// Reads the certificate chain and key, and checks that they belong together.
fn load_pair(files: &TlsFiles) -> Result<Pair, String> {
    let cert_pem = read_pem("certificate", &files.cert)?;
    let key_pem = read_pem("key", &files.key)?;
    let chain = certs("certificate", &files.cert, &cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        format!(
            "the key file {} holds no private key in PEM: {e}",
            files.key.display()
        )
    })?;
    let certified = CertifiedKey::from_der(chain, key, &provider()).map_err(|e| {
        format!(
            "the key {} does not fit the certificate {}: {e}",
            files.key.display(),
            files.cert.display()
        )
    })?;
    Ok(Pair {
        certified: Arc::new(certified),
        cert_pem,
        key_pem,
    })
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl ServerTls {
    /// Loads and checks the files; the error says which file is wrong and how.
    pub fn load(files: TlsFiles) -> Result<Arc<ServerTls>, String> {
        let mtimes = (mtime(&files.cert), mtime(&files.key));
        let pair = load_pair(&files)?;
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?;
        let (builder, ca_pem) = match &files.ca {
            None => (builder.with_no_client_auth(), None),
            Some(ca) => {
                let pem = read_pem("CA", ca)?;
                let mut roots = rustls::RootCertStore::empty();
                for cert in certs("CA", ca, &pem)? {
                    roots
                        .add(cert)
                        .map_err(|e| format!("the CA file {}: {e}", ca.display()))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                        .build()
                        .map_err(|e| format!("the CA file {}: {e}", ca.display()))?;
                (builder.with_client_cert_verifier(verifier), Some(pem))
            }
        };
        let current = Arc::new(CurrentCert(RwLock::new(pair)));
        let mut config = builder.with_cert_resolver(current.clone());
        let mut http_config = config.clone();
        // gRPC is HTTP/2 only; the HTTP API (`http.rs`) is served over HTTP/1.1.
        config.alpn_protocols = vec![b"h2".to_vec()];
        http_config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(ServerTls {
            files,
            current,
            acceptor: TlsAcceptor::from(Arc::new(config)),
            http_acceptor: TlsAcceptor::from(Arc::new(http_config)),
            ca_pem,
            loaded_mtimes: std::sync::Mutex::new(mtimes),
        }))
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The names the certificate being served gives this node (subject CN, first DNS name).
    pub fn certificate_names(&self) -> Vec<String> {
        let pair = self.current.0.read().expect("certificate lock poisoned");
        pair.certified
            .cert
            .first()
            .map(crate::acl::cert_names)
            .unwrap_or_default()
    }

    /// Whether connections must present a certificate signed by the CA.
    pub fn requires_client_certs(&self) -> bool {
        self.ca_pem.is_some()
    }

    /// Reads the certificate and key again and serves them to new connections. A pair that does
    /// not load is refused and the one being served is kept (the error says why).
    pub fn reload(&self) -> Result<(), String> {
        let mtimes = (mtime(&self.files.cert), mtime(&self.files.key));
        let result = load_pair(&self.files).map(|pair| {
            *self.current.0.write().expect("certificate lock poisoned") = pair;
        });
        // A refused pair is not retried until the files change again.
        *self.loaded_mtimes.lock().expect("mtime lock poisoned") = mtimes;
        result
    }

    /// [`ServerTls::reload`], logged, if the files changed since the last load.
    fn reload_if_changed(&self) {
        let now = (mtime(&self.files.cert), mtime(&self.files.key));
        if *self.loaded_mtimes.lock().expect("mtime lock poisoned") == now {
            return;
        }
        self.reload_logged("the certificate files changed");
    }

    /// Reloads and logs the outcome; `why` says what asked for it.
    pub fn reload_logged(&self, why: &str) {
        match self.reload() {
            Ok(()) => tracing::info!(
                cert = %self.files.cert.display(),
                "{why}: reloaded the TLS certificate"
            ),
            Err(e) => tracing::error!("{why}: keeping the TLS certificate in use: {e}"),
        }
    }

    /// Polls the files' modification times until `stop` completes.
    pub(crate) async fn watch(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(Duration::from_millis(limits::TLS_RELOAD_POLL_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let tls = self.clone();
            // `stat` and the file reads block; keep them off the runtime's workers.
            let _ = tokio::task::spawn_blocking(move || tls.reload_if_changed()).await;
        }
    }

    /// The client TLS of a member dialing another: the CA, and this member's own pair as its
    /// identity.
    fn peer_client_config(&self) -> Result<ClientTlsConfig, String> {
        let ca = self
            .ca_pem
            .as_ref()
            .ok_or("members dial each other over TLS only with --tls-ca")?;
        let pair = self.current.0.read().expect("certificate lock poisoned");
        Ok(ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .identity(Identity::from_pem(&pair.cert_pem, &pair.key_pem)))
    }
}

/// Dials members with `https://`, verifying them against the CA and presenting this member's
/// certificate (mTLS). Each new channel takes the pair being served at that time.
pub struct TlsPeerConnector(pub Arc<ServerTls>);

impl PeerConnector for TlsPeerConnector {
    fn channel(&self, addr: &str) -> Result<Channel, String> {
        let tls = self.0.peer_client_config()?;
        let endpoint =
            Endpoint::from_shared(format!("https://{addr}")).map_err(|e| e.to_string())?;
        crate::peer::peer_endpoint(endpoint)
            .tls_config(tls)
            .map(|e| e.connect_lazy())
            .map_err(|e| format!("TLS configuration: {e}"))
    }
}

/// An HTTP/2 server preface (an empty SETTINGS frame) followed by a GOAWAY whose debug data
/// says what is wrong: an HTTP/2 client reports it as the connection's error. GOAWAY code
/// 0xc is INADEQUATE_SECURITY.
fn plaintext_refusal() -> Vec<u8> {
    let debug = latchkey_core::TLS_REQUIRED_MESSAGE.as_bytes();
    let mut out = vec![0, 0, 0, 4, 0, 0, 0, 0, 0];
    let len = 8 + debug.len() as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.extend_from_slice(&[7, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&0u32.to_be_bytes()); // last stream id: none processed
    out.extend_from_slice(&0xcu32.to_be_bytes());
    out.extend_from_slice(debug);
    out
}

/// Tells the peer why it is refused, then keeps reading (bounded) so that closing does not reset
/// the connection before it has read the explanation.
async fn refuse(mut stream: TcpStream, explanation: &[u8]) {
    if stream.write_all(explanation).await.is_err() {
        return;
    }
    linger(stream).await;
}

/// Closes our side, then reads what the peer still sends (bounded in time) before dropping the
/// socket: closing with unread bytes makes the kernel send a reset, and the peer may lose what
/// we wrote last (our explanation, or a TLS alert such as "certificate required", which TLS 1.3
/// clients read only after they have sent their first request).
async fn linger(mut stream: TcpStream) {
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(
        Duration::from_millis(limits::CONN_MISMATCH_LINGER_MS),
        async { while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {} },
    )
    .await;
}

/// The first byte the client sent, without consuming it; `None` when it closed or stayed silent.
async fn first_byte(stream: &TcpStream) -> Option<u8> {
    let mut byte = [0u8; 1];
    match stream.peek(&mut byte).await {
        Ok(1) => Some(byte[0]),
        _ => None,
    }
}

/// Accepts connections on `listener` until `out`'s receiver is dropped, sorting out the wrong
/// protocol and (with `tls`) doing the handshake, each connection in its own task: a slow or
/// silent one holds up nobody. Every accepted socket gets TCP_NODELAY: a gRPC response is one
/// small write, and with Nagle's algorithm on it waits for the client's delayed ACK (~40 ms on
/// Linux) whenever an earlier segment is unacknowledged.
pub(crate) async fn accept_loop<IO, F, Fut>(
    listener: TcpListener,
    out: mpsc::Sender<std::io::Result<IO>>,
    handshake: F,
) where
    IO: Send + 'static,
    F: Fn(TcpStream, SocketAddr) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Option<IO>> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limits::CONN_HANDSHAKES_IN_FLIGHT_MAX));
    loop {
        let slot = tokio::select! {
            () = out.closed() => return,
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
        };
        let accepted = tokio::select! {
            () = out.closed() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, from) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // EMFILE and the like: tonic's own loop would report it; pass it on and go on
                // accepting.
                if out.send(Err(e)).await.is_err() {
                    return;
                }
                continue;
            }
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY on an accepted connection");
        }
        let out = out.clone();
        let connection = handshake(stream, from);
        tokio::spawn(async move {
            let timeout = Duration::from_millis(limits::CONN_HANDSHAKE_TIMEOUT_MS);
            match tokio::time::timeout(timeout, connection).await {
                Ok(Some(io)) => {
                    let _ = out.send(Ok(io)).await;
                }
                Ok(None) => {}
                Err(_) => tracing::debug!(%from, "dropped a connection silent for {timeout:?}"),
            }
            drop(slot);
        });
    }
}

/// A plaintext port: a TLS client is told this server does not speak TLS.
pub(crate) async fn plaintext_handshake(stream: TcpStream, from: SocketAddr) -> Option<TcpStream> {
    match first_byte(&stream).await {
        Some(TLS_HANDSHAKE_RECORD) => {
            tracing::debug!(%from, "refused a TLS client on this plaintext port");
            refuse(stream, NOT_TLS_BANNER).await;
            None
        }
        Some(_) => Some(stream),
        None => None,
    }
}

/// What a TLS port serves: the protocol decides the ALPN offered and how a plaintext client is
/// told to use TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Served {
    /// gRPC (HTTP/2): clients and members on `--listen`.
    Grpc,
    /// The HTTP/JSON API (HTTP/1.1) on `--http-listen`.
    Http,
}

/// An HTTP/1.1 400 response with a JSON error body, what a plaintext client of the HTTP API's
/// TLS port reads (`curl` prints it).
fn http_plaintext_refusal() -> Vec<u8> {
    let body = serde_json::to_vec(&crate::error::ErrorBody {
        code: "tls-required",
        message: latchkey_core::TLS_REQUIRED_MESSAGE.to_owned(),
        leader_id: None,
        leader_addr: None,
        group: None,
    })
    .expect("an error body always encodes");
    let mut out = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// A TLS port: a plaintext client is told to use TLS; a failed handshake drops that connection
/// only, logged at debug.
pub(crate) async fn tls_handshake(
    tls: Arc<ServerTls>,
    served: Served,
    stream: TcpStream,
    from: SocketAddr,
) -> Option<TlsStream<TcpStream>> {
    let (acceptor, refusal) = match served {
        Served::Grpc => (&tls.acceptor, plaintext_refusal as fn() -> Vec<u8>),
        Served::Http => (
            &tls.http_acceptor,
            http_plaintext_refusal as fn() -> Vec<u8>,
        ),
    };
    match first_byte(&stream).await {
        Some(TLS_HANDSHAKE_RECORD) => match acceptor.accept(stream).into_fallible().await {
            Ok(stream) => Some(stream),
            Err((e, stream)) => {
                tracing::debug!(%from, "TLS handshake failed: {e}");
                // rustls has written its alert; let the client read it.
                linger(stream).await;
                None
            }
        },
        Some(_) => {
            tracing::debug!(%from, "refused a plaintext client on this TLS port");
            refuse(stream, &refusal()).await;
            None
        }
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_is_one_settings_and_one_goaway_frame() {
        let bytes = plaintext_refusal();
        // SETTINGS: empty, stream 0.
        assert_eq!(&bytes[..9], &[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        let goaway = &bytes[9..];
        let len = u32::from_be_bytes([0, goaway[0], goaway[1], goaway[2]]) as usize;
        assert_eq!(goaway[3], 7, "GOAWAY");
        assert_eq!(goaway.len(), 9 + len);
        assert!(goaway.ends_with(latchkey_core::TLS_REQUIRED_MESSAGE.as_bytes()));
    }

    #[test]
    fn missing_and_junk_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not pem").unwrap();
        let missing = ServerTls::load(TlsFiles {
            cert: dir.path().join("nope.pem"),
            key: junk.clone(),
            ca: None,
        })
        .unwrap_err();
        assert!(
            missing.contains("cannot read the certificate file"),
            "{missing}"
        );
        let bad = ServerTls::load(TlsFiles {
            cert: junk.clone(),
            key: junk.clone(),
            ca: None,
        })
        .unwrap_err();
        assert!(bad.contains("holds no certificate"), "{bad}");
    }
}
