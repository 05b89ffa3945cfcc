//! CRC-32 (IEEE 802.3, the zlib/PNG one) for durable-log records, through `crc32fast`.

/// CRC-32 of the concatenation of `parts`.
pub(crate) fn crc32(parts: &[&[u8]]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for part in parts {
        h.update(part);
    }
    h.finalize()
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_the_zlib_check_value_across_parts() {
        assert_eq!(super::crc32(&[b"1234", b"56789"]), 0xCBF4_3926);
    }
}
