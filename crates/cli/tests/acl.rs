//! Client authentication, access control by lock prefix, and quotas (issue #13 items 3 and 4),
//! against real `latchkey serve` processes started with `--acl`.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::rpc::{pinned, reason, request, runtime};
use common::serve::ServeProcess;
use common::{free_port, run, Output, CLI_TIMEOUT, READY_TIMEOUT};
use latchkey_proto::v1 as pb;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use tonic::Code;

const ADMIN: &str = "admin-token-0123456789";
const APP: &str = "app-token-0123456789";
const APP2: &str = "app2-token-0123456789";
const READER: &str = "reader-token-0123456789";
const DELAYER: &str = "delayer-token-0123456789";
const EXIT_PERMISSION_DENIED: i32 = 5;

/// The access-control file every test serves: `app` and `app2` may lock and read under `app/`
/// (with small quotas), `reader` may only read, `admin` may do anything, and the certificate
/// identity `worker` may lock under `work/`.
fn acl_file(dir: &Path) -> PathBuf {
    let path = dir.join("acl.toml");
    std::fs::write(&path, acl_text()).unwrap();
    path
}

/// The text of [`acl_file`].
fn acl_text() -> String {
    format!(
        r#"
[roles.app]
lock = ["app/"]
read = ["app/"]

[roles.reader]
read = [""]

[roles.root]
admin = [""]

[roles.worker]
lock = ["work/"]

[identities.admin]
token_sha256 = "{}"
roles = ["root"]

[identities.app]
token_sha256 = "{}"
roles = ["app"]
max_sessions = 2
max_waiting = 1

[identities.app2]
token_sha256 = "{}"
roles = ["app"]

[identities.reader]
token_sha256 = "{}"
roles = ["reader"]

[identities.worker]
roles = ["worker"]

[identities.delayer]
token_sha256 = "{}"
roles = ["app"]
max_delays = 2
"#,
        common::sha256_hex(ADMIN),
        common::sha256_hex(APP),
        common::sha256_hex(APP2),
        common::sha256_hex(READER),
        common::sha256_hex(DELAYER),
    )
}

/// A node serving with `--acl` (and `extra` flags), ready once the admin sees it lead.
struct AclServer {
    addr: String,
    dir: tempfile::TempDir,
    process: ServeProcess,
}

impl AclServer {
    fn start(extra: &[String], scheme: &str, client_flags: &[String]) -> AclServer {
        let dir = tempfile::tempdir().unwrap();
        let acl = acl_file(dir.path());
        let mut args = vec!["--acl".to_owned(), acl.display().to_string()];
        args.extend_from_slice(extra);
        AclServer::start_in(dir, &args, scheme, client_flags)
    }

    /// A node serving with `args` (which give the access-control list) in `dir`.
    fn start_in(
        dir: tempfile::TempDir,
        extra: &[String],
        scheme: &str,
        client_flags: &[String],
    ) -> AclServer {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let mut process = ServeProcess::new(dir.path().join("server.log"));
        let mut args = vec![
            "--listen".to_owned(),
            addr.clone(),
            "--data-dir".to_owned(),
            dir.path().join("data").display().to_string(),
        ];
        args.extend_from_slice(extra);
        process.spawn("the ACL server", &args);
        let server = AclServer {
            addr: format!("{scheme}{addr}"),
            dir,
            process,
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let mut flags = client_flags.to_vec();
            flags.extend(["--auth-token".to_owned(), ADMIN.to_owned()]);
            let out = server.cli(&["cluster", "status", "--json"], &flags);
            if out.status.success() {
                // Every Raft group led (`--groups`): one, unless `extra` asks for more.
                let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
                let groups = report["groups"].as_array().map(Vec::as_slice);
                if groups.is_some_and(|g| !g.is_empty() && g.iter().all(|g| !g["leader"].is_null()))
                {
                    return server;
                }
            }
            assert!(
                Instant::now() < deadline,
                "not ready: {}\n{}",
                out.stderr,
                server.process.log_tail(40)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `latchkey ARGS --endpoints ADDR FLAGS` (before any `--`), bounded by `CLI_TIMEOUT`.
    fn cli(&self, args: &[&str], flags: &[String]) -> Output {
        let at = args.iter().position(|a| *a == "--").unwrap_or(args.len());
        let mut full: Vec<String> = args[..at].iter().map(|s| s.to_string()).collect();
        full.extend(["--endpoints".to_owned(), self.addr.clone()]);
        full.extend_from_slice(flags);
        full.extend(args[at..].iter().map(|s| s.to_string()));
        run(&full, self.dir.path(), CLI_TIMEOUT)
    }

    fn as_token(&self, token: &str, args: &[&str]) -> Output {
        self.cli(args, &["--auth-token".to_owned(), token.to_owned()])
    }
}

impl Drop for AclServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- server log ---\n{}", self.process.log_tail(60));
        }
        self.process.kill9();
    }
}

fn assert_denied(out: &Output, says: &[&str]) {
    assert_eq!(
        out.status.code(),
        Some(EXIT_PERMISSION_DENIED),
        "stdout: {}\nstderr: {}",
        out.stdout,
        out.stderr
    );
    for s in says {
        assert!(out.stderr.contains(s), "{s:?} not in: {}", out.stderr);
    }
}

fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "{:?}\nstdout: {}\nstderr: {}",
        out.status,
        out.stdout,
        out.stderr
    );
}

#[test]
fn permissions_are_granted_per_prefix_and_per_permission() {
    let server = AclServer::start(&[], "", &[]);
    // lock under its prefix: allowed; elsewhere: refused, naming the lock and the permission.
    assert_ok(&server.as_token(APP, &["lock", "--wait", "5s", "app/job", "--", "true"]));
    assert_denied(
        &server.as_token(APP, &["lock", "--wait", "5s", "other/job", "--", "true"]),
        &["\"lock\" permission on lock \"other/job\"", "\"app\""],
    );
    // read under its prefix: allowed; elsewhere, or a list wider than its prefix: refused.
    assert_ok(&server.as_token(APP, &["status", "app/job"]));
    assert_denied(
        &server.as_token(APP, &["status", "other/job"]),
        &["\"read\" permission on lock \"other/job\""],
    );
    assert_ok(&server.as_token(APP, &["list", "app/"]));
    assert_denied(
        &server.as_token(APP, &["list"]),
        &["\"read\" permission on every lock under the prefix \"\""],
    );
    // read everywhere, lock nowhere.
    assert_ok(&server.as_token(READER, &["status", "other/job"]));
    assert_ok(&server.as_token(READER, &["list"]));
    assert_denied(
        &server.as_token(READER, &["lock", "--wait", "5s", "app/job", "--", "true"]),
        &["\"lock\" permission"],
    );
    // admin: everything.
    assert_ok(&server.as_token(ADMIN, &["lock", "--wait", "5s", "other/job", "--", "true"]));
}

/// Membership changes concern every lock: they need `admin` on "".
#[test]
fn membership_changes_need_admin_on_every_lock() {
    let server = AclServer::start(&[], "", &[]);
    for token in [APP, READER] {
        assert_denied(
            &server.as_token(token, &["cluster", "add", "9=127.0.0.1:1"]),
            &["\"admin\" permission on every lock under the prefix \"\""],
        );
        assert_denied(
            &server.as_token(token, &["cluster", "remove", "9"]),
            &["\"admin\" permission"],
        );
    }
    // Member 9 is not a member: removing it changes nothing and succeeds.
    assert_ok(&server.as_token(ADMIN, &["cluster", "remove", "9"]));
}

#[test]
fn a_token_must_be_given_and_known() {
    let server = AclServer::start(&[], "", &[]);
    assert_ok(&server.as_token(APP, &["status", "app/job"]));
    assert_denied(
        &server.as_token("not-a-known-token", &["status", "app/job"]),
        &["not in the access-control list"],
    );
    assert_denied(
        &server.cli(&["status", "app/job"], &[]),
        &["no credentials"],
    );
    // The environment variable works like the flag.
    let args: Vec<String> = ["status", "app/job", "--endpoints", &server.addr]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut proc = common::Proc::spawn_with(&args, server.dir.path(), |c| {
        c.env("LATCHKEY_AUTH_TOKEN", APP);
    });
    assert!(proc.wait(CLI_TIMEOUT).success(), "{}", proc.stderr());
}

/// Raw gRPC as one identity: a request with its bearer token.
fn as_identity<T>(token: &str, msg: T) -> tonic::Request<T> {
    let mut r = request(msg, Duration::from_secs(5));
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

fn create(
    rt: &tokio::runtime::Runtime,
    client: &mut latchkey_proto::v1::locks_client::LocksClient<tonic::transport::Channel>,
    token: &str,
) -> Result<pb::Session, tonic::Status> {
    rt.block_on(client.create_session(as_identity(
        token,
        pb::CreateSessionRequest {
            ttl_ms: 30_000,
            ..Default::default()
        },
    )))
    .map(|r| r.into_inner().session.unwrap())
}

#[test]
fn a_session_is_refused_to_another_identity() {
    let server = AclServer::start(&[], "", &[]);
    let rt = runtime();
    let mut client = pinned(&rt, &server.addr);
    let session = create(&rt, &mut client, APP).unwrap();
    let acquire = |token: &str, seq: u64| {
        let mut client = client.clone();
        rt.block_on(client.acquire(as_identity(
            token,
            pb::AcquireRequest {
                session: Some(session),
                seq,
                name: "app/shared".into(),
                wait_timeout_ms: 0,
                ..Default::default()
            },
        )))
    };
    // app2 has the same permissions and the session's secret, but not the session.
    let refused = acquire(APP2, 1).unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert_eq!(reason(&refused).as_deref(), Some("permission-denied"));
    assert!(
        refused.message().contains("belongs to another identity"),
        "{refused:?}"
    );
    let keepalive = rt
        .block_on(client.clone().keep_alive(as_identity(
            APP2,
            pb::KeepAliveRequest {
                sessions: vec![session],
            },
        )))
        .unwrap_err();
    assert_eq!(keepalive.code(), Code::PermissionDenied, "{keepalive:?}");
    let close = rt
        .block_on(client.clone().close_session(as_identity(
            APP2,
            pb::CloseSessionRequest {
                session: Some(session),
            },
        )))
        .unwrap_err();
    assert_eq!(close.code(), Code::PermissionDenied, "{close:?}");
    // Its owner may.
    let granted = acquire(APP, 2).unwrap().into_inner();
    assert_eq!(granted.result, pb::AcquireResult::Granted as i32);
}

/// Elections (issue #32): a campaign is an acquire and `Proclaim` needs what it needs, the
/// `lock` permission on the name: `reader` (read everywhere) is refused, `app` (lock under
/// `app/`) proclaims; `latchkey elect` under another prefix is refused like `lock`.
#[test]
fn campaign_and_proclaim_need_the_lock_permission() {
    let server = AclServer::start(&[], "", &[]);
    assert_ok(&server.as_token(APP, &["elect", "--value", "a", "app/svc", "--", "true"]));
    assert_denied(
        &server.as_token(APP, &["elect", "--value", "a", "other/svc", "--", "true"]),
        &["\"lock\" permission on lock \"other/svc\""],
    );
    let rt = runtime();
    let mut client = pinned(&rt, &server.addr);
    let session = create(&rt, &mut client, APP).unwrap();
    let granted = rt
        .block_on(client.clone().acquire(as_identity(
            APP,
            pb::AcquireRequest {
                session: Some(session),
                seq: 1,
                name: "app/svc".into(),
                value: Some(b"a".to_vec()),
                ..Default::default()
            },
        )))
        .unwrap()
        .into_inner();
    assert_eq!(granted.result, pb::AcquireResult::Granted as i32);
    let proclaim = |token: &str, seq: u64| {
        rt.block_on(client.clone().proclaim(as_identity(
            token,
            pb::ProclaimRequest {
                session: Some(session),
                seq,
                name: "app/svc".into(),
                token: granted.token,
                value: b"b".to_vec(),
            },
        )))
    };
    let refused = proclaim(READER, 2).unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("\"lock\" permission"),
        "{refused:?}"
    );
    proclaim(APP, 3).expect("the leader proclaims with the lock permission");
}

/// [`create`] in Raft group `group` (a server with `--groups`).
fn create_in(
    rt: &tokio::runtime::Runtime,
    client: &mut latchkey_proto::v1::locks_client::LocksClient<tonic::transport::Channel>,
    token: &str,
    group: u32,
) -> Result<pb::Session, tonic::Status> {
    rt.block_on(client.create_session(as_identity(
        token,
        pb::CreateSessionRequest {
            ttl_ms: 30_000,
            group: Some(group),
            ..Default::default()
        },
    )))
    .map(|r| r.into_inner().session.unwrap())
}

fn assert_quota(status: &tonic::Status, says: &str) {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(reason(status).as_deref(), Some("quota-exceeded"));
    assert!(status.message().contains(says), "{status:?}");
}

#[test]
fn session_quotas_are_enforced_and_freed_when_a_session_ends() {
    let server = AclServer::start(&[], "", &[]);
    let rt = runtime();
    let mut client = pinned(&rt, &server.addr);
    let first = create(&rt, &mut client, APP).unwrap();
    create(&rt, &mut client, APP).unwrap();
    assert_quota(
        &create(&rt, &mut client, APP).unwrap_err(),
        "max_sessions) is 2",
    );
    // A refusal like the access check's (issue #31 item 5): logged with where it came from.
    let logged = server.log_lines("refused a client (quota) from 127.0.0.1:");
    assert_eq!(logged.len(), 1, "{}", server.process.log_tail(20));
    assert!(logged[0].contains("max_sessions) is 2"), "{}", logged[0]);
    // Another identity is not held back by app's quota.
    create(&rt, &mut client, APP2).unwrap();
    rt.block_on(client.close_session(as_identity(
        APP,
        pb::CloseSessionRequest {
            session: Some(first),
        },
    )))
    .unwrap();
    create(&rt, &mut client, APP).unwrap();
}

/// The attack the review of issue #32 found: a running lock-delay outlives its session, so an
/// identity that lets 1-s sessions of delayed locks die could park names for every tenant.
/// Its delays (asked for, held, and running after the session is gone) count against its
/// `max_delays`; another identity is not held back; an operator's end of a delay (`end_delay`:
/// not a plain force-release, and not by the delay's own identity, which is no admin) ends it
/// and frees the quota.
#[test]
fn delay_quotas_count_running_delays_after_their_sessions_are_gone() {
    let server = AclServer::start(&[], "", &[]);
    let rt = runtime();
    let mut client = pinned(&rt, &server.addr);
    let session = |client: &mut latchkey_proto::v1::locks_client::LocksClient<_>, token, ttl_ms| {
        rt.block_on(client.create_session(as_identity(
            token,
            pb::CreateSessionRequest {
                ttl_ms,
                ..Default::default()
            },
        )))
        .map(|r| r.into_inner().session.unwrap())
        .unwrap()
    };
    let acquire = |client: &mut latchkey_proto::v1::locks_client::LocksClient<_>,
                   token: &str,
                   s: pb::Session,
                   seq: u64,
                   name: &str,
                   lock_delay_ms: u64| {
        rt.block_on(client.acquire(as_identity(
            token,
            pb::AcquireRequest {
                session: Some(s),
                seq,
                name: name.into(),
                wait_timeout_ms: 0,
                lock_delay_ms,
                ..Default::default()
            },
        )))
        .map(|r| r.into_inner().result)
    };
    let granted = pb::AcquireResult::Granted as i32;
    // A 1-s session, never renewed: its two delayed locks fill the quota.
    let short = session(&mut client, DELAYER, 1_000);
    assert_eq!(
        acquire(&mut client, DELAYER, short, 1, "app/d1", 60_000).map_err(|e| e.to_string()),
        Ok(granted)
    );
    assert_eq!(
        acquire(&mut client, DELAYER, short, 2, "app/d2", 60_000).map_err(|e| e.to_string()),
        Ok(granted)
    );
    assert_quota(
        &acquire(&mut client, DELAYER, short, 3, "app/d3", 60_000).unwrap_err(),
        "max_delays) is 2",
    );
    // Without a delay the same identity is not held back.
    assert_eq!(
        acquire(&mut client, DELAYER, short, 4, "app/d3", 0).map_err(|e| e.to_string()),
        Ok(granted)
    );
    // The session expires; its delays run on, still the identity's.
    let describe = |client: &mut latchkey_proto::v1::locks_client::LocksClient<_>, name: &str| {
        rt.block_on(client.describe(as_identity(
            ADMIN,
            pb::DescribeRequest { name: name.into() },
        )))
        .unwrap()
        .into_inner()
        .lock
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while describe(&mut client, "app/d1").is_none_or(|l| l.delay_remaining_ms.is_none()) {
        assert!(Instant::now() < deadline, "app/d1's delay never started");
        std::thread::sleep(Duration::from_millis(100));
    }
    let fresh = session(&mut client, DELAYER, 30_000);
    assert_quota(
        &acquire(&mut client, DELAYER, fresh, 1, "app/d4", 60_000).unwrap_err(),
        "max_delays) is 2",
    );
    // Another identity is not held back by delayer's delays.
    let other = session(&mut client, APP2, 30_000);
    assert_eq!(
        acquire(&mut client, APP2, other, 1, "app/o1", 60_000).map_err(|e| e.to_string()),
        Ok(granted)
    );
    // The operator's way out: ending the delay (a plain force-release finds nobody holding).
    // The delay's own identity, which may lock but is no admin, cannot end it.
    let end_as = |who: &str, end_delay| {
        rt.block_on(client.clone().admin_release(as_identity(
            who,
            pb::AdminReleaseRequest {
                name: "app/d1".into(),
                reason: "ending a lock-delay".into(),
                operator: "test".into(),
                end_delay,
                ..Default::default()
            },
        )))
    };
    let end = |end_delay| end_as(ADMIN, end_delay);
    let not_admin = end_as(DELAYER, true).expect_err("a non-admin's end of a lock-delay");
    assert_eq!(
        reason(&not_admin).as_deref(),
        Some("permission-denied"),
        "{not_admin:?}"
    );
    assert!(
        describe(&mut client.clone(), "app/d1").is_some_and(|l| l.delay_remaining_ms.is_some()),
        "a refused end ended the delay"
    );
    let plain = end(false).expect_err("a plain force-release of a name in a lock-delay");
    assert_eq!(
        reason(&plain).as_deref(),
        Some("lock-not-held"),
        "{plain:?}"
    );
    end(true).expect("the end of app/d1's lock-delay");
    let after = describe(&mut client, "app/d1");
    assert!(
        after
            .as_ref()
            .is_none_or(|l| !l.held && l.delay_remaining_ms.is_none()),
        "the delay ended, nobody waited: {after:?}"
    );
    assert_eq!(
        acquire(&mut client, DELAYER, fresh, 2, "app/d4", 60_000).map_err(|e| e.to_string()),
        Ok(granted)
    );
}

#[test]
fn wait_quotas_are_enforced_and_freed_when_a_session_ends() {
    let server = AclServer::start(&[], "", &[]);
    let rt = runtime();
    let mut client = pinned(&rt, &server.addr);
    let holder = create(&rt, &mut client, APP2).unwrap();
    for name in ["app/a", "app/b"] {
        let got = rt
            .block_on(client.acquire(as_identity(
                APP2,
                pb::AcquireRequest {
                    session: Some(holder),
                    seq: if name == "app/a" { 1 } else { 2 },
                    name: name.into(),
                    wait_timeout_ms: 0,
                    ..Default::default()
                },
            )))
            .unwrap()
            .into_inner();
        assert_eq!(got.result, pb::AcquireResult::Granted as i32);
    }
    let waiter = create(&rt, &mut client, APP).unwrap();
    let spawner = client.clone();
    let wait_for = |seq: u64, name: &str| {
        let mut client = spawner.clone();
        let name = name.to_owned();
        rt.spawn(async move {
            client
                .acquire(as_identity(
                    APP,
                    pb::AcquireRequest {
                        session: Some(waiter),
                        seq,
                        name,
                        wait_timeout_ms: 60_000,
                        ..Default::default()
                    },
                ))
                .await
        })
    };
    // Waits (bounded) until `name` has one waiter.
    let observer = client.clone();
    let queued_on = |name: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let info = rt
                .block_on(observer.clone().describe(as_identity(
                    ADMIN,
                    pb::DescribeRequest { name: name.into() },
                )))
                .unwrap()
                .into_inner()
                .lock
                .unwrap();
            if info.waiters == 1 {
                break;
            }
            assert!(Instant::now() < deadline, "no wait queued on {name}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // The first wait queues (its long-poll stays open)...
    let queued = wait_for(1, "app/a");
    queued_on("app/a");
    // ...the second is past app's quota of one.
    let refused = rt.block_on(wait_for(2, "app/b")).unwrap().unwrap_err();
    assert_quota(&refused, "max_waiting) is 1");
    // A session that ends frees its waits.
    rt.block_on(client.close_session(as_identity(
        APP,
        pb::CloseSessionRequest {
            session: Some(waiter),
        },
    )))
    .unwrap();
    let _ = rt.block_on(queued);
    let waiter = create(&rt, &mut client, APP).unwrap();
    let mut c = client.clone();
    let again = rt.spawn(async move {
        c.acquire(as_identity(
            APP,
            pb::AcquireRequest {
                session: Some(waiter),
                seq: 1,
                name: "app/b".into(),
                wait_timeout_ms: 60_000,
                ..Default::default()
            },
        ))
        .await
    });
    // Queued, not refused, and granted when app2's session ends.
    queued_on("app/b");
    rt.block_on(client.close_session(as_identity(
        APP2,
        pb::CloseSessionRequest {
            session: Some(holder),
        },
    )))
    .unwrap();
    let granted = rt.block_on(again).unwrap().unwrap().into_inner();
    assert_eq!(granted.result, pb::AcquireResult::Granted as i32);
}

/// The Raft groups of the quota tests' server (`--groups`).
const GROUPS: u32 = 4;

fn groups_server() -> AclServer {
    AclServer::start(&["--groups".to_owned(), GROUPS.to_string()], "", &[])
}

/// Regression (issue #31): quotas were counted in the table of the group a session was made
/// in, so with `--groups 4` an identity could hold 4 × `max_sessions` sessions.
#[test]
fn session_quotas_count_the_sessions_of_every_group() {
    let server = groups_server();
    let rt = runtime();
    let mut client = pinned(&rt, &server.addr);
    let first = create_in(&rt, &mut client, APP, 0).unwrap();
    create_in(&rt, &mut client, APP, 1).unwrap();
    // app's quota is 2, and it has 2, each in a group of its own.
    for group in 2..GROUPS {
        assert_quota(
            &create_in(&rt, &mut client, APP, group).unwrap_err(),
            "max_sessions) is 2",
        );
    }
    // Another identity is not held back by app's quota, in any group.
    for group in 0..GROUPS {
        create_in(&rt, &mut client, APP2, group).unwrap();
    }
    // A session that ends in one group frees room in every group.
    rt.block_on(client.close_session(as_identity(
        APP,
        pb::CloseSessionRequest {
            session: Some(first),
        },
    )))
    .unwrap();
    create_in(&rt, &mut client, APP, GROUPS - 1).unwrap();
}

/// Regression (issue #31): an identity's queued acquires were counted per group, so with
/// `--groups 4` it could have 4 × `max_waiting` of them.
#[test]
fn wait_quotas_count_the_waits_of_every_group() {
    let server = groups_server();
    let rt = runtime();
    let mut client = pinned(&rt, &server.addr);
    // Two locks of app's prefix in different groups (a lock and its session share a group).
    let group = |name: &str| latchkey_core::group_of(name, GROUPS);
    let a = "app/w0".to_owned();
    let b = (1..64)
        .map(|i| format!("app/w{i}"))
        .find(|n| group(n) != group(&a))
        .expect("64 names fall in more than one of 4 groups");
    // app2 holds both, each with a session of its group.
    for name in [&a, &b] {
        let holder = create_in(&rt, &mut client, APP2, group(name)).unwrap();
        let got = rt
            .block_on(client.acquire(as_identity(
                APP2,
                pb::AcquireRequest {
                    session: Some(holder),
                    seq: 1,
                    name: name.clone(),
                    wait_timeout_ms: 0,
                    ..Default::default()
                },
            )))
            .unwrap()
            .into_inner();
        assert_eq!(got.result, pb::AcquireResult::Granted as i32);
    }
    // app (max_waiting 1) waits for each, with a session of each one's group.
    let on_a = create_in(&rt, &mut client, APP, group(&a)).unwrap();
    let on_b = create_in(&rt, &mut client, APP, group(&b)).unwrap();
    let spawner = client.clone();
    let wait_for = |session: pb::Session, name: &str| {
        let mut client = spawner.clone();
        let name = name.to_owned();
        rt.spawn(async move {
            client
                .acquire(as_identity(
                    APP,
                    pb::AcquireRequest {
                        session: Some(session),
                        seq: 1,
                        name,
                        wait_timeout_ms: 60_000,
                        ..Default::default()
                    },
                ))
                .await
        })
    };
    let observer = client.clone();
    let waiters_on = |name: &str| {
        rt.block_on(observer.clone().describe(as_identity(
            ADMIN,
            pb::DescribeRequest { name: name.into() },
        )))
        .unwrap()
        .into_inner()
        .lock
        .unwrap()
        .waiters
    };
    let queued_on = |name: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while waiters_on(name) != 1 {
            assert!(Instant::now() < deadline, "no wait queued on {name}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // The first wait queues in a's group...
    let queued = wait_for(on_a, &a);
    queued_on(&a);
    // ...and one in b's group is past app's quota of one.
    let refused = rt.block_on(wait_for(on_b, &b)).unwrap();
    assert_quota(
        &refused.map(|r| r.into_inner()).unwrap_err(),
        "max_waiting) is 1",
    );
    assert_eq!(waiters_on(&b), 0);
    // The wait in a's group ends with its session; then b's group takes one.
    rt.block_on(client.close_session(as_identity(
        APP,
        pb::CloseSessionRequest {
            session: Some(on_a),
        },
    )))
    .unwrap();
    let _ = rt.block_on(queued);
    let _again = wait_for(on_b, &b);
    queued_on(&b);
}

/// A CA and a certificate signed by it, for `127.0.0.1`, with common name `cn`.
fn issue(dir: &Path, ca: &(rcgen::Certificate, KeyPair), cn: &str) -> (String, String) {
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, cn);
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.0, &ca.1).unwrap();
    let (c, k) = (dir.join(format!("{cn}.pem")), dir.join(format!("{cn}.key")));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c.display().to_string(), k.display().to_string())
}

/// A CA in a temporary directory, and the client flags of certificates it signs.
struct TestCa {
    certs: tempfile::TempDir,
    pem: String,
    ca: (rcgen::Certificate, KeyPair),
}

impl TestCa {
    fn new() -> TestCa {
        let certs = tempfile::tempdir().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "test CA");
        let ca_key = KeyPair::generate().unwrap();
        let ca = (params.self_signed(&ca_key).unwrap(), ca_key);
        let pem = certs.path().join("ca.pem");
        std::fs::write(&pem, ca.0.pem()).unwrap();
        TestCa {
            pem: pem.display().to_string(),
            certs,
            ca,
        }
    }

    /// `--ca`, `--cert`, `--key` of a new certificate naming `cn`.
    fn client(&self, cn: &str) -> Vec<String> {
        let (cert, key) = issue(self.certs.path(), &self.ca, cn);
        vec![
            "--ca".to_owned(),
            self.pem.clone(),
            "--cert".to_owned(),
            cert,
            "--key".to_owned(),
            key,
        ]
    }
}

/// A TLS server that requires client certificates from `ca`, with the ACL of [`acl_file`].
struct TlsAclServer {
    server: AclServer,
    ca: TestCa,
}

impl TlsAclServer {
    fn start() -> TlsAclServer {
        let ca = TestCa::new();
        let (server_cert, server_key) = issue(ca.certs.path(), &ca.ca, "server");
        let server = AclServer::start(
            &[
                "--tls-cert".to_owned(),
                server_cert,
                "--tls-key".to_owned(),
                server_key,
                "--tls-ca".to_owned(),
                ca.pem.clone(),
            ],
            "https://",
            &ca.client("worker"),
        );
        TlsAclServer { server, ca }
    }

    fn client(&self, cn: &str) -> Vec<String> {
        self.ca.client(cn)
    }
}

#[test]
fn a_client_certificate_names_its_identity() {
    let tls = TlsAclServer::start();
    let server = &tls.server;
    let worker = tls.client("worker");
    assert_ok(&server.cli(&["lock", "--wait", "5s", "work/x", "--", "true"], &worker));
    assert_denied(
        &server.cli(&["lock", "--wait", "5s", "app/x", "--", "true"], &worker),
        &["identity \"worker\" lacks the \"lock\" permission on lock \"app/x\""],
    );
    // A certificate the CA signed, but for a name the list does not know.
    assert_denied(
        &server.cli(
            &["lock", "--wait", "5s", "work/x", "--", "true"],
            &tls.client("stranger"),
        ),
        &["\"stranger\""],
    );
}

/// docs/securing.md, "Access control": "`lock` does not imply `read`". `worker` may lock under
/// `work/` and has no `read` anywhere.
#[test]
fn the_lock_permission_does_not_imply_read() {
    let tls = TlsAclServer::start();
    let worker = tls.client("worker");
    assert_ok(
        &tls.server
            .cli(&["lock", "--wait", "5s", "work/x", "--", "true"], &worker),
    );
    // (Refused at the client's first read, NodeStatus, which it asks for the Raft groups:
    // "on any lock".)
    assert_denied(
        &tls.server.cli(&["status", "work/x"], &worker),
        &["identity \"worker\" lacks the \"read\" permission"],
    );
    assert_denied(
        &tls.server.cli(&["list", "work/"], &worker),
        &["\"read\" permission"],
    );
    // Nor the cluster's status (NodeStatus): the client learns the Raft groups a lock needs
    // from CreateSession, not from NodeStatus (issue #16).
    assert_denied(
        &tls.server.cli(&["cluster", "status"], &worker),
        &["\"read\" permission"],
    );
}

/// docs/securing.md, "Access control": "A bearer token ... wins over a client certificate". The
/// same connection presents `worker`'s certificate (lock under `work/`) and `app`'s token (lock
/// under `app/`): the call is `app`'s, both ways.
#[test]
fn a_bearer_token_wins_over_a_client_certificate() {
    let tls = TlsAclServer::start();
    let mut both = tls.client("worker");
    both.extend(["--auth-token".to_owned(), APP.to_owned()]);
    assert_ok(
        &tls.server
            .cli(&["lock", "--wait", "5s", "app/x", "--", "true"], &both),
    );
    assert_denied(
        &tls.server
            .cli(&["lock", "--wait", "5s", "work/x", "--", "true"], &both),
        &["identity \"app\" lacks the \"lock\" permission on lock \"work/x\""],
    );
}

#[test]
fn a_bad_acl_file_is_a_clear_start_up_error() {
    let dir = tempfile::tempdir().unwrap();
    let acl = dir.path().join("acl.toml");
    std::fs::write(&acl, "[identities.ci]\nrole = [\"x\"]\n").unwrap();
    let out = run(
        &[
            "serve".to_owned(),
            "--listen".to_owned(),
            format!("127.0.0.1:{}", free_port()),
            "--data-dir".to_owned(),
            dir.path().join("data").display().to_string(),
            "--acl".to_owned(),
            acl.display().to_string(),
        ],
        dir.path(),
        CLI_TIMEOUT,
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("acl.toml"), "{}", out.stderr);
    assert!(out.stderr.contains("role"), "{}", out.stderr);
    assert!(
        !dir.path().join("data").exists(),
        "a refused start touched the data dir"
    );
}

/// Issue #14 item 6: a force-release needs the admin permission on the lock, a revoke admin on
/// every lock; a refusal exits 5 and changes nothing; the audit log names the identity.
#[test]
fn admin_release_and_revoke_need_the_admin_permission_and_record_the_identity() {
    let server = AclServer::start(&[], "", &[]);
    let work = tempfile::tempdir().unwrap();
    let granted = work.path().join("granted");
    let mut args: Vec<String> = vec![
        "lock".into(),
        "--endpoints".into(),
        server.addr.clone(),
        "--auth-token".into(),
        APP.into(),
        "app/stuck".into(),
        "--".into(),
        "sh".into(),
        "-c".into(),
    ];
    args.push(format!(
        "echo $LATCHKEY_TOKEN > '{}'; exec sleep 100",
        granted.display()
    ));
    let mut holder = common::Proc::spawn(&args, work.path());
    common::wait_until("app holds app/stuck", Duration::from_secs(30), || {
        granted.exists()
    });
    let release = ["admin", "release", "app/stuck", "--reason", "stuck"];
    assert_denied(
        &server.as_token(APP, &release),
        &["\"admin\" permission on lock \"app/stuck\""],
    );
    assert_denied(
        &server.as_token(READER, &["admin", "revoke", "1", "--reason", "x"]),
        &["\"admin\" permission on every lock"],
    );
    assert_ok(&server.as_token(ADMIN, &release));
    assert_eq!(
        holder.wait_code(Duration::from_secs(30)),
        4,
        "{}",
        holder.stderr()
    );
    let audit = server.as_token(READER, &["audit", "--json"]);
    assert_ok(&audit);
    let records: serde_json::Value = serde_json::from_str(&audit.stdout).unwrap();
    assert_eq!(records.as_array().map(Vec::len), Some(1), "{records}");
    assert_eq!(records[0]["identity"], "admin");
    assert_eq!(records[0]["lock"], "app/stuck");
}

/// Issue #14 item 5: a backup holds every lock and session, so `snapshot save` needs the admin
/// permission on every lock; a reader is refused (exit 5) and no file is written.
#[test]
fn snapshot_save_needs_the_admin_permission_on_every_lock() {
    let server = AclServer::start(&[], "", &[]);
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("backup");
    let file_arg = file.to_str().unwrap();
    assert_denied(
        &server.as_token(READER, &["snapshot", "save", file_arg]),
        &["\"admin\" permission on every lock"],
    );
    assert!(!file.exists());
    assert_ok(&server.as_token(ADMIN, &["snapshot", "save", file_arg]));
    assert!(file.exists());
}

#[test]
fn watch_needs_the_read_permission_on_its_prefix() {
    let server = AclServer::start(&[], "", &[]);
    assert_ok(&server.as_token(APP, &["lock", "--wait", "5s", "app/job", "--", "true"]));
    assert_denied(
        &server.as_token(APP, &["watch", "other/"]),
        &["\"read\" permission on every lock under the prefix \"other/\""],
    );
    assert_denied(
        &server.as_token(APP, &["watch"]),
        &["\"read\" permission on every lock under the prefix \"\""],
    );
    // Allowed under its prefix: it streams until --timeout ends it (exit 1).
    let out = server.as_token(
        APP,
        &["watch", "--json", "--after", "0", "--timeout", "3s", "app/"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stdout.contains(r#""kind":"granted","lock":"app/job""#),
        "{}",
        out.stdout
    );
}

/// The access-control list inline in `serve --config`'s file (`[acl.roles.*]`,
/// `[acl.identities.*]`), instead of an `--acl` file: the same allows and denies.
#[test]
fn an_acl_inline_in_the_config_file_allows_and_denies() {
    let dir = tempfile::tempdir().unwrap();
    // The ACL file's tables, each moved under `acl.`.
    let inline = acl_text()
        .replace("[roles.", "[acl.roles.")
        .replace("[identities.", "[acl.identities.");
    let config = dir.path().join("latchkey.toml");
    std::fs::write(&config, format!("heartbeat-ms = 100\n{inline}")).unwrap();
    let config = config.display().to_string();
    let server = AclServer::start_in(dir, &["--config".to_owned(), config], "", &[]);
    assert_ok(&server.as_token(APP, &["lock", "--wait", "5s", "app/job", "--", "true"]));
    assert_denied(
        &server.as_token(APP, &["lock", "--wait", "5s", "other/job", "--", "true"]),
        &["\"lock\" permission on lock \"other/job\"", "\"app\""],
    );
    assert_denied(
        &server.as_token(READER, &["lock", "--wait", "5s", "app/job", "--", "true"]),
        &["\"lock\" permission"],
    );
    let unknown = server.as_token("not-a-known-token-0123", &["status", "app/job"]);
    assert_eq!(
        unknown.status.code(),
        Some(EXIT_PERMISSION_DENIED),
        "{}",
        unknown.stderr
    );
}

/// One access-control list, from one place: an inline one and `--acl` together are refused at
/// start, naming both.
#[test]
fn an_inline_acl_and_an_acl_file_together_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = acl_file(dir.path());
    let config = dir.path().join("latchkey.toml");
    std::fs::write(&config, "[acl.roles.r]\nread = [\"\"]\n").unwrap();
    let out = run(
        &[
            "serve".to_owned(),
            "--config".to_owned(),
            config.display().to_string(),
            "--acl".to_owned(),
            file.display().to_string(),
            "--listen".to_owned(),
            format!("127.0.0.1:{}", free_port()),
            "--data-dir".to_owned(),
            dir.path().join("data").display().to_string(),
        ],
        dir.path(),
        CLI_TIMEOUT,
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("two access-control lists") && out.stderr.contains("inline [acl]"),
        "{}",
        out.stderr
    );
}

/// `latchkey_auth_refused_total{reason="REASON"}` on `/metrics` at `metrics` (0 when the series
/// is absent).
fn refused_total(metrics: &str, reason: &str) -> u64 {
    let (status, body) = common::http_get(metrics, "/metrics").expect("/metrics answers");
    assert_eq!(status, 200, "{body}");
    let series = format!("latchkey_auth_refused_total{{reason=\"{reason}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0, |v| v.trim().parse().expect("a count"))
}

impl AclServer {
    /// The server log's lines containing `text`.
    fn log_lines(&self, text: &str) -> Vec<String> {
        std::fs::read_to_string(self.process.log_path())
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(text))
            .map(str::to_owned)
            .collect()
    }

    /// Waits (bounded) until the log has more than `seen` lines containing `text`.
    fn wait_for_log(&self, text: &str, seen: usize) {
        let deadline = Instant::now() + READY_TIMEOUT;
        while self.log_lines(text).len() <= seen {
            assert!(
                Instant::now() < deadline,
                "no new {text:?} in:\n{}",
                self.process.log_tail(40)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGHUP, then waits for the log line `text` it brings.
    fn sighup(&self, text: &str) {
        let seen = self.log_lines(text).len();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.process.pid()),
            nix::sys::signal::Signal::SIGHUP,
        )
        .unwrap();
        self.wait_for_log(text, seen);
    }
}

const REFUSED: &str = "refused a client";

/// Issue #31 item 5: a refused call is counted by reason on `/metrics` and logged in one line
/// with the client's address and why; a flood of refusals is counted whole but writes a bounded
/// number of lines (`REFUSAL_LOG_BURST`, then one per `REFUSAL_LOG_REFILL_MS`), and a later line
/// says how many it left out.
#[test]
fn a_refused_call_is_counted_and_logged_and_a_flood_logs_a_bounded_number_of_lines() {
    let metrics = format!("127.0.0.1:{}", free_port());
    let server = AclServer::start(&["--metrics-listen".to_owned(), metrics.clone()], "", &[]);
    assert_eq!(refused_total(&metrics, "unknown-token"), 0);
    assert_denied(
        &server.as_token("not-a-known-token", &["status", "app/job"]),
        &[],
    );
    assert_eq!(refused_total(&metrics, "unknown-token"), 1);
    assert_denied(
        &server.as_token(READER, &["lock", "--wait", "5s", "app/job", "--", "true"]),
        &[],
    );
    assert_eq!(refused_total(&metrics, "permission-denied"), 1);
    let lines = server.log_lines(REFUSED);
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(
        lines[0].contains("refused a client (unknown-token) from 127.0.0.1:")
            && lines[0].contains("not in the access-control list"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("refused a client (permission-denied) from 127.0.0.1:")
            && lines[1].contains("\"reader\""),
        "{}",
        lines[1]
    );

    // A flood over one connection, as fast as the server answers.
    const FLOOD: u64 = 500;
    let rt = runtime();
    let mut client = pinned(&rt, &server.addr);
    let started = Instant::now();
    for _ in 0..FLOOD {
        let refused = create(&rt, &mut client, "flood-token-0123456789").unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    }
    let elapsed = started.elapsed();
    assert_eq!(refused_total(&metrics, "unknown-token"), 1 + FLOOD);
    let written = server.log_lines(REFUSED).len();
    eprintln!("{written} refusal lines for {FLOOD} refusals in {elapsed:?}");
    // The burst of 10 lines (2 spent above), one more per second after it, and one for a
    // second begun.
    let bound = 10 + elapsed.as_secs() as usize + 1;
    assert!(
        written <= bound,
        "{written} refusal lines for {FLOOD} refusals in {elapsed:?}"
    );
    // Once a line is back in the bucket, the next one says what was left out.
    let deadline = Instant::now() + READY_TIMEOUT;
    let summary = loop {
        let _ = create(&rt, &mut client, "flood-token-0123456789");
        if let Some(line) = server
            .log_lines(REFUSED)
            .into_iter()
            .find(|l| l.contains("not logged since the last line"))
        {
            break line;
        }
        assert!(Instant::now() < deadline, "{}", server.process.log_tail(20));
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(summary.contains("unknown-token: "), "{summary}");
}

/// An identity of the reader role with `token`, as the ACL file writes it.
fn reader_identity(name: &str, token: &str) -> String {
    format!(
        "\n[identities.{name}]\ntoken_sha256 = \"{}\"\nroles = [\"reader\"]\n",
        common::sha256_hex(token)
    )
}

/// A file written with a modification time past any it had, even on a file system with coarse
/// timestamps.
fn write_later(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(std::time::SystemTime::now() + Duration::from_secs(2))
        .unwrap();
}

/// Issue #31 item 6: the `--acl` file is reloaded without a restart, on SIGHUP and when it
/// changes; an identity added becomes allowed and one removed is refused from the next call,
/// and a file that does not parse is refused with a log line while the list in force stays.
#[test]
fn an_acl_file_is_reloaded_on_sighup_and_on_change_and_a_broken_one_is_refused() {
    const NEW: &str = "new-token-0123456789";
    const NEWER: &str = "newer-token-0123456789";
    let server = AclServer::start(&[], "", &[]);
    let acl = server.dir.path().join("acl.toml");
    let status_as = |token| server.as_token(token, &["status", "app/job"]);
    assert_denied(&status_as(NEW), &["not in the access-control list"]);

    std::fs::write(&acl, acl_text() + &reader_identity("new", NEW)).unwrap();
    server.sighup("SIGHUP: reloaded the access-control list");
    assert_ok(&status_as(NEW));

    std::fs::write(&acl, "[identities.x]\nroles = [\"undefined\"]\n").unwrap();
    server.sighup("SIGHUP: keeping the access-control list in force");
    let refused = server.log_lines("keeping the access-control list in force");
    assert!(refused[0].contains("\"undefined\""), "{refused:?}");
    assert_ok(&status_as(NEW));
    assert_ok(&status_as(APP));

    // No signal: the file's modification time is polled. `new` is gone, `newer` is in.
    let changed = "the access-control file changed: reloaded the access-control list";
    let seen = server.log_lines(changed).len();
    write_later(&acl, &(acl_text() + &reader_identity("newer", NEWER)));
    server.wait_for_log(changed, seen);
    assert_ok(&status_as(NEWER));
    assert_denied(&status_as(NEW), &["not in the access-control list"]);
}

/// Issue #31 item 6: an access-control list inline in `serve --config`'s file is reloaded from
/// that file's `[acl]` table.
#[test]
fn an_inline_acl_is_reloaded_from_the_config_file() {
    const NEW: &str = "new-token-0123456789";
    let dir = tempfile::tempdir().unwrap();
    let inline = |text: String| {
        let acl = text
            .replace("[roles.", "[acl.roles.")
            .replace("[identities.", "[acl.identities.");
        format!("heartbeat-ms = 100\n{acl}")
    };
    let config = dir.path().join("latchkey.toml");
    std::fs::write(&config, inline(acl_text())).unwrap();
    let flags = ["--config".to_owned(), config.display().to_string()];
    let server = AclServer::start_in(dir, &flags, "", &[]);
    assert_denied(
        &server.as_token(NEW, &["status", "app/job"]),
        &["not in the access-control list"],
    );
    std::fs::write(&config, inline(acl_text() + &reader_identity("new", NEW))).unwrap();
    server.sighup("SIGHUP: reloaded the access-control list");
    assert_ok(&server.as_token(NEW, &["status", "app/job"]));
}

/// The `Batch` call (issue #35 item 1) as an attacker uses it: every operation is checked as
/// its own call would be, with the batch's credentials, and one refused operation neither
/// fails nor lets through the others. `app2` (lock and read under `app/`) holds app's session
/// id and secret; `reader` may only read; a batch without a token is nobody's.
#[test]
fn a_batch_checks_every_operation_as_its_own_call() {
    use pb::batch_op::Op;
    use pb::batch_result::Result as R;
    let server = AclServer::start(&[], "", &[]);
    let rt = runtime();
    let mut client = pinned(&rt, &server.addr);
    let victim = create(&rt, &mut client, APP).unwrap();
    let held = rt
        .block_on(client.acquire(as_identity(
            APP,
            pb::AcquireRequest {
                session: Some(victim),
                seq: 1,
                name: "app/held".into(),
                ..Default::default()
            },
        )))
        .unwrap()
        .into_inner();
    assert_eq!(held.result, pb::AcquireResult::Granted as i32);
    let own = create(&rt, &mut client, APP2).unwrap();
    let acquire = |s: pb::Session, seq: u64, name: &str| {
        Op::Acquire(pb::AcquireRequest {
            session: Some(s),
            seq,
            name: name.into(),
            ..Default::default()
        })
    };
    let ops = vec![
        acquire(own, 1, "app/mine"),
        acquire(victim, 2, "app/stolen"),
        acquire(own, 2, "other/x"),
        Op::Release(pb::ReleaseRequest {
            session: Some(victim),
            seq: 3,
            name: "app/held".into(),
            token: held.token,
        }),
        Op::KeepAlive(pb::KeepAliveRequest {
            sessions: vec![victim],
        }),
        Op::CloseSession(pb::CloseSessionRequest {
            session: Some(victim),
        }),
    ];
    let batcher = client.clone();
    let send = |token: Option<&str>, ops: Vec<Op>| {
        let msg = pb::BatchRequest {
            ops: ops
                .into_iter()
                .map(|op| pb::BatchOp { op: Some(op) })
                .collect(),
        };
        let req = match token {
            Some(token) => as_identity(token, msg),
            None => request(msg, Duration::from_secs(5)),
        };
        rt.block_on(batcher.clone().batch(req))
            .expect("the batch itself is answered")
            .into_inner()
            .results
            .into_iter()
            .map(|r| r.result.expect("a result"))
            .collect::<Vec<_>>()
    };
    let results = send(Some(APP2), ops.clone());
    let R::Acquire(mine) = &results[0] else {
        panic!("{results:?}");
    };
    assert_eq!(
        mine.result,
        pb::AcquireResult::Granted as i32,
        "{results:?}"
    );
    for (i, says) in [
        (1, "belongs to another identity"),
        (2, "other/x"),
        (3, "belongs to another identity"),
        (4, "belongs to another identity"),
        (5, "belongs to another identity"),
    ] {
        let R::Error(e) = &results[i] else {
            panic!("operation {i} was not refused: {results:?}");
        };
        assert_eq!(e.code, Code::PermissionDenied as i32, "{i}: {e:?}");
        assert_eq!(e.reason, "permission-denied", "{i}: {e:?}");
        assert!(e.message.contains(says), "{i}: {e:?}");
    }
    // `reader` may not lock; nobody (no token) may do anything.
    let results = send(Some(READER), vec![acquire(own, 9, "app/r")]);
    assert!(
        matches!(&results[..], [R::Error(e)] if e.code == Code::PermissionDenied as i32),
        "{results:?}"
    );
    let results = send(None, ops);
    assert_eq!(results.len(), 6);
    for (i, r) in results.iter().enumerate() {
        assert!(
            matches!(r, R::Error(e) if e.code == Code::Unauthenticated as i32),
            "{i}: {r:?}"
        );
    }
    // Nothing of the victim's changed: its lock is held under its token, its session lives.
    let out = server.as_token(ADMIN, &["status", "app/held", "--json"]);
    assert_ok(&out);
    let status: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(status["token"], held.token, "{status}");
    assert_eq!(status["session"], victim.id, "{status}");
    let alive = rt
        .block_on(client.clone().keep_alive(as_identity(
            APP,
            pb::KeepAliveRequest {
                sessions: vec![victim],
            },
        )))
        .unwrap()
        .into_inner();
    assert!(alive.leases.iter().all(|l| l.alive) && alive.leases.len() == 1);
}

/// Quotas hold inside one `Batch` call: app's `max_waiting` is 1, and a batch of waiting
/// acquires on its session, run at once, queues one and refuses the others; a request sent
/// twice in it is counted once.
#[test]
fn a_batch_cannot_exceed_a_wait_quota() {
    use pb::batch_op::Op;
    use pb::batch_result::Result as R;
    let server = AclServer::start(&[], "", &[]);
    let rt = runtime();
    let mut client = pinned(&rt, &server.addr);
    let holder = create(&rt, &mut client, APP2).unwrap();
    let waiter = create(&rt, &mut client, APP).unwrap();
    const N: u64 = 8;
    for i in 0..N {
        let r = rt
            .block_on(client.acquire(as_identity(
                APP2,
                pb::AcquireRequest {
                    session: Some(holder),
                    seq: 1 + i,
                    name: format!("app/q{i}"),
                    ..Default::default()
                },
            )))
            .unwrap()
            .into_inner();
        assert_eq!(r.result, pb::AcquireResult::Granted as i32);
    }
    // The last operation is the first sent again (a retry racing its first attempt): the
    // same request, counted once, answered as its first attempt is.
    let ops = (0..N)
        .chain([0])
        .map(|i| pb::BatchOp {
            op: Some(Op::Acquire(pb::AcquireRequest {
                session: Some(waiter),
                seq: 1 + i,
                name: format!("app/q{i}"),
                wait_timeout_ms: 30_000,
                ..Default::default()
            })),
        })
        .collect();
    let results = rt
        .block_on(client.batch(as_identity(APP, pb::BatchRequest { ops })))
        .unwrap()
        .into_inner()
        .results;
    let is_pending = |r: &pb::BatchResult| matches!(&r.result, Some(R::Acquire(a)) if a.result == pb::AcquireResult::Pending as i32);
    let is_over = |r: &pb::BatchResult| matches!(&r.result, Some(R::Error(e)) if e.message.contains("max_waiting"));
    let (first, again) = (&results[0], &results[N as usize]);
    assert!(
        (is_pending(first) && is_pending(again)) || (is_over(first) && is_over(again)),
        "the request and its retry were answered apart: {first:?} {again:?}"
    );
    let distinct = &results[..N as usize];
    let pending = distinct.iter().filter(|r| is_pending(r)).count();
    let over = distinct.iter().filter(|r| is_over(r)).count();
    assert_eq!((pending, over), (1, N as usize - 1), "{results:?}");
}

/// An ACL server that also serves the HTTP API: (server, its HTTP address).
fn http_acl_server() -> (AclServer, String) {
    let http = format!("127.0.0.1:{}", free_port());
    let server = AclServer::start(&["--http-listen".to_owned(), http.clone()], "", &[]);
    (server, http)
}

/// A session as the HTTP API's JSON spells it (the secret a decimal string).
fn session_json(s: pb::Session) -> serde_json::Value {
    serde_json::json!({"id": s.id, "secret": s.secret.to_string()})
}

/// `POST /v1/batch` with `ops`, as `token` (none: nobody); the batch must be answered 200,
/// one result per operation.
fn http_batch(
    http: &str,
    token: Option<&str>,
    ops: Vec<serde_json::Value>,
) -> Vec<serde_json::Value> {
    let n = ops.len();
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
    let body = serde_json::json!({ "ops": ops }).to_string();
    let reply = common::http_call(
        http,
        "POST",
        "/v1/batch",
        &headers,
        Some(&body),
        CLI_TIMEOUT,
    )
    .expect("POST /v1/batch");
    assert_eq!(reply.status, 200, "the batch itself is answered: {reply:?}");
    let results = reply.json()["results"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("no results: {reply:?}"));
    assert_eq!(results.len(), n, "{reply:?}");
    results
}

/// `POST /v1/batch` (issue #35 item 1) as an attacker uses it, as `Batch` over gRPC above:
/// every operation is checked as its own route's request would be, with the batch's
/// `Authorization`, and one refused operation neither fails nor lets through the others.
#[test]
fn an_http_batch_checks_every_operation_as_its_own_call() {
    use serde_json::json;
    let (server, http) = http_acl_server();
    let rt = runtime();
    let mut client = pinned(&rt, &server.addr);
    let victim = create(&rt, &mut client, APP).unwrap();
    let held = rt
        .block_on(client.acquire(as_identity(
            APP,
            pb::AcquireRequest {
                session: Some(victim),
                seq: 1,
                name: "app/held".into(),
                ..Default::default()
            },
        )))
        .unwrap()
        .into_inner();
    assert_eq!(held.result, pb::AcquireResult::Granted as i32);
    let own = session_json(create(&rt, &mut client, APP2).unwrap());
    let theirs = session_json(victim);
    let ops = vec![
        json!({"acquire": {"session": own, "seq": 1, "name": "app/mine"}}),
        json!({"acquire": {"session": theirs, "seq": 2, "name": "app/stolen"}}),
        json!({"acquire": {"session": own, "seq": 2, "name": "other/x"}}),
        json!({"release": {"session": theirs, "seq": 3, "name": "app/held", "token": held.token}}),
        json!({"keepalive": {"sessions": [theirs]}}),
        json!({"close": {"session": theirs}}),
    ];
    let results = http_batch(&http, Some(APP2), ops.clone());
    assert_eq!(results[0]["acquire"]["result"], "granted", "{results:?}");
    for (i, says) in [
        (1, "belongs to another identity"),
        (2, "other/x"),
        (3, "belongs to another identity"),
        (4, "belongs to another identity"),
        (5, "belongs to another identity"),
    ] {
        let e = &results[i]["error"];
        assert_eq!(e["code"], "permission-denied", "{i}: {results:?}");
        assert_eq!(e["status"], 403, "{i}: {e}");
        assert!(e["message"].as_str().unwrap().contains(says), "{i}: {e}");
    }
    // `reader` may not lock; nobody (no token) may do anything.
    let results = http_batch(
        &http,
        Some(READER),
        vec![json!({"acquire": {"session": own, "seq": 9, "name": "app/r"}})],
    );
    assert_eq!(
        results[0]["error"]["code"], "permission-denied",
        "{results:?}"
    );
    let results = http_batch(&http, None, ops);
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["error"]["code"], "unauthenticated", "{i}: {r}");
        assert_eq!(r["error"]["status"], 401, "{i}: {r}");
    }
    // Nothing of the victim's changed: its lock is held under its token, its session lives.
    let out = server.as_token(ADMIN, &["status", "app/held", "--json"]);
    assert_ok(&out);
    let status: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(status["token"], held.token, "{status}");
    assert_eq!(status["session"], victim.id, "{status}");
    let alive = rt
        .block_on(client.clone().keep_alive(as_identity(
            APP,
            pb::KeepAliveRequest {
                sessions: vec![victim],
            },
        )))
        .unwrap()
        .into_inner();
    assert!(alive.leases.iter().all(|l| l.alive) && alive.leases.len() == 1);
}

/// Quotas hold inside one `POST /v1/batch`, as in one gRPC `Batch`: app's `max_waiting` is 1,
/// and a batch of waiting acquires on its session queues one and refuses the others; a
/// request sent twice in it is counted once.
#[test]
fn an_http_batch_cannot_exceed_a_wait_quota() {
    let (server, http) = http_acl_server();
    let rt = runtime();
    let mut client = pinned(&rt, &server.addr);
    let holder = create(&rt, &mut client, APP2).unwrap();
    let waiter = session_json(create(&rt, &mut client, APP).unwrap());
    const N: u64 = 8;
    for i in 0..N {
        let r = rt
            .block_on(client.acquire(as_identity(
                APP2,
                pb::AcquireRequest {
                    session: Some(holder),
                    seq: 1 + i,
                    name: format!("app/q{i}"),
                    ..Default::default()
                },
            )))
            .unwrap()
            .into_inner();
        assert_eq!(r.result, pb::AcquireResult::Granted as i32);
    }
    // The last operation is the first sent again: counted once, answered as the first.
    let ops = (0..N)
        .chain([0])
        .map(|i| {
            serde_json::json!({"acquire": {
                "session": waiter, "seq": 1 + i, "name": format!("app/q{i}"),
                "wait_timeout_ms": 30_000,
            }})
        })
        .collect();
    let results = http_batch(&http, Some(APP), ops);
    let is_pending = |r: &serde_json::Value| r["acquire"]["result"] == "pending";
    let is_over = |r: &serde_json::Value| {
        r["error"]["code"] == "quota-exceeded"
            && r["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("max_waiting"))
    };
    let (first, again) = (&results[0], &results[N as usize]);
    assert!(
        (is_pending(first) && is_pending(again)) || (is_over(first) && is_over(again)),
        "the request and its retry were answered apart: {first} {again}"
    );
    let distinct = &results[..N as usize];
    let pending = distinct.iter().filter(|r| is_pending(r)).count();
    let over = distinct.iter().filter(|r| is_over(r)).count();
    assert_eq!((pending, over), (1, N as usize - 1), "{results:?}");
}
