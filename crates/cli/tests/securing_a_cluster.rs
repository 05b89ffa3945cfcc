//! The README's "Securing a cluster" walkthrough, run as written (issue #13): the shell block
//! between the `securing-a-cluster` markers is taken from README.md and run by `bash` in an
//! empty directory, with `latchkey` on the PATH and its fixed ports moved to free ones. Every
//! claim the walkthrough makes in its comments is checked against what it printed, so the README
//! cannot drift from the code.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The walkthrough as the README has it.
fn walkthrough() -> String {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .expect("README.md");
    let start = readme
        .find("<!-- securing-a-cluster:begin -->")
        .expect("README.md has the securing-a-cluster:begin marker");
    let end = readme
        .find("<!-- securing-a-cluster:end -->")
        .expect("README.md has the securing-a-cluster:end marker");
    let block = &readme[start..end];
    let body = block
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.rsplit_once("```"))
        .map(|(body, _)| body)
        .expect("the walkthrough is one ```sh block");
    body.to_owned()
}

/// A four-digit port prefix B such that ports B1, B2 and B3 are free (the walkthrough's members
/// listen on 127.0.0.1:742ID).
fn free_port_prefix() -> u16 {
    let seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos() as u64;
    for i in 0..200u64 {
        let prefix = 2000
            + ((seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(i * 7919))
                % 4400) as u16;
        if (1..=3).all(|id| std::net::TcpListener::bind(("127.0.0.1", prefix * 10 + id)).is_ok()) {
            return prefix;
        }
    }
    panic!("no three free ports in 200 tries");
}

/// Kills the walkthrough's process group (the shell and the members it started) when dropped.
struct Group(i32);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(-self.0),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

#[test]
fn the_securing_a_cluster_walkthrough_runs_as_written() {
    let script = walkthrough();
    assert!(
        script.contains("127.0.0.1:742"),
        "the walkthrough's members listen on 127.0.0.1:742ID"
    );
    let prefix = free_port_prefix();
    let script = script.replace("127.0.0.1:742", &format!("127.0.0.1:{prefix}"));

    let dir = tempfile::tempdir().unwrap();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_latchkey")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = Command::new("bash");
    command
        .arg("-c")
        .arg(format!("set -u\n{script}"))
        .current_dir(dir.path())
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    for (key, _) in std::env::vars() {
        if key.starts_with("LATCHKEY_") {
            command.env_remove(key);
        }
    }
    let mut child = command.spawn().expect("bash");
    let _group = Group(child.id() as i32);

    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the walkthrough did not finish in 120 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let (mut out, mut err) = (String::new(), String::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let logs: String = (1..=3)
        .map(|id| {
            std::fs::read_to_string(dir.path().join(format!("member-{id}.log"))).unwrap_or_default()
        })
        .collect();
    let all = format!("stdout:\n{out}\nstderr:\n{err}\nmember logs:\n{logs}");
    assert!(status.success(), "the walkthrough failed: {status}\n{all}");

    // Step 4: the deployer locks deploy/web, and its COMMAND sees the fencing token.
    let token = out
        .lines()
        .find_map(|l| l.strip_prefix("deploying under token "))
        .unwrap_or_else(|| panic!("no grant of deploy/web\n{all}"));
    assert!(
        token.trim().parse::<u64>().is_ok(),
        "token {token:?}\n{all}"
    );
    // ... but not other/x: permission denied, exit 5, naming the lock and the permission.
    assert!(out.contains("other/x refused: exit 5"), "{all}");
    assert!(
        err.contains("other/x") && err.contains("lock"),
        "the denial names the lock and the permission\n{all}"
    );
    // `cluster status` shows three members, one of them the leader.
    assert!(out.contains("leader"), "{all}");
    for id in 1..=3 {
        assert!(
            out.contains(&format!("127.0.0.1:{}", prefix * 10 + id)),
            "cluster status lists member {id}\n{all}"
        );
    }
    // Step 5: no certificate fails the TLS handshake (exit 1), a certificate naming no identity
    // is unauthenticated (exit 5), plaintext against TLS is told so (exit 1).
    assert!(out.contains("no certificate: exit 1"), "{all}");
    assert!(out.contains("unknown identity: exit 5"), "{all}");
    assert!(out.contains("plaintext: exit 1"), "{all}");
    assert!(
        err.contains("intruder"),
        "the refusal names the certificate's name\n{all}"
    );

    // The members formed one cluster over mTLS and never refused one another.
    assert!(
        !logs.contains("refused a peer message"),
        "a member refused another\n{all}"
    );
    // `kill $(jobs -p)` stopped them: their ports are free again.
    for id in 1..=3 {
        let port = prefix * 10 + id;
        latchkey_testkit::wait_until("the members to stop", Duration::from_secs(10), || {
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
        });
    }
}
