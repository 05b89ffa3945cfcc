//! A group's membership and this member's place in it: the membership changes an operator
//! makes (add a member as a learner and then a voter, remove, move; each through joint
//! consensus, on the leader only), the [`Membership`] a member knows, and this node's status as
//! a plain [`NodeStatus`] with its [`Role`] (`/readyz`, the health service and `cluster status`
//! read it), with [`Node::out_of_touch_for`], which ends a watch on a member cut off from its
//! leader. Like `ops.rs`, domain types only.

use std::collections::BTreeSet;
use std::time::Duration;

use latchkey_core::limits;
use openraft::async_runtime::WatchReceiver;
use openraft::ServerState;

use crate::cluster::member_addr::MemberAddr;
use crate::error::ApiError;
use crate::node::Node;
use crate::observe::metrics::Gauges;

/// The role of a member in its Raft group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Leader,
    Follower,
    Candidate,
    Learner,
    /// Outside the group (replica subsets): this member runs its node without a membership.
    Outside,
    Shutdown,
}

impl Role {
    /// The role's name on the wire and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Candidate => "candidate",
            Role::Learner => "learner",
            Role::Outside => "outside",
            Role::Shutdown => "shutdown",
        }
    }
}

/// What a member knows of itself and its group, read without a round trip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub id: u64,
    pub role: Role,
    pub term: u64,
    pub last_log_index: u64,
    pub applied_index: u64,
    pub leader_id: Option<u64>,
    /// The voters of the group: id and address.
    pub members: Vec<(u64, String)>,
    /// Members being added, not voting yet.
    pub learners: Vec<(u64, String)>,
    /// The cluster's id, which a new member joins with.
    pub cluster_id: String,
    pub sessions: u64,
    pub locks: u64,
    /// The highest index this member knows committed.
    pub committed_index: u64,
}

impl NodeStatus {
    /// Whether this member should get traffic: it follows or leads a known leader, and has
    /// applied within `limits::READY_APPLY_LAG_MAX` entries of what it knows committed (a
    /// member catching up would answer reads late and hand its clients a table far behind).
    pub fn readiness(&self) -> Result<(), String> {
        if self.role == Role::Shutdown {
            return Err("the Raft core has stopped".into());
        }
        if self.role == Role::Outside {
            return Err("not a member of this Raft group".into());
        }
        // Before its membership is known a starting member reports itself a learner: without a
        // leader, that it knows none is what matters (it failed the health test under load).
        if self.leader_id.is_none() {
            return Err(match self.role {
                Role::Candidate => "no leader known: an election is under way".into(),
                _ => "no leader known".into(),
            });
        }
        match self.role {
            Role::Leader | Role::Follower => {}
            Role::Shutdown => unreachable!("answered above"),
            Role::Candidate => return Err("an election is under way".into()),
            Role::Learner => return Err("a learner, not a voting member".into()),
            Role::Outside => unreachable!("answered above"),
        }
        let lag = self.committed_index.saturating_sub(self.applied_index);
        if lag > limits::READY_APPLY_LAG_MAX {
            return Err(format!(
                "applied {} entries behind the commit index {} (at most {} for ready)",
                lag,
                self.committed_index,
                limits::READY_APPLY_LAG_MAX
            ));
        }
        Ok(())
    }

    /// The values the metrics endpoint shows as gauges.
    pub fn gauges(&self) -> Gauges {
        Gauges {
            sessions: self.sessions,
            locks: self.locks,
            term: self.term,
            is_leader: self.role == Role::Leader,
            last_log_index: self.last_log_index,
            applied_index: self.applied_index,
            ready: self.readiness(),
            longest_queues: Vec::new(),
            groups: Vec::new(),
        }
    }
}

/// A group's members by the membership a member knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub voters: Vec<(u64, String)>,
    pub learners: Vec<(u64, String)>,
}

impl Membership {
    fn node_addr(&self, id: u64) -> Option<&str> {
        self.voters
            .iter()
            .chain(&self.learners)
            .find(|(m, _)| *m == id)
            .map(|(_, a)| a.as_str())
    }
}

/// A member id and address as a membership change takes them: id at least 1, `HOST:PORT` or
/// `HOST:PORT/HOST:PORT` (client, then peer address: `member_addr`).
fn check_member_addr(id: u64, addr: &str) -> Result<(), ApiError> {
    if id == 0 {
        return Err(ApiError::Invalid("member ids start at 1".into()));
    }
    MemberAddr::check(addr).map_err(ApiError::Invalid)?;
    Ok(())
}

impl Node {
    /// Add member `id` at `addr`: as a learner first, which receives the log (or a snapshot)
    /// without counting towards any quorum; once it has caught up (or after
    /// `MEMBER_CATCH_UP_TIMEOUT_MS`, when the call fails and the member stays a learner), it
    /// is promoted to voter through joint consensus. Answers the voters after the change.
    pub async fn add_member(&self, id: u64, addr: String) -> Result<Vec<(u64, String)>, ApiError> {
        check_member_addr(id, &addr)?;
        let current = self.membership();
        if current.voters.iter().any(|(v, _)| *v == id) {
            if current.node_addr(id) == Some(addr.as_str()) {
                // A retry of an add that went through.
                return Ok(current.voters);
            }
            return Err(ApiError::Membership(format!(
                "member {id} is already a voter at {}; `latchkey cluster move {id}={addr}` \
                 gives it a new address",
                current.node_addr(id).unwrap_or("?")
            )));
        }
        if let Some(old) = current
            .learners
            .iter()
            .find(|(l, _)| *l == id)
            .map(|(_, a)| a)
        {
            if *old != addr {
                // openraft's add keeps a known member's address: the learner would be waited
                // for where it is not.
                return Err(ApiError::Membership(format!(
                    "member {id} is already a learner at {old}; `latchkey cluster remove {id}` \
                     first, or `latchkey cluster move {id}={addr}`"
                )));
            }
        }
        self.leader_only()?;
        tracing::info!(member = id, %addr, "adding a member: as a learner until it caught up");
        let added = tokio::time::timeout(
            Duration::from_millis(limits::MEMBER_CATCH_UP_TIMEOUT_MS),
            self.raft
                .add_learner(id, openraft::BasicNode { addr: addr.clone() }, true),
        )
        .await;
        match added {
            Ok(result) => {
                result?;
            }
            Err(_) => {
                return Err(ApiError::Membership(format!(
                    "member {id} at {addr} did not catch up within {} ms: is it running (`latchkey \
                     serve --id {id} --join {}`) and reachable? It stays a learner (no vote); run \
                     the same `cluster add` again, or `cluster remove {id}`",
                    limits::MEMBER_CATCH_UP_TIMEOUT_MS,
                    self.cluster
                )))
            }
        }
        // openraft's blocking add returned: the learner's log matches the leader's.
        self.change_membership(openraft::ChangeMembers::AddVoterIds([id].into()))
            .await?;
        tracing::info!(member = id, %addr, "member added as a voter");
        Ok(self.membership().voters)
    }

    /// Remove voter `id` (the leader too: it commits the change, then steps down). Answers the
    /// voters after the change.
    pub async fn remove_member(&self, id: u64) -> Result<Vec<(u64, String)>, ApiError> {
        let current = self.membership();
        if current.node_addr(id).is_none() {
            // Not a member (any more): a retry of a removal that went through.
            return Ok(current.voters);
        }
        self.leader_only()?;
        tracing::info!(member = id, "removing a member");
        if current.voters.iter().any(|(v, _)| *v == id) {
            self.change_membership(openraft::ChangeMembers::RemoveVoters([id].into()))
                .await?;
        } else {
            // A learner left over from an add that did not finish.
            self.change_membership(openraft::ChangeMembers::RemoveNodes([id].into()))
                .await?;
        }
        tracing::info!(member = id, "member removed");
        Ok(self.membership().voters)
    }

    /// Record `addr` as member `id`'s address: it was restarted there with its data dir.
    pub async fn move_member(&self, id: u64, addr: String) -> Result<Vec<(u64, String)>, ApiError> {
        check_member_addr(id, &addr)?;
        let current = self.membership();
        match current.node_addr(id) {
            // Replica subsets: this group is not on that member, so it has no address here to
            // record (the client moves a member in every group in turn).
            None if self.config.replicas != 0 => {
                // Said by the group's leader, which knows the latest membership.
                self.leader_only()?;
                return Ok(current.voters);
            }
            None => {
                return Err(ApiError::Membership(format!(
                    "{id} is not a member; `latchkey cluster add {id}={addr}` adds it"
                )))
            }
            Some(a) if a == addr => return Ok(current.voters),
            Some(_) => {}
        }
        self.leader_only()?;
        tracing::info!(member = id, %addr, "recording a member's new address");
        self.change_membership(openraft::ChangeMembers::SetNodes(
            [(id, openraft::BasicNode { addr })].into(),
        ))
        .await?;
        Ok(self.membership().voters)
    }

    async fn change_membership(
        &self,
        change: openraft::ChangeMembers<u64, openraft::BasicNode>,
    ) -> Result<(), ApiError> {
        tokio::time::timeout(
            Duration::from_millis(limits::MEMBERSHIP_CHANGE_TIMEOUT_MS),
            self.raft.change_membership(change, false),
        )
        .await
        .map_err(|_| ApiError::NoQuorum)??;
        Ok(())
    }

    /// The membership this member knows (the last in its log, committed or not).
    pub fn membership(&self) -> Membership {
        let m = self.raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let (voters, learners) = membership
            .nodes()
            .map(|(id, n)| (*id, n.addr.clone()))
            .partition(|(id, _)| voters.contains(id));
        Membership { voters, learners }
    }

    /// Whether this member belongs to its group: always without replica subsets
    /// (`--replicas` 0); with them, while the group's membership as this member knows it
    /// (voters and learners) has this member. A member outside a group runs its node without
    /// a membership, so it can acknowledge nothing there, but it sends the group's clients on
    /// (`Groups::serving`) rather than let them wait for a leader it will never know.
    pub fn belongs(&self) -> bool {
        self.config.replicas == 0
            || self
                .raft
                .metrics()
                .borrow_watched()
                .membership_config
                .membership()
                .get_node(&self.id)
                .is_some()
    }

    /// The client address the membership gives this member (what leader hints name it by).
    pub fn own_client_addr(&self) -> String {
        self.membership()
            .node_addr(self.id)
            .map(|a| MemberAddr::split(a).client.to_owned())
            .unwrap_or_else(|| self.config.listen.to_string())
    }

    pub fn status(&self) -> NodeStatus {
        let m = self.raft.metrics().borrow_watched().clone();
        let role = match m.state {
            ServerState::Shutdown => Role::Shutdown,
            _ if !self.belongs() => Role::Outside,
            ServerState::Leader => Role::Leader,
            ServerState::Follower => Role::Follower,
            ServerState::Candidate => Role::Candidate,
            ServerState::Learner => Role::Learner,
        };
        let Membership {
            voters: members,
            learners,
        } = self.membership();
        let (sessions, locks) = self
            .state
            .read(|t| (t.session_count() as u64, t.lock_count() as u64));
        NodeStatus {
            id: self.id,
            role,
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            applied_index: m.last_applied.map(|l| l.index).unwrap_or(0),
            leader_id: m.current_leader,
            members,
            learners,
            cluster_id: self.cluster.to_string(),
            sessions,
            locks,
            committed_index: m.cluster_committed.map(|l| l.index).unwrap_or(0),
        }
    }

    /// How long this member has been out of touch with its group's leader, once that is longer
    /// than `limits::WATCH_OUT_OF_TOUCH_FAILOVERS` of the group's longest failovers; `None`
    /// while in touch. A leader is in touch while a quorum acknowledges it (openraft's
    /// `last_quorum_acked`), or always as its group's only voter; anyone else while the
    /// leader's appends reach it (`LeaderContact`). A member removed from the group, which
    /// Raft never tells, or cut off from the rest is out of touch however sure it is of its
    /// leader, and a watch through it ends ([`crate::observe::watch::WatchHub::watch`]).
    pub fn out_of_touch_for(&self) -> Option<Duration> {
        let silent = {
            let m = self.raft.metrics();
            let m = m.borrow_watched();
            match m.state {
                ServerState::Leader => {
                    let membership = m.membership_config.membership();
                    if membership.voter_ids().all(|id| id == self.id) {
                        return None;
                    }
                    match &m.last_quorum_acked {
                        Some(acked) => openraft::Instant::elapsed(&**acked),
                        // Elected, not yet acknowledged: as long as it last heard of a leader.
                        None => self.leader_contact.since(),
                    }
                }
                _ => self.leader_contact.since(),
            }
        };
        let c = &self.config;
        let failover = Duration::from_millis(c.heartbeat_ms + 3 * c.election_timeout_max_ms);
        (silent > failover * limits::WATCH_OUT_OF_TOUCH_FAILOVERS).then_some(silent)
    }
}
