//! TLS for clients and members (issue #13): the server's certificate and the client CA,
//! reloadable without a restart, the accept path that tells a client speaking the wrong protocol
//! so, and the mTLS connector members dial each other with.
//!
//! The accept is done here rather than by tonic's `ServerTlsConfig` for three reasons: the
//! certificate comes from a [`ResolvesServerCert`] whose key can be swapped (rotation) and the
//! acceptors are rebuilt when the CA changes, the first byte of a connection is peeked to answer
//! a plaintext client with an explanation instead of a handshake error it cannot read, and a
//! failed handshake must cost only that connection. A handshake refused for its client
//! certificate (none, or one the CA did not sign) is a refused client, counted and logged
//! rate-limited (`refusals.rs`); any other failure is logged at debug only (port scanners and
//! health checks would otherwise flood the log).
//!
//! A reloaded CA decides the handshakes that begin after it; a connection already open keeps
//! the client it verified (TLS does not verify again), until it closes. Members dial each other
//! the same way: each connection a member makes (a first one, or a redial after one dropped)
//! trusts the CA in use and presents the pair being served at that moment
//! ([`TlsPeerConnector`]).

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use hyper_util::rt::TokioIo;
use latchkey_core::limits;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::rustls;
use tokio_rustls::rustls::server::danger::ClientCertVerifier;
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::cluster::peer::PeerConnector;
use crate::observe::refusals::{Reason, Refusals};

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

/// A server's TLS: its current certificate (swappable), the acceptors built around it and the
/// client CA (rebuilt when the CA is reloaded), and the client configuration members dial each
/// other with.
pub struct ServerTls {
    files: TlsFiles,
    current: Arc<CurrentCert>,
    acceptors: RwLock<Acceptors>,
    /// The CA's certificates in PEM as last loaded, for dialing members.
    ca_pem: RwLock<Option<Vec<u8>>>,
    /// Modification times of the files when last loaded.
    loaded_mtimes: Mutex<Mtimes>,
}

/// gRPC's (ALPN `h2`) and the HTTP API's (ALPN `http/1.1`): one configuration otherwise, the
/// same certificate and client verification.
#[derive(Clone)]
struct Acceptors {
    grpc: TlsAcceptor,
    http: TlsAcceptor,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Mtimes {
    cert: Option<SystemTime>,
    key: Option<SystemTime>,
    ca: Option<SystemTime>,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// The certificate and key being served, and the key's PEM (a member presents the same pair as
/// its client identity when it dials another).
struct Pair {
    certified: Arc<CertifiedKey>,
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
    if let Err(webpki::Error::UnsupportedCertVersion) = webpki::EndEntityCert::try_from(&chain[0]) {
        return Err(format!(
            "the certificate {} is an X.509 version 1 certificate, which TLS (rustls) refuses: \
             issue a version 3 one (with openssl, give `x509 -req` an `-extfile` with a \
             subjectAltName)",
            files.cert.display()
        ));
    }
    let certified = CertifiedKey::from_der(chain, key, &provider()).map_err(|e| {
        format!(
            "the key {} does not fit the certificate {}: {e}",
            files.key.display(),
            files.cert.display()
        )
    })?;
    Ok(Pair {
        certified: Arc::new(certified),
        key_pem,
    })
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl Mtimes {
    fn of(files: &TlsFiles) -> Mtimes {
        Mtimes {
            cert: mtime(&files.cert),
            key: mtime(&files.key),
            ca: files.ca.as_deref().and_then(mtime),
        }
    }
}

/// Reads the CA file: the verifier that requires a client certificate it signed, and its PEM.
fn load_ca(ca: &Path) -> Result<(Arc<dyn ClientCertVerifier>, Vec<u8>), String> {
    let pem = read_pem("CA", ca)?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs("CA", ca, &pem)? {
        roots
            .add(cert)
            .map_err(|e| format!("the CA file {}: {e}", ca.display()))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| format!("the CA file {}: {e}", ca.display()))?;
    Ok((verifier, pem))
}

/// The acceptors serving `current`'s pair, verifying clients with `verifier` if given. Each
/// build starts with an empty session cache, so that a session verified under a CA that is
/// gone cannot be resumed without a new handshake.
fn build_acceptors(
    current: &Arc<CurrentCert>,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
) -> Result<Acceptors, String> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match verifier {
        None => builder.with_no_client_auth(),
        Some(verifier) => builder.with_client_cert_verifier(verifier),
    };
    let mut config = builder.with_cert_resolver(current.clone());
    let mut http_config = config.clone();
    // gRPC is HTTP/2 only; the HTTP API (`http.rs`) is served over HTTP/1.1.
    config.alpn_protocols = vec![b"h2".to_vec()];
    http_config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Acceptors {
        grpc: TlsAcceptor::from(Arc::new(config)),
        http: TlsAcceptor::from(Arc::new(http_config)),
    })
}

impl ServerTls {
    /// Loads and checks the files; the error says which file is wrong and how.
    pub fn load(files: TlsFiles) -> Result<Arc<ServerTls>, String> {
        let mtimes = Mtimes::of(&files);
        let pair = load_pair(&files)?;
        let (verifier, ca_pem) = match &files.ca {
            None => (None, None),
            Some(ca) => {
                let (verifier, pem) = load_ca(ca)?;
                (Some(verifier), Some(pem))
            }
        };
        let current = Arc::new(CurrentCert(RwLock::new(pair)));
        let acceptors = build_acceptors(&current, verifier)?;
        Ok(Arc::new(ServerTls {
            files,
            current,
            acceptors: RwLock::new(acceptors),
            ca_pem: RwLock::new(ca_pem),
            loaded_mtimes: Mutex::new(mtimes),
        }))
    }

    /// The acceptor for `served` in force now.
    fn acceptor(&self, served: Served) -> TlsAcceptor {
        let acceptors = self.acceptors.read().expect("acceptors lock poisoned");
        match served {
            Served::Grpc => acceptors.grpc.clone(),
            Served::Http => acceptors.http.clone(),
        }
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
            .map(crate::certificate::cert_names)
            .unwrap_or_default()
    }

    /// Whether connections must present a certificate signed by the CA.
    pub fn requires_client_certs(&self) -> bool {
        self.files.ca.is_some()
    }

    /// Reads the certificate and key again and serves them to new connections. A pair that does
    /// not load is refused and the one being served is kept (the error says why).
    pub fn reload(&self) -> Result<(), String> {
        let (cert, key) = (mtime(&self.files.cert), mtime(&self.files.key));
        let result = load_pair(&self.files).map(|pair| {
            *self.current.0.write().expect("certificate lock poisoned") = pair;
        });
        // A refused pair is not retried until the files change again.
        let mut loaded = self.loaded_mtimes.lock().expect("mtime lock poisoned");
        (loaded.cert, loaded.key) = (cert, key);
        result
    }

    /// Reads the CA file again and verifies the clients of new connections with it (open ones
    /// keep the client they verified). A CA that does not load is refused and the one in use is
    /// kept (the error says why). `Ok(false)`: there is no CA (`--tls-ca`) to reload.
    pub fn reload_ca(&self) -> Result<bool, String> {
        let Some(ca) = &self.files.ca else {
            return Ok(false);
        };
        let before = mtime(ca);
        let result = load_ca(ca).and_then(|(verifier, pem)| {
            let acceptors = build_acceptors(&self.current, Some(verifier))?;
            *self.acceptors.write().expect("acceptors lock poisoned") = acceptors;
            *self.ca_pem.write().expect("CA lock poisoned") = Some(pem);
            Ok(true)
        });
        self.loaded_mtimes.lock().expect("mtime lock poisoned").ca = before;
        result
    }

    /// Reloads, logged, what changed since the last load: the pair if its files did, the CA if
    /// its file did.
    pub(crate) fn reload_if_changed(&self) {
        let (now, loaded) = (
            Mtimes::of(&self.files),
            *self.loaded_mtimes.lock().expect("mtime lock poisoned"),
        );
        if (now.cert, now.key) != (loaded.cert, loaded.key) {
            self.reload_pair_logged("the certificate files changed");
        }
        if now.ca != loaded.ca {
            self.reload_ca_logged("the CA file changed");
        }
    }

    /// Reloads the pair and the CA, and logs the outcome; `why` says what asked for it.
    pub fn reload_logged(&self, why: &str) {
        self.reload_pair_logged(why);
        self.reload_ca_logged(why);
    }

    fn reload_pair_logged(&self, why: &str) {
        match self.reload() {
            Ok(()) => tracing::info!(
                cert = %self.files.cert.display(),
                "{why}: reloaded the TLS certificate"
            ),
            Err(e) => tracing::error!("{why}: keeping the TLS certificate in use: {e}"),
        }
    }

    fn reload_ca_logged(&self, why: &str) {
        match self.reload_ca() {
            Ok(false) => {}
            Ok(true) => tracing::info!(
                ca = %self.files.ca.as_deref().unwrap_or(Path::new("")).display(),
                "{why}: reloaded the client CA (new connections are verified with it; open ones \
                 keep theirs)"
            ),
            Err(e) => tracing::error!("{why}: keeping the client CA in use: {e}"),
        }
    }

    /// The client TLS of one connection of a member dialing another, made when it connects: the
    /// CA in use now, and this member's pair being served now as its identity.
    fn dial_config(&self) -> Result<rustls::ClientConfig, String> {
        self.dial_config_for(b"h2")
    }

    /// The client TLS of a follower forwarding an HTTP request to its leader's HTTP port
    /// (`api/http/forward.rs`): as [`ServerTls::dial_config`], over HTTP/1.1. The member's
    /// certificate only opens the connection (the leader's listener requires one with
    /// `--tls-ca`); the caller is known to the leader by its own bearer token, which wins over
    /// any certificate, so this member's certificate is never taken for the caller.
    pub fn http_dial_config(&self) -> Result<rustls::ClientConfig, String> {
        self.dial_config_for(b"http/1.1")
    }

    fn dial_config_for(&self, alpn: &[u8]) -> Result<rustls::ClientConfig, String> {
        let ca = self.ca_pem.read().expect("CA lock poisoned").clone();
        let ca = ca.ok_or("members dial each other over TLS only with --tls-ca")?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&ca) {
            let cert = cert.map_err(|e| format!("the CA: {e}"))?;
            roots.add(cert).map_err(|e| format!("the CA: {e}"))?;
        }
        let (chain, key) = {
            let pair = self.current.0.read().expect("certificate lock poisoned");
            let key = PrivateKeyDer::from_pem_slice(&pair.key_pem)
                .map_err(|e| format!("this member's key: {e}"))?;
            (pair.certified.cert.clone(), key)
        };
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| format!("this member's certificate: {e}"))?;
        config.alpn_protocols = vec![alpn.to_vec()];
        Ok(config)
    }
}

/// Dials members over TLS, verifying them against the CA and presenting this member's
/// certificate (mTLS). The handshake is done here rather than by tonic's `ClientTlsConfig`,
/// which fixes the CA and the pair when the channel is made: a channel lives as long as the
/// member's membership and redials with what it was made with, so a reloaded CA or a rotated
/// pair would never reach it. Each connection takes the CA and the pair in force when it is
/// made.
pub struct TlsPeerConnector(pub Arc<ServerTls>);

impl PeerConnector for TlsPeerConnector {
    fn channel(&self, addr: &str) -> Result<Channel, String> {
        if !self.0.requires_client_certs() {
            return Err("members dial each other over TLS only with --tls-ca".into());
        }
        // `http://`: tonic must not add a TLS layer of its own; the connector below is the TLS.
        let endpoint =
            Endpoint::from_shared(format!("http://{addr}")).map_err(|e| e.to_string())?;
        let host = endpoint.uri().host().ok_or("no host")?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let name = rustls_pki_types::ServerName::try_from(host)
            .map_err(|e| format!("{addr}: not a host name or address to verify: {e}"))?;
        let tls = self.0.clone();
        let dial = tower::service_fn(move |uri: Uri| {
            let (tls, name) = (tls.clone(), name.clone());
            async move {
                let config = tls.dial_config().map_err(std::io::Error::other)?;
                let authority = uri.authority().map(|a| a.as_str().to_owned());
                let authority = authority.ok_or_else(|| std::io::Error::other("no address"))?;
                let tcp = TcpStream::connect(authority).await?;
                tcp.set_nodelay(true)?;
                let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
                    .connect(name, tcp)
                    .await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        });
        Ok(crate::cluster::peer::peer_endpoint(endpoint).connect_with_connector_lazy(dial))
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

/// Why a failed handshake refused its client, if for its certificate: none where the CA requires
/// one, or one the CA's verifier refused.
fn certificate_refusal(e: &std::io::Error) -> Option<Reason> {
    match e.get_ref()?.downcast_ref::<rustls::Error>()? {
        rustls::Error::NoCertificatesPresented => Some(Reason::NoCertificate),
        rustls::Error::InvalidCertificate(_) => Some(Reason::BadCertificate),
        _ => None,
    }
}

/// A TLS port: a plaintext client is told to use TLS; a failed handshake drops that connection
/// only, reported to `refusals` when it refused the client's certificate, else logged at debug.
pub(crate) async fn tls_handshake(
    tls: Arc<ServerTls>,
    served: Served,
    refusals: Arc<Refusals>,
    stream: TcpStream,
    from: SocketAddr,
) -> Option<TlsStream<TcpStream>> {
    let refusal = match served {
        Served::Grpc => plaintext_refusal as fn() -> Vec<u8>,
        Served::Http => http_plaintext_refusal as fn() -> Vec<u8>,
    };
    match first_byte(&stream).await {
        Some(TLS_HANDSHAKE_RECORD) => {
            match tls.acceptor(served).accept(stream).into_fallible().await {
                Ok(stream) => Some(stream),
                Err((e, stream)) => {
                    match certificate_refusal(&e) {
                        Some(reason) => refusals.refused(
                            Some(from),
                            reason,
                            &format_args!("TLS handshake: {e}"),
                        ),
                        None => tracing::debug!(%from, "TLS handshake failed: {e}"),
                    }
                    // rustls has written its alert; let the client read it.
                    linger(stream).await;
                    None
                }
            }
        }
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

    /// Issue #33: a version-1 certificate was refused as "the key does not fit the certificate:
    /// ... UnsupportedCertVersion".
    #[test]
    fn a_version_1_certificate_is_named_as_such() {
        let fixtures =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../client/fixtures/tls");
        let said = ServerTls::load(TlsFiles {
            cert: fixtures.join("v1.pem"),
            key: fixtures.join("v1.key"),
            ca: None,
        })
        .unwrap_err();
        assert!(said.contains("X.509 version 1 certificate"), "{said}");
        assert!(!said.contains("does not fit"), "{said}");
    }
}
