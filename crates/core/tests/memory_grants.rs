//! What one more holder of a name with several holders (issue #32: a reader, a permit) costs in
//! memory, counted by the allocator as `tests/memory.rs` counts a held mutex: the table charges
//! `limits::TABLE_GRANT_BYTES` for it. Counted for sessions that already hold a lock (and so
//! already have their set of holds and their first remembered outcome, which every session
//! allocates on its first grant of anything, mutexes included, and which its own charge covers).
//! This binary has one test, so no other test allocates while it counts.

#[path = "../../testkit/src/counting_alloc.rs"]
mod counting_alloc;

use counting_alloc::{live_bytes, Counting};
use latchkey_core::*;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn a_permit_holder_costs_at_most_its_charge_in_the_table() {
    const N: u64 = 1_000;
    let mut t = LockTable::new();
    let mut index = 0;
    let mut keys = Vec::new();
    for secret in 0..N {
        index += 1;
        let op = Op::CreateSession {
            ttl_ms: limits::SESSION_TTL_MS_DEFAULT,
            secret,
        };
        let key = match t.apply(index, &Command { now_ms: 0, op }).outcome {
            Outcome::SessionCreated { id, .. } => SessionKey { id, secret },
            o => panic!("{o:?}"),
        };
        keys.push(key);
        index += 1;
        let op = Op::Acquire {
            session: key,
            seq: 1,
            name: format!("own/{secret}"),
            wait_ms: 0,
        };
        t.apply(index, &Command { now_ms: 0, op });
    }
    // The commands are made before counting starts and dropped after it ends.
    let cmds: Vec<Command> = keys
        .iter()
        .map(|key| Command {
            now_ms: 0,
            op: Op::AcquireWith {
                session: *key,
                seq: 2,
                name: "jobs".into(),
                wait_ms: 0,
                mode: Mode::Permits(limits::HOLDERS_PER_LOCK_MAX as u32),
            },
        })
        .collect();
    let before = live_bytes();
    for cmd in &cmds {
        index += 1;
        let o = t.apply(index, cmd).outcome;
        assert!(matches!(o, Outcome::Granted { .. }), "{o:?}");
    }
    let after = live_bytes();
    let per_holder = (after - before) as usize / N as usize;
    println!("{per_holder} B per permit holder");
    assert!(
        per_holder <= limits::TABLE_GRANT_BYTES,
        "{per_holder} B per permit holder, over its charge {}",
        limits::TABLE_GRANT_BYTES
    );
}
