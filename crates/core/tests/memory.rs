//! What a held lock costs in memory, counted by the allocator (bytes requested, so the count is
//! the same on every run and machine; the allocator's own rounding comes on top).
//!
//! Issue #11 asks for 1,000,000 held locks under 300 MB per node. The table is most of that, so
//! it gets about 200 B per held lock of a node's memory, leaving the rest to the server's
//! per-session state and the process itself. Rounding by the allocator adds about a fifth to the
//! bytes counted here (156 counted were 184 B of resident memory per lock under mimalloc, 1M
//! locks), hence 170 counted. This binary has one test, so no other test allocates while it
//! counts.

#[path = "../../testkit/src/counting_alloc.rs"]
mod counting_alloc;

use counting_alloc::{live_bytes, Counting};
use latchkey_core::*;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes per held lock that the table may use (see the module comment).
const HELD_LOCK_BYTES_MAX: usize = 170;

/// Regression test for issue #11's "hold" target: the table kept two heap copies of every held
/// lock's name (one in `locks`, one in the holder session's `held`) and an empty queue inline in
/// every lock, about 330 B per held lock.
#[test]
fn a_held_lock_costs_at_most_170_bytes_in_the_table() {
    // The shape of `latchkey bench --workload hold`: each session holds many locks, with
    // path-like names. 1,000 per session stays under `LOCKS_PER_SESSION_MAX`; every acquire
    // also leaves an outcome, bounded per session, so the sessions' share is counted too.
    const SESSIONS: u64 = 2;
    const LOCKS_PER_SESSION: u64 = 1_000;
    const _: () = assert!(LOCKS_PER_SESSION as usize <= limits::LOCKS_PER_SESSION_MAX);
    let mut t = LockTable::new();
    let mut index = 0;
    let mut keys = Vec::new();
    for secret in 0..SESSIONS {
        index += 1;
        let op = Op::CreateSession {
            ttl_ms: limits::SESSION_TTL_MS_DEFAULT,
            secret,
        };
        match t.apply(index, &Command { now_ms: 0, op }).outcome {
            Outcome::SessionCreated { id, .. } => keys.push(SessionKey { id, secret }),
            o => panic!("{o:?}"),
        }
    }
    // Names are made before counting starts, and the commands are dropped only after it ends,
    // so that neither is counted as the table's.
    let n = SESSIONS * LOCKS_PER_SESSION;
    let cmds: Vec<Command> = (0..n)
        .map(|i| Command {
            now_ms: 0,
            op: Op::Acquire {
                session: keys[(i % SESSIONS) as usize],
                seq: i / SESSIONS + 1,
                name: format!("bench/hold/{i:08}"),
                wait_ms: 0,
            },
        })
        .collect();
    let mut applied = Vec::with_capacity(cmds.len());
    let before = live_bytes();
    for cmd in &cmds {
        index += 1;
        applied.push(t.apply(index, cmd).outcome);
    }
    let after = live_bytes();
    assert!(applied.iter().all(|o| matches!(o, Outcome::Granted { .. })));
    assert_eq!(t.lock_count(), n as usize);
    let per_lock = (after - before) as usize / n as usize;
    println!("{per_lock} B per held lock");
    assert!(
        per_lock <= HELD_LOCK_BYTES_MAX,
        "{per_lock} B per held lock, over {HELD_LOCK_BYTES_MAX}"
    );
}
