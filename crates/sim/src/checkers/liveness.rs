//! Liveness after the faults heal: every acquire invoked once the cluster had time to settle
//! (leases of clients that died during the faults ran out, a leader was elected) is granted
//! within its wait.

use super::{ms, CheckConfig, Violation};
use crate::history::{HistoryData, OpKind, Ret};

pub fn check(h: &HistoryData, config: &CheckConfig) -> Vec<Violation> {
    let Some(healed) = h.healed_at else {
        return Vec::new();
    };
    let from = healed + config.settle;
    let mut out = Vec::new();
    let mut judged = 0;
    for op in h.operations() {
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
