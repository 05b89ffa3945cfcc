//! The fenced resource: a counter per lock behind a token gate, served over TCP from the root
//! namespace (never partitioned: the faults are between the lock service and its clients).
//!
//! A worker's critical section reads the counter (`BEGIN`) and writes it plus one (`COMMIT`),
//! each carrying its fencing token; the gate refuses a token lower than the highest it has
//! seen for the lock, as `latchkey-fence` does. Every decision is recorded with the time the
//! resource made it, in the simulation's [`ResourceOp`] form, so the simulation's
//! `fencing_order` and `no_overlap` checkers judge it: no lower token accepted after a higher
//! one, no two accepted sections overlapping, no lost update.
//!
//! The protocol is one line each way:
//! `BEGIN CLIENT GENERATION LOCK TOKEN` → `OK VALUE` | `STALE`;
//! `COMMIT CLIENT GENERATION LOCK TOKEN VALUE` → `OK` | `STALE`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use latchkey_sim::history::{Actor, ResourceOp, Step};

use crate::limits;
use crate::record::now;

#[derive(Default)]
struct State {
    /// Per lock: the highest token admitted and the counter.
    locks: BTreeMap<String, (u64, u64)>,
    ops: Vec<ResourceOp>,
}

pub struct Resource {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Resource {
    /// Serves on `addr`; times are recorded relative to `start` (on [`now`]'s clock).
    pub fn start(addr: SocketAddr, start: Duration) -> anyhow::Result<Resource> {
        let listener =
            TcpListener::bind(addr).with_context(|| format!("resource: binding {addr}"))?;
        let addr = listener.local_addr()?;
        let state: Arc<Mutex<State>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (state, stop) = (state.clone(), stop.clone());
            std::thread::spawn(move || accept(listener, state, stop, start))
        };
        Ok(Resource {
            addr,
            state,
            stop,
            thread: Some(thread),
        })
    }

    /// Stops serving and returns every decision, in the order made.
    pub fn stop(mut self) -> Vec<ResourceOp> {
        self.shut();
        std::mem::take(&mut self.state.lock().expect("resource poisoned").ops)
    }

    fn shut(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Resource {
    fn drop(&mut self) {
        self.shut();
    }
}

fn accept(listener: TcpListener, state: Arc<Mutex<State>>, stop: Arc<AtomicBool>, start: Duration) {
    let open = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(conn) = conn else { continue };
        if open.load(Ordering::SeqCst) >= limits::RESOURCE_CONNECTIONS_MAX {
            continue; // dropped: the worker reconnects
        }
        open.fetch_add(1, Ordering::SeqCst);
        let (state, stop, open) = (state.clone(), stop.clone(), open.clone());
        // Detached: a connection ends when its worker closes it or dies (its namespace goes at
        // the end of the run, which resets it); the accept loop does not wait for it.
        std::thread::spawn(move || {
            let _ = serve(conn, &state, &stop, start);
            open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

fn serve(
    conn: TcpStream,
    state: &Mutex<State>,
    stop: &AtomicBool,
    start: Duration,
) -> anyhow::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(1)))?;
    let mut out = conn.try_clone()?;
    let mut read = BufReader::new(conn);
    let mut line = String::new();
    loop {
        line.clear();
        match read
            .by_ref()
            .take(limits::LINE_BYTES_MAX as u64)
            .read_line(&mut line)
        {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if stop.load(Ordering::SeqCst) {
                    return Ok(());
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        let answer = decide(line.trim_end(), state, start)?;
        out.write_all(answer.as_bytes())?;
    }
}

/// Applies one request line and returns the answer line.
fn decide(line: &str, state: &Mutex<State>, start: Duration) -> anyhow::Result<String> {
    let words: Vec<&str> = line.split(' ').collect();
    let num = |i: usize| -> anyhow::Result<u64> {
        words
            .get(i)
            .and_then(|w| w.parse().ok())
            .with_context(|| format!("resource: bad request {line:?}"))
    };
    let (begin, expect) = match words.first() {
        Some(&"BEGIN") => (true, 5),
        Some(&"COMMIT") => (false, 6),
        _ => bail!("resource: bad request {line:?}"),
    };
    if words.len() != expect {
        bail!("resource: bad request {line:?}");
    }
    let actor = Actor {
        client: u32::try_from(num(1)?)?,
        generation: u32::try_from(num(2)?)?,
    };
    let lock = words[3].to_owned();
    let token = num(4)?;
    let mut s = state.lock().expect("resource poisoned");
    let at = now().saturating_sub(start);
    let (highest, value) = s.locks.entry(lock.clone()).or_insert((0, 0));
    let accepted = token >= *highest;
    let (step, answer) = if begin {
        let read = *value;
        if accepted {
            *highest = token;
        }
        (
            Step::Begin { read },
            if accepted {
                format!("OK {read}\n")
            } else {
                "STALE\n".into()
            },
        )
    } else {
        let wrote = num(5)?;
        if accepted {
            *highest = token;
            *value = wrote;
        }
        (
            Step::Commit { wrote },
            if accepted {
                "OK\n".into()
            } else {
                "STALE\n".into()
            },
        )
    };
    s.ops.push(ResourceOp {
        actor,
        lock,
        token,
        at,
        step,
        accepted,
    });
    Ok(answer)
}

/// A worker's connection to the resource.
pub struct Conn {
    addr: SocketAddr,
    stream: Option<BufReader<TcpStream>>,
}

impl Conn {
    pub fn new(addr: SocketAddr) -> Conn {
        Conn { addr, stream: None }
    }

    /// Sends one request; `None` for `STALE`, `Some(value)` (0 for a commit) for `OK`.
    pub fn call(&mut self, request: &str) -> anyhow::Result<Option<u64>> {
        if self.stream.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(2))
                .with_context(|| format!("connecting to the resource at {}", self.addr))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            self.stream = Some(BufReader::new(s));
        }
        let r = (|| {
            let s = self.stream.as_mut().expect("connected above");
            s.get_mut().write_all(format!("{request}\n").as_bytes())?;
            let mut line = String::new();
            s.read_line(&mut line)?;
            anyhow::Ok(line)
        })();
        let line = match r {
            Ok(line) => line,
            Err(e) => {
                self.stream = None;
                return Err(e);
            }
        };
        match line.trim_end().split_once(' ') {
            _ if line.trim_end() == "STALE" => Ok(None),
            _ if line.trim_end() == "OK" => Ok(Some(0)),
            Some(("OK", v)) => Ok(Some(v.parse()?)),
            _ => bail!("resource answered {line:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_refuses_a_lower_token_and_records_every_decision() {
        let r = Resource::start("127.0.0.1:0".parse().unwrap(), now()).unwrap();
        let mut c = Conn::new(r.addr);
        assert_eq!(c.call("BEGIN 1 1 a 10").unwrap(), Some(0));
        assert_eq!(c.call("COMMIT 1 1 a 10 1").unwrap(), Some(0));
        assert_eq!(c.call("BEGIN 2 1 a 12").unwrap(), Some(1));
        assert_eq!(
            c.call("COMMIT 1 1 a 10 5").unwrap(),
            None,
            "a lower token after a higher"
        );
        assert_eq!(c.call("COMMIT 2 1 a 12 2").unwrap(), Some(0));
        assert!(
            c.call("BEGIN x").is_err(),
            "a bad request closes the connection"
        );
        let ops = r.stop();
        let accepted: Vec<bool> = ops.iter().map(|o| o.accepted).collect();
        assert_eq!(accepted, [true, true, true, false, true]);
    }
}
