//! An attacker's review of `POST /v1/batch` (issue #35 item 1) against real `latchkey serve`
//! processes: the route's methods, its limits and malformed bodies on one node, and the
//! caller's identity through a follower's forwarding in a cluster of three with `--acl`.
//! Each probe prints `PROBE` lines of what it saw, and asserts what must hold.

mod common;

use std::time::Duration;

use common::cluster::{Cluster, Timing};
use common::{free_port, http_call, HttpReply, Server, READY_TIMEOUT};
use latchkey_core::limits;
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(60);

const ADMIN: &str = "admin-token-0123456789";
const APP: &str = "app-token-0123456789";
const APP2: &str = "app2-token-0123456789";

fn post(http: &str, path: &str, token: Option<&str>, body: &str) -> HttpReply {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
    http_call(http, "POST", path, &headers, Some(body), T).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn batch(http: &str, token: Option<&str>, ops: &[Value]) -> HttpReply {
    post(http, "/v1/batch", token, &json!({ "ops": ops }).to_string())
}

fn session(http: &str, token: Option<&str>) -> Value {
    let r = post(
        http,
        "/v1/sessions",
        token,
        &json!({"ttl_ms": 120_000}).to_string(),
    );
    assert_eq!(r.status, 200, "{r:?}");
    r.json()["session"].clone()
}

/// Methods, op count, body size, nesting, seq reuse inside one batch, a huge keepalive,
/// concurrent full batches, and a batch op's error against its own route's, on one node.
#[test]
fn batch_limits_and_shapes_on_one_node() {
    let http = format!("127.0.0.1:{}", free_port());
    let _server = Server::start_with(&["--http-listen", &http]);
    let mut findings: Vec<String> = Vec::new();

    // Other methods on /v1/batch.
    for method in ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"] {
        let r = http_call(&http, method, "/v1/batch", &[], None, T);
        let status = r.as_ref().map(|r| r.status).unwrap_or(0);
        eprintln!("PROBE {method} /v1/batch -> {status}");
        assert!(status == 405 || status == 0, "{method}: {r:?}");
    }

    // 256 acquires of 512-byte names, of two sessions (each within its sequence window),
    // distinct seqs: all granted.
    let two = [session(&http, None), session(&http, None)];
    let s = two[0].clone();
    let window = limits::SESSION_SEQ_WINDOW_MAX;
    let ops: Vec<Value> = (0..limits::BATCH_CALL_OPS_MAX)
        .map(|i| {
            let name = format!("{i:04}{}", "n".repeat(limits::LOCK_NAME_BYTES_MAX - 4));
            let (s, seq) = (&two[i / window], 1 + i % window);
            json!({"acquire": {"session": s, "seq": seq, "name": name, "wait_timeout_ms": 0}})
        })
        .collect();
    let body = json!({ "ops": ops }).to_string();
    let r = post(&http, "/v1/batch", None, &body);
    eprintln!(
        "PROBE 256 x 512-byte names: body {} bytes -> {}",
        body.len(),
        r.status
    );
    assert_eq!(r.status, 200, "{}", &r.body[..r.body.len().min(400)]);
    let granted = r.json()["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["acquire"]["result"] == "granted")
        .count();
    eprintln!("PROBE granted {granted} of 256");
    // (Per-session lock limit may refuse some; report it.)

    // The same 256 names, held, asked by another session that waits: how many queue, and a
    // retry of the whole batch (same seqs) answers each op as before.
    let waiters = [session(&http, None), session(&http, None)];
    let waits: Vec<Value> = (0..limits::BATCH_CALL_OPS_MAX)
        .map(|i| {
            let name = format!("{i:04}{}", "n".repeat(limits::LOCK_NAME_BYTES_MAX - 4));
            let (w, seq) = (&waiters[i / window], 1 + i % window);
            json!({"acquire": {"session": w, "seq": seq, "name": name, "wait_timeout_ms": 60_000}})
        })
        .collect();
    let kinds = |r: &HttpReply| -> Vec<String> {
        r.json()["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| {
                x["acquire"]["result"]
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| x["error"]["code"].as_str().unwrap_or("?").to_owned())
            })
            .collect()
    };
    let first = batch(&http, None, &waits);
    let again = batch(&http, None, &waits);
    let (k1, k2) = (kinds(&first), kinds(&again));
    let count = |k: &[String], what: &str| k.iter().filter(|x| *x == what).count();
    eprintln!(
        "PROBE 256 waiting acquires: first pending {} other {:?}; retry pending {}",
        count(&k1, "pending"),
        k1.iter()
            .filter(|x| *x != "pending")
            .collect::<std::collections::BTreeSet<_>>(),
        count(&k2, "pending")
    );
    let first_err = first.json()["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["error"].is_object())
        .cloned();
    eprintln!("PROBE   first refusal: {first_err:?}");
    if k1 != k2 {
        let diff: Vec<_> = k1
            .iter()
            .zip(&k2)
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .take(5)
            .collect();
        findings.push(format!("256 waits: retry answered apart: {diff:?}"));
    }

    // 257 ops: 400, nothing run.
    let ops: Vec<Value> = (0..=limits::BATCH_CALL_OPS_MAX)
        .map(|i| json!({"acquire": {"session": s, "seq": 10_000 + i, "name": format!("x/{i}")}}))
        .collect();
    let r = batch(&http, None, &ops);
    eprintln!("PROBE 257 ops -> {} {}", r.status, r.body);
    assert_eq!(r.status, 400);
    let held = http_call(&http, "GET", "/v1/lock?name=x%2F0", &[], None, T).unwrap();
    assert!(
        held.json()["lock"]["holder"].is_null(),
        "257-op batch ran: {held:?}"
    );

    // A body padded with JSON whitespace to exactly the limit, and one byte over.
    let small = json!({"ops": [{"keepalive": {"sessions": [s]}}]}).to_string();
    for (extra, want) in [(0usize, 200u16), (1, 413)] {
        let pad = limits::HTTP_BODY_BYTES_MAX - small.len() + extra;
        let body = format!("{}{}", " ".repeat(pad), small);
        let r = post(&http, "/v1/batch", None, &body);
        eprintln!(
            "PROBE body {} bytes (limit {}) -> {} {}",
            body.len(),
            limits::HTTP_BODY_BYTES_MAX,
            r.status,
            &r.body[..r.body.len().min(200)]
        );
        assert_eq!(r.status, want, "{r:?}");
    }

    // Deeply nested JSON: a clear 400, the node alive.
    let deep = format!("{{\"ops\":[{}", "[".repeat(200_000));
    let r = post(&http, "/v1/batch", None, &deep);
    eprintln!(
        "PROBE 200k nested arrays -> {} {}",
        r.status,
        &r.body[..r.body.len().min(200)]
    );
    assert_eq!(r.status, 400);
    let deep_obj = format!(
        "{{\"ops\":[{{\"acquire\":{{\"session\":{}{}",
        "{\"id\":".repeat(30_000),
        "1"
    );
    let r = post(&http, "/v1/batch", None, &deep_obj);
    eprintln!(
        "PROBE 30k nested objects -> {} {}",
        r.status,
        &r.body[..r.body.len().min(200)]
    );
    assert_eq!(r.status, 400);
    // Duplicate field / unknown op word / two op words in one object.
    for body in [
        r#"{"ops":[{"keepalive":{"sessions":[]},"close":{"session":{"id":1,"secret":"1"}}}]}"#,
        r#"{"ops":[{"acquire":{"session":{"id":1,"secret":"1"},"seq":1,"name":"a","name":"b"}}]}"#,
        r#"{"ops":[{"proclaim":{}}]}"#,
        r#"{"ops":[],"ops":[]}"#,
    ] {
        let r = post(&http, "/v1/batch", None, body);
        eprintln!("PROBE {body} -> {} {}", r.status, r.body);
        assert_eq!(r.status, 400, "{body}");
    }

    // Release and acquire with one seq in one batch: one is sequence-reused.
    let s2 = session(&http, None);
    let r = batch(
        &http,
        None,
        &[json!({"acquire": {"session": s2, "seq": 7, "name": "dup/a", "wait_timeout_ms": 0}})],
    );
    let token = r.json()["results"][0]["acquire"]["token"].clone();
    let r = batch(
        &http,
        None,
        &[
            json!({"release": {"session": s2, "seq": 8, "name": "dup/a", "token": token}}),
            json!({"acquire": {"session": s2, "seq": 8, "name": "dup/c", "wait_timeout_ms": 0}}),
        ],
    );
    eprintln!(
        "PROBE same seq, release + acquire -> {} {}",
        r.status, r.body
    );
    let reused = r.json()["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["error"]["code"] == "sequence-reused")
        .count();
    assert_eq!(reused, 1, "{r:?}");

    // A keepalive of 10k sessions (small ids: under the body limit).
    let many: Vec<Value> = (0..10_000u64)
        .map(|i| json!({"id": i + 1, "secret": "1"}))
        .collect();
    let r = batch(&http, None, &[json!({"keepalive": {"sessions": many}})]);
    eprintln!(
        "PROBE keepalive of 10k sessions -> {} {}",
        r.status,
        &r.body[..r.body.len().min(300)]
    );
    let e = &r.json()["results"][0]["error"];
    assert!(
        r.status == 413 || r.status == 400 || e["status"] == 400,
        "{r:?}"
    );
    // Single route, same keepalive.
    let r = post(
        &http,
        "/v1/sessions/keepalive",
        None,
        &json!({"sessions": many}).to_string(),
    );
    eprintln!(
        "PROBE single keepalive of 10k sessions -> {} {}",
        r.status,
        &r.body[..r.body.len().min(300)]
    );

    // A batch op's error against its own route's: an unknown session.
    let ghost = json!({"id": 999_999, "secret": "5"});
    let acq = json!({"session": ghost, "seq": 1, "name": "g/x", "wait_timeout_ms": 0});
    let single = post(&http, "/v1/locks/acquire", None, &acq.to_string());
    let batched = batch(&http, None, &[json!({"acquire": acq})]);
    eprintln!(
        "PROBE unknown session: single {} {} | batched {} {}",
        single.status, single.body, batched.status, batched.body
    );
    let be = &batched.json()["results"][0]["error"];
    assert_eq!(be["status"], single.status, "{batched:?} vs {single:?}");
    assert_eq!(be["code"], single.json()["code"]);

    // Many concurrent full batches (the member-wide room): every one answered.
    let started = std::time::Instant::now();
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..24)
            .map(|t| {
                let http = http.clone();
                scope.spawn(move || {
                    let two = [session(&http, None), session(&http, None)];
                    let ops: Vec<Value> = (0..limits::BATCH_CALL_OPS_MAX)
                        .map(|i| {
                            let (s, seq) = (&two[i / window], 1 + i % window);
                            json!({"acquire": {"session": s, "seq": seq, "name": format!("c{t}/{i}"), "wait_timeout_ms": 0}})
                        })
                        .collect();
                    batch(&http, None, &ops).status
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    eprintln!(
        "PROBE 24 concurrent batches of 256: {statuses:?} in {:?}",
        started.elapsed()
    );
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert!(findings.is_empty(), "FINDINGS:\n{}", findings.join("\n"));
}

/// Regression (issue #35's attacker review, F2): an acquire whose `seq` the session used for
/// an acquire of ANOTHER name was answered with that acquire's grant, though the name asked
/// for was not held; in one batch (two ops, one seq) and on the single route. The table now
/// remembers each outcome's request fingerprint and answers such a reuse `sequence-reused`
/// (`protocol.md` 5.1).
#[test]
fn a_seq_reused_for_another_name_is_not_answered_granted() {
    let http = format!("127.0.0.1:{}", free_port());
    let _server = Server::start_with(&["--http-listen", &http]);
    let mut findings: Vec<String> = Vec::new();
    // One session, the same seq, two names in one batch.
    let s2 = session(&http, None);
    let r = batch(
        &http,
        None,
        &[
            json!({"acquire": {"session": s2, "seq": 7, "name": "dup/a", "wait_timeout_ms": 0}}),
            json!({"acquire": {"session": s2, "seq": 7, "name": "dup/b", "wait_timeout_ms": 0}}),
        ],
    );
    eprintln!("PROBE same seq, two names -> {} {}", r.status, r.body);
    let holder = |name: &str| {
        let r = http_call(
            &http,
            "GET",
            &format!("/v1/lock?name={}", name.replace('/', "%2F")),
            &[],
            None,
            T,
        )
        .unwrap();
        r.json()["lock"]["holder"]["token"].clone()
    };
    let results = r.json()["results"].clone();
    for (i, name) in ["dup/a", "dup/b"].iter().enumerate() {
        let answered = results[i]["acquire"]["token"].clone();
        let held = holder(name);
        eprintln!("PROBE   {name}: answered token {answered}, held token {held}");
        if results[i]["acquire"]["result"] == "granted" && answered != held {
            findings.push(format!(
                "batch: {name} answered granted (token {answered}) but held by {held}"
            ));
        }
    }
    // The same with the single route, one after the other.
    let acq = |seq: u64, name: &str| {
        post(
            &http,
            "/v1/locks/acquire",
            None,
            &json!({"session": s2, "seq": seq, "name": name, "wait_timeout_ms": 0}).to_string(),
        )
    };
    let first = acq(20, "dup/s1");
    let second = acq(20, "dup/s2");
    eprintln!(
        "PROBE single route, same seq, two names: {} | {} | dup/s2 held by {}",
        first.body,
        second.body,
        holder("dup/s2")
    );
    if second.json()["result"] == "granted" && holder("dup/s2") != second.json()["token"] {
        findings.push(format!(
            "single route: dup/s2 answered {} but held by {}",
            second.body,
            holder("dup/s2")
        ));
    }
    // Refused as the client bug it is, in both places; the first acquire keeps its grant.
    if results[1]["error"]["code"] != "sequence-reused" {
        findings.push(format!("batch: dup/b answered {}", results[1]));
    }
    if (second.status, second.json()["code"].clone()) != (409, json!("sequence-reused")) {
        findings.push(format!(
            "single route: dup/s2 answered {} {}",
            second.status, second.body
        ));
    }
    if holder("dup/a") != results[0]["acquire"]["token"]
        || holder("dup/s1") != first.json()["token"]
    {
        findings.push("a first acquire lost its grant".into());
    }
    assert!(findings.is_empty(), "FINDINGS:\n{}", findings.join("\n"));
}

/// A batch of 256 operations of ONE session (SESSION_OUTCOMES_MAX outcomes) is past the
/// SESSION_SEQ_WINDOW_MAX (128) a session keeps unanswered at once; taken whole, a retry of it
/// after one more request of the session was not answered as before (`request-too-old`: an
/// attacker's review of issue #35, F3). The operations past the window are refused, each in
/// its own result; the others run, and the batch retried after one more request is answered
/// exactly as before.
#[test]
fn a_batch_past_a_sessions_seq_window_is_refused_there_and_retries_exactly_once() {
    let http = format!("127.0.0.1:{}", free_port());
    let _server = Server::start_with(&["--http-listen", &http]);
    let s = session(&http, None);
    let window = limits::SESSION_SEQ_WINDOW_MAX;
    let ops: Vec<Value> = (1..=limits::BATCH_CALL_OPS_MAX)
        .map(|i| json!({"acquire": {"session": s, "seq": i, "name": format!("w/{i}"), "wait_timeout_ms": 0}}))
        .collect();
    let body = json!({ "ops": ops }).to_string();
    let first = post(&http, "/v1/batch", None, &body);
    assert_eq!(first.status, 200, "{first:?}");
    let results = first.json()["results"].as_array().unwrap().clone();
    for (i, r) in results.iter().enumerate() {
        if i < window {
            assert_eq!(r["acquire"]["result"], "granted", "op {i}: {r}");
        } else {
            assert_eq!(r["error"]["code"], "invalid-request", "op {i}: {r}");
            let message = r["error"]["message"].as_str().unwrap();
            assert!(message.contains("sequence window"), "op {i}: {r}");
        }
    }
    let one_more = post(
        &http,
        "/v1/locks/acquire",
        None,
        &json!({"session": s, "seq": 300, "name": "extra/1", "wait_timeout_ms": 0}).to_string(),
    );
    assert_eq!(one_more.status, 200, "{one_more:?}");
    let retry = post(&http, "/v1/batch", None, &body);
    assert_eq!(retry.json(), first.json(), "a retry answered otherwise");
}

fn acl_text() -> String {
    format!(
        r#"
[roles.app]
lock = ["app/"]
read = ["app/"]

[roles.admin]
admin = [""]
lock = [""]
read = [""]

[identities.app]
token_sha256 = "{}"
roles = ["app"]
max_waiting = 2

[identities.app2]
token_sha256 = "{}"
roles = ["app"]

[identities.admin]
token_sha256 = "{}"
roles = ["admin"]
"#,
        common::sha256_hex(APP),
        common::sha256_hex(APP2),
        common::sha256_hex(ADMIN)
    )
}

/// Through each follower (forwarded to the leader) and at the leader: app2's token may not
/// use app's session for any op kind; no token gets 401 for every op; app's own batch works;
/// the mark of a forwarded request gives no identity; and nothing of app's changed.
#[test]
fn a_batch_through_a_follower_keeps_the_callers_identity() {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl.toml");
    std::fs::write(&acl, acl_text()).unwrap();
    std::env::set_var("LATCHKEY_AUTH_TOKEN", ADMIN);
    let acl = acl.display().to_string();
    let cluster = Cluster::start_configured(
        3,
        Timing::default(),
        &["--http-listen", "--acl", acl.as_str()],
    );
    let (leader, _) = cluster.wait_leader(&[], READY_TIMEOUT);
    let leader_http = cluster
        .members
        .iter()
        .find(|m| m.id == leader)
        .unwrap()
        .http_addr
        .clone()
        .unwrap();
    for m in &cluster.members {
        let http = m.http_addr.clone().unwrap();
        common::wait_until("the member forwards", READY_TIMEOUT, || {
            let r = post(
                &http,
                "/v1/sessions",
                Some(APP),
                &json!({"ttl_ms": 5_000}).to_string(),
            );
            r.status == 200
        });
    }
    let victim = session(&leader_http, Some(APP));
    let r = post(
        &leader_http,
        "/v1/locks/acquire",
        Some(APP),
        &json!({"session": victim, "seq": 1, "name": "app/held", "wait_timeout_ms": 0}).to_string(),
    );
    assert_eq!(r.json()["result"], "granted", "{r:?}");
    let token = r.json()["token"].as_u64().unwrap();
    let mut seq = 100u64;
    let mut wrong = Vec::new();
    for m in &cluster.members {
        let http = m.http_addr.clone().unwrap();
        let role = if m.id == leader { "leader" } else { "follower" };
        let own = session(&http, Some(APP2));
        seq += 10;
        let ops = vec![
            json!({"acquire": {"session": victim, "seq": seq, "name": "app/stolen", "wait_timeout_ms": 0}}),
            json!({"release": {"session": victim, "seq": seq + 1, "name": "app/held", "token": token}}),
            json!({"keepalive": {"sessions": [victim]}}),
            json!({"close": {"session": victim}}),
        ];
        // Each attack alone too, so that a batch the follower does not forward as a whole
        // (one op answered here) still reaches the leader's check.
        let mut attacks: Vec<Vec<Value>> = ops.iter().map(|o| vec![o.clone()]).collect();
        attacks.push(ops.clone());
        // Mixed with one legitimate op of app2's own.
        let mut mixed = ops.clone();
        mixed.insert(
            0,
            json!({"acquire": {"session": own, "seq": 1, "name": format!("app/own{}", m.id), "wait_timeout_ms": 0}}),
        );
        attacks.push(mixed);
        for attack in &attacks {
            for (who, tok, want) in [
                ("app2", Some(APP2), "permission-denied"),
                ("nobody", None, "unauthenticated"),
            ] {
                let r = batch(&http, tok, attack);
                eprintln!(
                    "PROBE {role} {} as {who}: {} {}",
                    m.id,
                    r.status,
                    &r.body[..r.body.len().min(600)]
                );
                if r.status != 200 {
                    if !(r.status == 401 || r.status == 403) {
                        wrong.push(format!(
                            "{role} {} as {who}: batch answered {} {}",
                            m.id, r.status, r.body
                        ));
                    }
                    continue;
                }
                for (i, res) in r.json()["results"].as_array().unwrap().iter().enumerate() {
                    let names_victim = attack[i]
                        .to_string()
                        .contains(&format!("\"id\":{}", victim["id"]));
                    if names_victim && res["error"]["code"] != want {
                        wrong.push(format!(
                            "{role} {} as {who}: op {i} {} -> {res}",
                            m.id, attack[i]
                        ));
                    }
                }
            }
        }
        // Cross-site on this member, app's own token: refused before anything runs.
        for (what, headers, want) in [
            (
                "evil origin",
                vec![
                    ("origin", "https://evil.example"),
                    ("content-type", "application/json"),
                ],
                403u16,
            ),
            ("text/plain", vec![("content-type", "text/plain")], 415),
            (
                "sec-fetch-site cross-site",
                vec![
                    ("sec-fetch-site", "cross-site"),
                    ("content-type", "application/json"),
                ],
                403,
            ),
        ] {
            let auth = format!("Bearer {APP}");
            let mut h: Vec<(&str, &str)> = headers.clone();
            h.push(("authorization", &auth));
            let body = json!({"ops": [ops[3].clone()]}).to_string();
            let r = raw_post(&http, "/v1/batch", &h, body.as_bytes());
            eprintln!("PROBE {role} {} cross-site {what}: {} {}", m.id, r.0, r.1);
            if r.0 != want {
                wrong.push(format!(
                    "{role} {} cross-site {what}: {} {}",
                    m.id, r.0, r.1
                ));
            }
        }
        // The forwarded mark, sent by a caller, gives no identity.
        let r = http_call(
            &http,
            "POST",
            "/v1/batch",
            &[("latchkey-forwarded-by", &leader.to_string())],
            Some(&json!({"ops": [ops[3].clone()]}).to_string()),
            T,
        )
        .unwrap();
        eprintln!(
            "PROBE {role} {} marked, no token: {} {}",
            m.id, r.status, r.body
        );
        if r.status == 200 && r.json()["results"][0]["close"].is_object() {
            wrong.push(format!("{role} {}: marked close ran: {}", m.id, r.body));
        }
    }
    // Nothing of app's changed.
    let held = http_call(
        &leader_http,
        "GET",
        "/v1/lock?name=app%2Fheld",
        &[("authorization", &format!("Bearer {ADMIN}"))],
        None,
        T,
    )
    .unwrap();
    eprintln!("PROBE after: {}", held.body);
    if held.json()["lock"]["holder"]["token"] != token {
        wrong.push(format!("app/held changed: {}", held.body));
    }
    let stolen = http_call(
        &leader_http,
        "GET",
        "/v1/lock?name=app%2Fstolen",
        &[("authorization", &format!("Bearer {ADMIN}"))],
        None,
        T,
    )
    .unwrap();
    if !stolen.json()["lock"]["holder"].is_null() {
        wrong.push(format!("app/stolen taken: {}", stolen.body));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `POST path` with exactly `headers` (no Content-Type added): (status, body).
fn raw_post(addr: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let mut req = format!("POST {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n");
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    s.write_all(&bytes).unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

/// The gRPC `Batch` and `POST /v1/batch` given the same inputs on one node: a malformed op
/// among good ones, one seq for two names, an unknown session, an empty batch.
#[test]
fn grpc_and_http_batches_answer_alike() {
    use common::rpc::{pinned, runtime};
    use latchkey_proto::v1 as pb;
    use pb::batch_op::Op;
    use pb::batch_result::Result as R;
    let http = format!("127.0.0.1:{}", free_port());
    let server = Server::start_with(&["--http-listen", &http]);
    let rt = runtime();
    let client = pinned(&rt, &server.addr);
    let grpc = |ops: Vec<Op>| {
        let msg = pb::BatchRequest {
            ops: ops
                .into_iter()
                .map(|op| pb::BatchOp { op: Some(op) })
                .collect(),
        };
        rt.block_on(client.clone().batch(msg))
            .map(|r| r.into_inner().results)
    };
    let s = rt
        .block_on(client.clone().create_session(pb::CreateSessionRequest {
            ttl_ms: 120_000,
            ..Default::default()
        }))
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    let sj = json!({"id": s.id, "secret": s.secret.to_string()});
    let acquire = |seq: u64, name: &str| {
        Op::Acquire(pb::AcquireRequest {
            session: Some(s),
            seq,
            name: name.into(),
            ..Default::default()
        })
    };
    // A malformed op (no session) beside a good one.
    let g = grpc(vec![
        Op::Acquire(pb::AcquireRequest {
            seq: 1,
            name: "m/bad".into(),
            ..Default::default()
        }),
        acquire(2, "m/good"),
    ]);
    let h = batch(
        &http,
        None,
        &[
            json!({"acquire": {"seq": 1, "name": "m/bad2"}}),
            json!({"acquire": {"session": sj, "seq": 3, "name": "m/good2"}}),
        ],
    );
    eprintln!(
        "PROBE malformed op beside a good one: gRPC {g:?}\n      HTTP {} {}",
        h.status, h.body
    );
    // One seq, two names.
    let g = grpc(vec![acquire(10, "g/a"), acquire(10, "g/b")]).unwrap();
    let granted: Vec<bool> = g
        .iter()
        .map(|r| matches!(&r.result, Some(R::Acquire(a)) if a.result == pb::AcquireResult::Granted as i32))
        .collect();
    let b_held = http_call(&http, "GET", "/v1/lock?name=g%2Fb", &[], None, T)
        .unwrap()
        .json()["lock"]["holder"]
        .clone();
    eprintln!("PROBE gRPC one seq two names: granted {granted:?}; g/b holder {b_held}");
    // An unknown session.
    let ghost = pb::Session {
        id: 999_999,
        secret: 5,
    };
    let g = grpc(vec![Op::Acquire(pb::AcquireRequest {
        session: Some(ghost),
        seq: 1,
        name: "g/x".into(),
        ..Default::default()
    })])
    .unwrap();
    let h = batch(
        &http,
        None,
        &[json!({"acquire": {"session": {"id": 999_999, "secret": "5"}, "seq": 1, "name": "g/x"}})],
    );
    eprintln!("PROBE unknown session: gRPC {g:?}\n      HTTP {}", h.body);
    // Empty.
    let g = grpc(vec![]);
    let h = batch(&http, None, &[]);
    eprintln!(
        "PROBE empty: gRPC {:?} | HTTP {} {}",
        g.as_ref()
            .map_err(|e| (e.code(), e.message().to_owned()))
            .err(),
        h.status,
        h.body
    );
    assert_eq!(h.status, 400);
    assert!(g.is_err());
}
