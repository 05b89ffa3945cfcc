//! The book's walkthroughs run as written: the one ```sh block between `<!-- NAME:begin -->` and
//! `<!-- NAME:end -->` in the one page of the book (`docs/*.md`) that has them, run by `bash` in
//! an empty directory with `latchkey` on the
//! PATH, its fixed ports (`127.0.0.1:PREFIX` + one digit) moved to free ones, in its own process
//! group (killed when the run is dropped), with every `LATCHKEY_*` variable of the test's
//! environment removed. The tests then check what it printed, so the book cannot drift from
//! the code.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The book's pages: the Markdown files of `docs/`, with their paths.
pub fn book_pages() -> Vec<(PathBuf, String)> {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
    let mut pages: Vec<(PathBuf, String)> = std::fs::read_dir(&docs)
        .unwrap_or_else(|e| panic!("{}: {e}", docs.display()))
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .map(|path| {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (path, text)
        })
        .collect();
    pages.sort();
    pages
}

/// The walkthrough named `marker` as the book has it: the one page with its begin marker.
pub fn book_block(marker: &str) -> String {
    let begin = format!("<!-- {marker}:begin -->");
    let end = format!("<!-- {marker}:end -->");
    let mut having = book_pages()
        .into_iter()
        .filter(|(_, text)| text.contains(&begin));
    let (page, text) = having
        .next()
        .unwrap_or_else(|| panic!("no page of docs/ has the {begin} marker"));
    assert!(
        having.next().is_none(),
        "more than one page of docs/ has the {begin} marker"
    );
    let start = text.find(&begin).unwrap();
    let stop = text
        .find(&end)
        .unwrap_or_else(|| panic!("{} has no {end} marker", page.display()));
    text[start..stop]
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.rsplit_once("```"))
        .map(|(body, _)| body.to_owned())
        .unwrap_or_else(|| panic!("the {marker} walkthrough is one ```sh block"))
}

/// A port prefix B (2000..6400) such that ports B0..=B9 are all free: a walkthrough's
/// processes listen on `127.0.0.1:PREFIX` followed by one digit.
pub fn free_port_prefix() -> u16 {
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
        if (0..=9).all(|d| std::net::TcpListener::bind(("127.0.0.1", prefix * 10 + d)).is_ok()) {
            return prefix;
        }
    }
    panic!("no ten free ports in 200 tries");
}

/// What a walkthrough printed, and the directory it ran in (its files, the members' logs).
pub struct Ran {
    pub status: ExitStatus,
    pub out: String,
    pub err: String,
    pub dir: tempfile::TempDir,
    /// Every `NAME:PORT` prefix the script used, mapped to the free prefix it ran with.
    pub ports: Vec<(String, u16)>,
    /// Whether something it started was still running (holding its output open)
    /// [`LEFT_RUNNING_AFTER`] after it ended; it was killed then.
    pub left_running: bool,
}

/// How long the processes a walkthrough started may take to stop after it ended.
pub const LEFT_RUNNING_AFTER: Duration = Duration::from_secs(10);

impl Ran {
    /// The directory's file `name`, empty if it does not exist.
    pub fn file(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Everything, for a failure message: stdout, stderr and the files named `logs`.
    pub fn all(&self, logs: &[&str]) -> String {
        let logs: String = logs
            .iter()
            .map(|name| format!("--- {name}:\n{}", self.file(name)))
            .collect();
        format!(
            "status: {}\nstdout:\n{}\nstderr:\n{}\n{logs}",
            self.status, self.out, self.err
        )
    }
}

/// Kills the walkthrough's process group (the shell and everything it started) when dropped.
struct Group(i32);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(-self.0),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Runs `script` with each of `port_prefixes` (e.g. `"127.0.0.1:742"`) replaced by a free
/// prefix, for at most `timeout`; panics if it runs longer. Its process group is killed once it
/// ended, so nothing it left running survives (see [`Ran::left_running`]).
pub fn run(script: &str, port_prefixes: &[&str], timeout: Duration) -> Ran {
    let mut script = script.to_owned();
    let mut ports = Vec::new();
    for prefix in port_prefixes {
        assert!(
            script.contains(prefix),
            "the walkthrough's processes listen on {prefix}N"
        );
        let free = free_port_prefix();
        let host = prefix.rsplit_once(':').expect("HOST:PORT-PREFIX").0;
        script = script.replace(prefix, &format!("{host}:{free}"));
        ports.push((prefix.to_string(), free));
    }
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
    let group = Group(child.id() as i32);
    // Read both pipes on threads (a walkthrough that prints much must not block on a full
    // pipe); each sends its text when every process holding the pipe has ended or closed it.
    let (tx, rx) = std::sync::mpsc::channel::<(bool, String)>();
    for (is_out, mut pipe) in [
        (
            true,
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
        ),
        (false, Box::new(child.stderr.take().unwrap())),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            let _ = tx.send((is_out, s));
        });
    }
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // The processes it started in the background inherited its pipes: once it has ended, they
    // close when those have stopped too (a walkthrough stops what it starts).
    let (mut out, mut err, mut closed) = (String::new(), String::new(), 0);
    let linger = Instant::now() + LEFT_RUNNING_AFTER;
    while closed < 2 && status.is_some() {
        match rx.recv_timeout(linger.saturating_duration_since(Instant::now())) {
            Ok((true, s)) => (out, closed) = (s, closed + 1),
            Ok((false, s)) => (err, closed) = (s, closed + 1),
            Err(_) => break,
        }
    }
    let left_running = closed < 2;
    drop(group);
    while closed < 2 {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok((true, s)) => (out, closed) = (s, closed + 1),
            Ok((false, s)) => (err, closed) = (s, closed + 1),
            Err(_) => break,
        }
    }
    let Some(status) = status else {
        let _ = child.wait();
        panic!("the walkthrough did not finish in {timeout:?}\nstdout:\n{out}\nstderr:\n{err}");
    };
    Ran {
        status,
        out,
        err,
        dir,
        ports,
        left_running,
    }
}
