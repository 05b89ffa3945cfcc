//! The on-disk encoding of every value in the log store: one format-version byte, then postcard.
//!
//! A reader refuses a version it does not know instead of misreading it, so a later format can be
//! introduced by bumping the byte and keeping a decoder for the old one.

use std::io;

use latchkey_core::versioned::{self, VersionedError};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Version of the value encoding written by this build (log entries and the vote).
/// 2: lock commands changed (an Acquire carries its wait timeout, `ExpireWaits`), so a log
/// written by version 1 is refused rather than misread.
pub const VALUE_FORMAT_VERSION: u8 = 2;

pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, io::Error> {
    versioned::encode(VALUE_FORMAT_VERSION, value)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// `what` names the value in the error ("log entry 17", "vote"), so a corrupt file is diagnosable.
pub(crate) fn decode<T: DeserializeOwned>(
    bytes: &[u8],
    what: &dyn std::fmt::Display,
) -> Result<T, io::Error> {
    let corrupt = |msg: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{what} is corrupt: {msg}"),
        )
    };
    match versioned::decode(VALUE_FORMAT_VERSION, bytes) {
        Ok((value, _)) => Ok(value),
        Err(VersionedError::Empty) => Err(corrupt("empty value".into())),
        // "format version N is not supported (this build reads M)", or postcard's message.
        Err(e) => Err(corrupt(e.to_string())),
    }
}
