//! Every acknowledged grant and release is reflected in the cluster after failovers and a
//! restart of every node:
//! - an acknowledged grant's token is the index of a committed entry that could make that
//!   grant (an Acquire by that session for that lock, or a release, cancel, close or expiry
//!   that handed the lock over);
//! - no committed entry was ever replaced by another (recorded by the log stores);
//! - after the final restart of every node, a lock is not held under a token whose release was
//!   acknowledged, nor under a token older than the newest acknowledged grant; and a lock whose
//!   newest acknowledged grant was neither released nor ended by its session's end is still held.

use std::collections::{BTreeMap, BTreeSet};

use latchkey_core::Op;

use super::{ms, Violation};
use crate::history::{HistoryData, OpKind, Ret};

fn v(message: String) -> Violation {
    Violation {
        checker: "durability",
        message,
    }
}

pub fn check(h: &HistoryData) -> Vec<Violation> {
    let mut out: Vec<Violation> = h.recorded_violations.iter().cloned().map(v).collect();
    let ops = h.operations();
    let ended: BTreeSet<u64> = h
        .committed_session_ends()
        .into_iter()
        .flat_map(|e| e.sessions)
        .collect();
    let mut newest: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    let mut released: BTreeSet<(&str, u64)> = BTreeSet::new();
    let mut release_tried: BTreeSet<(&str, u64)> = BTreeSet::new();
    for op in &ops {
        match (&op.op, &op.ret) {
            (OpKind::Acquire, Some((Ret::Granted { token }, at))) => {
                let e = newest.entry(op.lock.as_str()).or_insert((0, 0));
                if *token > e.0 {
                    *e = (*token, op.session);
                }
                let ok = match h.committed.get(token).and_then(|c| c.op.as_ref()) {
                    Some(Op::Acquire { session, name, .. }) => {
                        session.id.0 == op.session && *name == op.lock
                    }
                    Some(
                        Op::Release { .. }
                        | Op::CancelWait { .. }
                        | Op::CloseSession { .. }
                        | Op::ExpireSessions { .. },
                    ) => true,
                    _ => false,
                };
                if !ok {
                    out.push(v(format!(
                        "grant of lock {:?} to session {} with token {token}, acknowledged at {}, \
                         is not backed by a committed entry at index {token} (found {:?})",
                        op.lock,
                        op.session,
                        ms(*at),
                        h.committed.get(token).map(|c| &c.op)
                    )));
                }
            }
            (OpKind::Release { token }, ret) => {
                release_tried.insert((op.lock.as_str(), *token));
                if let Some((Ret::Released, _)) = ret {
                    released.insert((op.lock.as_str(), *token));
                }
            }
            _ => {}
        }
    }
    for (lock, holder) in &h.final_holders {
        let newest = newest.get(lock.as_str()).copied();
        match (holder, newest) {
            (Some((_, token)), _) if released.contains(&(lock.as_str(), *token)) => out.push(v(
                format!("after the restart lock {lock:?} is held under token {token}, whose release was acknowledged"),
            )),
            (Some((_, token)), Some((g, _))) if *token < g => out.push(v(format!(
                "after the restart lock {lock:?} is held under token {token}, older than the \
                 acknowledged grant {g}"
            ))),
            (None, Some((g, session)))
                if !release_tried.contains(&(lock.as_str(), g)) && !ended.contains(&session) =>
            {
                out.push(v(format!(
                    "after the restart lock {lock:?} is free, but its newest acknowledged grant \
                     (token {g}, session {session}) was never released and its session never ended"
                )))
            }
            _ => {}
        }
    }
    out
}
