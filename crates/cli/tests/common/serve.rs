//! [`ServeProcess`]: one `latchkey serve` child process, the only way the process tests start a
//! server ([`super::Server`] is one of them, [`super::cluster::Cluster`] one per member), with
//! two exceptions: `tls.rs` starts its members with its own small `Server` (certificate flags
//! per member; not yet moved onto `ServeProcess`), and `storage_failure.rs` starts `serve`
//! under `bash -c 'ulimit -f …'` to hit a file-size limit.
//!
//! It owns the child: its stderr goes to a log file (appended, one header line per start, so a
//! restarted member's log reads as one story), and it is killed and reaped when the handle
//! drops, also when a test panics. `latchkey bench --cluster` spawns its members with its own
//! code (`crates/cli/src/bench/cluster.rs`): that is the shipped binary, which must not depend
//! on test code, and it wants what tests do not (a parent-death signal, metrics ports, CPU
//! accounting, errors rather than panics).

use std::ffi::OsStr;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::{bin, signal, tail};
use latchkey_testkit::POLL;

pub struct ServeProcess {
    log: PathBuf,
    child: Option<Child>,
    /// Environment variables the server processes get beside the test's.
    pub envs: Vec<(String, String)>,
    /// Processes started so far (numbered in the log's header lines).
    starts: u32,
}

impl ServeProcess {
    /// Not running yet; its processes will log to `log`.
    pub fn new(log: PathBuf) -> ServeProcess {
        ServeProcess {
            log,
            child: None,
            envs: Vec::new(),
            starts: 0,
        }
    }

    /// Starts `latchkey serve ARGS` (at `RUST_LOG=info`), after a header line in the log
    /// naming `who`. Does not wait for it to serve.
    pub fn spawn<I, S>(&mut self, who: &str, args: I)
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        assert!(self.child.is_none(), "{who} already running");
        self.starts += 1;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("server log");
        let _ = writeln!(
            log.try_clone().expect("log handle"),
            "=== start {} of {who} ===",
            self.starts
        );
        let child = Command::new(bin())
            .arg("serve")
            .args(args)
            .env("RUST_LOG", "info")
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawning latchkey serve");
        self.child = Some(child);
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("server running").id() as i32
    }

    /// If the process exited on its own, reaps it: its status.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok().flatten()?;
        self.child = None;
        Some(status)
    }

    /// SIGKILL, then reap (a paused process dies of it all the same).
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then wait (at most `timeout`) for the clean exit: its status (`None` if it
    /// was not running); SIGKILL and `Err` if it does not come.
    pub fn sigterm(&mut self, timeout: Duration) -> Result<Option<ExitStatus>, String> {
        let Some(mut child) = self.child.take() else {
            return Ok(None);
        };
        signal(child.id() as i32, Signal::SIGTERM);
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().ok().flatten() {
                return Ok(Some(status));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("did not stop within {timeout:?} of SIGTERM"));
            }
            std::thread::sleep(POLL);
        }
    }

    /// SIGSTOP: the process stops answering, but its connections stay open.
    pub fn pause(&self) {
        signal(self.pid(), Signal::SIGSTOP);
    }

    /// SIGCONT.
    pub fn resume(&self) {
        signal(self.pid(), Signal::SIGCONT);
    }

    pub fn log_path(&self) -> &PathBuf {
        &self.log
    }

    /// The last `n` lines of the log, for failure messages.
    pub fn log_tail(&self, n: usize) -> String {
        tail(&self.log, n)
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}
