//! A tiny fenced key-value service over HTTP/1.1, std only: the resource side of the fencing
//! story, small enough to read in one sitting. The `fenced_kv` example (`main.rs` beside this
//! file) wraps [`run`].
//!
//! An example, not part of the `latchkey-fence` library: a resource embeds the gate, not this
//! server. The tests that need a fenced resource (`crates/fence/tests/http.rs`, the CLI's
//! `fencing_cli.rs`, the client's pause scenario) compile this very file: the fence crate's test
//! by `#[path]`, the others as `latchkey_testkit::fenced_kv`.
//!
//! - `GET /kv/KEY` answers 200 with the value, or 404.
//! - `PUT /kv/KEY` with headers [`LOCK_HEADER`] and [`TOKEN_HEADER`] and the value as body
//!   answers 200 when the gate admits the token, 409 naming the highest token when it is stale
//!   (also in the [`HIGHEST_HEADER`] response header), and 400 when a header is missing or bad.
//!
//! Which lock guards which key is the resource's decision, not the writer's: otherwise a stale
//! holder could sidestep its fence by naming a lock nobody uses. This service binds each key to
//! the lock of its first write and refuses writes under any other lock (409). The binding lives
//! in memory with the values; the gate's tokens may be durable.
//!
//! One request per connection (`Connection: close`), one thread per connection, bounded by
//! [`ServerConfig::connections_max`], with an I/O timeout: simple, and enough for an example.
//! No chunked bodies: a write must send `Content-Length`.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use latchkey_fence::{
    parse_token, FenceError, FenceGate, HIGHEST_HEADER, LOCK_HEADER, TOKEN_HEADER,
};

/// Every bound of this service, with the reason for its value (the gate's own bounds are in
/// `latchkey_fence::limits`).
pub mod limits {
    use std::time::Duration;

    use latchkey_fence::limits::LOCK_NAME_BYTES_MAX;

    /// Bytes of an HTTP request line plus headers. 8 KiB is what most servers accept; a lock
    /// name header (512 bytes) and a token fit many times over.
    pub const HTTP_HEAD_BYTES_MAX: usize = 8 * 1024;
    const _: () = assert!(LOCK_NAME_BYTES_MAX * 4 <= HTTP_HEAD_BYTES_MAX);
    /// Headers in one request; more is an attack or a bug, not a client of a key-value store.
    pub const HTTP_HEADERS_MAX: usize = 64;
    /// Bytes of a request body (one value).
    pub const HTTP_BODY_BYTES_MAX: usize = 64 * 1024;
    /// Bytes of a refused request the service still reads (and discards) before closing, so the
    /// client sees the error response instead of a connection reset: one whole request.
    pub const HTTP_DRAIN_BYTES_MAX: usize = HTTP_HEAD_BYTES_MAX + HTTP_BODY_BYTES_MAX;
    /// Bytes of a key (the path after `/kv/`).
    pub const KV_KEY_BYTES_MAX: usize = 256;
    /// Keys the service stores.
    pub const KV_KEYS_MAX: usize = 10_000;
    /// Connections served at once; each is a thread, so this bounds threads. Beyond it the
    /// service answers 503 at once instead of queueing.
    pub const HTTP_CONNECTIONS_MAX: usize = 64;
    /// A connection that sends or receives nothing for this long is closed, so a stuck client
    /// cannot hold a thread (or delay shutdown) for longer.
    pub const HTTP_IO_TIMEOUT: Duration = Duration::from_secs(10);
}

/// Locks a mutex whether or not an earlier holder panicked: the store's maps are consistent at
/// every point a panic can occur, so poisoning carries no information we need.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Why a write to the store was refused.
#[derive(Debug, thiserror::Error)]
pub enum PutError {
    #[error(transparent)]
    Fence(#[from] FenceError),
    #[error("key {key:?} is guarded by lock {guarded_by:?}, not by lock {lock:?}")]
    WrongLock {
        key: String,
        lock: String,
        guarded_by: String,
    },
    #[error("the store already holds its maximum of {max} keys")]
    TooManyKeys { max: usize },
    #[error("a key is 1 to {max} bytes of letters, digits and . _ ~ -")]
    InvalidKey { max: usize },
}

/// The store behind the service: values, the lock guarding each key, and the gate.
pub struct FencedKv<G> {
    gate: G,
    state: Mutex<KvState>,
    keys_max: usize,
}

#[derive(Default)]
struct KvState {
    values: HashMap<String, Vec<u8>>,
    guarded_by: HashMap<String, String>,
}

impl<G: FenceGate> FencedKv<G> {
    /// A store of at most `keys_max` keys (clamped to `1..=`[`limits::KV_KEYS_MAX`]).
    pub fn new(gate: G, keys_max: usize) -> Self {
        FencedKv {
            gate,
            state: Mutex::new(KvState::default()),
            keys_max: keys_max.clamp(1, limits::KV_KEYS_MAX),
        }
    }

    pub fn gate(&self) -> &G {
        &self.gate
    }

    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        lock(&self.state).values.get(key).cloned()
    }

    /// Writes `value` under `key` if `token` is admitted for `lock`, the lock guarding `key`.
    pub fn put(
        &self,
        key: &str,
        lock_name: &str,
        token: u64,
        value: Vec<u8>,
    ) -> Result<(), PutError> {
        validate_key(key)?;
        // Checked before admission too, so that a write aimed at the wrong lock does not raise
        // that lock's highest token.
        self.check_guard(&lock(&self.state), key, lock_name)?;
        self.gate.admit_then(lock_name, token, || {
            let mut state = lock(&self.state);
            // Again under the data lock: another lock may have claimed the key meanwhile.
            self.check_guard(&state, key, lock_name)?;
            if !state.values.contains_key(key) {
                if state.values.len() >= self.keys_max {
                    return Err(PutError::TooManyKeys { max: self.keys_max });
                }
                state
                    .guarded_by
                    .insert(key.to_owned(), lock_name.to_owned());
            }
            state.values.insert(key.to_owned(), value);
            Ok(())
        })?
    }

    fn check_guard(&self, state: &KvState, key: &str, lock_name: &str) -> Result<(), PutError> {
        match state.guarded_by.get(key) {
            Some(guard) if guard != lock_name => Err(PutError::WrongLock {
                key: key.to_owned(),
                lock: lock_name.to_owned(),
                guarded_by: guard.clone(),
            }),
            _ => Ok(()),
        }
    }
}

fn validate_key(key: &str) -> Result<(), PutError> {
    let ok = !key.is_empty()
        && key.len() <= limits::KV_KEY_BYTES_MAX
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(PutError::InvalidKey {
            max: limits::KV_KEY_BYTES_MAX,
        })
    }
}

/// One write attempt, as reported to `run`'s `on_write`.
#[derive(Debug, Clone, Copy)]
pub struct WriteEvent<'a> {
    pub key: &'a str,
    pub lock: Option<&'a str>,
    pub token: Option<u64>,
    /// The HTTP status answered: 200 accepted, anything else rejected.
    pub status: u16,
    pub message: &'a str,
}

impl WriteEvent<'_> {
    pub fn accepted(&self) -> bool {
        self.status == 200
    }
}

impl fmt::Display for WriteEvent<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.accepted() {
            "ACCEPTED"
        } else {
            "REJECTED"
        };
        write!(f, "{verdict} {} PUT /kv/{}", self.status, self.key)?;
        if let Some(lock) = self.lock {
            write!(f, " lock={lock:?}")?;
        }
        if let Some(token) = self.token {
            write!(f, " token={token}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Settings of the service; `Default` uses the bounds in [`limits`].
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub connections_max: usize,
    pub io_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            connections_max: limits::HTTP_CONNECTIONS_MAX,
            io_timeout: limits::HTTP_IO_TIMEOUT,
        }
    }
}

/// Stops [`run`]: it sets a flag and then connects to the listener to wake the blocked
/// `accept`, since std offers no other way to interrupt it.
#[derive(Clone)]
pub struct Shutdown {
    inner: Arc<ShutdownInner>,
}

struct ShutdownInner {
    stop: AtomicBool,
    wake: SocketAddr,
}

impl Shutdown {
    pub fn new(listener: &TcpListener) -> io::Result<Self> {
        let mut wake = listener.local_addr()?;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        Ok(Shutdown {
            inner: Arc::new(ShutdownInner {
                stop: AtomicBool::new(false),
                wake,
            }),
        })
    }

    pub fn trigger(&self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        // If this fails the listener is already gone, which stops `run` as well.
        let _ = TcpStream::connect(self.inner.wake);
    }

    fn is_triggered(&self) -> bool {
        self.inner.stop.load(Ordering::SeqCst)
    }
}

/// Serves the store on `listener` until `shutdown` is triggered, then waits for the
/// connections in progress (each ends within `io_timeout`). `on_write` sees every write
/// attempt, accepted or not.
pub fn run<G: FenceGate>(
    listener: TcpListener,
    kv: &FencedKv<G>,
    config: &ServerConfig,
    shutdown: &Shutdown,
    on_write: &(dyn Fn(&WriteEvent<'_>) + Sync),
) -> io::Result<()> {
    let active = AtomicUsize::new(0);
    // Scoped threads: every connection thread is joined before `run` returns.
    std::thread::scope(|scope| loop {
        let accepted = listener.accept();
        if shutdown.is_triggered() {
            return Ok(());
        }
        let mut stream = match accepted {
            Ok((stream, _)) => stream,
            // The peer gave up before we accepted; nothing to serve.
            Err(e) if is_transient(&e) => continue,
            Err(e) => return Err(e),
        };
        // A response is one small write; without TCP_NODELAY it can wait ~40 ms for the
        // client's delayed ACK.
        let _ = stream.set_nodelay(true);
        let _ = stream.set_read_timeout(Some(config.io_timeout));
        let _ = stream.set_write_timeout(Some(config.io_timeout));
        // Only this thread increments, so the check and the increment cannot race.
        if active.load(Ordering::SeqCst) >= config.connections_max {
            let busy = Response::text(503, "too many connections; retry\n");
            let _ = busy.write_to(&mut stream);
            continue;
        }
        active.fetch_add(1, Ordering::SeqCst);
        let active = &active;
        scope.spawn(move || {
            serve_connection(stream, kv, on_write);
            active.fetch_sub(1, Ordering::SeqCst);
        });
    })
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

fn serve_connection<G: FenceGate>(
    mut stream: TcpStream,
    kv: &FencedKv<G>,
    on_write: &(dyn Fn(&WriteEvent<'_>) + Sync),
) {
    let response = match read_request(&mut stream) {
        Ok(request) => handle(kv, request, on_write),
        Err(ReadError::Http(response)) => response,
        // Closed or timed out: nobody is listening for an answer.
        Err(ReadError::Io) => return,
    };
    // The client may have gone; there is nobody to tell.
    let _ = response.write_to(&mut stream);
    let _ = stream.flush();
    // Lingering close: closing a socket with unread input makes the kernel send a reset, which
    // can destroy the response before the client reads it (e.g. a 431 for an oversized head).
    // So signal the end of the response, then discard what the client still sends, bounded in
    // bytes here and in time by the read timeout.
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = io::copy(
        &mut (&stream).take(limits::HTTP_DRAIN_BYTES_MAX as u64),
        &mut io::sink(),
    );
}

struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    /// The value of header `name`, refusing duplicates: two tokens in one request are ambiguous.
    fn header_once(&self, name: &str) -> Result<Option<&str>, Response> {
        let mut values = self
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str());
        let first = values.next();
        if values.next().is_some() {
            return Err(Response::text(
                400,
                format!("more than one {name} header\n"),
            ));
        }
        Ok(first)
    }
}

enum ReadError {
    /// Answer this and close.
    Http(Response),
    /// The connection failed, closed or timed out.
    Io,
}

impl From<io::Error> for ReadError {
    fn from(_: io::Error) -> Self {
        ReadError::Io
    }
}

fn bad(status: u16, message: impl Into<String>) -> ReadError {
    ReadError::Http(Response::text(status, message))
}

fn read_request(stream: &mut impl Read) -> Result<Request, ReadError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buf.len() > limits::HTTP_HEAD_BYTES_MAX {
            break usize::MAX;
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(ReadError::Io);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    if head_end > limits::HTTP_HEAD_BYTES_MAX {
        return Err(bad(
            431,
            format!(
                "request line and headers exceed {} bytes\n",
                limits::HTTP_HEAD_BYTES_MAX
            ),
        ));
    }
    let head = std::str::from_utf8(&buf[..head_end])
        .map_err(|_| bad(400, "request head is not UTF-8\n"))?;
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(path), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad(400, "malformed request line\n"));
    };
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(bad(505, "only HTTP/1.0 and HTTP/1.1 are supported\n"));
    }
    let mut headers = Vec::new();
    for line in lines {
        if headers.len() == limits::HTTP_HEADERS_MAX {
            return Err(bad(
                431,
                format!("more than {} headers\n", limits::HTTP_HEADERS_MAX),
            ));
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(bad(400, "malformed header line\n"));
        };
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_whitespace()) {
            return Err(bad(400, "malformed header name\n"));
        }
        headers.push((name.to_owned(), value.trim_matches([' ', '\t']).to_owned()));
    }
    let mut request = Request {
        method: method.to_owned(),
        path: path.to_owned(),
        headers,
        body: Vec::new(),
    };
    if request
        .header_once("transfer-encoding")
        .map_err(ReadError::Http)?
        .is_some()
    {
        return Err(bad(
            501,
            "chunked bodies are not supported; send Content-Length\n",
        ));
    }
    let body_len = match request
        .header_once("content-length")
        .map_err(ReadError::Http)?
    {
        None => 0,
        Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => {
            v.parse::<usize>().unwrap_or(usize::MAX)
        }
        Some(_) => return Err(bad(400, "malformed Content-Length\n")),
    };
    if body_len > limits::HTTP_BODY_BYTES_MAX {
        return Err(bad(
            413,
            format!("body exceeds {} bytes\n", limits::HTTP_BODY_BYTES_MAX),
        ));
    }
    // Bytes after the head that arrived with it; anything past the body is ignored, since the
    // connection closes after one request.
    let mut body: Vec<u8> = buf[head_end + 4..].iter().copied().take(body_len).collect();
    let missing = body_len - body.len();
    stream.take(missing as u64).read_to_end(&mut body)?;
    if body.len() != body_len {
        return Err(ReadError::Io);
    }
    request.body = body;
    Ok(request)
}

fn handle<G: FenceGate>(
    kv: &FencedKv<G>,
    request: Request,
    on_write: &(dyn Fn(&WriteEvent<'_>) + Sync),
) -> Response {
    let Some(key) = request.path.strip_prefix("/kv/") else {
        return Response::text(404, "not found: the only resource is /kv/KEY\n");
    };
    match request.method.as_str() {
        "GET" => {
            if validate_key(key).is_err() {
                return Response::text(
                    400,
                    format!(
                        "{}\n",
                        PutError::InvalidKey {
                            max: limits::KV_KEY_BYTES_MAX
                        }
                    ),
                );
            }
            match kv.get(key) {
                Some(value) => Response {
                    status: 200,
                    headers: Vec::new(),
                    content_type: "application/octet-stream",
                    body: value,
                },
                None => Response::text(404, format!("no value for key {key:?}\n")),
            }
        }
        "PUT" => {
            let key = key.to_owned();
            put(kv, &key, request, on_write)
        }
        _ => {
            let mut r = Response::text(405, "only GET and PUT are supported\n");
            r.headers.push(("allow", "GET, PUT".to_owned()));
            r
        }
    }
}

fn put<G: FenceGate>(
    kv: &FencedKv<G>,
    key: &str,
    mut request: Request,
    on_write: &(dyn Fn(&WriteEvent<'_>) + Sync),
) -> Response {
    let lock_name = request.header_once(LOCK_HEADER);
    let token = request.header_once(TOKEN_HEADER);
    let (lock_name, token) = match (lock_name, token) {
        (Ok(l), Ok(t)) => (l.map(str::to_owned), t.map(parse_token)),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    let mut extra = Vec::new();
    let (status, message) = match (&lock_name, &token) {
        (None, _) => (400, format!("missing {LOCK_HEADER} header")),
        (_, None) => (400, format!("missing {TOKEN_HEADER} header")),
        (_, Some(Err(e))) => (400, format!("bad {TOKEN_HEADER} header: {e}")),
        (Some(lock_name), Some(Ok(token))) => {
            let body = std::mem::take(&mut request.body);
            match kv.put(key, lock_name, *token, body) {
                Ok(()) => (
                    200,
                    format!("wrote key {key:?} under lock {lock_name:?} with token {token}"),
                ),
                Err(PutError::Fence(FenceError::Rejected(r))) => {
                    extra.push((HIGHEST_HEADER, r.highest.to_string()));
                    (409, r.to_string())
                }
                Err(e @ PutError::WrongLock { .. }) => (409, e.to_string()),
                Err(
                    e @ (PutError::InvalidKey { .. }
                    | PutError::Fence(FenceError::InvalidLockName(_))),
                ) => (400, e.to_string()),
                Err(
                    e @ (PutError::TooManyKeys { .. }
                    | PutError::Fence(FenceError::TooManyLocks { .. })),
                ) => (503, e.to_string()),
                Err(e @ PutError::Fence(FenceError::Storage(_))) => (500, e.to_string()),
            }
        }
    };
    on_write(&WriteEvent {
        key,
        lock: lock_name.as_deref(),
        token: token.and_then(Result::ok),
        status,
        message: &message,
    });
    let mut response = Response::text(status, format!("{message}\n"));
    response.headers.extend(extra);
    response
}

struct Response {
    status: u16,
    headers: Vec<(&'static str, String)>,
    content_type: &'static str,
    body: Vec<u8>,
}

impl Response {
    fn text(status: u16, body: impl Into<String>) -> Self {
        Response {
            status,
            headers: Vec::new(),
            content_type: "text/plain; charset=utf-8",
            body: body.into().into_bytes(),
        }
    }

    fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let mut head = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: {}\r\ncontent-length: {}\r\nconnection: close\r\n",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len()
        );
        for (name, value) in &self.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        w.write_all(head.as_bytes())?;
        w.write_all(&self.body)
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}
