//! [`MemoryGate`]: the highest token per lock, in memory.
//!
//! Right for a resource whose data lives in the same process and dies with it: after a restart
//! both the data and the limits are gone together. If the data survives a restart (a file, a
//! database), the limits must too: use [`DurableGate`](crate::DurableGate).

use crate::gate::{Admitted, FenceError, FenceGate, Slots};
use crate::limits;

/// An in-memory, thread-safe [`FenceGate`]. Admissions of different locks run in parallel;
/// those of one lock run one at a time (see [`crate::gate`]).
pub struct MemoryGate {
    slots: Slots,
}

impl MemoryGate {
    /// A gate tracking up to [`limits::GATE_LOCKS_DEFAULT`] lock names.
    pub fn new() -> Self {
        Self::with_locks_max(limits::GATE_LOCKS_DEFAULT)
    }

    /// A gate tracking up to `locks_max` lock names (clamped to `1..=`[`limits::GATE_LOCKS_MAX`]).
    pub fn with_locks_max(locks_max: usize) -> Self {
        MemoryGate {
            slots: Slots::new(locks_max.clamp(1, limits::GATE_LOCKS_MAX)),
        }
    }
}

impl Default for MemoryGate {
    fn default() -> Self {
        Self::new()
    }
}

impl FenceGate for MemoryGate {
    fn admit_then<T>(
        &self,
        lock: &str,
        token: u64,
        f: impl FnOnce() -> T,
    ) -> Result<T, FenceError> {
        let (_, out) = self.slots.admit(lock, token, |_| Ok(()), f)?;
        Ok(out)
    }

    fn check(&self, lock: &str, token: u64) -> Result<Admitted, FenceError> {
        let (admitted, ()) = self.slots.admit(lock, token, |_| Ok(()), || ())?;
        Ok(admitted)
    }

    fn highest(&self, lock: &str) -> Option<u64> {
        self.slots.highest(lock)
    }
}
