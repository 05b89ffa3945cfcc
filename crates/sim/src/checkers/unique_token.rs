//! A token acknowledged to one client is never acknowledged to another for the same lock.

use std::collections::BTreeMap;

use super::{ms, Violation};
use crate::history::{HistoryData, OpKind, Ret};

pub fn check(h: &HistoryData) -> Vec<Violation> {
    let mut granted: BTreeMap<(&str, u64), (u64, std::time::Duration)> = BTreeMap::new();
    let mut out = Vec::new();
    let ops = h.operations();
    for op in &ops {
        let (OpKind::Acquire, Some((Ret::Granted { token }, at))) = (&op.op, &op.ret) else {
            continue;
        };
        match granted.get(&(op.lock.as_str(), *token)) {
            Some((session, first)) if *session != op.session => out.push(Violation {
                checker: "unique_token",
                message: format!(
                    "lock {:?} token {token} acknowledged to session {session} at {} and to \
                     session {} at {}",
                    op.lock,
                    ms(*first),
                    op.session,
                    ms(*at)
                ),
            }),
            Some(_) => {}
            None => {
                granted.insert((op.lock.as_str(), *token), (op.session, *at));
            }
        }
    }
    out
}
