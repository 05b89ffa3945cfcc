//! The lock table: sessions, locks, queues and the outcomes of recent requests.
//!
//! `LockTable::apply` is the whole state machine. It is deterministic: the same entries in the
//! same order give the same table on every member, which is what lets Raft replicate it.
//!
//! Handover: a release, close, expiry, force-release or revoke hands the lock to exactly one
//! waiter (the head of its queue) in the same entry, through the one `hand_over`, so an
//! operator's action gives the next holder a higher token like any release. Sessions leaving in
//! one entry drop their waits before their holds, so a lock is never handed to a session that
//! is leaving. `apply` asserts at every handover that the token increases.
//!
//! Read-write locks and semaphores (issue #32; `docs/primitives.md`): an acquire in
//! `Mode::Shared` or `Mode::Permits(n)` (`Op::AcquireWith`), or of a name already used so, puts
//! the name in `multi`, as a `MultiLock` of one `LockKind` with every holder and one FIFO queue
//! of waiters in their modes; a mutex moves there when a reader queues behind its holder. A
//! mutex keeps the code path, answers and encoding it had before. After every change to a
//! `MultiLock`'s holders or queue, `admit` grants the waiters at the head that fit (a writer
//! alone, the run of readers, as many as there are free permits), so a head that fits never
//! waits (`check_multi`); sessions leaving in one entry leave every such name first, and it is
//! handed on once. Tokens: a lock's grants take the entry's index (readers granted together
//! share it); a semaphore's take consecutive numbers from the index of its first grant, which
//! stay at most the granting entry's index (`MultiLock::grant_token` says why), so several
//! permits handed on by one entry each get their own. A kind or permit count that conflicts
//! with the name's is refused (`Rejection::KindConflict`, `PermitsConflict`) before anything
//! changes. A table with a `MultiLock`, or a session that remembers one of issue #32's
//! rejections, is written in snapshot format 8; any other in format 7, as before.
//!
//! Elections (issue #32): an `Op::Campaign` is an exclusive acquire that carries a value. Its
//! grant, at once or handed over from the queue (`publish_campaign`, in `hand_over`, `admit`
//! and `end_delays`), publishes the value in `values` under the grant's token; while it waits,
//! the value is kept in `campaigns` by request and dropped with the wait (`drop_campaign`). A
//! value leaves `values` with its grant, in the one `forget_hold` every ending grant goes
//! through, so a published value always belongs to its name's exclusive holder
//! (`check_values`). `Op::Proclaim` replaces it for that holder only
//! (`Rejection::NotElectionLeader` otherwise). Values are charged (`limits::TABLE_VALUE_BYTES`
//! plus their bytes) the same while waiting and published (with the name's bytes: a snapshot
//! writes the name again beside a published value), so a handover needs no room. A table with
//! a value, or a session that remembers a proclaim's answer, is written in snapshot format 9;
//! any other as before.
//!
//! Lock-delay (issue #32 item 4; `docs/primitives.md`): a mutex acquire may ask for a delay
//! (`Op::AcquireDelayed`), remembered in `Delays` with its grant or its wait. When such a grant
//! is lost (expiry, revoke, force-release: `Ends::Lost`; a release or close is `Ends::Clean`)
//! the name leaves `locks` for `Delays::running`, with no holder and its queue kept, until an
//! `Op::EndDelays` names it (by the lost grant's token; the leader proposes it once the delay
//! has run on its monotonic clock, `crates/server/src/node/delays.rs`: the table keeps no end
//! time) or an operator ends it (`Op::ForceReleaseTargeted` with `ForceTarget::Delay`, or the
//! older `Op::ForceRelease`, which ends a delay it finds: a targeted force-release of the
//! holder does not, so its retry keeps the delay it started); then the first live waiter gets it (a queued
//! campaign publishes its value then). A running delay keeps its holder's identity and counts
//! against it (`Delays::per_identity`, bounded by `limits::DELAYS_PER_IDENTITY_MAX`); a group
//! keeps at most `limits::DELAYS_MAX`. A name is in one of `locks`, `multi` and `running`
//! (`check_delays`: no grant while a delay runs). A campaign asks for no delay, but may wait for a name that has one. A
//! table with delay state, or a session that remembers a lock-delay rejection, is written in
//! snapshot format 10; any other as before.
//!
//! Time: the one decision that depends on it is whether a wait has ended (a waiter records
//! `now_ms + wait_ms` of its Acquire, the leader's time in the entry; a release passes over
//! ended waiters, `ExpireWaits` removes them). Skew between leaders' wall clocks only
//! lengthens or shortens a wait: no lease, grant order among live waiters or token depends on it.
//!
//! Byte budget: every command that adds a session, a held lock or a queued wait first checks
//! [`LockTable::bytes`] plus its charge against the budget and is refused
//! `Rejection::TableFull` otherwise; releases, closes, cancels and expiries never need room (a
//! session's remembered outcomes are charged when it is created) and only shrink the table, so
//! a table above a budget lowered by a restart only shrinks. The debug build asserts after
//! every entry that no entry grew the table past the budget and, while the table is small
//! (`DEBUG_CHECK_ITEMS_MAX`), that the count equals a recount along with every other
//! invariant; larger tables are checked whole on decode. Each charge is at least the thing's
//! encoded size, so a snapshot is never larger than the accounted bytes plus a small header
//! and any table within the budget can be streamed to a member.
//!
//! A held lock's name is stored once, shared by the lock and its holder's session; a snapshot
//! leaves the sessions' holds out and decoding rebuilds them from the locks, so an installed
//! table shares names too (`tests/memory.rs` budgets the bytes per held lock).
//!
//! Operators' actions (`ForceRelease`, `RevokeSession`) append an `AuditRecord` (index, leader
//! time, action, `Actor`, reason) to the audit log, which snapshots carry. A force-release
//! records the taken token in the holder session's `revoked` list (at most
//! `REVOKED_GRANTS_PER_SESSION_MAX`, the oldest dropped into `revoked_through`), which every
//! keepalive answer carries (`revoked_tokens` on the wire), so its client fires `lost()` for that guard while its other locks stay. A
//! try-lock that finds the lock held gets the holder as of its own entry (`Applied::busy`).

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use arcstr::ArcStr;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::groups::GroupShape;
use crate::limits;
use crate::types::*;

/// Memory: a member may hold a million locks (issue #11), so a held lock costs one heap copy of
/// its name, shared by `locks` and the holder's `Session::held`, and no queue unless someone
/// waits (`tests/memory.rs` counts the bytes).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(from = "DecodedTable")]
pub struct LockTable {
    /// Index of the last applied entry. Fencing tokens are entry indexes, so every token issued
    /// so far is at most this.
    last_index: u64,
    sessions: BTreeMap<SessionId, Session>,
    /// Mutexes, only while held. A lock with waiters is always held: a release hands it over in
    /// the same entry, so "free with a queue" is a state that cannot exist. (Names with several
    /// holders are in `multi`.)
    locks: BTreeMap<Name, Lock>,
    /// Every queued wait by the time it ends (leader wall-clock ms): (until_ms, session, seq).
    /// An index over the queues, so the leader finds ended waits without a scan.
    wait_ends: BTreeSet<(u64, SessionId, u64)>,
    /// Administrative actions (force-release, revoke), oldest first, at most
    /// `limits::AUDIT_RECORDS_MAX`. Outside the byte budget: bounded on its own (at most
    /// `limits::AUDIT_BYTES_MAX`), and an operator's force-release must work in a full table.
    audit: VecDeque<AuditRecord>,
    /// Names used with shared holders or permits (issue #32), held or waited for: a name is
    /// here or in `locks`, never both. A mutex moves here when a reader queues behind its
    /// holder, and never back (it leaves when free). Written only in snapshot format 8.
    multi: BTreeMap<Name, MultiLock>,
    /// Elections' published values (issue #32), by name: the value of the exclusive grant
    /// under `token`, which holds the name. Written only in snapshot formats 9 and 10.
    values: BTreeMap<Name, Published>,
    /// The values of queued campaigns, by request (session, seq): published when the request
    /// is granted, dropped when its wait ends. Written only in snapshot formats 9 and 10.
    campaigns: BTreeMap<(SessionId, u64), Vec<u8>>,
    /// Lock-delays (issue #32 item 4): asked for by held and queued acquires, and running.
    /// Written only in snapshot format 10.
    delays: Delays,
    /// The accounted bytes of the sessions, locks and waits (see `limits::TABLE_LOCK_BYTES` and
    /// the rest), kept by every change; not written, recounted on decode. `check_invariants`
    /// recounts it.
    #[serde(skip)]
    bytes: usize,
    /// The budget `apply` keeps `bytes` within: not replicated, so every member must be given the
    /// same one (the server makes it part of the cluster's fingerprint).
    #[serde(skip)]
    bytes_max: usize,
    /// Which Raft group this table is, of how many: session ids are made from it
    /// (`GroupShape::session_id`). Not replicated, like the budget: every member of a group is
    /// given the same one (the cluster's group count is recorded in its data dirs and part of its
    /// fingerprint).
    #[serde(skip)]
    shape: GroupShape,
    /// Bugs put back on purpose, for the simulation's checkers to catch (all off but there).
    /// Not replicated, like the budget: the server sets the same on every member.
    #[serde(skip)]
    plant: TablePlant,
    /// Per identity (access control): its live sessions and their queued Acquire requests,
    /// counted as they change, so that a quota check reads them at once rather than scan
    /// every session (it did: issue #35's review, F2). Not written; rebuilt on decode, and
    /// held to a count made afresh by `check_invariants`.
    #[serde(skip)]
    identities: BTreeMap<String, IdentityCount>,
}

/// One identity's entry in `LockTable::identities`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct IdentityCount {
    sessions: usize,
    waiting: usize,
}

/// Adds `sessions` and `waiting` (each -1, 0 or 1) to `identity`'s count in `counts` (none: no
/// access control, nothing counted); an identity whose counts reach zero leaves the map.
fn count_identity(
    counts: &mut BTreeMap<String, IdentityCount>,
    identity: Option<&str>,
    sessions: isize,
    waiting: isize,
) {
    let Some(id) = identity else {
        return;
    };
    if !counts.contains_key(id) {
        counts.insert(id.to_owned(), IdentityCount::default());
    }
    let c = counts.get_mut(id).expect("inserted above");
    c.sessions = c
        .sessions
        .checked_add_signed(sessions)
        .expect("an identity's sessions are counted before they end");
    c.waiting = c
        .waiting
        .checked_add_signed(waiting)
        .expect("an identity's waits are counted before they end");
    if *c == IdentityCount::default() {
        counts.remove(id);
    }
}

/// Bugs of the read-write locks, semaphores and elections (issue #32) put back on purpose, so
/// that the simulation shows its checkers catch each (`latchkey-sim --plant NAME`). Every field
/// is false unless a simulation sets it (through the server's `Plant::table`). Each leaves the
/// table's own invariants standing (a snapshot of it decodes): the harm is to holders the table
/// no longer records, to the order and tokens of grants, or to whose value a leader publishes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[doc(hidden)]
pub struct TablePlant {
    /// A permit's release frees a second permit too: another holder's grant is dropped without
    /// telling its session, which goes on holding, so a semaphore gets more than N holders.
    pub permit_freed_twice: bool,
    /// A reader that finds only readers holding is granted at once, past a waiting writer.
    pub reader_past_writer: bool,
    /// A writer that finds only readers holding is granted at once, their grants dropped
    /// without telling their sessions: readers go on reading beside a writer.
    pub writer_beside_readers: bool,
    /// A writer granted after readers takes their token (the last one) instead of its entry's
    /// index: a new writer's token not above an earlier grant's.
    pub writer_token_reused: bool,
    /// A proclaim under a token that is not the leader's (an ended term's, from a session that
    /// no longer leads) is accepted while another session leads: its value replaces the
    /// leader's, published under the leader's token. Readers then see an older term's value as
    /// the current leader's.
    pub proclaim_past_term: bool,
    /// A proclaim refused for an ended term while another session leads is answered
    /// `not-election-leader`, but its value still replaces the leader's, under the leader's
    /// token: a refused proclaim changes what readers see.
    pub refused_proclaim_applied: bool,
    /// A proclaim by the leader is acknowledged but keeps the value already published in its
    /// term (an insert that does not replace): readers see a value a later acknowledged
    /// proclaim replaced.
    pub proclaim_kept_old_value: bool,
    /// A read of a name whose leader published a value while candidates wait for it answers
    /// the name unheld (as if in a handover): readers find no leader while the term lasts.
    pub leader_hidden_while_contended: bool,
}

impl Default for LockTable {
    fn default() -> LockTable {
        LockTable {
            last_index: 0,
            sessions: BTreeMap::new(),
            locks: BTreeMap::new(),
            wait_ends: BTreeSet::new(),
            audit: VecDeque::new(),
            multi: BTreeMap::new(),
            values: BTreeMap::new(),
            campaigns: BTreeMap::new(),
            delays: Delays::default(),
            bytes: 0,
            bytes_max: limits::TABLE_BYTES_MAX,
            shape: GroupShape::SINGLE,
            identities: BTreeMap::new(),
            plant: TablePlant::default(),
        }
    }
}

/// What the table is charged for a session: its outcomes and its list of force-released grants
/// up front (see `limits::TABLE_SESSION_WITH_OUTCOMES_BYTES` for why), its access-control
/// identity and its owner description.
fn session_bytes(identity: Option<&str>, owner: Option<&SessionOwner>) -> usize {
    limits::TABLE_SESSION_WITH_OUTCOMES_BYTES
        + identity.map_or(0, str::len)
        + owner.map_or(0, |o| {
            std::mem::size_of::<SessionOwner>() + o.host.len() + o.user.len() + o.text.len()
        })
}

fn lock_bytes(name: &str) -> usize {
    limits::TABLE_LOCK_BYTES + name.len()
}

fn waiter_bytes(name: &str) -> usize {
    limits::TABLE_WAITER_BYTES + name.len()
}

/// What an election value for `name` is charged, published or waiting for its campaign's
/// grant: the same either way, with the name's bytes, which a snapshot writes again beside a
/// published value.
fn value_bytes(name: &str, value: &[u8]) -> usize {
    limits::TABLE_VALUE_BYTES + name.len() + value.len()
}

/// An election value and the grant that published it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
struct Published {
    token: u64,
    value: Vec<u8>,
}

/// What one keepalive answer may still spend on conflict events (`LockTable::contended`):
/// held names to look at and contended names to list, over all its sessions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContendedBudget {
    pub checks: usize,
    pub names: usize,
}

impl Default for ContendedBudget {
    fn default() -> Self {
        ContendedBudget {
            checks: limits::CONTENDED_CHECKS_PER_ANSWER_MAX,
            names: limits::CONTENDED_NAMES_PER_ANSWER_MAX,
        }
    }
}

/// What a lock-delay is charged, asked for by a queued acquire, held with its grant or
/// running (beside its lock's charge): the identity it counts against is kept with it.
fn delay_bytes(name: &str, identity: Option<&str>) -> usize {
    limits::TABLE_LOCK_DELAY_BYTES + name.len() + identity.map_or(0, str::len)
}

/// Lock-delay state (issue #32 item 4). A name is in at most one of `LockTable::locks`,
/// `LockTable::multi` and `running`. Only a mutex takes a delay.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
struct Delays {
    /// The delay (ms) the current grant of each held mutex asked for, when above zero.
    held: BTreeMap<Name, u64>,
    /// The delay (ms) each queued acquire asked for, when above zero, by (session, seq).
    asked: BTreeMap<(SessionId, u64), u64>,
    /// Names whose holder's grant ended by an expiry, revoke or force-release while it had a
    /// delay: granted to nobody until an `EndDelays` entry names them (or an operator's
    /// force-release), their waiters kept in order.
    running: BTreeMap<Name, Delayed>,
    /// How many of the delays above count against each identity (asked for by its sessions'
    /// waits, held with their grants, running after their loss): what its quota and
    /// `limits::DELAYS_PER_IDENTITY_MAX` are checked against. Not written; rebuilt on decode.
    #[serde(skip)]
    per_identity: BTreeMap<String, usize>,
}

impl Delays {
    /// One more delay counts against `identity` (none: no access control).
    fn charge(&mut self, identity: Option<&str>) {
        if let Some(id) = identity {
            *self.per_identity.entry(id.to_owned()).or_default() += 1;
        }
    }

    /// One delay of `identity` ended (or left for no grant).
    fn discharge(&mut self, identity: Option<&str>) {
        if let Some(id) = identity {
            let n = self
                .per_identity
                .get_mut(id)
                .expect("a delay's identity is counted");
            *n -= 1;
            if *n == 0 {
                self.per_identity.remove(id);
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.held.is_empty() && self.asked.is_empty() && self.running.is_empty()
    }

    /// Delays asked for, held or running: what `limits::DELAYS_MAX` bounds. A delay moves
    /// from asked to held to running and never adds to the count on the way.
    fn count(&self) -> usize {
        self.held.len() + self.asked.len() + self.running.len()
    }
}

/// A name in a lock-delay: no holder, and its queue. The table does not time it: the leader
/// does, on its monotonic clock, from when it first sees the delay (a new leader restarts it
/// in full, as it resumes leases), and proposes `Op::EndDelays` naming it by `token`, so no
/// step of any wall clock ends a delay early.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
struct Delayed {
    /// The entry's time when the delay started (leader wall clock, ms): shown, never acted on.
    since_ms: u64,
    /// How long the name is kept from everyone (ms, at most `limits::LOCK_DELAY_MS_MAX`).
    delay_ms: u64,
    /// The token of the grant whose end started the delay: the next grant's is above it, and
    /// an `EndDelays` names the delay by it.
    token: u64,
    /// The session that held that grant (gone, or revoked) and its identity under access
    /// control: a running delay counts against that identity's quota of delays
    /// (`IdentityUsage::delays`) as the held one did, so a tenant cannot park names in delays
    /// by letting sessions die.
    session: SessionId,
    identity: Option<String>,
    waiters: Queue,
}

/// A snapshot's table before the sessions' holds are rebuilt: the fields of [`LockTable`] in
/// the same order, as written in snapshot format 11.
#[derive(Deserialize)]
struct DecodedTable {
    last_index: u64,
    sessions: BTreeMap<SessionId, Session>,
    locks: BTreeMap<Name, Lock>,
    wait_ends: BTreeSet<(u64, SessionId, u64)>,
    audit: VecDeque<AuditRecord>,
    multi: BTreeMap<Name, MultiLock>,
    values: BTreeMap<Name, Published>,
    campaigns: BTreeMap<(SessionId, u64), Vec<u8>>,
    delays: Delays,
}

/// A table as snapshot format 10 wrote it: format 11 without request fingerprints in its
/// sessions.
#[derive(Deserialize)]
pub(crate) struct DecodedTableV10 {
    last_index: u64,
    sessions: BTreeMap<SessionId, SessionV10>,
    locks: BTreeMap<Name, Lock>,
    wait_ends: BTreeSet<(u64, SessionId, u64)>,
    audit: VecDeque<AuditRecord>,
    multi: BTreeMap<Name, MultiLock>,
    values: BTreeMap<Name, Published>,
    campaigns: BTreeMap<(SessionId, u64), Vec<u8>>,
    delays: Delays,
}

impl From<DecodedTableV10> for LockTable {
    fn from(d: DecodedTableV10) -> LockTable {
        LockTable::from(DecodedTable {
            last_index: d.last_index,
            sessions: sessions_from_v10(d.sessions),
            locks: d.locks,
            wait_ends: d.wait_ends,
            audit: d.audit,
            multi: d.multi,
            values: d.values,
            campaigns: d.campaigns,
            delays: d.delays,
        })
    }
}

/// A table written in snapshot format 10: [`LockTable`]'s fields in order, its sessions
/// without fingerprints, so the bytes are those a build before them wrote for the same table.
#[derive(Serialize)]
pub(crate) struct TableV10<'a> {
    last_index: &'a u64,
    sessions: SessionsV10<'a>,
    locks: &'a BTreeMap<Name, Lock>,
    wait_ends: &'a BTreeSet<(u64, SessionId, u64)>,
    audit: &'a VecDeque<AuditRecord>,
    multi: &'a BTreeMap<Name, MultiLock>,
    values: &'a BTreeMap<Name, Published>,
    campaigns: &'a BTreeMap<(SessionId, u64), Vec<u8>>,
    delays: &'a Delays,
}

/// A table as snapshot format 9 wrote it: format 10 without `delays` (lock-delay).
#[derive(Deserialize)]
pub(crate) struct DecodedTableV9 {
    last_index: u64,
    sessions: BTreeMap<SessionId, SessionV10>,
    locks: BTreeMap<Name, Lock>,
    wait_ends: BTreeSet<(u64, SessionId, u64)>,
    audit: VecDeque<AuditRecord>,
    multi: BTreeMap<Name, MultiLock>,
    values: BTreeMap<Name, Published>,
    campaigns: BTreeMap<(SessionId, u64), Vec<u8>>,
}

impl From<DecodedTableV9> for LockTable {
    fn from(d: DecodedTableV9) -> LockTable {
        LockTable::from(DecodedTable {
            last_index: d.last_index,
            sessions: sessions_from_v10(d.sessions),
            locks: d.locks,
            wait_ends: d.wait_ends,
            audit: d.audit,
            multi: d.multi,
            values: d.values,
            campaigns: d.campaigns,
            delays: Delays::default(),
        })
    }
}

/// A table written in snapshot format 9: [`LockTable`]'s fields but `delays`, in order, so the
/// bytes are those a build before lock-delay wrote for the same table.
#[derive(Serialize)]
pub(crate) struct TableV9<'a> {
    last_index: &'a u64,
    sessions: SessionsV10<'a>,
    locks: &'a BTreeMap<Name, Lock>,
    wait_ends: &'a BTreeSet<(u64, SessionId, u64)>,
    audit: &'a VecDeque<AuditRecord>,
    multi: &'a BTreeMap<Name, MultiLock>,
    values: &'a BTreeMap<Name, Published>,
    campaigns: &'a BTreeMap<(SessionId, u64), Vec<u8>>,
}

/// A table as snapshot format 8 wrote it: format 9 without the elections' values (issue #32).
#[derive(Deserialize)]
pub(crate) struct DecodedTableV8 {
    last_index: u64,
    sessions: BTreeMap<SessionId, SessionV10>,
    locks: BTreeMap<Name, Lock>,
    wait_ends: BTreeSet<(u64, SessionId, u64)>,
    audit: VecDeque<AuditRecord>,
    multi: BTreeMap<Name, MultiLock>,
}

impl From<DecodedTableV8> for LockTable {
    fn from(d: DecodedTableV8) -> LockTable {
        LockTable::from(DecodedTable {
            last_index: d.last_index,
            sessions: sessions_from_v10(d.sessions),
            locks: d.locks,
            wait_ends: d.wait_ends,
            audit: d.audit,
            multi: d.multi,
            values: BTreeMap::new(),
            campaigns: BTreeMap::new(),
            delays: Delays::default(),
        })
    }
}

/// A table written in snapshot format 8: [`LockTable`]'s fields but the elections' values, in
/// order, so the bytes are those a build before elections wrote for the same table.
#[derive(Serialize)]
pub(crate) struct TableV8<'a> {
    last_index: &'a u64,
    sessions: SessionsV10<'a>,
    locks: &'a BTreeMap<Name, Lock>,
    wait_ends: &'a BTreeSet<(u64, SessionId, u64)>,
    audit: &'a VecDeque<AuditRecord>,
    multi: &'a BTreeMap<Name, MultiLock>,
}

/// A table as snapshot format 7 wrote it: format 8 without `multi` (issue #32). Decoding one
/// gives the table that format 7 decoded to, with no name used with several holders.
#[derive(Deserialize)]
pub(crate) struct DecodedTableV7 {
    last_index: u64,
    sessions: BTreeMap<SessionId, SessionV10>,
    locks: BTreeMap<Name, Lock>,
    wait_ends: BTreeSet<(u64, SessionId, u64)>,
    audit: VecDeque<AuditRecord>,
}

impl From<DecodedTableV7> for LockTable {
    fn from(d: DecodedTableV7) -> LockTable {
        LockTable::from(DecodedTable {
            last_index: d.last_index,
            sessions: sessions_from_v10(d.sessions),
            locks: d.locks,
            wait_ends: d.wait_ends,
            audit: d.audit,
            multi: BTreeMap::new(),
            values: BTreeMap::new(),
            campaigns: BTreeMap::new(),
            delays: Delays::default(),
        })
    }
}

/// A table written in snapshot format 7: [`LockTable`]'s fields but `multi`, in order, so the
/// bytes are those a build before issue #32 wrote for the same table.
#[derive(Serialize)]
pub(crate) struct TableV7<'a> {
    last_index: &'a u64,
    sessions: SessionsV10<'a>,
    locks: &'a BTreeMap<Name, Lock>,
    wait_ends: &'a BTreeSet<(u64, SessionId, u64)>,
    audit: &'a VecDeque<AuditRecord>,
}

impl From<DecodedTable> for LockTable {
    /// Rebuild each session's `held` from the holders in `locks` and `multi`, sharing each name
    /// with its lock as `apply` does. A lock whose holder's session is missing is left out of
    /// every `held`: `check_invariants`, which every decode runs, then refuses the table.
    fn from(d: DecodedTable) -> LockTable {
        let mut sessions = d.sessions;
        for (name, lock) in &d.locks {
            if let Some(s) = sessions.get_mut(&lock.holder.session) {
                s.held.insert(name.clone());
            }
        }
        for (name, lock) in &d.multi {
            for h in &lock.holders {
                if let Some(s) = sessions.get_mut(&h.session) {
                    s.held.insert(name.clone());
                }
            }
        }
        let delays = d.delays;
        let mut table = LockTable {
            last_index: d.last_index,
            sessions,
            locks: d.locks,
            wait_ends: d.wait_ends,
            audit: d.audit,
            multi: d.multi,
            values: d.values,
            campaigns: d.campaigns,
            delays,
            ..LockTable::default()
        };
        table.delays.per_identity = table.count_delays_per_identity();
        table.identities = table.count_identities();
        table.bytes = table.count_bytes();
        table
    }
}

/// Debug builds check every invariant after each entry while the table has at most this many
/// locks and sessions: every table the core's tests build, and the start of every process
/// test; larger tables are checked on decode and by tests that call `check_invariants`.
#[cfg(debug_assertions)]
const DEBUG_CHECK_ITEMS_MAX: usize = 4_096;

/// A lock name, shared between the lock and its holder's session: one heap copy per held lock
/// instead of two. `ArcStr` keeps the length in that copy, so each reference is one word, which
/// the million entries of a full `locks` and the sessions' `held` sets feel. Encoded as a plain
/// string.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Name(ArcStr);

impl From<&str> for Name {
    fn from(name: &str) -> Name {
        Name(ArcStr::from(name))
    }
}

impl std::ops::Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// Lets maps keyed by `Name` be searched with a `&str`. Sound because `Name`'s order and
/// equality are those of the `str` it holds.
impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Name {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Name, D::Error> {
        String::deserialize(d).map(|n| Name(ArcStr::from(n)))
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
struct Session {
    secret: u64,
    ttl_ms: u64,
    /// Locks held (the token of each grant is its lock's holder's). Not written to snapshots:
    /// `DecodedTable` rebuilds it from `locks`, so that names are shared again after an install.
    #[serde(skip)]
    held: BTreeSet<Name>,
    /// Pending Acquire requests by sequence number, with the lock each waits for.
    waiting: BTreeMap<u64, String>,
    /// Final outcomes of recent requests, for exactly-once retries, each with what the request
    /// was (its `RequestPrint`), so that a seq reused for another request is not answered
    /// with this one's outcome.
    outcomes: BTreeMap<u64, Remembered>,
    /// The keys of `outcomes` in the order they were recorded. The oldest outcome is forgotten
    /// first, not the lowest seq: a long wait's grant is recorded late under a low seq, and must
    /// be remembered as long as any other fresh outcome.
    recorded: VecDeque<u64>,
    /// The highest sequence number whose outcome was forgotten to keep `outcomes` bounded.
    evicted_max: Option<u64>,
    /// Lease checkpoint: unrenewed for this long (ms, leader's clock) when the mark was made;
    /// `None` once a logged renewal cleared it. See `Op::MarkLeases`.
    lease_mark_ms: Option<u64>,
    /// The identity that created the session when access control is on (`Op::CreateOwnedSession`);
    /// only it may use the session, and the session counts toward its quotas.
    identity: Option<String>,
    /// What the client said about itself (host, pid, user, text); boxed, as most sessions of a
    /// busy table are the same few processes and many have none.
    owner: Option<Box<SessionOwner>>,
    /// Tokens of this session's grants that an operator force-released, newest last, at most
    /// `limits::REVOKED_GRANTS_PER_SESSION_MAX`: its client learns them from its keepalives.
    revoked: Vec<u64>,
    /// The highest token dropped from `revoked` to keep it bounded.
    revoked_through: Option<u64>,
    /// What each request in `waiting` was (since snapshot format 11; a wait decoded from an
    /// older snapshot has none): its outcome, when recorded, takes it along.
    wait_prints: BTreeMap<u64, RequestPrint>,
}

/// A remembered outcome and the fingerprint of the request it answered (`None`: remembered
/// before snapshot format 11, answered to any retry of the seq as before).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
struct Remembered {
    outcome: Outcome,
    print: Option<RequestPrint>,
}

/// A small stable fingerprint of a request that carries a sequence number (issue #35's
/// attacker review, F2): its kind and what defines it — an acquire's name, mode, lock-delay
/// and campaign value (not its wait, which a retry may shorten); a release's name and token;
/// a proclaim's name, token and value. FNV-1a (64-bit, `groups.rs`) over a tagged,
/// length-prefixed encoding, mixed by MurmurHash3's finalizer: the same on every member and
/// build, so replicas answer alike. A seq reused with another fingerprint is refused
/// `Rejection::SequenceReused` (like an idempotency key reused with other parameters); two
/// requests that differ collide with odds of 2^-64, and a session can only fool itself.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
struct RequestPrint(std::num::NonZeroU64);

/// The running hash of a [`RequestPrint`].
struct Printer(u64);

impl Printer {
    fn new(kind: u8) -> Printer {
        Printer(crate::groups::FNV_OFFSET).bytes(&[kind])
    }

    /// `bytes`, after their length, so that fields cannot run into each other.
    fn bytes(self, bytes: &[u8]) -> Printer {
        let h = crate::groups::fnv1a64_extend(self.0, &(bytes.len() as u64).to_le_bytes());
        Printer(crate::groups::fnv1a64_extend(h, bytes))
    }

    fn u64(self, v: u64) -> Printer {
        self.bytes(&v.to_le_bytes())
    }

    fn finish(self) -> RequestPrint {
        let h = crate::groups::fmix64(self.0);
        RequestPrint(std::num::NonZeroU64::new(h).unwrap_or(std::num::NonZeroU64::MIN))
    }
}

impl RequestPrint {
    const ACQUIRE: u8 = 1;
    const RELEASE: u8 = 2;
    const PROCLAIM: u8 = 3;

    fn acquire(r: &AcquireRequest<'_>) -> RequestPrint {
        let mode = match r.mode {
            Mode::Exclusive => 0,
            Mode::Shared => 1,
            Mode::Permits(n) => 2 + u64::from(n),
        };
        let p = Printer::new(Self::ACQUIRE)
            .bytes(r.name.as_bytes())
            .u64(mode)
            .u64(r.lock_delay_ms);
        match r.value {
            None => p.u64(0),
            Some(v) => p.u64(1).bytes(v),
        }
        .finish()
    }

    fn release(name: &str, token: u64) -> RequestPrint {
        Printer::new(Self::RELEASE)
            .bytes(name.as_bytes())
            .u64(token)
            .finish()
    }

    fn proclaim(name: &str, token: u64, value: &[u8]) -> RequestPrint {
        Printer::new(Self::PROCLAIM)
            .bytes(name.as_bytes())
            .u64(token)
            .bytes(value)
            .finish()
    }
}

/// A session as snapshot formats 7 to 10 wrote it: no request fingerprints (its outcomes and
/// waits decode with none).
#[derive(Deserialize)]
struct SessionV10 {
    secret: u64,
    ttl_ms: u64,
    waiting: BTreeMap<u64, String>,
    outcomes: BTreeMap<u64, Outcome>,
    recorded: VecDeque<u64>,
    evicted_max: Option<u64>,
    lease_mark_ms: Option<u64>,
    identity: Option<String>,
    owner: Option<Box<SessionOwner>>,
    revoked: Vec<u64>,
    revoked_through: Option<u64>,
}

impl From<SessionV10> for Session {
    fn from(s: SessionV10) -> Session {
        let outcomes = (s.outcomes.into_iter())
            .map(|(seq, outcome)| {
                (
                    seq,
                    Remembered {
                        outcome,
                        print: None,
                    },
                )
            })
            .collect();
        Session {
            secret: s.secret,
            ttl_ms: s.ttl_ms,
            held: BTreeSet::new(),
            waiting: s.waiting,
            outcomes,
            recorded: s.recorded,
            evicted_max: s.evicted_max,
            lease_mark_ms: s.lease_mark_ms,
            identity: s.identity,
            owner: s.owner,
            revoked: s.revoked,
            revoked_through: s.revoked_through,
            wait_prints: BTreeMap::new(),
        }
    }
}

fn sessions_from_v10(sessions: BTreeMap<SessionId, SessionV10>) -> BTreeMap<SessionId, Session> {
    sessions.into_iter().map(|(id, s)| (id, s.into())).collect()
}

/// A session written in snapshot formats 7 to 10 (one without fingerprints,
/// `LockTable::fits_format_10`): the bytes those builds wrote for it.
#[derive(Serialize)]
struct SessionV10Ref<'a> {
    secret: &'a u64,
    ttl_ms: &'a u64,
    waiting: &'a BTreeMap<u64, String>,
    #[serde(serialize_with = "outcomes_v10")]
    outcomes: &'a BTreeMap<u64, Remembered>,
    recorded: &'a VecDeque<u64>,
    evicted_max: &'a Option<u64>,
    lease_mark_ms: &'a Option<u64>,
    identity: &'a Option<String>,
    owner: &'a Option<Box<SessionOwner>>,
    revoked: &'a Vec<u64>,
    revoked_through: &'a Option<u64>,
}

fn outcomes_v10<S: Serializer>(
    outcomes: &&BTreeMap<u64, Remembered>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_map(outcomes.iter().map(|(seq, r)| (seq, &r.outcome)))
}

/// A table's sessions as snapshot formats 7 to 10 wrote them.
struct SessionsV10<'a>(&'a BTreeMap<SessionId, Session>);

impl Serialize for SessionsV10<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(id, x)| {
            let session = SessionV10Ref {
                secret: &x.secret,
                ttl_ms: &x.ttl_ms,
                waiting: &x.waiting,
                outcomes: &x.outcomes,
                recorded: &x.recorded,
                evicted_max: &x.evicted_max,
                lease_mark_ms: &x.lease_mark_ms,
                identity: &x.identity,
                owner: &x.owner,
                revoked: &x.revoked,
                revoked_through: &x.revoked_through,
            };
            (id, session)
        }))
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
struct Lock {
    holder: Holder,
    waiters: Queue,
}

/// A lock's FIFO queue of waiters. Most held locks have none, so an empty queue is a null
/// pointer (8 bytes) rather than an empty `VecDeque` (32 bytes) in every lock. Encoded as the
/// sequence of its waiters, like a `VecDeque`.
// The Box is the point: it makes the empty case one word instead of a whole `VecDeque`.
#[allow(clippy::box_collection)]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Queue(Option<Box<VecDeque<Waiter>>>);

impl Queue {
    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.len())
    }

    fn iter(&self) -> impl Iterator<Item = &Waiter> {
        self.0.iter().flat_map(|q| q.iter())
    }

    fn push_back(&mut self, w: Waiter) {
        self.0.get_or_insert_with(Default::default).push_back(w);
    }

    fn pop_front(&mut self) -> Option<Waiter> {
        let w = self.0.as_mut()?.pop_front();
        self.drop_if_empty();
        w
    }

    fn remove(&mut self, i: usize) -> Option<Waiter> {
        let w = self.0.as_mut()?.remove(i);
        self.drop_if_empty();
        w
    }

    /// Keeps "no waiters" one value, so that equal queues compare equal.
    fn drop_if_empty(&mut self) {
        if self.0.as_ref().is_some_and(|q| q.is_empty()) {
            self.0 = None;
        }
    }
}

impl Serialize for Queue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            Some(q) => q.serialize(s),
            None => <[Waiter]>::serialize(&[], s),
        }
    }
}

impl<'de> Deserialize<'de> for Queue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Queue, D::Error> {
        let q = VecDeque::<Waiter>::deserialize(d)?;
        Ok(Queue((!q.is_empty()).then(|| Box::new(q))))
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
struct Holder {
    session: SessionId,
    token: u64,
    granted_at_ms: u64,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
struct Waiter {
    session: SessionId,
    seq: u64,
    /// The wait ends unserved at this time (ms, the stamped leader wall clock of entries).
    until_ms: u64,
    /// The wait began at this time (ms, the same clock): "waited for" is measured from it.
    since_ms: u64,
}

/// A name used with several holders (issue #32): a read-write lock with a reader among its
/// holders or waiters, or a semaphore. One FIFO queue for every mode, so a reader behind a
/// waiting writer waits. `admit` grants the waiters at the head that fit after every change,
/// so the head of a queue never fits (`check_invariants`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
struct MultiLock {
    kind: LockKind,
    /// In the order granted, so tokens never decrease along it.
    holders: Vec<Grant>,
    waiters: VecDeque<ModeWaiter>,
    /// The highest token granted since the name was last free: a semaphore's next grant takes
    /// the one above it (see `grant_token`).
    last_token: u64,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
struct Grant {
    session: SessionId,
    token: u64,
    granted_at_ms: u64,
    mode: Mode,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
struct ModeWaiter {
    waiter: Waiter,
    mode: Mode,
}

impl MultiLock {
    /// Whether a grant in `mode` fits beside the current holders (queue order aside).
    fn fits(&self, mode: Mode) -> bool {
        match mode {
            Mode::Exclusive => self.holders.is_empty(),
            Mode::Shared => {
                self.holders.len() < limits::HOLDERS_PER_LOCK_MAX
                    && self.holders.first().is_none_or(|h| h.mode == Mode::Shared)
            }
            Mode::Permits(permits) => self.holders.len() < permits as usize,
        }
    }

    /// The token of a grant in `mode` made by the entry at `index`. A lock's grants take the
    /// entry's index, like a mutex's: one entry grants a lock at most once, to a writer or to
    /// the run of readers at the head of the queue, which share it. A semaphore's grants take
    /// the token above the last one, since one entry (an expiry of several holders) may grant
    /// several permits, each with a token of its own; the first grant after the name was free
    /// takes the entry's index. That stays at most the entry's index: every later grant is to
    /// an acquire with an entry of its own after that first one (`check_multi` checks the
    /// bound this rests on: the last token plus the waiters is at most the last index).
    fn grant_token(&self, mode: Mode, index: u64, plant: TablePlant) -> u64 {
        let token = match self.kind {
            LockKind::Lock
                if plant.writer_token_reused
                    && mode == Mode::Exclusive
                    && self.last_token > 0
                    && self.last_token < index =>
            {
                // Planted: the writer takes the last grant's token, asserting nothing.
                return self.last_token;
            }
            LockKind::Lock => index,
            LockKind::Semaphore { .. } => self.last_token + 1,
        };
        assert!(token <= index, "token {token} above its entry {index}");
        assert!(
            token > self.last_token
                || (mode == Mode::Shared && token == index && self.kind == LockKind::Lock),
            "token {token} after {}: tokens must increase (but readers granted together)",
            self.last_token
        );
        token
    }
}

/// The fields of an acquire request, whichever command carried it.
struct AcquireRequest<'a> {
    key: &'a SessionKey,
    seq: u64,
    name: &'a String,
    wait_ms: u64,
    mode: Mode,
    /// A campaign's election value (`Op::Campaign`): published by the grant.
    value: Option<&'a Vec<u8>>,
    /// The lock-delay asked for (ms); 0 for none.
    lock_delay_ms: u64,
}

/// What `LockTable::acquire` acts on: session, seq, name, wait, mode.
type Acquiring<'a> = (SessionId, u64, &'a str, u64, Mode);

/// Validate an election value (`Op::Campaign`, `Op::Proclaim`): at most
/// `limits::ELECTION_VALUE_BYTES_MAX` bytes.
pub fn validate_value(value: &[u8]) -> Result<(), Rejection> {
    if value.len() > limits::ELECTION_VALUE_BYTES_MAX {
        return Err(Rejection::FieldTooLong {
            field: "election value".into(),
            len: value.len(),
            max: limits::ELECTION_VALUE_BYTES_MAX,
        });
    }
    Ok(())
}

/// How a grant ended: by its holder's release or close (the next waiter gets the name at
/// once), or lost by an expiry, a revoke or a force-release (its lock-delay, if it asked for
/// one, runs first).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ends {
    Clean,
    Lost,
}

/// What a session-bearing request found when it looked its sequence number up.
enum Seen {
    New,
    Waiting,
    Done(Outcome),
    TooOld,
    /// The seq is known for another request (another fingerprint): a client bug, never
    /// answered with that request's outcome.
    Reused,
}

/// Validate the lock name of a new request: non-empty UTF-8 (guaranteed by `&str`) of bounded
/// length, without control characters (a newline or an escape sequence in a name breaks the
/// line-based output of `list` and the logs). The server checks it before proposing, the
/// client library before sending.
pub fn validate_name(name: &str) -> Result<(), Rejection> {
    validate_stored_name(name)?;
    if let Some(at) = name
        .char_indices()
        .find(|(_, c)| c.is_control())
        .map(|(at, _)| at)
    {
        return Err(Rejection::NameControlCharacter { at });
    }
    Ok(())
}

/// The rule the state machine applies and its invariants check: [`validate_name`] without the
/// control-character rule, which is checked before an acquire is proposed. Entries and snapshots
/// written before that rule existed must apply and decode as they did, so that a log replays to
/// the same table on every member, whichever version wrote it; and a lock taken under such a
/// name before an upgrade can still be described and released.
pub fn validate_stored_name(name: &str) -> Result<(), Rejection> {
    if name.is_empty() {
        return Err(Rejection::NameEmpty);
    }
    if name.len() > limits::LOCK_NAME_BYTES_MAX {
        return Err(Rejection::NameTooLong {
            len: name.len(),
            max: limits::LOCK_NAME_BYTES_MAX,
        });
    }
    Ok(())
}

/// Validate a requested session TTL.
pub fn validate_ttl_ms(ttl_ms: u64) -> Result<(), Rejection> {
    if !(limits::SESSION_TTL_MS_MIN..=limits::SESSION_TTL_MS_MAX).contains(&ttl_ms) {
        return Err(Rejection::TtlOutOfRange {
            ttl_ms,
            min: limits::SESSION_TTL_MS_MIN,
            max: limits::SESSION_TTL_MS_MAX,
        });
    }
    Ok(())
}

impl LockTable {
    pub fn new() -> LockTable {
        LockTable::default()
    }

    /// Index of the last applied entry (0 before any).
    pub fn last_index(&self) -> u64 {
        self.last_index
    }

    /// The table's accounted bytes: what its byte budget is checked against.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The byte budget `apply` keeps the table within.
    pub fn bytes_max(&self) -> usize {
        self.bytes_max
    }

    /// Sets the byte budget (a node's `--table-bytes-max`). A table already above it stays as it
    /// is: only commands that would grow it are refused, so releases, closes and expiries bring
    /// it back under.
    pub fn set_bytes_max(&mut self, bytes_max: usize) {
        self.bytes_max = bytes_max;
    }

    /// Which group this table is (`GroupShape::SINGLE` unless set).
    pub fn shape(&self) -> GroupShape {
        self.shape
    }

    /// Sets which group this table is, before any entry is applied to it: the ids of the
    /// sessions it creates from now on name this group.
    pub fn set_shape(&mut self, shape: GroupShape) {
        self.shape = shape;
    }

    /// The planted bugs (none unless set).
    pub fn plant(&self) -> TablePlant {
        self.plant
    }

    /// Puts the bugs of `plant` back (the simulation's checkers' own tests; never a real
    /// server's). Like the budget, every member must be given the same.
    #[doc(hidden)]
    pub fn set_plant(&mut self, plant: TablePlant) {
        self.plant = plant;
    }

    /// Room for `more` bytes, or the rejection that says the table is full.
    fn room_for(&self, more: usize) -> Result<(), Rejection> {
        if self.bytes.saturating_add(more) > self.bytes_max {
            return Err(Rejection::TableFull {
                bytes: self.bytes,
                max: self.bytes_max,
            });
        }
        Ok(())
    }

    /// The accounted bytes, counted from scratch (what `bytes` must equal).
    fn count_bytes(&self) -> usize {
        let sessions: usize = self
            .sessions
            .values()
            .map(|s| {
                session_bytes(s.identity.as_deref(), s.owner.as_deref())
                    + s.waiting.values().map(|n| waiter_bytes(n)).sum::<usize>()
            })
            .sum();
        let locks: usize = self.locks.keys().map(|n| lock_bytes(n)).sum();
        let multi: usize = self
            .multi
            .iter()
            .map(|(n, l)| lock_bytes(n) + l.holders.len() * limits::TABLE_GRANT_BYTES)
            .sum();
        let values: usize = self
            .values
            .iter()
            .map(|(n, p)| value_bytes(n, &p.value))
            .sum();
        // A campaign's name is its waiting request's (one that waits for nothing breaks an
        // invariant, which `check_values` reports).
        let campaigns: usize = self
            .campaigns
            .iter()
            .map(|((sid, seq), v)| {
                let name = self.sessions.get(sid).and_then(|s| s.waiting.get(seq));
                value_bytes(name.map_or("", String::as_str), v)
            })
            .sum();
        let delays: usize = self
            .delays
            .held
            .keys()
            .map(|n| {
                let holder = self.locks.get(n).map(|l| l.holder.session);
                delay_bytes(n, holder.and_then(|s| self.identity_of(s)))
            })
            .sum::<usize>()
            + self
                .delays
                .asked
                .keys()
                // A decoded table's ask may name no wait: `check_delays` refuses it afterwards.
                .map(|(sid, seq)| {
                    let name = self.sessions.get(sid).and_then(|s| s.waiting.get(seq));
                    delay_bytes(name.map_or("", String::as_str), self.identity_of(*sid))
                })
                .sum::<usize>()
            + self
                .delays
                .running
                .iter()
                .map(|(n, d)| lock_bytes(n) + delay_bytes(n, d.identity.as_deref()))
                .sum::<usize>();
        sessions + locks + multi + values + campaigns + delays
    }

    /// Apply the entry at log `index`. Indexes must strictly increase; the fencing token of any
    /// grant made by this entry is `index` (a semaphore's: at most `index`).
    ///
    /// An `Op::Batch` applies its operations in order, each as an entry of its own at `index`
    /// would be (invariants checked after each); a refused one changes nothing. A token of a
    /// lock stays unique and increasing because a batch never ends a grant it made: a release
    /// of a name granted earlier in the batch, a close of a session holding one, and a second
    /// acquire of permits of one name (a semaphore's tokens count its acquires' entries, see
    /// `MultiLock::grant_token`) are refused `Rejection::BatchConflict`, and so not
    /// remembered: sent again alone, each applies. A reader granted beside readers the batch
    /// granted shares their token, as readers granted together by one entry do.
    /// A lock-delay acquire (`Op::AcquireDelayed`) may be in a batch as any acquire: a
    /// lock-delay starts only when a grant is lost (expiry, revoke, force-release, none of
    /// them batchable), so no batch starts one, nor ends the delayed grant it made.
    pub fn apply(&mut self, index: u64, cmd: &Command) -> Applied {
        assert!(
            index > self.last_index,
            "entries applied out of order: {index} after {}",
            self.last_index
        );
        self.last_index = index;
        match &cmd.op {
            Op::Batch(ops) => self.apply_batch(index, cmd.now_ms, ops),
            op => self.apply_checked(index, cmd.now_ms, op),
        }
    }

    /// [`LockTable::apply`] of an `Op::Batch`.
    fn apply_batch(&mut self, index: u64, now_ms: u64, ops: &[Op]) -> Applied {
        if ops.is_empty() || ops.len() > limits::BATCH_OPS_MAX {
            return Applied::just(Outcome::Rejected(Rejection::BatchTooLarge {
                ops: ops.len(),
                max: limits::BATCH_OPS_MAX,
            }));
        }
        // Names granted by this entry so far, and names acquired in permits.
        let mut granted: BTreeSet<String> = BTreeSet::new();
        let mut permits: BTreeSet<&str> = BTreeSet::new();
        let mut answers = Vec::with_capacity(ops.len());
        for op in ops {
            let fx = match self.batch_conflict(op, &granted, &permits) {
                Some(refused) => Applied::just(Outcome::Rejected(refused)),
                None => self.apply_checked(index, now_ms, op),
            };
            if let Op::AcquireWith {
                name,
                mode: Mode::Permits(_),
                ..
            } = op
            {
                permits.insert(name);
            }
            for change in &fx.changes {
                if let LockChange::Granted { name, .. } = change {
                    granted.insert(name.clone());
                }
            }
            answers.push(fx);
        }
        Applied {
            ops: answers,
            ..Applied::just(Outcome::Batch)
        }
    }

    /// Why `op` may not be applied next in a batch whose earlier operations granted the names
    /// `granted` and asked for permits of `permits` (see [`LockTable::apply`]), if so.
    fn batch_conflict(
        &self,
        op: &Op,
        granted: &BTreeSet<String>,
        permits: &BTreeSet<&str>,
    ) -> Option<Rejection> {
        let conflict = |name: &str| Rejection::BatchConflict { name: name.into() };
        match op {
            _ if !op.batchable() => Some(Rejection::NotBatchable),
            Op::Release { name, .. } if granted.contains(name) => Some(conflict(name)),
            Op::AcquireWith {
                name,
                mode: Mode::Permits(_),
                ..
            } if permits.contains(name.as_str()) => Some(conflict(name)),
            Op::CloseSession { session } => {
                let held = &self.sessions.get(&session.id)?.held;
                held.iter()
                    .find(|n| granted.contains::<str>((*n).borrow()))
                    .map(|n| conflict((*n).borrow()))
            }
            _ => None,
        }
    }

    /// Apply one operation at `index`, then (debug builds) check every invariant.
    fn apply_checked(&mut self, index: u64, now_ms: u64, op: &Op) -> Applied {
        #[cfg(debug_assertions)]
        let bytes_before = self.bytes;
        let mut fx = Applied::just(Outcome::NotGranted);
        fx.outcome = self.apply_op(index, now_ms, op, &mut fx);
        #[cfg(debug_assertions)]
        {
            // The full check is O(table): after every entry of a large table (a debug-build
            // server filled with a snapshot's worth of locks) it would make filling quadratic.
            if self.locks.len() + self.sessions.len() <= DEBUG_CHECK_ITEMS_MAX {
                if let Err(e) = self.check_invariants() {
                    panic!("invariant broken after entry {index} ({op:?}): {e}");
                }
            }
            // The table never grows past its budget (it may shrink while above a lowered one).
            assert!(
                self.bytes <= self.bytes_max || self.bytes <= bytes_before,
                "entry {index} took the table from {bytes_before} to {} bytes, past its budget {}",
                self.bytes,
                self.bytes_max
            );
        }
        fx
    }

    /// One operation (not a batch) at `index`, stamped `now_ms`.
    fn apply_op(&mut self, index: u64, now_ms: u64, op: &Op, fx: &mut Applied) -> Outcome {
        match op {
            Op::Batch(_) => Outcome::Rejected(Rejection::NotBatchable),
            Op::CreateSession { ttl_ms, secret } => {
                self.create_session(index, *ttl_ms, *secret, None, None)
            }
            Op::CreateOwnedSession {
                ttl_ms,
                secret,
                owner,
            } => self.create_session(index, *ttl_ms, *secret, Some(owner), None),
            Op::OpenSession {
                ttl_ms,
                secret,
                identity,
                owner,
            } => self.create_session(index, *ttl_ms, *secret, identity.as_deref(), owner.as_ref()),
            Op::ForceRelease {
                name,
                token,
                by,
                reason,
            } => self.force_release(index, now_ms, name, *token, None, by, reason, fx),
            Op::ForceReleaseTargeted {
                name,
                token,
                target,
                by,
                reason,
            } => self.force_release(index, now_ms, name, *token, Some(*target), by, reason, fx),
            Op::RevokeSession {
                session,
                by,
                reason,
            } => match (by.validate(), validate_reason(reason)) {
                (Err(r), _) | (_, Err(r)) => Outcome::Rejected(r),
                _ if !self.sessions.contains_key(session) => {
                    Outcome::Rejected(Rejection::SessionNotFound { id: *session })
                }
                _ => {
                    let locks = self.sessions[session].held.len() as u32;
                    self.remove_sessions(&[*session], index, now_ms, Ends::Lost, fx);
                    self.audit_push(AuditRecord {
                        index,
                        at_ms: now_ms,
                        action: AuditAction::RevokeSession {
                            session: *session,
                            locks,
                        },
                        by: by.clone(),
                        reason: reason.clone(),
                    });
                    Outcome::SessionRevoked { locks }
                }
            },
            Op::CloseSession { session } => match self.authenticate(session) {
                Err(r) => Outcome::Rejected(r),
                Ok(()) => {
                    self.remove_sessions(&[session.id], index, now_ms, Ends::Clean, fx);
                    Outcome::SessionClosed
                }
            },
            Op::ExpireSessions { ids } => {
                // An id listed twice is expired once: removing it again would find no session.
                let mut live: Vec<SessionId> = Vec::with_capacity(ids.len());
                for id in ids {
                    if self.sessions.contains_key(id) && !live.contains(id) {
                        live.push(*id);
                    }
                }
                self.remove_sessions(&live, index, now_ms, Ends::Lost, fx);
                Outcome::SessionsExpired { ids: live }
            }
            Op::MarkLeases { marks } => {
                let mut ids = Vec::with_capacity(marks.len());
                for (id, unrenewed_ms) in marks {
                    if let Some(s) = self.sessions.get_mut(id) {
                        s.lease_mark_ms = Some(*unrenewed_ms);
                        ids.push(*id);
                    }
                }
                Outcome::LeasesMarked { ids }
            }
            Op::ExpireWaits => {
                let ended: Vec<(SessionId, u64)> = self
                    .wait_ends
                    .iter()
                    .take_while(|(until, _, _)| *until <= now_ms)
                    .take(limits::WAITS_EXPIRED_PER_ENTRY_MAX)
                    .map(|&(_, sid, seq)| (sid, seq))
                    .collect();
                // Every ended wait leaves first, then the waiters behind them that now fit are
                // granted (names with several holders only: behind a mutex's holder nothing fits).
                let mut multi = BTreeSet::new();
                for &(sid, seq) in &ended {
                    let name = self.cancel_wait(sid, seq);
                    if self.multi.contains_key(name.as_str()) {
                        multi.insert(name.clone());
                    }
                    fx.changes.push(LockChange::WaitEnded {
                        name,
                        session: sid,
                        seq,
                    });
                    self.record(sid, seq, Outcome::NotGranted);
                }
                fx.ended_waits = ended;
                for name in multi {
                    self.admit(&name, index, now_ms, fx);
                }
                Outcome::WaitsExpired {
                    count: fx.ended_waits.len(),
                }
            }
            Op::RenewLeases { ids } => {
                let mut live = Vec::with_capacity(ids.len());
                for id in ids {
                    if let Some(s) = self.sessions.get_mut(id) {
                        s.lease_mark_ms = None;
                        live.push(*id);
                    }
                }
                Outcome::LeasesRenewed { ids: live }
            }
            Op::Acquire {
                session,
                seq,
                name,
                wait_ms,
            } => {
                let request = AcquireRequest {
                    key: session,
                    seq: *seq,
                    name,
                    wait_ms: *wait_ms,
                    mode: Mode::Exclusive,
                    value: None,
                    lock_delay_ms: 0,
                };
                self.acquire_request(request, index, now_ms, fx)
            }
            Op::Campaign {
                session,
                seq,
                name,
                wait_ms,
                value,
            } => {
                let request = AcquireRequest {
                    key: session,
                    seq: *seq,
                    name,
                    wait_ms: *wait_ms,
                    mode: Mode::Exclusive,
                    value: Some(value),
                    lock_delay_ms: 0,
                };
                self.acquire_request(request, index, now_ms, fx)
            }
            Op::Proclaim {
                session,
                seq,
                name,
                token,
                value,
            } => match self.authenticate(session) {
                Err(r) => Outcome::Rejected(r),
                Ok(()) => {
                    let print = RequestPrint::proclaim(name, *token, value);
                    match self.seen(session.id, *seq, Some(print)) {
                        Seen::Done(o) if is_proclaim_outcome(&o) => o.answered_for(name),
                        Seen::Done(_) | Seen::Waiting | Seen::Reused => {
                            Outcome::Rejected(Rejection::SequenceReused { seq: *seq })
                        }
                        Seen::TooOld => Outcome::Rejected(Rejection::RequestTooOld { seq: *seq }),
                        Seen::New => {
                            let o = self.proclaim(session.id, *seq, name, *token, value, fx);
                            self.stamp(session.id, *seq, print);
                            o
                        }
                    }
                }
            },
            Op::AcquireDelayed {
                session,
                seq,
                name,
                wait_ms,
                lock_delay_ms,
            } => {
                let request = AcquireRequest {
                    key: session,
                    seq: *seq,
                    name,
                    wait_ms: *wait_ms,
                    mode: Mode::Exclusive,
                    value: None,
                    lock_delay_ms: *lock_delay_ms,
                };
                self.acquire_request(request, index, now_ms, fx)
            }
            Op::EndDelays { ends } => self.end_delays(ends, index, now_ms, fx),
            Op::AcquireWith {
                session,
                seq,
                name,
                wait_ms,
                mode,
            } => {
                let request = AcquireRequest {
                    key: session,
                    seq: *seq,
                    name,
                    wait_ms: *wait_ms,
                    mode: *mode,
                    value: None,
                    lock_delay_ms: 0,
                };
                self.acquire_request(request, index, now_ms, fx)
            }
            Op::CancelWait { session, seq } => match self.authenticate(session) {
                Err(r) => Outcome::Rejected(r),
                Ok(()) => match self.seen(session.id, *seq, None) {
                    Seen::Done(o) if !is_acquire_outcome(&o) => {
                        Outcome::Rejected(Rejection::SequenceReused { seq: *seq })
                    }
                    Seen::Done(o) => o,
                    Seen::Waiting => {
                        let name = self.cancel_wait(session.id, *seq);
                        fx.changes.push(LockChange::WaitEnded {
                            name: name.clone(),
                            session: session.id,
                            seq: *seq,
                        });
                        self.record(session.id, *seq, Outcome::NotGranted);
                        // A reader behind a cancelled writer may now fit.
                        if self.multi.contains_key(name.as_str()) {
                            self.admit(&name, index, now_ms, fx);
                        }
                        Outcome::NotGranted
                    }
                    // Reused: never, a cancel brings no fingerprint to differ.
                    Seen::TooOld | Seen::New | Seen::Reused => {
                        Outcome::Rejected(Rejection::UnknownRequest { seq: *seq })
                    }
                },
            },
            Op::Release {
                session,
                seq,
                name,
                token,
            } => match self.authenticate(session) {
                Err(r) => Outcome::Rejected(r),
                Ok(()) => {
                    let print = RequestPrint::release(name, *token);
                    match self.seen(session.id, *seq, Some(print)) {
                        Seen::Done(o) if is_release_outcome(&o) => o.answered_for(name),
                        // A release never waits and never grants: a Waiting seq, or one whose
                        // outcome is an acquire's, means the client reused an acquire's
                        // sequence number; a Reused one, another release's (another name or
                        // token).
                        Seen::Done(_) | Seen::Waiting | Seen::Reused => {
                            Outcome::Rejected(Rejection::SequenceReused { seq: *seq })
                        }
                        Seen::TooOld => Outcome::Rejected(Rejection::RequestTooOld { seq: *seq }),
                        Seen::New => {
                            let o = self.release(session.id, name, *token, index, now_ms, fx);
                            self.record(session.id, *seq, o.clone());
                            self.stamp(session.id, *seq, print);
                            o
                        }
                    }
                }
            },
        }
    }

    /// An `Acquire` or `AcquireWith`: authenticated, looked up for exactly-once, then applied.
    fn acquire_request(
        &mut self,
        r: AcquireRequest<'_>,
        index: u64,
        now_ms: u64,
        fx: &mut Applied,
    ) -> Outcome {
        let (session, seq, name) = (r.key, r.seq, r.name);
        if let Err(e) = self.authenticate(session) {
            return Outcome::Rejected(e);
        }
        let print = RequestPrint::acquire(&r);
        match self.seen(session.id, seq, Some(print)) {
            Seen::Done(o) if !is_acquire_outcome(&o) => {
                Outcome::Rejected(Rejection::SequenceReused { seq })
            }
            // The seq answered (or waits for) an acquire of another name, mode, delay or value:
            // its grant is not this request's (issue #35's attacker review, F2).
            Seen::Reused => Outcome::Rejected(Rejection::SequenceReused { seq }),
            Seen::Done(o) => o.answered_for(name),
            Seen::Waiting => Outcome::Queued {
                position: self.position(session.id, seq),
            },
            Seen::TooOld => Outcome::Rejected(Rejection::RequestTooOld { seq }),
            Seen::New => {
                let checked = match r.value.map(|v| validate_value(v)) {
                    Some(Err(e)) => Err(e),
                    _ => self.delay_check(session.id, name, r.mode, r.lock_delay_ms),
                };
                let o = match checked {
                    Err(rejection) => Outcome::Rejected(rejection),
                    Ok(()) => {
                        let extra = r.value.map_or(0, |v| value_bytes(name, v));
                        let a = (session.id, seq, name.as_str(), r.wait_ms, r.mode);
                        self.acquire(a, extra, index, now_ms)
                    }
                };
                if r.lock_delay_ms > 0 {
                    self.note_delay(session.id, seq, name, r.lock_delay_ms, &o);
                }
                // A campaign's value is published by its grant or kept for its handover.
                if let Some(v) = r.value {
                    match o {
                        Outcome::Granted { token } => {
                            self.bytes += value_bytes(name, v);
                            let key = self.key_of(name);
                            let value = v.clone();
                            self.values.insert(key, Published { token, value });
                        }
                        Outcome::Queued { .. } => {
                            self.bytes += value_bytes(name, v);
                            self.campaigns.insert((session.id, seq), v.clone());
                        }
                        _ => {}
                    }
                }
                match o {
                    Outcome::Granted { token } => fx.changes.push(LockChange::Granted {
                        name: name.clone(),
                        session: session.id,
                        token,
                        mode: r.mode,
                        value: r.value.cloned(),
                    }),
                    Outcome::Queued { .. } => fx.changes.push(LockChange::Queued {
                        name: name.clone(),
                        session: session.id,
                        seq,
                    }),
                    _ => {}
                }
                if o == Outcome::NotGranted {
                    fx.busy = self.describe(name).and_then(|l| l.holder);
                }
                if !matches!(o, Outcome::Queued { .. }) {
                    self.record(session.id, seq, o.clone());
                }
                self.stamp(session.id, seq, print);
                o
            }
        }
    }

    fn create_session(
        &mut self,
        index: u64,
        ttl_ms: u64,
        secret: u64,
        identity: Option<&str>,
        owner: Option<&SessionOwner>,
    ) -> Outcome {
        if let Err(r) = validate_ttl_ms(ttl_ms) {
            return Outcome::Rejected(r);
        }
        if let Some(Err(r)) = owner.map(SessionOwner::validate) {
            return Outcome::Rejected(r);
        }
        if self.sessions.len() >= limits::SESSIONS_MAX {
            return Outcome::Rejected(Rejection::TooManySessions {
                max: limits::SESSIONS_MAX,
            });
        }
        let cost = session_bytes(identity, owner);
        if let Err(r) = self.room_for(cost) {
            return Outcome::Rejected(r);
        }
        self.bytes += cost;
        let id = self.shape.session_id(index);
        let prev = self.sessions.insert(
            id,
            Session {
                secret,
                ttl_ms,
                held: BTreeSet::new(),
                waiting: BTreeMap::new(),
                outcomes: BTreeMap::new(),
                recorded: VecDeque::new(),
                lease_mark_ms: None,
                evicted_max: None,
                identity: identity.map(str::to_owned),
                owner: owner.map(|o| Box::new(o.clone())),
                revoked: Vec::new(),
                revoked_through: None,
                wait_prints: BTreeMap::new(),
            },
        );
        assert!(prev.is_none(), "session id {id} reused");
        count_identity(&mut self.identities, identity, 1, 0);
        Outcome::SessionCreated { id, ttl_ms }
    }

    fn authenticate(&self, key: &SessionKey) -> Result<(), Rejection> {
        match self.sessions.get(&key.id) {
            // A wrong secret answers like a missing session: no oracle for guessing ids.
            Some(s) if s.secret == key.secret => Ok(()),
            _ => Err(Rejection::SessionNotFound { id: key.id }),
        }
    }

    /// Where `seq` of session `sid` stands, for a request whose fingerprint is `print` (`None`
    /// for a cancel, which names an acquire by its seq): a known seq used for a request with
    /// another fingerprint is `Seen::Reused`.
    fn seen(&self, sid: SessionId, seq: u64, print: Option<RequestPrint>) -> Seen {
        let s = &self.sessions[&sid];
        let other =
            |known: Option<RequestPrint>| known.is_some_and(|k| print.is_some_and(|p| p != k));
        if s.waiting.contains_key(&seq) {
            if other(s.wait_prints.get(&seq).copied()) {
                Seen::Reused
            } else {
                Seen::Waiting
            }
        } else if let Some(r) = s.outcomes.get(&seq) {
            if other(r.print) {
                Seen::Reused
            } else {
                Seen::Done(r.outcome.clone())
            }
        } else if s.evicted_max.is_some_and(|m| seq <= m) {
            Seen::TooOld
        } else {
            Seen::New
        }
    }

    fn record(&mut self, sid: SessionId, seq: u64, outcome: Outcome) {
        let s = self
            .sessions
            .get_mut(&sid)
            .expect("recording for a live session");
        // A wait's outcome takes the fingerprint of the request that waited; a request answered
        // at once gets its own from `stamp`.
        let print = s.wait_prints.remove(&seq);
        let outcome = outcome.remembered();
        let prev = s.outcomes.insert(seq, Remembered { outcome, print });
        assert!(prev.is_none(), "outcome of {sid}/{seq} recorded twice");
        s.recorded.push_back(seq);
        while s.recorded.len() > limits::SESSION_OUTCOMES_MAX {
            let old = s.recorded.pop_front().expect("non-empty");
            s.outcomes.remove(&old);
            s.evicted_max = Some(s.evicted_max.map_or(old, |m| m.max(old)));
        }
    }

    /// A new request `(sid, seq)` was just applied: its outcome, if recorded, or its wait
    /// remembers its fingerprint.
    fn stamp(&mut self, sid: SessionId, seq: u64, print: RequestPrint) {
        let Some(s) = self.sessions.get_mut(&sid) else {
            return;
        };
        if s.waiting.contains_key(&seq) {
            s.wait_prints.insert(seq, print);
        } else if let Some(r) = s.outcomes.get_mut(&seq) {
            r.print = Some(print);
        }
    }

    fn position(&self, sid: SessionId, seq: u64) -> u32 {
        let name = self.sessions[&sid].waiting[&seq].as_str();
        let i = match self.locks.get(name) {
            Some(lock) => lock
                .waiters
                .iter()
                .position(|w| w.session == sid && w.seq == seq),
            None if self.delays.running.contains_key(name) => self.delays.running[name]
                .waiters
                .iter()
                .position(|w| w.session == sid && w.seq == seq),
            None => self.multi[name]
                .waiters
                .iter()
                .position(|w| w.waiter.session == sid && w.waiter.seq == seq),
        };
        (i.expect("a waiting request is in its lock's queue") + 1) as u32
    }

    /// The token of `sid`'s grant of `name`, which it holds.
    fn token_of(&self, sid: SessionId, name: &str) -> u64 {
        match self.locks.get(name) {
            Some(lock) => lock.holder.token,
            None => {
                self.multi[name]
                    .holders
                    .iter()
                    .find(|h| h.session == sid)
                    .expect("a recorded hold has its grant")
                    .token
            }
        }
    }

    /// The lock count against `LOCKS_MAX`: names held or waited for, either way.
    fn names_in_use(&self) -> usize {
        self.locks.len() + self.multi.len() + self.delays.running.len()
    }

    /// An acquire, checked before it changes anything. `extra` bytes (a campaign's value) must
    /// fit the budget beside what the acquire adds; the caller charges them.
    fn acquire(&mut self, a: Acquiring<'_>, extra: usize, index: u64, now_ms: u64) -> Outcome {
        let (sid, seq, name, wait_ms, mode) = a;
        if let Err(r) = validate_stored_name(name) {
            return Outcome::Rejected(r);
        }
        if let Mode::Permits(permits) = mode {
            if permits == 0 || permits as usize > limits::HOLDERS_PER_LOCK_MAX {
                return Outcome::Rejected(Rejection::PermitsOutOfRange {
                    permits,
                    max: limits::HOLDERS_PER_LOCK_MAX as u32,
                });
            }
        }
        let s = &self.sessions[&sid];
        if s.held.contains(name) {
            let token = self.token_of(sid, name);
            return Outcome::Rejected(Rejection::AlreadyHeld { token });
        }
        if let Some((&seq, _)) = s.waiting.iter().find(|(_, n)| n.as_str() == name) {
            return Outcome::Rejected(Rejection::AlreadyWaiting { seq });
        }
        if s.held.len() + s.waiting.len() >= limits::LOCKS_PER_SESSION_MAX {
            return Outcome::Rejected(Rejection::TooManyLocksForSession {
                max: limits::LOCKS_PER_SESSION_MAX,
            });
        }
        if self.delays.running.contains_key(name) {
            return self.acquire_delayed_name(a, extra, now_ms);
        }
        if mode != Mode::Exclusive || self.multi.contains_key(name) {
            return self.acquire_multi(a, extra, index, now_ms);
        }
        // A mutex: exactly as before issue #32.
        let waiter_cost = waiter_bytes(name) + extra;
        let room_for_waiter = self.room_for(waiter_cost);
        match self.locks.get_mut(name) {
            None => {
                if self.names_in_use() >= limits::LOCKS_MAX {
                    return Outcome::Rejected(Rejection::TooManyLocks {
                        max: limits::LOCKS_MAX,
                    });
                }
                if let Err(r) = self.room_for(lock_bytes(name) + extra) {
                    return Outcome::Rejected(r);
                }
                self.bytes += lock_bytes(name);
                let name = Name::from(name);
                self.locks.insert(
                    name.clone(),
                    Lock {
                        holder: Holder {
                            session: sid,
                            token: index,
                            granted_at_ms: now_ms,
                        },
                        waiters: Queue::default(),
                    },
                );
                let s = self.sessions.get_mut(&sid).expect("live");
                s.held.insert(name);
                Outcome::Granted { token: index }
            }
            Some(_) if wait_ms == 0 => Outcome::NotGranted,
            Some(lock) => {
                if lock.waiters.len() >= limits::WAITERS_PER_LOCK_MAX {
                    return Outcome::Rejected(Rejection::QueueFull {
                        max: limits::WAITERS_PER_LOCK_MAX,
                    });
                }
                if let Err(r) = room_for_waiter {
                    return Outcome::Rejected(r);
                }
                self.bytes += waiter_bytes(name);
                let until_ms = now_ms.saturating_add(wait_ms.min(limits::WAIT_TIMEOUT_MS_MAX));
                lock.waiters.push_back(Waiter {
                    session: sid,
                    seq,
                    until_ms,
                    since_ms: now_ms,
                });
                let position = lock.waiters.len() as u32;
                self.wait_ends.insert((until_ms, sid, seq));
                let s = self.sessions.get_mut(&sid).expect("live");
                let again = s.waiting.insert(seq, name.to_owned());
                assert!(again.is_none(), "request {seq} queued twice");
                count_identity(&mut self.identities, s.identity.as_deref(), 0, 1);
                Outcome::Queued { position }
            }
        }
    }

    /// An acquire in a mode other than a mutex's, or of a name used with several holders
    /// (issue #32). Checks before it changes anything, so a refusal loses nothing.
    fn acquire_multi(
        &mut self,
        a: Acquiring<'_>,
        extra: usize,
        index: u64,
        now_ms: u64,
    ) -> Outcome {
        let (sid, seq, name, wait_ms, mode) = a;
        let waiter_cost = waiter_bytes(name);
        if let Some(lock) = self.locks.get(name) {
            // A mutex's holder is a writer: a reader waits behind it, and the name becomes a
            // read-write lock; a semaphore's permit cannot be taken from it.
            if mode != Mode::Shared {
                return Outcome::Rejected(Rejection::KindConflict {
                    name: name.into(),
                    held: LockKind::Lock,
                    asked: mode.kind(),
                });
            }
            if wait_ms == 0 {
                return Outcome::NotGranted;
            }
            if lock.waiters.len() >= limits::WAITERS_PER_LOCK_MAX {
                return Outcome::Rejected(Rejection::QueueFull {
                    max: limits::WAITERS_PER_LOCK_MAX,
                });
            }
            if let Err(r) = self.room_for(waiter_cost + limits::TABLE_GRANT_BYTES) {
                return Outcome::Rejected(r);
            }
            let (key, lock) = self.locks.remove_entry(name).expect("held");
            self.bytes += limits::TABLE_GRANT_BYTES;
            let holder = Grant {
                session: lock.holder.session,
                token: lock.holder.token,
                granted_at_ms: lock.holder.granted_at_ms,
                mode: Mode::Exclusive,
            };
            let waiters = lock
                .waiters
                .iter()
                .map(|&waiter| ModeWaiter {
                    waiter,
                    mode: Mode::Exclusive,
                })
                .collect();
            let multi = MultiLock {
                kind: LockKind::Lock,
                holders: vec![holder],
                waiters,
                last_token: holder.token,
            };
            self.multi.insert(key, multi);
        }
        let Some((key, lock)) = self.multi.get_key_value(name) else {
            // Free: the first holder, with the entry's index as its token.
            if self.names_in_use() >= limits::LOCKS_MAX {
                return Outcome::Rejected(Rejection::TooManyLocks {
                    max: limits::LOCKS_MAX,
                });
            }
            let cost = lock_bytes(name) + limits::TABLE_GRANT_BYTES;
            if let Err(r) = self.room_for(cost + extra) {
                return Outcome::Rejected(r);
            }
            self.bytes += cost;
            let key = Name::from(name);
            let grant = Grant {
                session: sid,
                token: index,
                granted_at_ms: now_ms,
                mode,
            };
            let lock = MultiLock {
                kind: mode.kind(),
                holders: vec![grant],
                waiters: VecDeque::new(),
                last_token: index,
            };
            self.multi.insert(key.clone(), lock);
            self.sessions.get_mut(&sid).expect("live").held.insert(key);
            return Outcome::Granted { token: index };
        };
        let key = key.clone();
        match (lock.kind, mode.kind()) {
            (held, asked) if held == asked => {}
            (LockKind::Semaphore { permits }, LockKind::Semaphore { permits: asked }) => {
                return Outcome::Rejected(Rejection::PermitsConflict {
                    name: name.into(),
                    permits,
                    asked,
                })
            }
            (held, asked) => {
                return Outcome::Rejected(Rejection::KindConflict {
                    name: name.into(),
                    held,
                    asked,
                })
            }
        }
        let plant = self.plant;
        let only_readers = !lock.holders.is_empty()
            && lock.holders.iter().all(|h| h.mode == Mode::Shared)
            && lock.kind == LockKind::Lock;
        if plant.writer_beside_readers
            && mode == Mode::Exclusive
            && only_readers
            && lock.waiters.is_empty()
        {
            // Planted: the readers' grants are dropped without a word to their sessions.
            let mut fx = Applied::just(Outcome::NotGranted);
            while !self.multi[name].holders.is_empty() {
                self.drop_grant(name, 0, &mut fx);
            }
        }
        let lock = &self.multi[name];
        // Planted: a reader joins the readers past a waiting writer.
        let past_waiters = plant.reader_past_writer && mode == Mode::Shared && only_readers;
        // FIFO: an acquire that finds anyone waiting waits behind them (no writer starves).
        if (lock.waiters.is_empty() || past_waiters) && lock.fits(mode) {
            if let Err(r) = self.room_for(limits::TABLE_GRANT_BYTES + extra) {
                return Outcome::Rejected(r);
            }
            self.bytes += limits::TABLE_GRANT_BYTES;
            let lock = self.multi.get_mut(name).expect("in use");
            let token = lock.grant_token(mode, index, plant);
            lock.holders.push(Grant {
                session: sid,
                token,
                granted_at_ms: now_ms,
                mode,
            });
            lock.last_token = token;
            self.sessions.get_mut(&sid).expect("live").held.insert(key);
            return Outcome::Granted { token };
        }
        if wait_ms == 0 {
            return Outcome::NotGranted;
        }
        if lock.waiters.len() >= limits::WAITERS_PER_LOCK_MAX {
            return Outcome::Rejected(Rejection::QueueFull {
                max: limits::WAITERS_PER_LOCK_MAX,
            });
        }
        if let Err(r) = self.room_for(waiter_cost + extra) {
            return Outcome::Rejected(r);
        }
        self.bytes += waiter_cost;
        let until_ms = now_ms.saturating_add(wait_ms.min(limits::WAIT_TIMEOUT_MS_MAX));
        let lock = self.multi.get_mut(name).expect("in use");
        lock.waiters.push_back(ModeWaiter {
            waiter: Waiter {
                session: sid,
                seq,
                until_ms,
                since_ms: now_ms,
            },
            mode,
        });
        let position = lock.waiters.len() as u32;
        self.wait_ends.insert((until_ms, sid, seq));
        let s = self.sessions.get_mut(&sid).expect("live");
        let again = s.waiting.insert(seq, name.to_owned());
        assert!(again.is_none(), "request {seq} queued twice");
        count_identity(&mut self.identities, s.identity.as_deref(), 0, 1);
        Outcome::Queued { position }
    }

    /// Grant the waiters at the head of `name`'s queue that now fit (a writer alone, the run of
    /// readers, as many as there are free permits), passing over ended waits as `hand_over`
    /// does, and free the name if nobody holds it. Called after every change to the holders or
    /// the queue of a name used with several holders.
    fn admit(&mut self, name: &str, index: u64, now_ms: u64, fx: &mut Applied) {
        let (key, _) = self.multi.get_key_value(name).expect("in use");
        let key = key.clone();
        let plant = self.plant;
        loop {
            let lock = self.multi.get_mut(name).expect("in use");
            let Some(&next) = lock.waiters.front() else {
                break;
            };
            if !lock.fits(next.mode) {
                break;
            }
            lock.waiters.pop_front();
            let w = next.waiter;
            assert!(self.wait_ends.remove(&(w.until_ms, w.session, w.seq)));
            self.bytes -= waiter_bytes(name);
            let s = self.sessions.get_mut(&w.session).expect("live waiter");
            let waited_for = s.waiting.remove(&w.seq);
            assert_eq!(waited_for.as_deref(), Some(name));
            count_identity(&mut self.identities, s.identity.as_deref(), 0, -1);
            if w.until_ms > now_ms {
                s.held.insert(key.clone());
            } else {
                self.drop_campaign(name, w.session, w.seq);
                self.record(w.session, w.seq, Outcome::NotGranted);
                fx.ended_waits.push((w.session, w.seq));
                fx.changes.push(LockChange::WaitEnded {
                    name: name.to_owned(),
                    session: w.session,
                    seq: w.seq,
                });
                continue;
            }
            let lock = self.multi.get_mut(name).expect("in use");
            let token = lock.grant_token(next.mode, index, plant);
            lock.holders.push(Grant {
                session: w.session,
                token,
                granted_at_ms: now_ms,
                mode: next.mode,
            });
            lock.last_token = token;
            self.bytes += limits::TABLE_GRANT_BYTES;
            self.record(w.session, w.seq, Outcome::Granted { token });
            let value = self.publish_campaign(&key, w.session, w.seq, token);
            fx.changes.push(LockChange::Granted {
                name: name.to_owned(),
                session: w.session,
                token,
                mode: next.mode,
                value,
            });
            fx.handoffs.push(Handoff {
                name: name.to_owned(),
                session: w.session,
                seq: w.seq,
                token,
            });
        }
        if self.multi[name].holders.is_empty() {
            let lock = self.multi.remove(name).expect("in use");
            assert!(lock.waiters.is_empty(), "{name}: free with a queue");
            self.bytes -= lock_bytes(name);
        }
    }

    /// Take `holders[i]`'s grant of `name` (a name used with several holders); `admit` then
    /// hands on what it freed.
    fn drop_grant(&mut self, name: &str, i: usize, fx: &mut Applied) -> Grant {
        let lock = self.multi.get_mut(name).expect("in use");
        let g = lock.holders.remove(i);
        self.bytes -= limits::TABLE_GRANT_BYTES;
        self.forget_hold(name, g.session, g.token, fx);
        g
    }

    /// The holder `session`'s grant `token` of `name` ends: its session no longer records the
    /// hold, and the change says it was released.
    fn forget_hold(&mut self, name: &str, session: SessionId, token: u64, fx: &mut Applied) {
        if self.values.get(name).is_some_and(|p| p.token == token) {
            let p = self.values.remove(name).expect("found");
            self.bytes -= value_bytes(name, &p.value);
        }
        let removed = self
            .sessions
            .get_mut(&session)
            .expect("holder's session is live")
            .held
            .remove(name);
        assert!(removed, "{name}: holder's session does not record the hold");
        fx.changes.push(LockChange::Released {
            name: name.to_owned(),
            session,
            token,
        });
    }

    // ---- lock-delay (issue #32 item 4) ----

    /// Whether an acquire in `mode` asking for `lock_delay_ms` may go on, before anything
    /// changes: a delay within its limit, only on a mutex, and room for what it adds beside
    /// the lock or the wait.
    fn delay_check(
        &self,
        sid: SessionId,
        name: &str,
        mode: Mode,
        lock_delay_ms: u64,
    ) -> Result<(), Rejection> {
        if lock_delay_ms > limits::LOCK_DELAY_MS_MAX {
            return Err(Rejection::LockDelayOutOfRange {
                lock_delay_ms,
                max: limits::LOCK_DELAY_MS_MAX,
            });
        }
        let delayed = self.uses_lock_delay(name);
        if (mode != Mode::Exclusive && delayed)
            || (lock_delay_ms > 0 && self.multi.contains_key(name))
        {
            return Err(Rejection::LockDelayConflict { name: name.into() });
        }
        if lock_delay_ms > 0 {
            if self.delays.count() >= limits::DELAYS_MAX {
                return Err(Rejection::TooManyDelays {
                    max: limits::DELAYS_MAX,
                });
            }
            // Whatever the identity's quota (checked before proposing, so calls in flight can
            // pass it together), one identity keeps at most this share of the group's.
            let mine = self
                .identity_of(sid)
                .and_then(|id| self.delays.per_identity.get(id))
                .copied()
                .unwrap_or(0);
            if mine >= limits::DELAYS_PER_IDENTITY_MAX {
                return Err(Rejection::TooManyDelays {
                    max: limits::DELAYS_PER_IDENTITY_MAX,
                });
            }
            let charge = delay_bytes(name, self.identity_of(sid));
            self.room_for(charge + lock_bytes(name).max(waiter_bytes(name)))?;
        }
        Ok(())
    }

    /// Remember the delay an acquire asked for with what it got: a grant's, or a wait's.
    fn note_delay(
        &mut self,
        sid: SessionId,
        seq: u64,
        name: &str,
        lock_delay_ms: u64,
        o: &Outcome,
    ) {
        match o {
            Outcome::Granted { .. } => {
                let (key, _) = self.locks.get_key_value(name).expect("a granted mutex");
                self.delays.held.insert(key.clone(), lock_delay_ms);
            }
            Outcome::Queued { .. } => {
                self.delays.asked.insert((sid, seq), lock_delay_ms);
            }
            _ => return,
        }
        self.bytes += delay_bytes(name, self.identity_of(sid));
        let identity = self.identity_of(sid).map(str::to_owned);
        self.delays.charge(identity.as_deref());
    }

    /// How many delays count against each identity, counted afresh (`Delays::per_identity`).
    fn count_delays_per_identity(&self) -> BTreeMap<String, usize> {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        let held = self.delays.held.keys().filter_map(|n| {
            let holder = self.locks.get(n)?.holder.session;
            self.identity_of(holder)
        });
        let asked = self
            .delays
            .asked
            .keys()
            .filter_map(|(sid, _)| self.identity_of(*sid));
        let running = self
            .delays
            .running
            .values()
            .filter_map(|d| d.identity.as_deref());
        for id in held.chain(asked).chain(running) {
            *counts.entry(id.to_owned()).or_default() += 1;
        }
        counts
    }

    /// The identity live session `sid` belongs to, under access control.
    fn identity_of(&self, sid: SessionId) -> Option<&str> {
        self.sessions.get(&sid).and_then(|s| s.identity.as_deref())
    }

    /// Request `(sid, seq)` left `name`'s queue without a grant: its asked delay goes.
    fn forget_ask(&mut self, sid: SessionId, seq: u64, name: &str) {
        if self.delays.asked.remove(&(sid, seq)).is_some() {
            self.bytes -= delay_bytes(name, self.identity_of(sid));
            let identity = self.identity_of(sid).map(str::to_owned);
            self.delays.discharge(identity.as_deref());
        }
    }

    /// Request `(sid, seq)` was granted `key`: its asked delay becomes the grant's.
    fn take_ask(&mut self, sid: SessionId, seq: u64, key: Name) {
        if let Some(d) = self.delays.asked.remove(&(sid, seq)) {
            let prev = self.delays.held.insert(key, d);
            assert!(prev.is_none(), "a new grant found its lock's delay");
        }
    }

    /// An exclusive acquire of a name in a lock-delay: it queues (or, not waiting, is not
    /// granted). `extra` bytes (a campaign's value) must fit beside the wait; the caller
    /// charges them.
    fn acquire_delayed_name(&mut self, a: Acquiring<'_>, extra: usize, now_ms: u64) -> Outcome {
        let (sid, seq, name, wait_ms, mode) = a;
        assert_eq!(mode, Mode::Exclusive, "delay_check refused other modes");
        if wait_ms == 0 {
            return Outcome::NotGranted;
        }
        let waiter_cost = waiter_bytes(name);
        if self.delays.running[name].waiters.len() >= limits::WAITERS_PER_LOCK_MAX {
            return Outcome::Rejected(Rejection::QueueFull {
                max: limits::WAITERS_PER_LOCK_MAX,
            });
        }
        if let Err(r) = self.room_for(waiter_cost + extra) {
            return Outcome::Rejected(r);
        }
        self.bytes += waiter_cost;
        let until_ms = now_ms.saturating_add(wait_ms.min(limits::WAIT_TIMEOUT_MS_MAX));
        let d = self.delays.running.get_mut(name).expect("in a delay");
        d.waiters.push_back(Waiter {
            session: sid,
            seq,
            until_ms,
            since_ms: now_ms,
        });
        let position = d.waiters.len() as u32;
        self.wait_ends.insert((until_ms, sid, seq));
        let s = self.sessions.get_mut(&sid).expect("live");
        let again = s.waiting.insert(seq, name.to_owned());
        assert!(again.is_none(), "request {seq} queued twice");
        count_identity(&mut self.identities, s.identity.as_deref(), 0, 1);
        Outcome::Queued { position }
    }

    /// A mutex's grant ends: handed to the next waiter, or, when it was lost (expiry, revoke,
    /// force-release) and asked for a delay, into that delay.
    fn end_grant(&mut self, name: &str, index: u64, now_ms: u64, ends: Ends, fx: &mut Applied) {
        if ends == Ends::Lost && self.delays.held.contains_key(name) {
            self.start_delay(name, now_ms, fx);
        } else {
            self.hand_over(name, index, now_ms, fx);
        }
    }

    /// Take `name` from its holder, whose grant asked for a delay, and keep it from everyone
    /// until an `EndDelays` names the delay; its waiters stay queued in order. The lock's and
    /// the held delay's charges stay, as the running delay's (the holder's session, whose
    /// identity the delay keeps, is live here).
    fn start_delay(&mut self, name: &str, now_ms: u64, fx: &mut Applied) {
        let delay_ms = self.delays.held.remove(name).expect("asked for a delay");
        let (key, lock) = self.locks.remove_entry(name).expect("held");
        let session = lock.holder.session;
        let identity = self.identity_of(session).map(str::to_owned);
        self.forget_hold(name, session, lock.holder.token, fx);
        let delayed = Delayed {
            since_ms: now_ms,
            delay_ms,
            token: lock.holder.token,
            session,
            identity,
            waiters: lock.waiters,
        };
        self.delays.running.insert(key, delayed);
    }

    /// `Op::EndDelays`: each named delay still running under its token (the first
    /// `DELAYS_ENDED_PER_ENTRY_MAX` named; another, or a stale one, is passed over) ends
    /// (`end_delay`).
    fn end_delays(
        &mut self,
        ends: &[DelayEnd],
        index: u64,
        now_ms: u64,
        fx: &mut Applied,
    ) -> Outcome {
        let mut count = 0;
        for end in ends.iter().take(limits::DELAYS_ENDED_PER_ENTRY_MAX) {
            let Some((key, d)) = self.delays.running.get_key_value(end.name.as_str()) else {
                continue;
            };
            if d.token != end.token {
                continue;
            }
            let key = key.clone();
            self.end_delay(key, index, now_ms, fx);
            count += 1;
        }
        Outcome::DelaysEnded { count }
    }

    /// A running delay of `key` ends: the first waiter whose wait has not ended gets the name
    /// with this entry's index as its token (the ones before it leave not granted), or the
    /// name is free.
    fn end_delay(&mut self, key: Name, index: u64, now_ms: u64, fx: &mut Applied) {
        let name: &str = &key;
        let d = self.delays.running.remove(name).expect("a running delay");
        self.bytes -= delay_bytes(name, d.identity.as_deref());
        self.delays.discharge(d.identity.as_deref());
        assert!(index > d.token, "token did not increase for {name}");
        let mut waiters = d.waiters;
        let Some(next) = self.next_live_waiter(name, &mut waiters, now_ms, fx) else {
            self.bytes -= lock_bytes(name);
            return;
        };
        let holder = Holder {
            session: next.session,
            token: index,
            granted_at_ms: now_ms,
        };
        self.locks.insert(key.clone(), Lock { holder, waiters });
        // A campaign that waited out the delay leads now.
        self.grant_to_waiter(&key, &next, index, fx);
    }

    /// Pops `waiters` of `name` up to the first whose wait has not ended at `now_ms`, and
    /// answers it; the ones before it leave the queue not granted, as an `ExpireWaits` would
    /// have made them. Each popped waiter's charge and wait end go.
    fn next_live_waiter(
        &mut self,
        name: &str,
        waiters: &mut Queue,
        now_ms: u64,
        fx: &mut Applied,
    ) -> Option<Waiter> {
        loop {
            let w = waiters.pop_front()?;
            assert!(self.wait_ends.remove(&(w.until_ms, w.session, w.seq)));
            self.bytes -= waiter_bytes(name);
            if w.until_ms > now_ms {
                return Some(w);
            }
            self.forget_ask(w.session, w.seq, name);
            self.drop_campaign(name, w.session, w.seq);
            let s = self.sessions.get_mut(&w.session).expect("live waiter");
            s.waiting.remove(&w.seq).expect("recorded wait");
            count_identity(&mut self.identities, s.identity.as_deref(), 0, -1);
            self.record(w.session, w.seq, Outcome::NotGranted);
            fx.ended_waits.push((w.session, w.seq));
            fx.changes.push(LockChange::WaitEnded {
                name: name.to_owned(),
                session: w.session,
                seq: w.seq,
            });
        }
    }

    /// Waiter `next` was made the holder of mutex `key` under token `index`: its session holds
    /// it, its request is answered, its asked delay becomes the grant's, a queued campaign
    /// publishes its value, and the grant is reported (a change and a handoff).
    fn grant_to_waiter(&mut self, key: &Name, next: &Waiter, index: u64, fx: &mut Applied) {
        let name: &str = key;
        let s = self
            .sessions
            .get_mut(&next.session)
            .expect("every waiter belongs to a live session");
        let waited_for = s.waiting.remove(&next.seq);
        assert_eq!(waited_for.as_deref(), Some(name));
        count_identity(&mut self.identities, s.identity.as_deref(), 0, -1);
        s.held.insert(key.clone());
        self.take_ask(next.session, next.seq, key.clone());
        self.record(next.session, next.seq, Outcome::Granted { token: index });
        let value = self.publish_campaign(key, next.session, next.seq, index);
        fx.changes.push(LockChange::Granted {
            name: name.to_owned(),
            session: next.session,
            token: index,
            mode: Mode::Exclusive,
            value,
        });
        fx.handoffs.push(Handoff {
            name: name.to_owned(),
            session: next.session,
            seq: next.seq,
            token: index,
        });
    }

    /// The names live session `id` holds that someone waits for (conflict events, issue #32
    /// item 5), in name order, at most `limits::CONTENDED_PER_LEASE_MAX`, and whether that is
    /// all of them: false when another contended name was found past the listed ones, or
    /// `budget` (shared by the sessions of one keepalive answer) ran out of names to look at or
    /// to list before its held names were all looked at. Held names are looked at in name
    /// order, so what a cut list leaves out comes after its last name. A holder whose waiters all cannot fit beside it (readers behind its
    /// writer, permits of a full semaphore) is contended; so is every holder of a name with
    /// several.
    pub fn contended(&self, id: SessionId, budget: &mut ContendedBudget) -> (Vec<String>, bool) {
        let Some(s) = self.sessions.get(&id) else {
            return (Vec::new(), true);
        };
        let mut names = Vec::new();
        for name in &s.held {
            if budget.checks == 0 {
                return (names, false);
            }
            budget.checks -= 1;
            let waited_for = match self.multi.get(&**name) {
                Some(l) => !l.waiters.is_empty(),
                None => self.locks.get(&**name).is_some_and(|l| l.waiters.len() > 0),
            };
            if waited_for {
                // Cut only when there is one more to list than may be.
                if names.len() == limits::CONTENDED_PER_LEASE_MAX || budget.names == 0 {
                    return (names, false);
                }
                budget.names -= 1;
                names.push(name.to_string());
            }
        }
        (names, true)
    }

    /// Whether `name` is in a lock-delay, or its holder or a waiter asked for one: a leader
    /// force-releases such a name with [`Op::ForceReleaseTargeted`].
    pub fn uses_lock_delay(&self, name: &str) -> bool {
        self.delays.running.contains_key(name)
            || self.delays.held.contains_key(name)
            || self.locks.get(name).is_some_and(|l| {
                l.waiters
                    .iter()
                    .any(|w| self.delays.asked.contains_key(&(w.session, w.seq)))
            })
    }

    /// The running lock-delays, in name order: (name, token, delay ms), for the leader to time
    /// on its monotonic clock (`Op::EndDelays` names them by token). At most
    /// `limits::DELAYS_MAX`.
    pub fn running_delays(&self) -> impl Iterator<Item = (&str, u64, u64)> + '_ {
        self.delays
            .running
            .iter()
            .map(|(n, d)| (&**n, d.token, d.delay_ms))
    }

    /// Takes request `seq` out of its queue; answers the lock's name. Of a name used with
    /// several holders, the caller then `admit`s what now fits.
    fn cancel_wait(&mut self, sid: SessionId, seq: u64) -> String {
        let s = self.sessions.get_mut(&sid).expect("live");
        let name = s.waiting.remove(&seq).expect("waiting");
        count_identity(&mut self.identities, s.identity.as_deref(), 0, -1);
        let w = if let Some(lock) = self.multi.get_mut(name.as_str()) {
            let i = lock
                .waiters
                .iter()
                .position(|w| w.waiter.session == sid && w.waiter.seq == seq)
                .expect("a waiting request is in its lock's queue");
            lock.waiters.remove(i).expect("found").waiter
        } else if let Some(d) = self.delays.running.get_mut(name.as_str()) {
            let i = d
                .waiters
                .iter()
                .position(|w| w.session == sid && w.seq == seq)
                .expect("a waiting request is in its lock's queue");
            d.waiters.remove(i).expect("found")
        } else {
            let lock = self
                .locks
                .get_mut(name.as_str())
                .expect("a queue belongs to a held lock");
            let i = lock
                .waiters
                .iter()
                .position(|w| w.session == sid && w.seq == seq)
                .expect("a waiting request is in its lock's queue");
            lock.waiters.remove(i).expect("found")
        };
        assert!(
            self.wait_ends.remove(&(w.until_ms, sid, seq)),
            "waiter indexed by its end"
        );
        self.bytes -= waiter_bytes(&name);
        self.drop_campaign(&name, sid, seq);
        self.forget_ask(sid, seq, &name);
        name
    }

    /// A wait for `name` that ends without a grant drops its campaign's value, if it had one.
    fn drop_campaign(&mut self, name: &str, sid: SessionId, seq: u64) {
        if let Some(v) = self.campaigns.remove(&(sid, seq)) {
            self.bytes -= value_bytes(name, &v);
        }
    }

    /// A wait granted `name` under `token` publishes its campaign's value, if it had one (the
    /// charge moves with it); answers the value.
    fn publish_campaign(
        &mut self,
        name: &Name,
        sid: SessionId,
        seq: u64,
        token: u64,
    ) -> Option<Vec<u8>> {
        let value = self.campaigns.remove(&(sid, seq))?;
        let published = Published {
            token,
            value: value.clone(),
        };
        let prev = self.values.insert(name.clone(), published);
        assert!(prev.is_none(), "{name}: a value published beside another");
        Some(value)
    }

    /// The table's shared copy of `name`, which is in use.
    fn key_of(&self, name: &str) -> Name {
        match self.locks.get_key_value(name) {
            Some((key, _)) => key.clone(),
            None => self.multi.get_key_value(name).expect("in use").0.clone(),
        }
    }

    /// A new `Op::Proclaim`: the leader of `name` under `token` (its exclusive holder) replaces
    /// its value. A refusal for the value's size or the table's budget changes nothing and is
    /// not remembered (a retry is checked again); a proclaim's answer is.
    fn proclaim(
        &mut self,
        sid: SessionId,
        seq: u64,
        name: &str,
        token: u64,
        value: &[u8],
        fx: &mut Applied,
    ) -> Outcome {
        if let Err(r) = validate_value(value).and_then(|()| validate_stored_name(name)) {
            return Outcome::Rejected(r);
        }
        let leads = match self.locks.get(name) {
            Some(l) => l.holder.session == sid && l.holder.token == token,
            None => self.multi.get(name).is_some_and(|l| {
                l.holders
                    .iter()
                    .any(|h| h.session == sid && h.token == token && h.mode == Mode::Exclusive)
            }),
        };
        // The planted bug: published under the leader's token, so the table's own invariant
        // (a value belongs to its name's exclusive holder) still holds.
        let past_term = (self.locks.get(name))
            .filter(|l| self.plant.proclaim_past_term && !leads && l.holder.token > token)
            .map(|l| (l.holder.session, l.holder.token));
        if !leads && past_term.is_none() {
            // Another planted bug: refused, yet published as the leader's under its token.
            let refused_applied = (self.locks.get(name))
                .filter(|l| self.plant.refused_proclaim_applied && l.holder.token > token)
                .map(|l| (l.holder.session, l.holder.token));
            if let Some((leader, leader_token)) = refused_applied {
                // Published as an acknowledged proclaim would be, if the table has room.
                let _ = self.publish(name, leader, leader_token, value, fx);
            }
            let o = Outcome::Rejected(Rejection::NotElectionLeader {
                name: name.into(),
                token,
            });
            self.record(sid, seq, o.clone());
            return o;
        }
        let (leader, token) = past_term.unwrap_or((sid, token));
        // Another planted bug: acknowledged, but the term's earlier value stays.
        if self.plant.proclaim_kept_old_value
            && self.values.get(name).is_some_and(|p| p.token == token)
        {
            self.record(sid, seq, Outcome::Proclaimed);
            return Outcome::Proclaimed;
        }
        if let Err(r) = self.publish(name, leader, token, value, fx) {
            return Outcome::Rejected(r);
        }
        self.record(sid, seq, Outcome::Proclaimed);
        Outcome::Proclaimed
    }

    /// `value` replaces `name`'s published value as `leader`'s under `token` (the exclusive
    /// holder's grant), if the table has room: the rejection that says it has not, changing
    /// nothing.
    fn publish(
        &mut self,
        name: &str,
        leader: SessionId,
        token: u64,
        value: &[u8],
        fx: &mut Applied,
    ) -> Result<(), Rejection> {
        let old = self
            .values
            .get(name)
            .map_or(0, |p| value_bytes(name, &p.value));
        let new = value_bytes(name, value);
        if new > old {
            self.room_for(new - old)?;
        }
        self.bytes = self.bytes + new - old;
        let key = self.key_of(name);
        let published = Published {
            token,
            value: value.to_vec(),
        };
        self.values.insert(key, published);
        fx.changes.push(LockChange::Proclaimed {
            name: name.into(),
            session: leader,
            token,
            value: value.to_vec(),
        });
        Ok(())
    }

    fn release(
        &mut self,
        sid: SessionId,
        name: &str,
        token: u64,
        index: u64,
        now_ms: u64,
        fx: &mut Applied,
    ) -> Outcome {
        if let Some(lock) = self.multi.get(name) {
            let Some(i) = lock
                .holders
                .iter()
                .position(|h| h.session == sid && h.token == token)
            else {
                return Outcome::NotHolder;
            };
            self.drop_grant(name, i, fx);
            let lock = &self.multi[name];
            if self.plant.permit_freed_twice
                && matches!(lock.kind, LockKind::Semaphore { .. })
                && !lock.holders.is_empty()
            {
                // Planted: the oldest other permit is freed too, its session not told.
                let mut silent = Applied::just(Outcome::NotGranted);
                self.drop_grant(name, 0, &mut silent);
            }
            self.admit(name, index, now_ms, fx);
            return Outcome::Released;
        }
        match self.locks.get(name) {
            Some(lock) if lock.holder.session == sid && lock.holder.token == token => {
                self.hand_over(name, index, now_ms, fx);
                Outcome::Released
            }
            _ => Outcome::NotHolder,
        }
    }

    /// An operator's force-release: hand `name` over as its holder's release would, remember
    /// the taken grant in the holder's session (its client learns it from a keepalive), and
    /// record it in the audit log. `target` is what an [`Op::ForceReleaseTargeted`] ends;
    /// `None` is an [`Op::ForceRelease`], which takes the holder or, finding a running delay
    /// (under `token`, if given), ends it, as it always did (logs hold such entries).
    #[allow(clippy::too_many_arguments)]
    fn force_release(
        &mut self,
        index: u64,
        now_ms: u64,
        name: &str,
        token: Option<u64>,
        target: Option<ForceTarget>,
        by: &Actor,
        reason: &str,
        fx: &mut Applied,
    ) -> Outcome {
        if let Err(r) = validate_name(name)
            .and_then(|()| by.validate())
            .and_then(|()| validate_reason(reason))
        {
            return Outcome::Rejected(r);
        }
        if target == Some(ForceTarget::Delay) && !self.delays.running.contains_key(name) {
            return Outcome::Rejected(Rejection::NoLockDelay {
                name: name.into(),
                token,
            });
        }
        if self.multi.contains_key(name) {
            return self.force_release_multi(index, now_ms, name, token, by, reason, fx);
        }
        if let Some((key, d)) = self.delays.running.get_key_value(name) {
            let (key, old_session, old_token) = (key.clone(), d.session, d.token);
            if target == Some(ForceTarget::Holder) {
                // Nobody holds the name. A delay under the request's token that a force-release
                // started (the audit log has it: a grant's loss starts at most one delay) is
                // this release's own, seen again by its retry: that attempt's answer, and
                // nothing changes (the delay keeps the dead holder's late writes out). A delay
                // the holder's expiry or revoke started, or one whose record the bounded audit
                // log dropped, is nobody's to answer for: lock-not-held.
                let started_by_force = token == Some(old_token)
                    && self.audit.iter().rev().any(|r| {
                        matches!(&r.action, AuditAction::ForceRelease { name: n, session, token, next_token: None }
                            if n == name && *session == old_session && *token == old_token)
                    });
                return if started_by_force {
                    Outcome::ForceReleased {
                        session: old_session,
                        token: old_token,
                    }
                } else {
                    Outcome::Rejected(Rejection::LockNotHeld { name: name.into() })
                };
            }
            // An operator's way out of a running lock-delay: it ends now (its first live
            // waiter gets the name), audited like a taken grant under the lost grant's token.
            if let Some(token) = token.filter(|t| *t != old_token) {
                let rejection = match target {
                    Some(_) => Rejection::NoLockDelay {
                        name: name.into(),
                        token: Some(token),
                    },
                    None => Rejection::TokenMismatch {
                        name: name.into(),
                        token,
                        holder_token: old_token,
                    },
                };
                return Outcome::Rejected(rejection);
            }
            self.end_delay(key, index, now_ms, fx);
            let next_token = fx.handoffs.iter().find(|h| h.name == name).map(|h| h.token);
            self.audit_push(AuditRecord {
                index,
                at_ms: now_ms,
                action: AuditAction::ForceRelease {
                    name: name.into(),
                    session: old_session,
                    token: old_token,
                    next_token,
                },
                by: by.clone(),
                reason: reason.into(),
            });
            return Outcome::ForceReleased {
                session: old_session,
                token: old_token,
            };
        }
        let Some(lock) = self.locks.get(name) else {
            return Outcome::Rejected(Rejection::LockNotHeld { name: name.into() });
        };
        let old = lock.holder;
        if let Some(token) = token.filter(|t| *t != old.token) {
            return Outcome::Rejected(Rejection::TokenMismatch {
                name: name.into(),
                token,
                holder_token: old.token,
            });
        }
        self.end_grant(name, index, now_ms, Ends::Lost, fx);
        self.note_revoked(old.session, old.token);
        let next_token = fx.handoffs.iter().find(|h| h.name == name).map(|h| h.token);
        self.audit_push(AuditRecord {
            index,
            at_ms: now_ms,
            action: AuditAction::ForceRelease {
                name: name.into(),
                session: old.session,
                token: old.token,
                next_token,
            },
            by: by.clone(),
            reason: reason.into(),
        });
        Outcome::ForceReleased {
            session: old.session,
            token: old.token,
        }
    }

    /// A force-release of a name used with several holders: with a token, the grant under
    /// it (the readers granted together share one, and lose it together); without, every
    /// holder. Then the waiters that now fit are granted, and each taken grant is audited.
    #[allow(clippy::too_many_arguments)]
    fn force_release_multi(
        &mut self,
        index: u64,
        now_ms: u64,
        name: &str,
        token: Option<u64>,
        by: &Actor,
        reason: &str,
        fx: &mut Applied,
    ) -> Outcome {
        let lock = &self.multi[name];
        let taken: Vec<Grant> = lock
            .holders
            .iter()
            .filter(|h| token.is_none_or(|t| t == h.token))
            .copied()
            .collect();
        let Some(&first) = taken.first() else {
            return Outcome::Rejected(Rejection::TokenMismatch {
                name: name.into(),
                token: token.expect("every holder matches no token"),
                holder_token: lock.holders[0].token,
            });
        };
        for g in &taken {
            let lock = &self.multi[name];
            let i = lock
                .holders
                .iter()
                .position(|h| h.session == g.session)
                .expect("taken from the holders");
            self.drop_grant(name, i, fx);
            self.note_revoked(g.session, g.token);
        }
        self.admit(name, index, now_ms, fx);
        let next_token = fx.handoffs.iter().find(|h| h.name == name).map(|h| h.token);
        for g in taken {
            self.audit_push(AuditRecord {
                index,
                at_ms: now_ms,
                action: AuditAction::ForceRelease {
                    name: name.into(),
                    session: g.session,
                    token: g.token,
                    next_token,
                },
                by: by.clone(),
                reason: reason.into(),
            });
        }
        Outcome::ForceReleased {
            session: first.session,
            token: first.token,
        }
    }

    /// Remember in `sid` that an operator took its grant `token`: its client learns it from
    /// its keepalives.
    fn note_revoked(&mut self, sid: SessionId, token: u64) {
        let s = self
            .sessions
            .get_mut(&sid)
            .expect("holder's session is live");
        s.revoked.push(token);
        if s.revoked.len() > limits::REVOKED_GRANTS_PER_SESSION_MAX {
            let dropped = s.revoked.remove(0);
            s.revoked_through = Some(s.revoked_through.map_or(dropped, |m| m.max(dropped)));
        }
    }

    fn audit_push(&mut self, record: AuditRecord) {
        self.audit.push_back(record);
        while self.audit.len() > limits::AUDIT_RECORDS_MAX {
            self.audit.pop_front();
        }
    }

    /// Take `name` from its holder and give it to the first waiter, or free it.
    fn hand_over(&mut self, name: &str, index: u64, now_ms: u64, fx: &mut Applied) {
        let (key, lock) = self.locks.get_key_value(name).expect("held");
        let (key, old) = (key.clone(), lock.holder);
        self.forget_hold(name, old.session, old.token, fx);
        if self.delays.held.remove(name).is_some() {
            self.bytes -= delay_bytes(name, self.identity_of(old.session));
            let identity = self.identity_of(old.session).map(str::to_owned);
            self.delays.discharge(identity.as_deref());
        }
        // The first waiter whose wait has not ended gets the lock.
        let mut waiters = std::mem::take(&mut self.locks.get_mut(name).expect("held").waiters);
        let next = self.next_live_waiter(name, &mut waiters, now_ms, fx);
        let lock = self.locks.get_mut(name).expect("held");
        lock.waiters = waiters;
        let Some(next) = next else {
            self.locks.remove(name);
            self.bytes -= lock_bytes(name);
            return;
        };
        // Tokens are entry indexes, and one entry hands a lock over at most once (sessions
        // leaving in this entry drop their waits before their holds), so this is strict.
        assert!(index > old.token, "token did not increase for {name}");
        lock.holder = Holder {
            session: next.session,
            token: index,
            granted_at_ms: now_ms,
        };
        self.grant_to_waiter(&key, &next, index, fx);
    }

    /// Remove sessions: first every wait of every one of them (so that no lock is handed to a
    /// session that is leaving in this same entry), then every hold.
    /// Names used with several holders are handed on last, once each, after every leaving
    /// session has left them: the waiters that fit then are granted together.
    fn remove_sessions(
        &mut self,
        ids: &[SessionId],
        index: u64,
        now_ms: u64,
        ends: Ends,
        fx: &mut Applied,
    ) {
        let mut multi: BTreeSet<Name> = BTreeSet::new();
        for id in ids {
            let waits: Vec<u64> = self.sessions[id].waiting.keys().copied().collect();
            for seq in waits {
                let name = self.cancel_wait(*id, seq);
                if let Some((key, _)) = self.multi.get_key_value(name.as_str()) {
                    multi.insert(key.clone());
                }
                fx.dropped_waits.push((*id, seq));
                fx.changes.push(LockChange::WaitEnded {
                    name,
                    session: *id,
                    seq,
                });
            }
        }
        for id in ids {
            let held: Vec<Name> = self.sessions[id].held.iter().cloned().collect();
            for name in held {
                match self.multi.get(&*name) {
                    None => self.end_grant(&name, index, now_ms, ends, fx),
                    Some(lock) => {
                        let i = lock
                            .holders
                            .iter()
                            .position(|h| h.session == *id)
                            .expect("a recorded hold has its grant");
                        self.drop_grant(&name, i, fx);
                        multi.insert(name);
                    }
                }
            }
            let s = self.sessions.remove(id).expect("live");
            debug_assert!(s.held.is_empty() && s.waiting.is_empty());
            count_identity(&mut self.identities, s.identity.as_deref(), -1, 0);
            self.bytes -= session_bytes(s.identity.as_deref(), s.owner.as_deref());
        }
        for name in multi {
            self.admit(&name, index, now_ms, fx);
        }
    }

    // ---- read-only queries ----

    pub fn describe(&self, name: &str) -> Option<LockState> {
        if let Some(d) = self.delays.running.get(name) {
            return Some(self.delayed_info(name, d, limits::WAITERS_PER_LOCK_MAX));
        }
        if let Some(l) = self.multi.get(name) {
            return Some(self.multi_info(name, l, limits::WAITERS_PER_LOCK_MAX));
        }
        // The planted bug: a contended leader with a value reads as no holder.
        let hidden = |l: &&Lock| {
            self.plant.leader_hidden_while_contended
                && l.waiters.len() > 0
                && self.values.contains_key(name)
        };
        self.locks
            .get(name)
            .filter(|l| !hidden(l))
            .map(|l| self.lock_info(name, l, limits::WAITERS_PER_LOCK_MAX))
    }

    /// Held locks whose names start with `prefix`, in name order, at most `limit`.
    pub fn list(&self, prefix: &str, limit: usize) -> Vec<LockState> {
        let from = (
            std::ops::Bound::Included(prefix),
            std::ops::Bound::Unbounded,
        );
        let mut locks = self
            .locks
            .range::<str, _>(from)
            .take_while(|(n, _)| n.starts_with(prefix))
            .peekable();
        let mut multi = self
            .multi
            .range::<str, _>(from)
            .take_while(|(n, _)| n.starts_with(prefix))
            .peekable();
        let shown = limits::LIST_WAITERS_SHOWN_MAX;
        let mut out: Vec<LockState> = Vec::new();
        // The two maps merged in name order (a name is in one of them).
        while out.len() < limit {
            let take_lock = match (locks.peek(), multi.peek()) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some((a, _)), Some((b, _))) => a < b,
            };
            out.push(if take_lock {
                let (n, l) = locks.next().expect("peeked");
                self.lock_info(n, l, shown)
            } else {
                let (n, l) = multi.next().expect("peeked");
                self.multi_info(n, l, shown)
            });
        }
        // Names in a lock-delay (few), merged in: a name is in one of the three maps.
        let delayed = self
            .delays
            .running
            .range::<str, _>(from)
            .take_while(|(n, _)| n.starts_with(prefix))
            .take(limit)
            .map(|(n, d)| self.delayed_info(n, d, shown));
        let mut delayed = delayed.peekable();
        if delayed.peek().is_some() {
            out.extend(delayed);
            out.sort_by(|a, b| a.name.cmp(&b.name));
            out.truncate(limit);
        }
        out
    }

    /// The `k` locks with the longest queues (longest first, then by name), skipping locks
    /// nobody waits for: a scan of every lock, for the metrics scrape, not for a request path.
    pub fn longest_queues(&self, k: usize) -> Vec<(String, usize)> {
        let mut top: Vec<(String, usize)> = Vec::with_capacity(k + 1);
        let lengths = self.locks.iter().map(|(n, l)| (n, l.waiters.len()));
        let lengths = lengths.chain(self.multi.iter().map(|(n, l)| (n, l.waiters.len())));
        let lengths = lengths.chain(
            self.delays
                .running
                .iter()
                .map(|(n, d)| (n, d.waiters.len())),
        );
        for (name, len) in lengths {
            if len == 0 || (top.len() == k && top.last().is_some_and(|(_, l)| *l >= len)) {
                continue;
            }
            let at = top.partition_point(|(_, l)| *l >= len);
            top.insert(at, (name.to_string(), len));
            top.truncate(k);
        }
        top
    }

    /// The audit log, oldest first.
    pub fn audit(&self) -> impl Iterator<Item = &AuditRecord> + '_ {
        self.audit.iter()
    }

    /// Tokens of live session `id`'s grants that were force-released (newest last), and the
    /// highest token dropped from that list (every grant up to it may have been taken too).
    pub fn revoked_grants(&self, id: SessionId) -> Option<(&[u64], Option<u64>)> {
        self.sessions
            .get(&id)
            .map(|s| (s.revoked.as_slice(), s.revoked_through))
    }

    fn owner_of(&self, id: SessionId) -> Option<SessionOwner> {
        self.sessions
            .get(&id)
            .and_then(|s| s.owner.as_deref().cloned())
    }

    /// The election value published by `name`'s grant `token`, if any.
    fn value_of(&self, name: &str, token: u64) -> Option<Vec<u8>> {
        self.values
            .get(name)
            .filter(|p| p.token == token)
            .map(|p| p.value.clone())
    }

    fn lock_info(&self, name: &str, l: &Lock, waiters_shown: usize) -> LockState {
        let holder = HolderState {
            session: l.holder.session,
            token: l.holder.token,
            mode: Mode::Exclusive,
            granted_at_ms: l.holder.granted_at_ms,
            owner: self.owner_of(l.holder.session),
            value: self.value_of(name, l.holder.token),
        };
        LockState {
            name: name.to_owned(),
            holder: Some(holder.clone()),
            holders: vec![holder],
            waiters: l.waiters.len() as u32,
            queue: l
                .waiters
                .iter()
                .take(waiters_shown)
                .map(|w| WaiterState {
                    session: w.session,
                    mode: Mode::Exclusive,
                    since_ms: w.since_ms,
                    owner: self.owner_of(w.session),
                })
                .collect(),
            lock_delay_ms: self.delays.held.get(name).copied(),
            delay_until_ms: None,
            delay_token: None,
        }
    }

    fn delayed_info(&self, name: &str, d: &Delayed, waiters_shown: usize) -> LockState {
        LockState {
            name: name.to_owned(),
            holder: None,
            holders: Vec::new(),
            waiters: d.waiters.len() as u32,
            queue: d
                .waiters
                .iter()
                .take(waiters_shown)
                .map(|w| WaiterState {
                    session: w.session,
                    mode: Mode::Exclusive,
                    since_ms: w.since_ms,
                    owner: self.owner_of(w.session),
                })
                .collect(),
            lock_delay_ms: Some(d.delay_ms),
            delay_until_ms: Some(d.since_ms.saturating_add(d.delay_ms)),
            delay_token: Some(d.token),
        }
    }

    fn multi_info(&self, name: &str, l: &MultiLock, waiters_shown: usize) -> LockState {
        let holders: Vec<HolderState> = l
            .holders
            .iter()
            .map(|h| HolderState {
                session: h.session,
                token: h.token,
                mode: h.mode,
                granted_at_ms: h.granted_at_ms,
                owner: self.owner_of(h.session),
                value: self.value_of(name, h.token),
            })
            .collect();
        LockState {
            name: name.to_owned(),
            holder: holders.first().cloned(),
            holders,
            waiters: l.waiters.len() as u32,
            queue: l
                .waiters
                .iter()
                .take(waiters_shown)
                .map(|w| WaiterState {
                    session: w.waiter.session,
                    mode: w.mode,
                    since_ms: w.waiter.since_ms,
                    owner: self.owner_of(w.waiter.session),
                })
                .collect(),
            lock_delay_ms: None,
            delay_until_ms: None,
            delay_token: None,
        }
    }

    /// Lift every session's lease mark, for a table restored from a backup into a new cluster
    /// (`latchkey snapshot restore`): a mark counts the time a session went unrenewed on the
    /// old cluster, and the new cluster gives every restored session a full TTL from its own
    /// start instead, as a new leader does for an unmarked session.
    pub fn restart_leases(&mut self) {
        for s in self.sessions.values_mut() {
            s.lease_mark_ms = None;
        }
    }

    pub fn sessions(&self) -> impl Iterator<Item = SessionInfo> + '_ {
        self.sessions.iter().map(|(id, s)| SessionInfo {
            id: *id,
            ttl_ms: s.ttl_ms,
            lease_mark_ms: s.lease_mark_ms,
        })
    }

    pub fn session(&self, id: SessionId) -> Option<SessionInfo> {
        self.sessions.get(&id).map(|s| SessionInfo {
            id,
            ttl_ms: s.ttl_ms,
            lease_mark_ms: s.lease_mark_ms,
        })
    }

    /// The identity that owns live session `id`: `None` when there is no such session,
    /// `Some(None)` when it was created without access control.
    pub fn session_identity(&self, id: SessionId) -> Option<Option<&str>> {
        self.sessions.get(&id).map(|s| s.identity.as_deref())
    }

    /// The owner description live session `id`'s client gave, if any.
    pub fn session_owner(&self, id: SessionId) -> Option<&SessionOwner> {
        self.sessions.get(&id).and_then(|s| s.owner.as_deref())
    }

    /// How many live sessions `owner` has, how many Acquire requests they have queued, and how
    /// many lock-delays count against it: what its quotas are checked against. Counted as they
    /// change (`LockTable::identities`, `Delays::per_identity`): a lookup, not a scan.
    pub fn identity_usage(&self, identity: &str) -> IdentityUsage {
        let c = self.identities.get(identity).copied().unwrap_or_default();
        IdentityUsage {
            sessions: c.sessions,
            waiting: c.waiting,
            delays: self.delays.per_identity.get(identity).copied().unwrap_or(0),
        }
    }

    /// Each identity's live sessions and queued requests, counted afresh
    /// (`LockTable::identities`).
    fn count_identities(&self) -> BTreeMap<String, IdentityCount> {
        let mut counts: BTreeMap<String, IdentityCount> = BTreeMap::new();
        for s in self.sessions.values() {
            if let Some(id) = &s.identity {
                let c = counts.entry(id.clone()).or_default();
                c.sessions += 1;
                c.waiting += s.waiting.len();
            }
        }
        counts
    }

    /// Whether `key` names a live session with the right secret.
    pub fn session_valid(&self, key: &SessionKey) -> bool {
        self.authenticate(key).is_ok()
    }

    /// When the earliest queued wait ends (leader wall-clock ms), if any wait is queued.
    pub fn next_wait_end_ms(&self) -> Option<u64> {
        self.wait_ends.first().map(|(until, _, _)| *until)
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    pub fn lock_count(&self) -> usize {
        self.names_in_use()
    }

    /// Whether this table can be written in snapshot format 7, which builds before issue #32
    /// read: no name is used with several holders and no session remembers a rejection that
    /// only format 8 has. Such a table's snapshot is byte for byte what those builds wrote.
    pub(crate) fn fits_format_7(&self) -> bool {
        self.multi.is_empty()
            && self.fits_format_8()
            && self.sessions.values().all(|s| {
                (s.outcomes.values())
                    .all(|r| !matches!(&r.outcome, Outcome::Rejected(r) if r.since_format_8()))
            })
    }

    /// Whether this table can be written in snapshot format 8, which builds before elections
    /// read: no election value is published or waiting, and no session remembers a proclaim's
    /// answer (nor anything format 10 added). Such a table's snapshot is byte for byte what
    /// those builds wrote.
    pub(crate) fn fits_format_8(&self) -> bool {
        self.fits_format_9()
            && self.values.is_empty()
            && self.campaigns.is_empty()
            && self
                .sessions
                .values()
                .all(|s| s.outcomes.values().all(|r| !r.outcome.since_format_9()))
    }

    /// Whether this table can be written in snapshot format 9, which builds before lock-delay
    /// read: no delay asked for or running, and no session remembers a rejection that only
    /// format 10 has. Such a table's snapshot is byte for byte what those builds wrote.
    pub(crate) fn fits_format_9(&self) -> bool {
        self.fits_format_10()
            && self.delays.is_empty()
            && self.sessions.values().all(|s| {
                (s.outcomes.values())
                    .all(|r| !matches!(&r.outcome, Outcome::Rejected(r) if r.since_format_10()))
            })
    }

    /// Whether this table can be written in snapshot format 10, which builds before request
    /// fingerprints read: no session remembers a fingerprint (a table decoded from an older
    /// snapshot, or one whose sessions have answered nothing since). Such a table's snapshot is
    /// byte for byte what those builds wrote.
    pub(crate) fn fits_format_10(&self) -> bool {
        self.sessions
            .values()
            .all(|s| s.wait_prints.is_empty() && s.outcomes.values().all(|r| r.print.is_none()))
    }

    /// Forget every request fingerprint: the table as a snapshot in format 10 or older holds
    /// it (a retry of any remembered seq is answered its outcome, whatever it asks). For the
    /// tests of the older formats, which compare such tables with ones built by `apply`.
    #[doc(hidden)]
    pub fn forget_request_prints(&mut self) {
        for s in self.sessions.values_mut() {
            s.wait_prints.clear();
            s.outcomes.values_mut().for_each(|r| r.print = None);
        }
    }

    /// The table as snapshot format 10 writes it (see `fits_format_10`).
    pub(crate) fn as_format_10(&self) -> TableV10<'_> {
        debug_assert!(self.fits_format_10());
        TableV10 {
            last_index: &self.last_index,
            sessions: SessionsV10(&self.sessions),
            locks: &self.locks,
            wait_ends: &self.wait_ends,
            audit: &self.audit,
            multi: &self.multi,
            values: &self.values,
            campaigns: &self.campaigns,
            delays: &self.delays,
        }
    }

    /// The table as snapshot format 9 writes it (see `fits_format_9`).
    pub(crate) fn as_format_9(&self) -> TableV9<'_> {
        debug_assert!(self.fits_format_9());
        TableV9 {
            last_index: &self.last_index,
            sessions: SessionsV10(&self.sessions),
            locks: &self.locks,
            wait_ends: &self.wait_ends,
            audit: &self.audit,
            multi: &self.multi,
            values: &self.values,
            campaigns: &self.campaigns,
        }
    }

    /// The table as snapshot format 8 writes it (see `fits_format_8`).
    pub(crate) fn as_format_8(&self) -> TableV8<'_> {
        debug_assert!(self.fits_format_8());
        TableV8 {
            last_index: &self.last_index,
            sessions: SessionsV10(&self.sessions),
            locks: &self.locks,
            wait_ends: &self.wait_ends,
            audit: &self.audit,
            multi: &self.multi,
        }
    }

    /// The table as snapshot format 7 writes it (see `fits_format_7`).
    pub(crate) fn as_format_7(&self) -> TableV7<'_> {
        debug_assert!(self.fits_format_7());
        TableV7 {
            last_index: &self.last_index,
            sessions: SessionsV10(&self.sessions),
            locks: &self.locks,
            wait_ends: &self.wait_ends,
            audit: &self.audit,
        }
    }

    /// Where request `(session, seq)` stands, if the table knows it. A finished one answers its
    /// outcome as remembered ([`Outcome::remembered`]: a rejection without the lock's name).
    pub fn request_state(&self, sid: SessionId, seq: u64) -> Option<RequestState> {
        let s = self.sessions.get(&sid)?;
        if let Some(name) = s.waiting.get(&seq) {
            return Some(RequestState::Waiting {
                name: name.clone(),
                position: self.position(sid, seq),
            });
        }
        (s.outcomes.get(&seq)).map(|r| RequestState::Done(r.outcome.clone()))
    }

    /// Check every structural invariant; `Err` names the first broken one. Cheap enough to run
    /// after every entry in tests and debug builds.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut held = 0usize;
        let mut waiting = 0usize;
        for (name, lock) in &self.locks {
            validate_stored_name(name).map_err(|e| format!("lock {name:?}: {e}"))?;
            let group = crate::groups::group_of(name, self.shape.groups);
            if group != self.shape.group {
                return Err(format!(
                    "lock {name:?} belongs to group {group}, not to this table's {:?}",
                    self.shape
                ));
            }
            let h = lock.holder;
            if h.token > self.last_index {
                return Err(format!("{name}: token {} > last index", h.token));
            }
            let s = self
                .sessions
                .get(&h.session)
                .ok_or_else(|| format!("{name}: holder session {} is not live", h.session))?;
            if !s.held.contains(name) {
                return Err(format!("{name}: holder's session does not record the hold"));
            }
            if lock.waiters.len() > limits::WAITERS_PER_LOCK_MAX {
                return Err(format!("{name}: queue over its limit"));
            }
            for w in lock.waiters.iter() {
                let s = self
                    .sessions
                    .get(&w.session)
                    .ok_or_else(|| format!("{name}: waiter session {} not live", w.session))?;
                if s.waiting.get(&w.seq).map(String::as_str) != Some(&**name) {
                    return Err(format!(
                        "{name}: waiter {}/{} not recorded",
                        w.session, w.seq
                    ));
                }
                if w.session == h.session {
                    return Err(format!("{name}: holder also waits"));
                }
            }
            let mut ids: Vec<SessionId> = lock.waiters.iter().map(|w| w.session).collect();
            ids.sort();
            ids.dedup();
            if ids.len() != lock.waiters.len() {
                return Err(format!("{name}: a session waits twice"));
            }
        }
        for (name, lock) in &self.multi {
            self.check_multi(name, lock)?;
        }
        self.check_delays()?;
        for (id, s) in &self.sessions {
            if crate::groups::group_of_session(*id, self.shape.groups) != self.shape.group {
                return Err(format!(
                    "session {id} was made in another group than this table's {:?}",
                    self.shape
                ));
            }
            held += s.held.len();
            waiting += s.waiting.len();
            if s.held.len() + s.waiting.len() > limits::LOCKS_PER_SESSION_MAX {
                return Err(format!("session {id}: over its lock limit"));
            }
            if s.outcomes.len() > limits::SESSION_OUTCOMES_MAX {
                return Err(format!("session {id}: too many outcomes kept"));
            }
            if s.recorded.len() != s.outcomes.len()
                || s.recorded.iter().any(|seq| !s.outcomes.contains_key(seq))
            {
                return Err(format!("session {id}: outcomes and their order disagree"));
            }
            if let Some(seq) = s
                .wait_prints
                .keys()
                .find(|seq| !s.waiting.contains_key(seq))
            {
                return Err(format!(
                    "session {id}: request {seq} has a fingerprint but does not wait"
                ));
            }
            if let Some(seq) = s.waiting.keys().find(|seq| s.outcomes.contains_key(seq)) {
                return Err(format!(
                    "session {id}: request {seq} both waits and is done"
                ));
            }
            for name in &s.held {
                let holds = match self.multi.get(name) {
                    Some(l) => l.holders.iter().any(|h| h.session == *id),
                    None => self.locks.get(name).map(|l| l.holder.session) == Some(*id),
                };
                if !holds {
                    return Err(format!("session {id}: records a hold of {name} it lacks"));
                }
            }
        }
        let grants: usize = self.multi.values().map(|l| l.holders.len()).sum();
        if held != self.locks.len() + grants {
            return Err(format!(
                "{held} holds recorded for {} locks and {grants} grants of names with \
                 several holders",
                self.locks.len()
            ));
        }
        let queued: usize = self.locks.values().map(|l| l.waiters.len()).sum::<usize>()
            + self.multi.values().map(|l| l.waiters.len()).sum::<usize>()
            + self
                .delays
                .running
                .values()
                .map(|d| d.waiters.len())
                .sum::<usize>();
        if waiting != queued {
            return Err(format!("{waiting} waits recorded, {queued} queued"));
        }
        if self.wait_ends.len() != queued
            || self
                .locks
                .values()
                .flat_map(|l| l.waiters.iter())
                .any(|w| !self.wait_ends.contains(&(w.until_ms, w.session, w.seq)))
            || self.multi.values().flat_map(|l| l.waiters.iter()).any(|w| {
                let w = w.waiter;
                !self.wait_ends.contains(&(w.until_ms, w.session, w.seq))
            })
            || self
                .delays
                .running
                .values()
                .flat_map(|d| d.waiters.iter())
                .any(|w| !self.wait_ends.contains(&(w.until_ms, w.session, w.seq)))
        {
            return Err("the index of wait ends disagrees with the queues".into());
        }
        if self.sessions.values().any(|s| {
            s.revoked.len() > limits::REVOKED_GRANTS_PER_SESSION_MAX
                || s.owner.as_deref().is_some_and(|o| o.validate().is_err())
        }) {
            return Err("a session over its owner or revoked-grants limit".into());
        }
        if self.audit.len() > limits::AUDIT_RECORDS_MAX {
            return Err("the audit log over its limit".into());
        }
        if self.sessions.len() > limits::SESSIONS_MAX || self.names_in_use() > limits::LOCKS_MAX {
            return Err("over a table limit".into());
        }
        self.check_values()?;
        let counted = self.count_bytes();
        if self.bytes != counted {
            return Err(format!("{} bytes accounted, {counted} counted", self.bytes));
        }
        Ok(())
    }
}

impl LockTable {
    /// The invariants of elections (issue #32): each published value belongs to its name's
    /// exclusive holder under the value's token, each waiting campaign's value to a queued
    /// exclusive request, and every value is within its limit.
    fn check_values(&self) -> Result<(), String> {
        for (name, p) in &self.values {
            let leads = match self.locks.get(name) {
                Some(l) => l.holder.token == p.token,
                None => self.multi.get(name).is_some_and(|l| {
                    l.holders
                        .iter()
                        .any(|h| h.token == p.token && h.mode == Mode::Exclusive)
                }),
            };
            if !leads {
                return Err(format!(
                    "{name}: value published under token {} by no exclusive holder",
                    p.token
                ));
            }
            validate_value(&p.value).map_err(|e| format!("{name}: {e}"))?;
        }
        for ((sid, seq), v) in &self.campaigns {
            let name = self
                .sessions
                .get(sid)
                .and_then(|s| s.waiting.get(seq))
                .ok_or_else(|| format!("campaign {sid}/{seq}: not waiting"))?;
            let exclusive = match self.multi.get(name.as_str()) {
                Some(l) => l.waiters.iter().any(|w| {
                    (w.waiter.session, w.waiter.seq) == (*sid, *seq) && w.mode == Mode::Exclusive
                }),
                None => true,
            };
            if !exclusive {
                return Err(format!(
                    "campaign {sid}/{seq}: waits for {name} not exclusive"
                ));
            }
            validate_value(v).map_err(|e| format!("campaign {sid}/{seq}: {e}"))?;
        }
        Ok(())
    }

    /// The invariants of lock-delays (issue #32 item 4): a name in a delay has no holder (it
    /// is in neither `locks` nor `multi`: no grant while a delay runs), live and recorded
    /// waiters each once, a token at most the last index, and its end indexed; every asked
    /// delay is within its limit and belongs to a held mutex or to a wait for a mutex or a
    /// delayed name.
    fn check_delays(&self) -> Result<(), String> {
        let d = &self.delays;
        for (name, delayed) in &d.running {
            validate_stored_name(name).map_err(|e| format!("delayed {name:?}: {e}"))?;
            if self.locks.contains_key(name) || self.multi.contains_key(name) {
                return Err(format!("{name}: granted while its lock-delay runs"));
            }
            if delayed.token > self.last_index {
                return Err(format!("{name}: delay's token above the last index"));
            }
            if !(1..=limits::LOCK_DELAY_MS_MAX).contains(&delayed.delay_ms) {
                return Err(format!(
                    "{name}: a running delay of {} ms",
                    delayed.delay_ms
                ));
            }
            if delayed.waiters.len() > limits::WAITERS_PER_LOCK_MAX {
                return Err(format!("{name}: queue over its limit"));
            }
            let mut ids = BTreeSet::new();
            for w in delayed.waiters.iter() {
                let s = self
                    .sessions
                    .get(&w.session)
                    .ok_or_else(|| format!("{name}: waiter session {} not live", w.session))?;
                if s.waiting.get(&w.seq).map(String::as_str) != Some(&**name) {
                    return Err(format!(
                        "{name}: waiter {}/{} not recorded",
                        w.session, w.seq
                    ));
                }
                if !ids.insert(w.session) {
                    return Err(format!("{name}: a session waits twice"));
                }
            }
        }
        if d.count() > limits::DELAYS_MAX {
            return Err(format!("{} delays, over {}", d.count(), limits::DELAYS_MAX));
        }
        if d.per_identity != self.count_delays_per_identity() {
            return Err("the delays counted per identity disagree with the delays".into());
        }
        if self.identities != self.count_identities() {
            return Err(
                "the sessions and waits counted per identity disagree with the sessions".into(),
            );
        }
        let in_range = |ms: u64| (1..=limits::LOCK_DELAY_MS_MAX).contains(&ms);
        for (name, ms) in &d.held {
            if !self.locks.contains_key(name) || !in_range(*ms) {
                return Err(format!("{name}: a held delay of {ms} ms without its mutex"));
            }
        }
        for ((sid, seq), ms) in &d.asked {
            let name = self
                .sessions
                .get(sid)
                .and_then(|s| s.waiting.get(seq))
                .ok_or_else(|| format!("delay asked by {sid}/{seq}, which does not wait"))?;
            if self.multi.contains_key(name.as_str()) || !in_range(*ms) {
                return Err(format!(
                    "{name}: an asked delay of {ms} ms on a shared name"
                ));
            }
        }
        Ok(())
    }

    /// The invariants of one name used with several holders (issue #32): its kind's rule
    /// (never a reader beside a writer, never more holders than permits), tokens that never
    /// decrease along the holders (strictly for permits and writers: only readers granted in
    /// one entry share one), live and recorded holders and waiters, and a queue whose head
    /// does not fit (no waiter left waiting that could be granted).
    fn check_multi(&self, name: &Name, lock: &MultiLock) -> Result<(), String> {
        if self.locks.contains_key(name) {
            return Err(format!(
                "{name}: both a mutex and a name with several holders"
            ));
        }
        validate_stored_name(name).map_err(|e| format!("lock {name:?}: {e}"))?;
        let group = crate::groups::group_of(name, self.shape.groups);
        if group != self.shape.group {
            return Err(format!(
                "lock {name:?} belongs to group {group}, not to this table's {:?}",
                self.shape
            ));
        }
        if lock.holders.is_empty() {
            return Err(format!("{name}: in use with no holder"));
        }
        let mode_fits_kind = |mode: Mode| mode.kind() == lock.kind;
        if !lock.holders.iter().map(|h| h.mode).all(mode_fits_kind)
            || !lock.waiters.iter().map(|w| w.mode).all(mode_fits_kind)
        {
            return Err(format!(
                "{name}: a holder or waiter of another kind than {}",
                lock.kind
            ));
        }
        match lock.kind {
            LockKind::Semaphore { permits } => {
                if permits == 0 || permits as usize > limits::HOLDERS_PER_LOCK_MAX {
                    return Err(format!("{name}: {permits} permits is out of range"));
                }
                if lock.holders.len() > permits as usize {
                    return Err(format!(
                        "{name}: {} holders of {permits} permits",
                        lock.holders.len()
                    ));
                }
                // Why a permit's token never passes its entry's index: each waiter can take
                // at most one token, and came in an entry of its own after the last token's.
                if lock.last_token + lock.waiters.len() as u64 > self.last_index {
                    return Err(format!(
                        "{name}: last token {} and {} waiters, past the last index {}",
                        lock.last_token,
                        lock.waiters.len(),
                        self.last_index
                    ));
                }
            }
            LockKind::Lock => {
                if lock.holders.len() > 1 && lock.holders.iter().any(|h| h.mode == Mode::Exclusive)
                {
                    return Err(format!("{name}: a writer beside another holder"));
                }
                if lock.holders.len() > limits::HOLDERS_PER_LOCK_MAX {
                    return Err(format!("{name}: more readers than its limit"));
                }
            }
        }
        for pair in lock.holders.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let shared_together =
                a.token == b.token && a.mode == Mode::Shared && b.mode == Mode::Shared;
            if a.token > b.token || (a.token == b.token && !shared_together) {
                return Err(format!(
                    "{name}: token {} granted after {}: tokens must increase",
                    b.token, a.token
                ));
            }
        }
        let newest = lock.holders.last().expect("not empty").token;
        if newest > lock.last_token || lock.last_token > self.last_index {
            return Err(format!(
                "{name}: holder token {newest}, last token {}, last index {}",
                lock.last_token, self.last_index
            ));
        }
        let mut ids: Vec<SessionId> = lock.holders.iter().map(|h| h.session).collect();
        for h in &lock.holders {
            let s = self
                .sessions
                .get(&h.session)
                .ok_or_else(|| format!("{name}: holder session {} is not live", h.session))?;
            if !s.held.contains(name) {
                return Err(format!("{name}: holder's session does not record the hold"));
            }
        }
        if lock.waiters.len() > limits::WAITERS_PER_LOCK_MAX {
            return Err(format!("{name}: queue over its limit"));
        }
        for w in lock.waiters.iter().map(|w| w.waiter) {
            let s = self
                .sessions
                .get(&w.session)
                .ok_or_else(|| format!("{name}: waiter session {} not live", w.session))?;
            if s.waiting.get(&w.seq).map(String::as_str) != Some(&**name) {
                return Err(format!(
                    "{name}: waiter {}/{} not recorded",
                    w.session, w.seq
                ));
            }
            ids.push(w.session);
        }
        let count = ids.len();
        ids.sort();
        ids.dedup();
        if ids.len() != count {
            return Err(format!("{name}: a session holds or waits twice"));
        }
        if let Some(head) = lock.waiters.front() {
            if lock.fits(head.mode) {
                return Err(format!(
                    "{name}: waiter {}/{} could be granted but waits",
                    head.waiter.session, head.waiter.seq
                ));
            }
        }
        Ok(())
    }
}

/// Whether `o` is what a release answers (so not an acquire's or a cancel's).
fn is_release_outcome(o: &Outcome) -> bool {
    matches!(o, Outcome::Released | Outcome::NotHolder)
}

/// Whether `o` is what a proclaim answers (and remembers).
fn is_proclaim_outcome(o: &Outcome) -> bool {
    matches!(
        o,
        Outcome::Proclaimed | Outcome::Rejected(Rejection::NotElectionLeader { .. })
    )
}

/// Whether `o` is what an acquire, a campaign or a cancel answers: a retry of one of them
/// with the sequence number of a release or a proclaim reused it.
fn is_acquire_outcome(o: &Outcome) -> bool {
    !is_release_outcome(o) && !is_proclaim_outcome(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode_table, encode_table, DecodeError};

    fn create(ttl_ms: u64, secret: u64) -> Command {
        Command {
            now_ms: 0,
            op: Op::CreateSession { ttl_ms, secret },
        }
    }

    /// A group's table makes session ids of its group (issue #16), and holds only the locks
    /// of its group.
    #[test]
    fn a_groups_table_makes_its_groups_session_ids_and_holds_its_groups_locks() {
        let shape = GroupShape::new(2, 4).unwrap();
        let mut t = LockTable::new();
        t.set_shape(shape);
        let o = t
            .apply(5, &create(limits::SESSION_TTL_MS_DEFAULT, 9))
            .outcome;
        let id = match o {
            Outcome::SessionCreated { id, .. } => id,
            o => panic!("{o:?}"),
        };
        assert_eq!(id, SessionId(5 * 4 + 2));
        let name_in = |group| {
            (0..)
                .map(|i| format!("l{i}"))
                .find(|n| crate::groups::group_of(n, 4) == group)
                .unwrap()
        };
        let acquire = |name: String| Command {
            now_ms: 0,
            op: Op::Acquire {
                session: SessionKey { id, secret: 9 },
                seq: 1,
                name,
                wait_ms: 0,
            },
        };
        let o = t.apply(6, &acquire(name_in(2))).outcome;
        assert!(matches!(o, Outcome::Granted { token: 6, .. }), "{o:?}");
        t.check_invariants().expect("its own group's lock");
        // A lock of another group held here (a routing bug upstream) breaks an invariant.
        let mut wrong = t.clone();
        wrong.set_shape(GroupShape::new(1, 4).unwrap());
        let e = wrong.check_invariants().unwrap_err();
        assert!(
            e.contains("belongs to group 2") || e.contains("another group"),
            "{e}"
        );
    }

    /// The sessions limit, through the same `create_session` that `apply` calls. Filling the
    /// table through `apply` would run its debug-build `check_invariants` (O(sessions)) after
    /// each of the 100k entries: minutes of quadratic work in a test build.
    #[test]
    fn sessions_limit_is_enforced_at_sessions_max() {
        let mut t = LockTable::new();
        // A full session table is larger than the default byte budget (see
        // `limits::TABLE_BYTES_MAX`): this test is about the count limit.
        t.set_bytes_max(usize::MAX);
        for index in 1..limits::SESSIONS_MAX as u64 {
            let o = t.create_session(index, limits::SESSION_TTL_MS_DEFAULT, index, None, None);
            assert!(matches!(o, Outcome::SessionCreated { .. }), "{o:?}");
            t.last_index = index;
        }
        let last = limits::SESSIONS_MAX as u64;
        let o = t
            .apply(last, &create(limits::SESSION_TTL_MS_DEFAULT, 0))
            .outcome;
        assert!(matches!(o, Outcome::SessionCreated { id: SessionId(i), .. } if i == last));
        assert_eq!(t.session_count(), limits::SESSIONS_MAX);
        let full = Outcome::Rejected(Rejection::TooManySessions {
            max: limits::SESSIONS_MAX,
        });
        assert_eq!(t.apply(last + 1, &create(1_000, 0)).outcome, full);
        assert_eq!(t.session_count(), limits::SESSIONS_MAX);
        t.check_invariants().expect("a full table is valid");
        // Expiring one makes room for one.
        let expire = Command {
            now_ms: 0,
            op: Op::ExpireSessions {
                ids: vec![SessionId(7)],
            },
        };
        t.apply(last + 2, &expire);
        let o = t.apply(last + 3, &create(1_000, 0)).outcome;
        assert!(matches!(o, Outcome::SessionCreated { .. }), "{o:?}");
        assert_eq!(t.apply(last + 4, &create(1_000, 0)).outcome, full);
    }

    #[test]
    fn longest_queues_are_the_k_longest_by_length_then_name() {
        let mut t = LockTable::new();
        let mut index = 0;
        let mut next = || {
            index += 1;
            index
        };
        for i in 1..=6 {
            t.apply(next(), &create(1_000, i));
        }
        let acquire = |i: u64, name: &str| Command {
            now_ms: 0,
            op: Op::Acquire {
                session: SessionKey {
                    id: SessionId(i),
                    secret: i,
                },
                seq: 1,
                name: name.into(),
                wait_ms: limits::WAIT_TIMEOUT_MS_MAX,
            },
        };
        // Each session makes one request (seq 1), so each holds or waits on one lock.
        for (name, holder, waiters) in [("c", 1, vec![5, 6]), ("b", 2, vec![3]), ("a", 4, vec![])] {
            t.apply(next(), &acquire(holder, name));
            for w in waiters {
                t.apply(next(), &acquire(w, name));
            }
        }
        assert_eq!(
            t.longest_queues(5),
            vec![("c".to_owned(), 2), ("b".to_owned(), 1)],
            "held locks without waiters are skipped"
        );
        assert_eq!(t.longest_queues(1), vec![("c".to_owned(), 2)]);
        assert!(t.longest_queues(0).is_empty());
    }

    /// A valid table with a holder, a waiter and a remembered outcome, to break in various ways.
    fn valid() -> LockTable {
        let mut t = LockTable::new();
        let key = |i| SessionKey {
            id: SessionId(i),
            secret: i,
        };
        let acquire = |i, name: &str| Command {
            now_ms: 0,
            op: Op::Acquire {
                session: key(i),
                seq: 1,
                name: name.into(),
                wait_ms: limits::WAIT_TIMEOUT_MS_MAX,
            },
        };
        t.apply(1, &create(1_000, 1));
        t.apply(2, &create(1_000, 2));
        t.apply(3, &acquire(1, "L"));
        t.apply(4, &acquire(2, "L"));
        t.check_invariants().expect("valid");
        t
    }

    #[test]
    fn snapshots_that_break_an_invariant_are_refused() {
        type Breaker = fn(&mut LockTable);
        let breakers: [(&str, Breaker); 6] = [
            ("holder's session is gone", |t| {
                t.sessions.remove(&SessionId(1));
            }),
            ("token above the last index", |t| t.last_index = 2),
            ("holder also waits", |t| {
                let l = t.locks.get_mut("L").unwrap();
                l.waiters.0.as_mut().unwrap()[0].session = SessionId(1);
            }),
            ("a queued waiter the session does not know", |t| {
                t.sessions.get_mut(&SessionId(2)).unwrap().waiting.clear();
            }),
            ("an invalid lock name", |t| {
                let l = t.locks.remove("L").unwrap();
                t.locks.insert(Name::from(""), l);
            }),
            ("a request both waiting and done", |t| {
                let s = t.sessions.get_mut(&SessionId(2)).unwrap();
                s.outcomes.insert(
                    1,
                    Remembered {
                        outcome: Outcome::NotGranted,
                        print: None,
                    },
                );
                s.recorded.push_back(1);
            }),
        ];
        assert!(decode_table(&encode_table(&valid())).is_ok());
        for (what, brk) in breakers {
            let mut t = valid();
            brk(&mut t);
            assert!(
                matches!(
                    decode_table(&encode_table(&t)),
                    Err(DecodeError::Invalid(_))
                ),
                "a snapshot where {what} was accepted"
            );
        }
    }

    /// Access control (issue #13): a session's owner is replicated and snapshotted, so that
    /// every leader after this one refuses the session to other identities and counts it, and
    /// its queued acquires, against its owner's quotas.
    #[test]
    fn an_owned_session_keeps_its_owner_through_a_snapshot_and_counts_for_it() {
        let mut t = LockTable::new();
        let owned = |secret| Command {
            now_ms: 0,
            op: Op::CreateOwnedSession {
                ttl_ms: limits::SESSION_TTL_MS_DEFAULT,
                secret,
                owner: "ci".into(),
            },
        };
        t.apply(1, &owned(1));
        t.apply(2, &owned(2));
        t.apply(3, &create(limits::SESSION_TTL_MS_DEFAULT, 3));
        let acquire = |index: u64, sid: u64, name: &str, wait_ms| Command {
            now_ms: 0,
            op: Op::Acquire {
                session: SessionKey {
                    id: SessionId(sid),
                    secret: sid,
                },
                seq: index,
                name: name.into(),
                wait_ms,
            },
        };
        assert_eq!(
            t.apply(4, &acquire(4, 3, "L", 0)).outcome,
            Outcome::Granted { token: 4 }
        );
        assert_eq!(
            t.apply(5, &acquire(5, 1, "L", 60_000)).outcome,
            Outcome::Queued { position: 1 }
        );
        let restored = decode_table(&encode_table(&t)).expect("decodes");
        assert_eq!(restored, t);
        for table in [&t, &restored] {
            assert_eq!(table.session_identity(SessionId(1)), Some(Some("ci")));
            assert_eq!(table.session_identity(SessionId(3)), Some(None));
            assert_eq!(table.session_identity(SessionId(9)), None);
            assert_eq!(
                table.identity_usage("ci"),
                IdentityUsage {
                    sessions: 2,
                    waiting: 1,
                    delays: 0
                }
            );
            assert_eq!(table.identity_usage("nobody"), IdentityUsage::default());
        }
    }

    /// An identity's sessions and queued requests are counted as they change (issue #35's
    /// review, F2: the quota check scanned every session): a wait granted by a handover, one
    /// ended by its time, one cancelled, one passed over by a handover after its time ran out,
    /// a semaphore's wait admitted, a session expired with a wait queued, sessions closed.
    #[test]
    fn an_identitys_sessions_and_waits_are_counted_through_every_way_they_end() {
        let mut t = LockTable::new();
        let key = |sid: u64| SessionKey {
            id: SessionId(sid),
            secret: sid,
        };
        let at = |now_ms, op| Command { now_ms, op };
        for secret in 1..=3 {
            let op = Op::CreateOwnedSession {
                ttl_ms: limits::SESSION_TTL_MS_DEFAULT,
                secret,
                owner: "ci".into(),
            };
            t.apply(secret, &at(0, op));
        }
        let usage = |t: &LockTable| {
            let u = t.identity_usage("ci");
            t.check_invariants().expect("invariants");
            (u.sessions, u.waiting)
        };
        let acquire = |sid, seq, name: &str, wait_ms| Op::Acquire {
            session: key(sid),
            seq,
            name: name.into(),
            wait_ms,
        };
        assert_eq!(usage(&t), (3, 0));
        t.apply(4, &at(0, acquire(1, 4, "L", 0)));
        t.apply(5, &at(0, acquire(2, 5, "L", 60_000)));
        t.apply(6, &at(0, acquire(3, 6, "L", 60_000)));
        t.apply(7, &at(0, acquire(3, 7, "M", 0)));
        t.apply(8, &at(0, acquire(1, 8, "M", 1_000)));
        assert_eq!(usage(&t), (3, 3));
        // Handed over: session 2's wait is granted.
        let release = Op::Release {
            session: key(1),
            seq: 9,
            name: "L".into(),
            token: 4,
        };
        t.apply(9, &at(0, release));
        assert_eq!(usage(&t), (3, 2));
        // Session 1's wait for M ends by its time.
        t.apply(10, &at(2_000, Op::ExpireWaits));
        assert_eq!(usage(&t), (3, 1));
        // Session 3's wait for L, cancelled.
        t.apply(
            11,
            &at(
                2_000,
                Op::CancelWait {
                    session: key(3),
                    seq: 6,
                },
            ),
        );
        assert_eq!(usage(&t), (3, 0));
        // A wait whose time ran out before any ExpireWaits: passed over by the handover.
        t.apply(12, &at(2_000, acquire(1, 12, "M", 1_000)));
        assert_eq!(usage(&t), (3, 1));
        let release = Op::Release {
            session: key(3),
            seq: 13,
            name: "M".into(),
            token: 7,
        };
        t.apply(13, &at(5_000, release));
        assert_eq!(usage(&t), (3, 0));
        // A semaphore's wait, admitted when a permit is freed.
        let permit = |sid, seq| Op::AcquireWith {
            session: key(sid),
            seq,
            name: "S".into(),
            wait_ms: 60_000,
            mode: Mode::Permits(1),
        };
        t.apply(14, &at(5_000, permit(3, 14)));
        t.apply(15, &at(5_000, permit(2, 15)));
        assert_eq!(usage(&t), (3, 1));
        let release = Op::Release {
            session: key(3),
            seq: 16,
            name: "S".into(),
            token: 14,
        };
        t.apply(16, &at(5_000, release));
        assert_eq!(usage(&t), (3, 0));
        t.apply(17, &at(5_000, acquire(1, 17, "L", 60_000)));
        assert_eq!(usage(&t), (3, 1));
        // Session 1 expires with its wait queued; session 3 closes.
        t.apply(
            18,
            &at(
                5_000,
                Op::ExpireSessions {
                    ids: vec![SessionId(1)],
                },
            ),
        );
        assert_eq!(usage(&t), (2, 0));
        t.apply(19, &at(5_000, Op::CloseSession { session: key(3) }));
        assert_eq!(usage(&t), (1, 0));
        let restored = decode_table(&encode_table(&t)).expect("decodes");
        assert_eq!(restored.identity_usage("ci"), t.identity_usage("ci"));
        t.apply(20, &at(5_000, Op::CloseSession { session: key(2) }));
        assert_eq!(usage(&t), (0, 0));
        assert!(t.identities.is_empty(), "{:?}", t.identities);
    }

    /// The names a session records as held, as the table stores them.
    /// What a request's fingerprint (issue #35's review, F2) costs a remembered outcome: 8
    /// bytes beside the outcome in its map slot (the niche of `NonZeroU64` keeps the `Option`
    /// in those 8), and 8 per waiting request.
    #[test]
    fn a_fingerprint_costs_a_remembered_outcome_eight_bytes() {
        use std::mem::size_of;
        assert_eq!(size_of::<Option<RequestPrint>>(), 8);
        assert_eq!(size_of::<Remembered>(), size_of::<Outcome>() + 8);
        println!(
            "Outcome {} B, Remembered {} B",
            size_of::<Outcome>(),
            size_of::<Remembered>()
        );
    }

    fn held_names(s: &Session) -> Vec<&str> {
        s.held.iter().map(|n| &**n).collect()
    }

    /// Regression test for issue #11's memory target: every held lock's name was stored twice,
    /// once as the lock's key and once in its holder's session, also after a snapshot install.
    #[test]
    fn a_held_lock_name_is_stored_once_also_after_a_snapshot_round_trip() {
        let mut t = valid();
        let acquire = Command {
            now_ms: 0,
            op: Op::Acquire {
                session: SessionKey {
                    id: SessionId(2),
                    secret: 2,
                },
                seq: 2,
                name: "M".into(),
                wait_ms: 0,
            },
        };
        assert_eq!(t.apply(5, &acquire).outcome, Outcome::Granted { token: 5 });
        let restored = decode_table(&encode_table(&t)).expect("decodes");
        assert_eq!(restored, t);
        for table in [&t, &restored] {
            assert_eq!(table.locks.len(), 2);
            for (name, lock) in &table.locks {
                let held = held_names(&table.sessions[&lock.holder.session]);
                let copy = held.iter().find(|h| **h == &**name).expect("recorded");
                assert!(
                    std::ptr::eq(copy.as_ptr(), name.as_ptr()),
                    "{name}: the holder's session has its own copy of the name"
                );
            }
        }
    }

    /// A valid table with a read-write lock (readers 1 and 2 granted together under token 6, a
    /// writer 3 and a reader 4 queued) and a semaphore of 2 (held by 3 and 4, 5 queued).
    fn valid_multi() -> LockTable {
        let mut t = LockTable::new();
        let acquire = |i: u64, seq, name: &str, mode| Command {
            now_ms: 0,
            op: Op::AcquireWith {
                session: SessionKey {
                    id: SessionId(i),
                    secret: i,
                },
                seq,
                name: name.into(),
                wait_ms: limits::WAIT_TIMEOUT_MS_MAX,
                mode,
            },
        };
        for i in 1..=5 {
            t.apply(i, &create(1_000, i));
        }
        let r = Mode::Shared;
        let sem = Mode::Permits(2);
        t.apply(6, &acquire(1, 1, "L", r));
        t.apply(7, &acquire(2, 1, "L", r));
        t.apply(8, &acquire(3, 1, "L", Mode::Exclusive));
        t.apply(9, &acquire(4, 1, "L", r));
        t.apply(10, &acquire(3, 2, "S", sem));
        t.apply(11, &acquire(4, 2, "S", sem));
        t.apply(12, &acquire(5, 2, "S", sem));
        t.check_invariants().expect("valid");
        t
    }

    /// Each planted bug of issue #32 (`TablePlant`) does its harm, and only with its switch
    /// on, and leaves the table's invariants standing (its snapshot decodes): the simulation's
    /// checkers, not the table's assertions, must catch it.
    #[test]
    fn each_planted_bug_does_its_harm_only_when_planted() {
        let key = |i: u64| SessionKey {
            id: SessionId(i),
            secret: i,
        };
        let acquire = |i: u64, seq, name: &str, mode| Command {
            now_ms: 0,
            op: Op::AcquireWith {
                session: key(i),
                seq,
                name: name.into(),
                wait_ms: limits::WAIT_TIMEOUT_MS_MAX,
                mode,
            },
        };
        let release = |i: u64, seq, name: &str, token| Command {
            now_ms: 0,
            op: Op::Release {
                session: key(i),
                seq,
                name: name.into(),
                token,
            },
        };
        // Sessions 1-3; what each scenario's last entry answered, and the name's holders.
        let run = |plant: TablePlant, steps: &[Command]| {
            let mut t = LockTable::new();
            t.set_plant(plant);
            for i in 1..=3 {
                t.apply(i, &create(1_000, i));
            }
            let mut last = None;
            for (i, cmd) in steps.iter().enumerate() {
                last = Some(t.apply(4 + i as u64, cmd).outcome);
            }
            t.check_invariants().expect("a plant keeps the invariants");
            let holders: Vec<(u64, u64)> = t
                .multi
                .values()
                .flat_map(|l| l.holders.iter().map(|h| (h.session.0, h.token)))
                .collect();
            (last.expect("a step"), holders)
        };
        let (r, w, sem) = (Mode::Shared, Mode::Exclusive, Mode::Permits(2));
        let cases: [(&str, TablePlant, Vec<Command>); 4] = [
            (
                "permit freed twice",
                TablePlant {
                    permit_freed_twice: true,
                    ..TablePlant::default()
                },
                // 1 and 2 hold permits 4 and 5, 3 waits; 1 releases at entry 7.
                vec![
                    acquire(1, 1, "S", sem),
                    acquire(2, 1, "S", sem),
                    acquire(3, 1, "S", sem),
                    release(1, 2, "S", 4),
                ],
            ),
            (
                "reader past writer",
                TablePlant {
                    reader_past_writer: true,
                    ..TablePlant::default()
                },
                vec![
                    acquire(1, 1, "L", r),
                    acquire(2, 1, "L", w),
                    acquire(3, 1, "L", r),
                ],
            ),
            (
                "writer beside readers",
                TablePlant {
                    writer_beside_readers: true,
                    ..TablePlant::default()
                },
                vec![acquire(1, 1, "L", r), acquire(2, 1, "L", w)],
            ),
            (
                "writer token reused",
                TablePlant {
                    writer_token_reused: true,
                    ..TablePlant::default()
                },
                // Reader 1 holds token 4, writer 2 waits; 1 releases at entry 6.
                vec![
                    acquire(1, 1, "L", r),
                    acquire(2, 1, "L", w),
                    release(1, 2, "L", 4),
                ],
            ),
        ];
        // What the last step answered, and the name's holders: (session, token).
        type Seen = (Outcome, Vec<(u64, u64)>);
        let expected: [(Seen, Seen); 4] = [
            (
                (Outcome::Released, vec![(2, 5), (3, 6)]),
                // Session 2 still believes it holds permit 5.
                (Outcome::Released, vec![(3, 6)]),
            ),
            (
                (Outcome::Queued { position: 2 }, vec![(1, 4)]),
                (Outcome::Granted { token: 6 }, vec![(1, 4), (3, 6)]),
            ),
            (
                (Outcome::Queued { position: 1 }, vec![(1, 4)]),
                // Session 1 still believes it reads.
                (Outcome::Granted { token: 5 }, vec![(2, 5)]),
            ),
            (
                (Outcome::Released, vec![(2, 6)]),
                (Outcome::Released, vec![(2, 4)]),
            ),
        ];
        for ((name, plant, steps), (fixed, planted)) in cases.iter().zip(expected) {
            assert_eq!(run(TablePlant::default(), steps), fixed, "{name}, fixed");
            assert_eq!(run(*plant, steps), planted, "{name}, planted");
        }
    }

    /// The planted proclaim past its term (`TablePlant::proclaim_past_term`): session 1 led
    /// under token 3 and resigned, session 2 leads under token 5; 1's late proclaim under 3 is
    /// refused by the fixed table and, planted, replaces 2's value under 2's token.
    #[test]
    fn a_planted_proclaim_past_its_term_replaces_the_leaders_value() {
        let key = |i: u64| SessionKey {
            id: SessionId(i),
            secret: i,
        };
        let campaign = |i: u64, value: &[u8]| Command {
            now_ms: 0,
            op: Op::Campaign {
                session: key(i),
                seq: 1,
                name: "E".into(),
                wait_ms: limits::WAIT_TIMEOUT_MS_MAX,
                value: value.to_vec(),
            },
        };
        let run = |plant: TablePlant| {
            let mut t = LockTable::new();
            t.set_plant(plant);
            for i in 1..=2 {
                t.apply(i, &create(1_000, i));
            }
            t.apply(3, &campaign(1, b"one"));
            let resign = Op::Release {
                session: key(1),
                seq: 2,
                name: "E".into(),
                token: 3,
            };
            t.apply(4, &campaign(2, b"two"));
            t.apply(
                5,
                &Command {
                    now_ms: 0,
                    op: resign,
                },
            );
            let late = Op::Proclaim {
                session: key(1),
                seq: 3,
                name: "E".into(),
                token: 3,
                value: b"late".to_vec(),
            };
            let o = t
                .apply(
                    6,
                    &Command {
                        now_ms: 0,
                        op: late,
                    },
                )
                .outcome;
            t.check_invariants().expect("a plant keeps the invariants");
            let l = t.describe("E").expect("2 leads");
            let h = l.holders.first().expect("a holder");
            (o, h.session.0, h.token, h.value.clone())
        };
        let fixed = run(TablePlant::default());
        assert!(
            matches!(
                fixed.0,
                Outcome::Rejected(Rejection::NotElectionLeader { token: 3, .. })
            ),
            "{fixed:?}"
        );
        assert_eq!((fixed.1, fixed.2, fixed.3), (2, 5, Some(b"two".to_vec())));
        let planted = run(TablePlant {
            proclaim_past_term: true,
            ..TablePlant::default()
        });
        assert_eq!(planted, (Outcome::Proclaimed, 2, 5, Some(b"late".to_vec())));
    }

    /// The election plants a read judges (issue #32's review): session 1 leads under 3 with
    /// "one" while 2 waits; 1 proclaims "one2"; a read; 1 resigns, 2 leads under 5 with
    /// "two"; 1's late proclaim under 3. Fixed: the read finds 1 with "one2", the late
    /// proclaim is refused and 2's value stays. Planted, each changes its one answer and keeps
    /// the table's invariants.
    #[test]
    fn the_planted_election_read_bugs_change_what_a_read_finds() {
        let key = |i: u64| SessionKey {
            id: SessionId(i),
            secret: i,
        };
        let at = |op: Op| Command { now_ms: 0, op };
        let campaign = |i: u64, value: &[u8]| {
            at(Op::Campaign {
                session: key(i),
                seq: 1,
                name: "E".into(),
                wait_ms: limits::WAIT_TIMEOUT_MS_MAX,
                value: value.to_vec(),
            })
        };
        let proclaim = |seq: u64, value: &[u8]| {
            at(Op::Proclaim {
                session: key(1),
                seq,
                name: "E".into(),
                token: 3,
                value: value.to_vec(),
            })
        };
        let value = |t: &LockTable| {
            t.describe("E").map(|l| {
                let h = l.holders.first().expect("a holder");
                (h.session.0, h.token, h.value.clone().unwrap_or_default())
            })
        };
        type Read = Option<(u64, u64, Vec<u8>)>;
        let run = |plant: TablePlant| -> (Read, Outcome, Read) {
            let mut t = LockTable::new();
            t.set_plant(plant);
            for i in 1..=2 {
                t.apply(i, &create(1_000, i));
            }
            t.apply(3, &campaign(1, b"one"));
            t.apply(4, &campaign(2, b"two"));
            t.apply(5, &proclaim(2, b"one2"));
            let contended = value(&t);
            let resign = Op::Release {
                session: key(1),
                seq: 3,
                name: "E".into(),
                token: 3,
            };
            t.apply(6, &at(resign));
            let late = t.apply(7, &proclaim(4, b"late")).outcome;
            t.check_invariants().expect("a plant keeps the invariants");
            (contended, late, value(&t))
        };
        let refused = |o: &Outcome| {
            matches!(
                o,
                Outcome::Rejected(Rejection::NotElectionLeader { token: 3, .. })
            )
        };
        let fixed = run(TablePlant::default());
        assert_eq!(fixed.0, Some((1, 3, b"one2".to_vec())));
        assert!(refused(&fixed.1), "{fixed:?}");
        assert_eq!(fixed.2, Some((2, 6, b"two".to_vec())));
        let planted = run(TablePlant {
            refused_proclaim_applied: true,
            ..TablePlant::default()
        });
        assert!(refused(&planted.1), "{planted:?}");
        assert_eq!(planted.2, Some((2, 6, b"late".to_vec())));
        let planted = run(TablePlant {
            proclaim_kept_old_value: true,
            ..TablePlant::default()
        });
        assert_eq!(planted.0, Some((1, 3, b"one".to_vec())));
        let planted = run(TablePlant {
            leader_hidden_while_contended: true,
            ..TablePlant::default()
        });
        assert_eq!(planted.0, None);
        assert_eq!(planted.2, Some((2, 6, b"two".to_vec())));
    }

    /// Each invariant of a name with several holders (issue #32), broken on its own.
    #[test]
    fn invariants_catch_broken_read_write_locks_and_semaphores() {
        type Breaker = fn(&mut LockTable);
        let breakers: [(&str, Breaker); 8] = [
            ("a semaphore's tokens that could pass their entry", |t| {
                t.multi.get_mut("S").unwrap().last_token = t.last_index;
            }),
            ("a reader beside a writer", |t| {
                t.multi.get_mut("L").unwrap().holders[1].mode = Mode::Exclusive;
            }),
            ("more holders than permits", |t| {
                t.multi.get_mut("S").unwrap().kind = LockKind::Semaphore { permits: 1 };
                for w in t.multi.get_mut("S").unwrap().waiters.iter_mut() {
                    w.mode = Mode::Permits(1);
                }
                for h in t.multi.get_mut("S").unwrap().holders.iter_mut() {
                    h.mode = Mode::Permits(1);
                }
            }),
            ("tokens that decrease", |t| {
                let s = t.multi.get_mut("S").unwrap();
                s.holders.swap(0, 1);
            }),
            ("two permits under one token", |t| {
                let s = t.multi.get_mut("S").unwrap();
                s.holders[1].token = s.holders[0].token;
            }),
            ("a waiter that could be granted", |t| {
                // The writer's wait gone, the reader behind it fits beside the readers.
                let l = t.multi.get_mut("L").unwrap();
                let w = l.waiters.pop_front().unwrap().waiter;
                t.wait_ends.remove(&(w.until_ms, w.session, w.seq));
                t.sessions
                    .get_mut(&w.session)
                    .unwrap()
                    .waiting
                    .remove(&w.seq);
                t.bytes -= waiter_bytes("L");
            }),
            (
                "a reader queued ahead of the writer it arrived behind",
                |t| {
                    // FIFO, seen from the table alone: a head reader beside readers fits.
                    t.multi.get_mut("L").unwrap().waiters.swap(0, 1);
                },
            ),
            ("a name both a mutex and one with several holders", |t| {
                let l = t.multi.get("S").unwrap().holders[0];
                t.locks.insert(
                    Name::from("S"),
                    Lock {
                        holder: Holder {
                            session: l.session,
                            token: l.token,
                            granted_at_ms: 0,
                        },
                        waiters: Queue::default(),
                    },
                );
            }),
        ];
        for (what, brk) in breakers {
            let mut t = valid_multi();
            brk(&mut t);
            let e = t.check_invariants();
            assert!(e.is_err(), "a table with {what} passed");
            assert!(
                matches!(
                    decode_table(&encode_table(&t)),
                    Err(DecodeError::Invalid(_))
                ),
                "a snapshot with {what} decoded"
            );
        }
    }

    #[test]
    fn invariants_catch_holds_that_disagree_with_the_locks() {
        type Breaker = fn(&mut LockTable);
        let breakers: [(&str, Breaker); 3] = [
            ("a hold not recorded in its session", |t| {
                t.sessions.get_mut(&SessionId(1)).unwrap().held.clear();
            }),
            ("a hold recorded in another session", |t| {
                let held = &mut t.sessions.get_mut(&SessionId(1)).unwrap().held;
                let hold = held.pop_first().unwrap();
                t.sessions.get_mut(&SessionId(2)).unwrap().held.insert(hold);
            }),
            ("a hold of a lock that is free", |t| {
                let held = &mut t.sessions.get_mut(&SessionId(1)).unwrap().held;
                let hold = held.first().unwrap().clone();
                held.insert(Name::from(&*format!("{hold}-free")));
            }),
        ];
        for (what, brk) in breakers {
            let mut t = valid();
            brk(&mut t);
            assert!(t.check_invariants().is_err(), "a table where {what} passed");
        }
    }
}
