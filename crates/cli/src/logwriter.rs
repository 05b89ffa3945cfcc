//! Log output for `latchkey lock` that never blocks the task that logs.
//!
//! COMMAND shares our stderr. If whatever reads it stops (a full pipe), a blocking write of a
//! library warning ("renewal failed") would stall the task that logged it: the renewal task,
//! whose deadline is what tells us to stop COMMAND. So log lines go through a bounded queue to a
//! thread of their own, and a line that finds the queue full is dropped.

use std::io::Write;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use latchkey_core::limits::CLI_LOG_LINES_QUEUED_MAX;

/// A `MakeWriter` for tracing: each event becomes one queued line.
#[derive(Clone)]
pub struct LossyStderr {
    tx: SyncSender<Vec<u8>>,
    /// Lines queued and not yet written, for [`LossyStderr::drain`].
    queued: Arc<(Mutex<usize>, Condvar)>,
}

impl LossyStderr {
    /// Starts the writer thread. It is never joined: it may be blocked in a write for good,
    /// and it ends with the process.
    pub fn start() -> std::io::Result<LossyStderr> {
        let (tx, rx) = sync_channel::<Vec<u8>>(CLI_LOG_LINES_QUEUED_MAX);
        let queued = Arc::new((Mutex::new(0usize), Condvar::new()));
        let done = queued.clone();
        std::thread::Builder::new()
            .name("latchkey-log".into())
            .spawn(move || {
                let mut stderr = std::io::stderr();
                for line in rx {
                    let _ = stderr.write_all(&line);
                    let (count, cv) = &*done;
                    *count.lock().expect("log count lock poisoned") -= 1;
                    cv.notify_all();
                }
            })?;
        Ok(LossyStderr { tx, queued })
    }

    /// Waits up to `timeout` for the queued lines to be written (before the process exits).
    pub fn drain(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let (count, cv) = &*self.queued;
        let mut n = count.lock().expect("log count lock poisoned");
        while *n > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            n = cv.wait_timeout(n, left).expect("log count lock poisoned").0;
        }
    }
}

/// One event's bytes, queued when the event is done.
pub struct Line {
    buf: Vec<u8>,
    owner: LossyStderr,
}

impl Write for Line {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let (count, _) = &*self.owner.queued;
        let mut n = count.lock().expect("log count lock poisoned");
        match self.owner.tx.try_send(std::mem::take(&mut self.buf)) {
            Ok(()) => *n += 1,
            // Full: stderr is not being read; dropping the line is the point.
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {}
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LossyStderr {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line {
            buf: Vec::new(),
            owner: self.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_written_and_drained() {
        let w = LossyStderr::start().unwrap();
        for _ in 0..3 {
            let mut line = tracing_subscriber::fmt::MakeWriter::make_writer(&w);
            line.write_all(b"latchkey: logwriter test line\n").unwrap();
        }
        w.drain(Duration::from_secs(10));
        assert_eq!(*w.queued.0.lock().unwrap(), 0);
    }
}
