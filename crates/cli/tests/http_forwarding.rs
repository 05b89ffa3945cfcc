//! Any member serves every HTTP route (issue #33 item 2): a follower forwards a request its
//! leader must answer, carrying the caller's bearer token for the leader to check. Three real
//! members, requests sent round-robin over their HTTP ports as a load balancer would.

mod common;

use std::cell::Cell;
use std::time::Duration;

use common::cluster::{Cluster, Timing};
use common::{http_call, HttpReply, READY_TIMEOUT};
use serde_json::{json, Value};

/// Longer than one long-poll (`ACQUIRE_POLL_MS_MAX`), so that a waiting acquire answers.
const CALL_TIMEOUT: Duration =
    Duration::from_millis(latchkey_core::limits::ACQUIRE_POLL_MS_MAX + 20_000);

const ADMIN: &str = "admin-token-0123456789";
const APP: &str = "app-token-0123456789";
/// The mark a follower puts on a request it forwards (`api::http::forward::FORWARDED_HEADER`).
const FORWARDED_BY: &str = "latchkey-forwarded-by";

/// An access-control list: `app` may take and read names under `app_prefix`, `admin` anything.
fn acl_text(app_prefix: &str) -> String {
    format!(
        r#"
[roles.app]
lock = ["{app_prefix}"]
read = ["{app_prefix}"]

[roles.admin]
admin = [""]
lock = [""]
read = [""]

[identities.app]
token_sha256 = "{}"
roles = ["app"]

[identities.admin]
token_sha256 = "{}"
roles = ["admin"]
"#,
        common::sha256_hex(APP),
        common::sha256_hex(ADMIN)
    )
}

/// Sends each request to the next member's HTTP port, round-robin.
struct RoundRobin {
    addrs: Vec<String>,
    next: Cell<usize>,
    token: Option<String>,
}

impl RoundRobin {
    fn over(cluster: &Cluster, token: Option<&str>) -> RoundRobin {
        RoundRobin {
            addrs: cluster
                .members
                .iter()
                .map(|m| m.http_addr.clone().expect("HTTP on every member"))
                .collect(),
            next: Cell::new(0),
            token: token.map(|t| format!("Bearer {t}")),
        }
    }

    /// The reply, and the member's HTTP address that answered.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> (HttpReply, String) {
        let addr = self.addrs[self.next.get() % self.addrs.len()].clone();
        self.next.set(self.next.get() + 1);
        let body = body.map(|b| b.to_string());
        let auth: Vec<(&str, &str)> = self
            .token
            .iter()
            .map(|t| ("authorization", t.as_str()))
            .collect();
        let reply = http_call(&addr, method, path, &auth, body.as_deref(), CALL_TIMEOUT)
            .unwrap_or_else(|e| panic!("{method} {path} at {addr}: {e}"));
        (reply, addr)
    }

    fn ok(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (reply, addr) = self.call(method, path, body.clone());
        assert_eq!(
            reply.status, 200,
            "{method} {path} {body:?} at {addr}: {reply:?}"
        );
        reply.json()
    }
}

/// Until every follower has heard its leader's HTTP address (the first append after the
/// election carries it), a follower answers `not-leader`: wait for one create to pass on each.
fn wait_forwarding(rr: &RoundRobin) {
    for addr in &rr.addrs {
        common::wait_until("the member forwards", READY_TIMEOUT, || {
            let auth: Vec<(&str, &str)> = rr
                .token
                .iter()
                .map(|t| ("authorization", t.as_str()))
                .collect();
            http_call(
                addr,
                "GET",
                "/v1/locks?prefix=app%2F",
                &auth,
                None,
                CALL_TIMEOUT,
            )
            .is_ok_and(|r| r.status == 200)
        });
    }
}

#[test]
fn every_route_succeeds_through_a_round_robin_over_three_members() {
    let cluster = Cluster::start_with_http(3);
    let rr = RoundRobin::over(&cluster, None);
    wait_forwarding(&rr);
    // Each step goes to the next member: two in three land on a follower.
    let session = rr.ok("POST", "/v1/sessions", Some(json!({"ttl_ms": 15_000})))["session"].clone();
    let other = rr.ok("POST", "/v1/sessions", Some(json!({"ttl_ms": 15_000})))["session"].clone();
    let granted = rr.ok(
        "POST",
        "/v1/locks/acquire",
        Some(json!({"session": session, "seq": 1, "name": "rr/a", "wait_timeout_ms": 0})),
    );
    assert_eq!(granted["result"], "granted", "{granted}");
    let token = granted["token"].clone();
    // A retry with the same (session, seq), through another member, gets the same grant.
    let again = rr.ok(
        "POST",
        "/v1/locks/acquire",
        Some(json!({"session": session, "seq": 1, "name": "rr/a", "wait_timeout_ms": 0})),
    );
    assert_eq!(again["token"], token, "{again}");
    for _ in 0..3 {
        let described = rr.ok("GET", "/v1/lock?name=rr%2Fa", None);
        assert_eq!(described["lock"]["holder"]["token"], token, "{described}");
        let listed = rr.ok("GET", "/v1/locks?prefix=rr%2F", None);
        assert_eq!(listed["locks"][0]["name"], "rr/a", "{listed}");
        let renewed = rr.ok(
            "POST",
            "/v1/sessions/keepalive",
            Some(json!({"sessions": [session, other]})),
        );
        assert_eq!(renewed["leases"][0]["alive"], true, "{renewed}");
        assert_eq!(renewed["leases"][1]["alive"], true, "{renewed}");
    }
    let released = rr.ok(
        "POST",
        "/v1/locks/release",
        Some(json!({"session": session, "seq": 2, "name": "rr/a", "token": token})),
    );
    assert_eq!(released["released"], true, "{released}");
    let taken = rr.ok(
        "POST",
        "/v1/locks/acquire",
        Some(json!({"session": other, "seq": 1, "name": "rr/b", "wait_timeout_ms": 0})),
    );
    assert_eq!(taken["result"], "granted", "{taken}");
    let forced = rr.ok(
        "POST",
        "/v1/admin/release",
        Some(json!({"name": "rr/b", "reason": "test"})),
    );
    assert_eq!(forced["token"], taken["token"], "{forced}");
    for s in [&session, &other] {
        rr.ok("POST", "/v1/sessions/close", Some(json!({"session": s})));
    }
    // Every member answers its own status, naming the same leader.
    let leaders: Vec<Value> = (0..3)
        .map(|_| rr.ok("GET", "/v1/cluster/status", None)["leader_id"].clone())
        .collect();
    assert!(
        leaders.iter().all(|l| *l == leaders[0] && l.is_u64()),
        "{leaders:?}"
    );
}

#[test]
fn a_forwarded_request_is_checked_against_the_callers_own_identity() {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl.toml");
    std::fs::write(&acl, acl_text("app/")).unwrap();
    // The harness's own `latchkey cluster status` calls need a token of their own.
    std::env::set_var("LATCHKEY_AUTH_TOKEN", ADMIN);
    let acl = acl.display().to_string();
    let cluster = Cluster::start_configured(
        3,
        Timing::default(),
        &["--http-listen", "--acl", acl.as_str()],
    );
    let app = RoundRobin::over(&cluster, Some(APP));
    wait_forwarding(&app);
    let (leader, _) = cluster.wait_leader(&[], READY_TIMEOUT);
    for m in cluster.members.iter().filter(|m| m.id != leader) {
        let follower = m.http_addr.clone().unwrap();
        let send = |token: Option<&str>, path: &str, body: Value| {
            let auth = token.map(|t| format!("Bearer {t}"));
            let headers: Vec<(&str, &str)> =
                auth.iter().map(|a| ("authorization", a.as_str())).collect();
            let body = body.to_string();
            http_call(&follower, "POST", path, &headers, Some(&body), CALL_TIMEOUT).unwrap()
        };
        // The app's token passes through the follower and is the session's owner at the leader.
        let created = send(Some(APP), "/v1/sessions", json!({"ttl_ms": 15_000}));
        assert_eq!(created.status, 200, "via member {}: {created:?}", m.id);
        let session = created.json()["session"].clone();
        let take = |token: Option<&str>, seq: u64, name: &str| {
            send(
                token,
                "/v1/locks/acquire",
                json!({"session": session, "seq": seq, "name": name, "wait_timeout_ms": 0}),
            )
        };
        let granted = take(Some(APP), 1, "app/x");
        assert_eq!(granted.status, 200, "{granted:?}");
        // Outside its role: refused, as the leader refuses it.
        let denied = take(Some(APP), 2, "other/x");
        assert_eq!(denied.status, 403, "{denied:?}");
        // No token: the follower forwards no identity of its own.
        let anonymous = take(None, 3, "app/y");
        assert_eq!(anonymous.status, 401, "{anonymous:?}");
        // HTTP requires a 401 to name its scheme.
        assert!(
            anonymous
                .headers
                .iter()
                .any(|(k, v)| k == "www-authenticate" && v.starts_with("Bearer")),
            "{anonymous:?}"
        );
        let admin_release = send(
            Some(APP),
            "/v1/admin/release",
            json!({"name": "app/x", "reason": "test"}),
        );
        assert_eq!(admin_release.status, 403, "{admin_release:?}");
        // Another identity may not use the app's session, through a follower either.
        let not_owner = take(Some(ADMIN), 4, "app/z");
        assert_eq!(not_owner.status, 403, "{not_owner:?}");
        let forced = send(
            Some(ADMIN),
            "/v1/admin/release",
            json!({"name": "app/x", "reason": "test"}),
        );
        assert_eq!(forced.status, 200, "{forced:?}");
    }
}

/// The follower is the attacker's way in, not a judge: followers whose access-control lists
/// (by mistake, or by an attacker who changed their files) let `app` take any name still
/// cannot get the leader to grant one outside `app/`. The request passes the follower's own
/// check, is forwarded, and the leader refuses it on its own list. The mark of a forwarded
/// request gives nobody an identity: sent straight to the leader without a token it is 401,
/// and sent to a follower it only turns forwarding off.
#[test]
fn a_follower_with_a_laxer_acl_cannot_widen_what_the_leader_allows() {
    let dir = tempfile::tempdir().unwrap();
    let acl_of = |id: u64| dir.path().join(format!("acl-{id}.toml"));
    for id in 1..=3 {
        std::fs::write(acl_of(id), acl_text("app/")).unwrap();
    }
    std::env::set_var("LATCHKEY_AUTH_TOKEN", ADMIN);
    let acl = dir.path().join("acl-{id}.toml").display().to_string();
    let cluster = Cluster::start_configured(
        3,
        Timing::default(),
        &["--http-listen", "--acl", acl.as_str()],
    );
    let app = RoundRobin::over(&cluster, Some(APP));
    wait_forwarding(&app);
    let (leader, _) = cluster.wait_leader(&[], READY_TIMEOUT);
    let followers: Vec<u64> = cluster
        .ids()
        .into_iter()
        .filter(|&id| id != leader)
        .collect();
    for &id in &followers {
        std::fs::write(acl_of(id), acl_text("")).unwrap();
    }
    for &id in &followers {
        common::wait_until("the follower reloads its laxer list", READY_TIMEOUT, || {
            !cluster
                .log_lines(id, "reloaded the access-control list")
                .is_empty()
        });
    }
    let http = |id: u64| {
        let m = cluster.members.iter().find(|m| m.id == id).unwrap();
        m.http_addr.clone().unwrap()
    };
    let post = |at: u64, headers: &[(&str, &str)], path: &str, body: Value| {
        let body = body.to_string();
        http_call(&http(at), "POST", path, headers, Some(&body), CALL_TIMEOUT).unwrap()
    };
    let bearer = format!("Bearer {APP}");
    let as_app = [("authorization", bearer.as_str())];
    let created = post(leader, &as_app, "/v1/sessions", json!({"ttl_ms": 15_000}));
    assert_eq!(created.status, 200, "{created:?}");
    let session = created.json()["session"].clone();
    let acquire = |seq: u64, name: &str| json!({"session": session, "seq": seq, "name": name, "wait_timeout_ms": 0});
    for (seq, &id) in (1..).zip(&followers) {
        // Inside `app/`: the follower forwards it and the leader grants it (forwarding works).
        let inside = post(
            id,
            &as_app,
            "/v1/locks/acquire",
            acquire(seq * 10, "app/in"),
        );
        assert_eq!(inside.status, 200, "via member {id}: {inside:?}");
        assert_eq!(inside.json()["result"], "granted", "{inside:?}");
        let token = inside.json()["token"].clone();
        let released = post(
            id,
            &as_app,
            "/v1/locks/release",
            json!({"session": session, "seq": seq * 10 + 1, "name": "app/in", "token": token}),
        );
        assert_eq!(released.status, 200, "{released:?}");
        // Outside: the follower's list allows it, the leader's does not.
        let outside = post(
            id,
            &as_app,
            "/v1/locks/acquire",
            acquire(seq * 10 + 2, "other/x"),
        );
        assert_eq!(
            outside.status, 403,
            "a request the follower allows must be refused by the leader (via member {id}): {outside:?}"
        );
        // The mark set by the caller: not forwarded, so this member's own `not-leader`.
        let marked = [("authorization", bearer.as_str()), (FORWARDED_BY, "9")];
        let not_forwarded = post(
            id,
            &marked,
            "/v1/locks/acquire",
            acquire(seq * 10 + 3, "app/y"),
        );
        assert_eq!(not_forwarded.status, 503, "{not_forwarded:?}");
        assert_eq!(
            not_forwarded.json()["code"],
            "not-leader",
            "{not_forwarded:?}"
        );
    }
    // The mark gives no identity at the leader: no token, 401; the app's token, its own rights.
    let forged = [(FORWARDED_BY, followers[0].to_string())];
    let forged: Vec<(&str, &str)> = forged.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let anonymous = post(leader, &forged, "/v1/locks/acquire", acquire(100, "app/z"));
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    let marked_app = [("authorization", bearer.as_str()), (FORWARDED_BY, "2")];
    let still_app = post(
        leader,
        &marked_app,
        "/v1/locks/acquire",
        acquire(101, "other/z"),
    );
    assert_eq!(still_app.status, 403, "{still_app:?}");
    // Nothing outside `app/` was granted anywhere.
    let listed = http_call(
        &http(leader),
        "GET",
        "/v1/locks?prefix=other%2F",
        &[("authorization", &format!("Bearer {ADMIN}"))],
        None,
        CALL_TIMEOUT,
    )
    .unwrap();
    assert_eq!(listed.status, 200, "{listed:?}");
    assert_eq!(listed.json()["locks"], json!([]), "{listed:?}");
}

/// The status names each member's HTTP address: the leader every member's (their answers to
/// its appends say), a follower its own and its leader's.
#[test]
fn the_status_lists_the_members_http_addresses() {
    let cluster = Cluster::start_with_http(3);
    let (leader, _) = cluster.wait_leader(&[], READY_TIMEOUT);
    let http = |id: u64| {
        let m = cluster.members.iter().find(|m| m.id == id).unwrap();
        m.http_addr.clone().unwrap()
    };
    let listed = |at: u64| -> Vec<(u64, Value)> {
        let reply = http_call(
            &http(at),
            "GET",
            "/v1/cluster/status",
            &[],
            None,
            CALL_TIMEOUT,
        )
        .unwrap();
        assert_eq!(reply.status, 200, "{reply:?}");
        reply.json()["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["id"].as_u64().unwrap(), m["http_addr"].clone()))
            .collect()
    };
    let all: Vec<(u64, Value)> = cluster
        .ids()
        .into_iter()
        .map(|id| (id, json!(http(id))))
        .collect();
    common::wait_until(
        "the leader lists every member's HTTP address",
        READY_TIMEOUT,
        || listed(leader) == all,
    );
    for id in cluster.ids().into_iter().filter(|id| *id != leader) {
        common::wait_until(
            "a follower lists its own and its leader's",
            READY_TIMEOUT,
            || {
                let known = listed(id);
                [id, leader]
                    .iter()
                    .all(|k| known.iter().any(|(i, a)| i == k && *a == json!(http(*k))))
            },
        );
    }
}
