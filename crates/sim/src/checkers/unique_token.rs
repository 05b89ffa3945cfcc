//! A token acknowledged to one client is never acknowledged to another for the same lock, but
//! to readers granted together (who share one, issue #32).

use std::collections::BTreeMap;

use super::{ms, Violation};
use crate::history::{HistoryData, OpKind, Ret};

pub fn check(h: &HistoryData) -> Vec<Violation> {
    let mut granted: BTreeMap<(&str, u64), (u64, latchkey_core::Mode, std::time::Duration)> =
        BTreeMap::new();
    let mut out = Vec::new();
    let ops = h.operations();
    for op in &ops {
        let (OpKind::Acquire, Some((Ret::Granted { token }, at))) = (&op.op, &op.ret) else {
            continue;
        };
        match granted.get(&(op.lock.as_str(), *token)) {
            Some((_, latchkey_core::Mode::Shared, _)) if op.mode == latchkey_core::Mode::Shared => {
            }
            Some((session, _, first)) if *session != op.session => out.push(Violation {
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
                granted.insert((op.lock.as_str(), *token), (op.session, op.mode, *at));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::check;
    use crate::checkers::testkit::{actor, messages, Hist};
    use crate::history::{OpKind, Ret};

    #[test]
    fn accepts_distinct_tokens_and_a_repeated_answer_to_one_session() {
        let mut h = Hist::default();
        h.granted(1, "a", 100, 5, 110);
        h.released(1, "a", 5, 120, 130);
        h.granted(2, "a", 140, 7, 150);
        // The same session asked again (a retried request) and got the same grant.
        let again = Some((Ret::Granted { token: 7 }, 170));
        h.op_in(actor(2), 2, "a", OpKind::Acquire, 160, again);
        assert!(check(&h.h).is_empty());
    }

    #[test]
    fn rejects_one_token_acknowledged_to_two_sessions_for_one_lock() {
        let mut h = Hist::default();
        h.granted(1, "a", 100, 5, 110);
        h.granted(2, "a", 105, 5, 120);
        let m = messages(&check(&h.h), "unique_token");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].contains("token 5") && m[0].contains("session 2"),
            "{m:?}"
        );
    }

    #[test]
    fn rejects_one_token_acknowledged_to_two_generations_of_one_client() {
        let mut h = Hist::default();
        h.granted(1, "a", 100, 5, 110);
        let mut next = actor(1);
        next.generation = 2;
        h.op_in(
            next,
            9,
            "a",
            OpKind::Acquire,
            200,
            Some((Ret::Granted { token: 5 }, 210)),
        );
        assert_eq!(messages(&check(&h.h), "unique_token").len(), 1);
    }
}
