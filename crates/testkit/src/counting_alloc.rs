//! A global allocator that counts the bytes currently allocated, for the memory budget tests
//! (`crates/core/tests/memory.rs`, `crates/server/tests/memory.rs`). It counts bytes requested,
//! so a count does not depend on the allocator or the machine. A test binary installs it with
//! `#[global_allocator] static ALLOCATOR: Counting = Counting;` and reads [`live_bytes`]; it
//! should hold that binary's one test, so that no other test allocates while it counts.
//!
//! The core crate's test compiles this file by path (`#[path]`): the core does not depend on
//! the testkit, which depends on the server.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// Bytes currently allocated through [`Counting`].
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

/// The system allocator, counting.
pub struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Bytes currently allocated through [`Counting`], as requested.
pub fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}
