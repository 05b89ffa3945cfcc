//! The warnings `serve` gives at start for a setup that leaves a door open (docs/securing.md,
//! "Access control", "Member authentication"): clients served on a non-loopback address without
//! `--acl`, and a multi-member cluster without a cluster secret. Each is given before `serve`
//! binds, so these tests start it on an address it cannot bind (no port of this machine is
//! opened to the network) and read what it printed before it stopped; with the missing piece
//! given, the same start prints no warning.

mod common;

use std::path::Path;

use common::{free_port, run, Output, CLI_TIMEOUT};

const NO_AUTH: &str = "WARNING: serving clients on";
const NO_SECRET: &str = "peers are not authenticated";

fn serve(dir: &Path, args: &[&str]) -> Output {
    let mut full: Vec<String> = vec![
        "serve".into(),
        "--data-dir".into(),
        dir.join("data").display().to_string(),
    ];
    full.extend(args.iter().map(|a| a.to_string()));
    let out = run(&full, dir, CLI_TIMEOUT);
    // It stops at the bind: the warning was given at start, not at some later event.
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("cannot listen on"), "{}", out.stderr);
    out
}

#[test]
fn serving_clients_on_a_non_loopback_address_without_an_acl_warns() {
    let dir = tempfile::tempdir().unwrap();
    // 192.0.2.0/24 is TEST-NET-1 (RFC 5737): not loopback, and never this machine's address.
    let listen = format!("192.0.2.1:{}", free_port());
    let out = serve(dir.path(), &["--listen", &listen]);
    assert!(
        out.stderr
            .contains(&format!("{NO_AUTH} {listen} without authentication")),
        "{}",
        out.stderr
    );

    let acl = dir.path().join("acl.toml");
    std::fs::write(&acl, "[roles.r]\nread = [\"\"]\n").unwrap();
    let out = serve(
        dir.path(),
        &["--listen", &listen, "--acl", &acl.display().to_string()],
    );
    assert!(!out.stderr.contains(NO_AUTH), "{}", out.stderr);
}

#[test]
fn a_cluster_without_a_secret_warns() {
    let dir = tempfile::tempdir().unwrap();
    // Held here, so that `serve` cannot bind it.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let peers = format!("1={listen},2=127.0.0.1:{}", free_port());
    let args = ["--id", "1", "--listen", &listen, "--peers", &peers];
    let out = serve(dir.path(), &args);
    assert!(
        out.stderr.contains(&format!(
            "{NO_SECRET}: anyone who reaches {listen} can send Raft messages as a member"
        )),
        "{}",
        out.stderr
    );

    let secret = dir.path().join("cluster.secret");
    std::fs::write(&secret, "a-test-cluster-secret-0123456789\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let secret = secret.display().to_string();
    let mut with_secret = args.to_vec();
    with_secret.extend(["--cluster-secret-file", &secret]);
    let out = serve(dir.path(), &with_secret);
    assert!(!out.stderr.contains(NO_SECRET), "{}", out.stderr);
    // A single node has no peers to authenticate.
    let single = serve(dir.path(), &["--listen", &listen]);
    assert!(!single.stderr.contains(NO_SECRET), "{}", single.stderr);
    drop(taken);
}
