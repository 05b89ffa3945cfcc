//! The README's two-minute tour, run as a new user runs it (issue #33, "Done when"): its three
//! ```sh blocks taken from README.md as they stand, one per terminal, in an empty directory,
//! with what each printed checked against what the README says it does. Only two things differ
//! from a user's terminals, each asserted to be in the README as the test assumes:
//! - `cargo run --release -- serve` runs this build's `latchkey serve` (the binary that command
//!   builds; `.ci/run` runs the README's `cargo install --locked --path crates/cli` itself and
//!   the installed binary), and the block's `cargo install` line is skipped, `latchkey` being on
//!   the PATH;
//! - the default address 127.0.0.1:7420 is a free port instead, given as `LATCHKEY_LISTEN` to
//!   the server and `LATCHKEY_ENDPOINTS` to the clients, the variables the tour's commands read.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The ```sh blocks of the README between two headings.
fn readme_blocks(from: &str, to: &str) -> Vec<String> {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let text = std::fs::read_to_string(&readme).expect("README.md");
    let start = text.find(from).unwrap_or_else(|| panic!("no {from:?}"));
    let end = start
        + text[start..]
            .find(to)
            .unwrap_or_else(|| panic!("no {to:?}"));
    let section = &text[start..end];
    section
        .split("```sh\n")
        .skip(1)
        .map(|b| b.split_once("```").expect("a closed block").0.to_owned())
        .collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One terminal: `bash -c SCRIPT` in its own process group (killed when dropped), its output
/// in files of the tour's directory.
struct Terminal {
    child: Child,
    out: std::path::PathBuf,
    err: std::path::PathBuf,
}

impl Terminal {
    fn open(dir: &Path, name: &str, script: &str, addr: &str) -> Terminal {
        let bin_dir = Path::new(env!("CARGO_BIN_EXE_latchkey")).parent().unwrap();
        let out = dir.join(format!("{name}.out"));
        let err = dir.join(format!("{name}.err"));
        let mut command = Command::new("bash");
        command
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    bin_dir.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .process_group(0);
        for (key, _) in std::env::vars() {
            if key.starts_with("LATCHKEY_") {
                command.env_remove(key);
            }
        }
        command
            .env("LATCHKEY_LISTEN", addr)
            .env("LATCHKEY_ENDPOINTS", addr);
        Terminal {
            child: command.spawn().expect("bash"),
            out,
            err,
        }
    }

    fn out(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    fn err(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    fn wait(&mut self, within: Duration, what: &str) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: still running after {within:?}\nstdout:\n{}\nstderr:\n{}",
                self.out(),
                self.err()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Ctrl-C: SIGINT to the terminal's foreground process group.
    fn interrupt(&self) {
        kill(Pid::from_raw(-(self.child.id() as i32)), Signal::SIGINT).unwrap();
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(-(self.child.id() as i32)), Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// Waits until the member at `addr` answers `latchkey list`, as a user would retry.
fn until_serving(dir: &Path, addr: &str, server: &Terminal) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut probe = Terminal::open(dir, "probe", "latchkey list >/dev/null", addr);
        if probe
            .wait(Duration::from_secs(20), "latchkey list")
            .success()
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the server did not serve in 30 s\nserver stderr:\n{}\nlist stderr:\n{}",
            server.err(),
            probe.err()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn token_after(text: &str, prefix: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|rest| rest.trim().parse().ok())
}

#[test]
fn the_readme_tour_runs_as_written() {
    let blocks = readme_blocks("## A two-minute tour", "## A cluster of three");
    assert_eq!(blocks.len(), 3, "the tour is three terminals: {blocks:#?}");
    let (serve, second, third) = (&blocks[0], &blocks[1], &blocks[2]);
    assert_eq!(serve.trim(), "cargo run --release -- serve");
    let serve = serve.replace("cargo run --release --", "latchkey");
    let install = "cargo install --locked --path crates/cli";
    assert!(second.contains(install), "{second}");
    let second = second.replace(install, "");
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());

    // Terminal 1: the server.
    let mut server = Terminal::open(dir.path(), "terminal-1", &serve, &addr);
    until_serving(dir.path(), &addr, &server);

    // Terminal 2: a command under the lock, for 20 s.
    let mut holder = Terminal::open(dir.path(), "terminal-2", &second, &addr);
    let said = "I hold jobs/nightly-report with token ";
    let deadline = Instant::now() + Duration::from_secs(30);
    let first = loop {
        if let Some(token) = token_after(&holder.out(), said) {
            break token;
        }
        assert!(
            Instant::now() < deadline,
            "terminal 2 never held the lock:\n{}\n{}",
            holder.out(),
            holder.err()
        );
        std::thread::sleep(Duration::from_millis(50));
    };

    // Terminal 3, while it runs.
    let mut third = Terminal::open(dir.path(), "terminal-3", third, &addr);
    let status = third.wait(Duration::from_secs(60), "terminal 3");
    let (out, err) = (third.out(), third.err());
    let all = format!("status {status}\nstdout:\n{out}\nstderr:\n{err}");
    assert!(status.success(), "{all}");
    let lines: Vec<&str> = out.lines().collect();
    // `latchkey status`: the holder session, its token, how long, the waiters.
    assert!(
        lines[0].starts_with("jobs/nightly-report: held by session ")
            && lines[0].contains(&format!(" with token {first} for "))
            && lines[0].ends_with(" waiting"),
        "{all}"
    );
    // `latchkey lock --wait 2s ...`: times out, exit status 3 (`echo $?`).
    assert_eq!(lines.get(1), Some(&"3"), "{all}");
    assert!(
        err.contains("timed out waiting for lock \"jobs/nightly-report\""),
        "{all}"
    );
    assert!(!out.contains("never"), "{all}");
    // Queued, then ran with a higher token once terminal 2's command ended.
    let turn = token_after(&out, "my turn, token ").unwrap_or_else(|| panic!("{all}"));
    assert!(turn > first, "{all}");
    // `latchkey list --json`: every held lock, as JSON (none by now).
    let listed: serde_json::Value =
        serde_json::from_str(lines.last().unwrap()).unwrap_or_else(|e| panic!("{e}: {all}"));
    assert!(listed.is_array(), "{all}");
    let status = holder.wait(Duration::from_secs(40), "terminal 2");
    assert!(status.success(), "terminal 2: {status}\n{}", holder.err());

    // "Stop the server with Ctrl-C and start it again: ... the token sequence [is] still there
    // (the data is in `./latchkey-data`)."
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .unwrap();
    assert!(readme.contains("Stop the server with Ctrl-C and start it again"));
    server.interrupt();
    let stopped = server.wait(Duration::from_secs(20), "the server after Ctrl-C");
    assert!(stopped.success(), "{stopped}\n{}", server.err());
    assert!(dir.path().join("latchkey-data").is_dir());
    let mut server = Terminal::open(dir.path(), "terminal-1-again", &serve, &addr);
    until_serving(dir.path(), &addr, &server);
    let mut again = Terminal::open(
        dir.path(),
        "again",
        r#"latchkey lock jobs/nightly-report -- sh -c 'echo "token $LATCHKEY_TOKEN"'"#,
        &addr,
    );
    let status = again.wait(Duration::from_secs(30), "a lock after the restart");
    assert!(status.success(), "{status}\n{}", again.err());
    let after = token_after(&again.out(), "token ").unwrap_or_else(|| panic!("{}", again.out()));
    assert!(
        after > turn,
        "token {after} after the restart, {turn} before"
    );
    server.interrupt();
    let stopped = server.wait(Duration::from_secs(20), "the server after Ctrl-C");
    assert!(stopped.success(), "{stopped}\n{}", server.err());
}

/// The README's "A cluster of three", its one block run as written but for the hosts: each
/// `serve` line (the README runs one per host) in a terminal of its own, on 127.0.77.N for
/// host 10.0.0.N and with a data dir of its own for `/var/lib/latchkey`; the client lines in a
/// fourth terminal, with `./job.sh` a script that prints its token.
#[test]
fn the_readme_cluster_of_three_runs_as_written() {
    let blocks = readme_blocks("## A cluster of three", "## The guarantee");
    assert_eq!(blocks.len(), 1, "{blocks:#?}");
    let hosts = |line: &str| {
        (1..=3).fold(line.to_owned(), |l, n| {
            l.replace(&format!("10.0.0.{n}:"), &format!("127.0.77.{n}:"))
        })
    };
    let lines: Vec<&str> = blocks[0].lines().filter(|l| !l.trim().is_empty()).collect();
    let peers = lines[0];
    assert!(peers.starts_with("P="), "{peers}");
    let serves: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("latchkey serve"))
        .collect();
    assert_eq!(serves.len(), 3, "{lines:#?}");
    let clients: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| !l.starts_with("latchkey serve") && !l.starts_with("P="))
        .collect();
    assert_eq!(clients.len(), 2, "{lines:#?}");
    let dir = tempfile::tempdir().unwrap();
    // The variables of the tour are not the README's here: the commands give every address.
    let unused = "127.0.0.1:1";
    let mut members = Vec::new();
    for (n, serve) in serves.iter().enumerate() {
        assert!(serve.ends_with(&format!("# on host {}", n + 1)), "{serve}");
        let data = format!("./host-{}", n + 1);
        assert!(serve.contains("--data-dir /var/lib/latchkey "), "{serve}");
        let script = format!(
            "{}\n{}",
            hosts(peers),
            hosts(serve).replace("/var/lib/latchkey", &data)
        );
        members.push(Terminal::open(
            dir.path(),
            &format!("host-{}", n + 1),
            &script,
            unused,
        ));
    }
    let job = dir.path().join("job.sh");
    std::fs::write(
        &job,
        "#!/bin/sh\necho \"job ran with token $LATCHKEY_TOKEN\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&job, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    assert!(
        clients[0].starts_with("latchkey cluster status "),
        "{clients:#?}"
    );
    assert!(clients[1].starts_with("latchkey lock "), "{clients:#?}");
    // `cluster status`, retried until the cluster formed (about a second once all three run,
    // bounded here): every member, and the leader named.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let mut client = Terminal::open(dir.path(), "status", &hosts(clients[0]), unused);
        let status = client.wait(Duration::from_secs(30), "cluster status");
        let out = client.out();
        if status.success() && !out.contains("leader: none known") {
            break out;
        }
        let logs: String = members.iter().map(|m| m.err()).collect();
        assert!(
            Instant::now() < deadline,
            "the README's cluster had no leader in 60 s\nstdout:\n{out}\nstderr:\n{}\nmembers:\n{logs}",
            client.err()
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    for n in 1..=3 {
        let row = status
            .lines()
            .find(|l| l.contains(&format!("127.0.77.{n}:7420")))
            .unwrap_or_else(|| panic!("no row of host {n}:\n{status}"));
        assert!(
            row.contains("leader") || row.contains("follower"),
            "host {n}:\n{status}"
        );
    }
    assert!(status.contains("leader: "), "{status}");
    // The lock, with every member as an endpoint: the job runs under it.
    let mut lock = Terminal::open(dir.path(), "lock", &hosts(clients[1]), unused);
    let ran = lock.wait(Duration::from_secs(30), "the lock line");
    assert!(ran.success(), "{ran}\n{}\n{}", lock.out(), lock.err());
    assert!(
        token_after(&lock.out(), "job ran with token ").is_some(),
        "{}",
        lock.out()
    );
    for member in &members {
        member.interrupt();
    }
    for (n, member) in members.iter_mut().enumerate() {
        let stopped = member.wait(Duration::from_secs(20), "a member after Ctrl-C");
        assert!(
            stopped.success(),
            "host {}: {stopped}\n{}",
            n + 1,
            member.err()
        );
    }
}
