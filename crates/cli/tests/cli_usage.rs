//! The CLI as a new user meets it (issue #14, item 11), on the real binary: an unreachable
//! endpoint named once, `--timeout` bounding any command, an endpoint without a port refused,
//! durations like `1.5s` and `1m30s`, usage errors exiting 2 (a bad lock name, `bench
//! --clients 0`), Ctrl-C exiting 130, missing-argument messages without `--endpoints`, and
//! `serve --listen localhost:PORT`.

mod common;

use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use common::serve::ServeProcess;
use common::{free_port, run, wait_until, Output, Proc, Server, CLI_TIMEOUT, READY_TIMEOUT};
use nix::sys::signal::Signal;

fn latchkey(args: &[&str], dir: &Path) -> Output {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    run(&args, dir, CLI_TIMEOUT)
}

/// A TCP port that accepts connections (the kernel completes the handshake) and never answers:
/// a hung server. The listener must live as long as the test needs the port.
fn silent_server() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    (listener, addr)
}

#[test]
fn an_unreachable_endpoint_is_named_once() {
    let tmp = tempfile::tempdir().unwrap();
    let out = latchkey(
        &["status", "--endpoints", "127.0.0.1:1", "jobs/a"],
        tmp.path(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("cannot reach 127.0.0.1:1: connection refused"),
        "{}",
        out.stderr
    );
    assert_eq!(
        out.stderr.matches("127.0.0.1:1").count(),
        1,
        "{}",
        out.stderr
    );
}

/// Issue #33: dead endpoints are reported within the fail-fast budget (about 2 s; it took 64
/// attempts in 11.7 s), and a name that does not resolve says so (it said "uncategorized
/// error"). The time is the client's own report, "(N attempts in S s)".
#[test]
fn dead_and_misspelled_endpoints_fail_fast_naming_the_cause() {
    let tmp = tempfile::tempdir().unwrap();
    for (endpoints, cause) in [
        ("127.0.0.1:1,127.0.0.1:2", "connection refused"),
        (
            "nosuchhost.invalid:7420",
            "cannot reach nosuchhost.invalid:7420: no such host",
        ),
    ] {
        let out = latchkey(&["list", "--endpoints", endpoints], tmp.path());
        assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
        assert!(out.stderr.contains(cause), "{}", out.stderr);
        let seconds: f64 = out
            .stderr
            .rsplit_once(" attempts in ")
            .and_then(|(_, t)| t.split('s').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no attempts count in {}", out.stderr));
        let budget = latchkey_core::limits::CLIENT_UNREACHABLE_MS_MAX as f64 / 1000.0;
        assert!(seconds < 2.0 * budget, "{}", out.stderr);
    }
}

/// Issue #33 item 4: pointed at a port that answers HTTP (an HTTP/1.1 server here; the
/// `--http-listen` and `--metrics-listen` ports in `http_api.rs`), the CLI says so and which
/// port serves gRPC; it said `server error (Internal): h2 protocol error`.
#[test]
fn a_port_that_answers_http_is_named_as_not_a_grpc_port() {
    use std::io::{Read, Write};
    let tmp = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    // An HTTP/1.1 server: to each connection it answers 400 to the request (here the HTTP/2
    // preface), then closes its side and reads what is left, so that the client sees the
    // answer rather than a reset. Until the test is done.
    listener.set_nonblocking(true).unwrap();
    // Set when the test ends, also by a failed assertion (the guard's drop): the thread stops.
    struct Done(std::sync::Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Done {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = Done(done.clone());
    let server = {
        let done = done.clone();
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok((mut stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                stream.set_nonblocking(false).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_millis(500)))
                    .unwrap();
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf);
                let _ = stream.write_all(
                    b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
                let _ = stream.shutdown(std::net::Shutdown::Write);
                while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
            }
        })
    };
    let out = latchkey(&["status", "--endpoints", &addr, "jobs/a"], tmp.path());
    assert_ne!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "{addr} answered HTTP/1.1: it is not a latchkey gRPC port"
        )),
        "{}",
        out.stderr
    );
    drop(stop);
    server.join().unwrap();
}

/// Issue #33: `--wait -1s` gets a sentence (clap said "unexpected argument '-1' found"), and an
/// over-long lock name is quoted by its start and length, not echoed whole.
#[test]
fn a_negative_wait_and_an_over_long_name_get_a_sentence() {
    let tmp = tempfile::tempdir().unwrap();
    let out = latchkey(
        &[
            "lock",
            "--endpoints",
            "127.0.0.1:1",
            "--wait",
            "-1s",
            "x",
            "--",
            "true",
        ],
        tmp.path(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("a wait cannot be negative"),
        "{}",
        out.stderr
    );
    let long = "a".repeat(600);
    let out = latchkey(&["status", "--endpoints", "127.0.0.1:1", &long], tmp.path());
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("(600 bytes)"), "{}", out.stderr);
    assert!(!out.stderr.contains(&long), "{}", out.stderr);
}

#[test]
fn timeout_bounds_any_command() {
    let tmp = tempfile::tempdir().unwrap();
    let (_listener, addr) = silent_server();
    for args in [
        &["status", "--timeout", "1s", "--endpoints", &addr, "jobs/a"][..],
        // Global: before the subcommand too.
        &["--timeout", "500ms", "list", "--endpoints", &addr][..],
        &[
            "cluster",
            "status",
            "--timeout",
            "1.5s",
            "--endpoints",
            &addr,
        ][..],
        &[
            "lock",
            "--timeout",
            "1s",
            "--endpoints",
            &addr,
            "jobs/a",
            "--",
            "true",
        ][..],
    ] {
        let out = latchkey(args, tmp.path());
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("gave up after --timeout"),
            "{args:?}: {}",
            out.stderr
        );
    }
    let out = latchkey(&["serve", "--timeout", "1s"], tmp.path());
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
}

#[test]
fn an_endpoint_without_a_port_is_a_usage_error() {
    let tmp = tempfile::tempdir().unwrap();
    for endpoints in ["localhost", "http://10.0.0.1", "127.0.0.1:7420,db"] {
        let out = latchkey(&["status", "--endpoints", endpoints, "jobs/a"], tmp.path());
        assert_eq!(out.status.code(), Some(2), "{endpoints}: {}", out.stderr);
        assert!(
            out.stderr.contains("has no port"),
            "{endpoints}: {}",
            out.stderr
        );
    }
}

#[test]
fn usage_errors_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let name_300 = "é".repeat(300);
    for (args, expect) in [
        (&["status", "jobs/a\nb"][..], "control character"),
        (&["status", "jobs/\u{1b}[31mred"][..], "control character"),
        (&["lock", "", "--", "true"][..], "lock name is empty"),
        (&["lock", &name_300, "--", "true"][..], "the limit is 512"),
        (&["lock", "--wait", "5", "jobs/a", "--", "true"][..], "5"),
        (&["lock", "--ttl", "1.5", "jobs/a", "--", "true"][..], "1.5"),
        (
            &["lock", "--permits", "0", "jobs/a", "--", "true"][..],
            "a semaphore has 1 to 1024 permits",
        ),
        (
            &["lock", "--permits", "1025", "jobs/a", "--", "true"][..],
            "a semaphore has 1 to 1024 permits",
        ),
        (
            &["lock", "--shared", "--permits", "3", "jobs/a", "--", "true"][..],
            "cannot be used with",
        ),
        (&["bench", "--clients", "0"][..], "--clients must be"),
        (&["bench", "--concurrency", "0"][..], "--concurrency"),
        (
            &["bench", "--duration", "0s"][..],
            "--duration must be above 0",
        ),
    ] {
        let out = latchkey(args, tmp.path());
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(expect), "{args:?}: {}", out.stderr);
    }
}

#[test]
fn missing_arguments_do_not_show_endpoints_as_required() {
    let tmp = tempfile::tempdir().unwrap();
    // clap named the options given in its usage line, so `--endpoints` (given, or through
    // LATCHKEY_ENDPOINTS) read as if it were required.
    for args in [
        &["status", "--endpoints", "127.0.0.1:7420"][..],
        // (`lock NAME` without COMMAND holds the lock until a signal: not a usage error.)
        &["lock", "--endpoints", "127.0.0.1:7420"][..],
        &["lock"][..],
    ] {
        let out = latchkey(args, tmp.path());
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("required") && !out.stderr.contains("--endpoints"),
            "{args:?}: {}",
            out.stderr
        );
    }
}

/// SIGINT (Ctrl-C) ends a command with 130, as a shell reports a process killed by it; the
/// signal is sent once the command is talking to the (silent) server, so its handlers are in.
#[test]
fn ctrl_c_exits_130() {
    let tmp = tempfile::tempdir().unwrap();
    let (listener, addr) = silent_server();
    listener.set_nonblocking(true).unwrap();
    for args in [
        vec!["status", "--endpoints", &addr, "jobs/a"],
        vec!["cluster", "status", "--endpoints", &addr],
        vec!["lock", "--endpoints", &addr, "jobs/a", "--", "true"],
    ] {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut proc = Proc::spawn(&args, tmp.path());
        // Kept open (silent): a closed connection would end the command before the signal.
        let mut connections = Vec::new();
        wait_until("the command to connect", CLI_TIMEOUT, || {
            listener
                .accept()
                .map(|(stream, _)| connections.push(stream))
                .is_ok()
        });
        proc.signal_group(Signal::SIGINT);
        let code = proc.wait_code(CLI_TIMEOUT);
        assert_eq!(code, 130, "{args:?}: {}", proc.stderr());
        // Its other connections must not count as the next command's.
        while listener.accept().is_ok() {}
    }
}

/// `lock --wait 0` on a free lock, fractional and compound durations, and a wait that ends.
#[test]
fn durations_take_fractions_and_compounds() {
    let server = Server::start();
    let tmp = tempfile::tempdir().unwrap();
    let out = server.cli(&[
        "lock", "--ttl", "1m30s", "--wait", "1.5s", "jobs/a", "--", "true",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    let mut holder = server.lock(
        "jobs/a",
        &["--ttl", "1m"],
        "touch held; sleep 60",
        tmp.path(),
    );
    wait_until("the holder to hold", CLI_TIMEOUT, || {
        tmp.path().join("held").exists()
    });
    let out = server.cli(&["lock", "--wait", "250ms", "jobs/a", "--", "true"]);
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr);
    holder.signal_group(Signal::SIGKILL);
    let _ = holder.wait(CLI_TIMEOUT);
}

#[test]
fn listen_takes_a_host_name_or_says_an_ip_address_is_needed() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut serve = ServeProcess::new(tmp.path().join("server.log"));
    let data = tmp.path().join("data");
    let listen = format!("localhost:{port}");
    serve.spawn(
        "a server on localhost",
        [
            "--listen".as_ref(),
            listen.as_ref(),
            "--data-dir".as_ref(),
            data.as_os_str(),
        ],
    );
    wait_until("the server on localhost to lead", READY_TIMEOUT, || {
        assert!(serve.exited().is_none(), "{}", serve.log_tail(40));
        let out = latchkey(
            &["cluster", "status", "--json", "--endpoints", &listen],
            tmp.path(),
        );
        out.status.success() && out.stdout.contains("\"leader\":1")
    });
    serve
        .sigterm(Duration::from_secs(10))
        .expect("a clean stop");

    let out = latchkey(
        &["serve", "--listen", "no-such-host.invalid:7420"],
        tmp.path(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("give an IP address"), "{}", out.stderr);
}
