//! Cross-site writes to the HTTP API (issue #31 item 3) against a real `latchkey serve
//! --http-listen`, as curl-like requests: every state-changing route refuses a body that is not
//! `Content-Type: application/json` (415) and a request from another origin than the node's own
//! (403: an `Origin` header that is not `http://HOST` of the request, `null`, or a
//! `Sec-Fetch-Site` of another site), and the held lock stays held; a client that sends no
//! `Origin` (curl, the libraries) and the node's own web page keep working; an origin the
//! operator lists with `--http-allow-origin` may write and gets CORS headers, no other does;
//! and a malformed origin stops `serve`.
//!
//! Regression: the issue's `curl -H 'Origin: https://evil.example' -H 'Content-Type:
//! text/plain'` to `/v1/admin/release` answered 200 and released the lock, and so would a form
//! of any web page the operator opened.

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use common::{bin, free_port, http_call, HttpReply, Server};
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(30);

/// `METHOD path` on `addr` with exactly `headers` (a `host` header is the caller's, `host` of
/// `addr` if not given) and `body` as its bytes: nothing added, unlike `http_call`, which sends
/// every body as JSON.
fn send(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> HttpReply {
    let mut s = std::net::TcpStream::connect(addr).expect("connecting to the HTTP API");
    s.set_read_timeout(Some(T)).unwrap();
    let mut request = format!("{method} {path} HTTP/1.1\r\nconnection: close\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        request.push_str(&format!("host: {addr}\r\n"));
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    let mut bytes = request.into_bytes();
    bytes.extend_from_slice(body);
    s.write_all(&bytes).expect("sending the request");
    let mut reply = String::new();
    s.read_to_string(&mut reply).expect("reading the answer");
    let (head, body) = reply.split_once("\r\n\r\n").expect("an HTTP answer");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    HttpReply {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// A JSON call as a library makes it (no `Origin`), which must answer 200.
fn call_ok(http: &str, path: &str, body: Value) -> Value {
    let reply = http_call(http, "POST", path, &[], Some(&body.to_string()), T).expect(path);
    assert_eq!(reply.status, 200, "POST {path} {body}: {reply:?}");
    reply.json()
}

/// The node's HTTP API with `deploy/web` held by a session of its own: (server, HTTP address,
/// the session, its lock's token).
fn node_with_a_held_lock(extra: &[&str]) -> (Server, String, Value, u64) {
    let http = format!("127.0.0.1:{}", free_port());
    let mut args = vec!["--http-listen", &http];
    args.extend_from_slice(extra);
    let server = Server::start_with(&args);
    let session = call_ok(&http, "/v1/sessions", json!({"ttl_ms": 120_000}))["session"].clone();
    let grant = call_ok(
        &http,
        "/v1/locks/acquire",
        json!({"session": session, "seq": 1, "name": "deploy/web"}),
    );
    assert_eq!(grant["result"], "granted", "{grant}");
    let token = grant["token"].as_u64().expect("a token");
    (server, http, session, token)
}

/// `deploy/web`'s holder token, if held.
fn held_token(http: &str) -> Option<u64> {
    let reply =
        http_call(http, "GET", "/v1/lock?name=deploy/web", &[], None, T).expect("GET /v1/lock");
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.json()["lock"]["holder"]["token"].as_u64()
}

/// What a forged request of each state-changing route carries: the body that would do the
/// most harm (release the lock, end its session), with the session's real secret, as if the
/// attacker knew it (with `admin/release` it needs nothing).
fn forged_body(path: &str, session: &Value, token: u64) -> String {
    match path {
        "/v1/admin/release" => json!({"name": "deploy/web", "reason": "csrf", "operator": "="}),
        "/v1/locks/release" => {
            json!({"session": session, "seq": 2, "name": "deploy/web", "token": token})
        }
        "/v1/sessions/close" => json!({"session": session}),
        "/v1/sessions/keepalive" => json!({"sessions": [session]}),
        "/v1/locks/acquire" => json!({"session": session, "seq": 3, "name": "deploy/other"}),
        // An election's published value rewritten by another site's page.
        "/v1/locks/proclaim" => json!({
            "session": session, "seq": 4, "name": "deploy/web", "token": token, "value": "csrf"
        }),
        "/v1/sessions" => json!({"ttl_ms": 10_000}),
        // The batch call (issue #35) carrying the harm of the routes above at once.
        "/v1/batch" => json!({"ops": [
            {"release": {"session": session, "seq": 5, "name": "deploy/web", "token": token}},
            {"close": {"session": session}},
        ]}),
        other => panic!("no forged body for POST {other}: add one"),
    }
    .to_string()
}

/// A forged request and its refusal: what it is, its headers, the status and code it must get.
type Refused<'a> = (&'a str, Vec<(&'a str, &'a str)>, u16, &'a str);

#[test]
fn cross_site_writes_are_refused_and_the_lock_stays_held() {
    let (_server, http, session, token) = node_with_a_held_lock(&[]);
    let port = http.rsplit_once(':').unwrap().1;
    let other_port = free_port().to_string();
    let own = format!("http://{http}");
    let same_host_other_port = format!("http://127.0.0.1:{other_port}");
    let https_own = format!("https://{http}");
    // (what, headers, status, code): every one refused, on every state-changing route.
    let refusals: Vec<Refused> = vec![
        (
            "the issue's curl: text/plain from another site",
            vec![
                ("origin", "https://evil.example"),
                ("content-type", "text/plain"),
            ],
            403,
            "cross-origin",
        ),
        (
            "a form with enctype=text/plain, no Origin (an old browser)",
            vec![("content-type", "text/plain")],
            415,
            "unsupported-media-type",
        ),
        (
            "a urlencoded form, no Origin",
            vec![("content-type", "application/x-www-form-urlencoded")],
            415,
            "unsupported-media-type",
        ),
        (
            "a multipart form, no Origin",
            vec![("content-type", "multipart/form-data; boundary=x")],
            415,
            "unsupported-media-type",
        ),
        (
            "no Content-Type at all",
            vec![],
            415,
            "unsupported-media-type",
        ),
        (
            "a JSON look-alike media type",
            vec![("content-type", "application/jsonx")],
            415,
            "unsupported-media-type",
        ),
        (
            "JSON from another site (a CORS request the node never allowed)",
            vec![
                ("origin", "https://evil.example"),
                ("content-type", "application/json"),
            ],
            403,
            "cross-origin",
        ),
        (
            "the null origin (a sandboxed frame, a file, a redirect)",
            vec![("origin", "null"), ("content-type", "application/json")],
            403,
            "cross-origin",
        ),
        (
            "another port of the same host (another origin, the same site)",
            vec![
                ("origin", &same_host_other_port),
                ("sec-fetch-site", "same-site"),
                ("content-type", "application/json"),
            ],
            403,
            "cross-origin",
        ),
        (
            "the node's host and port under https: another origin",
            vec![("origin", &https_own), ("content-type", "application/json")],
            403,
            "cross-origin",
        ),
        (
            "the browser says cross-site, without an Origin",
            vec![
                ("sec-fetch-site", "cross-site"),
                ("content-type", "application/json"),
            ],
            403,
            "cross-origin",
        ),
        (
            "the browser says same-site, without an Origin",
            vec![
                ("sec-fetch-site", "same-site"),
                ("content-type", "application/json"),
            ],
            403,
            "cross-origin",
        ),
        (
            "two Content-Types, the first JSON",
            vec![
                ("content-type", "application/json"),
                ("content-type", "text/plain"),
            ],
            415,
            "unsupported-media-type",
        ),
    ];
    let mut posts: Vec<&str> = latchkey_server::http::ROUTES
        .iter()
        .filter(|(method, _)| *method != "GET")
        .map(|(_, path)| *path)
        .collect();
    // The route first: it needs nothing but the lock's name.
    posts.sort_by_key(|path| *path != "/v1/admin/release");
    assert_eq!(posts.first(), Some(&"/v1/admin/release"), "{posts:?}");
    let mut wrong = Vec::new();
    for path in &posts {
        let body = forged_body(path, &session, token);
        for (what, headers, status, code) in &refusals {
            let reply = send(&http, "POST", path, headers, body.as_bytes());
            let got_code = serde_json::from_str::<Value>(&reply.body)
                .ok()
                .and_then(|b| b["code"].as_str().map(str::to_owned));
            if reply.status != *status || got_code.as_deref() != Some(*code) {
                wrong.push(format!(
                    "POST {path}, {what}: want {status} {code}, got {} {}",
                    reply.status, reply.body
                ));
            }
            if reply.header("access-control-allow-origin").is_some() {
                wrong.push(format!("POST {path}, {what}: CORS headers: {reply:?}"));
            }
        }
        if held_token(&http) != Some(token) {
            wrong.push(format!(
                "after the forged requests to POST {path} deploy/web is not held"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // An unlisted origin's CORS preflight gets no CORS headers, so the browser sends nothing.
    let preflight = send(
        &http,
        "OPTIONS",
        "/v1/admin/release",
        &[
            ("origin", "https://evil.example"),
            ("access-control-request-method", "POST"),
            ("access-control-request-headers", "content-type"),
        ],
        b"",
    );
    assert!(
        preflight.header("access-control-allow-origin").is_none() && preflight.status >= 400,
        "{preflight:?}"
    );
    // Reads are not refused (a link to the page from elsewhere opens it), and a foreign page
    // cannot read the answer: no CORS headers.
    let read = send(
        &http,
        "GET",
        "/v1/lock?name=deploy/web",
        &[
            ("origin", "https://evil.example"),
            ("sec-fetch-site", "cross-site"),
        ],
        b"",
    );
    assert_eq!(read.status, 200, "{read:?}");
    assert!(
        read.header("access-control-allow-origin").is_none(),
        "{read:?}"
    );

    // Allowed: the node's own origin as the web page sends it (any case of the media type,
    // with parameters), by the name the browser used for the node.
    let keepalive = json!({"sessions": [session]}).to_string();
    for (host, origin, content_type) in [
        (http.clone(), own.clone(), "application/json"),
        (http.clone(), own.clone(), "Application/JSON; charset=utf-8"),
        (
            format!("localhost:{port}"),
            format!("http://localhost:{port}"),
            "application/json",
        ),
        (
            format!("LocalHost:{port}"),
            format!("http://localhost:{port}"),
            "application/json",
        ),
    ] {
        let reply = send(
            &http,
            "POST",
            "/v1/sessions/keepalive",
            &[
                ("host", &host),
                ("origin", &origin),
                ("sec-fetch-site", "same-origin"),
                ("content-type", content_type),
            ],
            keepalive.as_bytes(),
        );
        assert_eq!(
            reply.status, 200,
            "Host {host}, Origin {origin}, {content_type}: {reply:?}"
        );
        assert!(
            reply.header("access-control-allow-origin").is_none(),
            "{reply:?}"
        );
    }
    // The page's own force-release works, as the page sends it.
    let forced = send(
        &http,
        "POST",
        "/v1/admin/release",
        &[
            ("origin", &own),
            ("sec-fetch-site", "same-origin"),
            ("content-type", "application/json"),
        ],
        json!({"name": "deploy/web", "token": token, "reason": "the page"})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(forced.status, 200, "{forced:?}");
    assert_eq!(
        held_token(&http),
        None,
        "released by the page's own request"
    );
}

const DASHBOARD: &str = "https://dash.example";

#[test]
fn a_listed_origin_may_write_and_only_it_gets_cors_headers() {
    let (_server, http, session, _token) =
        node_with_a_held_lock(&["--http-allow-origin", DASHBOARD]);
    let keepalive = json!({"sessions": [session]}).to_string();

    let preflight = send(
        &http,
        "OPTIONS",
        "/v1/sessions/keepalive",
        &[
            ("origin", DASHBOARD),
            ("access-control-request-method", "POST"),
            (
                "access-control-request-headers",
                "authorization,content-type",
            ),
        ],
        b"",
    );
    assert_eq!(preflight.status, 204, "{preflight:?}");
    assert_eq!(
        preflight.header("access-control-allow-origin"),
        Some(DASHBOARD),
        "{preflight:?}"
    );
    let methods = preflight
        .header("access-control-allow-methods")
        .unwrap_or("");
    assert!(methods.contains("POST"), "{preflight:?}");
    let allowed = preflight
        .header("access-control-allow-headers")
        .unwrap_or("")
        .to_ascii_lowercase();
    assert!(
        allowed.contains("content-type") && allowed.contains("authorization"),
        "{preflight:?}"
    );
    assert!(
        preflight.header("access-control-max-age").is_some(),
        "{preflight:?}"
    );

    let write = send(
        &http,
        "POST",
        "/v1/sessions/keepalive",
        &[
            ("origin", DASHBOARD),
            ("sec-fetch-site", "cross-site"),
            ("content-type", "application/json"),
        ],
        keepalive.as_bytes(),
    );
    assert_eq!(write.status, 200, "{write:?}");
    assert_eq!(
        write.header("access-control-allow-origin"),
        Some(DASHBOARD),
        "{write:?}"
    );
    assert!(
        write
            .header("vary")
            .is_some_and(|v| v.to_ascii_lowercase().contains("origin")),
        "{write:?}"
    );
    // Listed or not, a write is JSON.
    let form = send(
        &http,
        "POST",
        "/v1/sessions/keepalive",
        &[("origin", DASHBOARD), ("content-type", "text/plain")],
        keepalive.as_bytes(),
    );
    assert_eq!(form.status, 415, "{form:?}");
    let read = send(
        &http,
        "GET",
        "/v1/cluster/status",
        &[("origin", DASHBOARD)],
        b"",
    );
    assert_eq!(read.status, 200, "{read:?}");
    assert_eq!(read.header("access-control-allow-origin"), Some(DASHBOARD));

    // Any other origin: refused, and no CORS headers, on a preflight either.
    for origin in [
        "https://evil.example",
        "http://dash.example",
        "https://dash.example:8443",
    ] {
        let refused = send(
            &http,
            "POST",
            "/v1/sessions/keepalive",
            &[("origin", origin), ("content-type", "application/json")],
            keepalive.as_bytes(),
        );
        assert_eq!(refused.status, 403, "{origin}: {refused:?}");
        assert!(
            refused.header("access-control-allow-origin").is_none(),
            "{origin}: {refused:?}"
        );
        let preflight = send(
            &http,
            "OPTIONS",
            "/v1/sessions/keepalive",
            &[
                ("origin", origin),
                ("access-control-request-method", "POST"),
            ],
            b"",
        );
        assert!(
            preflight.header("access-control-allow-origin").is_none(),
            "{origin}: {preflight:?}"
        );
    }
}

/// `latchkey serve ARGS` with `env`, expected to stop at once: its exit code and stderr.
fn refused_start(args: &[&str], env: &[(&str, &str)], dir: &Path) -> (Option<i32>, String) {
    let mut command = std::process::Command::new(bin());
    command
        .arg("serve")
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--data-dir", &dir.join("data").display().to_string()])
        .args(args)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().expect("spawning latchkey serve");
    let deadline = std::time::Instant::now() + T;
    loop {
        if child.try_wait().expect("waiting").is_some() {
            break;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("latchkey serve {args:?} did not stop");
        }
        std::thread::sleep(common::POLL);
    }
    let out = child.wait_with_output().expect("its output");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_malformed_allowed_origin_stops_serve_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let http = format!("127.0.0.1:{}", free_port());
    for (origin, says) in [
        ("https://dash.example/", "no path"),
        ("https://dash.example/ui", "no path"),
        ("dash.example", "scheme"),
        ("ftp://dash.example", "http or https"),
        ("null", "null"),
        ("*", "scheme"),
        ("https://", "host"),
        ("https://dash.example:0", "port"),
        ("https://dash.example:99999", "port"),
        ("https://user@dash.example", "user"),
    ] {
        let (code, stderr) = refused_start(
            &["--http-listen", &http, "--http-allow-origin", origin],
            &[],
            dir.path(),
        );
        assert_eq!(code, Some(2), "{origin}: {stderr}");
        assert!(
            stderr.contains("--http-allow-origin") && stderr.contains(says),
            "{origin}: {stderr}"
        );
    }
    // The same from the environment and from the config file.
    let (code, stderr) = refused_start(
        &["--http-listen", &http],
        &[("LATCHKEY_HTTP_ALLOW_ORIGIN", "https://dash.example/ui")],
        dir.path(),
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("no path"), "{stderr}");
    let config = dir.path().join("latchkey.toml");
    std::fs::write(
        &config,
        format!(
            "http-listen = \"{http}\"\nhttp-allow-origin = [\"https://ok.example\", \"https://dash.example/ui\"]\n"
        ),
    )
    .unwrap();
    let (code, stderr) = refused_start(
        &["--config", &config.display().to_string()],
        &[],
        dir.path(),
    );
    assert_ne!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("http-allow-origin") && stderr.contains("no path"),
        "{stderr}"
    );
    // A listed origin without the HTTP API, or more than the limit.
    let (code, stderr) = refused_start(&["--http-allow-origin", DASHBOARD], &[], dir.path());
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("--http-listen"), "{stderr}");
    let many: Vec<String> = (0..=latchkey_core::limits::HTTP_ALLOW_ORIGINS_MAX)
        .map(|i| format!("https://dash{i}.example"))
        .collect();
    let (code, stderr) = refused_start(
        &[
            "--http-listen",
            &http,
            "--http-allow-origin",
            &many.join(","),
        ],
        &[],
        dir.path(),
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "at most {}",
            latchkey_core::limits::HTTP_ALLOW_ORIGINS_MAX
        )),
        "{stderr}"
    );
}

#[test]
fn listed_origins_come_from_the_config_file_too() {
    let dir = tempfile::tempdir().unwrap();
    let http = format!("127.0.0.1:{}", free_port());
    let config = dir.path().join("latchkey.toml");
    std::fs::write(
        &config,
        format!("http-listen = \"{http}\"\nhttp-allow-origin = [\"https://a.example\", \"{DASHBOARD}\"]\n"),
    )
    .unwrap();
    let server = Server::start_with(&["--config", &config.display().to_string()]);
    for (origin, allowed) in [
        ("https://a.example", true),
        (DASHBOARD, true),
        ("https://b.example", false),
    ] {
        let read = send(
            &http,
            "GET",
            "/v1/cluster/status",
            &[("origin", origin)],
            b"",
        );
        assert_eq!(read.status, 200, "{read:?}");
        assert_eq!(
            read.header("access-control-allow-origin"),
            allowed.then_some(origin),
            "{origin}: {read:?}"
        );
    }
    drop(server);
}
