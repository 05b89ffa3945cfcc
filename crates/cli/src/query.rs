//! `latchkey status`, `latchkey list` and `latchkey cluster status`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use latchkey_client::{
    describe_session, human_duration, Holder, LockInfo, Mode, NodeStatus, SessionOwner,
};
use serde::Serialize;

use crate::{ClusterStatusArgs, ListArgs, MemberAddArgs, MemberAddrArgs, MemberIdArgs, StatusArgs};

/// One lock, as printed with `--json`. `token`, `session`, `held_for_ms` and `owner` are null
/// when the lock is free; `owner` is also null when the holder's client gave none. Of a lock
/// with several holders (readers, permits) they are the first granted's; `holders` lists
/// every one. `mode` is how it is held: `exclusive`, `shared`, or `permits` (a semaphore of
/// `permits`, null for a lock). `value`, only present then, is the election value its
/// exclusive holder (the election's leader) published, as UTF-8.
#[derive(Serialize, Debug, PartialEq)]
pub struct LockJson {
    pub name: String,
    pub held: bool,
    pub token: Option<u64>,
    pub session: Option<u64>,
    pub held_for_ms: Option<u64>,
    pub owner: Option<OwnerJson>,
    pub mode: &'static str,
    pub permits: Option<u32>,
    pub holders: Vec<HolderJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    pub waiters: u32,
    /// Waiters in queue order: all of them from `status`, the first few from `list`.
    pub queue: Vec<WaiterJson>,
    /// The lock-delay the holder's grant asked for (ms), when it asked for one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock_delay_ms: Option<u64>,
    /// While a lock-delay runs (no holder): ms until the name is granted again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_remaining_ms: Option<u64>,
    /// While a lock-delay runs: the lost grant's token (`admin release` ends the delay).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_token: Option<u64>,
}

/// A session's owner description: what its client said about itself (not authenticated).
#[derive(Serialize, Debug, PartialEq)]
pub struct OwnerJson {
    pub host: String,
    pub pid: u32,
    pub user: String,
    pub text: String,
}

#[derive(Serialize, Debug, PartialEq)]
pub struct HolderJson {
    pub session: u64,
    pub token: u64,
    pub held_for_ms: u64,
    pub owner: Option<OwnerJson>,
}

#[derive(Serialize, Debug, PartialEq)]
pub struct WaiterJson {
    pub session: u64,
    pub waited_ms: u64,
    pub owner: Option<OwnerJson>,
    /// How it asked: `exclusive`, `shared` or `permits`.
    pub mode: &'static str,
}

/// A mode's name in `--json`, and a semaphore's permits.
fn mode_json(mode: Mode) -> (&'static str, Option<u32>) {
    match mode {
        Mode::Exclusive => ("exclusive", None),
        Mode::Shared => ("shared", None),
        Mode::Permits(n) => ("permits", Some(n)),
    }
}

fn owner_json(o: &SessionOwner) -> OwnerJson {
    OwnerJson {
        host: o.host.clone(),
        pid: o.pid,
        user: o.user.clone(),
        text: o.text.clone(),
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl From<&LockInfo> for LockJson {
    fn from(lock: &LockInfo) -> LockJson {
        let (mode, permits) = mode_json(lock.mode);
        LockJson {
            mode,
            permits,
            holders: lock
                .holders
                .iter()
                .map(|h| HolderJson {
                    session: h.session,
                    token: h.token,
                    held_for_ms: ms(h.held_for),
                    owner: h.owner.as_ref().map(owner_json),
                })
                .collect(),
            value: lock
                .holder
                .as_ref()
                .and_then(|h| h.value.as_deref())
                .map(|v| String::from_utf8_lossy(v).into_owned()),
            name: lock.name.clone(),
            held: lock.holder.is_some(),
            token: lock.holder.as_ref().map(|h| h.token),
            session: lock.holder.as_ref().map(|h| h.session),
            held_for_ms: lock.holder.as_ref().map(|h| ms(h.held_for)),
            owner: lock
                .holder
                .as_ref()
                .and_then(|h| h.owner.as_ref())
                .map(owner_json),
            waiters: lock.waiters,
            queue: lock
                .queue
                .iter()
                .map(|w| WaiterJson {
                    session: w.session,
                    waited_ms: ms(w.waited),
                    owner: w.owner.as_ref().map(owner_json),
                    mode: mode_json(w.mode).0,
                })
                .collect(),
            lock_delay_ms: lock.lock_delay.map(ms),
            delay_remaining_ms: lock.delay_remaining.map(ms),
            delay_token: lock.delay_token,
        }
    }
}

/// One line: the holder with its owner and how long it has held the lock, then the number of
/// waiters and the longest wait.
fn human(lock: &LockInfo) -> String {
    let waiting = match lock.queue.first() {
        Some(w) => format!(
            "{} waiting, longest {}",
            lock.waiters,
            human_duration(w.waited)
        ),
        None => format!("{} waiting", lock.waiters),
    };
    let holder = |h: &Holder| {
        format!(
            "{} with token {} for {}",
            describe_session(h.session, h.owner.as_ref()),
            h.token,
            human_duration(h.held_for),
        )
    };
    let holders = || {
        lock.holders
            .iter()
            .map(holder)
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let (None, Some(left)) = (&lock.holder, lock.delay_remaining) {
        return format!(
            "{}: in a lock-delay (its holder's grant was lost) for {} more; {waiting}",
            lock.name,
            human_duration(left)
        );
    }
    let delay = lock.lock_delay.map_or(String::new(), |d| {
        format!(" (lock-delay {})", human_duration(d))
    });
    match (&lock.holder, lock.mode) {
        (None, _) => format!("{}: free; {waiting}", lock.name),
        (Some(_), Mode::Shared) => format!(
            "{}: read by {} (shared): {}; {waiting}",
            lock.name,
            plural(lock.holders.len(), "holder"),
            holders()
        ),
        (Some(_), Mode::Permits(n)) => format!(
            "{}: {} of {n} permits held: {}; {waiting}",
            lock.name,
            lock.holders.len(),
            holders()
        ),
        (Some(h), Mode::Exclusive) => match &h.value {
            Some(v) => format!(
                "{}: led by {}, value {:?}; {waiting}",
                lock.name,
                holder(h),
                String::from_utf8_lossy(v)
            ),
            None => format!("{}: held by {}{delay}; {waiting}", lock.name, holder(h)),
        },
    }
}

fn plural(n: usize, what: &str) -> String {
    match n {
        1 => format!("1 {what}"),
        n => format!("{n} {what}s"),
    }
}

/// `human`, then one indented line per waiter (status shows the whole queue).
fn human_with_queue(lock: &LockInfo) -> String {
    let mut out = human(lock);
    for (i, w) in lock.queue.iter().enumerate() {
        let how = match w.mode {
            Mode::Exclusive => "",
            Mode::Shared => " (shared)",
            Mode::Permits(_) => " (a permit)",
        };
        out.push_str(&format!(
            "\n  {}. {}{how} waiting for {}",
            i + 1,
            describe_session(w.session, w.owner.as_ref()),
            human_duration(w.waited)
        ));
    }
    out
}

/// `status NAME --json`: the lock, and the Raft group it belongs to (issue #16).
#[derive(Serialize, Debug, PartialEq)]
pub struct StatusJson {
    #[serde(flatten)]
    pub lock: LockJson,
    pub group: u32,
}

pub async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let client = args.endpoints.client()?;
    let lock = client.describe(&args.name).await?;
    let groups = client.groups().await?;
    let group = latchkey_core::group_of(&args.name, groups);
    if args.json {
        let json = StatusJson {
            lock: LockJson::from(&lock),
            group,
        };
        println!("{}", serde_json::to_string(&json)?);
    } else {
        println!("{}", human_with_queue(&lock));
        if groups > 1 {
            println!("group {group} of {groups}");
        }
    }
    Ok(())
}

pub async fn list(args: ListArgs) -> anyhow::Result<()> {
    let client = args.endpoints.client()?;
    let list = client.list(&args.prefix).await?;
    if args.json {
        let locks: Vec<LockJson> = list.locks.iter().map(LockJson::from).collect();
        println!("{}", serde_json::to_string(&locks)?);
    } else {
        for lock in &list.locks {
            println!("{}", human(lock));
        }
        if list.locks.is_empty() {
            // On stderr: a script reading the list on stdout still reads nothing.
            match args.prefix.as_str() {
                "" => eprintln!("latchkey: no locks are held"),
                prefix => eprintln!("latchkey: no locks are held under {prefix:?}"),
            }
        }
    }
    if list.truncated {
        eprintln!("latchkey: more locks match than the server returns at once; narrow the prefix");
    }
    Ok(())
}

/// One row of `cluster status`.
#[derive(Serialize, Debug, PartialEq)]
pub struct MemberJson {
    pub id: Option<u64>,
    pub addr: String,
    /// "leader", "follower", ... as the node says, or "unreachable".
    pub role: String,
    pub term: Option<u64>,
    pub last_log_index: Option<u64>,
    pub applied_index: Option<u64>,
}

/// One Raft group of `cluster status` (issue #16): its leader as the members report it.
#[derive(Serialize, Debug, PartialEq)]
pub struct GroupJson {
    pub id: u32,
    pub leader: Option<u64>,
    /// The term of that leader, and the last index of its log (as the leader reports them).
    pub term: Option<u64>,
    pub last_log_index: Option<u64>,
    /// The group's voters, as its leader reports them (empty with no leader, or from a server
    /// before groups): every member, unless the groups are placed on replica subsets
    /// (`serve --replicas`).
    pub voters: Vec<u64>,
}

#[derive(Serialize, Debug, PartialEq)]
pub struct ClusterJson {
    /// The id a new member joins with (`serve --join`), as the members say.
    pub cluster_id: Option<String>,
    /// Group 0's leader (the only group's, in a cluster of one).
    pub leader: Option<u64>,
    pub members: Vec<MemberJson>,
    /// Every Raft group, in order (one for a cluster of one group).
    pub groups: Vec<GroupJson>,
}

/// An endpoint or a member's recorded address as the address clients dial: no scheme, and no
/// path, trailing `/` or peer address (a member with `--peer-listen` is recorded as
/// `CLIENT/PEER`; its peer port answers no client).
fn bare(addr: &str) -> String {
    let addr = addr
        .trim()
        .trim_start_matches("http://")
        .trim_start_matches("https://");
    addr.split('/').next().unwrap_or(addr).to_owned()
}

/// Builds the report from what each address answered (`None`: unreachable).
pub fn cluster_report(answers: &BTreeMap<String, Option<NodeStatus>>) -> ClusterJson {
    // Ids of members by address, from every node's view of the membership.
    let mut ids: BTreeMap<String, u64> = BTreeMap::new();
    for status in answers.values().flatten() {
        let voters = status.group_status.iter().flat_map(|g| &g.voters);
        for m in status.members.iter().chain(&status.learners).chain(voters) {
            ids.insert(bare(&m.addr), m.id);
        }
    }
    let mut members: Vec<MemberJson> = answers
        .iter()
        .map(|(addr, answer)| match answer {
            Some(s) => MemberJson {
                id: Some(s.id),
                addr: addr.clone(),
                role: s.role.clone(),
                term: Some(s.term),
                last_log_index: Some(s.last_log_index),
                applied_index: Some(s.applied_index),
            },
            None => MemberJson {
                id: ids.get(addr).copied(),
                addr: addr.clone(),
                role: "unreachable".into(),
                term: None,
                last_log_index: None,
                applied_index: None,
            },
        })
        .collect();
    members.sort_by(|a, b| (a.id.is_none(), a.id, &a.addr).cmp(&(b.id.is_none(), b.id, &b.addr)));
    // The leader of the highest term any node reports itself leader in.
    let leader = members
        .iter()
        .filter(|m| m.role == "leader")
        .max_by_key(|m| m.term)
        .and_then(|m| m.id);
    let cluster_id = answers
        .values()
        .flatten()
        .map(|s| s.cluster_id.clone())
        .find(|id| !id.is_empty());
    ClusterJson {
        cluster_id,
        leader,
        members,
        groups: group_report(answers),
    }
}

/// Each group's leader: of the members that report themselves its leader, the one of the
/// highest term. A server from before groups reports no groups: its one group is the fields
/// of its status.
fn group_report(answers: &BTreeMap<String, Option<NodeStatus>>) -> Vec<GroupJson> {
    let count = answers
        .values()
        .flatten()
        .map(|s| s.groups.max(1))
        .max()
        .unwrap_or(1);
    let none = Vec::new();
    (0..count)
        .map(|id| {
            let leading = answers
                .values()
                .flatten()
                .filter_map(|s| {
                    let (role, term, last, voters) =
                        match s.group_status.iter().find(|g| g.group == id) {
                            Some(g) => (g.role.as_str(), g.term, g.last_log_index, &g.voters),
                            None if id == 0 => (s.role.as_str(), s.term, s.last_log_index, &none),
                            None => return None,
                        };
                    (role == "leader").then_some((term, s.id, last, voters))
                })
                .max_by_key(|&(term, leader, last, _)| (term, leader, last));
            GroupJson {
                id,
                leader: leading.map(|(_, leader, _, _)| leader),
                term: leading.map(|(term, _, _, _)| term),
                last_log_index: leading.map(|(_, _, last, _)| last),
                voters: leading
                    .map(|(_, _, _, v)| v.iter().map(|m| m.id).collect())
                    .unwrap_or_default(),
            }
        })
        .collect()
}

pub async fn cluster_status(args: ClusterStatusArgs) -> anyhow::Result<()> {
    let client = args.endpoints.client()?;
    let mut answers: BTreeMap<String, Option<NodeStatus>> = BTreeMap::new();
    let mut to_ask: BTreeSet<String> = args.endpoints.endpoints.iter().map(|e| bare(e)).collect();
    // Two rounds: the endpoints given, then members they report that were not given.
    for _ in 0..2 {
        let mut asks = tokio::task::JoinSet::new();
        for addr in std::mem::take(&mut to_ask) {
            let client = client.clone();
            asks.spawn(async move {
                let answer = client.node_status(&addr).await;
                (addr, answer)
            });
        }
        while let Some(joined) = asks.join_next().await {
            let (addr, answer) = joined?;
            let answer = match answer {
                Ok(status) => Some(status),
                // Refused, not unreachable: say so (exit 5, as every refused call).
                Err(e @ latchkey_client::Error::PermissionDenied { .. }) => return Err(e.into()),
                Err(e) => {
                    tracing::info!(%addr, error = %e, "node unreachable");
                    None
                }
            };
            answers.insert(addr, answer);
        }
        // Every group's voters: with replica subsets a member need not be in group 0.
        for status in answers.values().flatten() {
            let voters = status.group_status.iter().flat_map(|g| &g.voters);
            for m in status.members.iter().chain(&status.learners).chain(voters) {
                let addr = bare(&m.addr);
                if !answers.contains_key(&addr) {
                    to_ask.insert(addr);
                }
            }
        }
        if to_ask.is_empty() {
            break;
        }
    }
    let report = cluster_report(&answers);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        let dash = || "-".to_owned();
        let show = |v: Option<u64>| v.map_or_else(dash, |v| v.to_string());
        println!(
            "{:<6} {:<24} {:<12} {:>8} {:>14} {:>14}",
            "ID", "ADDR", "ROLE", "TERM", "LAST_LOG", "APPLIED"
        );
        for m in &report.members {
            println!(
                "{:<6} {:<24} {:<12} {:>8} {:>14} {:>14}",
                show(m.id),
                m.addr,
                m.role,
                show(m.term),
                show(m.last_log_index),
                show(m.applied_index)
            );
        }
        if report.groups.len() > 1 {
            println!();
            println!(
                "{:<6} {:<8} {:>8} {:>14}  VOTERS",
                "GROUP", "LEADER", "TERM", "LAST_LOG"
            );
            for g in &report.groups {
                let voters: Vec<String> = g.voters.iter().map(u64::to_string).collect();
                println!(
                    "{:<6} {:<8} {:>8} {:>14}  {}",
                    g.id,
                    g.leader
                        .map_or_else(|| "none".to_owned(), |l| l.to_string()),
                    show(g.term),
                    show(g.last_log_index),
                    if voters.is_empty() {
                        "-".to_owned()
                    } else {
                        voters.join(",")
                    }
                );
            }
        } else {
            match report.leader {
                Some(id) => println!("leader: {id}"),
                None => println!("leader: none known"),
            }
        }
        if let Some(id) = &report.cluster_id {
            println!("cluster id: {id} (a new member joins with `latchkey serve --join {id}`)");
        }
    }
    if answers.values().all(Option::is_none) {
        anyhow::bail!("no endpoint answered");
    }
    Ok(())
}

/// Parses `ID=HOST:PORT` (clap reports a bad one as a usage error, exit 2).
pub fn parse_member(text: &str) -> Result<(u64, String), String> {
    let list = crate::serve::parse_members(text)?;
    if list.0.len() != 1 {
        return Err(format!("{text:?}: one member, ID=HOST:PORT"));
    }
    Ok(list.0.into_iter().next().expect("one member"))
}

fn voters_text(members: &[latchkey_client::Member]) -> String {
    let list: Vec<String> = members
        .iter()
        .map(|m| format!("{}={}", m.id, m.addr))
        .collect();
    list.join(",")
}

fn print_members(what: &str, members: &[latchkey_client::Member]) {
    println!("{what}; voters now: {}", voters_text(members));
}

/// `what`, then the voters of the group changed, or of each group changed when there were
/// several (`group G: ID=ADDR,...; group H: ...`).
fn print_group_voters(what: &str, changed: &[latchkey_client::GroupVoters]) {
    match changed {
        [one] => print_members(what, &one.voters),
        several => {
            let each: Vec<String> = several
                .iter()
                .map(|g| format!("group {}: {}", g.group, voters_text(&g.voters)))
                .collect();
            println!("{what}; voters now: {}", each.join("; "));
        }
    }
}

pub async fn cluster_add(args: MemberAddArgs) -> anyhow::Result<()> {
    let client = args.member.endpoints.client()?;
    let (id, addr) = &args.member.member;
    let groups = (!args.groups.is_empty()).then_some(args.groups.as_slice());
    let changed = client.add_member_in(*id, addr, groups).await?;
    print_group_voters(&format!("member {id} at {addr} added"), &changed);
    Ok(())
}

pub async fn cluster_remove(args: MemberIdArgs) -> anyhow::Result<()> {
    let client = args.endpoints.client()?;
    let groups = (!args.groups.is_empty()).then_some(args.groups.as_slice());
    let changed = client.remove_member_from(args.id, groups).await?;
    print_group_voters(&format!("member {} removed", args.id), &changed);
    Ok(())
}

pub async fn cluster_move(args: MemberAddrArgs) -> anyhow::Result<()> {
    let client = args.endpoints.client()?;
    let (id, addr) = &args.member;
    let members = client.move_member(*id, addr).await?;
    print_members(&format!("member {id} now at {addr}"), &members);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_client::{Holder, Member, Waiter};

    #[test]
    fn free_lock_has_null_holder_fields() {
        let free = LockInfo {
            name: "a".into(),
            lock_delay: None,
            delay_remaining: None,
            delay_token: None,
            holder: None,
            mode: Mode::Exclusive,
            holders: vec![],
            waiters: 0,
            queue: vec![],
        };
        let json = serde_json::to_value(LockJson::from(&free)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"name":"a","held":false,"token":null,"session":null,"held_for_ms":null,"owner":null,
                "mode":"exclusive","permits":null,"holders":[],"waiters":0,"queue":[]})
        );
        let web3 = SessionOwner {
            host: "web-3".into(),
            pid: 4411,
            user: "deploy".into(),
            text: String::new(),
        };
        let holder = Holder {
            session: 3,
            token: 17,
            held_for: Duration::from_millis(1500),
            owner: Some(web3.clone()),
            value: None,
        };
        let held = LockInfo {
            name: "b".into(),
            lock_delay: None,
            delay_remaining: None,
            delay_token: None,
            holder: Some(holder.clone()),
            mode: Mode::Exclusive,
            holders: vec![holder],
            waiters: 2,
            queue: vec![
                Waiter {
                    session: 5,
                    waited: Duration::from_millis(125_000),
                    owner: None,
                    mode: Mode::Exclusive,
                },
                Waiter {
                    session: 6,
                    waited: Duration::from_millis(900),
                    owner: Some(web3),
                    mode: Mode::Exclusive,
                },
            ],
        };
        let json = serde_json::to_value(LockJson::from(&held)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"name":"b","held":true,"token":17,"session":3,"held_for_ms":1500,
                "owner":{"host":"web-3","pid":4411,"user":"deploy","text":""},
                "mode":"exclusive","permits":null,
                "holders":[{"session":3,"token":17,"held_for_ms":1500,
                            "owner":{"host":"web-3","pid":4411,"user":"deploy","text":""}}],
                "waiters":2,
                "queue":[{"session":5,"waited_ms":125000,"owner":null,"mode":"exclusive"},
                         {"session":6,"waited_ms":900,"owner":{"host":"web-3","pid":4411,"user":"deploy","text":""},"mode":"exclusive"}]})
        );
        assert_eq!(
            human_with_queue(&held),
            "b: held by session 3 (host web-3, pid 4411, user deploy) with token 17 for 1.5s; \
             2 waiting, longest 2m05s\n  \
             1. session 5 waiting for 2m05s\n  \
             2. session 6 (host web-3, pid 4411, user deploy) waiting for 0.9s"
        );
        // An election's leader (issue #32): its value in both forms.
        let mut led = held.clone();
        for h in led.holder.iter_mut().chain(led.holders.iter_mut()) {
            h.value = Some(b"10.0.0.1:80".to_vec());
        }
        assert_eq!(
            serde_json::to_value(LockJson::from(&led)).unwrap()["value"],
            "10.0.0.1:80"
        );
        assert!(
            human(&led).starts_with(
                "b: led by session 3 (host web-3, pid 4411, user deploy) with token 17 for \
                 1.5s, value \"10.0.0.1:80\"; 2 waiting"
            ),
            "{}",
            human(&led)
        );
    }

    /// Readers and permits: every holder with its token, the mode, a semaphore's permits, and
    /// how each waiter asked (issue #32).
    #[test]
    fn several_holders_are_each_shown_with_their_token() {
        let h = |session, token| Holder {
            session,
            token,
            held_for: Duration::from_millis(2000),
            owner: None,
            value: None,
        };
        let waiter = |session, mode| Waiter {
            session,
            waited: Duration::from_millis(1000),
            owner: None,
            mode,
        };
        let readers = LockInfo {
            name: "cfg".into(),
            lock_delay: None,
            delay_remaining: None,
            delay_token: None,
            holder: Some(h(3, 10)),
            mode: Mode::Shared,
            holders: vec![h(3, 10), h(4, 10)],
            waiters: 2,
            queue: vec![waiter(5, Mode::Exclusive), waiter(6, Mode::Shared)],
        };
        assert_eq!(
            human_with_queue(&readers),
            "cfg: read by 2 holders (shared): session 3 with token 10 for 2.0s, session 4 with \
             token 10 for 2.0s; 2 waiting, longest 1.0s\n  \
             1. session 5 waiting for 1.0s\n  \
             2. session 6 (shared) waiting for 1.0s"
        );
        let jobs = LockInfo {
            name: "jobs".into(),
            lock_delay: None,
            delay_remaining: None,
            delay_token: None,
            holder: Some(h(3, 20)),
            mode: Mode::Permits(3),
            holders: vec![h(3, 20), h(4, 21)],
            waiters: 0,
            queue: vec![],
        };
        assert_eq!(
            human(&jobs),
            "jobs: 2 of 3 permits held: session 3 with token 20 for 2.0s, session 4 with token \
             21 for 2.0s; 0 waiting"
        );
        let json = serde_json::to_value(LockJson::from(&jobs)).unwrap();
        assert_eq!(json["mode"], "permits");
        assert_eq!(json["permits"], 3);
        assert_eq!(json["holders"][1]["token"], 21);
        assert_eq!(json["token"], 20, "the first holder's, as for a mutex");
    }

    #[test]
    fn cluster_report_names_the_leader_and_the_unreachable() {
        let status = |id, role: &str, term| NodeStatus {
            id,
            role: role.into(),
            term,
            last_log_index: 10,
            applied_index: 9,
            leader_id: Some(1),
            members: vec![
                Member {
                    id: 1,
                    addr: "h:1".into(),
                },
                Member {
                    id: 2,
                    addr: "h:2".into(),
                },
                Member {
                    id: 3,
                    addr: "h:3".into(),
                },
            ],
            learners: vec![],
            cluster_id: "c0ffee".into(),
            sessions: 0,
            locks: 0,
            groups: 1,
            group_status: vec![],
        };
        let answers = BTreeMap::from([
            ("h:1".to_string(), Some(status(1, "leader", 4))),
            ("h:2".to_string(), Some(status(2, "follower", 4))),
            ("h:3".to_string(), None),
        ]);
        let report = cluster_report(&answers);
        assert_eq!(report.leader, Some(1));
        assert_eq!(report.cluster_id.as_deref(), Some("c0ffee"));
        assert_eq!(report.members.len(), 3);
        assert_eq!(report.members[2].id, Some(3));
        assert_eq!(report.members[2].role, "unreachable");
        assert_eq!(report.members[2].term, None);
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["members"][0]["last_log_index"], 10);
        // A server from before groups: its one group is its own fields.
        assert_eq!(
            report.groups,
            vec![GroupJson {
                id: 0,
                leader: Some(1),
                term: Some(4),
                last_log_index: Some(10),
                voters: vec![],
            }]
        );
    }

    #[test]
    fn cluster_report_names_each_groups_leader() {
        let group = |group, role: &str, term, last| latchkey_client::GroupStatus {
            group,
            role: role.into(),
            term,
            last_log_index: last,
            applied_index: last,
            leader_id: None,
            sessions: 0,
            locks: 0,
            voters: (1..=3)
                .map(|id| Member {
                    id,
                    addr: format!("h:{id}"),
                })
                .collect(),
        };
        let status = |id, groups: Vec<latchkey_client::GroupStatus>| NodeStatus {
            id,
            role: groups[0].role.clone(),
            term: groups[0].term,
            last_log_index: groups[0].last_log_index,
            applied_index: 0,
            leader_id: None,
            members: vec![],
            learners: vec![],
            cluster_id: "c0ffee".into(),
            sessions: 0,
            locks: 0,
            groups: 3,
            group_status: groups,
        };
        let answers = BTreeMap::from([
            (
                "h:1".to_string(),
                Some(status(
                    1,
                    vec![
                        group(0, "leader", 2, 40),
                        group(1, "follower", 3, 7),
                        group(2, "leader", 1, 9),
                    ],
                )),
            ),
            (
                "h:2".to_string(),
                Some(status(
                    2,
                    vec![
                        group(0, "follower", 2, 40),
                        group(1, "leader", 3, 8),
                        group(2, "follower", 1, 9),
                    ],
                )),
            ),
            ("h:3".to_string(), None),
        ]);
        let report = cluster_report(&answers);
        let leaders: Vec<_> = report
            .groups
            .iter()
            .map(|g| (g.id, g.leader, g.term))
            .collect();
        assert_eq!(
            leaders,
            vec![
                (0, Some(1), Some(2)),
                (1, Some(2), Some(3)),
                (2, Some(1), Some(1))
            ]
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["groups"][1]["last_log_index"], 8);
        assert_eq!(json["groups"][1]["id"], 1);
        assert_eq!(json["groups"][1]["voters"], serde_json::json!([1, 2, 3]));
    }
}
