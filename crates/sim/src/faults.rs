//! The faults of a run: the schedules that choose them, their injection into the simulated
//! cluster, their healing, and the faults clients ask for at their critical sections.
//!
//! [`Faults`] is the schedules' state (what is broken and when it heals, where each schedule
//! is, the fault RNG and the log of what was done); [`FaultCtx`] is the one context every
//! schedule acts through: the simulation, the run's configuration, its history, the nodes'
//! disks, the clients' controls, and the time. The schedules:
//! - the random schedule ([`FaultCtx::inject`]): every `fault_every_ms`, a partition (both ways
//!   or one way), an isolated leader, a node crash (losing its unsynced writes), a paused node
//!   (its messages held), a lossy link, or a client fault armed for its next write, grant or
//!   critical section;
//! - failover after a lease write ([`FaultCtx::failover_after_lease_write`]);
//! - failover after a logged renewal ([`FaultCtx::failover_after_renewal`]);
//! - lag, catch up by a snapshot, then lead ([`LagPlan`]).
//!
//! Every draw comes from the fault RNG (and the disk crash RNG), in a fixed order per step, so a
//! seed replays its faults.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;

use crate::client::ClientControl;
use crate::config::{client_name, node_name, RunConfig};
use crate::history::History;
use crate::store::SharedDisk;

/// Active faults and when they heal.
pub(crate) struct Faults {
    rng: StdRng,
    pub(crate) log: Vec<String>,
    crashed: BTreeMap<u64, Duration>,
    /// Crashed clients (index) and when their hosts restart.
    crashed_clients: BTreeMap<usize, Duration>,
    /// (a, b, one_way, heal_at)
    cut: Vec<(String, String, bool, Duration)>,
    held: Vec<(String, Duration)>,
    lossy: Vec<(String, String, Duration)>,
    next_at: Duration,
    /// Every host's name (nodes and clients).
    hosts: Vec<String>,
    /// Client cuts drawn but not yet asked for by their client (it asks at its next critical
    /// section): client index -> direction.
    client_cuts: BTreeMap<usize, CutDirection>,
    /// Where the lag-then-lead schedule is.
    lag: LagPlan,
    /// The highest committed index already looked at for lease writes.
    lease_writes_seen: u64,
    /// No failover after a lease write before this (one at a time).
    lease_failover_after: Duration,
    /// The highest index the renewal-then-failover schedule has decided on.
    renewals_seen: u64,
    /// No renewal-then-failover before this.
    renewal_failover_after: Duration,
    /// When the renewal-then-failover schedule next starves the clients (see
    /// [`failover_after_renewal`]).
    starve_clients_at: Duration,
}

/// What a fault step acts on: the one context every schedule takes.
pub(crate) struct FaultCtx<'a, 's> {
    pub sim: &'a mut turmoil::Sim<'s>,
    pub faults: &'a mut Faults,
    pub config: &'a RunConfig,
    pub history: &'a History,
    /// By node: its disks, one per Raft group.
    pub disks: &'a BTreeMap<u64, Vec<SharedDisk>>,
    pub controls: &'a [Arc<ClientControl>],
    /// Draws which unsynced writes a crashed node's disk loses.
    pub crash_rng: &'a mut StdRng,
    /// True simulation time of this step.
    pub now: Duration,
}

/// The "lag, catch up by a snapshot, then lead" schedule: the state a new leader needs to
/// resume a lease from a mark that an installed snapshot no longer has (issue #9, bug 1). A
/// follower applies a new leader's marks, is cut off while the leader lifts them with logged
/// renewals and snapshots past it, comes back and installs the snapshot; then the leader is
/// isolated so that the follower may win (with five nodes, the other followers are cut from
/// each other too, so that only it can gather a majority; with three it races the other one).
#[derive(Debug, Clone, Copy)]
enum LagPlan {
    /// At `next_at`, isolate the leader, so that the next one marks every session.
    Idle { next_at: Duration },
    /// Wait until `until` for a follower to learn that the marks of a term after `old_term`
    /// (the isolated leader's), made after `since`, committed.
    WaitMark {
        old_term: u64,
        since: Duration,
        until: Duration,
    },
    /// Follower `node` is cut off from its peers until `heal_at`.
    Lagging { node: u64, heal_at: Duration },
    /// `node` is back since `since`: wait until `until` for it to install a snapshot.
    CatchingUp {
        node: u64,
        since: Duration,
        until: Duration,
    },
}

#[derive(Debug, Clone, Copy)]
enum CutDirection {
    Both,
    /// The client's messages to the nodes are lost; their answers would arrive.
    FromClient,
    /// The nodes' messages to the client are lost; its requests arrive.
    ToClient,
}

impl Faults {
    /// The schedules' state at the start of a run, with the fault RNG seeded from the run's.
    pub(crate) fn new(rng: StdRng, config: &RunConfig, hosts: Vec<String>) -> Faults {
        Faults {
            rng,
            log: Vec::new(),
            crashed: BTreeMap::new(),
            crashed_clients: BTreeMap::new(),
            cut: Vec::new(),
            held: Vec::new(),
            lossy: Vec::new(),
            next_at: Duration::from_secs(2),
            hosts,
            client_cuts: BTreeMap::new(),
            lag: LagPlan::Idle {
                next_at: Duration::from_secs(2),
            },
            lease_writes_seen: 0,
            lease_failover_after: Duration::ZERO,
            renewals_seen: 0,
            renewal_failover_after: Duration::ZERO,
            starve_clients_at: config.ttl,
        }
    }

    /// Cuts `node` off from every other node until `heal_at`.
    fn isolate(&mut self, sim: &mut turmoil::Sim<'_>, nodes: u64, node: u64, heal_at: Duration) {
        let n = node_name(node);
        for other in (1..=nodes).filter(|o| *o != node) {
            let o = node_name(other);
            sim.partition(n.as_str(), o.as_str());
            self.cut.push((n.clone(), o, false, heal_at));
        }
    }

    /// The current leader, if it is up.
    fn live_leader(&self, history: &History) -> Option<(u64, u64)> {
        history
            .with(|h| h.leader)
            .filter(|(_, node)| !self.crashed.contains_key(node))
    }

    /// Loses every client host's messages to the nodes until `heal_at` (their answers arrive).
    fn cut_clients_messages(&mut self, sim: &mut turmoil::Sim<'_>, nodes: u64, heal_at: Duration) {
        let nodes: Vec<String> = (1..=nodes).map(node_name).collect();
        let clients: Vec<String> = self
            .hosts
            .iter()
            .filter(|h| !nodes.contains(h))
            .cloned()
            .collect();
        for c in &clients {
            for n in &nodes {
                sim.partition_oneway(c.as_str(), n.as_str());
                self.cut.push((c.clone(), n.clone(), true, heal_at));
            }
        }
    }
}

impl FaultCtx<'_, '_> {
    /// One step of the safety phase: the random schedule, then the targeted ones (which wait
    /// while the lag-then-lead plan runs, as it alone acts on the nodes then).
    pub(crate) fn safety_step(&mut self) {
        self.inject();
        let lag_idle = |c: &Self| matches!(c.faults.lag, LagPlan::Idle { .. });
        if self.config.failover_after_lease_write_p > 0.0 && lag_idle(self) {
            self.failover_after_lease_write();
        }
        if self.config.failover_after_renewal_p > 0.0 && lag_idle(self) {
            self.failover_after_renewal();
        }
        if self.config.lag_then_lead {
            self.lag_then_lead();
        }
    }

    /// Heals the random faults that are due, then injects the next one when it is due.
    fn inject(&mut self) {
        let now = self.now;
        let (sim, f, config, history) =
            (&mut *self.sim, &mut *self.faults, self.config, self.history);
        let (disks, controls, crash_rng) = (self.disks, self.controls, &mut *self.crash_rng);
        let stamp = |s: String| format!("{:.3}s {s}", now.as_secs_f64());
        // Heal what is due.
        let due: Vec<u64> = f
            .crashed
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            f.crashed.remove(&id);
            sim.bounce(node_name(id));
            f.log.push(stamp(format!("restart n{id}")));
        }
        f.cut.retain(|(a, b, one_way, t)| {
            if *t > now {
                return true;
            }
            if *one_way {
                sim.repair_oneway(a.as_str(), b.as_str());
            } else {
                sim.repair(a.as_str(), b.as_str());
            }
            false
        });
        f.held.retain(|(n, t)| {
            if *t > now {
                return true;
            }
            for h in f.hosts.iter().filter(|h| *h != n) {
                sim.release(n.as_str(), h.as_str());
            }
            false
        });
        f.lossy.retain(|(a, b, t)| {
            if *t > now {
                return true;
            }
            sim.set_link_fail_rate(a.as_str(), b.as_str(), 0.0);
            sim.set_link_max_message_latency(a.as_str(), b.as_str(), Duration::from_millis(2));
            false
        });
        if now < f.next_at {
            return;
        }
        let (lo, hi) = config.fault_every_ms;
        f.next_at = now + Duration::from_millis(f.rng.random_range(lo..=hi));
        let rng = &mut f.rng;
        let node = rng.random_range(1..=config.nodes);
        let other = (node + rng.random_range(1..config.nodes) - 1) % config.nodes + 1;
        let last = Duration::from_millis(rng.random_range(300..=5_000));
        let (a, b) = (node_name(node), node_name(other));
        let kind = rng.random_range(0..124);
        // While the lag-then-lead plan runs, it alone acts on the nodes: a random partition or
        // crash on top of it in a three-node cluster leaves no majority, and the plan stalls.
        if kind <= 76 && !matches!(f.lag, LagPlan::Idle { .. }) {
            return;
        }
        match kind {
            0..=19 => {
                let one_way = rng.random_bool(0.4);
                if one_way {
                    sim.partition_oneway(a.as_str(), b.as_str());
                } else {
                    sim.partition(a.as_str(), b.as_str());
                }
                f.log.push(stamp(format!(
                    "cut {a} {} {b} for {last:?}",
                    if one_way { "->" } else { "<->" }
                )));
                f.cut.push((a, b, one_way, now + last));
            }
            20..=31 => {
                let Some((_, leader)) = history.with(|h| h.leader) else {
                    return;
                };
                let l = node_name(leader);
                // Half the time long enough for a new leader to be elected and a full lease to run
                // out under it while the old one, still reachable by clients, believes it leads.
                let last = if rng.random_bool(0.5) {
                    config.ttl.mul_f64(rng.random_range(1.5..3.0))
                } else {
                    last
                };
                for other in (1..=config.nodes).filter(|o| *o != leader) {
                    let o = node_name(other);
                    sim.partition(l.as_str(), o.as_str());
                    f.cut.push((l.clone(), o, false, now + last));
                }
                f.log.push(stamp(format!(
                    "isolate leader {l} from its peers for {last:?}"
                )));
            }
            32..=49 => {
                // Mostly keep a majority of the targeted group's voters (every node, or its
                // replicas) up; sometimes take it down too.
                let voters = config.group_voters(config.targeted_group());
                let down = voters.iter().filter(|v| f.crashed.contains_key(v)).count();
                if f.crashed.contains_key(&node)
                    || (voters.contains(&node)
                        && down + 1 > voters.len() / 2
                        && rng.random_bool(0.8))
                {
                    return;
                }
                sim.crash(a.as_str());
                let lost = crate::store::crash_node(&disks[&node], crash_rng);
                f.crashed.insert(node, now + last);
                f.log.push(stamp(format!(
                    "crash {a} ({lost} unsynced writes lost) for {last:?}"
                )));
            }
            50..=61 => {
                for h in f.hosts.iter().filter(|h| **h != a) {
                    sim.hold(a.as_str(), h.as_str());
                }
                f.held.push((a.clone(), now + last));
                f.log.push(stamp(format!(
                    "pause {a} (hold all its messages) for {last:?}"
                )));
            }
            62..=76 => {
                let rate = rng.random_range(0.01..0.2);
                let delay = Duration::from_millis(rng.random_range(5..=300));
                sim.set_link_fail_rate(a.as_str(), b.as_str(), rate);
                sim.set_link_max_message_latency(a.as_str(), b.as_str(), delay);
                f.log.push(stamp(format!(
                    "lossy link {a}<->{b}: loss {rate:.2}, delay up to {delay:?}, for {last:?}"
                )));
                f.lossy.push((a, b, now + last));
            }
            77..=88 => {
                let c = rng.random_range(0..controls.len());
                let pause = config.ttl.as_millis() as u64 * rng.random_range(12..=30) / 10;
                controls[c].pause_ms.store(pause, Ordering::Relaxed);
                f.log.push(stamp(format!(
                    "pause client c{} for {pause} ms at its next write",
                    c + 1
                )));
            }
            100..=123 => {
                let c = rng.random_range(0..controls.len());
                if f.client_cuts.contains_key(&c) {
                    return;
                }
                let ms = config.ttl.as_millis() as u64 * rng.random_range(12..=25) / 10;
                let direction = match rng.random_range(0..10) {
                    0..=4 => CutDirection::Both,
                    5..=7 => CutDirection::FromClient,
                    _ => CutDirection::ToClient,
                };
                controls[c].cut_ms.store(ms, Ordering::Relaxed);
                f.client_cuts.insert(c, direction);
                f.log.push(stamp(format!(
                    "cut client c{} off from every node ({direction:?}) for {ms} ms at its next \
                 critical section",
                    c + 1
                )));
            }
            _ => {
                let c = rng.random_range(0..controls.len());
                controls[c]
                    .crash
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                f.log
                    .push(stamp(format!("kill client c{} at its next grant", c + 1)));
            }
        }
    }

    /// Isolates the leader right after it committed a `MarkLeases` or a
    /// `RenewLeases`, with the run's chance: the next leader may have the entry in its log but not
    /// know it committed, so not have applied it when it wins (issue #9, bug 2 needs that).
    fn failover_after_lease_write(&mut self) {
        let now = self.now;
        let (sim, f, config, history) =
            (&mut *self.sim, &mut *self.faults, self.config, self.history);
        let Some(leader) = f.live_leader(history) else {
            return;
        };
        let from = f.lease_writes_seen + 1;
        let (last, write) = history.with(|h| {
            let last = h.committed.last_key_value().map_or(0, |(i, _)| *i);
            let write = h
                .committed
                .range(from..)
                .filter(|(_, c)| c.leader == leader)
                .find_map(|(i, c)| {
                    c.ops().find_map(|op| match op {
                        latchkey_core::Op::MarkLeases { .. } => Some((*i, "MarkLeases")),
                        latchkey_core::Op::RenewLeases { .. } => Some((*i, "RenewLeases")),
                        _ => None,
                    })
                });
            (last, write)
        });
        f.lease_writes_seen = f.lease_writes_seen.max(last);
        let Some((index, kind)) = write else {
            return;
        };
        if now < f.lease_failover_after || !f.rng.random_bool(config.failover_after_lease_write_p) {
            return;
        }
        // Short: long enough for an election, and the next leader may be isolated right after its
        // own first lease writes, so that failovers chain (each new leader resumes from the marks
        // the last one logged, their unrenewed times adding up).
        let last = Duration::from_millis(f.rng.random_range(600..=1_500));
        f.lease_failover_after = now + Duration::from_millis(300);
        let l = leader.1;
        f.isolate(sim, config.nodes, l, now + last);
        f.log.push(format!(
            "{:.3}s isolate leader n{l} from its peers right after it committed {kind} (entry \
         {index}), for {last:?}",
            now.as_secs_f64()
        ));
    }

    /// The "logged renewal, then failover" schedule: the state issue #9's bug 2 needs. A leader
    /// commits a `RenewLeases` that lifts a mark, and acknowledges it to the clients, whose
    /// deadlines now stand; no follower learns that it committed (the leader's messages to its
    /// peers are cut the moment the followers hold the entry, while their acknowledgements still
    /// reach it), so the next leader has it in its log unapplied when it wins. The clients' own
    /// messages are lost for most of a TTL meanwhile (their answers still arrive), so no keepalive
    /// of theirs reaches the new leader to renew the lease afresh: only the lease the new leader
    /// resumed stands between them and an expiry, and it must not end before their deadlines.
    ///
    /// Only a renewal that lifts a mark which has stood for more than a quarter TTL can show a
    /// lease resumed too early: resumed from a younger mark, the lease would still outlast the
    /// client's deadline (TTL minus a margin of TTL/5). Marks made as a leader takes office are
    /// lifted within TTL/3 (the clients renew that often), mostly younger; so from time to time the
    /// schedule first loses the clients' messages for a little over half a TTL (their deadlines
    /// stand), long enough for the leader to mark their sessions unrenewed for TTL/2, and their
    /// next keepalives lift those marks through the log.
    fn failover_after_renewal(&mut self) {
        let now = self.now;
        let (sim, f, config, history) =
            (&mut *self.sim, &mut *self.faults, self.config, self.history);
        if now < f.renewal_failover_after {
            return;
        }
        let ttl = config.ttl;
        if now >= f.starve_clients_at {
            f.starve_clients_at = now + ttl.mul_f64(f.rng.random_range(3.0..5.0));
            let starve = ttl.mul_f64(f.rng.random_range(0.55..0.65));
            f.cut_clients_messages(sim, config.nodes, now + starve);
            f.log.push(format!(
                "{:.3}s renewal-then-failover: lose every client's messages to the nodes for \
             {starve:?}, so that the leader marks their sessions",
                now.as_secs_f64()
            ));
            return;
        }
        let Some(leader) = f.live_leader(history) else {
            return;
        };
        // Followers that must hold the entry for it to commit (with the leader, a majority of
        // the targeted group's voters: every node, or its replicas).
        let followers_needed = config.group_voters(config.targeted_group()).len() / 2;
        let found = history.with(|h| {
            let (index, ids) = h
                .appended
                .range((f.renewals_seen + 1, 0, 0)..)
                .filter(|(_, a)| a.leader == leader)
                .find_map(|(_, a)| {
                    a.ops().find_map(|op| match op {
                        latchkey_core::Op::RenewLeases { ids } => Some((a.index, ids.clone())),
                        _ => None,
                    })
                })?;
            let holding = h
                .last_appended
                .iter()
                .filter(|(n, (last, by))| **n != leader.1 && *by == leader && *last >= index)
                .count();
            if holding < followers_needed {
                // Not replicated yet: look again next step.
                return None;
            }
            // Decided either way from here.
            let known_committed = h
                .commit_checked
                .iter()
                .any(|(n, (_, c))| *n != leader.1 && *c >= index);
            // The mark each renewed session carried before this renewal: the newest lease write
            // for it below `index` (a renewal there means no mark stood).
            let mut pending: std::collections::BTreeSet<_> = ids.iter().copied().collect();
            let mut oldest_mark = Duration::ZERO;
            for (_, c) in h.committed.range(..index).rev() {
                if pending.is_empty() {
                    break;
                }
                for op in c.ops() {
                    match op {
                        latchkey_core::Op::MarkLeases { marks } => {
                            for (id, unrenewed_ms) in marks {
                                if pending.remove(id) {
                                    let stood = now.saturating_sub(c.known_at)
                                        + Duration::from_millis(*unrenewed_ms);
                                    oldest_mark = oldest_mark.max(stood);
                                }
                            }
                        }
                        latchkey_core::Op::RenewLeases { ids } => {
                            for id in ids {
                                pending.remove(id);
                            }
                        }
                        _ => {}
                    }
                }
            }
            Some((
                index,
                !known_committed && oldest_mark * 4 > ttl,
                oldest_mark,
            ))
        });
        let Some((index, eligible, oldest_mark)) = found else {
            return;
        };
        f.renewals_seen = index;
        if !eligible || !f.rng.random_bool(config.failover_after_renewal_p) {
            return;
        }
        // One at a time, with room between them for the clients to come back.
        f.renewal_failover_after = now + ttl * 2;
        // Until about the clients' own deadlines (TTL minus the margin, from their last renewal),
        // and the old leader as long: back earlier, it could win the next election and resume
        // from the renewal it applied, ending the new leader's term before its leases run out.
        let cut = ttl.mul_f64(f.rng.random_range(0.8..1.0));
        let l = node_name(leader.1);
        for other in (1..=config.nodes).filter(|o| *o != leader.1).map(node_name) {
            sim.partition_oneway(l.as_str(), other.as_str());
            f.cut.push((l.clone(), other, true, now + cut));
        }
        f.cut_clients_messages(sim, config.nodes, now + cut);
        f.log.push(format!(
            "{:.3}s renewal-then-failover: for {cut:?}, cut the messages of leader n{} to its \
         peers once its followers held RenewLeases (entry {index}, lifting a mark that stood \
         {oldest_mark:?}), and every client's messages to the nodes",
            now.as_secs_f64(),
            leader.1
        ));
    }

    /// One step of [`LagPlan`].
    fn lag_then_lead(&mut self) {
        let now = self.now;
        let (sim, f, config, history) =
            (&mut *self.sim, &mut *self.faults, self.config, self.history);
        let stamp = format!("{:.3}s", now.as_secs_f64());
        let restart = |f: &mut Faults| LagPlan::Idle {
            next_at: now + Duration::from_millis(f.rng.random_range(1_000..=4_000)),
        };
        f.lag = match f.lag {
            LagPlan::Idle { next_at } if now >= next_at => {
                let Some((old_term, l)) = f.live_leader(history) else {
                    return;
                };
                // Long enough for an election, short enough to keep most of the run for the rest.
                let last = Duration::from_millis(f.rng.random_range(700..=1_500));
                f.isolate(sim, config.nodes, l, now + last);
                f.log.push(format!(
                "{stamp} lag-then-lead: isolate leader n{l} for {last:?}, so that a new one marks every session"
            ));
                LagPlan::WaitMark {
                    old_term,
                    since: now,
                    until: now + Duration::from_secs(5),
                }
            }
            LagPlan::WaitMark { until, .. } if now >= until => restart(f),
            LagPlan::WaitMark {
                old_term, since, ..
            } => {
                let Some(leader) = f.live_leader(history).filter(|l| l.0 > old_term) else {
                    return;
                };
                // A follower that knows a mark of this term committed (so applies it now).
                let lagger = history.with(|h| {
                    let mark = h.committed.iter().find(|(i, c)| {
                        c.leader == leader
                            && c.ops()
                                .any(|op| matches!(op, latchkey_core::Op::MarkLeases { .. }))
                            && h.appended
                                .get(&(**i, leader.0, leader.1))
                                .is_some_and(|a| a.first_at >= since)
                    })?;
                    let index = *mark.0;
                    (1..=config.nodes).find(|n| {
                        *n != leader.1
                            && !f.crashed.contains_key(n)
                            && h.commit_checked.get(n).is_some_and(|&(_, c)| c >= index)
                    })
                });
                let Some(node) = lagger else {
                    return;
                };
                // Long enough for the leader to lift the marks by logged renewals and snapshot
                // past them, and for the follower's stale marks to be older than a TTL.
                let last = config.ttl.mul_f64(f.rng.random_range(1.0..1.5));
                f.isolate(sim, config.nodes, node, now + last);
                f.log.push(format!(
                "{stamp} lag-then-lead: cut n{node} off from its peers for {last:?}, right after \
                 it applied the marks of term {}",
                leader.0
            ));
                LagPlan::Lagging {
                    node,
                    heal_at: now + last,
                }
            }
            LagPlan::Lagging { node, heal_at } if now >= heal_at => LagPlan::CatchingUp {
                node,
                since: heal_at,
                until: now + Duration::from_secs(3),
            },
            LagPlan::CatchingUp { until, .. } if now >= until => restart(f),
            LagPlan::CatchingUp { node, since, until } => {
                let installed = history.with(|h| {
                    h.probed
                        .iter()
                        .rev()
                        .take_while(|p| p.at >= since)
                        .any(|p| {
                            p.node == node
                                && matches!(
                                    p.event,
                                    latchkey_server::ProbeEvent::SnapshotInstalled { .. }
                                )
                        })
                });
                let leader = f.live_leader(history);
                match leader {
                    Some((_, l)) if installed && l != node => {
                        let last = config.ttl.mul_f64(f.rng.random_range(1.0..2.0));
                        f.isolate(sim, config.nodes, l, now + last);
                        // The other followers cannot elect one of them without `node`.
                        let others: Vec<u64> = config
                            .group_voters(config.targeted_group())
                            .into_iter()
                            .filter(|o| *o != l && *o != node)
                            .collect();
                        if others.len() > 1 {
                            for (i, a) in others.iter().enumerate() {
                                for b in &others[i + 1..] {
                                    let (a, b) = (node_name(*a), node_name(*b));
                                    sim.partition(a.as_str(), b.as_str());
                                    f.cut.push((a, b, false, now + last));
                                }
                            }
                        }
                        f.log.push(format!(
                        "{stamp} lag-then-lead: n{node} installed a snapshot; isolate leader n{l} \
                         for {last:?} so that n{node} may lead"
                    ));
                        restart(f)
                    }
                    _ => LagPlan::CatchingUp { node, since, until },
                }
            }
            other => other,
        };
    }

    /// Carries out what clients asked for at their critical sections (cut me off, hold my
    /// messages, crash me) and restarts crashed clients that are due. Runs every step: a client
    /// may ask in the step the faults heal; after the heal, a crash it asked for restarts at once.
    pub(crate) fn serve_client_requests(&mut self, healed: bool) {
        let now = self.now;
        let (sim, f, config, controls) = (
            &mut *self.sim,
            &mut *self.faults,
            self.config,
            self.controls,
        );
        let stamp = |s: String| format!("{:.3}s {s}", now.as_secs_f64());
        let due: Vec<usize> = f
            .crashed_clients
            .iter()
            .filter(|(_, t)| **t <= now || healed)
            .map(|(i, _)| *i)
            .collect();
        for i in due {
            f.crashed_clients.remove(&i);
            let c = client_name(i as u32 + 1);
            sim.bounce(c.as_str());
            f.log.push(stamp(format!("restart client {c}")));
        }
        for (i, control) in controls.iter().enumerate() {
            let c = client_name(i as u32 + 1);
            if control.crash_now.swap(false, Ordering::Relaxed) {
                sim.crash(c.as_str());
                let down = Duration::from_millis(f.rng.random_range(200..=3_000));
                f.crashed_clients
                    .insert(i, if healed { now } else { now + down });
                f.log.push(stamp(format!(
                    "kill client {c} (holding a lock); restart after {down:?}"
                )));
            }
            let ms = control.pause_now_ms.swap(0, Ordering::Relaxed);
            if ms > 0 && !healed {
                for h in f.hosts.iter().filter(|h| **h != c) {
                    sim.hold(c.as_str(), h.as_str());
                }
                f.held.push((c.clone(), now + Duration::from_millis(ms)));
                f.log.push(stamp(format!(
                    "pause client {c} for {ms} ms (hold its messages), between its read and write"
                )));
            }
        }
        // Cut off the clients that asked for it (they reached the critical section of a cut drawn
        // earlier).
        for (i, control) in controls.iter().enumerate() {
            let ms = control.cut_now_ms.swap(0, Ordering::Relaxed);
            if ms == 0 || healed {
                continue;
            }
            let direction = f.client_cuts.remove(&i).unwrap_or(CutDirection::Both);
            let c = client_name(i as u32 + 1);
            let heal_at = now + Duration::from_millis(ms);
            for n in (1..=config.nodes).map(node_name) {
                match direction {
                    CutDirection::Both => {
                        sim.partition(c.as_str(), n.as_str());
                        f.cut.push((c.clone(), n, false, heal_at));
                    }
                    CutDirection::FromClient => {
                        sim.partition_oneway(c.as_str(), n.as_str());
                        f.cut.push((c.clone(), n, true, heal_at));
                    }
                    CutDirection::ToClient => {
                        sim.partition_oneway(n.as_str(), c.as_str());
                        f.cut.push((n, c.clone(), true, heal_at));
                    }
                }
            }
            f.log.push(stamp(format!(
                "cut client {c} off from every node ({direction:?}) for {ms} ms, in its critical \
             section"
            )));
        }
    }

    /// Ends every fault at once: the start of the liveness phase.
    pub(crate) fn heal_all(&mut self) {
        // Client faults armed "at the next write/grant/critical section" that have not fired
        // yet are disarmed too: firing in the liveness phase they would be faults after the
        // heal (a holder paused or killed there legitimately starves waiters).
        for c in self.controls {
            c.disarm();
        }
        self.faults.client_cuts.clear();
        let (sim, f) = (&mut *self.sim, &mut *self.faults);
        for (id, _) in std::mem::take(&mut f.crashed) {
            sim.bounce(node_name(id));
        }
        for (a, b, _, _) in std::mem::take(&mut f.cut) {
            sim.repair(a.as_str(), b.as_str());
        }
        for (n, _) in std::mem::take(&mut f.held) {
            for h in f.hosts.iter().filter(|h| **h != n) {
                sim.release(n.as_str(), h.as_str());
            }
        }
        for (a, b, _) in std::mem::take(&mut f.lossy) {
            sim.set_link_fail_rate(a.as_str(), b.as_str(), 0.0);
            sim.set_link_max_message_latency(a.as_str(), b.as_str(), Duration::from_millis(2));
        }
    }
}
