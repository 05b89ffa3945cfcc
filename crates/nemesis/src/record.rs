//! What the processes of a run write down, and how it becomes the simulation's history.
//!
//! Every process stamps its events with `CLOCK_BOOTTIME` ([`now`]): one clock for the whole
//! machine, which keeps running while a process is stopped (SIGSTOP) and which no namespace
//! changes. So events of different processes are ordered by real time, as Jepsen's are by its
//! single control node, and the checkers can ask "were two holders at one real time?".

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use latchkey_sim::history::{Actor, Event, HistoryData, OpKind, Ret};
use serde::{Deserialize, Serialize};

use crate::limits;
use crate::postgres::Written;

/// Now on `CLOCK_BOOTTIME`, since boot.
pub fn now() -> Duration {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .expect("CLOCK_BOOTTIME exists on every Linux since 2.6.39");
    Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32)
}

/// One line of a worker's history (JSON). `at` is [`now`] in nanoseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub enum WorkerEvent {
    /// An acquire (`token: None`) or a release of `token` was sent.
    Invoke {
        id: u64,
        generation: u32,
        session: u64,
        lock: String,
        token: Option<u64>,
        at: u64,
    },
    /// The operation `id` was answered.
    Return { id: u64, ret: WorkerRet, at: u64 },
    /// The worker read its lease deadline at `at` and found it had not passed: it may act as
    /// the holder of `lock` with `token` at that moment.
    HoldCheck {
        generation: u32,
        session: u64,
        lock: String,
        token: u64,
        at: u64,
    },
    /// The worker found its session lost (deadline passed, or the server said so).
    Lost {
        generation: u32,
        session: u64,
        at: u64,
    },
    /// The worker wrote to the PostgreSQL resource through the book's recipe, under `token`,
    /// finishing at `at`. Not part of the lock history: the database's own log is checked.
    Postgres {
        lock: String,
        token: u64,
        written: crate::postgres::Written,
        at: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerRet {
    Granted { token: u64 },
    NotGranted,
    Released,
    NotHolder,
}

/// Where [`read_worker`] puts the worker's number in an operation id.
const CLIENT_SHIFT: u32 = 40;

/// The worker whose history an operation id (as [`read_worker`] made it) came from.
pub fn client_of(id: u64) -> u32 {
    (id >> CLIENT_SHIFT) as u32
}

/// Reads worker `client`'s history file into `h`, times made relative to `start`. Operation
/// ids are made unique across workers (`client` in the high bits). Its PostgreSQL writes are
/// counted into `postgres` by outcome. A last line cut short (the
/// worker was killed mid-write) is dropped; any other bad line is an error.
pub fn read_worker(
    path: &Path,
    client: u32,
    start: Duration,
    h: &mut HistoryData,
    postgres: &mut BTreeMap<Written, usize>,
) -> anyhow::Result<usize> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let lines: Vec<String> = BufReader::new(file)
        .lines()
        .collect::<Result<_, _>>()
        .with_context(|| format!("reading {}", path.display()))?;
    if lines.len() > limits::WORKER_EVENTS_MAX {
        bail!(
            "{}: {} events, over the bound of {}",
            path.display(),
            lines.len(),
            limits::WORKER_EVENTS_MAX
        );
    }
    let rel = |at: u64| Duration::from_nanos(at).saturating_sub(start);
    let id = |id: u64| (u64::from(client) << CLIENT_SHIFT) | id;
    let actor = |generation| Actor { client, generation };
    let last = lines.len().saturating_sub(1);
    for (i, line) in lines.iter().enumerate() {
        let ev: WorkerEvent = match serde_json::from_str(line) {
            Ok(ev) => ev,
            Err(_) if i == last => break,
            Err(e) => bail!("{}:{}: {e}: {line}", path.display(), i + 1),
        };
        h.events.push(match ev {
            WorkerEvent::Invoke {
                id: op,
                generation,
                session,
                lock,
                token,
                at,
            } => Event::Invoke {
                id: id(op),
                actor: actor(generation),
                session,
                lock,
                op: match token {
                    None => OpKind::Acquire,
                    Some(token) => OpKind::Release { token },
                },
                at: rel(at),
            },
            WorkerEvent::Return { id: op, ret, at } => Event::Return {
                id: id(op),
                ret: match ret {
                    WorkerRet::Granted { token } => Ret::Granted { token },
                    WorkerRet::NotGranted => Ret::NotGranted,
                    WorkerRet::Released => Ret::Released,
                    WorkerRet::NotHolder => Ret::NotHolder,
                },
                at: rel(at),
            },
            WorkerEvent::HoldCheck {
                generation,
                session,
                lock,
                token,
                at,
            } => Event::HoldCheck {
                actor: actor(generation),
                session,
                lock,
                token,
                at: rel(at),
            },
            WorkerEvent::Lost {
                generation,
                session,
                at,
            } => Event::Lost {
                actor: actor(generation),
                session,
                at: rel(at),
            },
            WorkerEvent::Postgres { written, .. } => {
                *postgres.entry(written).or_default() += 1;
                continue;
            }
        });
    }
    Ok(lines.len())
}

/// Sorts the merged events of every worker by time (stable: one worker's events at one
/// instant keep their order), as the checkers read them in execution order.
pub fn sort_events(h: &mut HistoryData) {
    let at = |e: &Event| match e {
        Event::Invoke { at, .. }
        | Event::Return { at, .. }
        | Event::HoldCheck { at, .. }
        | Event::Lost { at, .. } => *at,
    };
    h.events.sort_by_key(at);
    h.resource.sort_by_key(|op| op.at);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_file_reads_into_events_with_unique_ids_and_a_torn_last_line_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.jsonl");
        let lines = [
            serde_json::to_string(&WorkerEvent::Invoke {
                id: 1,
                generation: 1,
                session: 7,
                lock: "a".into(),
                token: None,
                at: 5_000_000_000,
            })
            .unwrap(),
            serde_json::to_string(&WorkerEvent::Return {
                id: 1,
                ret: WorkerRet::Granted { token: 12 },
                at: 5_100_000_000,
            })
            .unwrap(),
            serde_json::to_string(&WorkerEvent::Postgres {
                lock: "a".into(),
                token: 12,
                written: Written::Stale,
                at: 5_200_000_000,
            })
            .unwrap(),
            "{\"ev\":\"hold_ch".to_owned(),
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let mut h = HistoryData::default();
        let mut postgres = BTreeMap::new();
        let n = read_worker(&path, 3, Duration::from_secs(4), &mut h, &mut postgres).unwrap();
        assert_eq!(n, 4);
        assert_eq!(h.events.len(), 2);
        assert_eq!(postgres, BTreeMap::from([(Written::Stale, 1)]));
        match &h.events[0] {
            Event::Invoke { id, actor, at, .. } => {
                assert_eq!(*id, (3 << 40) | 1);
                assert_eq!(actor.client, 3);
                assert_eq!(*at, Duration::from_secs(1));
            }
            e => panic!("unexpected {e:?}"),
        }
    }

    #[test]
    fn a_bad_line_before_the_last_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.jsonl");
        std::fs::write(
            &path,
            "not json\n{\"ev\":\"lost\",\"generation\":1,\"session\":1,\"at\":1}\n",
        )
        .unwrap();
        let err = read_worker(
            &path,
            1,
            Duration::ZERO,
            &mut HistoryData::default(),
            &mut BTreeMap::new(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("w.jsonl:1"), "{err}");
    }
}
