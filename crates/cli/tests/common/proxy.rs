//! A fault-injecting TCP proxy for one directed peer link: node i dials member j through
//! `P(i→j)` (`latchkey serve --peer-dial j=P`), so the test can cut that link alone.
//!
//! Modes: [`Mode::Pass`] forwards bytes; [`Mode::Drop`] kills every open connection and closes
//! new ones at once (a crashed host or a firewall that rejects); [`Mode::Blackhole`] accepts
//! connections and swallows their bytes (a silent partition: the dialer sees timeouts);
//! [`Mode::AnswersLost`] forwards what the dialer sends and swallows what comes back (requests
//! arrive and take effect, their answers are lost: the dialer retries). Plain
//! threads, blocking sockets; every thread ends when its sockets are shut down, which happens
//! on a mode change and when the proxy drops.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Drop,
    Blackhole,
    AnswersLost,
}

struct Shared {
    target: String,
    mode: Mutex<Mode>,
    /// Both ends of every live connection, to shut them down on a cut.
    conns: Mutex<Vec<TcpStream>>,
    stop: AtomicBool,
}

impl Shared {
    fn mode(&self) -> Mode {
        *self.mode.lock().expect("proxy mode")
    }

    fn kill_all(&self) {
        for s in self.conns.lock().expect("proxy conns").drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn register(&self, s: &TcpStream) {
        if let Ok(s) = s.try_clone() {
            self.conns.lock().expect("proxy conns").push(s);
        }
    }
}

pub struct Proxy {
    pub addr: String,
    shared: Arc<Shared>,
}

impl Proxy {
    /// A proxy on a fresh loopback port forwarding to `target`, passing traffic.
    pub fn start(target: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy bind");
        let addr = listener.local_addr().expect("proxy addr").to_string();
        let shared = Arc::new(Shared {
            target: target.to_owned(),
            mode: Mutex::new(Mode::Pass),
            conns: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        std::thread::spawn(move || accept_loop(listener, s));
        Proxy { addr, shared }
    }

    pub fn mode(&self) -> Mode {
        self.shared.mode()
    }

    /// Switches the mode. Leaving `Pass` kills the open connections when going to `Drop`;
    /// leaving `Blackhole` or `AnswersLost` kills them too (bytes were swallowed mid-stream,
    /// the connections are garbage), so that the dialer reconnects cleanly.
    pub fn set(&self, mode: Mode) {
        let old = std::mem::replace(&mut *self.shared.mode.lock().expect("proxy mode"), mode);
        let swallowed = matches!(old, Mode::Blackhole | Mode::AnswersLost);
        if mode == Mode::Drop || (swallowed && mode != old) {
            self.shared.kill_all();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.kill_all();
        // Wake the accept loop so that it sees the stop flag.
        let _ = TcpStream::connect_timeout(
            &self.addr.parse().expect("proxy addr"),
            Duration::from_millis(200),
        );
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for incoming in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = incoming else { continue };
        let _ = client.set_nodelay(true);
        match shared.mode() {
            Mode::Drop => drop(client),
            Mode::Blackhole => {
                shared.register(&client);
                let s = shared.clone();
                std::thread::spawn(move || swallow(client, s));
            }
            Mode::Pass | Mode::AnswersLost => {
                let target = shared.target.parse().expect("proxy target");
                let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(1)) else {
                    continue; // the member is down: the dialer sees its connection close
                };
                let _ = server.set_nodelay(true);
                shared.register(&client);
                shared.register(&server);
                let (c2, s2) = (
                    client.try_clone().expect("clone"),
                    server.try_clone().expect("clone"),
                );
                let (a, b) = (shared.clone(), shared.clone());
                std::thread::spawn(move || pump(client, server, Direction::Request, a));
                std::thread::spawn(move || pump(s2, c2, Direction::Answer, b));
            }
        }
    }
}

/// Which way a pump copies: from the dialer to the target, or back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Request,
    Answer,
}

/// Copies `from` to `to` while the mode is `Pass` (or `AnswersLost`, for requests); swallows
/// while it is `Blackhole` (or `AnswersLost`, for answers).
fn pump(mut from: TcpStream, mut to: TcpStream, direction: Direction, shared: Arc<Shared>) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let forward = match shared.mode() {
            Mode::Pass => true,
            Mode::AnswersLost => direction == Direction::Request,
            Mode::Blackhole => false,
            Mode::Drop => break,
        };
        if forward && to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

fn swallow(mut s: TcpStream, _shared: Arc<Shared>) {
    let mut buf = [0u8; 16 * 1024];
    while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
}
