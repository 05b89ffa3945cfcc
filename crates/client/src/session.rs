//! [`Session`]: a lease on the server, renewed in the background, and the client's own idea of
//! when it may have run out.
//!
//! The server expires a session `ttl` after it last received a renewal. The client cannot see
//! that clock, so it keeps a conservative one of its own: the send instant of the last renewal
//! the server acknowledged, plus the TTL, minus a safety margin ([`ClientLease`]). The server received
//! that renewal after it was sent, so the server's deadline is later than the client's by at
//! least the margin. When the client's deadline passes, every [`LockGuard`](crate::LockGuard)
//! of the session reports `lost()`, while the server still holds the locks for the margin:
//! that is the time a holder has to stop working.
//!
//! Failover signal. Like Chubby's clients, a session tells its owner when the cluster behind it
//! changed hands: [`Session::failovers`] counts renewals that were acknowledged by a different
//! node than the previous one, or only after failed attempts (UNAVAILABLE, no leader, a node
//! gone). Nothing is lost by a failover as long as `lost()` has not fired (the new leader
//! resumes the lease), but a holder may want to re-check the resource it protects or log it.

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use latchkey_core::{limits, SessionId, SessionKey};
use latchkey_proto::v1 as pb;
use tokio::sync::{watch, Notify, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::client::{CallOpts, Client};
use crate::env::sleep_until;
use crate::error::Error;
use crate::lock::LockRequest;

/// The least safety margin ([`limits::CLIENT_SAFETY_MARGIN_MS_MIN`], where its reason is).
pub const SAFETY_MARGIN_MIN: Duration = Duration::from_millis(limits::CLIENT_SAFETY_MARGIN_MS_MIN);

/// Deadline of one renewal attempt: a fifth of the TTL, at least 200 ms (reasons in
/// [`limits::CLIENT_RENEWAL_ATTEMPT_TTL_DIVISOR`]).
pub(crate) fn renewal_attempt_timeout(ttl: Duration) -> Duration {
    (ttl / limits::CLIENT_RENEWAL_ATTEMPT_TTL_DIVISOR)
        .max(Duration::from_millis(limits::CLIENT_RENEWAL_ATTEMPT_MS_MIN))
}

/// Cap of the backoff between renewal attempts: a twentieth of the TTL, at least 50 ms
/// (reasons in [`limits::CLIENT_RENEWAL_BACKOFF_TTL_DIVISOR`]).
pub(crate) fn renewal_backoff_max(ttl: Duration) -> Duration {
    (ttl / limits::CLIENT_RENEWAL_BACKOFF_TTL_DIVISOR)
        .max(Duration::from_millis(limits::CLIENT_RENEWAL_BACKOFF_MS_MIN))
}

/// The safety margin for a lease of `ttl`: `max(ttl / 5, 200 ms)`.
pub fn safety_margin(ttl: Duration) -> Duration {
    (ttl / limits::CLIENT_SAFETY_MARGIN_TTL_DIVISOR).max(SAFETY_MARGIN_MIN)
}

/// Why a session ended on purpose (not worth a warning).
const WHY_CLOSED: &str = "the session was closed";
const WHY_DROPPED: &str = "the session was dropped";

/// A session's lease as the client sees it: pure arithmetic on instants, no I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClientLease {
    ttl: Duration,
    margin: Duration,
    /// Send instant of the newest acknowledged renewal (or of the CreateSession).
    acked_sent: Instant,
    /// After a failed renewal: when to try again (sooner than the regular schedule).
    retry_at: Option<Instant>,
    /// The group sessions of one logical session renew on one schedule (issue #16): each
    /// renewal falls on `grid + k * interval`, the first such instant at most an interval
    /// after the last acknowledged send, so that all of them are due at the same instant and
    /// travel in the same keepalive requests, however apart they were made.
    grid: Option<Instant>,
}

impl ClientLease {
    pub(crate) fn new(sent: Instant, ttl: Duration) -> ClientLease {
        ClientLease {
            ttl,
            margin: safety_margin(ttl),
            acked_sent: sent,
            retry_at: None,
            grid: None,
        }
    }

    /// This lease renewed on the schedule of the logical session that started at `grid`.
    pub(crate) fn on_grid(mut self, grid: Instant) -> ClientLease {
        self.grid = Some(grid);
        self
    }

    /// After this instant the locks may be lost.
    pub(crate) fn deadline(&self) -> Instant {
        self.acked_sent + self.ttl.saturating_sub(self.margin)
    }

    /// When to send the next renewal.
    pub(crate) fn next_renewal(&self) -> Instant {
        let interval = self.ttl / limits::CLIENT_RENEWAL_TTL_DIVISOR;
        let regular = self.acked_sent + interval;
        let regular = match self.grid {
            // The last grid instant at or before the regular time: after the last send,
            // and never later than the regular schedule.
            Some(grid) if regular > grid && !interval.is_zero() => {
                let since = (regular - grid).as_nanos();
                let step = interval.as_nanos();
                let back = since % step;
                let aligned = regular - Duration::from_nanos(back as u64);
                if aligned > self.acked_sent {
                    aligned
                } else {
                    regular
                }
            }
            _ => regular,
        };
        self.retry_at.unwrap_or(regular)
    }

    /// The server acknowledged a renewal sent at `sent`, granting `server_ttl`. An older
    /// acknowledgement never moves the deadline back; a shorter server TTL is believed.
    pub(crate) fn acknowledged(&mut self, sent: Instant, server_ttl: Duration) {
        if sent >= self.acked_sent {
            self.acked_sent = sent;
        }
        if !server_ttl.is_zero() && server_ttl < self.ttl {
            self.ttl = server_ttl;
            self.margin = safety_margin(server_ttl);
        }
        self.retry_at = None;
    }

    /// A renewal failed at `now`: try again after a tenth of the TTL (at least 100 ms), but
    /// never later than the deadline (reasons in [`limits::CLIENT_RENEWAL_RETRY_TTL_DIVISOR`]).
    pub(crate) fn failed(&mut self, now: Instant) {
        let step = (self.ttl / limits::CLIENT_RENEWAL_RETRY_TTL_DIVISOR)
            .max(Duration::from_millis(limits::CLIENT_RENEWAL_RETRY_MS_MIN));
        self.retry_at = Some((now + step).min(self.deadline()));
    }
}

/// What identifies a session to the server (the core's own type), as the protocol carries it.
pub(crate) fn pb_session(key: SessionKey) -> Option<pb::Session> {
    Some(pb::Session {
        id: key.id.0,
        secret: key.secret,
    })
}

/// State shared by a session, its renewal task and its lock guards.
pub(crate) struct SessionShared {
    pub client: Client,
    pub key: SessionKey,
    pub ttl: Duration,
    /// The Raft group this session lives in (issue #16); its calls go to that group's leader.
    pub group: u32,
    /// The cluster's group count, as the session's creation answered it.
    pub groups: u32,
    /// Whether this is one of the group sessions of a logical session of several (a cluster
    /// of several groups): its renewal then ends, and it is closed, once the logical session
    /// is lost in another group.
    in_groups: bool,
    /// Sequence numbers of unanswered requests (see [`SeqWindow`]).
    window: Mutex<SeqWindow>,
    /// Woken when a request leaves the window.
    window_moved: Notify,
    /// Names of the locks this client holds a live guard for: a grant of any other lock to
    /// this session is one nobody wants (see `release_orphan`).
    pub guarded: Mutex<HashSet<String>>,
    /// Bounds the waits (Acquire long-polls) in flight.
    pub waits: Semaphore,
    /// Bounds the short sequenced requests (releases) in flight. Separate from `waits` so
    /// that a release, which may be what ends those waits, never queues behind them.
    /// Keepalives and the close carry no sequence number and take no permit.
    pub short_requests: Semaphore,
    /// When the CreateSession that made it was sent.
    created: Instant,
    /// Shared by every group session of one logical session: lost in one group, the session
    /// is lost everywhere, and every guard of it reports `lost()`.
    lost: Arc<watch::Sender<Option<String>>>,
    /// Grants of this session an operator force-released, as the last keepalive said.
    taken: watch::Sender<Taken>,
    /// Held names someone waits for, as the last keepalive said (conflict events).
    contended: watch::Sender<std::collections::BTreeSet<String>>,
    /// Failovers seen by the renewal task (see the module comment).
    failovers: watch::Sender<u64>,
    deadline: Mutex<Instant>,
    /// Best-effort clean-ups (releases of dropped guards, abandoned waits); aborted on close.
    background: Mutex<Option<JoinSet<()>>>,
}

impl SessionShared {
    /// A fresh sequence number for a new logical request (retries reuse theirs), once the
    /// window allows it. The request counts as unanswered until the ticket is dropped.
    pub(crate) async fn begin_request(self: &Arc<Self>) -> SeqTicket {
        loop {
            let moved = self.window_moved.notified();
            tokio::pin!(moved);
            // Registered before looking, so that a move between the look and the wait is seen.
            moved.as_mut().enable();
            if let Some(seq) = self
                .window
                .lock()
                .expect("window lock poisoned")
                .try_begin()
            {
                return SeqTicket {
                    shared: self.clone(),
                    seq,
                };
            }
            moved.await;
        }
    }

    pub(crate) fn mark_lost(&self, why: &str) {
        self.lost.send_if_modified(|lost| {
            if lost.is_some() {
                return false;
            }
            if why == WHY_CLOSED || why == WHY_DROPPED {
                tracing::debug!(session = self.key.id.0, why, "session ended");
            } else {
                tracing::warn!(session = self.key.id.0, why, "session lost");
            }
            *lost = Some(why.to_owned());
            true
        });
    }

    /// Lost, or past the deadline on the client's clock.
    pub(crate) fn may_be_lost(&self) -> bool {
        self.lost.borrow().is_some()
            || self.client.clock().now() >= *self.deadline.lock().expect("deadline lock poisoned")
    }

    pub(crate) fn lost_error(&self) -> Option<Error> {
        self.lost.borrow().as_ref().map(|why| Error::SessionLost {
            id: self.key.id.0,
            why: why.clone(),
        })
    }

    pub(crate) fn watch_lost(&self) -> watch::Receiver<Option<String>> {
        self.lost.subscribe()
    }

    pub(crate) fn watch_taken(&self) -> watch::Receiver<Taken> {
        self.taken.subscribe()
    }

    pub(crate) fn watch_contended(&self) -> watch::Receiver<std::collections::BTreeSet<String>> {
        self.contended.subscribe()
    }

    /// A guard of `name` ended: its waiters were this grant's, not a later one's.
    pub(crate) fn forget_contended(&self, name: &str) {
        self.contended.send_if_modified(|names| names.remove(name));
    }

    /// A keepalive's list of held names that someone waits for: all of them, or, `truncated`,
    /// the first of them in name order. A cut list says nothing of the names after its last
    /// one (the server looks at held names in name order): what was known of those is kept
    /// until an answer lists all; names up to it that it does not list are not contended.
    fn contended_now(&self, names: Vec<String>, truncated: bool) {
        self.contended.send_if_modified(|old| {
            let new = merge_contended(old, names, truncated);
            if *old == new {
                return false;
            }
            *old = new;
            true
        });
    }

    /// A keepalive's list of force-released grants; logs the newly taken ones this client
    /// guards.
    fn taken_now(&self, tokens: Vec<u64>, through: u64) {
        let new = Taken {
            tokens: tokens.into_iter().collect(),
            through,
        };
        self.taken.send_if_modified(|old| {
            if *old == new {
                return false;
            }
            for t in new.tokens.difference(&old.tokens) {
                tracing::warn!(
                    session = self.key.id.0,
                    token = t,
                    "an operator force-released a lock of this session"
                );
            }
            *old = new;
            true
        });
    }

    /// Turns a server's "no such session" into the session being lost.
    pub(crate) fn check(&self, e: Error) -> Error {
        if let Error::SessionNotFound { message } = &e {
            self.mark_lost(&format!("the server does not know the session: {message}"));
            return self.lost_error().unwrap_or(e);
        }
        e
    }

    /// Runs `task` in the background until it ends or the session closes. Does nothing once
    /// the session is closed: closing released everything anyway.
    pub(crate) fn spawn_background(
        &self,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut background = self.background.lock().expect("background lock poisoned");
        if let Some(set) = background.as_mut() {
            while set.try_join_next().is_some() {}
            set.spawn_on(task, &handle);
        }
    }

    fn close_background(&self) -> Option<JoinSet<()>> {
        self.background
            .lock()
            .expect("background lock poisoned")
            .take()
    }
}

/// The grants of a session that an operator force-released (`AdminRelease`), from the keepalive
/// answers: the tokens the server remembers (at most `REVOKED_GRANTS_PER_SESSION_MAX`), and
/// the highest it forgot (every grant up to it may have been taken).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Taken {
    tokens: BTreeSet<u64>,
    through: u64,
}

impl Taken {
    pub(crate) fn covers(&self, token: u64) -> bool {
        token <= self.through || self.tokens.contains(&token)
    }
}

/// The sequence numbers of a session's unanswered requests. A new request waits while its
/// number would be `SESSION_SEQ_WINDOW_MAX` or more past the oldest unanswered one, so that the
/// server's memory of outcomes (`SESSION_OUTCOMES_MAX`, at least twice that) still holds the
/// oldest one's outcome when it is retried (the reasoning is at the constant).
#[derive(Debug)]
pub(crate) struct SeqWindow {
    next: u64,
    unanswered: BTreeSet<u64>,
}

impl SeqWindow {
    pub(crate) fn new(first: u64) -> SeqWindow {
        SeqWindow {
            next: first,
            unanswered: BTreeSet::new(),
        }
    }

    /// The next sequence number, if the window has room for it.
    pub(crate) fn try_begin(&mut self) -> Option<u64> {
        let oldest = self.unanswered.first().copied().unwrap_or(self.next);
        if self.next - oldest >= latchkey_core::limits::SESSION_SEQ_WINDOW_MAX as u64 {
            return None;
        }
        let seq = self.next;
        self.next += 1;
        self.unanswered.insert(seq);
        Some(seq)
    }

    /// Request `seq` was answered, or will never be sent again.
    pub(crate) fn end(&mut self, seq: u64) {
        self.unanswered.remove(&seq);
    }
}

/// A request's place in its session's [`SeqWindow`]; dropping it ends the request.
pub(crate) struct SeqTicket {
    shared: Arc<SessionShared>,
    pub seq: u64,
}

impl Drop for SeqTicket {
    fn drop(&mut self) {
        self.shared
            .window
            .lock()
            .expect("window lock poisoned")
            .end(self.seq);
        self.shared.window_moved.notify_waiters();
    }
}

/// A session: a lease on the server that keeps this client's locks alive.
///
/// One background task renews it every TTL / 3 and is stopped when the session is closed or
/// dropped. Dropping a session without [`Session::close`] stops the renewal, marks every guard
/// lost and sends a best-effort CloseSession in the background (if a tokio runtime is running);
/// if that fails too, the server expires the session after its TTL.
pub struct Session {
    /// The session of group 0 (of the only group, in a cluster of one).
    shared: Arc<SessionShared>,
    renewal: Option<JoinHandle<()>>,
    /// The sessions of the other groups, in a cluster of several (issue #16).
    others: Option<OtherGroups>,
}

/// The group sessions of a logical session besides group 0's, each made on the first lock of
/// its group ("registered lazily"), with its own renewal; all share the logical session's
/// `lost`, and their keepalives travel in the client's batches (one request per member that
/// leads any of them).
struct OtherGroups {
    groups: u32,
    /// When group 0's session was made: every group session renews on its schedule
    /// (`ClientLease::on_grid`).
    grid: Instant,
    owner: Option<latchkey_core::SessionOwner>,
    /// By group: the session and its renewal (taken when the session ends).
    made: Mutex<std::collections::BTreeMap<u32, GroupSession>>,
    /// Held while a group session is being made, so that two locks of one group make one.
    /// One per group (at most `GROUPS_MAX`), so that a group whose leader is away delays
    /// only the locks of that group.
    making: Vec<tokio::sync::Mutex<()>>,
}

/// One group's session of a logical session, and its renewal (taken when the session ends).
type GroupSession = (Arc<SessionShared>, Option<JoinHandle<()>>);

/// Opens a session of `ttl_ms` in `group` and starts its renewal. The answer says how many
/// groups the cluster has (the client remembers it): with more than one, the session is one
/// of a logical session's group sessions, renewed on one schedule with its siblings (`grid`,
/// group 0's creation when `None`).
async fn open(
    client: Client,
    ttl_ms: u64,
    owner: Option<&latchkey_core::SessionOwner>,
    group: u32,
    lost: Arc<watch::Sender<Option<String>>>,
    grid: Option<Instant>,
) -> Result<(Arc<SessionShared>, JoinHandle<()>), Error> {
    let opts = CallOpts {
        attempt_timeout: client.config().rpc_timeout,
        backoff_max: None,
        group,
    };
    // Before the first attempt: the lease starts no earlier than this on the server.
    // A retry after a lost answer may leave an orphan session on the server; it holds
    // nothing and expires after its TTL.
    let sent = client.clock().now();
    let (response, answered) = client
        .call_traced(
            opts,
            pb::CreateSessionRequest {
                ttl_ms,
                owner: owner.map(crate::types::owner_to_pb),
                // Named even in a cluster of one group, which accepts group 0 (a server from
                // before groups ignores the field).
                group: Some(group),
            },
            |mut c, r| async move { c.create_session(r).await },
        )
        .await?;
    let session = response
        .session
        .ok_or_else(|| Error::Protocol("CreateSession answered without a session".into()))?;
    let id = SessionId(session.id);
    let groups = client.learned_groups(response.groups)?;
    if latchkey_core::group_of_session(id, groups) != group {
        return Err(Error::Protocol(format!(
            "CreateSession in group {group} answered session {id}, of another group"
        )));
    }
    let in_groups = groups > 1;
    let ttl = Duration::from_millis(ttl_ms);
    let mut lease = ClientLease::new(sent, ttl);
    if let Some(grid) = grid.or(in_groups.then_some(sent)) {
        lease = lease.on_grid(grid);
    }
    lease.acknowledged(sent, Duration::from_millis(response.ttl_ms));
    let shared = Arc::new(SessionShared {
        client,
        key: SessionKey {
            id,
            secret: session.secret,
        },
        ttl: lease.ttl,
        group,
        groups,
        in_groups,
        created: sent,
        window: Mutex::new(SeqWindow::new(1)),
        window_moved: Notify::new(),
        guarded: Mutex::new(HashSet::new()),
        waits: Semaphore::new(latchkey_core::limits::SESSION_WAITS_IN_FLIGHT_MAX),
        short_requests: Semaphore::new(latchkey_core::limits::SESSION_SHORT_REQUESTS_IN_FLIGHT_MAX),
        lost,
        taken: watch::channel(Taken::default()).0,
        contended: watch::channel(Default::default()).0,
        failovers: watch::channel(0).0,
        deadline: Mutex::new(lease.deadline()),
        background: Mutex::new(Some(JoinSet::new())),
    });
    let renewal = tokio::spawn(renew(shared.clone(), lease, answered.endpoint));
    Ok((shared, renewal))
}

impl Session {
    pub(crate) async fn create(
        client: Client,
        ttl: Duration,
        owner: Option<latchkey_core::SessionOwner>,
    ) -> Result<Session, Error> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        latchkey_core::validate_ttl_ms(ttl_ms).map_err(|e| Error::InvalidArgument {
            message: e.to_string(),
        })?;
        let lost = Arc::new(watch::channel(None).0);
        // Group 0's session first: its answer says how many groups there are.
        let (shared, renewal) = open(client, ttl_ms, owner.as_ref(), 0, lost, None).await?;
        let groups = shared.groups;
        let grid = shared.created;
        Ok(Session {
            shared,
            renewal: Some(renewal),
            others: (groups > 1).then(|| OtherGroups {
                groups,
                grid,
                owner,
                made: Mutex::new(Default::default()),
                making: (0..groups).map(|_| tokio::sync::Mutex::new(())).collect(),
            }),
        })
    }

    /// The group session that takes the lock `name`: made on first use of its group.
    pub(crate) async fn for_lock(&self, name: &str) -> Result<Arc<SessionShared>, Error> {
        let Some(others) = &self.others else {
            return Ok(self.shared.clone());
        };
        let group = latchkey_core::group_of(name, others.groups);
        if group == 0 {
            return Ok(self.shared.clone());
        }
        let made = |others: &OtherGroups| {
            let made = others.made.lock().expect("groups lock poisoned");
            made.get(&group).map(|(s, _)| s.clone())
        };
        if let Some(s) = made(others) {
            return Ok(s);
        }
        let _making = others.making[group as usize].lock().await;
        if let Some(s) = made(others) {
            return Ok(s);
        }
        if let Some(e) = self.shared.lost_error() {
            return Err(e);
        }
        let ttl_ms = u64::try_from(self.shared.ttl.as_millis()).unwrap_or(u64::MAX);
        let (shared, renewal) = open(
            self.shared.client.clone(),
            ttl_ms,
            others.owner.as_ref(),
            group,
            self.shared.lost.clone(),
            Some(others.grid),
        )
        .await?;
        others
            .made
            .lock()
            .expect("groups lock poisoned")
            .insert(group, (shared.clone(), Some(renewal)));
        Ok(shared)
    }

    /// Every group session made so far: group 0's first.
    fn group_sessions(&self) -> Vec<Arc<SessionShared>> {
        let mut all = vec![self.shared.clone()];
        if let Some(others) = &self.others {
            let made = others.made.lock().expect("groups lock poisoned");
            all.extend(made.values().map(|(s, _)| s.clone()));
        }
        all
    }

    /// Takes the renewals of the other groups' sessions, to stop them.
    fn take_other_renewals(&self) -> Vec<JoinHandle<()>> {
        match &self.others {
            None => Vec::new(),
            Some(others) => {
                let mut made = others.made.lock().expect("groups lock poisoned");
                made.values_mut().filter_map(|(_, r)| r.take()).collect()
            }
        }
    }

    /// The session id (as shown by `latchkey status`).
    pub fn id(&self) -> u64 {
        self.shared.key.id.0
    }

    /// The lease length the server granted.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// How long before the server's earliest possible expiry this client declares the session
    /// lost.
    pub fn safety_margin(&self) -> Duration {
        safety_margin(self.shared.ttl)
    }

    /// The client-side deadline: if no renewal is acknowledged before it, the session is lost.
    ///
    /// With several Raft groups, the earliest of its group sessions' deadlines: the logical
    /// session is lost when any of them is.
    pub fn deadline(&self) -> Instant {
        self.group_sessions()
            .iter()
            .map(|s| *s.deadline.lock().expect("deadline lock poisoned"))
            .min()
            .expect("group 0's session is always there")
    }

    /// Each group session made so far, as `(session id, deadline)`, group 0's first: one
    /// element in a cluster of one group. [`Session::deadline`] is the earliest of them; a
    /// lock's own deadline is its group session's (the one [`LockGuard::session_id`] names).
    ///
    /// [`LockGuard::session_id`]: crate::LockGuard::session_id
    pub fn group_deadlines(&self) -> Vec<(u64, Instant)> {
        self.group_sessions()
            .iter()
            .map(|s| {
                (
                    s.key.id.0,
                    *s.deadline.lock().expect("deadline lock poisoned"),
                )
            })
            .collect()
    }

    /// The id of the session that takes the lock `name`: this session's own id in a cluster
    /// of one group; with several, its session in that lock's group. A lock's holder, as
    /// `latchkey status NAME` shows it, is this id.
    ///
    /// Not a mere getter with several groups: the first call for a group registers the
    /// logical session there (a `CreateSession` at that group's leader, then its renewal),
    /// as the first lock of the group would, and fails as that would (no leader within the
    /// budget: `Error::Unavailable`; the session already lost: its loss). Once registered,
    /// and in a cluster of one group, it answers at once without a request.
    pub async fn session_id_for(&self, name: &str) -> Result<u64, Error> {
        Ok(self.for_lock(name).await?.key.id.0)
    }

    /// How long ago the client-side deadline passed on this client's clock; zero before it.
    /// A holder that learns of a loss late (after a pause) has that much less time to stop.
    pub fn past_deadline(&self) -> Duration {
        self.shared
            .client
            .clock()
            .now()
            .saturating_duration_since(self.deadline())
    }

    /// How many failovers the session has lived through: renewals acknowledged by another
    /// node than the previous renewal, or only after failed attempts (an election, a node
    /// down). Starts at 0; never decreases.
    pub fn failovers(&self) -> u64 {
        *self.shared.failovers.borrow()
    }

    /// Completes at the next failover after the call (see [`Session::failovers`]), with the new
    /// count; never, if the session ends first.
    pub fn next_failover(&self) -> impl std::future::Future<Output = u64> + Send + 'static {
        let mut rx = self.shared.failovers.subscribe();
        let seen = *rx.borrow_and_update();
        async move {
            let next = rx.wait_for(|n| *n > seen).await.map(|n| *n);
            match next {
                Ok(n) => n,
                Err(_) => std::future::pending().await,
            }
        }
    }

    /// Whether the session may have been lost: [`Session::lost`] has completed, or the
    /// deadline has passed on this client's clock (exact even when the renewal task has not
    /// run since, as after a process pause).
    pub fn is_lost(&self) -> bool {
        self.group_sessions().iter().any(|s| s.may_be_lost())
    }

    /// Completes when the session may have been lost.
    pub fn lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        wait_lost(self.shared.watch_lost())
    }

    /// Starts a request for the lock `name` (exclusive); see [`LockRequest::wait`].
    pub fn lock(&self, name: impl Into<String>) -> LockRequest<'_> {
        LockRequest::new(self, name.into())
    }

    /// Starts a request to read-lock `name` (shared with other readers, never with a writer);
    /// see [`LockRequest::shared`].
    pub fn lock_shared(&self, name: impl Into<String>) -> LockRequest<'_> {
        self.lock(name).shared()
    }

    /// Campaigns in the election `name`: waits in its FIFO queue (no herd) until this session
    /// leads, then publishes `value` (at most `limits::ELECTION_VALUE_BYTES_MAX` bytes) and
    /// returns the [`Leadership`](crate::Leadership), whose token is the term's fencing
    /// token. Fails as [`LockRequest::wait`] does (the session lost, bad input).
    pub async fn campaign(
        &self,
        name: impl Into<String>,
        value: impl Into<Vec<u8>>,
    ) -> Result<crate::Leadership, Error> {
        self.campaign_within(name, value, None).await
    }

    /// [`Session::campaign`], giving up after `timeout` ([`LockRequest::wait`]'s, `None`: for
    /// ever); after a timeout the server may still make this session lead, as after a lock
    /// wait's.
    pub async fn campaign_within(
        &self,
        name: impl Into<String>,
        value: impl Into<Vec<u8>>,
        timeout: Option<std::time::Duration>,
    ) -> Result<crate::Leadership, Error> {
        let guard = self.lock(name).campaign(value.into()).wait(timeout).await?;
        Ok(crate::Leadership::new(guard))
    }

    /// Starts a request for one of the `permits` permits of the semaphore `name`; see
    /// [`LockRequest::permits`].
    pub fn acquire_permit(&self, name: impl Into<String>, permits: u32) -> LockRequest<'_> {
        self.lock(name).permits(permits)
    }

    /// Ends the session: stops the renewal, then asks the server to release its locks and
    /// drop its waits. Every guard reports `lost()` from here on.
    pub async fn close(mut self) -> Result<(), Error> {
        self.stop_renewal().await;
        // Every group's session, each at its group's leader, at once; the first error wins.
        let sessions = self.group_sessions();
        let closes = sessions.iter().map(|s| close_on_server(s));
        futures::future::join_all(closes)
            .await
            .into_iter()
            .collect::<Result<Vec<()>, Error>>()
            .map(|_| ())
    }

    async fn stop_renewal(&mut self) {
        let mut renewals: Vec<JoinHandle<()>> = self.renewal.take().into_iter().collect();
        renewals.extend(self.take_other_renewals());
        for renewal in renewals {
            renewal.abort();
            let _ = renewal.await;
        }
        for s in self.group_sessions() {
            if let Some(mut set) = s.close_background() {
                set.shutdown().await;
            }
        }
        self.shared.mark_lost(WHY_CLOSED);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let Some(renewal) = self.renewal.take() else {
            return; // closed
        };
        renewal.abort();
        for renewal in self.take_other_renewals() {
            renewal.abort();
        }
        let sessions = self.group_sessions();
        for s in &sessions {
            if let Some(set) = s.close_background() {
                drop(set); // aborts its tasks
            }
        }
        self.shared.mark_lost(WHY_DROPPED);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            // Detached on purpose: nothing is left to own them, and each call ends within
            // the client's retry budget.
            for shared in sessions {
                handle.spawn(async move {
                    if let Err(e) = close_on_server(&shared).await {
                        tracing::debug!(session = shared.key.id.0, error = %e, "best-effort close failed");
                    }
                });
            }
        }
    }
}

async fn close_on_server(shared: &SessionShared) -> Result<(), Error> {
    use pb::batch_op::Op;
    use pb::batch_result::Result as R;
    let opts = CallOpts {
        attempt_timeout: shared.client.config().rpc_timeout,
        backoff_max: None,
        group: shared.group,
    };
    let request = pb::CloseSessionRequest {
        session: pb_session(shared.key),
    };
    let batched: (fn(_) -> _, fn(_) -> _) = (Op::CloseSession, |r| match r {
        R::CloseSession(r) => Some(r),
        _ => None,
    });
    let closed = shared
        .client
        .call_or_batch(opts, request, batched, |mut c, r| async move {
            c.close_session(r).await
        })
        .await;
    match closed {
        // Already gone (expired, or a retry of a close that went through): closed all the same.
        Ok(_) | Err(Error::SessionNotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

pub(crate) async fn wait_lost(mut rx: watch::Receiver<Option<String>>) {
    // A dropped sender means the session is gone: lost as well.
    let _ = rx.wait_for(|lost| lost.is_some()).await;
}

/// Decides whether an acknowledged renewal marks a failover: another node answered than the
/// last time, or renewals failed since the last acknowledgement.
#[derive(Debug)]
pub(crate) struct FailoverDetector {
    last_endpoint: String,
    disrupted: bool,
}

impl FailoverDetector {
    pub(crate) fn new(endpoint: String) -> FailoverDetector {
        FailoverDetector {
            last_endpoint: endpoint,
            disrupted: false,
        }
    }

    /// A renewal failed after its retries.
    pub(crate) fn failed(&mut self) {
        self.disrupted = true;
    }

    /// A renewal was acknowledged by `endpoint` after `failed_attempts`: was it a failover?
    pub(crate) fn acknowledged(&mut self, endpoint: &str, failed_attempts: u32) -> bool {
        let failover = self.disrupted || failed_attempts > 0 || endpoint != self.last_endpoint;
        self.disrupted = false;
        if endpoint != self.last_endpoint {
            self.last_endpoint = endpoint.to_owned();
        }
        failover
    }
}

/// The renewal task: one per session, owned by its [`Session`].
async fn renew(shared: Arc<SessionShared>, lease: ClientLease, endpoint: String) {
    if !shared.in_groups {
        return renew_until_lost(shared, lease, endpoint).await;
    }
    let lost = wait_lost(shared.watch_lost());
    tokio::select! {
        () = renew_until_lost(shared.clone(), lease, endpoint) => {}
        () = lost => {
            // Lost in another group: the client gives up this group's locks as well, so
            // they go to their waiters now rather than when this lease runs out.
            if let Err(e) = close_on_server(&shared).await {
                tracing::debug!(session = shared.key.id.0, error = %e, "best-effort close failed");
            }
        }
    }
}

async fn renew_until_lost(shared: Arc<SessionShared>, mut lease: ClientLease, endpoint: String) {
    let key = shared.key;
    let clock = shared.client.clock();
    let mut failovers = FailoverDetector::new(endpoint);
    loop {
        tokio::select! {
            _ = sleep_until(clock, lease.deadline()) => break,
            _ = sleep_until(clock, lease.next_renewal()) => {}
        }
        let sent = clock.now();
        let until_deadline = lease.deadline().saturating_duration_since(sent);
        // A renewal races its deadline: short attempts (a paused or partitioned node must not
        // hold it for long) and frequent retries, so that it reaches a new leader soon after
        // an election. Keepalives are idempotent; re-sending one costs nothing.
        let opts = CallOpts {
            attempt_timeout: shared
                .client
                .config()
                .rpc_timeout
                .min(renewal_attempt_timeout(lease.ttl))
                .min(until_deadline),
            backoff_max: Some(renewal_backoff_max(lease.ttl)),
            group: shared.group,
        };
        let session = pb::Session {
            id: key.id.0,
            secret: key.secret,
        };
        // Sent together with every other session of this client due now (see `keepalive`).
        let call = crate::keepalive::keep_alive(&shared.client, session, opts);
        let result = tokio::select! {
            r = call => r,
            _ = sleep_until(clock, lease.deadline()) => break,
        };
        match result {
            Ok((lease_answer, answered)) => match lease_answer {
                Some(l) if l.alive => {
                    shared.taken_now(l.revoked_tokens, l.revoked_through);
                    shared.contended_now(l.contended, l.contended_truncated);
                    lease.acknowledged(sent, Duration::from_millis(l.ttl_ms));
                    *shared.deadline.lock().expect("deadline lock poisoned") = lease.deadline();
                    if failovers.acknowledged(&answered.endpoint, answered.failed_attempts) {
                        shared.failovers.send_modify(|n| *n += 1);
                        tracing::info!(
                            session = key.id.0,
                            endpoint = %answered.endpoint,
                            "session renewed after a failover"
                        );
                    }
                }
                Some(_) => {
                    shared.mark_lost("the server says the session has expired");
                    return;
                }
                None => {
                    tracing::warn!(session = key.id.0, "KeepAlive answer without this session");
                    lease.failed(clock.now());
                }
            },
            Err(Error::SessionNotFound { message }) => {
                shared.mark_lost(&format!("the server does not know the session: {message}"));
                return;
            }
            Err(e) => {
                tracing::warn!(session = key.id.0, error = %e, "renewal failed; retrying");
                failovers.failed();
                lease.failed(clock.now());
            }
        }
    }
    shared.mark_lost(
        "no renewal was acknowledged before the lease deadline (TTL minus safety margin)",
    );
}

/// The contended names after a keepalive's list (see `SessionShared::contended_now`).
fn merge_contended(
    old: &std::collections::BTreeSet<String>,
    listed: Vec<String>,
    truncated: bool,
) -> std::collections::BTreeSet<String> {
    let mut new: std::collections::BTreeSet<String> = listed.into_iter().collect();
    if truncated {
        let cut = new.last().cloned();
        let after: Vec<String> = old
            .iter()
            .filter(|n| cut.as_ref().is_none_or(|c| *n > c))
            .cloned()
            .collect();
        new.extend(after);
    }
    new
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cut list replaces what was known up to its last name and keeps the rest (the
    /// attacker review of issue #32: keeping every old name left a released-and-retaken lock
    /// "contended" for as long as the lists were cut).
    #[test]
    fn a_cut_contended_list_keeps_only_what_it_says_nothing_of() {
        let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
        let old = set(&["a", "c", "m", "z"]);
        let listed = vec!["b".to_string(), "m".to_string()];
        assert_eq!(
            merge_contended(&old, listed.clone(), true),
            set(&["b", "m", "z"])
        );
        assert_eq!(merge_contended(&old, listed, false), set(&["b", "m"]));
        assert_eq!(merge_contended(&old, Vec::new(), true), old);
        assert_eq!(merge_contended(&old, Vec::new(), false), set(&[]));
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_request_waits_while_the_oldest_unanswered_one_is_a_window_behind() {
        let window_max = latchkey_core::limits::SESSION_SEQ_WINDOW_MAX as u64;
        let mut w = SeqWindow::new(1);
        let oldest = w.try_begin().unwrap();
        // Newer requests come and go while the oldest stays unanswered...
        for expected in 2..=window_max {
            let seq = w.try_begin().unwrap();
            assert_eq!(seq, expected);
            w.end(seq);
        }
        // ...until the next would be a full window past it.
        assert_eq!(w.try_begin(), None);
        w.end(oldest);
        assert_eq!(w.try_begin(), Some(window_max + 1));
        // Answered requests never hold the window.
        let mut w = SeqWindow::new(1);
        for _ in 0..3 * window_max {
            let seq = w.try_begin().unwrap();
            w.end(seq);
        }
    }

    #[test]
    fn a_failover_is_another_node_or_a_retry() {
        let mut f = FailoverDetector::new("http://a".into());
        assert!(!f.acknowledged("http://a", 0));
        assert!(f.acknowledged("http://b", 0), "another node answered");
        assert!(!f.acknowledged("http://b", 0));
        assert!(f.acknowledged("http://b", 2), "answered after retries");
        f.failed();
        assert!(f.acknowledged("http://b", 0), "a renewal failed before");
        assert!(!f.acknowledged("http://b", 0));
    }

    #[test]
    fn margin_is_a_fifth_of_the_ttl_with_a_floor() {
        assert_eq!(
            safety_margin(Duration::from_secs(15)),
            Duration::from_secs(3)
        );
        assert_eq!(safety_margin(Duration::from_secs(2)), 400 * MS);
        assert_eq!(safety_margin(Duration::from_secs(1)), 200 * MS);
        assert_eq!(safety_margin(500 * MS), 200 * MS);
    }

    #[test]
    fn deadline_is_acked_send_plus_ttl_minus_margin() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(15);
        let mut lease = ClientLease::new(t0, ttl);
        assert_eq!(lease.deadline(), t0 + Duration::from_secs(12));
        assert_eq!(lease.next_renewal(), t0 + Duration::from_secs(5));

        // A renewal sent at t0+5 s and acknowledged (whenever) moves the deadline to t0+17 s.
        lease.acknowledged(t0 + Duration::from_secs(5), ttl);
        assert_eq!(lease.deadline(), t0 + Duration::from_secs(17));
        assert_eq!(lease.next_renewal(), t0 + Duration::from_secs(10));

        // A late acknowledgement of an older renewal never moves it back.
        lease.acknowledged(t0 + Duration::from_secs(1), ttl);
        assert_eq!(lease.deadline(), t0 + Duration::from_secs(17));
    }

    /// The group sessions of one logical session are made at different times (at the first
    /// lock of each group) but renew at the same instants, so that their renewals share the
    /// keepalive requests (issue #16).
    #[test]
    fn group_sessions_renew_on_one_grid() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(15);
        let home = ClientLease::new(t0, ttl).on_grid(t0);
        assert_eq!(home.next_renewal(), t0 + Duration::from_secs(5));
        // Made 2.3 s later: renewed at the grid's 5 s, not at 7.3 s.
        let mut late = ClientLease::new(t0 + 2300 * MS, ttl).on_grid(t0);
        assert_eq!(late.next_renewal(), t0 + Duration::from_secs(5));
        // Renewed a few ms after the grid instant: the next is the next grid instant.
        late.acknowledged(t0 + Duration::from_secs(5) + 3 * MS, ttl);
        assert_eq!(late.next_renewal(), t0 + Duration::from_secs(10));
        // Made on a grid instant: a whole interval later.
        let on = ClientLease::new(t0 + Duration::from_secs(5), ttl).on_grid(t0);
        assert_eq!(on.next_renewal(), t0 + Duration::from_secs(10));
        // Never later than the regular schedule, always after the last send, for any offset.
        for offset_ms in [0u32, 1, 999, 2500, 4999, 5000, 5001, 12_345] {
            let sent = t0 + offset_ms * MS;
            let lease = ClientLease::new(sent, ttl).on_grid(t0);
            let next = lease.next_renewal();
            assert!(
                next > sent && next <= sent + Duration::from_secs(5),
                "{offset_ms}"
            );
        }
    }

    #[test]
    fn server_ttl_shorter_than_asked_is_believed() {
        let t0 = Instant::now();
        let mut lease = ClientLease::new(t0, Duration::from_secs(15));
        lease.acknowledged(t0, Duration::from_secs(10));
        assert_eq!(lease.deadline(), t0 + Duration::from_secs(8));
        // Zero means "not said": keep ours.
        lease.acknowledged(t0, Duration::ZERO);
        assert_eq!(lease.deadline(), t0 + Duration::from_secs(8));
        // Longer than asked: keep ours (the smaller is safe).
        lease.acknowledged(t0, Duration::from_secs(60));
        assert_eq!(lease.deadline(), t0 + Duration::from_secs(8));
    }

    #[test]
    fn failed_renewal_retries_sooner_but_not_past_the_deadline() {
        let t0 = Instant::now();
        let mut lease = ClientLease::new(t0, Duration::from_secs(2));
        assert_eq!(lease.deadline(), t0 + 1600 * MS);
        lease.failed(t0 + 700 * MS);
        assert_eq!(lease.next_renewal(), t0 + 900 * MS);
        lease.failed(t0 + 1550 * MS);
        assert_eq!(lease.next_renewal(), t0 + 1600 * MS);
        // An acknowledgement returns to the regular schedule.
        lease.acknowledged(t0 + 1550 * MS, Duration::from_secs(2));
        assert_eq!(
            lease.next_renewal(),
            t0 + 1550 * MS + Duration::from_secs(2) / 3
        );
    }

    #[test]
    fn first_renewal_comes_before_the_deadline_for_every_ttl() {
        let t0 = Instant::now();
        for ttl_ms in [
            latchkey_core::limits::SESSION_TTL_MS_MIN,
            2_000,
            15_000,
            latchkey_core::limits::SESSION_TTL_MS_MAX,
        ] {
            let lease = ClientLease::new(t0, Duration::from_millis(ttl_ms));
            assert!(lease.next_renewal() < lease.deadline(), "ttl {ttl_ms} ms");
            // The margin leaves room for the CLI's kill grace (half the margin) and more.
            assert!(lease.margin >= SAFETY_MARGIN_MIN);
        }
    }
}
