//! The Rust client's conformance agent (issue #15 item 5): the JSON-lines protocol every
//! latchkey client's agent speaks (`docs/conformance.md`), over `latchkey-client`'s public API
//! only. The conformance suite (`crates/cli/tests/conformance.rs`) drives this agent, the
//! Python client's and the TypeScript client's through the same commands against real
//! `latchkey serve` processes.
//!
//! One command per line in, one answer per line out, each answer carrying its command's `id`.
//! Commands run concurrently (a `lock` may wait), so answers may come out of order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use latchkey_client::{Client, Error, Leadership, LockGuard, Mode, Session};
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// Queue positions kept per `lock` command: a wait hears one a long-poll (at most 10 s), so a
/// conformance wait of a minute hears a handful.
const POSITIONS_KEPT_MAX: usize = 64;

/// The agent's state: one client, its sessions and guards by the names the suite gave them.
#[derive(Clone)]
struct Agent {
    client: Client,
    sessions: Arc<Mutex<HashMap<String, Arc<Session>>>>,
    guards: Arc<Mutex<HashMap<String, Option<LockGuard>>>>,
    /// A campaign's leadership, by the guard name its `campaign` answered.
    leaderships: Arc<Mutex<HashMap<String, Option<Leadership>>>>,
    /// The queue positions the client reported to a `lock` that asked (`"positions": true`),
    /// in order, by the lock command's id; at most `POSITIONS_KEPT_MAX` each (the latest).
    positions: Arc<Mutex<HashMap<String, Vec<u32>>>>,
    next_guard: Arc<Mutex<u64>>,
}

/// Serves commands from `input` until it closes, sending each answer to `output`; then closes
/// every session it opened.
pub async fn serve(
    endpoints: Vec<String>,
    mut input: mpsc::Receiver<String>,
    output: std::sync::mpsc::Sender<String>,
) {
    let client = match Client::connect(endpoints).await {
        Ok(client) => client,
        Err(e) => {
            let _ = output.send(
                json!({"id": null, "ok": false, "error": "other", "message": e.to_string()})
                    .to_string(),
            );
            return;
        }
    };
    let agent = Agent {
        client,
        sessions: Arc::default(),
        guards: Arc::default(),
        leaderships: Arc::default(),
        positions: Arc::default(),
        next_guard: Arc::default(),
    };
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(line) = input.recv().await {
        let (agent, output) = (agent.clone(), output.clone());
        tasks.spawn(async move {
            let answer = match serde_json::from_str::<Value>(&line) {
                Ok(command) => {
                    let id = command.get("id").cloned().unwrap_or(Value::Null);
                    let mut answer = agent.run(&command).await;
                    answer["id"] = id;
                    answer
                }
                Err(_) => json!({"id": null, "ok": false, "error": "bad-command"}),
            };
            let _ = output.send(answer.to_string());
        });
        // Reap finished commands so the set does not grow with the run.
        while tasks.try_join_next().is_some() {}
    }
    tasks.shutdown().await;
    let sessions: Vec<_> = agent.sessions.lock().unwrap().drain().collect();
    for (_, session) in sessions {
        if let Ok(session) = Arc::try_unwrap(session) {
            let _ = session.close().await;
        }
    }
}

fn failed(e: &Error) -> Value {
    let code = match e {
        Error::WaitTimedOut { .. } | Error::Held { .. } => "wait-timeout",
        Error::PermissionDenied { .. } => "permission-denied",
        Error::SessionLost { .. } => "lost",
        Error::InvalidArgument { .. } => "invalid-argument",
        Error::Conflict { reason, .. } if reason == "kind-conflict" => "kind-conflict",
        Error::Conflict { reason, .. } if reason == "permits-conflict" => "permits-conflict",
        Error::Conflict { reason, .. } if reason == "not-election-leader" => "not-election-leader",
        _ => "other",
    };
    json!({"ok": false, "error": code, "message": e.to_string()})
}

fn field<'a>(command: &'a Value, name: &str) -> Result<&'a str, Value> {
    command[name].as_str().ok_or_else(
        || json!({"ok": false, "error": "bad-command", "message": format!("no {name}")}),
    )
}

impl Agent {
    async fn run(&self, command: &Value) -> Value {
        match self.try_run(command).await {
            Ok(answer) | Err(answer) => answer,
        }
    }

    fn session(&self, name: &str) -> Result<Arc<Session>, Value> {
        self.sessions.lock().unwrap().get(name).cloned().ok_or_else(
            || json!({"ok": false, "error": "other", "message": format!("no session {name}")}),
        )
    }

    fn guard_name(&self) -> String {
        let mut next = self.next_guard.lock().unwrap();
        *next += 1;
        format!("g-{next}")
    }

    fn no_guard(name: &str) -> Value {
        json!({"ok": false, "error": "other", "message": format!("no guard {name}")})
    }

    /// Runs `f` on the guard named `name` (or answers that there is none).
    fn with_guard<T>(&self, name: &str, f: impl FnOnce(&LockGuard) -> T) -> Result<T, Value> {
        let guards = self.guards.lock().unwrap();
        match guards.get(name) {
            Some(Some(guard)) => Ok(f(guard)),
            _ => Err(json!({"ok": false, "error": "other", "message": format!("no guard {name}")})),
        }
    }

    async fn try_run(&self, command: &Value) -> Result<Value, Value> {
        match command["op"].as_str().unwrap_or("") {
            "session" => {
                let name = field(command, "session")?;
                let ttl = Duration::from_millis(command["ttl_ms"].as_u64().unwrap_or(15_000));
                let session = self.client.session(ttl).await.map_err(|e| failed(&e))?;
                let id = session.id();
                self.sessions
                    .lock()
                    .unwrap()
                    .insert(name.to_owned(), Arc::new(session));
                Ok(json!({"ok": true, "session_id": id}))
            }
            "lock" => {
                let session = self.session(field(command, "session")?)?;
                let wait = command["wait_ms"].as_u64().map(Duration::from_millis);
                let request = session.lock(field(command, "name")?);
                // `"mode": "shared"` a reader, `"permits": N` one of a semaphore's N permits.
                let request = match (command["mode"].as_str(), &command["permits"]) {
                    (Some("shared"), Value::Null) => request.shared(),
                    (None | Some("exclusive"), Value::Null) => request,
                    (None | Some("permits"), permits) => match permits.as_u64() {
                        Some(n) => request.permits(u32::try_from(n).unwrap_or(u32::MAX)),
                        None => {
                            return Err(json!({"ok": false, "error": "bad-command",
                            "message": "permits is a number"}))
                        }
                    },
                    (Some(mode), _) => {
                        return Err(json!({"ok": false, "error": "bad-command",
                        "message": format!("no mode {mode} with permits")}))
                    }
                };
                // `"lock_delay_ms": N` asks for a lock-delay (docs/primitives.md).
                let request = match &command["lock_delay_ms"] {
                    Value::Null => request,
                    ms => match ms.as_u64() {
                        Some(ms) => request.lock_delay(Duration::from_millis(ms)),
                        None => {
                            return Err(json!({"ok": false, "error": "bad-command",
                            "message": "lock_delay_ms is a number"}))
                        }
                    },
                };
                // `"positions": true` records the queue positions the client reports while
                // this lock waits, for the `positions` command (by this command's id).
                let (request, heard) = if command["positions"] == Value::Bool(true) {
                    let id = field(command, "id")?.to_owned();
                    let (tx, rx) = tokio::sync::watch::channel(0u32);
                    self.positions
                        .lock()
                        .unwrap()
                        .insert(id.clone(), Vec::new());
                    (request.positions(tx), Some((id, rx)))
                } else {
                    (request, None)
                };
                // Ends when the wait does: its request owns the sender.
                let record = async {
                    let Some((id, mut rx)) = heard else { return };
                    while rx.changed().await.is_ok() {
                        let position = *rx.borrow_and_update();
                        let mut all = self.positions.lock().unwrap();
                        let heard = all.entry(id.clone()).or_default();
                        if heard.len() == POSITIONS_KEPT_MAX {
                            heard.remove(0);
                        }
                        heard.push(position);
                    }
                };
                let (waited, ()) = tokio::join!(request.wait(wait), record);
                let guard = waited.map_err(|e| failed(&e))?;
                let token = guard.token();
                let name = {
                    let mut next = self.next_guard.lock().unwrap();
                    *next += 1;
                    format!("g-{next}")
                };
                self.guards
                    .lock()
                    .unwrap()
                    .insert(name.clone(), Some(guard));
                Ok(json!({"ok": true, "token": token, "guard": name}))
            }
            "release" => {
                let name = field(command, "guard")?;
                let guard = self
                    .guards
                    .lock()
                    .unwrap()
                    .get_mut(name)
                    .and_then(Option::take);
                let Some(guard) = guard else {
                    return Err(
                        json!({"ok": false, "error": "other", "message": format!("no guard {name}")}),
                    );
                };
                let was_lost = guard.is_lost();
                match guard.release().await {
                    Ok(()) if was_lost => Ok(json!({"ok": false, "error": "lost"})),
                    Ok(()) => Ok(json!({"ok": true})),
                    Err(e) => Err(failed(&e)),
                }
            }
            "lost" => {
                let lost = self.with_guard(field(command, "guard")?, LockGuard::is_lost)?;
                Ok(json!({"ok": true, "lost": lost}))
            }
            "wait_lost" => {
                let timeout = Duration::from_millis(command["timeout_ms"].as_u64().unwrap_or(0));
                let lost = self.with_guard(field(command, "guard")?, |g| g.lost())?;
                let lost = tokio::time::timeout(timeout, lost).await.is_ok();
                Ok(json!({"ok": true, "lost": lost}))
            }
            "positions" => {
                let lock = field(command, "lock")?;
                let positions = self.positions.lock().unwrap().get(lock).cloned();
                let positions = positions.ok_or_else(|| {
                    json!({"ok": false, "error": "other",
                    "message": format!("no lock {lock} that asked for positions")})
                })?;
                Ok(json!({"ok": true, "positions": positions}))
            }
            "contended" => {
                let contended =
                    self.with_guard(field(command, "guard")?, LockGuard::is_contended)?;
                Ok(json!({"ok": true, "contended": contended}))
            }
            "wait_contended" => {
                let timeout = Duration::from_millis(command["timeout_ms"].as_u64().unwrap_or(0));
                let contended = self.with_guard(field(command, "guard")?, LockGuard::contended)?;
                let contended = tokio::time::timeout(timeout, contended).await.is_ok();
                Ok(json!({"ok": true, "contended": contended}))
            }
            "fencing_headers" => {
                let headers = self.with_guard(field(command, "guard")?, |g| {
                    latchkey_client::fencing_headers(g)
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), Value::String(v)))
                        .collect::<serde_json::Map<_, _>>()
                })?;
                Ok(json!({"ok": true, "headers": headers}))
            }
            "describe" => {
                let info = self
                    .client
                    .describe(field(command, "name")?)
                    .await
                    .map_err(|e| failed(&e))?;
                let holder = info.holder.as_ref();
                let (mode, permits) = match info.mode {
                    Mode::Exclusive => ("exclusive", 0),
                    Mode::Shared => ("shared", 0),
                    Mode::Permits(n) => ("permits", n),
                };
                let holders: Vec<Value> = info
                    .holders
                    .iter()
                    .map(|h| json!({"session_id": h.session, "token": h.token}))
                    .collect();
                Ok(json!({
                    "ok": true,
                    "held": holder.is_some(),
                    "token": holder.map(|h| h.token),
                    "session_id": holder.map(|h| h.session),
                    "waiters": info.waiters,
                    "mode": mode,
                    "permits": permits,
                    "holders": holders,
                }))
            }
            "close" => {
                let name = field(command, "session")?;
                let session = self.sessions.lock().unwrap().remove(name);
                let Some(session) = session else {
                    return Err(
                        json!({"ok": false, "error": "other", "message": format!("no session {name}")}),
                    );
                };
                // Guards hold the session's shared state, not the `Session`: it can close.
                match Arc::try_unwrap(session) {
                    Ok(session) => session.close().await.map_err(|e| failed(&e))?,
                    Err(_) => {
                        return Err(
                            json!({"ok": false, "error": "other", "message": "session busy"}),
                        )
                    }
                }
                Ok(json!({"ok": true}))
            }
            "campaign" => {
                let session = self.session(field(command, "session")?)?;
                let name = field(command, "name")?;
                let value = field(command, "value")?;
                let campaign = session.campaign(name, value);
                // `Session::campaign` waits until this session leads; `wait_ms` bounds it
                // here (a campaign given up is withdrawn by the client, as a lock wait is), so
                // `wait_ms: 0` is no try-lock in this agent: the suite leaves it out.
                let leadership = match command["wait_ms"].as_u64() {
                    None => campaign.await,
                    Some(ms) => tokio::time::timeout(Duration::from_millis(ms), campaign)
                        .await
                        .unwrap_or_else(|_| {
                            Err(Error::WaitTimedOut {
                                name: name.to_owned(),
                            })
                        }),
                }
                .map_err(|e| failed(&e))?;
                let token = leadership.token();
                let guard = self.guard_name();
                self.leaderships
                    .lock()
                    .unwrap()
                    .insert(guard.clone(), Some(leadership));
                Ok(json!({"ok": true, "token": token, "guard": guard}))
            }
            "proclaim" => {
                let name = field(command, "guard")?;
                let value = field(command, "value")?.to_owned();
                // Taken out for the call (a `Leadership` is not `Clone`), then put back.
                let leadership = self
                    .leaderships
                    .lock()
                    .unwrap()
                    .get_mut(name)
                    .and_then(Option::take)
                    .ok_or_else(|| Self::no_guard(name))?;
                let proclaimed = leadership.proclaim(value).await;
                self.leaderships
                    .lock()
                    .unwrap()
                    .insert(name.to_owned(), Some(leadership));
                proclaimed.map_err(|e| failed(&e))?;
                Ok(json!({"ok": true}))
            }
            "resign" => {
                let name = field(command, "guard")?;
                let leadership = self
                    .leaderships
                    .lock()
                    .unwrap()
                    .get_mut(name)
                    .and_then(Option::take)
                    .ok_or_else(|| Self::no_guard(name))?;
                leadership.resign().await.map_err(|e| failed(&e))?;
                Ok(json!({"ok": true}))
            }
            "leader" => {
                let leader = self
                    .client
                    .leader(field(command, "name")?)
                    .await
                    .map_err(|e| failed(&e))?;
                let leader = leader.map(|l| {
                    json!({
                        "session_id": l.session,
                        "token": l.token,
                        "value": String::from_utf8_lossy(&l.value),
                    })
                });
                Ok(json!({"ok": true, "leader": leader}))
            }
            "inject_retry" => Ok(json!({"ok": false, "error": "unsupported",
                "message": "the suite injects retries in the network (a proxy that loses answers)"})),
            _ => Ok(json!({"ok": false, "error": "unknown-op"})),
        }
    }
}
