//! The framing every versioned encoding in latchkey shares: one format-version byte, then the
//! value in postcard. Used by the lock table's snapshot encoding ([`crate::codec`]), the log
//! store's values, the snapshot file's header and the peer payloads; each keeps its own version
//! constant and error type. (`latchkey-fence` has its own record format and no dependency on
//! this crate.)
//!
//! A reader refuses a version it does not know rather than misreading it, so a later format can
//! be introduced by bumping the byte and keeping a decoder for the old one. Pure: bytes in,
//! bytes out.

use serde::{Deserialize, Serialize};

/// Why bytes could not be read as a version's encoding.
#[derive(Debug, thiserror::Error)]
pub enum VersionedError {
    #[error("empty")]
    Empty,
    #[error("format version {found} is not supported (this build reads {expected})")]
    UnknownVersion { found: u8, expected: u8 },
    #[error("{0}")]
    Corrupt(#[from] postcard::Error),
}

/// `version`, then `value` in postcard. Fails only for a value postcard cannot represent (a
/// sequence of unknown length); serializing to memory does not fail otherwise.
pub fn encode<T: Serialize + ?Sized>(version: u8, value: &T) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_extend(value, vec![version])
}

/// The bytes after the version byte, if it is `version`.
pub fn strip_version(version: u8, bytes: &[u8]) -> Result<&[u8], VersionedError> {
    match bytes.split_first() {
        None => Err(VersionedError::Empty),
        Some((&v, rest)) if v == version => Ok(rest),
        Some((&found, _)) => Err(VersionedError::UnknownVersion {
            found,
            expected: version,
        }),
    }
}

/// The value after the version byte, and the bytes after the value (a reader that wants the
/// value to end the input checks they are empty).
pub fn decode<'a, T: Deserialize<'a>>(
    version: u8,
    bytes: &'a [u8],
) -> Result<(T, &'a [u8]), VersionedError> {
    Ok(postcard::take_from_bytes(strip_version(version, bytes)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Value {
        name: String,
        token: u64,
    }

    fn value() -> Value {
        Value {
            name: "lock-a".into(),
            token: 1 << 40,
        }
    }

    #[test]
    fn encoding_is_the_version_byte_then_postcard() {
        // The on-disk and on-wire bytes of every codec that moved onto this helper.
        let mut expected = vec![7];
        expected.extend(postcard::to_stdvec(&value()).unwrap());
        assert_eq!(encode(7, &value()).unwrap(), expected);
    }

    #[test]
    fn decode_returns_the_value_and_what_follows_it() {
        let mut bytes = encode(7, &value()).unwrap();
        bytes.extend([1, 2]);
        let (decoded, rest): (Value, _) = decode(7, &bytes).unwrap();
        assert_eq!((decoded, rest), (value(), &[1u8, 2][..]));
    }

    #[test]
    fn decode_refuses_another_version_and_empty_input() {
        let bytes = encode(7, &value()).unwrap();
        assert!(matches!(
            decode::<Value>(8, &bytes),
            Err(VersionedError::UnknownVersion {
                found: 7,
                expected: 8
            })
        ));
        assert!(matches!(
            decode::<Value>(7, &[]),
            Err(VersionedError::Empty)
        ));
        assert!(matches!(
            decode::<Value>(7, &bytes[..3]),
            Err(VersionedError::Corrupt(_))
        ));
    }
}
