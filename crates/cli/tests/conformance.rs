//! One conformance suite for every latchkey client (issue #15 item 5): the same scenarios, on
//! real `latchkey serve` processes, run against the Rust, Python and TypeScript clients through
//! each one's *agent*, a thin program over the client's public API that speaks the JSON-lines
//! protocol of `docs/conformance.md`.
//!
//! - Rust: `latchkey_testkit::conformance`, served on a thread of this test.
//! - Python: `python -m latchkey.conformance_agent`, from the virtualenv `.ci/run` installs the
//!   package into (`target/conformance/venv`), or `LATCHKEY_CONFORMANCE_PYTHON`.
//! - TypeScript: `node clients/js/dist/conformance-agent.js` once `.ci/run` built the package,
//!   or `LATCHKEY_CONFORMANCE_NODE`.
//!
//! A client whose agent is not installed is skipped with a message, unless
//! `LATCHKEY_CONFORMANCE_REQUIRED=1` (which `.ci/run` sets): then it fails.
//!
//! The scenarios: FIFO order with increasing tokens, a wait that times out, try-lock, exactly
//! once under injected retries (a proxy loses the answers to a granted acquire; the client's
//! retry must get the same grant, not a second one), the lost signal when the server is paused
//! past the client's deadline and the release of that lost lock, failover to a new leader, a
//! read-write lock (readers together, a writer alone, a reader behind a waiting writer waits)
//! a counting semaphore (N hold, the next waits, another kind or count is refused) and an
//! election (campaign, leader, proclaim, resign; the next candidate leads with a higher token),
//! conflict events and a lock-delay (a holder told of a waiter; a clean release hands over at
//! once; a revoked holder's delay keeps the name from the next waiter), queue positions (a
//! waiter hears 2, then 1 once the one ahead of it is granted).

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::proxy::{Mode, Proxy};
use common::{wait_until, Server};
use serde_json::{json, Value};

/// How long one agent command may take to answer, unless it waits on purpose.
const ANSWER: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Rust,
    Python,
    Node,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The command that starts `kind`'s agent, or why it is not installed.
fn agent_command(kind: Kind) -> Result<Vec<String>, String> {
    let split = |s: String| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    match kind {
        Kind::Rust => Ok(Vec::new()),
        Kind::Python => {
            if let Ok(cmd) = std::env::var("LATCHKEY_CONFORMANCE_PYTHON") {
                return Ok(split(cmd));
            }
            let python = repo().join("target/conformance/venv/bin/python");
            if python.exists() {
                Ok(vec![
                    python.display().to_string(),
                    "-m".into(),
                    "latchkey.conformance_agent".into(),
                ])
            } else {
                Err(format!(
                    "{} does not exist (.ci/run installs clients/python there)",
                    python.display()
                ))
            }
        }
        Kind::Node => {
            if let Ok(cmd) = std::env::var("LATCHKEY_CONFORMANCE_NODE") {
                return Ok(split(cmd));
            }
            let script = repo().join("clients/js/dist/conformance-agent.js");
            if script.exists() {
                Ok(vec!["node".into(), script.display().to_string()])
            } else {
                Err(format!(
                    "{} does not exist (.ci/run builds clients/js)",
                    script.display()
                ))
            }
        }
    }
}

/// One running agent: commands in, answers (by id) out.
struct Agent {
    kind: Kind,
    send: Box<dyn FnMut(String) + Send>,
    answers: mpsc::Receiver<String>,
    /// Answers read while waiting for another id.
    early: HashMap<String, Value>,
    next_id: u64,
    child: Option<Child>,
    stderr: Option<PathBuf>,
    _thread: Option<std::thread::JoinHandle<()>>,
}

impl Agent {
    fn start(kind: Kind, endpoints: &str, work: &std::path::Path) -> Agent {
        let (out_tx, answers) = mpsc::channel::<String>();
        if kind == Kind::Rust {
            let (in_tx, in_rx) = tokio::sync::mpsc::channel::<String>(64);
            let endpoints: Vec<String> = endpoints.split(',').map(str::to_owned).collect();
            let thread = std::thread::spawn(move || {
                let runtime = tokio::runtime::Runtime::new().expect("runtime");
                runtime.block_on(latchkey_testkit::conformance::serve(
                    endpoints, in_rx, out_tx,
                ));
                runtime.shutdown_timeout(Duration::from_secs(5));
            });
            return Agent {
                kind,
                send: Box::new(move |line| {
                    let _ = in_tx.blocking_send(line);
                }),
                answers,
                early: HashMap::new(),
                next_id: 0,
                child: None,
                stderr: None,
                _thread: Some(thread),
            };
        }
        let argv = agent_command(kind).expect("agent installed");
        let stderr = work.join(format!("{kind:?}-agent-{}.log", std::process::id()));
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .args(["--endpoints", endpoints])
            .current_dir(repo())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).expect("agent log"))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {argv:?}: {e}"));
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if out_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stdin: ChildStdin = child.stdin.take().unwrap();
        Agent {
            kind,
            send: Box::new(move |line| {
                let _ = writeln!(stdin, "{line}");
                let _ = stdin.flush();
            }),
            answers,
            early: HashMap::new(),
            next_id: 0,
            child: Some(child),
            stderr: Some(stderr),
            _thread: None,
        }
    }

    /// Sends `command` (an `id` is added) and returns the id, without waiting.
    fn send(&mut self, mut command: Value) -> String {
        self.next_id += 1;
        let id = self.next_id.to_string();
        command["id"] = json!(id);
        (self.send)(command.to_string());
        id
    }

    /// The answer to `id`, waiting at most `timeout`.
    fn answer(&mut self, id: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(answer) = self.early.remove(id) {
                return answer;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.answers.recv_timeout(left).unwrap_or_else(|_| {
                panic!(
                    "{:?} agent: no answer to command {id} within {timeout:?}\n{}",
                    self.kind,
                    self.log()
                )
            });
            let answer: Value = serde_json::from_str(&line).unwrap_or_else(|e| {
                panic!(
                    "{:?} agent wrote a line that is not JSON ({e}): {line:?}",
                    self.kind
                )
            });
            let answer_id = answer["id"].as_str().unwrap_or_default().to_owned();
            self.early.insert(answer_id, answer);
        }
    }

    fn call(&mut self, command: Value) -> Value {
        let id = self.send(command);
        self.answer(&id, ANSWER)
    }

    /// `call`, asserting that it succeeded.
    fn ok(&mut self, command: Value) -> Value {
        let answer = self.call(command.clone());
        assert_eq!(
            answer["ok"],
            true,
            "{:?} agent: {command} answered {answer}\n{}",
            self.kind,
            self.log()
        );
        answer
    }

    fn log(&self) -> String {
        self.stderr
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .map(|s| format!("agent stderr:\n{s}"))
            .unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn token(answer: &Value) -> u64 {
    answer["token"]
        .as_u64()
        .unwrap_or_else(|| panic!("no token in {answer}"))
}

/// Three sessions queue on one lock: each release hands it to the next in arrival order, with
/// a higher token; describe shows the holder and the queue.
fn fifo_order_and_tokens(kind: Kind) {
    let server = Server::start();
    let work = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(kind, &server.addr, work.path());
    for s in ["s1", "s2", "s3"] {
        agent.ok(json!({"op": "session", "session": s, "ttl_ms": 15_000}));
    }
    let first = agent.ok(json!({"op": "lock", "session": "s1", "name": "fifo"}));
    let second =
        agent.send(json!({"op": "lock", "session": "s2", "name": "fifo", "wait_ms": 20_000}));
    wait_until("s2 queued", ANSWER, || {
        server.status("fifo")["waiters"] == 1
    });
    let third =
        agent.send(json!({"op": "lock", "session": "s3", "name": "fifo", "wait_ms": 20_000}));
    wait_until("s3 queued", ANSWER, || {
        server.status("fifo")["waiters"] == 2
    });
    let described = agent.ok(json!({"op": "describe", "name": "fifo"}));
    assert_eq!(described["held"], true, "{described}");
    assert_eq!(described["token"], first["token"], "{described}");
    assert_eq!(described["waiters"], 2, "{described}");

    agent.ok(json!({"op": "release", "guard": first["guard"]}));
    let second = agent.answer(&second, ANSWER);
    assert_eq!(
        second["ok"], true,
        "{kind:?}: s2 was granted next: {second}"
    );
    assert!(token(&second) > token(&first), "{first} then {second}");
    agent.ok(json!({"op": "release", "guard": second["guard"]}));
    let third = agent.answer(&third, ANSWER);
    assert_eq!(third["ok"], true, "{kind:?}: s3 was granted last: {third}");
    assert!(token(&third) > token(&second), "{second} then {third}");
    let headers = agent.ok(json!({"op": "fencing_headers", "guard": third["guard"]}));
    assert_eq!(headers["headers"]["latchkey-lock"], "fifo", "{headers}");
    assert_eq!(
        headers["headers"]["latchkey-token"],
        token(&third).to_string(),
        "{headers}"
    );
    agent.ok(json!({"op": "release", "guard": third["guard"]}));
    for s in ["s1", "s2", "s3"] {
        agent.ok(json!({"op": "close", "session": s}));
    }
    assert_eq!(server.status("fifo")["held"], false);
}

/// A wait that runs out answers `wait-timeout` after (not before) its time and leaves the
/// queue; a try-lock (`wait_ms` 0) answers at once.
fn wait_timeout_and_try_lock(kind: Kind) {
    let server = Server::start();
    let work = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(kind, &server.addr, work.path());
    agent.ok(json!({"op": "session", "session": "holder", "ttl_ms": 15_000}));
    agent.ok(json!({"op": "session", "session": "waiter", "ttl_ms": 15_000}));
    agent.ok(json!({"op": "lock", "session": "holder", "name": "busy"}));

    let started = Instant::now();
    let timed_out =
        agent.call(json!({"op": "lock", "session": "waiter", "name": "busy", "wait_ms": 700}));
    assert_eq!(timed_out["error"], "wait-timeout", "{kind:?}: {timed_out}");
    assert!(
        started.elapsed() >= Duration::from_millis(700),
        "{kind:?}: gave up after {:?}",
        started.elapsed()
    );
    let tried =
        agent.call(json!({"op": "lock", "session": "waiter", "name": "busy", "wait_ms": 0}));
    assert_eq!(tried["error"], "wait-timeout", "{kind:?}: {tried}");
    wait_until("the timed-out waiter left the queue", ANSWER, || {
        server.status("busy")["waiters"] == 0
    });
    let free = agent.ok(json!({"op": "lock", "session": "waiter", "name": "free", "wait_ms": 0}));
    assert!(token(&free) > 0, "{free}");
}

/// The answer to a granted acquire is lost (a proxy forwards the request and swallows the
/// answer): the client's retry must carry the same sequence number and get the same grant
/// back. The lock is held once, under the one token, and the next grant of that lock is the
/// next one the cluster makes.
fn exactly_once_under_retries(kind: Kind) {
    let server = Server::start();
    let proxy = Proxy::start(&server.addr);
    let work = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(kind, &proxy.addr, work.path());
    agent.ok(json!({"op": "session", "session": "s1", "ttl_ms": 15_000}));
    let before = server.status("once");
    assert_eq!(before["held"], false);

    proxy.set(Mode::AnswersLost);
    let pending =
        agent.send(json!({"op": "lock", "session": "s1", "name": "once", "wait_ms": 20_000}));
    wait_until("the acquire took effect", ANSWER, || {
        server.status("once")["held"] == true
    });
    let granted = server.status("once");
    // The answers come back; the connection that lost them is cut, so the client retries.
    proxy.set(Mode::Pass);
    let answer = agent.answer(&pending, Duration::from_secs(60));
    assert_eq!(answer["ok"], true, "{kind:?}: {answer}\n{}", agent.log());
    assert_eq!(
        json!(token(&answer)),
        granted["token"],
        "{kind:?}: the retry got another grant than the one the lost answer carried"
    );
    let after = server.status("once");
    assert_eq!(after["token"], granted["token"], "{after}");
    // Held once: a second session cannot take it, and the release frees it.
    agent.ok(json!({"op": "session", "session": "s2", "ttl_ms": 15_000}));
    let tried = agent.call(json!({"op": "lock", "session": "s2", "name": "once", "wait_ms": 0}));
    assert_eq!(tried["error"], "wait-timeout", "{tried}");
    agent.ok(json!({"op": "release", "guard": answer["guard"]}));
    let next = agent.ok(json!({"op": "lock", "session": "s2", "name": "once", "wait_ms": 0}));
    assert!(token(&next) > token(&answer), "{answer} then {next}");
}

/// The server is paused (SIGSTOP) while a lock is held: the client cannot renew, so its lost
/// signal must fire at its own deadline, before the TTL has passed since its last renewal.
/// Releasing the lost lock then answers (lost or ok) without hanging.
fn lost_signal_and_release_of_a_lost_lock(kind: Kind) {
    let mut server = Server::start();
    let work = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(kind, &server.addr, work.path());
    let ttl = Duration::from_millis(3_000);
    agent.ok(json!({"op": "session", "session": "s1", "ttl_ms": ttl.as_millis() as u64}));
    let held = agent.ok(json!({"op": "lock", "session": "s1", "name": "paused"}));
    let lost = agent.ok(json!({"op": "lost", "guard": held["guard"]}));
    assert_eq!(lost["lost"], false, "{lost}");

    server.pause();
    let paused_at = Instant::now();
    let waited =
        agent.call(json!({"op": "wait_lost", "guard": held["guard"], "timeout_ms": 20_000}));
    let fired_after = paused_at.elapsed();
    assert_eq!(
        waited["lost"], true,
        "{kind:?}: the lost signal never fired: {waited}"
    );
    // The last renewal was at most TTL/3 before the pause; the client's deadline is that
    // renewal's send time + TTL - margin, so the signal fires before TTL after the pause.
    assert!(
        fired_after < ttl,
        "{kind:?}: the lost signal fired {fired_after:?} after the pause, past the TTL {ttl:?}"
    );
    let lost = agent.ok(json!({"op": "lost", "guard": held["guard"]}));
    assert_eq!(lost["lost"], true, "{lost}");
    server.resume();
    let started = Instant::now();
    let released = agent.call(json!({"op": "release", "guard": held["guard"]}));
    assert!(
        released["ok"] == true || released["error"] == "lost",
        "{kind:?}: releasing a lost lock answered {released}"
    );
    assert!(started.elapsed() < ANSWER, "{kind:?}: the release hung");
}

/// A held lock survives a leader kill: the session renews through the new leader (its lost
/// signal does not fire), and the next grant has a higher token.
fn failover_to_a_new_leader(kind: Kind) {
    let mut cluster = Cluster::start(3);
    let work = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(kind, &cluster.endpoints(), work.path());
    agent.ok(json!({"op": "session", "session": "s1", "ttl_ms": 10_000}));
    let held = agent.ok(json!({"op": "lock", "session": "s1", "name": "failover/a"}));
    let (leader, _) = cluster.wait_leader(&[], ANSWER);
    cluster.kill9(leader);
    cluster.wait_leader(&[leader], ANSWER);
    let next =
        agent.ok(json!({"op": "lock", "session": "s1", "name": "failover/b", "wait_ms": 20_000}));
    assert!(token(&next) > token(&held), "{held} then {next}");
    // Past a whole TTL after the kill, the first lock is still held by a live session.
    let waited =
        agent.call(json!({"op": "wait_lost", "guard": held["guard"], "timeout_ms": 11_000}));
    assert_eq!(
        waited["lost"], false,
        "{kind:?}: the session was lost across the failover: {waited}"
    );
    let described = agent.ok(json!({"op": "describe", "name": "failover/a"}));
    assert_eq!(described["token"], held["token"], "{described}");
    agent.ok(json!({"op": "release", "guard": held["guard"]}));
    agent.ok(json!({"op": "release", "guard": next["guard"]}));
}

fn session_ids(answer: &Value) -> Vec<u64> {
    answer["holders"]
        .as_array()
        .unwrap_or_else(|| panic!("no holders in {answer}"))
        .iter()
        .map(|h| h["session_id"].as_u64().expect("a holder's session_id"))
        .collect()
}

/// Readers hold a read-write lock together and a writer alone; a reader that comes behind a
/// waiting writer waits (a stream of readers never starves a writer); every grant's token is
/// above the one before it; describe shows the mode and every holder.
fn readers_and_a_writer(kind: Kind) {
    let server = Server::start();
    let work = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(kind, &server.addr, work.path());
    let mut ids = HashMap::new();
    for s in ["r1", "r2", "w", "r3"] {
        let made = agent.ok(json!({"op": "session", "session": s, "ttl_ms": 15_000}));
        ids.insert(s, made["session_id"].as_u64().expect("session_id"));
    }
    let reader = |s: &str, wait_ms: u64| json!({"op": "lock", "session": s, "name": "rw", "mode": "shared", "wait_ms": wait_ms});
    let r1 = agent.ok(reader("r1", 0));
    let r2 = agent.ok(reader("r2", 0));
    assert!(token(&r2) > token(&r1), "{r1} then {r2}");
    let described = agent.ok(json!({"op": "describe", "name": "rw"}));
    assert_eq!(described["mode"], "shared", "{kind:?}: {described}");
    assert_eq!(
        session_ids(&described),
        [ids["r1"], ids["r2"]],
        "{described}"
    );

    let writer = agent.send(json!({"op": "lock", "session": "w", "name": "rw", "wait_ms": 20_000}));
    wait_until("the writer queued", ANSWER, || {
        server.status("rw")["waiters"] == 1
    });
    // Readers hold, but a writer waits: a new reader waits behind it.
    let tried = agent.call(reader("r3", 0));
    assert_eq!(
        tried["error"], "wait-timeout",
        "{kind:?}: a reader was granted past a waiting writer: {tried}"
    );
    let late_reader = agent.send(reader("r3", 20_000));
    wait_until("the late reader queued", ANSWER, || {
        server.status("rw")["waiters"] == 2
    });
    agent.ok(json!({"op": "release", "guard": r1["guard"]}));
    assert_eq!(server.status("rw")["waiters"], 2, "one reader still holds");
    agent.ok(json!({"op": "release", "guard": r2["guard"]}));
    let writer = agent.answer(&writer, ANSWER);
    assert_eq!(
        writer["ok"], true,
        "{kind:?}: the writer was granted: {writer}"
    );
    assert!(token(&writer) > token(&r2), "{r2} then {writer}");
    let described = agent.ok(json!({"op": "describe", "name": "rw"}));
    assert_eq!(described["mode"], "exclusive", "{described}");
    assert_eq!(
        session_ids(&described),
        [ids["w"]],
        "the writer alone: {described}"
    );
    assert_eq!(
        described["waiters"], 1,
        "the late reader waits: {described}"
    );

    agent.ok(json!({"op": "release", "guard": writer["guard"]}));
    let late_reader = agent.answer(&late_reader, ANSWER);
    assert_eq!(late_reader["ok"], true, "{kind:?}: {late_reader}");
    assert!(
        token(&late_reader) > token(&writer),
        "{writer} then {late_reader}"
    );
    agent.ok(json!({"op": "release", "guard": late_reader["guard"]}));
    assert_eq!(server.status("rw")["held"], false);
}

/// A semaphore of 3 permits: three hold at once, each with a token of its own, the fourth
/// waits and is granted when one releases; an acquire of the name as a lock, or with another
/// count, is refused with its typed error and changes nothing; 0 permits is bad input.
fn a_semaphore_of_three(kind: Kind) {
    let server = Server::start();
    let work = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(kind, &server.addr, work.path());
    let mut ids = HashMap::new();
    for s in ["s1", "s2", "s3", "s4", "other"] {
        let made = agent.ok(json!({"op": "session", "session": s, "ttl_ms": 15_000}));
        ids.insert(s, made["session_id"].as_u64().expect("session_id"));
    }
    let permit = |s: &str, permits: u64, wait_ms: u64| json!({"op": "lock", "session": s, "name": "jobs", "permits": permits, "wait_ms": wait_ms});
    let held: Vec<Value> = ["s1", "s2", "s3"]
        .iter()
        .map(|s| agent.ok(permit(s, 3, 0)))
        .collect();
    let tokens: Vec<u64> = held.iter().map(token).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "{kind:?}: each permit has a token of its own, in order: {tokens:?}"
    );
    let described = agent.ok(json!({"op": "describe", "name": "jobs"}));
    assert_eq!(described["mode"], "permits", "{kind:?}: {described}");
    assert_eq!(described["permits"], 3, "{described}");
    assert_eq!(
        session_ids(&described),
        [ids["s1"], ids["s2"], ids["s3"]],
        "{described}"
    );
    let tried = agent.call(permit("s4", 3, 0));
    assert_eq!(
        tried["error"], "wait-timeout",
        "{kind:?}: a fourth permit: {tried}"
    );
    let fourth = agent.send(permit("s4", 3, 20_000));
    wait_until("the fourth queued", ANSWER, || {
        server.status("jobs")["waiters"] == 1
    });

    let kind_conflict =
        agent.call(json!({"op": "lock", "session": "other", "name": "jobs", "wait_ms": 0}));
    assert_eq!(
        kind_conflict["error"], "kind-conflict",
        "{kind:?}: {kind_conflict}"
    );
    let count_conflict = agent.call(permit("other", 5, 5_000));
    assert_eq!(
        count_conflict["error"], "permits-conflict",
        "{kind:?}: {count_conflict}"
    );
    let zero = agent.call(permit("other", 0, 0));
    assert_eq!(zero["error"], "invalid-argument", "{kind:?}: {zero}");
    let unchanged = agent.ok(json!({"op": "describe", "name": "jobs"}));
    assert_eq!(unchanged["permits"], 3, "{unchanged}");
    assert_eq!(
        unchanged["waiters"], 1,
        "only the fourth waits: {unchanged}"
    );

    agent.ok(json!({"op": "release", "guard": held[1]["guard"]}));
    let fourth = agent.answer(&fourth, ANSWER);
    assert_eq!(
        fourth["ok"], true,
        "{kind:?}: the fourth was granted: {fourth}"
    );
    assert!(token(&fourth) > tokens[2], "{tokens:?} then {fourth}");
    let described = agent.ok(json!({"op": "describe", "name": "jobs"}));
    assert_eq!(
        session_ids(&described),
        [ids["s1"], ids["s3"], ids["s4"]],
        "{described}"
    );
    for s in ["s1", "s2", "s3", "s4", "other"] {
        agent.ok(json!({"op": "close", "session": s}));
    }
    assert_eq!(server.status("jobs")["held"], false);
}

/// An election (issue #32): two candidates; the first leads with its value, proclaims a new
/// one that `leader` reads, resigns, and the second (queued behind it) leads with a higher
/// token and its own value; once it resigns nobody leads.
fn an_election_of_two(kind: Kind) {
    let server = Server::start();
    let work = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(kind, &server.addr, work.path());
    let mut ids = HashMap::new();
    for s in ["first", "second"] {
        let made = agent.ok(json!({"op": "session", "session": s, "ttl_ms": 15_000}));
        ids.insert(s, made["session_id"].as_u64().expect("session_id"));
    }
    let nobody = agent.ok(json!({"op": "leader", "name": "svc/leader"}));
    assert_eq!(
        nobody["leader"],
        Value::Null,
        "{kind:?}: nobody leads yet: {nobody}"
    );
    let campaign = |session: &str, value: &str| json!({"op": "campaign", "session": session, "name": "svc/leader", "value": value});
    let first = agent.ok(campaign("first", "10.0.0.1:80"));
    let mut waits = campaign("second", "10.0.0.2:80");
    waits["wait_ms"] = 20_000.into();
    let second = agent.send(waits);
    wait_until("the second candidate queued", ANSWER, || {
        server.status("svc/leader")["waiters"] == 1
    });
    let leader = agent.ok(json!({"op": "leader", "name": "svc/leader"}));
    assert_eq!(
        leader["leader"],
        json!({"session_id": ids["first"], "token": token(&first), "value": "10.0.0.1:80"}),
        "{kind:?}: {leader}"
    );
    agent.ok(json!({"op": "proclaim", "guard": first["guard"], "value": "10.0.0.1:8080"}));
    let leader = agent.ok(json!({"op": "leader", "name": "svc/leader"}));
    assert_eq!(
        leader["leader"],
        json!({"session_id": ids["first"], "token": token(&first), "value": "10.0.0.1:8080"}),
        "{kind:?}: the proclaimed value, same term: {leader}"
    );
    agent.ok(json!({"op": "resign", "guard": first["guard"]}));
    let second = agent.answer(&second, ANSWER);
    assert_eq!(second["ok"], true, "{kind:?}: the second leads: {second}");
    assert!(token(&second) > token(&first), "{first} then {second}");
    let leader = agent.ok(json!({"op": "leader", "name": "svc/leader"}));
    assert_eq!(
        leader["leader"],
        json!({"session_id": ids["second"], "token": token(&second), "value": "10.0.0.2:80"}),
        "{kind:?}: {leader}"
    );
    agent.ok(json!({"op": "resign", "guard": second["guard"]}));
    let nobody = agent.ok(json!({"op": "leader", "name": "svc/leader"}));
    assert_eq!(
        nobody["leader"],
        Value::Null,
        "{kind:?}: both resigned: {nobody}"
    );
    for s in ["first", "second"] {
        agent.ok(json!({"op": "close", "session": s}));
    }
}

/// Conflict events and a lock-delay (issue #32 items 4 and 5): a bad lock-delay is refused
/// before any call; a holder learns that someone waits for its lock; a clean release hands it
/// over at once despite a long delay; a holder's lost grant (its session revoked) keeps the
/// name from the next waiter for its delay.
fn a_contended_holder_and_a_lock_delay(kind: Kind) {
    let server = Server::start();
    let work = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(kind, &server.addr, work.path());
    // A TTL of 3 s: renewed each second, so a holder hears of a waiter within about one.
    for (s, ttl_ms) in [
        ("holder", 3_000),
        ("waiter", 15_000),
        ("doomed", 15_000),
        ("late", 15_000),
    ] {
        agent.ok(json!({"op": "session", "session": s, "ttl_ms": ttl_ms}));
    }
    let too_long = agent.call(json!({"op": "lock", "session": "holder", "name": "res", "wait_ms": 0, "lock_delay_ms": 300_001}));
    assert_eq!(
        too_long["error"], "invalid-argument",
        "{kind:?}: {too_long}"
    );
    let reader = agent.call(json!({"op": "lock", "session": "holder", "name": "res", "wait_ms": 0, "mode": "shared", "lock_delay_ms": 1_000}));
    assert_eq!(reader["error"], "invalid-argument", "{kind:?}: {reader}");
    assert_eq!(server.status("res")["held"], false, "nothing was asked");

    // A minute's delay: a clean release must not start it.
    let held = agent.ok(json!({"op": "lock", "session": "holder", "name": "res", "wait_ms": 0, "lock_delay_ms": 60_000}));
    assert_eq!(
        server.status("res")["lock_delay_ms"],
        60_000,
        "{kind:?}: the delay was sent"
    );
    let quiet = agent.ok(json!({"op": "contended", "guard": held["guard"]}));
    assert_eq!(quiet["contended"], false, "{kind:?}: nobody waits yet");
    let waits =
        agent.send(json!({"op": "lock", "session": "waiter", "name": "res", "wait_ms": 40_000}));
    wait_until("the waiter queued", ANSWER, || {
        server.status("res")["waiters"] == 1
    });
    let told =
        agent.ok(json!({"op": "wait_contended", "guard": held["guard"], "timeout_ms": 10_000}));
    assert_eq!(
        told["contended"], true,
        "{kind:?}: the holder was not told: {told}"
    );
    let now = agent.ok(json!({"op": "contended", "guard": held["guard"]}));
    assert_eq!(now["contended"], true, "{kind:?}: {now}");
    agent.ok(json!({"op": "release", "guard": held["guard"]}));
    let granted = agent.answer(&waits, ANSWER);
    assert_eq!(
        granted["ok"], true,
        "{kind:?}: a clean release hands over at once: {granted}"
    );
    agent.ok(json!({"op": "release", "guard": granted["guard"]}));

    // A lost grant: the delay runs, the next waiter keeps its place and waits it out.
    let delay = Duration::from_millis(3_000);
    agent.ok(json!({"op": "lock", "session": "doomed", "name": "res2", "wait_ms": 0, "lock_delay_ms": 3_000}));
    let session = server.status("res2")["session"].as_u64().expect("a holder");
    let late =
        agent.send(json!({"op": "lock", "session": "late", "name": "res2", "wait_ms": 30_000}));
    wait_until("the late one queued", ANSWER, || {
        server.status("res2")["waiters"] == 1
    });
    let revoked_at = Instant::now();
    let revoked = server.cli(&[
        "admin",
        "revoke",
        &session.to_string(),
        "--reason",
        "conformance",
    ]);
    assert!(revoked.status.success(), "revoke: {}", revoked.stderr);
    let during = server.status("res2");
    assert_eq!(during["held"], false, "{during}");
    let late = agent.answer(&late, ANSWER);
    assert_eq!(
        late["ok"], true,
        "{kind:?}: granted after the delay: {late}"
    );
    assert!(
        revoked_at.elapsed() >= delay,
        "{kind:?}: granted {:?} after the holder's session was revoked, within its {delay:?} lock-delay",
        revoked_at.elapsed()
    );
    for s in ["holder", "waiter", "late"] {
        agent.ok(json!({"op": "close", "session": s}));
    }
}

/// The positions a waiting `lock` (sent with `"positions": true`) heard so far.
fn positions(agent: &mut Agent, lock: &str) -> Vec<u64> {
    let heard = agent.ok(json!({"op": "positions", "lock": lock}));
    heard["positions"]
        .as_array()
        .unwrap_or_else(|| panic!("{:?}: positions is a list: {heard}", agent.kind))
        .iter()
        .map(|p| p.as_u64().expect("a position is a number"))
        .collect()
}

/// Waits (bounded) until the waiting `lock` heard `position` last; returns all it heard.
fn until_position(agent: &mut Agent, lock: &str, position: u64, within: Duration) -> Vec<u64> {
    let deadline = Instant::now() + within;
    loop {
        let heard = positions(agent, lock);
        if heard.last() == Some(&position) {
            return heard;
        }
        assert!(
            Instant::now() < deadline,
            "{:?}: position {position} not heard within {within:?}; heard {heard:?}",
            agent.kind
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Queue positions (issue #32 item 5): a waiter behind a holder and another waiter hears it is
/// second in the queue, then first once the holder's release grants the waiter ahead of it;
/// the positions it hears never rise. The server tells a waiter its place when its long-poll
/// ends, at most `ACQUIRE_POLL_MS_MAX` after it began, so each step may take that long (and
/// the scenario about twice that).
fn queue_positions(kind: Kind) {
    let server = Server::start();
    let work = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(kind, &server.addr, work.path());
    for s in ["holder", "first", "second"] {
        agent.ok(json!({"op": "session", "session": s, "ttl_ms": 15_000}));
    }
    // One long-poll, and the slack of the answer's way back.
    let poll = Duration::from_millis(latchkey_core::limits::ACQUIRE_POLL_MS_MAX) + ANSWER / 3;
    let held = agent.ok(json!({"op": "lock", "session": "holder", "name": "q", "wait_ms": 0}));
    let first = agent.send(json!({"op": "lock", "session": "first", "name": "q", "wait_ms": 60_000, "positions": true}));
    wait_until("the first waiter queued", ANSWER, || {
        server.status("q")["waiters"] == 1
    });
    let second = agent.send(json!({"op": "lock", "session": "second", "name": "q", "wait_ms": 60_000, "positions": true}));
    wait_until("the second waiter queued", ANSWER, || {
        server.status("q")["waiters"] == 2
    });
    let behind_two = until_position(&mut agent, &second, 2, poll);
    assert!(
        behind_two.iter().all(|&p| p == 2),
        "{kind:?}: the second waiter heard {behind_two:?} with two ahead of it"
    );
    agent.ok(json!({"op": "release", "guard": held["guard"]}));
    let first_granted = agent.answer(&first, ANSWER);
    assert_eq!(
        first_granted["ok"], true,
        "{kind:?}: the release grants the first waiter: {first_granted}"
    );
    let heard_by_first = positions(&mut agent, &first);
    assert!(
        heard_by_first.iter().all(|&p| p == 1),
        "{kind:?}: the first waiter, at the head of the queue, heard {heard_by_first:?}"
    );
    let moved_up = until_position(&mut agent, &second, 1, poll);
    assert!(
        moved_up.windows(2).all(|w| w[0] >= w[1]) && moved_up.first() == Some(&2),
        "{kind:?}: the second waiter's positions went 2 then 1, never up: {moved_up:?}"
    );
    agent.ok(json!({"op": "release", "guard": first_granted["guard"]}));
    let second_granted = agent.answer(&second, ANSWER);
    assert_eq!(second_granted["ok"], true, "{kind:?}: {second_granted}");
    assert!(
        token(&held) < token(&first_granted) && token(&first_granted) < token(&second_granted),
        "{kind:?}: tokens in grant order"
    );
    agent.ok(json!({"op": "release", "guard": second_granted["guard"]}));
    for s in ["holder", "first", "second"] {
        agent.ok(json!({"op": "close", "session": s}));
    }
}

/// Runs every scenario against `kind`'s client, or explains why it cannot.
fn conforms(kind: Kind) {
    if let Err(why) = agent_command(kind) {
        let required = std::env::var("LATCHKEY_CONFORMANCE_REQUIRED").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "the {kind:?} client's agent is not installed: {why}"
        );
        println!("SKIPPED: the {kind:?} client's agent is not installed: {why}");
        return;
    }
    fifo_order_and_tokens(kind);
    wait_timeout_and_try_lock(kind);
    exactly_once_under_retries(kind);
    lost_signal_and_release_of_a_lost_lock(kind);
    failover_to_a_new_leader(kind);
    readers_and_a_writer(kind);
    a_semaphore_of_three(kind);
    an_election_of_two(kind);
    a_contended_holder_and_a_lock_delay(kind);
    queue_positions(kind);
}

#[test]
fn the_rust_client_conforms() {
    conforms(Kind::Rust);
}

#[test]
fn the_python_client_conforms() {
    conforms(Kind::Python);
}

#[test]
fn the_typescript_client_conforms() {
    conforms(Kind::Node);
}
