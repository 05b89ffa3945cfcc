//! Waiting for an event in a test: poll a condition until it holds, with a deadline.
//!
//! A test synchronises on what it can observe (a status, a file, a queue length), never on a
//! sleep of a guessed length; the deadline bounds the wait on a loaded machine, and the message
//! names what never happened.

use std::future::Future;
use std::time::{Duration, Instant};

/// Poll interval: short next to every event a test waits for (an election, a grant, a file),
/// long enough that polling a CLI or an RPC does not load the machine.
pub const POLL: Duration = Duration::from_millis(20);

/// A condition did not hold within its deadline.
#[derive(Debug, thiserror::Error)]
#[error("timed out after {timeout:?} waiting for {what}")]
pub struct TimedOut {
    pub what: String,
    pub timeout: Duration,
}

/// The deadline of one wait, shared by the blocking and the async form.
struct Deadline<'a> {
    what: &'a str,
    timeout: Duration,
    at: Instant,
}

impl<'a> Deadline<'a> {
    fn new(what: &'a str, timeout: Duration) -> Self {
        Deadline {
            what,
            timeout,
            at: Instant::now() + timeout,
        }
    }

    fn check(&self) -> Result<(), TimedOut> {
        if Instant::now() < self.at {
            Ok(())
        } else {
            Err(TimedOut {
                what: self.what.to_owned(),
                timeout: self.timeout,
            })
        }
    }
}

/// Polls `condition` (every [`POLL`], blocking the thread) until it holds; panics naming `what`
/// after `timeout`. For synchronous tests.
pub fn wait_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Deadline::new(what, timeout);
    while !condition() {
        if let Err(e) = deadline.check() {
            panic!("{e}");
        }
        std::thread::sleep(POLL);
    }
}

/// Polls the async `condition` (every [`POLL`]) until it holds; [`TimedOut`] after `timeout`.
pub async fn wait_until_async<F, Fut>(
    what: &str,
    timeout: Duration,
    mut condition: F,
) -> Result<(), TimedOut>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Deadline::new(what, timeout);
    while !condition().await {
        deadline.check()?;
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_that_never_holds_times_out_naming_what() {
        let result =
            std::panic::catch_unwind(|| wait_until("nothing", Duration::from_millis(50), || false));
        let message = *result
            .expect_err("must time out")
            .downcast::<String>()
            .unwrap();
        assert!(message.contains("waiting for nothing"), "{message}");
    }

    #[test]
    fn a_condition_is_polled_until_it_holds() {
        let mut polls = 0;
        wait_until("the third poll", Duration::from_secs(10), || {
            polls += 1;
            polls == 3
        });
        assert_eq!(polls, 3);
    }

    #[tokio::test]
    async fn the_async_form_reports_a_timeout_as_an_error() {
        let err = wait_until_async("nothing", Duration::from_millis(50), || async { false })
            .await
            .expect_err("must time out");
        assert_eq!(err.what, "nothing");
        let mut polls = 0;
        wait_until_async("the second poll", Duration::from_secs(10), || {
            polls += 1;
            let done = polls == 2;
            async move { done }
        })
        .await
        .unwrap();
        assert_eq!(polls, 2);
    }
}
