//! A small table-driven DSL for the lock table: each step is (entry index, command, expected
//! outcome, expected handoffs, expected dropped waits), applied in order, with
//! `check_invariants()` after every step.
//!
//! Sessions are named by labels ("a", "b", ...); `open` binds a label to the id the table
//! assigns. A label ending in `!` ("a!") stands for that session with a wrong secret.

#![allow(dead_code)] // each test file uses a different part of the DSL

use std::collections::BTreeMap;

use latchkey_core::codec::encode_table;
use latchkey_core::*;

pub const TTL_MS: u64 = 15_000;

/// Apply one entry and check every structural invariant afterwards.
pub fn apply_checked(table: &mut LockTable, index: u64, cmd: &Command) -> Applied {
    let applied = table.apply(index, cmd);
    if let Err(e) = table.check_invariants() {
        panic!("invariant broken after entry {index} ({cmd:?}): {e}");
    }
    applied
}

#[derive(Clone, Debug)]
pub enum Cmd {
    Open(&'static str, u64),
    Close(&'static str),
    Expire(Vec<&'static str>),
    Acquire {
        who: &'static str,
        seq: u64,
        name: String,
        wait_ms: u64,
    },
    Cancel(&'static str, u64),
    ExpireWaits,
    Release {
        who: &'static str,
        seq: u64,
        name: String,
        token: u64,
    },
}

/// Acquire and wait in the queue if the lock is held.
pub fn acq(who: &'static str, seq: u64, name: &str) -> Cmd {
    Cmd::Acquire {
        who,
        seq,
        name: name.to_owned(),
        wait_ms: latchkey_core::limits::WAIT_TIMEOUT_MS_MAX,
    }
}

/// Try-lock: acquire without waiting.
pub fn try_acq(who: &'static str, seq: u64, name: &str) -> Cmd {
    Cmd::Acquire {
        who,
        seq,
        name: name.to_owned(),
        wait_ms: 0,
    }
}

pub fn rel(who: &'static str, seq: u64, name: &str, token: u64) -> Cmd {
    Cmd::Release {
        who,
        seq,
        name: name.to_owned(),
        token,
    }
}

/// Acquire, waiting in the queue for at most `wait_ms` (entries are 10 ms apart).
#[allow(dead_code)]
pub fn acq_for(who: &'static str, seq: u64, name: &str, wait_ms: u64) -> Cmd {
    Cmd::Acquire {
        who,
        seq,
        name: name.to_owned(),
        wait_ms,
    }
}

pub fn cancel(who: &'static str, seq: u64) -> Cmd {
    Cmd::Cancel(who, seq)
}

pub fn close(who: &'static str) -> Cmd {
    Cmd::Close(who)
}

#[derive(Clone, Debug)]
pub enum Want {
    Is(Outcome),
    /// `SessionCreated` with the id of this step's index.
    Created,
    /// `SessionsExpired` with these labels' ids, in this order.
    Expired(Vec<&'static str>),
}

#[derive(Clone, Debug)]
pub struct Step {
    pub index: u64,
    pub cmd: Cmd,
    pub want: Want,
    /// (lock, session label, seq); the token is always the step's index.
    pub hands: Vec<(String, &'static str, u64)>,
    pub drops: Vec<(&'static str, u64)>,
}

impl Step {
    pub fn hands(mut self, hands: &[(&str, &'static str, u64)]) -> Step {
        self.hands = hands
            .iter()
            .map(|&(n, who, seq)| (n.to_owned(), who, seq))
            .collect();
        self
    }

    pub fn drops(mut self, drops: &[(&'static str, u64)]) -> Step {
        self.drops = drops.to_vec();
        self
    }
}

pub fn step(index: u64, cmd: Cmd, outcome: Outcome) -> Step {
    Step {
        index,
        cmd,
        want: Want::Is(outcome),
        hands: Vec::new(),
        drops: Vec::new(),
    }
}

/// Open session `who` at `index` with the default TTL.
pub fn open(index: u64, who: &'static str) -> Step {
    Step {
        index,
        cmd: Cmd::Open(who, TTL_MS),
        want: Want::Created,
        hands: Vec::new(),
        drops: Vec::new(),
    }
}

/// Expire `who` at `index`; `live` are the labels the outcome must list.
pub fn expire(index: u64, who: &[&'static str], live: &[&'static str]) -> Step {
    Step {
        index,
        cmd: Cmd::Expire(who.to_vec()),
        want: Want::Expired(live.to_vec()),
        hands: Vec::new(),
        drops: Vec::new(),
    }
}

pub fn granted(token: u64) -> Outcome {
    Outcome::Granted { token }
}

pub fn queued(position: u32) -> Outcome {
    Outcome::Queued { position }
}

pub fn rejected(r: Rejection) -> Outcome {
    Outcome::Rejected(r)
}

/// Drives a `LockTable` with sessions named by label, for the table-driven tests (not the
/// simulation, which is `crates/sim`).
#[derive(Default)]
pub struct TableDriver {
    pub table: LockTable,
    keys: BTreeMap<&'static str, SessionKey>,
}

impl TableDriver {
    pub fn new() -> TableDriver {
        TableDriver::default()
    }

    /// The key of `who`; `"x!"` is `x` with a wrong secret.
    pub fn key(&self, who: &str) -> SessionKey {
        let (label, wrong) = match who.strip_suffix('!') {
            Some(l) => (l, true),
            None => (who, false),
        };
        let mut key = *self
            .keys
            .get(label)
            .unwrap_or_else(|| panic!("session {label:?} was never opened"));
        if wrong {
            key.secret ^= 0x5eed;
        }
        key
    }

    pub fn id(&self, who: &str) -> SessionId {
        self.key(who).id
    }

    pub fn label(&self, id: SessionId) -> &'static str {
        self.keys
            .iter()
            .find(|(_, k)| k.id == id)
            .map(|(l, _)| *l)
            .unwrap_or_else(|| panic!("no label for session {id}"))
    }

    pub fn command(&self, index: u64, cmd: &Cmd) -> Command {
        let op = match cmd {
            Cmd::Open(who, ttl_ms) => Op::CreateSession {
                ttl_ms: *ttl_ms,
                secret: secret_of(who),
            },
            Cmd::Close(who) => Op::CloseSession {
                session: self.key(who),
            },
            Cmd::Expire(who) => Op::ExpireSessions {
                ids: who.iter().map(|w| self.id(w)).collect(),
            },
            Cmd::Acquire {
                who,
                seq,
                name,
                wait_ms,
            } => Op::Acquire {
                session: self.key(who),
                seq: *seq,
                name: name.clone(),
                wait_ms: *wait_ms,
            },
            Cmd::ExpireWaits => Op::ExpireWaits,
            Cmd::Cancel(who, seq) => Op::CancelWait {
                session: self.key(who),
                seq: *seq,
            },
            Cmd::Release {
                who,
                seq,
                name,
                token,
            } => Op::Release {
                session: self.key(who),
                seq: *seq,
                name: name.clone(),
                token: *token,
            },
        };
        Command {
            now_ms: now_ms_at(index),
            op,
        }
    }

    /// Apply `steps` in order, checking each step's outcome, handoffs and dropped waits, and the
    /// table's invariants after each.
    pub fn run(&mut self, steps: &[Step]) {
        for s in steps {
            assert!(
                s.index > self.table.last_index(),
                "bad test: step {} does not follow {}",
                s.index,
                self.table.last_index()
            );
            let cmd = self.command(s.index, &s.cmd);
            let got = apply_checked(&mut self.table, s.index, &cmd);
            if let (Cmd::Open(who, _), Outcome::SessionCreated { id, .. }) = (&s.cmd, &got.outcome)
            {
                let secret = secret_of(who);
                self.keys.insert(who, SessionKey { id: *id, secret });
            }
            let want = match &s.want {
                Want::Is(o) => o.clone(),
                Want::Created => {
                    let Cmd::Open(_, ttl_ms) = s.cmd else {
                        panic!("bad test: Want::Created for {:?}", s.cmd)
                    };
                    Outcome::SessionCreated {
                        id: SessionId(s.index),
                        ttl_ms,
                    }
                }
                Want::Expired(live) => Outcome::SessionsExpired {
                    ids: live.iter().map(|w| self.id(w)).collect(),
                },
            };
            assert_eq!(
                got.outcome, want,
                "outcome of step {} ({:?})",
                s.index, s.cmd
            );
            let hands: Vec<Handoff> = s
                .hands
                .iter()
                .map(|(name, who, seq)| Handoff {
                    name: name.clone(),
                    session: self.id(who),
                    seq: *seq,
                    token: s.index,
                })
                .collect();
            assert_eq!(
                got.handoffs, hands,
                "handoffs of step {} ({:?})",
                s.index, s.cmd
            );
            let drops: Vec<(SessionId, u64)> =
                s.drops.iter().map(|(w, seq)| (self.id(w), *seq)).collect();
            assert_eq!(
                got.dropped_waits, drops,
                "dropped waits of step {} ({:?})",
                s.index, s.cmd
            );
        }
    }

    /// The holder of `name` as (label, token), and the number of waiters.
    pub fn holder(&self, name: &str) -> Option<(&'static str, u64, u32)> {
        self.table.describe(name).map(|info| {
            let h = info.holder.expect("a described lock is held");
            (self.label(h.session), h.token, info.waiters)
        })
    }

    pub fn state(&self, who: &str, seq: u64) -> Option<RequestState> {
        self.table.request_state(self.id(who), seq)
    }

    pub fn encoding(&self) -> Vec<u8> {
        encode_table(&self.table)
    }
}

pub fn secret_of(who: &str) -> u64 {
    who.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

pub fn now_ms_at(index: u64) -> u64 {
    1_700_000_000_000 + index * 10
}
