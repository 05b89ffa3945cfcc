//! The tasks a [`Node`] runs for as long as it lives, each documented on its function:
//! [`Node::lease_duties`] (the lease task: every lease log write comes from it, so their log
//! order is the order they were decided in), [`Node::follow_membership`] (the peer address book
//! in step with the membership), [`Node::compact_log`] (only for a log shared by groups),
//! [`Node::found_later`] and [`Node::rebalance_leadership`] (only with several groups). The
//! node starts them (`Node::start`); what they propose goes through `ops.rs`.

use super::data_dir::founder_of;
use super::delays::DelayTimer;
use super::{Node, RenewRequest};
use crate::cluster::member_addr::MemberAddr;
use crate::error::ApiError;
use crate::probe::ProbeEvent;
use latchkey_core::{limits, Op, Outcome, SessionId};
use latchkey_raft::TypeConfig;
use openraft::async_runtime::WatchReceiver;
use openraft::{ReadPolicy, ServerState};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

impl Node {
    /// Keeps this group from holding back the member's shared log: a member's groups share one
    /// log, whose segments go from the front only, each once every group purged its entries in
    /// it, and a quiet group (its few entries never reach the snapshot policy) would keep every
    /// segment on disk. Every `LOG_COMPACTION_CHECK_MS`, once the log has outgrown
    /// `LOG_SEGMENTS_HELD_BACK_MAX` segments and this group's entries hold the oldest back, it
    /// snapshots (if its snapshot does not cover them yet and it has applied them) and then
    /// purges up to them: what openraft does after `--snapshot-every-entries`, sooner. Nothing
    /// it purges is needed: the snapshot covers it.
    pub async fn compact_log(self: Arc<Node>) {
        let Some(held_back) = self.held_back.as_ref() else {
            return;
        };
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(limits::LOG_COMPACTION_CHECK_MS)) => {}
            }
            let Some(upto) = held_back() else {
                continue;
            };
            let (snapshot, applied) = {
                let metrics = self.raft.metrics();
                let m = metrics.borrow_watched();
                (
                    m.snapshot.as_ref().map_or(0, |s| s.index()),
                    m.last_applied.as_ref().map_or(0, |a| a.index()),
                )
            };
            let triggered = if snapshot >= upto {
                tracing::info!(
                    group = self.shape.group,
                    upto,
                    "purging the entries that hold back the member's shared Raft log"
                );
                self.raft.trigger().purge_log(upto).await
            } else if applied >= upto {
                tracing::info!(
                    group = self.shape.group,
                    upto,
                    snapshot,
                    "snapshotting to purge the entries that hold back the member's shared Raft log"
                );
                self.raft.trigger().snapshot().await
            } else {
                // Not applied here yet: a snapshot could not cover them; ask again later.
                continue;
            };
            if let Err(e) = triggered {
                tracing::warn!(group = self.shape.group, error = %e, "log compaction: the Raft core stopped");
                return;
            }
        }
    }

    /// Initializes this group if its founder (`founder_of`) has not made it known here within
    /// `limits::FOUNDING_WAIT_ELECTIONS` election timeouts: the founder is down, and the group
    /// must not wait for it. Returns at once for a group this member founds, or one that is
    /// not new.
    pub async fn found_later(self: Arc<Node>) {
        let Some(nodes) = self.found_later.lock().expect("found_later lock").take() else {
            return;
        };
        let wait = Duration::from_millis(
            self.config.election_timeout_max_ms * limits::FOUNDING_WAIT_ELECTIONS,
        );
        tokio::select! {
            () = self.shutdown.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        if self.raft.is_initialized().await.unwrap_or(true) {
            return;
        }
        tracing::info!(
            group = self.shape.group,
            "the group's founder has not initialized it: initializing it here"
        );
        if let Err(e) = self.raft.initialize(nodes).await {
            tracing::info!("initialize: {e} (another member may have initialized first)");
        }
    }

    /// Leader rebalance (issue #16): while this member leads a group whose preferred leader
    /// ([`founder_of`] over the voters) is another member, and that member has answered within
    /// an election timeout with a log at most `REBALANCE_LAG_ENTRIES_MAX` behind, continuously
    /// for `rebalance_after_ms` in this term, hand it the group (openraft's leader transfer).
    /// So leaderships return to where the cluster spread them after a member comes back. Only
    /// with several groups: a single group has nothing to spread.
    ///
    /// A transfer is an election like any other for the leases: the successor resumes them at
    /// a full TTL after a quorum elected it, and that quorum overlaps the one that confirmed
    /// each renewal the old leader acknowledged, after the renewal arrived (see
    /// `peer/service.rs` `check_leadership_transfer`). While transferring, openraft refuses this leader's
    /// reads and writes (`ForwardToLeader`), so it acknowledges nothing more.
    pub async fn rebalance_leadership(self: Arc<Node>) {
        if self.config.groups == 1 || self.config.rebalance_after_ms == 0 {
            return;
        }
        let settle = Duration::from_millis(self.config.rebalance_after_ms);
        let answering = Duration::from_millis(self.config.election_timeout_min_ms);
        // (term, member) and since when that member has been ready to take over in that term.
        let mut ready: Option<(u64, u64, tokio::time::Instant)> = None;
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(limits::REBALANCE_CHECK_MS)) => {}
            }
            let successor = {
                let metrics = self.raft.metrics();
                let m = metrics.borrow_watched();
                self.preferred_successor(&m, answering)
                    .map(|to| (m.current_term, to))
            };
            let Some((term, to)) = successor else {
                ready = None;
                continue;
            };
            let now = tokio::time::Instant::now();
            let since = match ready {
                Some((t, m, since)) if t == term && m == to => since,
                _ => {
                    ready = Some((term, to, now));
                    continue;
                }
            };
            if now.duration_since(since) < settle {
                continue;
            }
            ready = None;
            tracing::info!(
                group = self.shape.group,
                term,
                successor = to,
                "handing the group to its preferred leader, member {to}"
            );
            self.metrics.leader_transfers.inc();
            self.probe.event(
                self.id,
                self.shape.group,
                ProbeEvent::LeaderTransferStarted { term, to },
            );
            if let Err(e) = self.raft.trigger().transfer_leader(to).await {
                tracing::warn!(group = self.shape.group, "leader transfer: {e}");
                return;
            }
        }
    }

    /// The member this leader should hand the group to now, if any: the group's preferred
    /// leader, when that is not this member, it is a voter, it answered within `answering`,
    /// and its log is at most `REBALANCE_LAG_ENTRIES_MAX` entries behind.
    fn preferred_successor(
        &self,
        m: &openraft::RaftMetrics<TypeConfig>,
        answering: Duration,
    ) -> Option<u64> {
        if m.state != ServerState::Leader {
            return None;
        }
        let voters: Vec<u64> = m.membership_config.membership().voter_ids().collect();
        if voters.len() < 2 {
            return None;
        }
        let preferred = match self.placement.first() {
            // Replica subsets: the member that founded the group, while it is a voter.
            Some((founder, _)) if voters.contains(founder) => *founder,
            _ => founder_of(self.shape.group, voters),
        };
        if preferred == self.id {
            return None;
        }
        let matched = m.replication.as_ref()?.get(&preferred)?.as_ref()?.index;
        let last = m.last_log_index.unwrap_or(0);
        if last.saturating_sub(matched) > limits::REBALANCE_LAG_ENTRIES_MAX {
            return None;
        }
        let acked = m.heartbeat.as_ref()?.get(&preferred)?.as_ref()?;
        (openraft::Instant::elapsed(&**acked) <= answering).then_some(preferred)
    }

    /// The leader's duties, for as long as the node runs, in one task so that their log
    /// writes are ordered: when this node becomes leader, restart (or resume) every lease and
    /// mark every session; while it is leader, write logged renewals for marked sessions, mark
    /// sessions that go unrenewed for half their TTL, and expire sessions whose lease ran out.
    pub async fn lease_duties(self: Arc<Node>, mut renewals: mpsc::Receiver<RenewRequest>) {
        // The server metrics change only with the role, the vote and the membership; the full
        // metrics change with every append, commit and apply, and woke this loop (a scan of
        // every lease) once per entry under load (issue #11's profile).
        let mut metrics = self.raft.server_metrics();
        let mut led_term: Option<u64> = None;
        let mut retry_at: Option<tokio::time::Instant> = None;
        let mut leading = false;
        let mut delays = DelayTimer::new(self.config.plant.delay_ends_early);
        // Snapshots by operations (issue #35): openraft's policy counts entries, and with the
        // leader's coalescing one entry carries up to `BATCH_OPS_MAX` operations, so this asks
        // for a snapshot once `--snapshot-every-entries` operations were applied since the
        // last, on every member (each snapshots its own table). The count at which to ask
        // next: a snapshot resets the count, and one not taken is asked for again an interval
        // later. Without coalescing an entry is an operation and openraft's policy does it.
        let every = self.config.snapshot_every_entries;
        let mut snapshot_at = every;
        // Whether this loop asked for a snapshot that it has not yet seen taken (the probe's
        // `SnapshotTakenAfterAsk`: the simulation counts that the path runs under faults).
        let mut asked = false;
        loop {
            if self.config.coalesce {
                let ops = self.state.ops_since_snapshot();
                if ops >= snapshot_at {
                    tracing::debug!(
                        group = self.shape.group,
                        ops,
                        "snapshot: operations since the last"
                    );
                    match self.raft.trigger().snapshot().await {
                        Ok(()) => {
                            asked = true;
                            self.probe.event(
                                self.id,
                                self.shape.group,
                                ProbeEvent::SnapshotAskedByOperations { ops },
                            );
                        }
                        // The core stopped (shutting down): the leases' work below says so too.
                        Err(e) => {
                            tracing::warn!(group = self.shape.group, error = %e, "snapshot: the Raft core stopped")
                        }
                    }
                    snapshot_at = ops.saturating_add(every);
                } else if ops.saturating_add(every) < snapshot_at {
                    // A snapshot was taken since: count from it.
                    snapshot_at = every;
                    if std::mem::take(&mut asked) {
                        self.probe.event(
                            self.id,
                            self.shape.group,
                            ProbeEvent::SnapshotTakenAfterAsk,
                        );
                    }
                }
            }
            let (leader_now, term) = {
                let m = metrics.borrow_and_update();
                (
                    m.state == ServerState::Leader && m.current_leader == Some(self.id),
                    m.vote.leader_id.term,
                )
            };
            if leading && !leader_now {
                // A leader hears from no leader: its contact stamp dates from before it was
                // elected. It was in touch until now; its successor's appends take over.
                self.leader_contact.heard();
            }
            leading = leader_now;
            if led_term.is_some() && (!leader_now || led_term != Some(term)) {
                // Out of office, or re-elected in a later term: this term's deadlines are not
                // the new term's until it resumes them.
                self.leases.lock().expect("leases lock").stepped_down();
                delays.stepped_down();
                led_term = None;
            }
            if leader_now && led_term.is_none() && retry_at.is_none_or(|t| self.clock.now() >= t) {
                if self.resume_leases(term).await {
                    led_term = Some(term);
                    retry_at = None;
                } else {
                    retry_at = Some(
                        self.clock.now() + Duration::from_millis(limits::LEASE_WRITE_RETRY_MS),
                    );
                }
            }
            if led_term.is_some() && retry_at.is_none_or(|t| self.clock.now() >= t) {
                self.leases
                    .lock()
                    .expect("leases lock")
                    .mark_stale(self.clock.now());
                let written = self.log_marks().await
                    && self.expire_due().await
                    && self.expire_waits().await
                    && self.end_delays(&mut delays).await;
                // A write that failed (typically "not the leader" in the moment around an
                // election) is retried after a pause, not in a tight loop.
                retry_at = (!written).then(|| {
                    self.clock.now() + Duration::from_millis(limits::LEASE_WRITE_RETRY_MS)
                });
            }
            // Only a leader acts on deadlines (a follower's are stale and would wake it in a
            // busy loop).
            let wake = {
                let now = self.clock.now();
                let cap = now + Duration::from_millis(limits::LEASE_TICK_MS);
                let next = match (led_term, retry_at) {
                    (None, _) => None,
                    (Some(_), Some(t)) => Some(t),
                    (Some(_), None) => self.leases.lock().expect("leases lock").next_deadline(),
                };
                next.map_or(cap, |d| d.clamp(now + Duration::from_millis(1), cap))
            };
            tokio::select! {
                changed = metrics.changed() => if changed.is_err() { return },
                Some(req) = renewals.recv() => {
                    // Every keepalive waiting for a logged renewal goes into one entry: after a
                    // failover every session needs one at once, and one commit per keepalive
                    // would let clients' deadlines pass in the queue.
                    let mut batch = vec![req];
                    let mut sessions = batch[0].sessions.len();
                    while sessions < limits::LEASE_RENEW_BATCH_MAX {
                        match renewals.try_recv() {
                            Ok(more) => {
                                sessions += more.sessions.len();
                                batch.push(more);
                            }
                            Err(_) => break,
                        }
                    }
                    self.renew_through_log(batch).await
                }
                _ = crate::clock::sleep_until(&*self.clock, wake) => {}
                _ = self.shutdown.cancelled() => return,
            }
        }
    }

    /// Keeps the peer address book in step with the Raft membership, for as long as the node
    /// runs. And a single-member cluster restarted on another address records its new address
    /// itself once it leads: nobody else could (with more members, `cluster move` does it).
    pub async fn follow_membership(self: Arc<Node>) {
        let mut metrics = self.raft.server_metrics();
        // Where it listens (and listens for members), unless that is a wildcard (0.0.0.0),
        // which names no host: then its founding `--peers` entry. (Not `--peers` first: a
        // founder moved by `cluster move` keeps its founding list on its command line.)
        let wildcard = self.config.listen.ip().is_unspecified()
            || self
                .config
                .peer_listen
                .is_some_and(|p| p.ip().is_unspecified());
        let advertised = if wildcard {
            self.config
                .members()
                .remove(&self.id)
                .unwrap_or_else(|| self.config.own_addr())
        } else {
            self.config.own_addr()
        };
        loop {
            let (book, moved_alone) = {
                let m = metrics.borrow_and_update();
                let membership = m.membership_config.membership();
                let recorded: BTreeMap<u64, &str> = membership
                    .nodes()
                    .map(|(id, n)| (*id, n.addr.as_str()))
                    .collect();
                let alone = membership.voter_ids().eq([self.id]) && recorded.len() == 1;
                let moved = recorded.get(&self.id).is_some_and(|a| *a != advertised);
                // Members dial each other at the peer part of their addresses.
                let book: BTreeMap<u64, String> = recorded
                    .iter()
                    .map(|(id, a)| (*id, MemberAddr::split(a).peer().to_owned()))
                    .collect();
                let committed =
                    m.committed_membership_config.log_id() == m.membership_config.log_id();
                (
                    book,
                    alone && moved && committed && m.state == ServerState::Leader,
                )
            };
            *self.peer_book.write().expect("address book lock") = book;
            if moved_alone {
                tracing::info!(addr = %advertised, "this member moved: recording its new address");
                if let Err(e) = self.move_member(self.id, advertised.clone()).await {
                    tracing::warn!("recording this member's new address failed, will retry: {e}");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(limits::LEASE_WRITE_RETRY_MS)) => continue,
                        _ = self.shutdown.cancelled() => return,
                    }
                }
            }
            tokio::select! {
                changed = metrics.changed() => if changed.is_err() { return },
                _ = self.shutdown.cancelled() => return,
            }
        }
    }

    /// This node leads `term`: resume every lease, but only once it has applied everything up
    /// to its own first entry of the term. Entries the old leader committed (a mark, a logged
    /// renewal that lifted one) may not be applied here yet when the election is won; a lease
    /// resumed from the table before them would start from a mark already lifted, and the
    /// too-short deadline would be logged as this leader's own mark (issue #9, bug 2). openraft's
    /// read index is that first entry (or a later committed one) and `ensure_linearizable`
    /// returns once it is applied. False if leadership of `term` could not be confirmed.
    async fn resume_leases(&self, term: u64) -> bool {
        if !self.config.plant.resume_before_applied {
            let confirmed = tokio::time::timeout(
                Duration::from_millis(limits::PROPOSE_TIMEOUT_MS),
                self.raft.ensure_linearizable(ReadPolicy::ReadIndex),
            )
            .await;
            match confirmed {
                Ok(Ok(read)) if read.committed_leader_id().term == term => {}
                Ok(Ok(read)) => {
                    tracing::debug!(term, read = %read, "leadership moved on before leases resumed");
                    return false;
                }
                Ok(Err(e)) => {
                    tracing::debug!(term, "cannot confirm leadership to resume leases yet: {e}");
                    return false;
                }
                Err(_) => return false,
            }
        }
        tracing::info!(term, "became leader: resuming every session lease");
        let now = self.clock.now();
        // Read the table with the lease table locked: an entry applied meanwhile then reaches
        // the lease table only after the resume (the observer runs after the state machine
        // released the table), never before it to be undone by it.
        let mut leases = self.leases.lock().expect("leases lock");
        let (live, applied_index): (Vec<_>, u64) = self
            .state
            .read(|t| (t.sessions().collect(), t.last_index()));
        let stale_marks = leases.resume(term, live, now);
        let resumed = if self.probe.wants_resumed_leases() {
            leases.remaining(now)
        } else {
            Vec::new()
        };
        drop(leases);
        self.probe.event(
            self.id,
            self.shape.group,
            ProbeEvent::LeasesResumed {
                term,
                applied_index,
                stale_marks,
                leases: resumed,
            },
        );
        true
    }

    /// Propose the marks this leader made that have not committed yet, in batches. A batch
    /// that fails stays due; it is computed afresh and proposed again later. False on failure.
    async fn log_marks(&self) -> bool {
        loop {
            let marks = self
                .leases
                .lock()
                .expect("leases lock")
                .marks_to_log(self.clock.now());
            if marks.is_empty() {
                return true;
            }
            match self
                .propose(Op::MarkLeases {
                    marks: marks.clone(),
                })
                .await
            {
                Ok(_) => self
                    .leases
                    .lock()
                    .expect("leases lock")
                    .marks_logged(&marks),
                Err(e) => {
                    tracing::debug!("lease marks not committed yet, will retry: {e}");
                    return false;
                }
            }
        }
    }

    /// Renew marked sessions through the log, then in memory; answer with those renewed.
    async fn renew_through_log(&self, batch: Vec<RenewRequest>) {
        let mut ids: Vec<SessionId> = batch
            .iter()
            .flat_map(|r| r.sessions.iter().map(|(id, _)| *id))
            .collect();
        ids.sort();
        ids.dedup();
        let result = match self.propose(Op::RenewLeases { ids }).await {
            Ok(Outcome::LeasesRenewed { ids: live }) => {
                self.metrics.logged_renewals.inc_by(live.len() as u64);
                self.probe.event(
                    self.id,
                    self.shape.group,
                    ProbeEvent::LeasesRenewedThroughLog {
                        sessions: live.clone(),
                    },
                );
                Ok(live)
            }
            Ok(other) => Err(ApiError::Raft(format!("unexpected outcome {other:?}"))),
            Err(e) => Err(e),
        };
        for req in batch {
            let answer = match &result {
                Ok(live) => {
                    let mut leases = self.leases.lock().expect("leases lock");
                    Ok(req
                        .sessions
                        .iter()
                        .filter(|(id, arrived)| {
                            live.binary_search(id).is_ok() && leases.renew_logged(*id, *arrived)
                        })
                        .map(|(id, _)| *id)
                        .collect())
                }
                Err(e) => Err(e.clone()),
            };
            let _ = req.reply.send(answer);
        }
    }

    /// End the waits whose wait timeout has passed on this leader's wall clock. A release
    /// already passes such waiters over; this frees them from their queues (and answers their
    /// long-polls) when no release comes. False if it did not commit.
    async fn expire_waits(&self) -> bool {
        // Bounded: waits that keep coming due as fast as entries commit (a caller sending
        // 1-ms waits it abandons) must not keep the lease task from its other duties (session
        // expiry, lock-delays); the rest are due on the next pass.
        for _ in 0..limits::WAIT_EXPIRY_ROUNDS_PER_PASS {
            let due = self
                .state
                .read(|t| t.next_wait_end_ms())
                .is_some_and(|end| end <= self.clock.wall_ms());
            if !due {
                return true;
            }
            match self.propose(Op::ExpireWaits).await {
                Ok(Outcome::WaitsExpired { count }) => {
                    self.probe.event(
                        self.id,
                        self.shape.group,
                        ProbeEvent::WaitsExpired { count },
                    );
                    if count == 0 {
                        return true;
                    }
                }
                Ok(other) => {
                    tracing::warn!("unexpected outcome of a wait expiry: {other:?}");
                    return true;
                }
                Err(e) => {
                    tracing::debug!("wait expiry not committed yet, will retry: {e}");
                    return false;
                }
            }
        }
        true
    }

    /// End the lock-delays that have run their length on this leader's monotonic clock since
    /// it first saw them (issue #32 item 4, `delays.rs`): each named name goes to its head
    /// waiter in the `EndDelays` entry. Delays past one entry's limit are due on the next
    /// tick. False if it did not commit.
    async fn end_delays(&self, timer: &mut DelayTimer) -> bool {
        let now = self.clock.now();
        if !timer.wants_scan(now) {
            return true;
        }
        let ends = self.state.read(|t| timer.due(t.running_delays(), now));
        if ends.is_empty() {
            return true;
        }
        match self.propose(Op::EndDelays { ends }).await {
            Ok(Outcome::DelaysEnded { .. }) => true,
            Ok(other) => {
                tracing::warn!("unexpected outcome of a lock-delay end: {other:?}");
                true
            }
            Err(e) => {
                tracing::debug!("lock-delay end not committed yet, will retry: {e}");
                false
            }
        }
    }

    /// Propose the expiry of every session whose lease ran out. False if it did not commit.
    async fn expire_due(&self) -> bool {
        let due = self
            .leases
            .lock()
            .expect("leases lock")
            .take_expired(self.clock.now());
        if due.is_empty() {
            return true;
        }
        match self.propose(Op::ExpireSessions { ids: due.clone() }).await {
            Ok(Outcome::SessionsExpired { ids }) => {
                tracing::info!(sessions = ?ids, "session leases ran out: expired");
                self.probe.event(
                    self.id,
                    self.shape.group,
                    ProbeEvent::SessionsExpired { sessions: ids },
                );
                true
            }
            Ok(other) => {
                tracing::warn!(sessions = ?due, "unexpected outcome of an expiry: {other:?}");
                true
            }
            Err(e) => {
                tracing::debug!(sessions = ?due, "expiry not committed yet, will retry: {e}");
                self.leases.lock().expect("leases lock").expiry_failed(&due);
                false
            }
        }
    }
}
