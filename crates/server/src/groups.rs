//! The Raft groups one member runs (issue #16), and which of them a request goes to.
//!
//! A member of a cluster of `groups` groups runs one [`Node`] per group, each with its own
//! log, state machine, leader, leases and waiters. A lock name belongs to the group
//! `latchkey_core::group_of` names, a session to the group its id names (`id % groups`); a
//! request about a lock or a session is answered by that group's node, and every error it
//! gives names the group (`latchkey-group` metadata) so that a client routes its next request
//! for that group to the leader hint. With one group, everything is group 0's, as before
//! groups existed.

use std::sync::Arc;

use latchkey_core::{group_of, group_of_session, SessionId};

use crate::error::ApiError;
use crate::node::Node;

pub struct Groups {
    nodes: Vec<Arc<Node>>,
}

impl Groups {
    /// `nodes[g]` must be group `g`'s node, one per group.
    pub fn new(nodes: Vec<Arc<Node>>) -> Arc<Groups> {
        assert!(!nodes.is_empty(), "a member runs at least one group");
        for (g, node) in nodes.iter().enumerate() {
            assert_eq!(node.shape.group as usize, g, "group {g}'s node");
            assert_eq!(node.shape.groups as usize, nodes.len(), "group {g}'s count");
        }
        Arc::new(Groups { nodes })
    }

    pub fn count(&self) -> u32 {
        self.nodes.len() as u32
    }

    /// Group 0's node: the member's own settings (`config`), metrics and shutdown, which every
    /// group's node shares.
    pub fn first(&self) -> &Arc<Node> {
        &self.nodes[0]
    }

    pub fn all(&self) -> &[Arc<Node>] {
        &self.nodes
    }

    /// Group `group`'s node, or the error a request naming a group this cluster lacks gets.
    pub fn get(&self, group: u32) -> Result<&Arc<Node>, ApiError> {
        self.nodes.get(group as usize).ok_or_else(|| {
            ApiError::Invalid(format!(
                "group {group}: this cluster has {} Raft groups",
                self.nodes.len()
            ))
        })
    }

    pub fn of_lock(&self, name: &str) -> &Arc<Node> {
        &self.nodes[group_of(name, self.count()) as usize]
    }

    pub fn of_session(&self, id: SessionId) -> &Arc<Node> {
        &self.nodes[group_of_session(id, self.count()) as usize]
    }

    /// The one node of a one-group cluster, for the calls not yet served with several
    /// groups (`what` names the call in the error).
    pub fn single(&self, what: &'static str) -> Result<&Arc<Node>, ApiError> {
        match self.nodes.as_slice() {
            [node] => Ok(node),
            _ => Err(ApiError::NotWithGroups {
                what,
                groups: self.count(),
            }),
        }
    }

    /// A request for the lock `name` in session `session`: the lock's group, which must be
    /// the session's (a client that does not know groups made its session in group 0).
    pub fn of_lock_in(&self, name: &str, session: SessionId) -> Result<&Arc<Node>, ApiError> {
        let groups = self.count();
        let (lock, of_session) = (group_of(name, groups), group_of_session(session, groups));
        if lock != of_session {
            return Err(ApiError::WrongGroup {
                name: name.to_owned(),
                lock,
                session: session.0,
                of_session,
                groups,
            });
        }
        Ok(&self.nodes[lock as usize])
    }
}
