//! The protected resource of the fencing tests: the fenced key-value example service on a
//! thread of its own (it is plain std), with every write attempt recorded.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use latchkey_fence::MemoryGate;

use crate::fenced_kv::{limits, run, FencedKv, ServerConfig, Shutdown, WriteEvent};

/// One write attempt the resource saw: its HTTP status, the token it carried, and the
/// service's one-line account of it.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub status: u16,
    pub token: Option<u64>,
    pub line: String,
}

/// The fenced key-value service (in-memory gate) on `127.0.0.1`, a free port.
pub struct FencedResource {
    pub addr: SocketAddr,
    shutdown: Shutdown,
    kv: Arc<FencedKv<MemoryGate>>,
    /// Every attempt, in order.
    attempts: Arc<Mutex<Vec<Attempt>>>,
    /// Attempts already handed out by [`FencedResource::new_attempts`].
    seen: usize,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl FencedResource {
    pub fn start() -> anyhow::Result<FencedResource> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").context("resource bind")?;
        let addr = listener.local_addr()?;
        let shutdown = Shutdown::new(&listener)?;
        let kv = Arc::new(FencedKv::new(MemoryGate::new(), limits::KV_KEYS_MAX));
        let attempts: Arc<Mutex<Vec<Attempt>>> = Arc::default();
        let thread = {
            let (shutdown, kv, attempts) = (shutdown.clone(), kv.clone(), attempts.clone());
            std::thread::spawn(move || {
                let on_write = |e: &WriteEvent<'_>| {
                    attempts
                        .lock()
                        .expect("attempts lock poisoned")
                        .push(Attempt {
                            status: e.status,
                            token: e.token,
                            line: e.to_string(),
                        });
                };
                run(
                    listener,
                    &kv,
                    &ServerConfig::default(),
                    &shutdown,
                    &on_write,
                )
            })
        };
        Ok(FencedResource {
            addr,
            shutdown,
            kv,
            attempts,
            seen: 0,
            thread: Some(thread),
        })
    }

    /// The attempts since the last call.
    pub fn new_attempts(&mut self) -> Vec<Attempt> {
        let attempts = self.attempts.lock().expect("attempts lock poisoned");
        let new = attempts[self.seen..].to_vec();
        self.seen = attempts.len();
        new
    }

    /// The stored value of `key`.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.kv.get(key)
    }

    /// Stops the service (waiting for its thread) and returns every attempt it saw.
    pub fn stop(mut self) -> anyhow::Result<Vec<Attempt>> {
        self.shutdown.trigger();
        if let Some(thread) = self.thread.take() {
            thread
                .join()
                .map_err(|_| anyhow::anyhow!("the resource's thread panicked"))?
                .context("the resource's service")?;
        }
        Ok(self
            .attempts
            .lock()
            .expect("attempts lock poisoned")
            .clone())
    }
}

impl Drop for FencedResource {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.shutdown.trigger();
            let _ = thread.join();
        }
    }
}
