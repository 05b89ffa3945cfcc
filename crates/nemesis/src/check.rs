//! The checks of a real run's history.
//!
//! A run has no record of what the servers appended and committed (the simulation's probes
//! see inside the members; here they are real processes), so it is judged from what the
//! clients and the resource recorded, all on one machine-wide clock:
//! - [`hold_overlap`]: no two holders of one lock at one real time, each holder's time being
//!   from the moment it learned of its grant to its last hold check (the last moment it acted
//!   as the holder);
//! - [`token_order`]: a grant that began after another ended has the higher token;
//! - the simulation's `unique_token` (no token acknowledged to two sessions), `fencing_order`
//!   and `no_overlap` (the resource's accepted sections never overlapped, no update was lost;
//!   since this resource refuses any token below the highest it saw, those two guard the
//!   harness more than latchkey, whose bugs show in the checks above first);
//! - the simulation's `liveness`: after the last fault healed and the cluster settled, every
//!   acquire is granted within its wait.
//!
//! - [`linearizable`]: each lock's history is linearizable against the simulation's lock
//!   model, searched as the simulation's `linearizable` checker searches it. The simulation
//!   knows when each session end (an expiry or a close) was appended and committed; a run
//!   has no record of the servers' entries, so here the search may place a session's end
//!   anywhere after its first acquire of the lock, or nowhere. It still finds a grant made
//!   while the holder neither released nor could have been ended, a release answered as done
//!   after the lock went to another, a try that was refused while nobody held the lock, and a
//!   token lower than an earlier grant's.
//!
//! What this cannot judge without the servers' records: when the servers ended each session
//! (so whether an end came too early against its lease), and the lease checks (server-side
//! expiries against client deadlines). The simulation checks those on every seed.

use std::collections::BTreeMap;
use std::time::Duration;

use latchkey_sim::checkers::linearizable::EndWindow;
use latchkey_sim::checkers::{CheckConfig, Violation};
use latchkey_sim::history::{Actor, Event, HistoryData, OpKind, Ret};

fn ms(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

/// Every check of a run.
pub fn check(h: &HistoryData, config: &CheckConfig) -> Vec<Violation> {
    let mut out = hold_overlap(h);
    out.extend(token_order(h));
    out.extend(linearizable(h));
    out.extend(latchkey_sim::checkers::check_clients_and_resource(h));
    out.extend(latchkey_sim::checkers::check_liveness(h, config));
    out
}

/// One holder's time with a lock.
#[derive(Debug)]
struct Holding {
    actor: Actor,
    token: u64,
    from: Duration,
    to: Duration,
}

/// No two holders of one lock at one real time.
pub fn hold_overlap(h: &HistoryData) -> Vec<Violation> {
    // (lock, actor, token) -> (granted at, last hold check)
    let mut granted: BTreeMap<u64, (Actor, String)> = BTreeMap::new();
    let mut spans: BTreeMap<(String, Actor, u64), (Duration, Option<Duration>)> = BTreeMap::new();
    for e in &h.events {
        match e {
            Event::Invoke {
                id,
                actor,
                lock,
                op: OpKind::Acquire,
                ..
            } => {
                granted.insert(*id, (*actor, lock.clone()));
            }
            Event::Return {
                id,
                ret: Ret::Granted { token },
                at,
            } => {
                if let Some((actor, lock)) = granted.remove(id) {
                    spans.insert((lock, actor, *token), (*at, None));
                }
            }
            Event::HoldCheck {
                actor,
                lock,
                token,
                at,
                ..
            } => {
                if let Some((_, last)) = spans.get_mut(&(lock.clone(), *actor, *token)) {
                    *last = Some((*last).unwrap_or(*at).max(*at));
                }
            }
            _ => {}
        }
    }
    let mut by_lock: BTreeMap<&str, Vec<Holding>> = BTreeMap::new();
    for ((lock, actor, token), (from, to)) in &spans {
        if let Some(to) = to {
            by_lock.entry(lock.as_str()).or_default().push(Holding {
                actor: *actor,
                token: *token,
                from: *from,
                to: *to,
            });
        }
    }
    let mut out = Vec::new();
    for (lock, mut list) in by_lock {
        list.sort_by_key(|s| s.from);
        // The holding that reaches furthest so far: each holding must start after it ends.
        let mut reach: Option<&Holding> = None;
        for s in &list {
            if let Some(r) = reach {
                if s.from <= r.to {
                    out.push(Violation {
                        checker: "hold_overlap",
                        message: format!(
                            "lock {lock:?}: {:?} held it with token {} from {} to {}, and {:?} \
                             with token {} from {}",
                            r.actor,
                            r.token,
                            ms(r.from),
                            ms(r.to),
                            s.actor,
                            s.token,
                            ms(s.from)
                        ),
                    });
                }
            }
            if reach.is_none_or(|r| s.to > r.to) {
                reach = Some(s);
            }
        }
    }
    out
}

/// A grant invoked after another grant of the same lock was answered has a higher token.
pub fn token_order(h: &HistoryData) -> Vec<Violation> {
    struct Grant {
        actor: Actor,
        invoked: Duration,
        answered: Duration,
        token: u64,
    }
    let mut by_lock: BTreeMap<String, Vec<Grant>> = BTreeMap::new();
    for op in h.operations() {
        if let (OpKind::Acquire, Some((Ret::Granted { token }, answered))) = (&op.op, op.ret) {
            by_lock.entry(op.lock).or_default().push(Grant {
                actor: op.actor,
                invoked: op.invoked,
                answered,
                token,
            });
        }
    }
    let mut out = Vec::new();
    for (lock, grants) in by_lock {
        let mut answered: Vec<&Grant> = grants.iter().collect();
        answered.sort_by_key(|g| g.answered);
        let mut invoked: Vec<&Grant> = grants.iter().collect();
        invoked.sort_by_key(|g| g.invoked);
        // Sweep: `top` is the grant with the highest token among those answered before the
        // current grant was invoked.
        let mut top: Option<&Grant> = None;
        let mut next = answered.iter().peekable();
        for g in invoked {
            while let Some(a) = next.next_if(|a| a.answered < g.invoked) {
                if top.is_none_or(|t| a.token > t.token) {
                    top = Some(a);
                }
            }
            if let Some(t) = top {
                if g.token <= t.token {
                    out.push(Violation {
                        checker: "token_order",
                        message: format!(
                            "lock {lock:?}: {:?} was granted token {} at {}, after {:?} had \
                             been granted token {} at {}",
                            g.actor,
                            g.token,
                            ms(g.answered),
                            t.actor,
                            t.token,
                            ms(t.answered)
                        ),
                    });
                }
            }
        }
    }
    out
}

/// Each lock's history is linearizable against the lock model, with every session's end
/// placed by the search (see the module's docs).
///
/// A session is named by its worker and generation here, not by its id: the CLI's sessions
/// are numbered by the worker ([`crate::cli_worker`]), and with several Raft groups a session
/// id is one group's (two groups may give one id to two workers' sessions).
pub fn linearizable(h: &HistoryData) -> Vec<Violation> {
    let thread = |actor: &Actor| (u64::from(actor.client) << 32) | u64::from(actor.generation);
    // Built field by field: the history's own counters are private to the simulation.
    let mut renamed = HistoryData::default();
    renamed.events.extend(h.events.iter().cloned().map(|mut e| {
        match &mut e {
            Event::Invoke { actor, session, .. }
            | Event::HoldCheck { actor, session, .. }
            | Event::Lost { actor, session, .. } => *session = thread(actor),
            Event::Return { .. } => {}
        }
        e
    }));
    renamed.modes.clone_from(&h.modes);
    // Per (lock, session): its first acquire of the lock, and whether an end of the session
    // could matter to the lock (it held it without an answered release, or its acquire was not
    // answered: it may hold it still).
    let mut first: BTreeMap<(String, u64), Duration> = BTreeMap::new();
    let mut held: BTreeMap<(String, u64), Vec<u64>> = BTreeMap::new();
    let mut released: std::collections::BTreeSet<(String, u64, u64)> = Default::default();
    let mut unanswered: std::collections::BTreeSet<(String, u64)> = Default::default();
    for op in renamed.operations() {
        let key = (op.lock.clone(), op.session);
        match (&op.op, &op.ret) {
            (OpKind::Acquire, ret) => {
                let at = first.entry(key.clone()).or_insert(op.invoked);
                *at = (*at).min(op.invoked);
                match ret {
                    Some((Ret::Granted { token }, _)) => held.entry(key).or_default().push(*token),
                    None => {
                        unanswered.insert(key);
                    }
                    Some(_) => {}
                }
            }
            (OpKind::Release { token }, Some((Ret::Released, _))) => {
                released.insert((op.lock, op.session, *token));
            }
            (OpKind::Release { .. }, _) => {}
        }
    }
    let mut ends: BTreeMap<String, Vec<EndWindow>> = BTreeMap::new();
    for ((lock, session), from) in first {
        let key = (lock, session);
        let still_held = held.get(&key).is_some_and(|tokens| {
            tokens
                .iter()
                .any(|&t| !released.contains(&(key.0.clone(), session, t)))
        });
        if still_held || unanswered.contains(&key) {
            ends.entry(key.0).or_default().push(EndWindow {
                id: session,
                sessions: vec![session],
                from,
                by: None,
            });
        }
    }
    latchkey_sim::checkers::linearizable::check_with_ends(&renamed, |lock, _| {
        ends.get(lock).cloned().unwrap_or_default()
    })
}

/// The checks of the workers' histories (not the resources') again, on what a kept run left
/// in `dir` (`w1.jsonl`, `w2.jsonl`, ...): the operations read and the violations found.
pub fn kept_run(dir: &std::path::Path) -> anyhow::Result<(usize, Vec<Violation>)> {
    let mut h = HistoryData::default();
    let mut postgres = BTreeMap::new();
    let mut read = 0;
    // Workers of both kinds are numbered from 1 without gaps.
    for client in 1..=2 * crate::limits::WORKERS_MAX {
        let path = dir.join(format!("w{client}.jsonl"));
        if !path.exists() {
            break;
        }
        crate::record::read_worker(&path, client, Duration::ZERO, &mut h, &mut postgres)?;
        read += 1;
    }
    anyhow::ensure!(
        read > 0,
        "no worker history (w1.jsonl) in {}",
        dir.display()
    );
    crate::record::sort_events(&mut h);
    let operations = h
        .events
        .iter()
        .filter(|e| matches!(e, Event::Invoke { .. }))
        .count();
    let mut out = hold_overlap(&h);
    out.extend(token_order(&h));
    out.extend(linearizable(&h));
    Ok((operations, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    fn actor(client: u32) -> Actor {
        Actor {
            client,
            generation: 1,
        }
    }

    /// Client `c` asks at `ask`, is granted `token` at `got`, and checks its hold at `checks`.
    fn holding(
        h: &mut HistoryData,
        c: u32,
        id: u64,
        ask: u64,
        got: u64,
        token: u64,
        checks: &[u64],
    ) {
        h.events.push(Event::Invoke {
            id,
            actor: actor(c),
            session: u64::from(c),
            lock: "a".into(),
            op: OpKind::Acquire,
            at: t(ask),
        });
        h.events.push(Event::Return {
            id,
            ret: Ret::Granted { token },
            at: t(got),
        });
        for &at in checks {
            h.events.push(Event::HoldCheck {
                actor: actor(c),
                session: u64::from(c),
                lock: "a".into(),
                token,
                at: t(at),
            });
        }
    }

    fn sorted(mut h: HistoryData) -> HistoryData {
        crate::record::sort_events(&mut h);
        h
    }

    #[test]
    fn holders_one_after_another_pass() {
        let mut h = HistoryData::default();
        holding(&mut h, 1, 1, 0, 10, 5, &[11, 300]);
        holding(&mut h, 2, 2, 20, 400, 9, &[401, 700]);
        let h = sorted(h);
        assert!(hold_overlap(&h).is_empty());
        assert!(token_order(&h).is_empty());
    }

    #[test]
    fn a_holder_that_acts_after_the_next_was_granted_is_caught() {
        let mut h = HistoryData::default();
        // Client 1 paused from 300 ms to 5 s and then still acted as the holder.
        holding(&mut h, 1, 1, 0, 10, 5, &[11, 5_000]);
        holding(&mut h, 2, 2, 20, 4_000, 9, &[4_001, 4_200]);
        let v = hold_overlap(&sorted(h));
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].message.contains("token 5 from 0.010s to 5.000s"),
            "{}",
            v[0]
        );
    }

    #[test]
    fn a_lower_token_granted_after_a_higher_was_answered_is_caught() {
        let mut h = HistoryData::default();
        holding(&mut h, 1, 1, 0, 10, 9, &[11]);
        holding(&mut h, 2, 2, 20, 400, 7, &[401]);
        let v = token_order(&sorted(h));
        assert_eq!(v.len(), 1, "{v:?}");
        // Concurrent grants (the second asked before the first was answered) are not ordered.
        let mut h = HistoryData::default();
        holding(&mut h, 1, 1, 0, 10, 9, &[]);
        holding(&mut h, 2, 2, 5, 400, 7, &[]);
        assert!(token_order(&sorted(h)).is_empty());
    }

    /// Client `c` (session `session`) invokes `op` on lock "a" at `ask`, answered `ret` at
    /// `got` (or never).
    fn op(
        h: &mut HistoryData,
        (c, session, id): (u32, u64, u64),
        op: OpKind,
        ask: u64,
        ret: Option<(Ret, u64)>,
    ) {
        h.events.push(Event::Invoke {
            id,
            actor: actor(c),
            session,
            lock: "a".into(),
            op,
            at: t(ask),
        });
        if let Some((ret, got)) = ret {
            h.events.push(Event::Return {
                id,
                ret,
                at: t(got),
            });
        }
    }

    fn acquire(
        h: &mut HistoryData,
        c: u32,
        session: u64,
        id: u64,
        ask: u64,
        ret: Option<(Ret, u64)>,
    ) {
        op(h, (c, session, id), OpKind::Acquire, ask, ret);
    }

    fn release(
        h: &mut HistoryData,
        c: u32,
        session: u64,
        id: u64,
        token: u64,
        ask: u64,
        ret: Option<(Ret, u64)>,
    ) {
        op(h, (c, session, id), OpKind::Release { token }, ask, ret);
    }

    #[test]
    fn a_holder_lost_without_a_release_and_an_unanswered_acquire_may_end_before_the_next_grant() {
        let mut h = HistoryData::default();
        // Client 1 holds 5 and is never heard of again (its session expired).
        acquire(&mut h, 1, 1, 1, 0, Some((Ret::Granted { token: 5 }, 10)));
        // Client 2's acquire goes unanswered: it may have been granted (6) and then expired.
        acquire(&mut h, 2, 2, 2, 20, None);
        acquire(&mut h, 3, 3, 3, 30, Some((Ret::NotGranted, 2_000)));
        acquire(
            &mut h,
            3,
            3,
            4,
            2_100,
            Some((Ret::Granted { token: 9 }, 4_000)),
        );
        release(&mut h, 3, 3, 5, 9, 4_100, Some((Ret::Released, 4_200)));
        // A release of a lock lost long ago is refused.
        release(&mut h, 1, 1, 6, 5, 5_000, Some((Ret::NotHolder, 5_010)));
        let v = linearizable(&sorted(h));
        assert!(v.is_empty(), "{v:?}");
    }

    #[test]
    fn a_release_answered_as_done_after_the_lock_went_to_another_is_caught() {
        let mut h = HistoryData::default();
        acquire(&mut h, 1, 1, 1, 0, Some((Ret::Granted { token: 5 }, 10)));
        acquire(&mut h, 2, 2, 2, 20, Some((Ret::Granted { token: 9 }, 400)));
        // No hold check of either overlaps, so `hold_overlap` sees nothing.
        release(&mut h, 1, 1, 3, 5, 500, Some((Ret::Released, 600)));
        let h = sorted(h);
        assert!(hold_overlap(&h).is_empty());
        assert!(token_order(&h).is_empty());
        let v = linearizable(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].message.contains("not linearizable"), "{v:?}");
    }

    #[test]
    fn a_try_refused_while_nobody_held_the_lock_is_caught() {
        let mut h = HistoryData::default();
        acquire(&mut h, 1, 1, 1, 0, Some((Ret::Granted { token: 5 }, 10)));
        release(&mut h, 1, 1, 2, 5, 100, Some((Ret::Released, 110)));
        acquire(&mut h, 2, 2, 3, 200, Some((Ret::NotGranted, 300)));
        let v = linearizable(&sorted(h));
        assert_eq!(v.len(), 1, "{v:?}");
    }

    #[test]
    fn sessions_are_told_apart_by_worker_and_generation_not_by_id() {
        // Two groups gave one id (7) to the sessions of two workers: client 2's refusal is
        // client 1's holding, not its own.
        let mut h = HistoryData::default();
        acquire(&mut h, 1, 7, 1, 0, Some((Ret::Granted { token: 5 }, 10)));
        acquire(&mut h, 2, 7, 2, 20, Some((Ret::NotGranted, 300)));
        release(&mut h, 1, 7, 3, 5, 400, Some((Ret::Released, 410)));
        let v = linearizable(&sorted(h));
        assert!(v.is_empty(), "{v:?}");
    }
}
