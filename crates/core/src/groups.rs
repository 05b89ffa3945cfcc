//! The lock namespace split over Raft groups (issue #16): which group a lock name belongs to,
//! and which group a session id was made in.
//!
//! A cluster runs `groups` independent Raft groups, fixed when it is founded. A lock name
//! belongs to one group for life, by [`group_of`]: FNV-1a (64-bit) over the name's UTF-8
//! bytes, mixed by MurmurHash3's 64-bit finalizer (FNV's low bits alone are poor), then
//! Lamping and Veach's jump consistent hash onto `0..groups`, which moves the fewest names if
//! a cluster ever grows its group count. Every client computes it, in any language, so
//! `docs/protocol.md` gives the steps and the test vectors of [`tests`] below.
//!
//! A session lives in one group: its id is `index * groups + group`, where `index` is the log
//! index of the entry that created it in that group ([`GroupShape::session_id`]), so ids of
//! different groups never collide and `id % groups` names the group that knows the session.
//! With one group the id is the index, as before groups existed. Fencing tokens are log
//! indexes of the lock's group: they strictly increase per lock name, and tokens of
//! different groups are not comparable.

use serde::{Deserialize, Serialize};

use crate::limits;
use crate::types::SessionId;

/// One group of a node's table: which group it is, and of how many.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupShape {
    pub group: u32,
    pub groups: u32,
}

impl GroupShape {
    /// The one group of an unsharded cluster.
    pub const SINGLE: GroupShape = GroupShape {
        group: 0,
        groups: 1,
    };

    /// Group `group` of `groups`; `None` unless `group < groups <= GROUPS_MAX`.
    pub fn new(group: u32, groups: u32) -> Option<GroupShape> {
        (check_groups(groups).is_ok() && group < groups).then_some(GroupShape { group, groups })
    }

    /// The id of the session created by the entry at `index` in this group.
    pub fn session_id(self, index: u64) -> SessionId {
        let id = index
            .checked_mul(u64::from(self.groups))
            .and_then(|id| id.checked_add(u64::from(self.group)))
            .expect("log index * GROUPS_MAX fits in u64 (limits::GROUPS_MAX)");
        SessionId(id)
    }
}

impl Default for GroupShape {
    fn default() -> GroupShape {
        GroupShape::SINGLE
    }
}

/// Why a group count is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the number of groups must be between 1 and {max}, not {groups}", max = limits::GROUPS_MAX)]
pub struct BadGroups {
    pub groups: u64,
}

/// `Ok` for a group count a cluster may have: `1..=GROUPS_MAX`.
pub fn check_groups(groups: u32) -> Result<(), BadGroups> {
    if groups == 0 || groups > limits::GROUPS_MAX {
        return Err(BadGroups {
            groups: u64::from(groups),
        });
    }
    Ok(())
}

/// The group that knows the session `id`, in a cluster of `groups` groups.
pub fn group_of_session(id: SessionId, groups: u32) -> u32 {
    assert!(groups >= 1, "a cluster has at least one group");
    (id.0 % u64::from(groups)) as u32
}

/// The group of the lock `name` in a cluster of `groups` groups (see the module docs).
pub fn group_of(name: &str, groups: u32) -> u32 {
    assert!(groups >= 1, "a cluster has at least one group");
    jump(fmix64(fnv1a64(name.as_bytes())), groups)
}

/// Why a replica count is refused (`serve --replicas`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadReplicas {
    #[error("--replicas {replicas} is more than the {members} founding members")]
    MoreThanMembers { replicas: u32, members: usize },
    #[error(
        "--replicas {replicas}: a group of fewer than {min} replicas survives no member's loss",
        min = limits::REPLICAS_MIN
    )]
    TooFew { replicas: u32 },
    #[error(
        "--groups {groups} of {replicas} replicas leave some of the {members} founding members in \
         no group (each group is on consecutive members): give at least {need} groups",
        need = *members as u32 - replicas + 1
    )]
    MembersInNoGroup {
        groups: u32,
        replicas: u32,
        members: usize,
    },
}

/// `Ok` for a replica count in itself: 0 (every member in every group) or at least
/// `REPLICAS_MIN`. What a member that joins can check (it is given no founding list).
pub fn check_replica_count(replicas: u32) -> Result<(), BadReplicas> {
    if replicas != 0 && replicas < limits::REPLICAS_MIN {
        return Err(BadReplicas::TooFew { replicas });
    }
    Ok(())
}

/// `Ok` for `groups` groups of `replicas` replicas in a cluster founded by `members` members:
/// 0 (every member in every group), or `REPLICAS_MIN..=members` such that every member is in
/// some group ([`replicas_of`] places group g from the (g mod N)-th member on, so that takes
/// `groups + replicas - 1 >= members`): a member in no group would never be ready to serve.
pub fn check_replicas(replicas: u32, members: usize, groups: u32) -> Result<(), BadReplicas> {
    check_replica_count(replicas)?;
    if replicas == 0 {
        return Ok(());
    }
    if replicas as usize > members {
        return Err(BadReplicas::MoreThanMembers { replicas, members });
    }
    if (groups as usize) + (replicas as usize) - 1 < members {
        return Err(BadReplicas::MembersInNoGroup {
            groups,
            replicas,
            members,
        });
    }
    Ok(())
}

/// The members that found group `group` with `replicas` replicas (issue #16, "groups across
/// machines"), of the founding members `ids`: the one that founds and first leads it, the
/// (group mod N)-th by id (as with every member in every group), then the next `replicas - 1`
/// by id, wrapping around. So each member founds about G/N groups and replicates about
/// G·R/N, and its loss moves only the leaderships it held. `replicas` 0 or at least N: every
/// member. Placement decides only a group's founding voters; afterwards its membership is in
/// its own log and changes through it, like a cluster's.
pub fn replicas_of(group: u32, ids: impl IntoIterator<Item = u64>, replicas: u32) -> Vec<u64> {
    let mut ids: Vec<u64> = ids.into_iter().collect();
    assert!(!ids.is_empty(), "a cluster has members");
    ids.sort_unstable();
    ids.dedup();
    let n = ids.len();
    let r = if replicas == 0 {
        n
    } else {
        (replicas as usize).min(n)
    };
    let first = group as usize % n;
    (0..r).map(|i| ids[(first + i) % n]).collect()
}

pub(crate) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv1a64(bytes: &[u8]) -> u64 {
    fnv1a64_extend(FNV_OFFSET, bytes)
}

/// FNV-1a (64-bit) of what `h` hashed, then `bytes`. Also the table's request fingerprints
/// (`table.rs`, `RequestPrint`): stable across builds and platforms, unlike std's hashers.
pub(crate) fn fnv1a64_extend(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(FNV_PRIME))
}

/// MurmurHash3's 64-bit finalizer.
pub(crate) fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

/// Lamping and Veach, "A Fast, Minimal Memory, Consistent Hash Algorithm" (2014), as
/// published. Its arithmetic is one IEEE-754 double division and multiplication per step,
/// which every language computes alike.
fn jump(mut key: u64, buckets: u32) -> u32 {
    let (mut b, mut j): (i64, i64) = (-1, 0);
    while j < i64::from(buckets) {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    /// The vectors `docs/protocol.md` lists for clients in other languages.
    pub(crate) const VECTORS: &[(&str, u32, u32)] = &[
        ("", 4, 1),
        ("a", 4, 3),
        ("jobs/nightly", 8, 4),
        ("orders/42", 3, 2),
        ("Ünïcödé", 16, 14),
        ("x", 64, 36),
    ];

    #[test]
    fn the_hash_steps_match_their_published_values() {
        // FNV-1a 64 of "" is the offset basis, of "a" the published 0xaf63dc4c8601ec8c.
        assert_eq!(fnv1a64(b""), FNV_OFFSET);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fmix64(0), 0);
        // Jump hash with one bucket is always 0; key 0 stays in bucket 0 however many.
        assert_eq!(jump(12345, 1), 0);
        assert_eq!(jump(0, 1000), 0);
    }

    #[test]
    fn group_of_matches_the_protocol_docs_vectors() {
        for &(name, groups, group) in VECTORS {
            assert_eq!(group_of(name, groups), group, "{name:?} of {groups}");
        }
    }

    #[test]
    fn one_group_holds_every_name() {
        for name in ["", "a", "x/y/z", "0123456789"] {
            assert_eq!(group_of(name, 1), 0);
        }
    }

    #[test]
    fn names_spread_evenly_over_the_groups() {
        for groups in [2u32, 3, 8, 64] {
            let mut counts = vec![0u32; groups as usize];
            let n = 20_000u32;
            for i in 0..n {
                counts[group_of(&format!("lock-{i}"), groups) as usize] += 1;
            }
            let mean = f64::from(n) / f64::from(groups);
            for (g, &c) in counts.iter().enumerate() {
                let off = (f64::from(c) - mean).abs() / mean;
                assert!(off < 0.15, "group {g} of {groups}: {c} names, mean {mean}");
            }
        }
    }

    #[test]
    fn growing_the_group_count_moves_names_only_to_the_new_group() {
        // What jump hash promises, and why it is the mapping: from 4 groups to 5, a name
        // either stays or moves to group 4.
        let mut moved = 0;
        for i in 0..10_000 {
            let name = format!("n{i}");
            let (before, after) = (group_of(&name, 4), group_of(&name, 5));
            if before != after {
                assert_eq!(after, 4, "{name}");
                moved += 1;
            }
        }
        assert!((1_500..2_500).contains(&moved), "{moved} of 10000 moved");
    }

    #[test]
    fn session_ids_name_their_group_and_never_collide() {
        let groups = 5;
        let mut seen = std::collections::BTreeSet::new();
        for group in 0..groups {
            let shape = GroupShape::new(group, groups).unwrap();
            for index in 1..200 {
                let id = shape.session_id(index);
                assert_eq!(group_of_session(id, groups), group);
                assert!(seen.insert(id), "{id} made twice");
            }
        }
        assert_eq!(GroupShape::SINGLE.session_id(77), SessionId(77));
    }

    #[test]
    fn shapes_and_counts_out_of_range_are_refused() {
        assert!(GroupShape::new(0, 0).is_none());
        assert!(GroupShape::new(3, 3).is_none());
        assert!(GroupShape::new(0, limits::GROUPS_MAX + 1).is_none());
        assert!(GroupShape::new(limits::GROUPS_MAX - 1, limits::GROUPS_MAX).is_some());
        assert_eq!(check_groups(0), Err(BadGroups { groups: 0 }));
        assert!(check_groups(1).is_ok());
    }

    #[test]
    fn replicas_start_at_the_founder_and_spread_evenly() {
        let ids = [5u64, 1, 3, 9, 7, 2];
        // Sorted: 1 2 3 5 7 9. Group 4 starts at the 4th (7) and wraps.
        assert_eq!(replicas_of(4, ids, 3), vec![7, 9, 1]);
        assert_eq!(replicas_of(0, ids, 3), vec![1, 2, 3]);
        // 0 and N mean every member, the founder first.
        assert_eq!(replicas_of(1, ids, 0), vec![2, 3, 5, 7, 9, 1]);
        assert_eq!(replicas_of(1, ids, 6), replicas_of(1, ids, 0));
        // 12 groups of 3 on 6 members: each founds 2 and replicates 6.
        let (mut founds, mut holds) = (BTreeMap::new(), BTreeMap::new());
        for g in 0..12 {
            let r = replicas_of(g, ids, 3);
            assert_eq!(r.len(), 3);
            assert_eq!(
                r.iter().collect::<BTreeSet<_>>().len(),
                3,
                "group {g}: {r:?}"
            );
            *founds.entry(r[0]).or_insert(0) += 1;
            for m in r {
                *holds.entry(m).or_insert(0) += 1;
            }
        }
        assert!(founds.values().all(|&c| c == 2), "{founds:?}");
        assert!(holds.values().all(|&c| c == 6), "{holds:?}");
    }

    #[test]
    fn replica_counts_out_of_range_are_refused() {
        assert!(check_replicas(0, 1, 1).is_ok());
        assert!(check_replicas(3, 6, 6).is_ok());
        assert!(check_replicas(6, 6, 1).is_ok());
        assert_eq!(
            check_replicas(7, 6, 6),
            Err(BadReplicas::MoreThanMembers {
                replicas: 7,
                members: 6
            })
        );
        assert_eq!(
            check_replicas(1, 6, 6),
            Err(BadReplicas::TooFew { replicas: 1 })
        );
        assert_eq!(
            check_replica_count(2),
            Err(BadReplicas::TooFew { replicas: 2 })
        );
        assert!(check_replica_count(0).is_ok() && check_replica_count(3).is_ok());
        // Four groups of three on seven members: groups 0-3 start at members 0-3 and reach
        // member 5 at most; member 6 would be in none. Five groups reach it.
        assert_eq!(
            check_replicas(3, 7, 4),
            Err(BadReplicas::MembersInNoGroup {
                groups: 4,
                replicas: 3,
                members: 7
            })
        );
        assert!(check_replicas(3, 7, 5).is_ok());
        for (members, groups) in [(7u64, 5u32), (6, 4), (9, 24)] {
            let placed: BTreeSet<u64> = (0..groups)
                .flat_map(|g| replicas_of(g, 1..=members, 3))
                .collect();
            assert_eq!(
                placed.len() as u64,
                members,
                "{members} members, {groups} groups"
            );
        }
    }

    #[test]
    fn the_largest_index_times_the_most_groups_fits() {
        let shape = GroupShape::new(limits::GROUPS_MAX - 1, limits::GROUPS_MAX).unwrap();
        shape.session_id(limits::LOG_INDEX_MAX_WITH_GROUPS);
    }
}
