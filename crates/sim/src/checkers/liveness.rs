//! Liveness after the faults heal: every acquire invoked once the cluster had time to settle
//! (leases of clients that died during the faults ran out, a leader was elected) is granted
//! within its wait, and no waiter from before that is left waiting to the end.

use super::{ms, CheckConfig, Violation};
use crate::history::{HistoryData, OpKind, Ret};

pub fn check(h: &HistoryData, config: &CheckConfig) -> Vec<Violation> {
    let Some(healed) = h.healed_at else {
        return Vec::new();
    };
    let from = healed + config.settle;
    let mut out = Vec::new();
    let mut judged = 0;
    let ops = h.operations();
    for (i, op) in ops.iter().enumerate() {
        // A waiter from before the cluster settled that was never answered, while its client
        // did nothing else afterwards (it did not lose its session and start another): it
        // waited through the whole liveness phase.
        if op.op == OpKind::Acquire
            && op.invoked < from
            && op.ret.is_none()
            && !ops[i + 1..]
                .iter()
                .any(|o| o.actor.client == op.actor.client)
        {
            out.push(Violation {
                checker: "liveness",
                message: format!(
                    "{:?} asked for lock {:?} at {}, before the faults healed at {}, and was \
                     still waiting when the run ended",
                    op.actor,
                    op.lock,
                    ms(op.invoked),
                    ms(healed)
                ),
            });
        }
        if op.op != OpKind::Acquire || op.invoked < from || op.invoked > config.liveness_until {
            continue;
        }
        judged += 1;
        match &op.ret {
            Some((Ret::Granted { .. }, _)) => {}
            other => out.push(Violation {
                checker: "liveness",
                message: format!(
                    "{:?} asked for lock {:?} at {}, {} after the faults healed, and got {:?}",
                    op.actor,
                    op.lock,
                    ms(op.invoked),
                    ms(op.invoked - healed),
                    other
                ),
            }),
        }
    }
    if judged == 0 {
        out.push(Violation {
            checker: "liveness",
            message: format!(
                "no acquire was invoked between {} and {}: the clients made no progress",
                ms(from),
                ms(config.liveness_until)
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::check;
    use crate::checkers::testkit::{actor, messages, t, Hist};
    use crate::checkers::CheckConfig;
    use crate::history::{OpKind, Ret};

    const CONFIG: CheckConfig = CheckConfig {
        settle: std::time::Duration::from_secs(2),
        liveness_until: std::time::Duration::from_secs(20),
    };

    /// Faults heal at 10 s; acquires from 12 s on are judged. During the faults client 1's wait
    /// ran out, client 2 lost its session while waiting and came back with a new one.
    fn base() -> Hist {
        let mut h = Hist::default();
        h.h.healed_at = Some(t(10_000));
        h.op(
            1,
            "a",
            OpKind::Acquire,
            5_000,
            Some((Ret::NotGranted, 7_000)),
        );
        h.op(2, "a", OpKind::Acquire, 6_000, None);
        let mut next = actor(2);
        next.generation = 2;
        h.op_in(
            next,
            9,
            "a",
            OpKind::Acquire,
            11_000,
            Some((Ret::Granted { token: 40 }, 11_100)),
        );
        h.granted(1, "a", 13_000, 45, 13_200);
        // Invoked as the run winds down: not judged.
        h.op(3, "a", OpKind::Acquire, 21_000, None);
        h
    }

    #[test]
    fn accepts_a_history_where_every_waiter_after_the_heal_is_granted() {
        assert!(check(&base().h, &CONFIG).is_empty());
    }

    #[test]
    fn rejects_a_waiter_after_the_heal_that_is_not_granted() {
        let mut h = base();
        h.op(
            4,
            "a",
            OpKind::Acquire,
            14_000,
            Some((Ret::NotGranted, 19_000)),
        );
        h.op(5, "a", OpKind::Acquire, 15_000, None);
        let m = messages(&check(&h.h, &CONFIG), "liveness");
        assert_eq!(m.len(), 2, "{m:?}");
        assert!(
            m[0].contains("NotGranted") && m[1].contains("None"),
            "{m:?}"
        );
    }

    /// Regression: a waiter that started during the faults and was never answered escaped the
    /// checker, which only judged acquires invoked after the settle time.
    #[test]
    fn rejects_a_waiter_from_before_the_heal_never_granted() {
        let mut h = base();
        h.op(4, "a", OpKind::Acquire, 9_000, None);
        let m = messages(&check(&h.h, &CONFIG), "liveness");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(m[0].contains("still waiting"), "{m:?}");
    }

    #[test]
    fn rejects_a_run_where_no_acquire_was_judged() {
        let mut h = Hist::default();
        h.h.healed_at = Some(t(10_000));
        h.granted(1, "a", 5_000, 5, 5_100);
        let m = messages(&check(&h.h, &CONFIG), "liveness");
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(m[0].contains("no progress"), "{m:?}");
    }
}
