//! TLS for clients and members (issue #13), with real `latchkey` processes and certificates
//! generated here. Self-contained: the shared helpers in `common/` are being reworked.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_latchkey")
}

use latchkey_testkit::free_port;

/// A CA and the means to sign certificates with it.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    fn write(&self, path: &Path) -> PathBuf {
        std::fs::write(path, self.cert.pem()).unwrap();
        path.to_owned()
    }

    /// A certificate for 127.0.0.1 and localhost (servers and clients alike: no extended key
    /// usage restricts it), written as `NAME.pem` and `NAME.key` in `dir`.
    fn issue(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        let (cert_path, key_path) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }
}

/// A `latchkey serve` process, killed when dropped; its stderr goes to a file.
struct Server {
    child: Child,
    log: PathBuf,
    port: u16,
}

impl Server {
    fn start(dir: &Path, id: u64, port: u16, extra: &[String]) -> Server {
        let log = dir.join(format!("serve-{id}.log"));
        let data = dir.join(format!("data-{id}"));
        let child = Command::new(bin())
            .arg("serve")
            .args(["--id", &id.to_string()])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(&data)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut server = Server { child, log, port };
        server.wait_for_log("latchkey node serving");
        server
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (bounded) until the log has a line containing `text`.
    fn wait_for_log(&mut self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.log().contains(text) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("server exited ({status}) before {text:?}:\n{}", self.log());
            }
            assert!(Instant::now() < deadline, "no {text:?} in:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn https(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    fn plain(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn paths(args: &[&Path]) -> Vec<String> {
    args.iter().map(|p| p.display().to_string()).collect()
}

/// `latchkey ARGS`, with a bound on its run time.
fn latchkey(args: &[String]) -> Output {
    let mut child = Command::new(bin())
        .args(args)
        .env_remove("LATCHKEY_ENDPOINTS")
        .env_remove("LATCHKEY_CA")
        .env_remove("LATCHKEY_CERT")
        .env_remove("LATCHKEY_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `latchkey lock --wait 0 ... NAME -- true` with these client flags.
fn lock_once(endpoints: &str, flags: &[String]) -> Output {
    let mut args = vec![
        "lock".to_owned(),
        "--endpoints".to_owned(),
        endpoints.to_owned(),
        "--wait".to_owned(),
        "10s".to_owned(),
    ];
    args.extend_from_slice(flags);
    args.extend(["jobs/tls".to_owned(), "--".to_owned(), "true".to_owned()]);
    latchkey(&args)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A failure that is a TLS error given at once, not the end of a retry loop.
fn assert_tls_failure(out: &Output, says: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("TLS: "), "not a TLS error: {err}");
    assert!(err.contains(says), "{says:?} not in: {err}");
    assert!(!err.contains("attempts"), "retried: {err}");
}

fn tls_flags(cert: &Path, key: &Path, ca: Option<&Path>) -> Vec<String> {
    let mut flags = vec![
        "--tls-cert".to_owned(),
        cert.display().to_string(),
        "--tls-key".to_owned(),
        key.display().to_string(),
    ];
    if let Some(ca) = ca {
        flags.extend(["--tls-ca".to_owned(), ca.display().to_string()]);
    }
    flags
}

#[test]
fn a_lock_over_tls_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    let (cert, key) = ca.issue(dir.path(), "server");
    let server = Server::start(dir.path(), 1, free_port(), &tls_flags(&cert, &key, None));
    let out = lock_once(
        &server.https(),
        &["--ca".to_owned(), paths(&[&ca_pem])[0].clone()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_server_certificate_from_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let other = Ca::new("other CA");
    let other_pem = other.write(&dir.path().join("other.pem"));
    let (cert, key) = ca.issue(dir.path(), "server");
    let server = Server::start(dir.path(), 1, free_port(), &tls_flags(&cert, &key, None));
    let out = lock_once(
        &server.https(),
        &["--ca".to_owned(), paths(&[&other_pem])[0].clone()],
    );
    assert_tls_failure(&out, "is not signed by the CA given with --ca");
}

#[test]
fn a_plaintext_client_of_a_tls_server_is_told_to_use_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (cert, key) = ca.issue(dir.path(), "server");
    let server = Server::start(dir.path(), 1, free_port(), &tls_flags(&cert, &key, None));
    let out = lock_once(&server.plain(), &[]);
    assert_tls_failure(
        &out,
        &format!("the server at {} speaks TLS: use https://", server.plain()),
    );
}

#[test]
fn a_tls_client_of_a_plaintext_server_is_told_it_does_not_speak_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    let server = Server::start(dir.path(), 1, free_port(), &[]);
    let out = lock_once(
        &server.https(),
        &["--ca".to_owned(), paths(&[&ca_pem])[0].clone()],
    );
    assert_tls_failure(
        &out,
        &format!(
            "the server at {} does not speak TLS: use http://",
            server.plain()
        ),
    );
}

#[test]
fn an_https_endpoint_without_a_ca_is_refused_not_dialed_in_plaintext() {
    let out = lock_once("https://127.0.0.1:1", &[]);
    let err = stderr(&out);
    // A usage error: the command line lacks --ca (issue #14: exit 2 everywhere).
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("uses TLS: give the CA"), "{err}");
}

#[test]
fn a_client_without_a_certificate_is_refused_when_the_server_requires_one() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    let (cert, key) = ca.issue(dir.path(), "server");
    let (client_cert, client_key) = ca.issue(dir.path(), "client");
    let server = Server::start(
        dir.path(),
        1,
        free_port(),
        &tls_flags(&cert, &key, Some(&ca_pem)),
    );
    let ca_flag = ["--ca".to_owned(), paths(&[&ca_pem])[0].clone()];
    let out = lock_once(&server.https(), &ca_flag);
    assert_tls_failure(&out, "requires a client certificate");
    // A certificate from another CA is refused too.
    let stranger = Ca::new("stranger CA");
    let (bad_cert, bad_key) = stranger.issue(dir.path(), "stranger");
    let mut flags = ca_flag.to_vec();
    flags.extend(paths(&[
        Path::new("--cert"),
        &bad_cert,
        Path::new("--key"),
        &bad_key,
    ]));
    let out = lock_once(&server.https(), &flags);
    assert_tls_failure(&out, "refused this client's certificate");
    // The CA's client gets in.
    let mut flags = ca_flag.to_vec();
    flags.extend(paths(&[
        Path::new("--cert"),
        &client_cert,
        Path::new("--key"),
        &client_key,
    ]));
    let out = lock_once(&server.https(), &flags);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// Three members of one cluster over mTLS, each with its `member-ID` certificate from `ca`,
/// and, with `peer_listen`, serving its peers on a port of its own (`--peer-listen`): the
/// members and their peer ports.
fn mtls_cluster(dir: &Path, ca: &Ca, ca_pem: &Path, peer_listen: bool) -> (Vec<Server>, Vec<u16>) {
    let ports = [free_port(), free_port(), free_port()];
    let peer_ports = if peer_listen {
        vec![free_port(), free_port(), free_port()]
    } else {
        ports.to_vec()
    };
    let peers = (1..=3)
        .zip(ports.iter().zip(&peer_ports))
        .map(|(id, (port, peer))| match peer_listen {
            true => format!("{id}=127.0.0.1:{port}/127.0.0.1:{peer}"),
            false => format!("{id}=127.0.0.1:{port}"),
        })
        .collect::<Vec<_>>()
        .join(",");
    let members = (1..=3u64)
        .zip(ports.iter().zip(&peer_ports))
        .map(|(id, (&port, peer))| {
            let (cert, key) = ca.issue(dir, &format!("member-{id}"));
            let mut flags = tls_flags(&cert, &key, Some(ca_pem));
            flags.extend(["--peers".to_owned(), peers.clone()]);
            if peer_listen {
                flags.extend(["--peer-listen".to_owned(), format!("127.0.0.1:{peer}")]);
            }
            Server::start(dir, id, port, &flags)
        })
        .collect();
    (members, peer_ports)
}

/// A lock through `members` as a client with a certificate from `ca`.
fn assert_locks(dir: &Path, ca: &Ca, ca_pem: &Path, members: &[Server]) {
    let (cert, key) = ca.issue(dir, "client");
    let endpoints = members
        .iter()
        .map(Server::https)
        .collect::<Vec<_>>()
        .join(",");
    let flags = paths(&[
        Path::new("--ca"),
        ca_pem,
        Path::new("--cert"),
        &cert,
        Path::new("--key"),
        &key,
    ]);
    let out = lock_once(&endpoints, &flags);
    assert!(
        out.status.success(),
        "{}\n{}",
        stderr(&out),
        members
            .iter()
            .map(Server::log)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn three_members_over_mtls_grant_a_lock() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("cluster CA");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    let (members, _) = mtls_cluster(dir.path(), &ca, &ca_pem, false);
    assert_locks(dir.path(), &ca, &ca_pem, &members);
}

/// `--peer-listen`: the peer listener speaks the same TLS (and mTLS) as the client one.
#[test]
fn three_members_over_mtls_on_their_own_peer_ports_grant_a_lock() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("cluster CA");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    let (members, _) = mtls_cluster(dir.path(), &ca, &ca_pem, true);
    assert_locks(dir.path(), &ca, &ca_pem, &members);
}

#[test]
fn a_tls_cluster_without_a_ca_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (cert, key) = ca.issue(dir.path(), "server");
    let mut args = vec!["serve".to_owned(), "--peers".to_owned()];
    args.push(format!(
        "1=127.0.0.1:{},2=127.0.0.1:{}",
        free_port(),
        free_port()
    ));
    args.extend([
        "--data-dir".to_owned(),
        dir.path().join("d").display().to_string(),
    ]);
    args.extend(tls_flags(&cert, &key, None));
    let out = latchkey(&args);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("give every member --tls-ca"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_member_whose_certificate_does_not_name_it_is_refused_at_start() {
    // The other members would refuse every message it sends: say so at start, not in their logs.
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_path = ca.write(&dir.path().join("ca.pem"));
    let (cert, key) = ca.issue(dir.path(), "member-2");
    let mut args = vec![
        "serve".to_owned(),
        "--id".to_owned(),
        "1".to_owned(),
        "--peers".to_owned(),
        format!("1=127.0.0.1:{},2=127.0.0.1:{}", free_port(), free_port()),
        "--data-dir".to_owned(),
        dir.path().join("d").display().to_string(),
    ];
    args.extend(tls_flags(&cert, &key, Some(&ca_path)));
    let out = latchkey(&args);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("must name it `member-1`"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_missing_or_bad_certificate_file_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    for (cert, says) in [
        (
            dir.path().join("absent.pem"),
            "cannot read the certificate file",
        ),
        (junk.clone(), "holds no certificate"),
    ] {
        let mut args = vec!["serve".to_owned()];
        args.extend([
            "--data-dir".to_owned(),
            dir.path().join("d").display().to_string(),
        ]);
        args.extend(["--listen".to_owned(), format!("127.0.0.1:{}", free_port())]);
        args.extend(tls_flags(&cert, &junk, None));
        let out = latchkey(&args);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert!(stderr(&out).contains(says), "{says:?}: {}", stderr(&out));
    }
}

#[test]
fn sighup_after_replacing_the_files_serves_the_new_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let old_ca = Ca::new("old CA");
    let new_ca = Ca::new("new CA");
    let old_pem = old_ca.write(&dir.path().join("old-ca.pem"));
    let new_pem = new_ca.write(&dir.path().join("new-ca.pem"));
    let (cert, key) = old_ca.issue(dir.path(), "server");
    let mut server = Server::start(dir.path(), 1, free_port(), &tls_flags(&cert, &key, None));
    let endpoint = server.https();
    let with = |ca: &Path| lock_once(&endpoint, &paths(&[Path::new("--ca"), ca]));
    let out = with(&old_pem);
    assert!(out.status.success(), "{}", stderr(&out));

    // A bad pair is refused and the old one kept.
    std::fs::write(&key, "garbage").unwrap();
    let pid = nix::unistd::Pid::from_raw(server.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    server.wait_for_log("SIGHUP: keeping the TLS certificate in use");
    let out = with(&old_pem);
    assert!(out.status.success(), "{}", stderr(&out));

    // The new CA's certificate, written over the old files.
    let (new_cert, new_key) = new_ca.issue(dir.path(), "next");
    std::fs::copy(&new_cert, &cert).unwrap();
    std::fs::copy(&new_key, &key).unwrap();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    server.wait_for_log("SIGHUP: reloaded the TLS certificate");
    let out = with(&new_pem);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_tls_failure(&with(&old_pem), "is not signed by the CA given with --ca");
}

/// `curl ARGS`: its exit status and what it printed (the body, then the status code on a line of
/// its own), bounded in time by curl's own `--max-time`.
fn curl(args: &[&str]) -> (bool, String) {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "20", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The HTTP API of a TLS node is served over TLS (issue #15): with the node's certificate, its
/// client-certificate check, and the certificate's identity under access control; a
/// plaintext client is answered in HTTP, with a JSON error that says to use TLS.
#[test]
fn the_http_api_of_a_tls_node_needs_tls_and_knows_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    let (cert, key) = ca.issue(dir.path(), "server");
    let (worker_cert, worker_key) = ca.issue(dir.path(), "worker");
    let (stranger_cert, stranger_key) = ca.issue(dir.path(), "stranger");
    let acl = dir.path().join("acl.toml");
    std::fs::write(
        &acl,
        "[roles.reader]\nread = [\"\"]\n\n[identities.worker]\nroles = [\"reader\"]\n",
    )
    .unwrap();
    let http_port = free_port();
    let mut flags = tls_flags(&cert, &key, Some(&ca_pem));
    flags.extend([
        "--acl".to_owned(),
        acl.display().to_string(),
        "--http-listen".to_owned(),
        format!("127.0.0.1:{http_port}"),
    ]);
    let server = Server::start(dir.path(), 1, free_port(), &flags);
    let url = format!("https://127.0.0.1:{http_port}/v1/cluster/status");
    let files = paths(&[
        &ca_pem,
        &worker_cert,
        &worker_key,
        &stranger_cert,
        &stranger_key,
    ]);
    let as_worker = [
        "--cacert", &files[0], "--cert", &files[1], "--key", &files[2], &url,
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, out) = curl(&as_worker);
        if ok && out.contains(r#""role":"leader""#) && out.ends_with("\n200") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the worker never read the status: {out}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let as_stranger = [
        "--cacert", &files[0], "--cert", &files[3], "--key", &files[4], &url,
    ];
    let (_, out) = curl(&as_stranger);
    assert!(
        out.contains(r#""code":"unauthenticated""#) && out.ends_with("\n401"),
        "{out}"
    );
    // Refused by the same check as over gRPC, and logged with the connection's address.
    let log = server.log();
    assert!(
        log.contains("refused a client (unknown-identity) from 127.0.0.1:")
            && log.contains("names [\"stranger\""),
        "{log}"
    );
    // Without a client certificate the handshake itself fails (the CA makes it mandatory).
    let (ok, out) = curl(&["--cacert", &files[0], &url]);
    assert!(!ok, "a client without a certificate got in: {out}");
    let (_, out) = curl(&[&format!("http://127.0.0.1:{http_port}/v1/cluster/status")]);
    assert!(
        out.contains(r#""code":"tls-required""#) && out.ends_with("\n400"),
        "{out}"
    );
}

/// docs/securing.md, "TLS", rotation: without SIGHUP, the files' modification times are polled
/// every `RELOAD_POLL_MS`, and a changed pair is served from then on.
#[test]
fn replacing_the_files_without_sighup_serves_the_new_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let old_ca = Ca::new("old CA");
    let new_ca = Ca::new("new CA");
    let old_pem = old_ca.write(&dir.path().join("old-ca.pem"));
    let new_pem = new_ca.write(&dir.path().join("new-ca.pem"));
    let (cert, key) = old_ca.issue(dir.path(), "server");
    let mut server = Server::start(dir.path(), 1, free_port(), &tls_flags(&cert, &key, None));
    let endpoint = server.https();
    let with = |ca: &Path| lock_once(&endpoint, &paths(&[Path::new("--ca"), ca]));
    let out = with(&old_pem);
    assert!(out.status.success(), "{}", stderr(&out));

    // The new CA's pair over the old files; their modification times move past the loaded
    // ones even on a file system with coarse timestamps.
    let (new_cert, new_key) = new_ca.issue(dir.path(), "next");
    let later = std::time::SystemTime::now() + Duration::from_secs(2);
    for (from, to) in [(&new_key, &key), (&new_cert, &cert)] {
        std::fs::copy(from, to).unwrap();
        std::fs::File::options()
            .write(true)
            .open(to)
            .unwrap()
            .set_modified(later)
            .unwrap();
    }
    // Bounded by `wait_for_log`'s 30 s, several poll intervals.
    server.wait_for_log("the certificate files changed: reloaded the TLS certificate");
    assert!(!server.log().contains("SIGHUP"), "{}", server.log());
    let out = with(&new_pem);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_tls_failure(&with(&old_pem), "is not signed by the CA given with --ca");
}

/// docs/securing.md, "Securing a cluster": "a client's certificate from the same CA cannot speak
/// for a member". On a real mTLS cluster, a connection presenting `member-2`'s certificate (signed
/// by the members' CA) sends member 3's peer port a message signed as member 1: refused for its
/// certificate. The same message as member 2 passes that check (and fails only on its payload), so
/// what refused the first was the certificate.
#[test]
fn a_member_certificate_cannot_speak_for_another_member() {
    use latchkey_proto::v1 as pb;
    use latchkey_proto::v1::raft_peer_client::RaftPeerClient;
    use latchkey_server::peer_auth::{ClusterId, PeerAuth, PeerMethod};
    use latchkey_server::PeerConnector;

    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("cluster CA");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    let (members, peer_ports) = mtls_cluster(dir.path(), &ca, &ca_pem, true);
    assert_locks(dir.path(), &ca, &ca_pem, &members);
    let peers: std::collections::BTreeMap<u64, String> = (1..=3u64)
        .zip(members.iter().zip(&peer_ports))
        .map(|(id, (m, peer))| (id, format!("{}/127.0.0.1:{peer}", m.plain())))
        .collect();
    let cluster = ClusterId::founded_by(&peers);
    let (cert, key) = ca.issue(dir.path(), "member-2");
    let tls = latchkey_server::tls::ServerTls::load(latchkey_server::tls::TlsFiles {
        cert,
        key,
        ca: Some(ca_pem.clone()),
    })
    .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let send_as = |from: u64| {
        let channel = {
            let _in_runtime = rt.enter();
            latchkey_server::tls::TlsPeerConnector(tls.clone())
                .channel(&format!("127.0.0.1:{}", peer_ports[2]))
                .unwrap()
        };
        let payload = b"not a vote".to_vec();
        let mut meta = tonic::metadata::MetadataMap::new();
        PeerAuth::new(from, cluster.clone(), None).sign(&mut meta, PeerMethod::Vote, 3, &payload);
        let request = tonic::Request::from_parts(
            meta,
            tonic::Extensions::default(),
            pb::PeerMessage { payload },
        );
        rt.block_on(RaftPeerClient::new(channel).vote(request))
    };
    let as_member_1 = send_as(1).expect_err("member 1's message over member 2's certificate");
    assert_eq!(
        as_member_1.code(),
        tonic::Code::PermissionDenied,
        "{as_member_1:?}"
    );
    assert!(
        as_member_1
            .message()
            .contains("must come with a certificate naming `member-1`"),
        "{as_member_1:?}"
    );
    let as_member_2 = send_as(2).expect_err("a payload that is no vote");
    assert_eq!(
        as_member_2.code(),
        tonic::Code::InvalidArgument,
        "{as_member_2:?}"
    );
    // Refused with a log line, and the cluster unharmed.
    assert!(
        members[2].log().contains("refused a peer message"),
        "{}",
        members[2].log()
    );
    assert_locks(dir.path(), &ca, &ca_pem, &members);
}

/// `latchkey_auth_refused_total{reason="REASON"}` on `/metrics` at `addr` (0 when absent).
fn refused_total(addr: &str, reason: &str) -> u64 {
    let (ok, out) = curl(&[&format!("http://{addr}/metrics")]);
    assert!(ok && out.ends_with("\n200"), "{out}");
    let series = format!("latchkey_auth_refused_total{{reason=\"{reason}\"}} ");
    out.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0, |v| v.trim().parse().expect("a count"))
}

impl Server {
    /// SIGHUP, then waits for the log to have one more line containing `text`.
    fn sighup(&mut self, text: &str) {
        let seen = self.log().matches(text).count();
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
        self.wait_for_more(text, seen);
    }

    /// Waits (bounded) until the log has more than `seen` lines containing `text`.
    fn wait_for_more(&mut self, text: &str, seen: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.log().matches(text).count() <= seen {
            assert!(
                Instant::now() < deadline,
                "no new {text:?} in:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Issue #31 items 5 and 6: a handshake refused for its client certificate (none, or one the CA
/// did not sign) is counted and logged with the client's address; the CA file is reloaded on
/// SIGHUP and when it changes, so a client whose certificate comes from a new CA is refused
/// before the CA file trusts that CA and accepted after, without a restart.
#[test]
fn a_client_of_a_new_ca_is_refused_before_and_accepted_after_the_ca_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let old_ca = Ca::new("old CA");
    let new_ca = Ca::new("new CA");
    let ca_file = old_ca.write(&dir.path().join("ca.pem"));
    let old_pem = old_ca.write(&dir.path().join("old-ca.pem"));
    let (cert, key) = old_ca.issue(dir.path(), "server");
    let (client_cert, client_key) = new_ca.issue(dir.path(), "client");
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut flags = tls_flags(&cert, &key, Some(&ca_file));
    flags.extend(["--metrics-listen".to_owned(), metrics.clone()]);
    let mut server = Server::start(dir.path(), 1, free_port(), &flags);
    let endpoint = server.https();
    let server_ca = ["--ca".to_owned(), old_pem.display().to_string()];
    let mut as_client = server_ca.to_vec();
    as_client.extend(paths(&[
        Path::new("--cert"),
        &client_cert,
        Path::new("--key"),
        &client_key,
    ]));

    assert_tls_failure(
        &lock_once(&endpoint, &as_client),
        "refused this client's certificate",
    );
    assert_tls_failure(
        &lock_once(&endpoint, &server_ca),
        "requires a client certificate",
    );
    assert!(refused_total(&metrics, "bad-certificate") >= 1);
    assert!(refused_total(&metrics, "no-certificate") >= 1);
    let log = server.log();
    for reason in ["bad-certificate", "no-certificate"] {
        let said = format!("refused a client ({reason}) from 127.0.0.1:");
        assert!(log.contains(&said), "no {said:?} in:\n{log}");
    }

    // A rotation: the CA file trusts both CAs, then SIGHUP.
    let both = old_ca.cert.pem() + &new_ca.cert.pem();
    std::fs::write(&ca_file, both).unwrap();
    server.sighup("SIGHUP: reloaded the client CA");
    let out = lock_once(&endpoint, &as_client);
    assert!(out.status.success(), "{}", stderr(&out));

    // No signal: the file's modification time is polled. The new CA is trusted no more.
    let changed = "the CA file changed: reloaded the client CA";
    let seen = server.log().matches(changed).count();
    std::fs::write(&ca_file, old_ca.cert.pem()).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&ca_file)
        .unwrap()
        .set_modified(std::time::SystemTime::now() + Duration::from_secs(2))
        .unwrap();
    server.wait_for_more(changed, seen);
    assert_tls_failure(
        &lock_once(&endpoint, &as_client),
        "refused this client's certificate",
    );
    // A CA file that does not load is refused; the CA in use stays.
    std::fs::write(&ca_file, "not a certificate").unwrap();
    server.sighup("SIGHUP: keeping the client CA in use");
    let (server_cert, server_key) = old_ca.issue(dir.path(), "old-client");
    let mut as_old_client = server_ca.to_vec();
    as_old_client.extend(paths(&[
        Path::new("--cert"),
        &server_cert,
        Path::new("--key"),
        &server_key,
    ]));
    let out = lock_once(&endpoint, &as_old_client);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// Issue #31 item 6, the members' own dialing: after the CA file of every member is given a new
/// CA beside the old one (reloaded, no restart), a member restarted with a certificate of the
/// new CA is dialed by the others again, and catches up. Each connection a member makes trusts
/// the CA in use when it is made; with the CA read at start, the others' redials to it failed.
#[test]
fn members_redial_with_the_reloaded_ca() {
    let dir = tempfile::tempdir().unwrap();
    let old_ca = Ca::new("old CA");
    let new_ca = Ca::new("new CA");
    let ca_file = old_ca.write(&dir.path().join("ca.pem"));
    let (mut members, _) = mtls_cluster(dir.path(), &old_ca, &ca_file, false);
    assert_locks(dir.path(), &old_ca, &ca_file, &members);

    std::fs::write(&ca_file, old_ca.cert.pem() + &new_ca.cert.pem()).unwrap();
    for member in &mut members {
        member.sighup("SIGHUP: reloaded the client CA");
    }
    // Member 1 stops and misses a lock, so it cannot lead when it returns: the others must dial
    // it to bring it up to date.
    let port = members[0].port;
    let peers = (1..=3)
        .zip(&members)
        .map(|(id, m)| format!("{id}=127.0.0.1:{}", m.port))
        .collect::<Vec<_>>()
        .join(",");
    drop(members.remove(0));
    assert_locks(dir.path(), &old_ca, &ca_file, &members);
    let (cert, key) = new_ca.issue(dir.path(), "member-1");
    let mut flags = tls_flags(&cert, &key, Some(&ca_file));
    flags.extend(["--peers".to_owned(), peers]);
    members.insert(0, Server::start(dir.path(), 1, port, &flags));

    let (client_cert, client_key) = old_ca.issue(dir.path(), "observer");
    let mut args = vec![
        "cluster".to_owned(),
        "status".to_owned(),
        "--json".to_owned(),
    ];
    args.extend([
        "--endpoints".to_owned(),
        members
            .iter()
            .map(Server::https)
            .collect::<Vec<_>>()
            .join(","),
    ]);
    args.extend(paths(&[
        Path::new("--ca"),
        &ca_file,
        Path::new("--cert"),
        &client_cert,
        Path::new("--key"),
        &client_key,
    ]));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = latchkey(&args);
        let report: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
        let applied = |id: u64| {
            report["members"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|m| m["id"] == id)
                .and_then(|m| m["applied_index"].as_u64())
        };
        let leader = report["leader"].as_u64().filter(|&l| l != 1);
        let caught_up = leader
            .and_then(|l| Some(applied(1)? >= applied(l)?))
            .unwrap_or(false);
        if caught_up {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "member 1 never caught up: {report}\n{}",
            members
                .iter()
                .map(Server::log)
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `curl ARGS` with `-X METHOD`, a JSON body and headers: the body, then the status code.
fn curl_post(tls: &[&str], url: &str, headers: &[&str], body: &str) -> String {
    let mut args: Vec<&str> = tls.to_vec();
    args.extend([
        "-X",
        "POST",
        "-H",
        "content-type: application/json",
        "-d",
        body,
    ]);
    for h in headers {
        args.extend(["-H", h]);
    }
    args.push(url);
    curl(&args).1
}

/// Issue #33 item 2 over TLS: a follower forwards an HTTP request to its leader over TLS,
/// presenting its member certificate only to open the connection; the caller is its own
/// bearer token at the leader. The attack matrix: the members' certificates name identities
/// with `admin` (as a member's might), and none of them may be taken for a caller: a token
/// without `admin` is refused the admin call through every follower; a malformed or unknown
/// bearer header is refused, never passed over for the certificate; a caller known only by its
/// certificate is not forwarded (it is answered `not-leader`, as before), so the follower's
/// certificate never stands in for it.
#[test]
fn a_follower_forwards_over_tls_and_its_certificate_is_never_the_caller() {
    const APP: &str = "app-token-0123456789";
    // An admin token the leader no longer knows but the followers still do (revoked, and the
    // leader reloaded its list first).
    const STALE: &str = "stale-admin-token-0123456789";
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("cluster CA");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    let acl_of = |id: usize| dir.path().join(format!("acl-{id}.toml"));
    let sha = |t: &str| {
        use sha2::Digest;
        let d = sha2::Sha256::digest(t.as_bytes());
        d.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    let acl_text = |stale: bool| {
        let stale = match stale {
            true => format!(
                "[identities.stale]\ntoken_sha256 = \"{}\"\nroles = [\"root\"]\n",
                sha(STALE)
            ),
            false => String::new(),
        };
        format!(
            r#"
[roles.app]
lock = ["app/"]
read = ["app/"]

[roles.root]
admin = [""]
lock = [""]
read = [""]

[identities.app]
token_sha256 = "{}"
roles = ["app"]

[identities.worker]
roles = ["app"]

[identities."member-1"]
roles = ["root"]

[identities."member-2"]
roles = ["root"]

[identities."member-3"]
roles = ["root"]

{stale}"#,
            sha(APP)
        )
    };
    for id in 1..=3 {
        std::fs::write(acl_of(id), acl_text(true)).unwrap();
    }
    let ports = [free_port(), free_port(), free_port()];
    let http_ports = [free_port(), free_port(), free_port()];
    let peers = (1..=3)
        .zip(&ports)
        .map(|(id, port)| format!("{id}=127.0.0.1:{port}"))
        .collect::<Vec<_>>()
        .join(",");
    let start = |id: u64, acl: bool| {
        let i = (id - 1) as usize;
        let (cert, key) = ca.issue(dir.path(), &format!("member-{id}"));
        let mut flags = tls_flags(&cert, &key, Some(&ca_pem));
        flags.extend([
            "--peers".to_owned(),
            peers.clone(),
            "--http-listen".to_owned(),
            format!("127.0.0.1:{}", http_ports[i]),
        ]);
        if acl {
            flags.extend([
                "--acl".to_owned(),
                acl_of(id as usize).display().to_string(),
            ]);
        }
        Server::start(dir.path(), id, ports[i], &flags)
    };
    let mut members: Vec<Server> = (1..=3u64).map(|id| start(id, true)).collect();
    let (client_cert, client_key) = ca.issue(dir.path(), "client");
    let (worker_cert, worker_key) = ca.issue(dir.path(), "worker");
    let (stranger_cert, stranger_key) = ca.issue(dir.path(), "stranger");
    let files = paths(&[
        &ca_pem,
        &client_cert,
        &client_key,
        &worker_cert,
        &worker_key,
        &stranger_cert,
        &stranger_key,
    ]);
    let as_client = [
        "--cacert", &files[0], "--cert", &files[1], "--key", &files[2],
    ];
    let as_worker = [
        "--cacert", &files[0], "--cert", &files[3], "--key", &files[4],
    ];
    let url = |i: usize, path: &str| format!("https://127.0.0.1:{}{path}", http_ports[i]);
    let bearer = format!("authorization: Bearer {APP}");
    // The leader, by its own answer; then wait until every follower forwards (it needs its
    // leader's HTTP address, which the leader's appends carry).
    let deadline = Instant::now() + Duration::from_secs(60);
    let leader = loop {
        let found = (0..3).find(|&i| {
            let (ok, out) = curl(
                &[
                    &as_client[..],
                    &["-H", &bearer, &url(i, "/v1/cluster/status")],
                ]
                .concat(),
            );
            ok && out.contains(r#""role":"leader""#) && out.ends_with("\n200")
        });
        if let Some(i) = found {
            break i;
        }
        assert!(Instant::now() < deadline, "no leader over HTTPS");
        std::thread::sleep(Duration::from_millis(100));
    };
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    // The leader forgets the stale admin token; the followers keep it.
    std::fs::write(acl_of(leader + 1), acl_text(false)).unwrap();
    loop {
        if members[leader]
            .log()
            .contains("reloaded the access-control list")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the leader never reloaded its list"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for &f in &followers {
        loop {
            let out = curl_post(
                &as_client,
                &url(f, "/v1/sessions"),
                &[&bearer],
                r#"{"ttl_ms":15000}"#,
            );
            if out.ends_with("\n200") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "follower {} never forwarded over TLS: {out}\n{}",
                f + 1,
                members[f].log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    for &f in &followers {
        let post = |headers: &[&str], path: &str, body: &str| {
            curl_post(&as_client, &url(f, path), headers, body)
        };
        // Forwarded over TLS: the app's session and grant are made at the leader.
        let created = post(&[&bearer], "/v1/sessions", r#"{"ttl_ms":15000}"#);
        assert!(
            created.ends_with("\n200"),
            "via member {}: {created}",
            f + 1
        );
        let body: serde_json::Value =
            serde_json::from_str(created.rsplit_once('\n').unwrap().0).unwrap();
        let session = body["session"].to_string();
        let acquire =
            format!(r#"{{"session":{session},"seq":1,"name":"app/x{f}","wait_timeout_ms":0}}"#);
        let granted = post(&[&bearer], "/v1/locks/acquire", &acquire);
        assert!(granted.ends_with("\n200"), "{granted}");
        assert!(granted.contains(r#""token""#), "{granted}");
        // The attack: the follower's own certificate (member-N, admin) must not lend the app
        // its rights. Through the follower, the app's token is refused the admin call.
        let release = format!(r#"{{"name":"app/x{f}","reason":"attack"}}"#);
        let escalated = post(&[&bearer], "/v1/admin/release", &release);
        assert!(
            escalated.ends_with("\n403"),
            "admin through a follower's certificate: {escalated}"
        );
        // A bearer header that is malformed or unknown is refused, never passed over for a
        // certificate (the caller's or, forwarded, the follower's).
        for bad in [
            "authorization: Basic bWVtYmVyOng=",
            "authorization: Bearer unknown-token-0000",
        ] {
            let out = post(&[bad], "/v1/admin/release", &release);
            assert!(out.ends_with("\n401"), "{bad}: {out}");
        }
        // A token the follower accepts (admin there) but the leader does not know: refused at
        // the leader, which never falls back to the certificate it sees (the follower's, an
        // admin's).
        let stale = format!("authorization: Bearer {STALE}");
        let out = post(&[&stale], "/v1/admin/release", &release);
        assert!(
            out.ends_with("\n401") && out.contains("not in the access-control list"),
            "a token the leader does not know, through member {}: {out}",
            f + 1
        );
        // A caller known only by its certificate is not forwarded: answered `not-leader`,
        // its certificate's identity never swapped for the follower's.
        let worker = curl_post(
            &as_worker,
            &url(f, "/v1/sessions"),
            &[],
            r#"{"ttl_ms":15000}"#,
        );
        assert!(
            worker.ends_with("\n503") && worker.contains(r#""code":"not-leader""#),
            "{worker}"
        );
        // The forwarded mark gives nobody an identity at the leader either.
        let marked = curl_post(
            &as_client,
            &url(leader, "/v1/admin/release"),
            &["latchkey-forwarded-by: 2"],
            &release,
        );
        assert!(marked.ends_with("\n401"), "{marked}");
    }
    // Those refusals were the leader's, of requests the followers forwarded.
    let log = members[leader].log();
    assert!(log.contains("refused a client (unknown-token)"), "{log}");
    // A follower without access control (a cluster part-way through turning it on) forwards
    // a caller known only by its certificate: at the leader, the connection's certificate is
    // the follower's (member-N, root here), and must not be taken for the caller (the
    // attacker's review of issue #35, F1: a certificate no list names was granted a session
    // and locks outside every prefix). The leader judges the request without a certificate:
    // no credentials.
    let f = followers[0];
    let _ = members[f].child.kill();
    let _ = members[f].child.wait();
    members[f] = start(f as u64 + 1, false);
    let as_stranger = [
        "--cacert", &files[0], "--cert", &files[5], "--key", &files[6],
    ];
    let answered = loop {
        let out = curl_post(
            &as_stranger,
            &url(f, "/v1/sessions"),
            &[],
            r#"{"ttl_ms":15000}"#,
        );
        // 503 `not-leader` until the restarted follower has heard its leader's address.
        if !out.ends_with("\n503") {
            break out;
        }
        assert!(
            Instant::now() < deadline + Duration::from_secs(60),
            "member {} never forwarded: {out}\n{}",
            f + 1,
            members[f].log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        answered.ends_with("\n401") && answered.contains("unauthenticated"),
        "a stranger's certificate through a follower without --acl: {answered}"
    );
    // The grants stand: nobody released them.
    for &f in &followers {
        let out = curl(
            &[
                &as_client[..],
                &[
                    "-H",
                    &bearer,
                    &url(leader, &format!("/v1/lock?name=app/x{f}")),
                ],
            ]
            .concat(),
        )
        .1;
        assert!(
            out.contains(r#""holder":{"#) && out.ends_with("\n200"),
            "app/x{f}: {out}"
        );
    }
}
