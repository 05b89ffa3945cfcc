//! Values that must exist in two crates. The fence crate depends on nothing of latchkey (a
//! resource fences writes without the lock service's code), so it keeps its own copies of the
//! header names and the lock-name bound; these tests fail if a copy drifts from the original.

/// A holder sends the fencing headers the client names; a resource reads the fence crate's.
#[test]
fn the_fencing_headers_are_the_fence_crates() {
    assert_eq!(latchkey_client::TOKEN_HEADER, latchkey_fence::TOKEN_HEADER);
    assert_eq!(latchkey_client::LOCK_HEADER, latchkey_fence::LOCK_HEADER);
}

/// Every name the lock service grants must be one a gate can fence.
#[test]
fn the_lock_name_bound_is_the_fence_crates() {
    assert_eq!(
        latchkey_core::limits::LOCK_NAME_BYTES_MAX,
        latchkey_fence::limits::LOCK_NAME_BYTES_MAX
    );
}
