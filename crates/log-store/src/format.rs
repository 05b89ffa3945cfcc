//! The bytes of a segment file, and nothing else: encoding, decoding and the torn-tail rule.
//! Pure (no I/O), so every rule here is tested on byte buffers.
//!
//! A segment file `<dir>/<number:020>.seg`:
//! - header, [`HEADER_BYTES`]: [`SEGMENT_MAGIC`] (the last byte is the format version), the
//!   segment number (u64 LE), the CRC-32 of those 16 bytes (u32 LE);
//! - frames, each `len: u32 LE | crc: u32 LE | kind: u8 | body`, where `len` counts kind and
//!   body and `crc` is the CRC-32 of the `len` bytes followed by kind and body (so a damaged
//!   length cannot pass for a good one). The first frame of every segment is a
//!   [`FRAME_CHECKPOINT`], every later one a [`FRAME_BATCH`].
//! - A frame's body is a sequence of records framed the same way (`len | crc | kind | body`),
//!   of the kinds `REC_*` below ([`Record`]).
//!
//! Why records inside a frame: the writer writes a whole group commit with one `write` and one
//! `fdatasync`. A crash during that write may persist any subset of its pages, so valid records
//! of the torn batch may follow a damaged one; the frame's checksum covers the whole batch, so
//! the torn batch is recognised as one damaged frame at the tail. A damaged frame *followed by a
//! valid frame* cannot come from a crash (nothing is written after a batch before its fsync
//! returned) and is corruption. The records keep their own checksum so that one entry read back
//! alone with a positioned read is verified too.

use std::ops::Range;

/// First bytes of a segment file; the last byte is the format version.
pub const SEGMENT_MAGIC: [u8; 8] = *b"LKRLOG\x00\x01";
/// Magic (8) + segment number (8) + crc (4).
pub const HEADER_BYTES: usize = 20;
/// len (4) + crc (4) + kind (1).
pub(crate) const FRAME_HEADER_BYTES: usize = 9;

/// A frame holding the records of one group commit.
pub(crate) const FRAME_BATCH: u8 = 0x10;
/// The first frame of a segment: the vote, committed log id, purge point and every meta key
/// at the time the segment was started.
pub(crate) const FRAME_CHECKPOINT: u8 = 0x11;

const REC_ENTRY: u8 = 1;
const REC_VOTE: u8 = 2;
const REC_COMMITTED: u8 = 3;
const REC_TRUNCATE: u8 = 4;
const REC_PURGE: u8 = 5;
const REC_META: u8 = 6;
const REC_GROUP: u8 = 7;

/// One change to the log's state, as stored. Values (`bytes`, `last_purged`, ...) are in the
/// versioned encoding of `codec`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Record<'a> {
    /// The encoded entry at `index`.
    Entry {
        index: u64,
        bytes: &'a [u8],
    },
    Vote(&'a [u8]),
    /// The encoded `Option<LogId>` of `save_committed`.
    Committed(&'a [u8]),
    /// Entries at and after `from` are removed.
    Truncate {
        from: u64,
    },
    /// Entries up to and including `upto` are removed; `last_purged` is the encoded log id.
    Purge {
        upto: u64,
        last_purged: &'a [u8],
    },
    /// An application key (the server's cluster record, ...).
    Meta {
        key: &'a str,
        value: &'a [u8],
    },
    /// The records after it in the same frame are of this Raft group (issue #16: one log
    /// shared by a member's groups). Every frame starts in group 0, so a log of one group
    /// never holds this record, and its bytes are those of the build before groups shared it.
    Group(u32),
}

pub(crate) fn crc32(parts: &[&[u8]]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for part in parts {
        h.update(part);
    }
    h.finalize()
}

pub(crate) fn segment_header(number: u64) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[..8].copy_from_slice(&SEGMENT_MAGIC);
    h[8..16].copy_from_slice(&number.to_le_bytes());
    let crc = crc32(&[&h[..16]]);
    h[16..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Starts a frame (or record) of `kind` at the end of `buf`; [`end_frame`] fills in its header.
pub(crate) fn begin_frame(buf: &mut Vec<u8>, kind: u8) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; FRAME_HEADER_BYTES]);
    buf[start + 8] = kind;
    start
}

/// Fills in the length and checksum of the frame that [`begin_frame`] started at `start`.
/// Fails if it is longer than a `u32` length can say.
pub(crate) fn end_frame(buf: &mut [u8], start: usize) -> Result<(), String> {
    let len = buf.len() - start - (FRAME_HEADER_BYTES - 1);
    let len = u32::try_from(len).map_err(|_| format!("a log frame of {len} bytes is too long"))?;
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32(&[&buf[start..start + 4], &buf[start + 8..]]);
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Appends `record` (its own `len | crc | kind | body`) to `buf`; returns where it starts.
pub(crate) fn encode_record(buf: &mut Vec<u8>, record: &Record<'_>) -> Result<usize, String> {
    let kind = match record {
        Record::Entry { .. } => REC_ENTRY,
        Record::Vote(_) => REC_VOTE,
        Record::Committed(_) => REC_COMMITTED,
        Record::Truncate { .. } => REC_TRUNCATE,
        Record::Purge { .. } => REC_PURGE,
        Record::Meta { .. } => REC_META,
        Record::Group(_) => REC_GROUP,
    };
    if let Record::Meta { key, .. } = record {
        if u16::try_from(key.len()).is_err() {
            return Err(format!("meta key of {} bytes is too long", key.len()));
        }
    }
    let start = begin_frame(buf, kind);
    match record {
        Record::Entry { index, bytes } => {
            buf.extend_from_slice(&index.to_le_bytes());
            buf.extend_from_slice(bytes);
        }
        Record::Vote(bytes) | Record::Committed(bytes) => buf.extend_from_slice(bytes),
        Record::Truncate { from } => buf.extend_from_slice(&from.to_le_bytes()),
        Record::Group(group) => buf.extend_from_slice(&group.to_le_bytes()),
        Record::Purge { upto, last_purged } => {
            buf.extend_from_slice(&upto.to_le_bytes());
            buf.extend_from_slice(last_purged);
        }
        Record::Meta { key, value } => {
            let key_len = u16::try_from(key.len()).expect("checked above");
            buf.extend_from_slice(&key_len.to_le_bytes());
            buf.extend_from_slice(key.as_bytes());
            buf.extend_from_slice(value);
        }
    }
    end_frame(buf, start)?;
    Ok(start)
}

/// A frame that passed its checksum: `body` is its range in the buffer it was read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Frame {
    pub(crate) kind: u8,
    pub(crate) body: Range<usize>,
}

/// The frame (or record) starting at `off`, if it is complete and its checksum holds.
pub(crate) fn frame_at(buf: &[u8], off: usize) -> Result<Frame, &'static str> {
    let Some(header) = buf.get(off..off + FRAME_HEADER_BYTES) else {
        return Err("incomplete frame header");
    };
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if len == 0 {
        return Err("frame length is zero");
    }
    let end = (off + FRAME_HEADER_BYTES - 1)
        .checked_add(len)
        .ok_or("frame length out of range")?;
    if end > buf.len() {
        return Err("frame runs past the end of the file");
    }
    if crc32(&[&header[..4], &buf[off + 8..end]]) != crc {
        return Err("checksum mismatch");
    }
    Ok(Frame {
        kind: header[8],
        body: off + FRAME_HEADER_BYTES..end,
    })
}

fn u64_at(bytes: &[u8]) -> Result<(u64, &[u8]), String> {
    if bytes.len() < 8 {
        return Err("record too short for its index".into());
    }
    let (head, rest) = bytes.split_at(8);
    Ok((u64::from_le_bytes(head.try_into().expect("8 bytes")), rest))
}

/// Decodes one record whose frame passed its checksum.
pub(crate) fn decode_record<'a>(kind: u8, body: &'a [u8]) -> Result<Record<'a>, String> {
    Ok(match kind {
        REC_ENTRY => {
            let (index, bytes) = u64_at(body)?;
            Record::Entry { index, bytes }
        }
        REC_VOTE => Record::Vote(body),
        REC_COMMITTED => Record::Committed(body),
        REC_TRUNCATE => {
            let (from, rest) = u64_at(body)?;
            if !rest.is_empty() {
                return Err("truncate record has trailing bytes".into());
            }
            Record::Truncate { from }
        }
        REC_PURGE => {
            let (upto, last_purged) = u64_at(body)?;
            Record::Purge { upto, last_purged }
        }
        REC_META => {
            if body.len() < 2 {
                return Err("meta record too short".into());
            }
            let key_len = u16::from_le_bytes([body[0], body[1]]) as usize;
            let key = body
                .get(2..2 + key_len)
                .ok_or("meta key runs past its record")?;
            let key = std::str::from_utf8(key).map_err(|_| "meta key is not UTF-8")?;
            Record::Meta {
                key,
                value: &body[2 + key_len..],
            }
        }
        REC_GROUP => {
            let bytes: [u8; 4] = body
                .try_into()
                .map_err(|_| format!("group record of {} bytes, not 4", body.len()))?;
            Record::Group(u32::from_le_bytes(bytes))
        }
        other => return Err(format!("unknown record kind {other}")),
    })
}

/// The records of a frame body, each with its offset in `buf`.
pub(crate) fn records(
    buf: &[u8],
    body: Range<usize>,
) -> impl Iterator<Item = Result<(usize, Range<usize>, Record<'_>), String>> {
    let end = body.end;
    let mut off = body.start;
    let frames = &buf[..end];
    std::iter::from_fn(move || {
        if off >= end {
            return None;
        }
        let at = off;
        let result = frame_at(frames, at)
            .map_err(|e| format!("record at byte {at}: {e}"))
            .and_then(|f| {
                off = f.body.end;
                let record = decode_record(f.kind, &buf[f.body.clone()])
                    .map_err(|e| format!("record at byte {at}: {e}"))?;
                Ok((at, at..f.body.end, record))
            });
        if result.is_err() {
            off = end;
        }
        Some(result)
    })
}

/// Why a segment cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SegmentError {
    BadHeader(&'static str),
    /// Damage that a crash cannot explain: at `offset`, with valid data after it, or in a
    /// segment that is not the last.
    Corrupt {
        offset: usize,
        reason: &'static str,
    },
}

/// The frames of one segment file.
#[derive(Debug)]
pub(crate) struct Parsed {
    /// Offset of each good frame with its kind and body range.
    pub(crate) frames: Vec<Frame>,
    /// Bytes up to the end of the last good frame; anything after is a torn tail (only ever in
    /// the last segment).
    pub(crate) valid_len: usize,
}

/// Splits a segment file into frames. In the last segment (`last`), a damaged frame with no
/// good frame anywhere after it is a torn group commit and ends the segment; anything else
/// damaged is [`SegmentError::Corrupt`].
pub(crate) fn parse_segment(buf: &[u8], number: u64, last: bool) -> Result<Parsed, SegmentError> {
    let header = buf
        .get(..HEADER_BYTES)
        .ok_or(SegmentError::BadHeader("shorter than a segment header"))?;
    if header[..8] != SEGMENT_MAGIC {
        return Err(SegmentError::BadHeader(
            "not a latchkey log segment (magic)",
        ));
    }
    if header != segment_header(number) {
        return Err(SegmentError::BadHeader(
            "header checksum or segment number does not match the file name",
        ));
    }
    let mut frames = Vec::new();
    let mut off = HEADER_BYTES;
    while off < buf.len() {
        match frame_at(buf, off) {
            Ok(frame) => {
                off = frame.body.end;
                frames.push(frame);
            }
            Err(_) if last && is_torn_tail(buf, off) => break,
            Err(reason) => {
                return Err(SegmentError::Corrupt {
                    offset: off,
                    reason,
                })
            }
        }
    }
    Ok(Parsed {
        frames,
        valid_len: off,
    })
}

/// Whether damage at `off` can be a torn last write: no good frame starts after it. (A frame's
/// bytes inside the torn write are records, not frames, so they do not count.)
fn is_torn_tail(buf: &[u8], off: usize) -> bool {
    let frame_kind = |p: usize| {
        buf.get(p + FRAME_HEADER_BYTES - 1)
            .is_some_and(|&k| k == FRAME_BATCH || k == FRAME_CHECKPOINT)
    };
    // The kind byte first: most offsets fail there, before a checksum is computed.
    !(off + 1..buf.len()).any(|p| frame_kind(p) && frame_at(buf, p).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, records: &[Record<'_>]) -> Vec<u8> {
        let mut buf = Vec::new();
        let start = begin_frame(&mut buf, kind);
        for r in records {
            encode_record(&mut buf, r).unwrap();
        }
        end_frame(&mut buf, start).unwrap();
        buf
    }

    fn segment(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut buf = segment_header(7).to_vec();
        for f in frames {
            buf.extend_from_slice(f);
        }
        buf
    }

    #[test]
    fn every_record_kind_round_trips() {
        let all = [
            Record::Entry {
                index: 42,
                bytes: b"entry",
            },
            Record::Vote(b"vote"),
            Record::Committed(b""),
            Record::Truncate { from: 9 },
            Record::Purge {
                upto: 3,
                last_purged: b"lp",
            },
            Record::Meta {
                key: "cluster",
                value: b"c1",
            },
            Record::Group(u32::MAX),
        ];
        let buf = segment(&[frame(FRAME_CHECKPOINT, &[]), frame(FRAME_BATCH, &all)]);
        let parsed = parse_segment(&buf, 7, false).unwrap();
        assert_eq!(parsed.valid_len, buf.len());
        assert_eq!(parsed.frames.len(), 2);
        let got: Vec<Record<'_>> = records(&buf, parsed.frames[1].body.clone())
            .map(|r| r.unwrap().2)
            .collect();
        assert_eq!(got, all);
    }

    #[test]
    fn a_group_record_of_another_length_is_refused() {
        for body in [&[1u8, 0, 0][..], &[1, 0, 0, 0, 0]] {
            assert!(decode_record(REC_GROUP, body).is_err(), "{body:?}");
        }
        assert_eq!(
            decode_record(REC_GROUP, &[3, 0, 0, 0]),
            Ok(Record::Group(3))
        );
    }

    #[test]
    fn a_header_of_another_segment_or_format_is_refused() {
        let buf = segment(&[frame(FRAME_CHECKPOINT, &[])]);
        assert!(matches!(
            parse_segment(&buf, 8, true),
            Err(SegmentError::BadHeader(_))
        ));
        let mut other = buf.clone();
        other[7] = 2;
        assert!(matches!(
            parse_segment(&other, 7, true),
            Err(SegmentError::BadHeader(_))
        ));
        assert!(matches!(
            parse_segment(&buf[..10], 7, true),
            Err(SegmentError::BadHeader(_))
        ));
    }

    /// A batch frame of entries 1 and 2.
    fn two_entry_batch() -> Vec<u8> {
        let entries = [
            Record::Entry {
                index: 1,
                bytes: b"one",
            },
            Record::Entry {
                index: 2,
                bytes: b"two",
            },
        ];
        frame(FRAME_BATCH, &entries)
    }

    #[test]
    fn every_cut_of_the_last_frame_is_a_torn_tail_only_in_the_last_segment() {
        let good = segment(&[frame(FRAME_CHECKPOINT, &[])]);
        let last = two_entry_batch();
        let mut full = good.clone();
        full.extend_from_slice(&last);
        for cut in good.len() + 1..full.len() {
            let parsed = parse_segment(&full[..cut], 7, true).expect("torn tail");
            assert_eq!(parsed.valid_len, good.len(), "cut at {cut}");
            assert_eq!(parsed.frames.len(), 1);
            assert!(matches!(
                parse_segment(&full[..cut], 7, false),
                Err(SegmentError::Corrupt { offset, .. }) if offset == good.len()
            ));
        }
    }

    /// A crash may persist the later pages of a batch but not its first: the batch's records
    /// after the damage are still only part of the torn batch, not valid data after it.
    #[test]
    fn valid_records_inside_a_torn_batch_do_not_make_it_corruption() {
        let good = segment(&[frame(FRAME_CHECKPOINT, &[])]);
        let mut buf = good.clone();
        buf.extend_from_slice(&two_entry_batch());
        buf[good.len() + 2] ^= 0xFF; // the frame's length
        buf[good.len() + FRAME_HEADER_BYTES + 2] ^= 0xFF; // and the first record
        let parsed = parse_segment(&buf, 7, true).expect("torn tail");
        assert_eq!(parsed.valid_len, good.len());
    }

    #[test]
    fn damage_followed_by_a_valid_frame_is_corruption() {
        let first = segment(&[frame(FRAME_CHECKPOINT, &[])]);
        let batch = frame(FRAME_BATCH, &[Record::Vote(b"v")]);
        let mut buf = first.clone();
        buf.extend_from_slice(&batch);
        buf.extend_from_slice(&batch);
        buf[first.len() + FRAME_HEADER_BYTES + 3] ^= 0x01;
        assert_eq!(
            parse_segment(&buf, 7, true).err(),
            Some(SegmentError::Corrupt {
                offset: first.len(),
                reason: "checksum mismatch"
            })
        );
    }

    #[test]
    fn zeros_or_noise_after_the_last_frame_are_a_torn_tail() {
        let good = segment(&[frame(FRAME_CHECKPOINT, &[]), frame(FRAME_BATCH, &[])]);
        for tail in [
            vec![0u8; 4096],
            (0..300u32).map(|i| (i * 7919) as u8).collect(),
        ] {
            let mut buf = good.clone();
            buf.extend_from_slice(&tail);
            assert_eq!(parse_segment(&buf, 7, true).unwrap().valid_len, good.len());
        }
    }

    mod hostile_input {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig { cases: 1_000, ..ProptestConfig::default() })]

            /// Mutated segments parse or are refused, never panic; what parses stays inside
            /// the buffer and its records decode or are refused.
            #[test]
            fn a_mutated_segment_parses_or_is_refused(
                edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
                cut in any::<usize>(),
                last in any::<bool>(),
            ) {
                let mut buf = segment(&[
                    frame(FRAME_CHECKPOINT, &[Record::Vote(b"v"), Record::Meta { key: "k", value: b"x" }]),
                    frame(FRAME_BATCH, &[Record::Entry { index: 1, bytes: b"e1" }, Record::Truncate { from: 1 }]),
                    frame(FRAME_BATCH, &[Record::Purge { upto: 0, last_purged: b"p" }]),
                ]);
                for (at, v) in edits {
                    let at = at % buf.len();
                    buf[at] = v;
                }
                buf.truncate(cut % (buf.len() + 1));
                if let Ok(parsed) = parse_segment(&buf, 7, last) {
                    prop_assert!(parsed.valid_len <= buf.len());
                    for f in parsed.frames {
                        for r in records(&buf, f.body) {
                            let _ = r;
                        }
                    }
                }
            }
        }
    }
}
