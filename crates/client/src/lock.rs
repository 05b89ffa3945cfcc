//! Taking a lock ([`LockRequest`]) and holding it ([`LockGuard`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use latchkey_core::limits::{self, ACQUIRE_POLL_MS_MAX, WAIT_TIMEOUT_MS_MAX};
use latchkey_core::Mode;
use latchkey_proto::v1 as pb;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::client::CallOpts;
use crate::env::{sleep_until, ClientClock};
use crate::error::Error;
use crate::session::{pb_session, wait_lost, SeqTicket, SessionShared, Taken};
use pb::batch_op::Op;
use pb::batch_result::Result as R;

/// Header that carries the fencing token to a fenced resource (see the `latchkey-fence` crate).
pub const TOKEN_HEADER: &str = "latchkey-token";
/// Header that carries the lock name to a fenced resource.
pub const LOCK_HEADER: &str = "latchkey-lock";

/// [`limits::CLIENT_PENDING_AFTER_DEADLINE_MS_MAX`].
const PENDING_AFTER_DEADLINE_MAX: Duration =
    Duration::from_millis(limits::CLIENT_PENDING_AFTER_DEADLINE_MS_MAX);

/// How long after the caller's wait timeout a wait gives up on its own when no server answers
/// ([`limits::CLIENT_UNANSWERED_AFTER_DEADLINE_MS_MAX`], where its reason is).
pub const UNANSWERED_AFTER_DEADLINE_MAX: Duration =
    Duration::from_millis(limits::CLIENT_UNANSWERED_AFTER_DEADLINE_MS_MAX);

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `d` in whole milliseconds, rounded up.
fn ms_ceil(d: Duration) -> u64 {
    let whole = ms(d);
    if d > Duration::from_millis(whole) {
        whole.saturating_add(1)
    } else {
        whole
    }
}

/// A request for one lock in a session; made by [`Session::lock`](crate::Session::lock)
/// (exclusive unless [`LockRequest::shared`] or [`LockRequest::permits`] says otherwise).
pub struct LockRequest<'a> {
    session: &'a crate::Session,
    name: String,
    mode: Mode,
    /// A campaign's election value ([`Session::campaign`](crate::Session::campaign)).
    value: Option<Vec<u8>>,
    lock_delay: Duration,
    positions: Option<watch::Sender<u32>>,
}

impl<'a> LockRequest<'a> {
    pub(crate) fn new(session: &'a crate::Session, name: String) -> LockRequest<'a> {
        LockRequest {
            session,
            name,
            mode: Mode::Exclusive,
            value: None,
            lock_delay: Duration::ZERO,
            positions: None,
        }
    }

    /// Makes this request a campaign in the election `name` (issue #32): an exclusive acquire
    /// whose grant publishes `value` as the leader's (at most
    /// `limits::ELECTION_VALUE_BYTES_MAX` bytes). [`Session::campaign`](crate::Session::campaign)
    /// waits for it and wraps the guard in a [`Leadership`](crate::Leadership). A campaign
    /// takes no lock-delay (refused as an invalid argument).
    pub fn campaign(mut self, value: Vec<u8>) -> LockRequest<'a> {
        self.mode = Mode::Exclusive;
        self.value = Some(value);
        self
    }

    /// Ask for a lock-delay (docs/primitives.md): if this grant is lost (the session expires
    /// or is revoked, or an operator force-releases it), the server grants the name to nobody
    /// until `delay` after that, so that a resource that cannot check fencing tokens has time
    /// to finish what this holder started. A release or a close hands over at once. At most
    /// `limits::LOCK_DELAY_MS_MAX` (5 minutes), whole milliseconds; a mutex's (exclusive)
    /// acquire only, not a campaign's. Zero, the default: none.
    pub fn lock_delay(mut self, delay: Duration) -> LockRequest<'a> {
        self.lock_delay = delay;
        self
    }

    /// Report this request's place in the queue as it moves: every answer of a queued wait
    /// (each long-poll, at most `ACQUIRE_POLL_MS_MAX` apart, and each re-attach) sends its
    /// 1-based position to `positions`. Nothing is sent when the lock is granted at once.
    pub fn positions(mut self, positions: watch::Sender<u32>) -> LockRequest<'a> {
        self.positions = Some(positions);
        self
    }

    /// Take the lock as a reader of a read-write lock: any number of readers hold it
    /// together, never beside an exclusive holder (a writer). Readers queue FIFO with writers,
    /// so a reader behind a waiting writer waits (docs/primitives.md).
    pub fn shared(mut self) -> LockRequest<'a> {
        self.mode = Mode::Shared;
        self
    }

    /// Take one of the `permits` permits of a counting semaphore (1 to
    /// `limits::HOLDERS_PER_LOCK_MAX`; every acquire of the name must say the same count while
    /// it is in use, else [`Error::Conflict`]). Each permit's grant has its own token.
    pub fn permits(mut self, permits: u32) -> LockRequest<'a> {
        self.mode = Mode::Permits(permits);
        self
    }

    /// The mode this request takes the lock in.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Takes the lock, waiting in its FIFO queue for at most `timeout` (`None`: until granted;
    /// `Some(Duration::ZERO)`: try once, never queue).
    ///
    /// Fails with [`Error::WaitTimedOut`] when the wait ends without a grant (with
    /// [`Error::Held`], naming the holder, when a try-once found the lock held) and with
    /// [`Error::SessionLost`] if the session is lost meanwhile. The request keeps one sequence
    /// number across its long-polls and retries, so it keeps its place in the queue through
    /// reconnects and leader changes.
    ///
    /// Elections and unreachable nodes only make the wait longer: the request is re-sent (same
    /// sequence number) to whichever node leads, until an answer, the session is lost, or
    /// `timeout` plus [`UNANSWERED_AFTER_DEADLINE_MAX`] passes without an answer (then
    /// [`Error::WaitTimedOut`]).
    ///
    /// If this future is dropped while queued, or gives up unanswered, the server may still
    /// have the waiter; a background task of the session keeps polling it and releases the
    /// lock if it is granted after all (until the wait times out on the server or the session
    /// is closed). If the server answers that it no longer remembers the request's outcome
    /// (`request-too-old`, a [`Error::Conflict`]), a grant it may have made is looked up and
    /// released the same way.
    ///
    /// A new request of the session (wait or release) waits while the session's oldest
    /// unanswered request is `SESSION_SEQ_WINDOW_MAX` requests behind, so that the server
    /// still remembers that request's outcome when it is retried.
    pub async fn wait(self, timeout: Option<Duration>) -> Result<LockGuard, Error> {
        latchkey_core::validate_name(&self.name).map_err(|e| Error::InvalidArgument {
            message: e.to_string(),
        })?;
        if let Mode::Permits(permits) = self.mode {
            if permits == 0 || permits as usize > limits::HOLDERS_PER_LOCK_MAX {
                return Err(Error::InvalidArgument {
                    message: latchkey_core::Rejection::PermitsOutOfRange {
                        permits,
                        max: limits::HOLDERS_PER_LOCK_MAX as u32,
                    }
                    .to_string(),
                });
            }
        }
        if let Some(value) = &self.value {
            latchkey_core::validate_value(value).map_err(|e| Error::InvalidArgument {
                message: e.to_string(),
            })?;
        }
        let (mode, value) = (self.mode, self.value.as_deref());
        // Rounded up: a delay asked for is never shortened, and 0.5 ms is not "none".
        let lock_delay_ms = ms_ceil(self.lock_delay);
        if lock_delay_ms > limits::LOCK_DELAY_MS_MAX {
            return Err(Error::InvalidArgument {
                message: latchkey_core::Rejection::LockDelayOutOfRange {
                    lock_delay_ms,
                    max: limits::LOCK_DELAY_MS_MAX,
                }
                .to_string(),
            });
        }
        if lock_delay_ms > 0 && mode != Mode::Exclusive {
            return Err(Error::InvalidArgument {
                message: "a lock-delay is for an exclusive lock (a mutex) only".into(),
            });
        }
        if lock_delay_ms > 0 && value.is_some() {
            return Err(Error::InvalidArgument {
                message: "a campaign takes no lock-delay".into(),
            });
        }
        // The session of the lock's group (made now if it is the group's first lock).
        let shared = &self.session.for_lock(&self.name).await?;
        if let Some(e) = shared.lost_error() {
            return Err(e);
        }
        let _permit = shared
            .waits
            .acquire()
            .await
            .expect("the waits semaphore is never closed");
        let clock = shared.client.clock();
        let deadline = timeout.map(|t| clock.now() + t);
        loop {
            // One logical request: its seq is fixed here and reused by every re-send.
            let ticket = shared.begin_request().await;
            let mut pending = PendingAcquire {
                shared: shared.clone(),
                name: self.name.clone(),
                mode,
                value: self.value.clone(),
                lock_delay_ms,
                seq: ticket.seq,
                ticket: Some(ticket),
                deadline,
                armed: true,
            };
            // A request's first send may ride a batch (`ClientConfig::batch`); a re-send of a
            // queued request long-polls in a call of its own.
            let mut first = true;
            loop {
                let now = clock.now();
                let give_up_at = deadline.map(|d| d + UNANSWERED_AFTER_DEADLINE_MAX);
                let answer = tokio::select! {
                    r = acquire_once(shared, &self.name, (mode, value, lock_delay_ms), pending.seq, deadline, std::mem::take(&mut first)) => r,
                    _ = wait_lost(shared.watch_lost()) => {
                        pending.armed = false;
                        return Err(shared.lost_error().expect("lost"));
                    }
                    // Still armed: the background task settles the request.
                    _ = sleep_until_some(clock, give_up_at) => {
                        return Err(Error::WaitTimedOut { name: self.name });
                    }
                };
                let response = match answer {
                    Ok(response) => response,
                    // The retry budget of one call ran out (a long election, a partition):
                    // keep trying under the same seq while the session and the wait last.
                    Err(Error::Unavailable { .. } | Error::Transport { .. })
                        if give_up_at.is_none_or(|t| clock.now() < t) =>
                    {
                        continue
                    }
                    Err(e) if is_too_old(&e) => {
                        // Granted or not, the outcome is forgotten: a grant would be held
                        // with no guard, so look and release it.
                        pending.armed = false;
                        let (owner, name) = (shared.clone(), self.name.clone());
                        shared.spawn_background(async move { release_orphan(&owner, &name).await });
                        return Err(e);
                    }
                    Err(e) => return Err(e),
                };
                match pb::AcquireResult::try_from(response.result) {
                    Ok(pb::AcquireResult::Granted) => {
                        pending.armed = false;
                        return Ok(LockGuard::new(shared.clone(), self.name, response.token));
                    }
                    Ok(pb::AcquireResult::NotGranted) => {
                        pending.armed = false;
                        if deadline.is_none() {
                            // Only after the server's own cap on a wait (a day): start again.
                            break;
                        }
                        if let Some(h) = response.held_by.filter(|h| h.held) {
                            let holder = crate::types::LockInfo::from_pb(h).holder;
                            if let Some(holder) = holder {
                                return Err(Error::Held {
                                    name: self.name,
                                    holder: Box::new(holder),
                                });
                            }
                        }
                        return Err(Error::WaitTimedOut { name: self.name });
                    }
                    Ok(pb::AcquireResult::Pending) => {
                        if let Some(positions) = &self.positions {
                            positions.send_replace(response.position);
                        }
                        if deadline.is_some_and(|d| now > d + PENDING_AFTER_DEADLINE_MAX) {
                            // Still armed: the background task settles it.
                            return Err(Error::WaitTimedOut { name: self.name });
                        }
                    }
                    Ok(pb::AcquireResult::Unspecified) | Err(_) => {
                        return Err(Error::Protocol(format!(
                            "Acquire answered an unknown result {}",
                            response.result
                        )));
                    }
                }
            }
        }
    }

    /// Takes the lock if it is free now; `Ok(None)` if it is held.
    pub async fn try_acquire(self) -> Result<Option<LockGuard>, Error> {
        match self.wait(Some(Duration::ZERO)).await {
            Ok(guard) => Ok(Some(guard)),
            Err(Error::WaitTimedOut { .. } | Error::Held { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Cap of the backoff between attempts of one Acquire ([`limits::CLIENT_ACQUIRE_BACKOFF_MS_MAX`]).
const ACQUIRE_BACKOFF_MAX: Duration = Duration::from_millis(limits::CLIENT_ACQUIRE_BACKOFF_MS_MAX);

/// Sleeps until `clock` reads `at`, or forever.
async fn sleep_until_some(clock: &dyn ClientClock, at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(clock, at).await,
        None => std::future::pending().await,
    }
}

/// One Acquire call (with its retries) for request `seq` in `how` (its mode, a campaign's
/// value and the lock-delay), waiting until `deadline`; the request's `first` send rides a
/// batch with `ClientConfig::batch`.
async fn acquire_once(
    shared: &SessionShared,
    name: &str,
    how: (Mode, Option<&[u8]>, u64),
    seq: u64,
    deadline: Option<Instant>,
    first: bool,
) -> Result<pb::AcquireResponse, Error> {
    let wait_timeout_ms = match deadline {
        None => WAIT_TIMEOUT_MS_MAX,
        Some(d) => {
            ms(d.saturating_duration_since(shared.client.clock().now())).min(WAIT_TIMEOUT_MS_MAX)
        }
    };
    // The server long-polls at most ACQUIRE_POLL_MS_MAX whatever we ask (a re-attach may go by
    // the original wait), so every attempt allows a full poll.
    let opts = CallOpts {
        attempt_timeout: Duration::from_millis(ACQUIRE_POLL_MS_MAX)
            + shared.client.config().rpc_timeout,
        // A waiter should reach a new leader soon after an election; when the call's retry
        // budget runs out first, `wait` sends it again (same seq).
        backoff_max: Some(ACQUIRE_BACKOFF_MAX),
        group: shared.group,
    };
    let (mode, permits) = crate::types::mode_to_pb(how.0);
    let request = pb::AcquireRequest {
        session: pb_session(shared.key),
        seq,
        name: name.to_owned(),
        wait_timeout_ms,
        mode,
        permits,
        value: how.1.map(<[u8]>::to_vec),
        lock_delay_ms: how.2,
    };
    if first && shared.client.config().batch {
        // In a batch, a request that must wait answers PENDING at once (the server does not
        // long-poll it there): the next send of it is a call of its own.
        let opts = CallOpts {
            attempt_timeout: shared.client.config().rpc_timeout,
            ..opts
        };
        return shared
            .client
            .call_batched(opts, Op::Acquire(request), |r| match r {
                R::Acquire(r) => Some(r),
                _ => None,
            })
            .await
            .map(|(r, _)| r)
            .map_err(|e| shared.check(e));
    }
    shared
        .client
        .call(opts, request, |mut c, r| async move { c.acquire(r).await })
        .await
        .map_err(|e| shared.check(e))
}

/// An Acquire whose outcome the caller will never see. On drop, while armed, a background task
/// keeps re-sending it until it is decided and releases a late grant, so that a lock nobody
/// holds a guard for does not stay held until the session ends.
struct PendingAcquire {
    shared: Arc<SessionShared>,
    name: String,
    mode: Mode,
    value: Option<Vec<u8>>,
    /// The lock-delay the request asked for: a re-send asks the same.
    lock_delay_ms: u64,
    seq: u64,
    /// Keeps `seq` in the session's window until the request is settled.
    ticket: Option<SeqTicket>,
    deadline: Option<Instant>,
    armed: bool,
}

impl Drop for PendingAcquire {
    fn drop(&mut self) {
        if !self.armed || self.shared.lost_error().is_some() {
            return;
        }
        let shared = self.shared.clone();
        let (name, mode, seq, deadline) = (self.name.clone(), self.mode, self.seq, self.deadline);
        let value = self.value.take();
        let lock_delay_ms = self.lock_delay_ms;
        let ticket = self.ticket.take();
        self.shared.spawn_background(async move {
            let _ticket = ticket;
            loop {
                if shared.lost_error().is_some() {
                    return;
                }
                let how = (mode, value.as_deref(), lock_delay_ms);
                let response = match acquire_once(&shared, &name, how, seq, deadline, false).await {
                    Ok(r) => r,
                    Err(e) if is_too_old(&e) => {
                        release_orphan(&shared, &name).await;
                        return;
                    }
                    // A grant nobody holds a guard for must not be left behind because of an
                    // election: keep trying while the session lasts (closing it ends this).
                    Err(Error::Unavailable { .. } | Error::Transport { .. }) => continue,
                    Err(e) => {
                        tracing::debug!(lock = %name, seq, error = %e, "abandoned wait not settled");
                        return;
                    }
                };
                match pb::AcquireResult::try_from(response.result) {
                    Ok(pb::AcquireResult::Pending) => continue,
                    Ok(pb::AcquireResult::Granted) => {
                        let _ = release_on_server(&shared, &name, response.token).await;
                        return;
                    }
                    _ => return,
                }
            }
        });
    }
}

/// A held lock. Its fencing token goes with every write to the protected resource.
///
/// Dropping a guard without [`LockGuard::release`] sends a best-effort release in the
/// background (owned by the session, so it is abandoned if the session closes first, which
/// releases everything anyway). Call `release` to learn whether it worked.
#[must_use = "dropping a guard releases the lock in the background"]
pub struct LockGuard {
    shared: Arc<SessionShared>,
    name: String,
    token: u64,
    lost: watch::Receiver<Option<String>>,
    /// Force-released grants of the session: this guard's lock is lost if its token is one.
    taken: watch::Receiver<Taken>,
    released: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.name)
            .field("token", &self.token)
            .field("session", &self.shared.key.id.0)
            .finish()
    }
}

impl LockGuard {
    fn new(shared: Arc<SessionShared>, name: String, token: u64) -> LockGuard {
        let lost = shared.watch_lost();
        let taken = shared.watch_taken();
        shared
            .guarded
            .lock()
            .expect("guarded lock poisoned")
            .insert(name.clone());
        LockGuard {
            shared,
            name,
            token,
            lost,
            taken,
            released: false,
        }
    }

    /// The fencing token of this grant: larger than that of every earlier grant of the lock.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The session that holds the lock.
    pub fn session_id(&self) -> u64 {
        self.shared.key.id.0
    }

    /// Completes when the lock may be lost: the session's deadline on this client's clock
    /// clock passed without an acknowledged renewal, the server said the session is gone, the
    /// session was closed, or a keepalive answer said an operator force-released this grant
    /// (`latchkey admin release`; the lock is then already someone else's). Stop working
    /// under the lock at once; the server keeps it for the session's safety margin at most.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let session = wait_lost(self.lost.clone());
        let mut taken = self.taken.clone();
        let token = self.token;
        async move {
            tokio::select! {
                () = session => {}
                // A dropped sender means the session is gone: lost as well.
                _ = taken.wait_for(|t| t.covers(token)) => {}
            }
        }
    }

    fn taken(&self) -> bool {
        self.taken.borrow().covers(self.token)
    }

    /// Completes when someone is seen waiting for this lock (Chubby's "conflicting lock
    /// request"), so that a long holder can finish up and release it: the session's keepalive
    /// answers list its held names that have waiters, so it completes within about a renewal
    /// interval (a third of the TTL) of the first waiter queueing, or at once if one waits
    /// already. It also completes when the lock may be lost ([`LockGuard::lost`]): nobody
    /// needs it released then. Never completes for a lock nobody asks for.
    pub fn contended(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut contended = self.shared.watch_contended();
        let name = self.name.clone();
        let lost = self.lost();
        async move {
            tokio::select! {
                () = lost => {}
                // A dropped sender means the session is gone: lost as well.
                _ = contended.wait_for(|names| names.contains(&name)) => {}
            }
        }
    }

    /// Whether the last keepalive answer said someone waits for this lock.
    pub fn is_contended(&self) -> bool {
        self.shared.watch_contended().borrow().contains(&self.name)
    }

    /// Whether the lock may be lost: [`LockGuard::lost`] has completed, or the session's
    /// deadline has passed on this client's clock. The second is checked here, not left to the
    /// renewal task's timer, so that a holder that resumes from a pause and asks before
    /// writing gets the true answer.
    pub fn is_lost(&self) -> bool {
        self.shared.may_be_lost() || self.taken()
    }

    /// Whether an operator force-released this grant (`latchkey admin release`), as a
    /// keepalive answer said: the lock is certainly lost, not only maybe.
    pub fn force_released(&self) -> bool {
        self.taken()
    }

    /// Why the lock may be lost, once it may be.
    pub fn lost_reason(&self) -> Option<String> {
        if self.taken() {
            return Some(format!(
                "an operator force-released it (token {}); see `latchkey audit`",
                self.token
            ));
        }
        self.lost.borrow().clone()
    }

    /// Releases the lock. Fails with [`Error::NotHeld`] if the grant was no longer current
    /// (the lock had been lost), and with [`Error::SessionLost`] if the session is gone.
    pub async fn release(mut self) -> Result<(), Error> {
        self.release_in_place().await
    }

    /// [`LockGuard::release`], keeping the guard (its drop then releases nothing): what
    /// `Leadership::resign_keeping_term` needs to proclaim under the ended term.
    pub(crate) async fn release_in_place(&mut self) -> Result<(), Error> {
        self.released = true;
        release_on_server(&self.shared, &self.name, self.token).await
    }

    /// Publishes `value` as this grant's election value (`Proclaim`, issue #32). Fails with
    /// [`Error::Conflict`] `not-election-leader` if the grant is no longer current.
    pub(crate) async fn proclaim(&self, value: Vec<u8>) -> Result<(), Error> {
        latchkey_core::validate_value(&value).map_err(|e| Error::InvalidArgument {
            message: e.to_string(),
        })?;
        let shared = &self.shared;
        let _permit = shared
            .short_requests
            .acquire()
            .await
            .expect("the short-requests semaphore is never closed");
        let ticket = shared.begin_request().await;
        let request = pb::ProclaimRequest {
            session: pb_session(shared.key),
            seq: ticket.seq,
            name: self.name.clone(),
            token: self.token,
            value,
        };
        let opts = CallOpts {
            attempt_timeout: shared.client.config().rpc_timeout,
            backoff_max: None,
            group: shared.group,
        };
        shared
            .client
            .call(opts, request, |mut c, r| async move { c.proclaim(r).await })
            .await
            .map_err(|e| shared.check(e))?;
        Ok(())
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.shared
            .guarded
            .lock()
            .expect("guarded lock poisoned")
            .remove(&self.name);
        // What the keepalives said of this grant's waiters is not a later grant's.
        self.shared.forget_contended(&self.name);
        if self.released {
            return;
        }
        let shared = self.shared.clone();
        let (name, token) = (self.name.clone(), self.token);
        self.shared.spawn_background(async move {
            if let Err(e) = release_on_server(&shared, &name, token).await {
                tracing::debug!(lock = %name, token, error = %e, "best-effort release failed");
            }
        });
    }
}

/// Whether the server answered that it no longer remembers the request's outcome.
/// The server no longer remembers the request's outcome: `request-too-old`, or
/// `unknown-request` (the node's own end-of-wait cancel found the request neither queued nor
/// remembered). Either way a grant it may have made is unknown to us (docs/protocol.md).
fn is_too_old(e: &Error) -> bool {
    matches!(e, Error::Conflict { reason, .. }
        if reason == "request-too-old" || reason == "unknown-request")
}

/// An Acquire of `name` by this session was granted or not, and its outcome is lost to us:
/// if the server says the session holds `name` while no guard of ours does, release it, so
/// that a lock nobody knows about does not stay held until the session ends. (A session holds
/// a lock at most once, so the guard set tells ours apart from an orphan.)
async fn release_orphan(shared: &Arc<SessionShared>, name: &str) {
    let holders = match shared.client.describe(name).await {
        Ok(info) => info.holders,
        Err(e) => {
            tracing::debug!(lock = %name, error = %e, "cannot look for an orphan grant");
            return;
        }
    };
    // Of a name with several holders (readers, permits), this session's grant.
    let Some(holder) = holders.into_iter().find(|h| h.session == shared.key.id.0) else {
        return;
    };
    if shared
        .guarded
        .lock()
        .expect("guarded lock poisoned")
        .contains(name)
    {
        return;
    }
    if let Err(e) = release_on_server(shared, name, holder.token).await {
        tracing::debug!(lock = %name, token = holder.token, error = %e, "orphan grant not released");
    }
}

async fn release_on_server(
    shared: &Arc<SessionShared>,
    name: &str,
    token: u64,
) -> Result<(), Error> {
    let _permit = shared
        .short_requests
        .acquire()
        .await
        .expect("the short-requests semaphore is never closed");
    let ticket = shared.begin_request().await;
    let request = pb::ReleaseRequest {
        session: pb_session(shared.key),
        seq: ticket.seq,
        name: name.to_owned(),
        token,
    };
    let opts = CallOpts {
        attempt_timeout: shared.client.config().rpc_timeout,
        backoff_max: None,
        group: shared.group,
    };
    let batched: (fn(_) -> _, fn(_) -> _) = (Op::Release, |r| match r {
        R::Release(r) => Some(r),
        _ => None,
    });
    let response = shared
        .client
        .call_or_batch(opts, request, batched, |mut c, r| async move {
            c.release(r).await
        })
        .await
        .map_err(|e| shared.check(e))?;
    if response.released {
        Ok(())
    } else {
        Err(Error::NotHeld {
            name: name.to_owned(),
            token,
        })
    }
}

/// The header that carries `guard`'s fencing token to a fenced resource:
/// `("latchkey-token", "<token>")`. Send [`fencing_headers`] to name the lock as well.
pub fn fencing_header(guard: &LockGuard) -> (&'static str, String) {
    (TOKEN_HEADER, guard.token().to_string())
}

/// Both fencing headers: `latchkey-lock: <name>` and `latchkey-token: <token>`.
pub fn fencing_headers(guard: &LockGuard) -> [(&'static str, String); 2] {
    [
        (LOCK_HEADER, guard.name().to_owned()),
        fencing_header(guard),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock-delay is never shortened on its way to the server (the attacker review of
    /// issue #32 found 0.5 ms sent as none).
    #[test]
    fn a_lock_delay_is_rounded_up_to_whole_milliseconds() {
        assert_eq!(ms_ceil(Duration::ZERO), 0);
        assert_eq!(ms_ceil(Duration::from_micros(500)), 1);
        assert_eq!(ms_ceil(Duration::from_millis(3)), 3);
        assert_eq!(ms_ceil(Duration::from_micros(3_001)), 4);
        assert_eq!(ms_ceil(Duration::MAX), u64::MAX);
    }
}
