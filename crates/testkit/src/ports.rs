//! [`free_port`]: a loopback port for a server a test starts, picked so that no other test's
//! connections take it in the meantime.
//!
//! A port the kernel picks (`bind` to port 0) comes from the ephemeral range
//! (`/proc/sys/net/ipv4/ip_local_port_range`, 32768..=60999 by default), and so does the local
//! port of every outgoing connection: between the test releasing such a port and the server
//! binding it, any process's `connect` may take it (CI saw `cannot serve metrics on
//! 127.0.0.1:41971: Address already in use`). A port below that range is taken only by a
//! `bind` naming it, which among tests means another test's `free_port`: a random pick out of
//! [`RANGE`], checked free, makes that one in thousands.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};

/// Ports tests pick from: below the kernel's ephemeral range, and below the ports the
/// walkthrough tests use (`PREFIX` followed by a digit, 20000 and up).
pub const RANGE: std::ops::Range<u16> = 10_000..20_000;

/// How many ports [`free_port`] tries before giving up.
const TRIES: u64 = 1_000;

/// A loopback port in [`RANGE`] that nothing listened on a moment ago.
pub fn free_port() -> u16 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut state = (std::process::id() as u64) << 32 ^ nanos ^ call.wrapping_mul(0x9E37_79B9);
    let span = u64::from(RANGE.end - RANGE.start);
    for _ in 0..TRIES {
        // splitmix64: a well-spread sequence from any seed.
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let port = RANGE.start + (z % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {RANGE:?} after {TRIES} tries");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_are_in_range_bindable_and_spread() {
        let picks: Vec<u16> = (0..50).map(|_| free_port()).collect();
        assert!(picks.iter().all(|p| RANGE.contains(p)), "{picks:?}");
        let mut distinct = picks.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(
            distinct.len() > 40,
            "50 picks gave {} ports",
            distinct.len()
        );
        TcpListener::bind(("127.0.0.1", picks[0])).expect("a pick is bindable");
    }
}
