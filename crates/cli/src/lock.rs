//! `latchkey lock NAME -- COMMAND`: run COMMAND while holding NAME. `latchkey elect NAME --
//! COMMAND` runs here too: its acquire is a campaign (`LockArgs::campaign`), and everything
//! after the grant is the same.
//!
//! COMMAND runs in a process group of its own, and every signal goes to that group: a shell
//! script, `make` or a worker pool stops as a whole, not just its first process.
//!
//! Stopping rule: when the guard reports the lock may be lost (the session's client-side
//! deadline passed, or the server dropped the session), COMMAND's group gets SIGTERM at once and
//! SIGKILL [`kill_grace`] (half the session's safety margin) after the client deadline: at
//! once, if the loss was noticed that late (after a pause). The client deadline is at least the
//! margin before the server can expire the session and grant the lock again, so COMMAND is dead
//! before anyone else can hold the lock (clock drift and scheduling delays get the other half).
//! Signals are sent first and reported after: a write to a full stderr pipe must not hold up
//! the kill.
//!
//! SIGINT and SIGTERM received by `latchkey lock` while COMMAND runs are forwarded to COMMAND's
//! group (in its own group, COMMAND no longer gets a terminal's Ctrl-C directly); the lock is
//! held until COMMAND ends. Before COMMAND starts, they end `latchkey lock` (exit 130 or 143,
//! the session closed), and so does `--timeout` (exit 1).

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::Context;
use latchkey_client::{LockGuard, Session};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::signal::unix::{signal, SignalKind};

use crate::{LockArgs, Stopped};

/// Between SIGTERM and SIGKILL: half the safety margin (see the module comment).
pub fn kill_grace(safety_margin: Duration) -> Duration {
    safety_margin / 2
}

/// The exit status `sh` would report: the code, or 128 + the signal that killed it.
pub fn shell_status(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => (code & 0xff) as u8,
        (None, Some(signal)) => (128 + signal).min(255) as u8,
        (None, None) => crate::EXIT_FAILURE,
    }
}

/// A bug [`crate::serve::TEST_PLANT_VAR`] puts back in `latchkey lock`, for the nemesis
/// (`crates/nemesis`, `run --cli-plant`) to prove its checks catch it on real processes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockPlant {
    /// COMMAND is left running when the lock may be lost: the wrapper waits for it to end,
    /// as a naive one would, and only then reports the loss.
    pub ignores_deadline: bool,
}

/// The bug [`crate::serve::TEST_PLANT_VAR`] plants in `latchkey lock`, if set to one of
/// its bugs (a server's bug, for `serve`, plants nothing here): only in a debug build
/// (`debug_build`, given as `cfg!(debug_assertions)`). A release build refuses to run with it
/// set, as `serve` does, so that no installed `latchkey lock` can be switched into a bug.
pub fn test_plant(value: Option<&std::ffi::OsStr>, debug_build: bool) -> anyhow::Result<LockPlant> {
    let Some(value) = value else {
        return Ok(LockPlant::default());
    };
    anyhow::ensure!(
        debug_build,
        "{} is set: it puts a fixed bug back for tests, and only a debug build accepts it; \
         unset it",
        crate::serve::TEST_PLANT_VAR
    );
    match value.to_str() {
        Some("cli-ignores-deadline") => Ok(LockPlant {
            ignores_deadline: true,
        }),
        Some(server) if crate::serve::TEST_PLANTS.contains(&server) => Ok(LockPlant::default()),
        _ => anyhow::bail!(
            "{}={value:?} names no planted bug; known: cli-ignores-deadline, {}",
            crate::serve::TEST_PLANT_VAR,
            crate::serve::TEST_PLANTS.join(", ")
        ),
    }
}

/// Runs `latchkey lock`; `timeout` (`--timeout`) bounds the time until COMMAND starts.
pub async fn lock(args: LockArgs, timeout: Option<Duration>) -> anyhow::Result<u8> {
    let plant = test_plant(
        std::env::var_os(crate::serve::TEST_PLANT_VAR).as_deref(),
        cfg!(debug_assertions),
    )?;
    let mut terminate = signal(SignalKind::terminate()).context("installing signal handlers")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing signal handlers")?;
    let deadline = timeout.map(|timeout| tokio::time::Instant::now() + timeout);
    let timed_out = || Stopped::Timeout(timeout.unwrap_or_default());
    let until_deadline = || async move {
        match deadline {
            Some(deadline) => tokio::time::sleep_until(deadline).await,
            None => std::future::pending().await,
        }
    };

    let client = args.endpoints.client()?;
    let owner =
        latchkey_client::SessionOptions::owner_of_this_process(args.owner.as_deref().unwrap_or(""));
    let open = client.session_with(latchkey_client::SessionOptions {
        ttl: args.ttl,
        owner: Some(owner),
    });
    let session = tokio::select! {
        r = open => r.context("cannot open a session")?,
        () = until_deadline() => return Err(timed_out().into()),
        _ = terminate.recv() => return Err(signalled("SIGTERM", Signal::SIGTERM).into()),
        _ = interrupt.recv() => return Err(signalled("SIGINT", Signal::SIGINT).into()),
    };

    let waited = tokio::select! {
        r = request(&session, &args).wait(args.wait) => r,
        () = until_deadline() => return abandon(session, timed_out()).await,
        _ = terminate.recv() => {
            return abandon(session, signalled("SIGTERM while waiting for the lock", Signal::SIGTERM)).await
        }
        _ = interrupt.recv() => {
            return abandon(session, signalled("SIGINT while waiting for the lock", Signal::SIGINT)).await
        }
    };
    let guard = match waited {
        Ok(guard) => guard,
        Err(e) => {
            close_quietly(session).await;
            return Err(match e {
                // These name the lock already.
                latchkey_client::Error::WaitTimedOut { .. }
                | latchkey_client::Error::Held { .. } => anyhow::Error::new(e),
                e => anyhow::Error::new(e).context(format!("lock {:?}", args.name)),
            });
        }
    };
    tracing::debug!(lock = %args.name, token = guard.token(), "granted");
    if args.command.is_empty() {
        return hold(guard, session, &mut terminate, &mut interrupt).await;
    }

    let child = tokio::process::Command::new(&args.command[0])
        .args(&args.command[1..])
        // Its own group, so that signals reach everything COMMAND starts (see the module
        // comment).
        .process_group(0)
        // The names a fenced resource's helpers read (`latchkey-fence`), not a copy of them.
        .env(latchkey_fence::LOCK_ENV, &args.name)
        .env(latchkey_fence::TOKEN_ENV, guard.token().to_string())
        .spawn();
    let child = match child {
        Ok(child) => child,
        Err(e) => {
            release_quietly(guard).await;
            close_quietly(session).await;
            return Err(Stopped::CannotRun {
                command: args.command[0].clone(),
                io: e,
            }
            .into());
        }
    };
    let grace = kill_grace(session.safety_margin());
    supervise(
        child,
        guard,
        session,
        grace,
        plant,
        &mut terminate,
        &mut interrupt,
    )
    .await
}

/// The lock request `args` ask for: exclusive, `--shared` or `--permits N`, or a campaign
/// (`latchkey elect`).
fn request<'a>(session: &'a Session, args: &LockArgs) -> latchkey_client::LockRequest<'a> {
    let mut request = session.lock(args.name.clone());
    if let Some(value) = &args.campaign {
        // `latchkey elect` has no --lock-delay: a campaign takes none.
        return request.campaign(value.clone());
    }
    if let Some(delay) = args.lock_delay {
        request = request.lock_delay(delay);
    }
    match args.mode() {
        latchkey_core::Mode::Exclusive => request,
        latchkey_core::Mode::Shared => request.shared(),
        latchkey_core::Mode::Permits(n) => request.permits(n),
    }
}

/// Waits for COMMAND to end or for the lock to be lost, whichever comes first.
async fn supervise(
    mut child: Child,
    guard: LockGuard,
    session: Session,
    grace: Duration,
    plant: LockPlant,
    terminate: &mut tokio::signal::unix::Signal,
    interrupt: &mut tokio::signal::unix::Signal,
) -> anyhow::Result<u8> {
    // COMMAND leads its group: the group id is its pid.
    let group = child.id().map(|id| Pid::from_raw(id as i32));
    let name = guard.name().to_owned();
    // Conflict events: say once that someone waits (COMMAND may want to finish up).
    let contended = guard.contended();
    tokio::pin!(contended);
    let mut told = false;
    loop {
        tokio::select! {
            biased;
            status = child.wait() => {
                let status = status.context("waiting for COMMAND")?;
                if let Some(why) = guard.lost_reason() {
                    // It ended, but maybe not under the lock: do not report it as a success.
                    // What it left running in its group is stopped all the same.
                    signal_group(group, Signal::SIGKILL);
                    close_quietly(session).await;
                    eprintln!("latchkey: COMMAND ended ({status}) after lock {name:?} may have been lost");
                    return Err(Stopped::LockLost { name, why }.into());
                }
                let code = shell_status(status);
                if let Err(e) = guard.release().await {
                    eprintln!("latchkey: warning: releasing lock {name:?}: {e}");
                }
                close_quietly(session).await;
                return Ok(code);
            }
            // Planted (`LockPlant::ignores_deadline`): COMMAND is not stopped.
            _ = guard.lost(), if !plant.ignores_deadline => break,
            () = &mut contended, if !told => {
                told = true;
                if !guard.is_lost() {
                    eprintln!("latchkey: someone is waiting for lock {name:?}");
                }
            }
            _ = terminate.recv() => signal_group(group, Signal::SIGTERM),
            _ = interrupt.recv() => signal_group(group, Signal::SIGINT),
        }
    }

    // Signal first, report after (see the module comment).
    signal_group(group, Signal::SIGTERM);
    // SIGKILL at the client deadline + grace, however late the loss was noticed.
    let kill_in = grace.saturating_sub(session.past_deadline());
    let (status, killed) = match tokio::time::timeout(kill_in, child.wait()).await {
        Ok(status) => (status, false),
        Err(_) => {
            signal_group(group, Signal::SIGKILL);
            (child.wait().await, true)
        }
    };
    // COMMAND's leader is gone; anything it left in its group goes too.
    signal_group(group, Signal::SIGKILL);

    let why = guard
        .lost_reason()
        .unwrap_or_else(|| "the session ended".into());
    let force_released = guard.force_released();
    if force_released {
        eprintln!(
            "latchkey: lock {name:?} (token {}) was force-released by an operator (see `latchkey \
             audit`); sent SIGTERM to COMMAND's process group",
            guard.token(),
        );
    } else {
        eprintln!(
            "latchkey: lock {name:?} (token {}) may be lost: {why}; sent SIGTERM to COMMAND's process group",
            guard.token(),
        );
    }
    if killed {
        eprintln!(
            "latchkey: COMMAND still running after {} ms: sent SIGKILL",
            kill_in.as_millis()
        );
    }
    match status {
        Ok(status) => eprintln!("latchkey: COMMAND stopped ({status})"),
        Err(e) => eprintln!("latchkey: waiting for COMMAND: {e}"),
    }
    // The server may still hold the lock for us: closing the session frees it for the next
    // waiter sooner than the expiry would.
    let token = guard.token();
    drop(guard);
    close_quietly(session).await;
    if force_released {
        return Err(Stopped::ForceReleased {
            name,
            token,
            command: true,
        }
        .into());
    }
    Err(Stopped::LockLost { name, why }.into())
}

/// `latchkey lock NAME` without COMMAND (as `etcdctl lock NAME`): prints the token on stdout,
/// holds the lock until SIGINT or SIGTERM, then releases it and exits 0; exits 4 at once if
/// the lock may be lost meanwhile.
async fn hold(
    guard: LockGuard,
    session: Session,
    terminate: &mut tokio::signal::unix::Signal,
    interrupt: &mut tokio::signal::unix::Signal,
) -> anyhow::Result<u8> {
    use std::io::Write as _;
    let name = guard.name().to_owned();
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", guard.token()).context("writing the token")?;
        out.flush().context("writing the token")?;
    }
    eprintln!(
        "latchkey: holding lock {name:?} with token {}; Ctrl-C or SIGTERM releases it",
        guard.token()
    );
    tokio::select! {
        _ = guard.lost() => {
            let (token, force_released) = (guard.token(), guard.force_released());
            let why = guard.lost_reason().unwrap_or_else(|| "the session ended".into());
            drop(guard);
            close_quietly(session).await;
            if force_released {
                return Err(Stopped::ForceReleased { name, token, command: false }.into());
            }
            eprintln!("latchkey: lock {name:?} (token {token}) may be lost: {why}");
            return Err(Stopped::HeldLockLost { name, why }.into());
        }
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    let released = guard.release().await;
    close_quietly(session).await;
    match released {
        Ok(()) => {
            eprintln!("latchkey: released lock {name:?}");
            Ok(0)
        }
        Err(e) => Err(anyhow::Error::new(e).context(format!("releasing lock {name:?}"))),
    }
}

fn signal_group(group: Option<Pid>, signal: Signal) {
    if let Some(group) = group {
        // ESRCH: the group is empty already; the wait arm sees COMMAND's exit.
        let _ = killpg(group, signal);
    }
}

fn signalled(what: &str, signal: Signal) -> Stopped {
    Stopped::Signal {
        what: what.into(),
        signal,
    }
}

async fn abandon(session: Session, why: Stopped) -> anyhow::Result<u8> {
    close_quietly(session).await;
    Err(why.into())
}

async fn release_quietly(guard: LockGuard) {
    if let Err(e) = guard.release().await {
        eprintln!("latchkey: warning: releasing the lock: {e}");
    }
}

/// Closing is a courtesy (the server expires the session anyway), so it gets a short bound:
/// an unresponsive server must not hold up the exit.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(3);

async fn close_quietly(session: Session) {
    let why = match tokio::time::timeout(CLOSE_TIMEOUT, session.close()).await {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {CLOSE_TIMEOUT:?}"),
    };
    eprintln!(
        "latchkey: warning: closing the session: {why} (the server expires it after its TTL)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `LATCHKEY_TEST_PLANT` plants in a debug build only; a release build refuses to run
    /// with it set, whatever it names.
    #[test]
    fn the_lock_test_plant_is_refused_by_a_release_build() {
        use std::ffi::OsStr;
        let planted = Some(OsStr::new("cli-ignores-deadline"));
        assert!(test_plant(planted, true).unwrap().ignores_deadline);
        assert_eq!(test_plant(None, false).unwrap(), LockPlant::default());
        // A server's bug plants nothing in `latchkey lock`.
        let server = Some(OsStr::new("renew-without-quorum"));
        assert_eq!(test_plant(server, true).unwrap(), LockPlant::default());
        let e = test_plant(Some(OsStr::new("cli-ignore-deadline")), true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("names no planted bug"), "{e}");
        for value in [planted, server, Some(OsStr::new(""))] {
            let e = test_plant(value, false).unwrap_err().to_string();
            assert!(e.contains("only a debug build accepts it"), "{e}");
        }
    }

    #[test]
    fn grace_fits_inside_the_margin_for_every_ttl() {
        for ttl_ms in [1_000, 2_000, 15_000, 3_600_000] {
            let margin = latchkey_client::safety_margin(Duration::from_millis(ttl_ms));
            let grace = kill_grace(margin);
            assert!(grace > Duration::ZERO && grace < margin, "ttl {ttl_ms} ms");
        }
    }

    #[test]
    fn shell_status_follows_sh() {
        assert_eq!(shell_status(ExitStatus::from_raw(0)), 0);
        assert_eq!(shell_status(ExitStatus::from_raw(7 << 8)), 7);
        // Killed by SIGTERM (15) and SIGKILL (9).
        assert_eq!(shell_status(ExitStatus::from_raw(15)), 143);
        assert_eq!(shell_status(ExitStatus::from_raw(9)), 137);
    }
}
