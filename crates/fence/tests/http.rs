//! The fenced key-value example service (`examples/fenced_kv/service.rs`), served in-process on
//! port 0 and spoken to over raw TCP.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Mutex;

use fenced_kv::{limits, run, FencedKv, ServerConfig, Shutdown};
use latchkey_fence::{DurableConfig, DurableGate, FenceGate, MemoryGate};

// The example's service itself, not a copy (it is not part of the library).
#[path = "../examples/fenced_kv/service.rs"]
#[allow(dead_code)]
mod fenced_kv;

struct Reply {
    status: u16,
    head: String,
    body: String,
}

fn send(addr: SocketAddr, raw: &[u8]) -> Reply {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.write_all(raw).expect("send");
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).expect("read reply");
    let text = String::from_utf8(bytes).expect("utf-8 reply");
    let (head, body) = text.split_once("\r\n\r\n").expect("reply has a head");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    Reply {
        status,
        head: head.to_ascii_lowercase(),
        body: body.to_owned(),
    }
}

fn put(addr: SocketAddr, key: &str, lock: Option<&str>, token: Option<&str>, value: &str) -> Reply {
    let mut raw = format!(
        "PUT /kv/{key} HTTP/1.1\r\nhost: test\r\ncontent-length: {}\r\n",
        value.len()
    );
    if let Some(lock) = lock {
        raw.push_str(&format!("latchkey-lock: {lock}\r\n"));
    }
    if let Some(token) = token {
        raw.push_str(&format!("latchkey-token: {token}\r\n"));
    }
    raw.push_str("\r\n");
    raw.push_str(value);
    send(addr, raw.as_bytes())
}

fn get(addr: SocketAddr, key: &str) -> Reply {
    send(
        addr,
        format!("GET /kv/{key} HTTP/1.1\r\nhost: test\r\n\r\n").as_bytes(),
    )
}

struct StopOnDrop<'a>(&'a Shutdown);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.trigger();
    }
}

/// Serves `gate` on an ephemeral port while `client` runs, then shuts down and joins the server
/// (so a server that does not stop fails the test by hanging). Returns the write events.
fn with_server<G: FenceGate>(
    gate: G,
    client: impl FnOnce(SocketAddr),
) -> Vec<(u16, Option<u64>, String)> {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let shutdown = Shutdown::new(&listener).expect("shutdown handle");
    let kv = FencedKv::new(gate, limits::KV_KEYS_MAX);
    let events = Mutex::new(Vec::new());
    let on_write = |e: &fenced_kv::WriteEvent<'_>| {
        events
            .lock()
            .expect("not poisoned")
            .push((e.status, e.token, e.to_string()))
    };
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            run(
                listener,
                &kv,
                &ServerConfig::default(),
                &shutdown,
                &on_write,
            )
        });
        {
            // Stops the server even when an assertion in `client` panics, so a failing test
            // fails instead of hanging in the scope's join.
            let _stop = StopOnDrop(&shutdown);
            client(addr);
        }
        server
            .join()
            .expect("server thread")
            .expect("server ran cleanly");
    });
    events.into_inner().expect("not poisoned")
}

#[test]
fn stale_writes_get_409_naming_the_highest_token_and_the_value_is_kept() {
    let events = with_server(MemoryGate::new(), |addr| {
        assert_eq!(
            put(addr, "balance", Some("acct"), Some("2"), "100").status,
            200
        );
        // Holder with token 3 writes; the paused holder with token 2 comes back.
        assert_eq!(
            put(addr, "balance", Some("acct"), Some("3"), "150").status,
            200
        );
        let stale = put(addr, "balance", Some("acct"), Some("2"), "120");
        assert_eq!(stale.status, 409);
        assert!(stale.body.contains("token 3"), "{}", stale.body);
        assert!(stale.head.contains("latchkey-highest: 3"), "{}", stale.head);
        let value = get(addr, "balance");
        assert_eq!((value.status, value.body.as_str()), (200, "150"));
        // The same holder may write again.
        assert_eq!(
            put(addr, "balance", Some("acct"), Some("3"), "160").status,
            200
        );
    });
    let statuses: Vec<(u16, Option<u64>)> = events.iter().map(|(s, t, _)| (*s, *t)).collect();
    assert_eq!(
        statuses,
        vec![
            (200, Some(2)),
            (200, Some(3)),
            (409, Some(2)),
            (200, Some(3))
        ]
    );
    assert!(events[2].2.starts_with("REJECTED 409"), "{}", events[2].2);
    assert!(events[1].2.starts_with("ACCEPTED 200"), "{}", events[1].2);
}

#[test]
fn missing_or_bad_headers_get_400_and_write_nothing() {
    with_server(MemoryGate::new(), |addr| {
        let no_token = put(addr, "k", Some("l"), None, "v");
        assert_eq!(no_token.status, 400);
        assert!(
            no_token.body.contains("latchkey-token"),
            "{}",
            no_token.body
        );
        assert_eq!(put(addr, "k", None, Some("1"), "v").status, 400);
        assert_eq!(put(addr, "k", Some("l"), Some("-1"), "v").status, 400);
        assert_eq!(
            put(addr, "k", Some("l"), Some("99999999999999999999"), "v").status,
            400
        );
        let dup = b"PUT /kv/k HTTP/1.1\r\nlatchkey-lock: l\r\nlatchkey-token: 1\r\nlatchkey-token: 2\r\ncontent-length: 1\r\n\r\nv";
        assert_eq!(send(addr, dup).status, 400);
        assert_eq!(put(addr, "bad/key", Some("l"), Some("1"), "v").status, 400);
        assert_eq!(
            put(addr, "bad%20key", Some("l"), Some("1"), "v").status,
            400
        );
        assert_eq!(get(addr, "k").status, 404, "nothing was written");
    });
}

#[test]
fn a_key_is_guarded_by_the_lock_of_its_first_write() {
    with_server(MemoryGate::new(), |addr| {
        assert_eq!(put(addr, "k", Some("owner"), Some("5"), "v").status, 200);
        // A stale holder of "owner" cannot dodge its fence by naming a fresh lock.
        let dodge = put(addr, "k", Some("other"), Some("1"), "evil");
        assert_eq!(dodge.status, 409);
        assert!(
            dodge.body.contains("guarded by lock \"owner\""),
            "{}",
            dodge.body
        );
        assert_eq!(get(addr, "k").body, "v");
    });
}

#[test]
fn oversized_requests_are_refused() {
    with_server(MemoryGate::new(), |addr| {
        let big_header = format!(
            "GET /kv/k HTTP/1.1\r\nx-pad: {}\r\n\r\n",
            "a".repeat(limits::HTTP_HEAD_BYTES_MAX)
        );
        assert_eq!(send(addr, big_header.as_bytes()).status, 431);
        let big_body = format!(
            "PUT /kv/k HTTP/1.1\r\nlatchkey-lock: l\r\nlatchkey-token: 1\r\ncontent-length: {}\r\n\r\n",
            limits::HTTP_BODY_BYTES_MAX + 1
        );
        assert_eq!(send(addr, big_body.as_bytes()).status, 413);
        let chunked = b"PUT /kv/k HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n";
        assert_eq!(send(addr, chunked).status, 501);
        assert_eq!(send(addr, b"DELETE /kv/k HTTP/1.1\r\n\r\n").status, 405);
        assert_eq!(send(addr, b"nonsense\r\n\r\n").status, 400);
        assert_eq!(send(addr, b"GET /kv/k HTTP/2\r\n\r\n").status, 505);
    });
}

#[test]
fn the_durable_gate_behind_the_service_remembers_tokens_across_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let open = || DurableGate::open(dir.path(), DurableConfig::default()).expect("open gate");
    with_server(open(), |addr| {
        assert_eq!(put(addr, "k", Some("l"), Some("7"), "v").status, 200);
    });
    // The service restarted (its values are gone, its fence is not).
    with_server(open(), |addr| {
        assert_eq!(put(addr, "k", Some("l"), Some("6"), "stale").status, 409);
        assert_eq!(put(addr, "k", Some("l"), Some("7"), "v2").status, 200);
    });
}

/// Hostile input (issue #13): whatever bytes a connection sends (a valid request with bytes
/// changed, cut or inserted, or noise), the service answers with a status or closes that
/// connection, never panics, and goes on serving the next client.
mod hostile_input {
    use super::*;
    use proptest::prelude::*;

    /// Sends `raw`, half-closes, and reads whatever comes back (bounded by the service's own
    /// I/O timeout); the reply, if any, must start like an HTTP response.
    fn poke(addr: SocketAddr, raw: &[u8]) -> Result<(), TestCaseError> {
        let mut stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(15)))
            .expect("timeout");
        // The service may answer and close before it has read everything: a refused write is
        // an answer too.
        let _ = stream.write_all(raw);
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut reply = Vec::new();
        let _ = stream.read_to_end(&mut reply);
        prop_assert!(
            reply.is_empty() || reply.starts_with(b"HTTP/1.1 "),
            "not an HTTP reply: {:?}",
            String::from_utf8_lossy(&reply)
        );
        Ok(())
    }

    fn mutate(mut bytes: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
        for &(at, kind, value) in edits {
            if bytes.is_empty() {
                bytes.push(value);
                continue;
            }
            let at = at % bytes.len();
            match kind % 3 {
                0 => bytes[at] = value,
                1 => bytes.truncate(at),
                _ => bytes.insert(at, value),
            }
        }
        bytes
    }

    #[test]
    fn mutated_requests_and_noise_never_stop_the_service() {
        with_server(MemoryGate::new(), |addr| {
            let valid = b"PUT /kv/balance HTTP/1.1\r\nlatchkey-lock: acct\r\nlatchkey-token: 7\r\n\
                          content-length: 3\r\n\r\n100"
                .to_vec();
            let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
                cases: 300,
                ..ProptestConfig::default()
            });
            let inputs = prop_oneof![
                proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6)
                    .prop_map(move |edits| mutate(valid.clone(), &edits)),
                proptest::collection::vec(any::<u8>(), 0..2_048),
            ];
            runner
                .run(&inputs, |raw| poke(addr, &raw))
                .expect("every input answered or closed");
            // Still serving (a key no mutation of the request above can name).
            assert_eq!(get(addr, "never-written").status, 404);
        });
    }
}
