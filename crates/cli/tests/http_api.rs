//! The HTTP/JSON API (`serve --http-listen`, issue #15 item 2) against real `latchkey serve`
//! processes: a whole session's flow, exactly-once retries, errors as JSON with a stable code
//! (a follower's with the leader's address), access control, the OpenAPI document held to the
//! served routes, and the book's curl walkthrough (docs/http.md) run as written.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::serve::ServeProcess;
use common::{free_port, http_call, run, wait_until, HttpReply, Server, POLL, READY_TIMEOUT};
use serde_json::{json, Value};

/// Longer than one long-poll (`ACQUIRE_POLL_MS_MAX`), so that a waiting acquire answers.
const CALL_TIMEOUT: Duration =
    Duration::from_millis(latchkey_core::limits::ACQUIRE_POLL_MS_MAX + 20_000);

/// A server with the HTTP API on a port of its own; its HTTP address.
fn http_server() -> (Server, String) {
    let http = format!("127.0.0.1:{}", free_port());
    let server = Server::start_with(&["--http-listen", &http]);
    (server, http)
}

fn call(addr: &str, method: &str, path: &str, body: Option<Value>) -> HttpReply {
    let body = body.map(|b| b.to_string());
    http_call(addr, method, path, &[], body.as_deref(), CALL_TIMEOUT)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// [`call`] marked as forwarded already (`latchkey-forwarded-by`, issue #33): a follower
/// answers it itself, as a request forwarded once is never forwarded again.
fn call_here(addr: &str, method: &str, path: &str, body: Option<Value>) -> HttpReply {
    let body = body.map(|b| b.to_string());
    let marked = [("latchkey-forwarded-by", "0")];
    http_call(addr, method, path, &marked, body.as_deref(), CALL_TIMEOUT)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// POST `body` to `path`, expecting 200; the answer's JSON.
fn post_ok(addr: &str, path: &str, body: Value) -> Value {
    let reply = call(addr, "POST", path, Some(body.clone()));
    assert_eq!(reply.status, 200, "POST {path} {body}: {reply:?}");
    reply.json()
}

fn get_ok(addr: &str, path: &str) -> Value {
    let reply = call(addr, "GET", path, None);
    assert_eq!(reply.status, 200, "GET {path}: {reply:?}");
    reply.json()
}

fn new_session(addr: &str) -> Value {
    let created = post_ok(addr, "/v1/sessions", json!({"ttl_ms": 15_000}));
    assert_eq!(created["ttl_ms"], 15_000, "{created}");
    assert!(created["session"]["secret"].is_string(), "{created}");
    created["session"].clone()
}

fn acquire(addr: &str, session: &Value, seq: u64, name: &str, wait_ms: u64) -> Value {
    post_ok(
        addr,
        "/v1/locks/acquire",
        json!({"session": session, "seq": seq, "name": name, "wait_timeout_ms": wait_ms}),
    )
}

/// The error a reply carries: its status and its JSON `code`, checked to have a message.
fn error_of(reply: &HttpReply) -> (u16, String) {
    let body = reply.json();
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "an error has a message: {reply:?}"
    );
    assert_eq!(reply.header("content-type"), Some("application/json"));
    (reply.status, body["code"].as_str().unwrap_or("").to_owned())
}

#[test]
fn a_session_takes_waits_for_and_hands_over_a_lock_over_http() {
    let (_server, http) = http_server();
    let a = new_session(&http);
    let b = new_session(&http);

    let first = acquire(&http, &a, 1, "deploy/web", 0);
    assert_eq!(first["result"], "granted", "{first}");
    let token_a = first["token"].as_u64().expect("a token");

    // B asks without waiting: told who holds it.
    let refused = acquire(&http, &b, 1, "deploy/web", 0);
    assert_eq!(refused["result"], "not-granted", "{refused}");
    assert_eq!(refused["held_by"]["token"], token_a, "{refused}");

    // B waits (long-poll) while A holds it.
    let waiter = {
        let (http, b) = (http.clone(), b.clone());
        std::thread::spawn(move || {
            // Re-sent with the same seq while pending, as the protocol says; bounded.
            for _ in 0..10 {
                let answer = acquire(&http, &b, 2, "deploy/web", 60_000);
                if answer["result"] != "pending" {
                    return answer;
                }
            }
            panic!("still pending after 10 long-polls");
        })
    };
    wait_until("B queued", Duration::from_secs(20), || {
        get_ok(&http, "/v1/lock?name=deploy%2Fweb")["lock"]["waiters"] == 1
    });
    let described = get_ok(&http, "/v1/lock?name=deploy/web")["lock"].clone();
    assert_eq!(described["holder"]["session"], a["id"], "{described}");
    assert_eq!(described["queue"][0]["session"], b["id"], "{described}");
    assert!(
        !waiter.is_finished(),
        "B's acquire answered while A held the lock"
    );
    // Conflict events over HTTP too: A's lease lists the name B waits for, B's lists nothing.
    let told = post_ok(&http, "/v1/sessions/keepalive", json!({"sessions": [a, b]}));
    assert_eq!(
        told["leases"][0]["contended"],
        json!(["deploy/web"]),
        "{told}"
    );
    assert_eq!(told["leases"][1]["contended"], json!([]), "{told}");

    let released = post_ok(
        &http,
        "/v1/locks/release",
        json!({"session": a, "seq": 2, "name": "deploy/web", "token": token_a}),
    );
    assert_eq!(released["released"], true, "{released}");
    let handed = waiter.join().expect("B's acquire");
    assert_eq!(handed["result"], "granted", "{handed}");
    let token_b = handed["token"].as_u64().expect("a token");
    assert!(
        token_b > token_a,
        "tokens increase: {token_a} then {token_b}"
    );

    let listed = get_ok(&http, "/v1/locks?prefix=deploy/");
    assert_eq!(listed["truncated"], false, "{listed}");
    assert_eq!(
        listed["locks"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    assert_eq!(listed["locks"][0]["holder"]["token"], token_b, "{listed}");

    let renewed = post_ok(&http, "/v1/sessions/keepalive", json!({"sessions": [a, b]}));
    let leases = renewed["leases"].as_array().expect("leases");
    assert_eq!(leases.len(), 2, "{renewed}");
    assert!(
        leases
            .iter()
            .all(|l| l["alive"] == true && l["ttl_ms"] == 15_000),
        "{renewed}"
    );

    // Closing B releases its lock; A's keepalive of B then says it is gone.
    assert_eq!(
        post_ok(&http, "/v1/sessions/close", json!({"session": b})),
        json!({})
    );
    let after = post_ok(&http, "/v1/sessions/keepalive", json!({"sessions": [a, b]}));
    assert_eq!(after["leases"][0]["alive"], true, "{after}");
    assert_eq!(after["leases"][1]["alive"], false, "{after}");
    let free = get_ok(&http, "/v1/lock?name=deploy/web");
    assert!(free["lock"]["holder"].is_null(), "{free}");

    let status = get_ok(&http, "/v1/cluster/status");
    assert_eq!(status["role"], "leader", "{status}");
    assert_eq!(status["leader_id"], status["id"], "{status}");
    assert_eq!(
        status["members"].as_array().map(Vec::len),
        Some(1),
        "{status}"
    );
}

#[test]
fn a_retried_acquire_gets_its_first_outcome() {
    let (_server, http) = http_server();
    let s = new_session(&http);
    let first = acquire(&http, &s, 7, "jobs/a", 0);
    assert_eq!(first["result"], "granted", "{first}");
    // The same request again (a retry after a lost answer): the same grant, not a new one.
    let retried = acquire(&http, &s, 7, "jobs/a", 0);
    assert_eq!(retried, first, "a retry answers the original outcome");
    let released = post_ok(
        &http,
        "/v1/locks/release",
        json!({"session": s, "seq": 8, "name": "jobs/a", "token": first["token"]}),
    );
    assert_eq!(released["released"], true, "{released}");
    let release_retried = post_ok(
        &http,
        "/v1/locks/release",
        json!({"session": s, "seq": 8, "name": "jobs/a", "token": first["token"]}),
    );
    assert_eq!(
        release_retried, released,
        "a retried release answers its first outcome"
    );
    // Still the original outcome after the release: a late duplicate takes nothing.
    let late = acquire(&http, &s, 7, "jobs/a", 0);
    assert_eq!(late["result"], "granted", "{late}");
    assert_eq!(late["token"], first["token"], "{late}");
    let free = get_ok(&http, "/v1/lock?name=jobs/a");
    assert!(
        free["lock"]["holder"].is_null(),
        "the duplicate took the lock: {free}"
    );
    // A new request is a new grant, with a higher token.
    let again = acquire(&http, &s, 9, "jobs/a", 0);
    assert!(again["token"].as_u64() > first["token"].as_u64(), "{again}");
}

#[test]
fn errors_are_json_with_a_stable_code() {
    let (_server, http) = http_server();
    let s = new_session(&http);
    let post = |path: &str, body: &str| {
        http_call(&http, "POST", path, &[], Some(body), CALL_TIMEOUT).expect("an answer")
    };
    let cases: Vec<(HttpReply, (u16, &str))> = vec![
        (post("/v1/sessions", "{not json"), (400, "invalid-request")),
        (
            post("/v1/sessions", r#"{"ttl_ms": 15000, "tll": 1}"#),
            (400, "invalid-request"),
        ),
        (
            post("/v1/sessions", r#"{"ttl_ms": 5}"#),
            (400, "ttl-out-of-range"),
        ),
        (
            post(
                "/v1/locks/acquire",
                r#"{"session": {"id": 1, "secret": 5}, "seq": 1, "name": "x"}"#,
            ),
            (400, "invalid-request"),
        ),
        (
            post(
                "/v1/locks/acquire",
                &json!({"session": {"id": 999_999, "secret": "1"}, "seq": 1, "name": "x"})
                    .to_string(),
            ),
            (404, "session-not-found"),
        ),
        (
            post(
                "/v1/locks/acquire",
                &json!({"session": s, "seq": 1, "name": ""}).to_string(),
            ),
            (400, "name-empty"),
        ),
        (
            call(&http, "GET", "/v1/nothing", None),
            (404, "no-such-route"),
        ),
        (
            call(&http, "GET", "/v1/locks/acquire", None),
            (405, "method-not-allowed"),
        ),
        (
            call(&http, "GET", "/v1/lock", None),
            (400, "invalid-request"),
        ),
        (
            call(&http, "GET", "/v1/lock?nme=x", None),
            (400, "invalid-request"),
        ),
        (
            call(&http, "GET", "/v1/locks?limit=many", None),
            (400, "invalid-request"),
        ),
        // A group past the most a cluster has is malformed; one this cluster lacks is a fact of
        // the cluster, not of the request (docs/openapi.json calls it valid). Regression: both
        // were 400, which schemathesis found.
        (
            call(&http, "GET", "/v1/locks?group=64", None),
            (400, "invalid-request"),
        ),
        (
            call(&http, "GET", "/v1/locks?group=1", None),
            (409, "no-such-group"),
        ),
        (
            post("/v1/sessions", r#"{"ttl_ms": 15000, "group": 63}"#),
            (409, "no-such-group"),
        ),
        (
            post(
                "/v1/sessions/keepalive",
                &format!(
                    r#"{{"sessions": [], "pad": "{}"}}"#,
                    "x".repeat(latchkey_core::limits::HTTP_BODY_BYTES_MAX)
                ),
            ),
            (413, "body-too-large"),
        ),
    ];
    for (reply, want) in cases {
        assert_eq!(error_of(&reply), (want.0, want.1.to_owned()), "{reply:?}");
    }
}

#[test]
fn a_follower_forwards_to_its_leader_once_and_else_names_the_leaders_address() {
    let cluster = Cluster::start_with_http(3);
    let (leader, _) = cluster.wait_leader(&[], READY_TIMEOUT);
    let leader_addr = cluster.addr(leader);
    let follower = cluster
        .members
        .iter()
        .find(|m| m.id != leader)
        .expect("a follower");
    let follower_http = follower.http_addr.clone().expect("HTTP on every member");
    // Forwarded once already: the follower answers not-leader itself, naming the leader.
    let reply = call_here(
        &follower_http,
        "POST",
        "/v1/sessions",
        Some(json!({"ttl_ms": 15_000})),
    );
    assert_eq!(
        error_of(&reply),
        (503, "not-leader".to_owned()),
        "{reply:?}"
    );
    let body = reply.json();
    assert_eq!(body["leader_id"], leader, "{body}");
    assert_eq!(body["leader_addr"], leader_addr.as_str(), "{body}");
    // Reads are the leader's too; the follower's own status is not.
    let read = call_here(&follower_http, "GET", "/v1/lock?name=x", None);
    assert_eq!(error_of(&read), (503, "not-leader".to_owned()), "{read:?}");
    let status = get_ok(&follower_http, "/v1/cluster/status");
    assert_eq!(status["role"], "follower", "{status}");
    assert_eq!(status["leader_id"], leader, "{status}");
    // Unmarked, the follower forwards the call to its leader (once it heard the leader's HTTP
    // address, which the leader's appends carry), reads too.
    wait_until("the follower forwards", READY_TIMEOUT, || {
        let body = json!({"ttl_ms": 15_000}).to_string();
        http_call(
            &follower_http,
            "POST",
            "/v1/sessions",
            &[],
            Some(&body),
            CALL_TIMEOUT,
        )
        .is_ok_and(|r| r.status == 200)
    });
    let read = get_ok(&follower_http, "/v1/lock?name=x");
    assert_eq!(read["lock"]["holder"], Value::Null, "{read}");
    // A batch (issue #35) too: the follower, refusing every operation as not the leader,
    // answers the batch as a whole `not-leader`, which it forwards as any route's.
    let session = new_session(&follower_http);
    let ops = json!({"ops": [
        {"acquire": {"session": session, "seq": 1, "name": "batched"}},
        {"keepalive": {"sessions": [session]}},
    ]});
    let here = call_here(&follower_http, "POST", "/v1/batch", Some(ops.clone()));
    assert_eq!(error_of(&here), (503, "not-leader".to_owned()), "{here:?}");
    assert_eq!(here.json()["leader_id"], leader, "{here:?}");
    let forwarded = post_ok(&follower_http, "/v1/batch", ops);
    assert_eq!(
        forwarded["results"][0]["acquire"]["result"], "granted",
        "{forwarded}"
    );
    assert_eq!(
        forwarded["results"][1]["keepalive"]["leases"][0]["alive"], true,
        "{forwarded}"
    );
    // The leader's HTTP API takes the call.
    let leader_http = cluster
        .members
        .iter()
        .find(|m| m.id == leader)
        .and_then(|m| m.http_addr.clone())
        .expect("the leader's HTTP address");
    new_session(&leader_http);
}

/// `POST /v1/batch` (issue #35 item 1): one answer per operation, in order, each its own
/// route's answer or an error with the fields of the API's errors; a wait answers pending at
/// once and goes on as its own route's long-poll; a retried operation gets its first outcome;
/// a malformed batch is refused whole with 400.
#[test]
fn a_batch_answers_each_operation_in_order_over_http() {
    let (_server, http) = http_server();
    let s = new_session(&http);
    let other = new_session(&http);
    let held = acquire(&http, &other, 1, "b/held", 0);
    assert_eq!(held["result"], "granted", "{held}");
    let batch = |ops: Value| post_ok(&http, "/v1/batch", json!({ "ops": ops }));
    let first = batch(json!([
        {"acquire": {"session": s, "seq": 1, "name": "b/one"}},
        {"acquire": {"session": s, "seq": 2, "name": "b/held", "wait_timeout_ms": 60_000}},
        {"keepalive": {"sessions": [s, other]}},
        {"acquire": {"session": s, "seq": 3, "name": ""}},
    ]));
    let results = first["results"].as_array().expect("results");
    assert_eq!(results.len(), 4, "{first}");
    assert_eq!(results[0]["acquire"]["result"], "granted", "{first}");
    let token = results[0]["acquire"]["token"].as_u64().expect("a token");
    assert_eq!(results[1]["acquire"]["result"], "pending", "{first}");
    assert_eq!(results[1]["acquire"]["position"], 1, "{first}");
    let leases = &results[2]["keepalive"]["leases"];
    assert_eq!(leases.as_array().map(Vec::len), Some(2), "{first}");
    assert!(
        leases
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["alive"] == true),
        "{first}"
    );
    let e = &results[3]["error"];
    assert_eq!(
        (&e["status"], &e["code"]),
        (&json!(400), &json!("name-empty")),
        "{first}"
    );
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{first}"
    );

    // The grant sent again: its first outcome. The lock released, the other session closed.
    let second = batch(json!([
        {"acquire": {"session": s, "seq": 1, "name": "b/one"}},
        {"release": {"session": s, "seq": 4, "name": "b/one", "token": token}},
        {"close": {"session": other}},
    ]));
    assert_eq!(second["results"][0]["acquire"]["token"], token, "{second}");
    assert_eq!(
        second["results"][1]["release"]["released"], true,
        "{second}"
    );
    assert_eq!(second["results"][2]["close"], json!({}), "{second}");
    // The wait goes on through its own route, same seq: the lock is free now.
    let granted = acquire(&http, &s, 2, "b/held", 60_000);
    assert_eq!(granted["result"], "granted", "{granted}");

    let max = latchkey_core::limits::BATCH_CALL_OPS_MAX;
    let ka = json!({"keepalive": {"sessions": [s]}});
    let acq = json!({"acquire": {"session": s, "seq": 9, "name": "b/x"}});
    for (what, body) in [
        ("no operation", json!({"ops": []})),
        ("too many", json!({"ops": vec![acq.clone(); max + 1]})),
        ("two keepalives", json!({"ops": [ka, ka]})),
        (
            "an unknown operation",
            json!({"ops": [{"lock": {"session": s}}]}),
        ),
        (
            "two words in one operation",
            json!({"ops": [{"close": {"session": s}, "keepalive": {"sessions": []}}]}),
        ),
        (
            "a field the route does not take",
            json!({"ops": [{"close": {"session": s, "x": 1}}]}),
        ),
        ("a bare list", json!([acq])),
        ("no ops", json!({})),
    ] {
        let reply = call(&http, "POST", "/v1/batch", Some(body));
        assert_eq!(
            error_of(&reply),
            (400, "invalid-request".to_owned()),
            "{what}: {reply:?}"
        );
    }
    // Nothing of the refused batches ran.
    let lock = get_ok(&http, "/v1/lock?name=b/x");
    assert_eq!(lock["lock"]["holder"], Value::Null, "{lock}");
}

/// With several Raft groups (issue #16) the HTTP API routes as the gRPC one does: a session is
/// made in a named group and takes only that group's locks, each call goes to its group's
/// leader (an error names the group and the leader), one keepalive renews the groups this
/// member leads and refuses the others with their leader, a list is one group's, and the
/// status shows every group.
#[test]
fn the_http_api_serves_a_cluster_of_several_raft_groups() {
    // Members with a peer port of their own: their membership addresses are CLIENT/PEER, of
    // which every answer names the client part.
    let cluster = Cluster::start_with_peer_listen(3, &["--groups", "3", "--http-listen"]);
    let http = |id: u64| {
        cluster.members[id as usize - 1]
            .http_addr
            .clone()
            .expect("HTTP on every member")
    };
    // Group g of a new cluster is founded and led by member g + 1.
    wait_until("each group led by its founder", READY_TIMEOUT, || {
        let s = get_ok(&http(1), "/v1/cluster/status");
        s["groups"] == 3 && (0..3u64).all(|g| s["group_status"][g as usize]["leader_id"] == g + 1)
    });
    let names = common::names_by_group(3);

    // A session is made in a group, which a cluster of several needs named.
    let reply = call(
        &http(1),
        "POST",
        "/v1/sessions",
        Some(json!({"ttl_ms": 15_000})),
    );
    assert_eq!(
        error_of(&reply),
        (409, "not-with-groups".to_owned()),
        "{reply:?}"
    );
    let created = post_ok(
        &http(1),
        "/v1/sessions",
        json!({"ttl_ms": 15_000, "group": 0}),
    );
    assert_eq!(
        (created["group"].clone(), created["groups"].clone()),
        (json!(0), json!(3))
    );
    let s0 = created["session"].clone();
    let granted = acquire(&http(1), &s0, 1, &names[0], 0);
    assert_eq!(granted["result"], "granted", "{granted}");
    let described = get_ok(&http(1), &format!("/v1/lock?name={}", names[0]));
    assert_eq!(described["group"], 0, "{described}");
    // The read reflects the log up to the grant's entry at least (its token is that index).
    assert!(
        described["read_index"].as_u64() >= granted["token"].as_u64(),
        "{described} after {granted}"
    );
    assert_eq!(
        described["lock"]["holder"]["session"], s0["id"],
        "{described}"
    );

    // A lock of another group is not this session's to take.
    let reply = call(
        &http(1),
        "POST",
        "/v1/locks/acquire",
        Some(json!({"session": s0, "seq": 2, "name": names[1], "wait_timeout_ms": 0})),
    );
    assert_eq!(
        error_of(&reply),
        (409, "wrong-group".to_owned()),
        "{reply:?}"
    );

    // Group 1 is member 2's: member 1 forwards a call there (`http_forwarding.rs`); one
    // marked as forwarded already it answers itself, sending the client there, naming the group.
    let reply = call_here(
        &http(1),
        "POST",
        "/v1/sessions",
        Some(json!({"ttl_ms": 15_000, "group": 1})),
    );
    assert_eq!(
        error_of(&reply),
        (503, "not-leader".to_owned()),
        "{reply:?}"
    );
    let body = reply.json();
    assert_eq!(body["group"], 1, "{body}");
    assert_eq!(body["leader_id"], 2, "{body}");
    assert_eq!(body["leader_addr"], cluster.addr(2).as_str(), "{body}");
    let read = call_here(
        &http(1),
        "GET",
        &format!("/v1/lock?name={}", names[1]),
        None,
    );
    assert_eq!(error_of(&read), (503, "not-leader".to_owned()), "{read:?}");
    assert_eq!(read.json()["group"], 1, "{read:?}");
    let s1 = post_ok(
        &http(2),
        "/v1/sessions",
        json!({"ttl_ms": 15_000, "group": 1}),
    )["session"]
        .clone();
    let granted = acquire(&http(2), &s1, 1, &names[1], 0);
    assert_eq!(granted["result"], "granted", "{granted}");

    // One keepalive to member 1 with both sessions: group 0's is renewed, group 1's refused
    // with its leader.
    let renewed = post_ok(
        &http(1),
        "/v1/sessions/keepalive",
        json!({"sessions": [s0, s1]}),
    );
    let leases = renewed["leases"].as_array().expect("leases");
    assert_eq!(leases.len(), 1, "{renewed}");
    assert_eq!(
        (leases[0]["id"].clone(), leases[0]["alive"].clone()),
        (s0["id"].clone(), json!(true))
    );
    let refused = renewed["refused"].as_array().expect("refused");
    assert_eq!(refused.len(), 1, "{renewed}");
    assert_eq!(
        (
            refused[0]["group"].clone(),
            refused[0]["code"].clone(),
            refused[0]["leader_id"].clone(),
            refused[0]["leader_addr"].clone()
        ),
        (
            json!(1),
            json!("not-leader"),
            json!(2),
            json!(cluster.addr(2))
        ),
        "{renewed}"
    );
    // A session named twice, once with a wrong secret, gets each its own answer.
    let forged = json!({"id": s0["id"], "secret": "1"});
    let twice = post_ok(
        &http(1),
        "/v1/sessions/keepalive",
        json!({"sessions": [s0, forged]}),
    );
    let alive: Vec<Value> = twice["leases"]
        .as_array()
        .expect("leases")
        .iter()
        .map(|l| l["alive"].clone())
        .collect();
    assert_eq!(alive, [json!(true), json!(false)], "{twice}");
    let at_leader = post_ok(
        &http(2),
        "/v1/sessions/keepalive",
        json!({"sessions": [s1]}),
    );
    assert_eq!(at_leader["leases"][0]["alive"], true, "{at_leader}");
    assert_eq!(at_leader["refused"], json!([]), "{at_leader}");

    // A list is one group's, at its leader.
    let reply = call(&http(1), "GET", "/v1/locks?prefix=", None);
    assert_eq!(
        error_of(&reply),
        (409, "not-with-groups".to_owned()),
        "{reply:?}"
    );
    let listed = get_ok(&http(1), "/v1/locks?prefix=&group=0");
    let listed: Vec<&str> = listed["locks"]
        .as_array()
        .expect("locks")
        .iter()
        .filter_map(|l| l["name"].as_str())
        .collect();
    assert_eq!(listed, [names[0].as_str()]);
    let reply = call_here(&http(1), "GET", "/v1/locks?group=1", None);
    assert_eq!(
        error_of(&reply),
        (503, "not-leader".to_owned()),
        "{reply:?}"
    );
    // A group this cluster lacks is a conflict with the cluster, not bad input (a request
    // naming it is valid by docs/openapi.json, which cannot know the count).
    let reply = call(&http(1), "GET", "/v1/locks?group=3", None);
    assert_eq!(
        error_of(&reply),
        (409, "no-such-group".to_owned()),
        "{reply:?}"
    );

    // The status shows every group as this member sees it.
    let status = get_ok(&http(1), "/v1/cluster/status");
    let groups = status["group_status"].as_array().expect("group_status");
    assert_eq!(groups.len(), 3, "{status}");
    assert_eq!(groups[0]["role"], "leader", "{status}");
    assert_eq!(groups[1]["role"], "follower", "{status}");
    assert_eq!(
        groups[1]["leader_addr"],
        cluster.addr(2).as_str(),
        "{status}"
    );
    assert_eq!(
        groups[1]["voters"].as_array().map(Vec::len),
        Some(3),
        "{status}"
    );

    // Release, close and force-release go to their group's leader too.
    let reply = call_here(
        &http(1),
        "POST",
        "/v1/sessions/close",
        Some(json!({"session": s1})),
    );
    assert_eq!(
        error_of(&reply),
        (503, "not-leader".to_owned()),
        "{reply:?}"
    );
    assert_eq!(reply.json()["group"], 1, "{reply:?}");
    let token = described["lock"]["holder"]["token"].clone();
    let released = post_ok(
        &http(1),
        "/v1/locks/release",
        json!({"session": s0, "seq": 3, "name": names[0], "token": token}),
    );
    assert_eq!(released["released"], true, "{released}");
    let reply = call_here(
        &http(1),
        "POST",
        "/v1/admin/release",
        Some(json!({"name": names[1], "reason": "test"})),
    );
    assert_eq!(
        error_of(&reply),
        (503, "not-leader".to_owned()),
        "{reply:?}"
    );
    assert_eq!(reply.json()["group"], 1, "{reply:?}");
    let forced = post_ok(
        &http(2),
        "/v1/admin/release",
        json!({"name": names[1], "reason": "test"}),
    );
    assert_eq!(forced["session"], s1["id"], "{forced}");
    post_ok(&http(2), "/v1/sessions/close", json!({"session": s1}));
}

const APP: &str = "app-token-0123456789";
const OTHER: &str = "other-token-0123456789";

/// Kills the server when dropped, printing its log if the test failed.
struct Running(ServeProcess);

impl Drop for Running {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- server log ---\n{}", self.0.log_tail(60));
        }
        self.0.kill9();
    }
}

#[test]
fn access_control_applies_over_http() {
    access_control_over_http(1);
}

/// The same with two Raft groups and the session in group 1: the access check runs at the
/// node of the session's group, whose table says whose it is (group 0's does not know it).
#[test]
fn access_control_applies_in_every_raft_group_over_http() {
    access_control_over_http(2);
}

fn access_control_over_http(groups: u32) {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl.toml");
    std::fs::write(
        &acl,
        format!(
            r#"
[roles.app]
lock = ["app/"]
read = ["app/"]

[identities.app]
token_sha256 = "{}"
roles = ["app"]

[identities.other]
token_sha256 = "{}"
roles = ["app"]
"#,
            common::sha256_hex(APP),
            common::sha256_hex(OTHER)
        ),
    )
    .unwrap();
    let http = format!("127.0.0.1:{}", free_port());
    let mut process = ServeProcess::new(dir.path().join("server.log"));
    process.spawn(
        "the ACL server",
        [
            "--listen".to_owned(),
            format!("127.0.0.1:{}", free_port()),
            "--data-dir".to_owned(),
            dir.path().join("data").display().to_string(),
            "--acl".to_owned(),
            acl.display().to_string(),
            "--http-listen".to_owned(),
            http.clone(),
            "--groups".to_owned(),
            groups.to_string(),
        ],
    );
    let _running = Running(process);
    // A name of the last group, and that group's parameter for the calls that name one.
    let name = (0..)
        .map(|i| format!("app/x{i}"))
        .find(|n| latchkey_core::group_of(n, groups) == groups - 1)
        .unwrap();
    let group_param = if groups > 1 {
        format!("&group={}", groups - 1)
    } else {
        String::new()
    };
    let app = format!("Bearer {APP}");
    let other = format!("Bearer {OTHER}");
    let as_app = [("authorization", app.as_str())];
    let as_other = [("authorization", other.as_str())];
    let send = |auth: &[(&str, &str)], method: &str, path: &str, body: Option<Value>| {
        let body = body.map(|b| b.to_string());
        http_call(&http, method, path, auth, body.as_deref(), CALL_TIMEOUT)
    };
    wait_until("the ACL server leads every group", READY_TIMEOUT, || {
        send(&as_app, "GET", "/v1/cluster/status", None).is_ok_and(|r| {
            let status = r.json();
            r.status == 200
                && status["group_status"]
                    .as_array()
                    .is_some_and(|g| g.iter().all(|g| g["role"] == "leader"))
        })
    });

    let session = if groups > 1 {
        json!({"ttl_ms": 15_000, "group": groups - 1})
    } else {
        json!({"ttl_ms": 15_000})
    };
    let anonymous = send(&[], "POST", "/v1/sessions", Some(session.clone())).unwrap();
    assert_eq!(error_of(&anonymous), (401, "unauthenticated".to_owned()));
    let wrong = send(
        &[("authorization", "Bearer not-a-known-token")],
        "POST",
        "/v1/sessions",
        Some(session.clone()),
    )
    .unwrap();
    assert_eq!(error_of(&wrong), (401, "unauthenticated".to_owned()));

    let created = send(&as_app, "POST", "/v1/sessions", Some(session)).unwrap();
    assert_eq!(created.status, 200, "{created:?}");
    let s = created.json()["session"].clone();
    let take = |auth: &[(&str, &str)], seq: u64, name: &str| {
        send(
            auth,
            "POST",
            "/v1/locks/acquire",
            Some(json!({"session": s, "seq": seq, "name": name})),
        )
        .unwrap()
    };
    let outside = take(&as_app, 1, "ops/db");
    assert_eq!(error_of(&outside), (403, "permission-denied".to_owned()));
    assert!(
        outside.json()["message"]
            .as_str()
            .unwrap()
            .contains("ops/db"),
        "{outside:?}"
    );
    // Another identity may not use app's session, even on names it may lock, nor renew or
    // close it.
    let borrowed = take(&as_other, 2, &name);
    assert_eq!(error_of(&borrowed), (403, "permission-denied".to_owned()));
    for (path, body) in [
        ("/v1/sessions/keepalive", json!({"sessions": [s]})),
        ("/v1/sessions/close", json!({"session": s})),
    ] {
        let refused = send(&as_other, "POST", path, Some(body)).unwrap();
        assert_eq!(
            error_of(&refused),
            (403, "permission-denied".to_owned()),
            "{path}"
        );
    }
    let granted = take(&as_app, 3, &name);
    assert_eq!(granted.status, 200, "{granted:?}");
    assert_eq!(granted.json()["result"], "granted");
    let read_outside = send(&as_app, "GET", "/v1/locks?prefix=", None).unwrap();
    assert_eq!(
        error_of(&read_outside),
        (403, "permission-denied".to_owned())
    );
    let read_inside = send(
        &as_app,
        "GET",
        &format!("/v1/locks?prefix=app/{group_param}"),
        None,
    )
    .unwrap();
    assert_eq!(read_inside.status, 200, "{read_inside:?}");
    assert_eq!(read_inside.json()["locks"][0]["name"], name.as_str());
}

/// The (method, path) pairs `docs/openapi.json` documents.
const ADMIN: &str = "admin-token-0123456789";

/// `POST /v1/admin/release` is the gRPC AdminRelease: refused without `admin` on the lock,
/// else the holder's grant is taken and the audit log names the identity and the reason.
#[test]
fn an_admin_force_releases_over_http_and_the_audit_log_has_it() {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl.toml");
    std::fs::write(
        &acl,
        format!(
            r#"
[roles.app]
lock = ["app/"]
read = ["app/"]

[roles.admin]
admin = [""]
read = [""]

[identities.app]
token_sha256 = "{}"
roles = ["app"]

[identities.ops]
token_sha256 = "{}"
roles = ["admin"]
"#,
            common::sha256_hex(APP),
            common::sha256_hex(ADMIN)
        ),
    )
    .unwrap();
    let grpc = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let mut process = ServeProcess::new(dir.path().join("server.log"));
    process.spawn(
        "the ACL server",
        [
            "--listen".to_owned(),
            grpc.clone(),
            "--data-dir".to_owned(),
            dir.path().join("data").display().to_string(),
            "--acl".to_owned(),
            acl.display().to_string(),
            "--http-listen".to_owned(),
            http.clone(),
        ],
    );
    let _running = Running(process);
    let app = format!("Bearer {APP}");
    let admin = format!("Bearer {ADMIN}");
    let as_app = [("authorization", app.as_str())];
    let as_admin = [("authorization", admin.as_str())];
    let send = |auth: &[(&str, &str)], method: &str, path: &str, body: Option<Value>| {
        let body = body.map(|b| b.to_string());
        http_call(&http, method, path, auth, body.as_deref(), CALL_TIMEOUT).unwrap()
    };
    wait_until("the ACL server leads", READY_TIMEOUT, || {
        http_call(
            &http,
            "GET",
            "/v1/cluster/status",
            &as_app,
            None,
            CALL_TIMEOUT,
        )
        .is_ok_and(|r| r.status == 200 && r.json()["role"] == "leader")
    });
    let status = send(&as_app, "GET", "/v1/cluster/status", None).json();
    assert_eq!(status["access_control"], true, "{status}");

    let created = send(
        &as_app,
        "POST",
        "/v1/sessions",
        Some(json!({"ttl_ms": 15_000})),
    );
    assert_eq!(created.status, 200, "{created:?}");
    let s = created.json()["session"].clone();
    let granted = send(
        &as_app,
        "POST",
        "/v1/locks/acquire",
        Some(json!({"session": s, "seq": 1, "name": "app/x"})),
    );
    assert_eq!(granted.json()["result"], "granted", "{granted:?}");
    let token = granted.json()["token"].as_u64().unwrap();

    let release =
        |auth: &[(&str, &str)], body: Value| send(auth, "POST", "/v1/admin/release", Some(body));
    let reason = "INC-7 stuck deploy";
    // May lock app/x, but not force-release it.
    let denied = release(
        &as_app,
        json!({"name": "app/x", "token": token, "reason": reason}),
    );
    assert_eq!(error_of(&denied), (403, "permission-denied".to_owned()));
    let anonymous = release(&[], json!({"name": "app/x", "reason": reason}));
    assert_eq!(error_of(&anonymous), (401, "unauthenticated".to_owned()));
    let no_reason = release(&as_admin, json!({"name": "app/x", "reason": ""}));
    assert_eq!(error_of(&no_reason).0, 400, "{no_reason:?}");
    let stale = release(
        &as_admin,
        json!({"name": "app/x", "token": token + 1, "reason": reason}),
    );
    assert_eq!(error_of(&stale).0, 409, "{stale:?}");
    let held = send(&as_app, "GET", "/v1/lock?name=app/x", None).json();
    assert_eq!(held["lock"]["holder"]["token"], token, "still held: {held}");

    let taken = release(
        &as_admin,
        json!({"name": "app/x", "token": token, "reason": reason, "operator": "alice@ops"}),
    );
    assert_eq!(taken.status, 200, "{taken:?}");
    assert_eq!(
        taken.json(),
        json!({"session": s["id"], "token": token}),
        "{taken:?}"
    );
    let free = send(&as_app, "GET", "/v1/lock?name=app/x", None).json();
    assert_eq!(free["lock"]["holder"], Value::Null, "{free}");

    let audit = run(
        &[
            "audit".into(),
            "--json".into(),
            "--endpoints".into(),
            grpc,
            "--auth-token".into(),
            ADMIN.into(),
        ],
        dir.path(),
        CALL_TIMEOUT,
    );
    assert!(audit.status.success(), "latchkey audit: {audit:?}");
    let records: Value = serde_json::from_str(&audit.stdout).unwrap();
    assert_eq!(records.as_array().map(Vec::len), Some(1), "{records}");
    let r = &records[0];
    assert_eq!(r["action"], "force-release", "{r}");
    assert_eq!(r["lock"], "app/x", "{r}");
    assert_eq!(r["token"], token, "{r}");
    assert_eq!(r["identity"], "ops", "{r}");
    assert_eq!(r["reason"], reason, "{r}");
}

fn documented_routes() -> BTreeSet<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json");
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("docs/openapi.json"))
            .expect("docs/openapi.json is JSON");
    assert_eq!(
        doc["openapi"].as_str().map(|v| &v[..2]),
        Some("3."),
        "an OpenAPI 3 document"
    );
    let mut routes = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("a path item").keys() {
            routes.insert((method.to_uppercase(), path.clone()));
        }
    }
    routes
}

#[test]
fn the_openapi_document_describes_exactly_the_served_routes() {
    let documented = documented_routes();
    let routed: BTreeSet<(String, String)> = latchkey_server::http::ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(
        documented, routed,
        "docs/openapi.json and http::ROUTES differ"
    );

    // And the running server serves each of them (a route it lacks answers no-such-route or
    // method-not-allowed, whatever the body).
    let (_server, http) = http_server();
    for (method, path) in &documented {
        let body = (method == "POST").then(|| json!({}));
        let reply = call(&http, method, path, body);
        let code = serde_json::from_str::<Value>(&reply.body)
            .ok()
            .and_then(|b| b["code"].as_str().map(str::to_owned));
        assert!(
            !matches!(
                code.as_deref(),
                Some("no-such-route" | "method-not-allowed")
            ),
            "{method} {path} is documented but not served: {reply:?}"
        );
    }
    let served = get_ok(&http, "/v1/openapi.json");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json");
    let file: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(
        served, file,
        "GET /v1/openapi.json serves docs/openapi.json"
    );
}

/// The book's "HTTP API" walkthrough (docs/http.md): the shell block between the `http-api`
/// markers, run by `bash` in an empty directory with `latchkey` on the PATH and its ports moved
/// to free ones.
#[test]
fn the_books_http_walkthrough_runs_as_written() {
    let script = common::walkthrough::book_block("http-api");
    for fixed in ["127.0.0.1:7420", "127.0.0.1:7480"] {
        assert!(script.contains(fixed), "the walkthrough uses {fixed}");
    }
    let script = script
        .replace("127.0.0.1:7420", &format!("127.0.0.1:{}", free_port()))
        .replace("127.0.0.1:7480", &format!("127.0.0.1:{}", free_port()));
    let dir = tempfile::tempdir().unwrap();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_latchkey")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    use std::os::unix::process::CommandExt as _;
    let mut child = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        // Its own process group, killed whole below: the server it starts goes with it.
        .process_group(0)
        .current_dir(dir.path())
        .env("PATH", path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("bash");
    let _group = Group(child.id() as i32);
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the walkthrough did not finish in 120 s");
        }
        std::thread::sleep(POLL);
    };
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        status.success(),
        "the walkthrough failed: {status}\n{stdout}\n{stderr}"
    );
    // What the walkthrough's comments promise.
    for promised in [
        r#""result":"granted""#,
        r#""result":"not-granted""#,
        r#""released":true"#,
        r#""code":"session-not-found""#,
    ] {
        assert!(
            stdout.contains(promised),
            "no {promised} in:\n{stdout}\n{stderr}"
        );
    }
}

/// Kills the walkthrough's process group (the shell and the server it started) when dropped.
struct Group(i32);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(-self.0),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Issue #33 item 4: the CLI pointed at the HTTP API's port or the metrics port says that the
/// port answered HTTP and is not a gRPC port (it said `server error (Internal): protocol error:
/// received message with invalid compression flag: 123` and `server error (Unimplemented):
/// grpc-status header missing`).
#[test]
fn the_cli_at_the_http_or_metrics_port_says_it_is_not_a_grpc_port() {
    let http = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let _server = Server::start_with(&["--http-listen", &http, "--metrics-listen", &metrics]);
    let tmp = tempfile::tempdir().unwrap();
    for port in [&http, &metrics] {
        let args: Vec<String> = ["status", "--endpoints", port.as_str(), "jobs/a"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let out = run(&args, tmp.path(), common::CLI_TIMEOUT);
        assert!(!out.status.success(), "{}", out.stderr);
        assert!(
            out.stderr.contains(&format!(
                "{port} answered HTTP without gRPC: it is not a latchkey gRPC port"
            )),
            "{}",
            out.stderr
        );
    }
}

/// Issue #33: a browser pointed at the HTTP port finds the page: `GET /` redirects to `/ui`
/// (it answered 404).
#[test]
fn the_root_redirects_to_the_page() {
    let (_server, http) = http_server();
    let reply = call(&http, "GET", "/", None);
    assert_eq!(reply.status, 303, "{reply:?}");
    assert_eq!(reply.header("location"), Some("/ui"), "{reply:?}");
    assert_eq!(call(&http, "GET", "/ui", None).status, 200);
}

/// Issue #32 over HTTP: `mode` takes `"shared"` or `{"permits": N}`; a lock's answer has
/// `mode`, `permits` and every holder; bad modes are 400 and a kind clash 409, each with its
/// code.
#[test]
fn readers_and_permits_over_http() {
    let (_server, http) = http_server();
    let s: Vec<Value> = (0..3).map(|_| new_session(&http)).collect();
    let take = |session: &Value, seq: u64, name: &str, mode: Value| {
        call(
            &http,
            "POST",
            "/v1/locks/acquire",
            Some(json!({"session": session, "seq": seq, "name": name, "mode": mode})),
        )
    };
    let t0 = take(&s[0], 1, "jobs", json!({"permits": 2})).json();
    let t1 = take(&s[1], 1, "jobs", json!({"permits": 2.0})).json();
    assert_eq!(
        (&t0["result"], &t1["result"]),
        (&json!("granted"), &json!("granted"))
    );
    let full = take(&s[2], 1, "jobs", json!({"permits": 2})).json();
    assert_eq!(full["result"], "not-granted", "{full}");
    let lock = get_ok(&http, "/v1/lock?name=jobs")["lock"].clone();
    assert_eq!(
        (&lock["mode"], &lock["permits"]),
        (&json!("permits"), &json!(2)),
        "{lock}"
    );
    let tokens: Vec<&Value> = lock["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .map(|h| &h["token"])
        .collect();
    assert_eq!(tokens, vec![&t0["token"], &t1["token"]], "{lock}");
    assert_eq!(
        lock["holder"]["token"], t0["token"],
        "the first holder: {lock}"
    );

    for ((mode, status, code), seq) in [
        (json!({"permits": 0}), 400, "permits-out-of-range"),
        (json!({"permits": 1025}), 400, "permits-out-of-range"),
        (json!({"permits": 2, "extra": 1}), 400, "invalid-request"),
        (json!("reader"), 400, "invalid-request"),
        (json!({"permits": 3}), 409, "permits-conflict"),
        (json!("shared"), 409, "kind-conflict"),
    ]
    .into_iter()
    .zip(10..)
    {
        // A seq each: a rejection is a remembered outcome, answered again to the same seq.
        let reply = take(&s[2], seq, "jobs", mode.clone());
        assert_eq!(
            error_of(&reply),
            (status, code.to_owned()),
            "{mode}: {reply:?}"
        );
    }

    let r0 = take(&s[0], 3, "cfg", json!("shared")).json();
    let r1 = take(&s[1], 3, "cfg", json!("shared")).json();
    assert_eq!(
        (&r0["result"], &r1["result"]),
        (&json!("granted"), &json!("granted"))
    );
    let writer = take(&s[2], 4, "cfg", json!("exclusive")).json();
    assert_eq!(writer["result"], "not-granted", "{writer}");
    let listed = get_ok(&http, "/v1/locks?prefix=cfg");
    let cfg = &listed["locks"][0];
    assert_eq!(
        (&cfg["mode"], &cfg["permits"]),
        (&json!("shared"), &Value::Null),
        "{cfg}"
    );
    assert_eq!(cfg["holders"].as_array().map(Vec::len), Some(2), "{cfg}");

    // A mutex, without `mode`, reads as before (and says it is exclusive).
    let m = acquire(&http, &s[2], 5, "mutex", 0);
    assert_eq!(m["result"], "granted", "{m}");
    let lock = get_ok(&http, "/v1/lock?name=mutex")["lock"].clone();
    assert_eq!(lock["mode"], "exclusive", "{lock}");
    assert_eq!(lock["holders"][0]["token"], m["token"], "{lock}");
}

/// Issue #32's elections over HTTP: an acquire with `value` is a campaign whose holder shows
/// the value; `POST /v1/locks/proclaim` replaces it for the leader under its token only (409
/// not-election-leader otherwise); a value with a shared mode is 400 invalid-request.
#[test]
fn elections_over_http() {
    let (_server, http) = http_server();
    let a = new_session(&http);
    let b = new_session(&http);
    let campaign = |session: &Value, seq: u64, mode: &str, value: &str| {
        call(
            &http,
            "POST",
            "/v1/locks/acquire",
            Some(
                json!({"session": session, "seq": seq, "name": "svc", "mode": mode, "value": value}),
            ),
        )
    };
    let proclaim = |session: &Value, seq: u64, token: &Value, value: &str| {
        call(
            &http,
            "POST",
            "/v1/locks/proclaim",
            Some(
                json!({"session": session, "seq": seq, "name": "svc", "token": token, "value": value}),
            ),
        )
    };
    let shared = campaign(&a, 1, "shared", "x");
    assert_eq!(
        error_of(&shared),
        (400, "invalid-request".into()),
        "{shared:?}"
    );
    let led = campaign(&a, 2, "exclusive", "a:80").json();
    assert_eq!(led["result"], "granted", "{led}");
    let lock = get_ok(&http, "/v1/lock?name=svc")["lock"].clone();
    assert_eq!(lock["holder"]["value"], "a:80", "{lock}");
    assert_eq!(lock["holders"][0]["value"], "a:80", "{lock}");

    assert_eq!(proclaim(&a, 3, &led["token"], "a:81").status, 200);
    let lock = get_ok(&http, "/v1/lock?name=svc")["lock"].clone();
    assert_eq!(lock["holder"]["value"], "a:81", "{lock}");
    let other = proclaim(&b, 1, &led["token"], "b");
    assert_eq!(
        error_of(&other),
        (409, "not-election-leader".into()),
        "{other:?}"
    );
    // A plain lock's holder has no value.
    let m = acquire(&http, &b, 2, "mutex", 0);
    let lock = get_ok(&http, "/v1/lock?name=mutex")["lock"].clone();
    assert_eq!(lock["holder"]["token"], m["token"], "{lock}");
    assert!(lock["holder"].get("value").is_none(), "{lock}");
}
