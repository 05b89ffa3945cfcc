//! The Raft groups one member runs (issue #16), and which of them a request goes to.
//!
//! A member of a cluster of `groups` groups runs one [`Node`] per group, each with its own
//! log, state machine, leader, leases and waiters. A lock name belongs to the group
//! `latchkey_core::group_of` names, a session to the group its id names (`id % groups`); a
//! request about a lock or a session is answered by that group's node, and every error it
//! gives names the group (`latchkey-group` metadata) so that a client routes its next request
//! for that group to the leader hint. With one group, everything is group 0's, as before
//! groups existed.
//!
//! With replica subsets (`--replicas`) a member runs every group's node but belongs only to
//! the groups it was placed on (or added to): a request for another group is answered with
//! that group's name and a hint to one of its replicas ([`Groups::serving`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use latchkey_core::{group_of, group_of_session, limits, IdentityUsage, SessionId, SessionKey};

use crate::cluster::member_addr::MemberAddr;
use crate::error::{ApiError, GroupError};
use crate::node::ops::SessionLease;
use crate::node::{Node, OtherGroups};
use crate::probe::ProbeEvent;

/// What a keepalive carrying sessions of several groups got ([`Groups::keep_alive`]).
#[derive(Debug)]
pub struct Renewal {
    /// The leases of the groups renewed, in the request's order.
    pub leases: Vec<SessionLease>,
    /// Each group this member could not renew now (an election, or a group it is outside
    /// of), with why and the hint where to send that group's sessions instead.
    pub refused: Vec<(u32, ApiError)>,
}

pub struct Groups {
    nodes: Vec<Arc<Node>>,
    /// Which replica the next client sent from a group this member is outside of goes to.
    hint_turn: AtomicUsize,
    /// Room for batch operations running at once, member-wide (`BATCH_OPS_IN_FLIGHT_MAX`):
    /// shared by both APIs' batch calls (`api/calls.rs`).
    batch_room: tokio::sync::Semaphore,
}

impl Groups {
    /// `nodes[g]` must be group `g`'s node, one per group.
    pub fn new(nodes: Vec<Arc<Node>>) -> Arc<Groups> {
        assert!(!nodes.is_empty(), "a member runs at least one group");
        for (g, node) in nodes.iter().enumerate() {
            assert_eq!(node.shape.group as usize, g, "group {g}'s node");
            assert_eq!(node.shape.groups as usize, nodes.len(), "group {g}'s count");
            assert!(
                Arc::ptr_eq(&node.member_groups, &nodes[0].member_groups),
                "group {g} started with another member's `MemberShared`"
            );
        }
        let groups = Arc::new(Groups {
            nodes,
            hint_turn: AtomicUsize::new(0),
            batch_room: tokio::sync::Semaphore::new(limits::BATCH_OPS_IN_FLIGHT_MAX),
        });
        let others: std::sync::Weak<dyn OtherGroups> = Arc::downgrade(&groups) as _;
        groups.nodes[0]
            .member_groups
            .set(others)
            .expect("a member's groups are made once");
        groups
    }

    pub fn count(&self) -> u32 {
        self.nodes.len() as u32
    }

    /// Group 0's node: the member's own settings (`config`), metrics and shutdown, which every
    /// group's node shares.
    pub fn first(&self) -> &Arc<Node> {
        &self.nodes[0]
    }

    /// The member's room for batch operations in flight, of either API.
    pub(crate) fn batch_room(&self) -> &tokio::sync::Semaphore {
        &self.batch_room
    }

    pub fn all(&self) -> &[Arc<Node>] {
        &self.nodes
    }

    /// Group `group`'s node, to serve a request about it (see [`Groups::serving`]), or the
    /// error a request naming a group this cluster lacks gets: invalid past the most any
    /// cluster has (`GROUPS_MAX`, the bound `docs/openapi.json` states), else a conflict with
    /// this cluster's group count, which a well-formed request cannot know.
    pub fn get(&self, group: u32) -> Result<&Arc<Node>, GroupError> {
        if group >= limits::GROUPS_MAX {
            return Err(GroupError::of_cluster(ApiError::Invalid(format!(
                "group {group}: a cluster has at most {} Raft groups (0 to {})",
                limits::GROUPS_MAX,
                limits::GROUPS_MAX - 1
            ))));
        }
        if group >= self.count() {
            return Err(GroupError::of_cluster(ApiError::NoSuchGroup {
                group,
                groups: self.count(),
            }));
        }
        self.serving(group)
    }

    /// Group `group`'s node, unless this member is outside the group (replica subsets,
    /// `--replicas`: [`Node::belongs`]): then a not-leader error that names the group, with a
    /// hint to one of its replicas ([`Groups::replica_hint`]), so that the client asks there.
    pub fn serving(&self, group: u32) -> Result<&Arc<Node>, GroupError> {
        let node = &self.nodes[group as usize];
        if node.belongs() {
            return Ok(node);
        }
        let (leader_id, leader_addr) = self.replica_hint(node).unzip();
        Err(GroupError::of(
            node.shape,
            ApiError::NotLeader {
                leader_id,
                leader_addr,
            },
        ))
    }

    /// A member of `node`'s group for a client this member cannot serve there: one of the
    /// members the group was placed on ([`Node::placement`]) or, on a member that joined
    /// (given no founding list), any member of the groups it belongs to, who knows more;
    /// never this member. Each at the address the memberships this member follows give it,
    /// else the founding one. Another one each time, as one may be down; `None` when this
    /// member knows nobody to send the client to.
    fn replica_hint(&self, node: &Node) -> Option<(u64, String)> {
        let mut known: BTreeMap<u64, String> = BTreeMap::new();
        for n in self.belonging() {
            for (id, addr) in n.membership().voters {
                known.insert(id, MemberAddr::split(&addr).client.to_owned());
            }
        }
        let candidates: Vec<(u64, String)> = if node.placement.is_empty() {
            known.into_iter().collect()
        } else {
            node.placement
                .iter()
                .map(|(id, founding)| (*id, known.get(id).unwrap_or(founding).clone()))
                .collect()
        };
        let candidates: Vec<(u64, String)> = candidates
            .into_iter()
            .filter(|(id, _)| *id != node.id)
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let turn = self.hint_turn.fetch_add(1, Ordering::Relaxed);
        let hint = candidates[turn % candidates.len()].clone();
        node.probe.event(
            node.id,
            node.shape.group,
            ProbeEvent::SentToReplica { to: hint.0 },
        );
        Some(hint)
    }

    pub fn of_lock(&self, name: &str) -> Result<&Arc<Node>, GroupError> {
        self.serving(group_of(name, self.count()))
    }

    pub fn of_session(&self, id: SessionId) -> Result<&Arc<Node>, GroupError> {
        self.serving(group_of_session(id, self.count()))
    }

    /// The groups this member belongs to (every group, without replica subsets), which its
    /// readiness covers.
    pub fn belonging(&self) -> impl Iterator<Item = &Arc<Node>> {
        self.nodes.iter().filter(|n| n.belongs())
    }

    /// Whether this member should get client traffic: it belongs to at least one group, and
    /// every group it belongs to is ready ([`crate::node::ops::NodeStatus::readiness`]).
    pub fn readiness(&self) -> Result<(), String> {
        let mut belonging = 0;
        for node in self.belonging() {
            belonging += 1;
            node.status().readiness().map_err(|why| {
                if self.count() > 1 {
                    format!("group {}: {why}", node.shape.group)
                } else {
                    why
                }
            })?;
        }
        if belonging == 0 {
            return Err("a member of no Raft group yet".into());
        }
        Ok(())
    }

    /// The group a call without a lock name names (`CreateSession`, `List`): a cluster of one
    /// group needs none; a cluster of several requires it (`what` names the call in the
    /// error).
    pub fn named(&self, group: Option<u32>, what: &'static str) -> Result<&Arc<Node>, GroupError> {
        match group {
            Some(g) => self.get(g),
            None => self.single(what),
        }
    }

    /// Renews `keys`, each session at its group's node: a client sends one request per member,
    /// with the sessions of every group that member leads (issue #16). `authorize` checks the
    /// caller at a group's node for that group's sessions (whose they are is in its table),
    /// for each group this member serves, or once for no session if it serves none of them.
    ///
    /// A request of several groups is answered group by group: a group this member cannot
    /// renew now is refused on its own (`Renewal::refused`, with its leader hint), so that one
    /// group's election does not fail the renewal of the others. A request of one group fails
    /// as a whole, as in a cluster of one.
    pub async fn keep_alive(
        &self,
        keys: &[SessionKey],
        mut authorize: impl FnMut(&Arc<Node>, &[SessionId]) -> Result<(), GroupError>,
    ) -> Result<Renewal, GroupError> {
        let groups = self.count();
        // Each group's keys, and where each stands in the request.
        let mut by_group: BTreeMap<u32, (Vec<SessionKey>, Vec<usize>)> = BTreeMap::new();
        for (at, key) in keys.iter().enumerate() {
            let (keys, places) = by_group
                .entry(group_of_session(key.id, groups))
                .or_default();
            keys.push(*key);
            places.push(at);
        }
        // Each group's node, once: a group this member is outside of (replica subsets) has no
        // table here to check its sessions against, and is refused with a hint to one of its
        // replicas. The caller's credentials are checked in any case.
        let serving: BTreeMap<u32, Result<&Arc<Node>, ApiError>> = by_group
            .keys()
            .map(|&g| (g, self.serving(g).map_err(|e| e.error)))
            .collect();
        let mut checked = false;
        for (g, (keys, _)) in &by_group {
            if let Ok(node) = &serving[g] {
                let ids: Vec<SessionId> = keys.iter().map(|k| k.id).collect();
                authorize(node, &ids)?;
                checked = true;
            }
        }
        if !checked {
            authorize(self.first(), &[])?;
        }
        // The limit holds for the whole request, not only for each group's share of it.
        crate::node::ops::check_keepalive_len(keys.len()).map_err(GroupError::of_cluster)?;
        let renewals = by_group.iter().map(|(g, (keys, _))| {
            let node = serving[g].clone();
            async move {
                match node {
                    Ok(node) => node.keep_alive(keys).await,
                    Err(outside) => Err(outside),
                }
            }
        });
        let several = by_group.len() > 1;
        // A node answers one lease per key, in order: each goes back to its key's place (a
        // session named twice, once with a wrong secret, gets each its own answer).
        let mut renewed: Vec<Option<SessionLease>> = vec![None; keys.len()];
        let mut refused = Vec::new();
        for ((&group, (_, places)), answers) in by_group
            .iter()
            .zip(futures::future::join_all(renewals).await)
        {
            match answers {
                Ok(leases) => {
                    debug_assert_eq!(leases.len(), places.len(), "one lease per key");
                    for (&at, lease) in places.iter().zip(leases) {
                        renewed[at] = Some(lease);
                    }
                }
                Err(e) if several && e.is_unavailable() => refused.push((group, e)),
                Err(e) => return Err(GroupError::of_group(group, groups, e)),
            }
        }
        Ok(Renewal {
            leases: renewed.into_iter().flatten().collect(),
            refused,
        })
    }

    /// The one node of a one-group cluster, for the calls not yet served with several
    /// groups (`what` names the call in the error).
    pub fn single(&self, what: &'static str) -> Result<&Arc<Node>, GroupError> {
        match self.nodes.as_slice() {
            [_] => self.serving(0),
            _ => Err(GroupError::of_cluster(ApiError::NotWithGroups {
                what,
                groups: self.count(),
            })),
        }
    }

    /// A request for the lock `name` in session `session`: the lock's group, which must be
    /// the session's (a client that does not know groups made its session in group 0).
    pub fn of_lock_in(&self, name: &str, session: SessionId) -> Result<&Arc<Node>, GroupError> {
        let groups = self.count();
        let (lock, of_session) = (group_of(name, groups), group_of_session(session, groups));
        if lock != of_session {
            return Err(GroupError::of_cluster(ApiError::WrongGroup {
                name: name.to_owned(),
                lock,
                session: session.0,
                of_session,
                groups,
            }));
        }
        self.serving(lock)
    }
}

impl OtherGroups for Groups {
    /// What `identity` holds in the tables of the groups this member belongs to other than
    /// `except` (see [`Node::identity_usage`], which adds its own): the member's copies, which
    /// trail each group's leader by what is still being replicated. A group this member is
    /// outside of (replica subsets) is not counted: it has no table of it.
    fn identity_usage_besides(&self, except: u32, identity: &str) -> IdentityUsage {
        let mut usage = IdentityUsage::default();
        for node in self.belonging().filter(|n| n.shape.group != except) {
            let u = node.state.read(|t| t.identity_usage(identity));
            usage.sessions += u.sessions;
            usage.waiting += u.waiting;
            usage.delays += u.delays;
        }
        usage
    }
}
