//! Plain answers of the read-only calls; no protobuf types leak out of this crate.

use std::time::Duration;

use latchkey_core::{Mode, SessionOwner};
use latchkey_proto::v1 as pb;

/// One lock as the leader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    pub name: String,
    /// `None` when the lock is free; of several holders (readers, permits), the first granted.
    pub holder: Option<Holder>,
    /// How it is held: `Exclusive` (a mutex or a writer; also a free lock), `Shared` (readers)
    /// or `Permits(n)` (a semaphore of n permits).
    pub mode: Mode,
    /// Every holder, in the order granted.
    pub holders: Vec<Holder>,
    /// Sessions queued for the lock.
    pub waiters: u32,
    /// The first waiters in queue order (all of them from `describe`, a few from `list`).
    pub queue: Vec<Waiter>,
    /// The lock-delay the holder's grant asked for ([`crate::LockRequest::lock_delay`]).
    pub lock_delay: Option<Duration>,
    /// While a lock-delay runs (a holder's grant was lost; no holder): how long until the
    /// name is granted again.
    pub delay_remaining: Option<Duration>,
    /// While a lock-delay runs: the token of the lost grant that started it;
    /// [`crate::Client::admin_release`] with it ends the delay.
    pub delay_token: Option<u64>,
}

/// One session waiting for a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter {
    pub session: u64,
    /// How long it has waited, by the leader's clock.
    pub waited: Duration,
    pub owner: Option<SessionOwner>,
    /// How it asked for the lock.
    pub mode: Mode,
}

/// The current holder of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub session: u64,
    /// The fencing token of the grant.
    pub token: u64,
    /// How long the lock has been held, by the leader's clock.
    pub held_for: Duration,
    /// What the holder's client said about itself, if anything.
    pub owner: Option<SessionOwner>,
    /// The election value this holder published (a campaign's or a proclaim's), if any: it
    /// is then the election's leader (issue #32).
    pub value: Option<Vec<u8>>,
}

impl Holder {
    /// "held by session 10 (host web-3, pid 4411) for 2m03s".
    pub fn describe(&self) -> String {
        format!(
            "held by {} for {}",
            describe_session(self.session, self.owner.as_ref()),
            human_duration(self.held_for)
        )
    }
}

/// "session 10 (host web-3, pid 4411, user deploy: nightly job)", or "session 10" without an
/// owner description.
pub fn describe_session(session: u64, owner: Option<&SessionOwner>) -> String {
    let Some(o) = owner else {
        return format!("session {session}");
    };
    let mut parts = Vec::new();
    if !o.host.is_empty() {
        parts.push(format!("host {}", o.host));
    }
    if o.pid != 0 {
        parts.push(format!("pid {}", o.pid));
    }
    if !o.user.is_empty() {
        parts.push(format!("user {}", o.user));
    }
    let mut s = parts.join(", ");
    if !o.text.is_empty() {
        if !s.is_empty() {
            s.push_str(": ");
        }
        s.push_str(&o.text);
    }
    if s.is_empty() {
        format!("session {session}")
    } else {
        format!("session {session} ({s})")
    }
}

/// A short human duration: `4.2s`, `2m03s`, `1h05m`.
pub fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 10_000 {
        format!("{:.1}s", d.as_secs_f64())
    } else if ms < 3_600_000 {
        format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60)
    } else {
        format!("{}h{:02}m", ms / 3_600_000, (ms / 60_000) % 60)
    }
}

pub(crate) fn owner_from_pb(o: pb::Owner) -> SessionOwner {
    SessionOwner {
        host: o.host,
        pid: o.pid,
        user: o.user,
        text: o.text,
    }
}

pub(crate) fn owner_to_pb(o: &SessionOwner) -> pb::Owner {
    pb::Owner {
        host: o.host.clone(),
        pid: o.pid,
        user: o.user.clone(),
        text: o.text.clone(),
    }
}

impl LockInfo {
    pub(crate) fn from_pb(lock: pb::LockInfo) -> LockInfo {
        let holder = lock.held.then(|| Holder {
            session: lock.session,
            token: lock.token,
            held_for: Duration::from_millis(lock.held_for_ms),
            owner: lock.owner.map(owner_from_pb),
            value: lock.value,
        });
        let mut holders: Vec<Holder> = lock
            .holders
            .into_iter()
            .map(|h| Holder {
                session: h.session,
                token: h.token,
                held_for: Duration::from_millis(h.held_for_ms),
                owner: h.owner.map(owner_from_pb),
                value: h.value,
            })
            .collect();
        if holders.is_empty() {
            // A server from before issue #32 names its one holder only.
            holders.extend(holder.clone());
        }
        LockInfo {
            holder,
            mode: mode_from_pb(lock.mode, lock.permits),
            holders,
            name: lock.name,
            waiters: lock.waiters,
            queue: lock
                .queue
                .into_iter()
                .map(|w| Waiter {
                    session: w.session,
                    waited: Duration::from_millis(w.waited_ms),
                    owner: w.owner.map(owner_from_pb),
                    mode: mode_from_pb(w.mode, lock.permits),
                })
                .collect(),
            lock_delay: (lock.lock_delay_ms > 0).then(|| Duration::from_millis(lock.lock_delay_ms)),
            delay_remaining: lock.delay_remaining_ms.map(Duration::from_millis),
            delay_token: lock.delay_token,
        }
    }
}

/// A mode from the wire (an unknown one, from a newer server, read as exclusive).
pub(crate) fn mode_from_pb(mode: i32, permits: u32) -> Mode {
    match pb::LockMode::try_from(mode) {
        Ok(pb::LockMode::Shared) => Mode::Shared,
        Ok(pb::LockMode::Permits) => Mode::Permits(permits),
        Ok(pb::LockMode::Exclusive) | Err(_) => Mode::Exclusive,
    }
}

/// The mode as the wire says it: the enum and a semaphore's permits (0 for a lock).
pub(crate) fn mode_to_pb(mode: Mode) -> (i32, u32) {
    match mode {
        Mode::Exclusive => (pb::LockMode::Exclusive as i32, 0),
        Mode::Shared => (pb::LockMode::Shared as i32, 0),
        Mode::Permits(n) => (pb::LockMode::Permits as i32, n),
    }
}

/// Options of a new session ([`Client::session_with`](crate::Client::session_with)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionOptions {
    /// The lease (1 s to 1 h).
    pub ttl: Duration,
    /// Who runs the session, shown by `status` and `list` (see
    /// [`SessionOptions::owner_of_this_process`]).
    pub owner: Option<SessionOwner>,
}

impl SessionOptions {
    /// This process's host name, pid and user, with `text` (may be empty).
    pub fn owner_of_this_process(text: &str) -> SessionOwner {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_default();
        let user = std::env::var("USER")
            .or_else(|_| std::env::var("LOGNAME"))
            .or_else(|_| std::env::var("USERNAME"))
            .unwrap_or_else(|_| user_of_this_process());
        let cut = |s: &str, max: usize| {
            let mut end = s.len().min(max);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s[..end].to_owned()
        };
        SessionOwner {
            host: cut(host.trim(), latchkey_core::limits::OWNER_HOST_BYTES_MAX),
            pid: std::process::id(),
            user: cut(user.trim(), latchkey_core::limits::OWNER_USER_BYTES_MAX),
            text: text.to_owned(),
        }
    }
}

/// This process's user when the environment does not name one (cron, systemd, `env -i`): the
/// uid's name in the passwd database, or the uid itself (as Python's `getpass` does).
fn user_of_this_process() -> String {
    #[cfg(target_os = "linux")]
    {
        let uid = nix::unistd::getuid();
        match nix::unistd::User::from_uid(uid) {
            Ok(Some(user)) => user.name,
            _ => uid.to_string(),
        }
    }
    #[cfg(not(target_os = "linux"))]
    String::new()
}

/// One administrative action from the audit log ([`Client::audit`](crate::Client::audit)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// The Raft group whose log holds it (0 in a cluster of one); `index` is of that log.
    pub group: u32,
    pub index: u64,
    /// Leader wall clock, Unix ms.
    pub at_ms: u64,
    /// "force-release" or "revoke".
    pub action: String,
    /// force-release: the lock; revoke: empty.
    pub lock: String,
    pub session: u64,
    /// force-release: the grant taken.
    pub token: u64,
    /// force-release: the next waiter's grant (0: none).
    pub next_token: u64,
    /// revoke: how many locks the session held.
    pub locks: u32,
    /// The authenticated identity; `None` without access control.
    pub identity: Option<String>,
    /// What the operator's tool said about them (e.g. user@host).
    pub operator: String,
    pub reason: String,
}

impl AuditEntry {
    pub(crate) fn from_pb(r: pb::AuditRecord) -> AuditEntry {
        AuditEntry {
            group: r.group,
            index: r.index,
            at_ms: r.at_ms,
            action: r.action,
            lock: r.lock,
            session: r.session,
            token: r.token,
            next_token: r.next_token,
            locks: r.locks,
            identity: (!r.identity.is_empty()).then_some(r.identity),
            operator: r.operator,
            reason: r.reason,
        }
    }
}

/// The answer of [`Client::list`](crate::Client::list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockList {
    pub locks: Vec<LockInfo>,
    /// More locks matched than the server returns in one answer.
    pub truncated: bool,
}

/// One node's view of its Raft group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub id: u64,
    /// "leader", "follower", "candidate", "learner" or "shutdown".
    pub role: String,
    pub term: u64,
    pub last_log_index: u64,
    pub applied_index: u64,
    /// The leader this node believes in, if any.
    pub leader_id: Option<u64>,
    /// The voters.
    pub members: Vec<Member>,
    /// Members being added, not voting yet.
    pub learners: Vec<Member>,
    /// The cluster's id (`latchkey serve --join` takes it).
    pub cluster_id: String,
    pub sessions: u64,
    pub locks: u64,
    /// The cluster's Raft groups (issue #16; 1 from a server before groups). The fields above
    /// are group 0's.
    pub groups: u32,
    /// This node's view of every group, in group order (empty from a server before groups).
    pub group_status: Vec<GroupStatus>,
}

/// One Raft group as one node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupStatus {
    pub group: u32,
    /// As [`NodeStatus::role`], in this group.
    pub role: String,
    pub term: u64,
    pub last_log_index: u64,
    pub applied_index: u64,
    pub leader_id: Option<u64>,
    pub sessions: u64,
    pub locks: u64,
    /// The group's voters as this node knows them: every member, unless the cluster places
    /// its groups on replica subsets (`serve --replicas`); none on a node outside the group
    /// (role `outside`).
    pub voters: Vec<Member>,
}

/// A member of a group: its id and client address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub addr: String,
}

/// A Raft group's voters after a membership change in it (`Client::add_member_in`,
/// `Client::remove_member_from`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupVoters {
    pub group: u32,
    pub voters: Vec<Member>,
}

/// A consistent copy of the whole table, as `Client::backup` received it: the bytes are the
/// core's table encoding (`latchkey_core::codec`), checked against the header's length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backup {
    /// The Raft group it copies (0 in a cluster of one).
    pub group: u32,
    /// The last log index applied to the table: every fencing token issued so far is at most
    /// this.
    pub applied_index: u64,
    /// The cluster it came from: its members (`ID=ADDR,...`) and fingerprint.
    pub members: String,
    pub fingerprint: String,
    /// The SHA-256 the server computed over `table` (the caller checks it).
    pub table_sha256: Vec<u8>,
    pub table: Vec<u8>,
}
