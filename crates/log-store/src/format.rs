//! The bytes of a segment file, and nothing else: encoding, decoding and the torn-tail rule.
//! Pure (no I/O), so every rule here is tested on byte buffers.
//!
//! A segment file `<dir>/<number:020>.seg`, version 2 (the one written):
//! - header, [`HEADER_BYTES`] = 36: [`SEGMENT_MAGIC`] (8; the last byte is the format
//!   version, 2), the segment number (u64 LE), the segment's [`Salt`] (16 random bytes drawn
//!   when the segment is created), the CRC-32 of those 32 bytes (u32 LE);
//! - frames, each `len: u32 LE | tag: u64 LE | seq: u64 LE | kind: u8 | body`
//!   ([`FRAME_HEADER_BYTES`] = 21 before the body), where `len` counts kind and body, `seq` is
//!   the frame's place in its segment (the checkpoint is 0, the batches after it 1, 2, ...) and
//!   `tag` is two CRC-32s of the frame without its tag (`len | seq | kind | body`): the low
//!   half of it prefixed with the salt's first 8 bytes, the high half with its last 8. The
//!   first frame of every segment is a [`FRAME_CHECKPOINT`], every later one a
//!   [`FRAME_BATCH`].
//! - A frame's body is a sequence of records, each `len: u32 LE | crc: u32 LE | kind: u8 |
//!   body` with `crc` the CRC-32 of len, kind and body, of the kinds `REC_*` below
//!   ([`Record`]).
//!
//! Version 1 (read, never written; the build before issue #31): a 20-byte header (magic ending
//! in 1, number, CRC-32 of both), and frames laid out like records (`len | crc | kind | body`,
//! no salt, no sequence number). A log whose last segment is of version 1 is rotated to a new
//! segment when it is opened, so every frame written from then on is of version 2; the old
//! segments are read with their own rule until they are purged and deleted.
//!
//! Why records inside a frame: the writer writes a whole group commit with one `write` and one
//! `fdatasync`. A crash during that write may persist any subset of its pages, so valid records
//! of the torn batch may follow a damaged one; the frame's checksum covers the whole batch, so
//! the torn batch is recognised as one damaged frame at the tail. A damaged frame *followed by a
//! valid frame* cannot come from a crash (nothing is written after a batch before its fsync
//! returned) and is corruption. The records keep their own checksum so that one entry read back
//! alone with a positioned read is verified too.
//!
//! Why a salted tag (issue #31): the torn-tail rule looks for a valid frame anywhere after the
//! damage, and a torn batch holds client bytes: a lock name, a session's owner text. In version
//! 1 a client could write a well-formed frame (length, CRC-32, kind, body: every field is public
//! and computable) into such a string; a crash that then lost an earlier page of that batch
//! left damage followed by "a valid frame", and the member refused to start as corrupt.
//!
//! Version 2 counts only frames whose tag verifies under the segment's salt, which never
//! leaves the data directory (no API, log line or snapshot carries it). The attacker controls
//! every byte of a forged frame, `tag` and `seq` included, and may guess the sequence number;
//! what they cannot know is the salt. CRC-32 is affine over GF(2) for inputs of one length, so
//! each half of the tag is a CRC the attacker can compute from their own bytes, XOR a 32-bit
//! value that depends only on the salt half and the length; that value is uniform over 32
//! bits (the salt half, as a polynomial, is multiplied by a power of x modulo the CRC's
//! polynomial, which maps the 64-bit halves evenly onto all residues). The halves are drawn
//! independently, so a forged frame verifies with probability 2^-64 however the rest of it
//! was chosen, and a torn batch of B bytes, which has fewer than B places to put one, is
//! mistaken for corruption with probability below B * 2^-64 (2^-34 for a batch of a GiB). A
//! CRC is no MAC against an attacker who sees tags; no one outside the data directory does.
//!
//! The salt also keeps stale blocks of a deleted segment (which a filesystem may show after a
//! crash in place of unwritten data) from counting as frames, and the sequence number inside
//! the tag makes a frame valid only at its place: a frame copied to another place in its
//! segment is corruption, not a later batch. Version 1 segments keep their rule; nothing is
//! appended to them once this build opened the log, so only a crash of the build before can
//! have left a torn batch in one. Defence in depth: the server refuses a lock name with a
//! control character before it is proposed (`latchkey-server`'s `ops.rs`), so a name cannot
//! hold a small `len`; other client strings (owner text) still can, hence the tag.

use std::ops::Range;

/// First bytes of a segment file of the version written (2); the last byte is the format
/// version.
pub const SEGMENT_MAGIC: [u8; 8] = *b"LKRLOG\x00\x02";
/// The magic of a version 1 segment (read only).
const SEGMENT_MAGIC_V1: [u8; 8] = *b"LKRLOG\x00\x01";
/// Magic (8) + segment number (8) + salt (16) + crc (4).
pub const HEADER_BYTES: usize = 36;
/// Magic (8) + segment number (8) + crc (4).
const HEADER_BYTES_V1: usize = 20;
/// len (4) + tag (8) + seq (8) + kind (1).
pub(crate) const FRAME_HEADER_BYTES: usize = 21;
/// len (4) + crc (4) + kind (1): a record, and a frame of version 1.
pub(crate) const RECORD_HEADER_BYTES: usize = 9;

/// The random bytes of a segment that its frames' tags are keyed with.
pub(crate) type Salt = [u8; 16];

/// How a segment's frames are laid out and checked: its header's version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Version {
    /// Unsalted frames laid out like records (read only).
    V1,
    /// Frames with a sequence number, tagged under the segment's salt.
    V2(Salt),
}

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
    /// never holds this record, and its records are those of the build before groups shared it.
    Group(u32),
}

pub(crate) fn crc32(parts: &[&[u8]]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for part in parts {
        h.update(part);
    }
    h.finalize()
}

/// The header of a new segment `number` whose frames are tagged under `salt`.
pub(crate) fn segment_header(number: u64, salt: &Salt) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[..8].copy_from_slice(&SEGMENT_MAGIC);
    h[8..16].copy_from_slice(&number.to_le_bytes());
    h[16..32].copy_from_slice(salt);
    let crc = crc32(&[&h[..32]]);
    h[32..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The header of a version 1 segment (for the tests of reading one).
#[cfg(test)]
pub(crate) fn segment_header_v1(number: u64) -> [u8; HEADER_BYTES_V1] {
    let mut h = [0u8; HEADER_BYTES_V1];
    h[..8].copy_from_slice(&SEGMENT_MAGIC_V1);
    h[8..16].copy_from_slice(&number.to_le_bytes());
    let crc = crc32(&[&h[..16]]);
    h[16..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The tag under `salt` of the frame `frame` (header and body; what its tag field holds does
/// not matter): it covers the frame with its tag cut out, `len | seq | kind | body`.
fn tag(salt: &Salt, frame: &[u8]) -> u64 {
    let covered: [&[u8]; 2] = [&frame[..4], &frame[12..]];
    let half = |key: &[u8]| {
        let mut h = crc32fast::Hasher::new();
        h.update(key);
        for part in covered {
            h.update(part);
        }
        u64::from(h.finalize())
    };
    half(&salt[..8]) | half(&salt[8..]) << 32
}

/// Starts a frame of `kind`, the `seq`th of its segment, at the end of `buf`; [`end_frame`]
/// fills in its length and tag.
pub(crate) fn begin_frame(buf: &mut Vec<u8>, kind: u8, seq: u64) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; FRAME_HEADER_BYTES]);
    buf[start + 12..start + 20].copy_from_slice(&seq.to_le_bytes());
    buf[start + 20] = kind;
    start
}

/// Fills in the length and tag (under `salt`) of the frame that [`begin_frame`] started at
/// `start`. Fails if it is longer than a `u32` length can say.
pub(crate) fn end_frame(buf: &mut [u8], start: usize, salt: &Salt) -> Result<(), String> {
    let len = buf.len() - start - (FRAME_HEADER_BYTES - 1);
    let len = u32::try_from(len).map_err(|_| format!("a log frame of {len} bytes is too long"))?;
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    let tag = tag(salt, &buf[start..]);
    buf[start + 4..start + 12].copy_from_slice(&tag.to_le_bytes());
    Ok(())
}

/// Starts a record (or a version 1 frame) of `kind` at the end of `buf`; [`end_record`] fills
/// in its header.
pub(crate) fn begin_record(buf: &mut Vec<u8>, kind: u8) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; RECORD_HEADER_BYTES]);
    buf[start + 8] = kind;
    start
}

/// Fills in the length and checksum of the record that [`begin_record`] started at `start`.
/// Fails if it is longer than a `u32` length can say.
pub(crate) fn end_record(buf: &mut [u8], start: usize) -> Result<(), String> {
    let len = buf.len() - start - (RECORD_HEADER_BYTES - 1);
    let len = u32::try_from(len).map_err(|_| format!("a log record of {len} bytes is too long"))?;
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
    let start = begin_record(buf, kind);
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
    end_record(buf, start)?;
    Ok(start)
}

/// A frame (or record) that passed its checksum: `body` is its range in the buffer it was read
/// from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Frame {
    /// Where its header starts.
    pub(crate) at: usize,
    pub(crate) kind: u8,
    pub(crate) body: Range<usize>,
}

/// The end of the `len` bytes (kind and body) that follow a header of `header_bytes` at `off`,
/// if they are inside `buf`.
fn frame_end(buf: &[u8], off: usize, header_bytes: usize) -> Result<usize, &'static str> {
    let Some(header) = buf.get(off..off + header_bytes) else {
        return Err("incomplete frame header");
    };
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    if len == 0 {
        return Err("frame length is zero");
    }
    let end = (off + header_bytes - 1)
        .checked_add(len)
        .ok_or("frame length out of range")?;
    if end > buf.len() {
        return Err("frame runs past the end of the file");
    }
    Ok(end)
}

/// The record (or version 1 frame) starting at `off`, if it is complete and its checksum holds.
pub(crate) fn record_at(buf: &[u8], off: usize) -> Result<Frame, &'static str> {
    let end = frame_end(buf, off, RECORD_HEADER_BYTES)?;
    let crc = u32::from_le_bytes(buf[off + 4..off + 8].try_into().expect("4 bytes"));
    if crc32(&[&buf[off..off + 4], &buf[off + 8..end]]) != crc {
        return Err("checksum mismatch");
    }
    Ok(Frame {
        at: off,
        kind: buf[off + 8],
        body: off + RECORD_HEADER_BYTES..end,
    })
}

/// The sequence number a version 2 frame at `off` claims, unchecked.
fn claimed_seq(buf: &[u8], off: usize) -> Option<u64> {
    let bytes = buf.get(off + 12..off + 20)?;
    Some(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
}

/// The version 2 frame starting at `off` with its sequence number, if it is complete and its
/// tag holds under `salt`.
pub(crate) fn frame_at(buf: &[u8], off: usize, salt: &Salt) -> Result<(u64, Frame), &'static str> {
    let end = frame_end(buf, off, FRAME_HEADER_BYTES)?;
    let stored = u64::from_le_bytes(buf[off + 4..off + 12].try_into().expect("8 bytes"));
    if tag(salt, &buf[off..end]) != stored {
        return Err("checksum mismatch");
    }
    let seq = claimed_seq(buf, off).expect("inside the frame");
    Ok((
        seq,
        Frame {
            at: off,
            kind: buf[off + 20],
            body: off + FRAME_HEADER_BYTES..end,
        },
    ))
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
        let result = record_at(frames, at)
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
    /// How its frames are laid out and checked.
    pub(crate) version: Version,
    /// Each good frame, in order: where it starts, its kind and body range.
    pub(crate) frames: Vec<Frame>,
    /// Bytes up to the end of the last good frame; anything after is a torn tail (only ever in
    /// the last segment).
    pub(crate) valid_len: usize,
}

/// Reads a segment header: its version, checked against the file's `number`.
fn parse_header(buf: &[u8], number: u64) -> Result<(Version, usize), SegmentError> {
    let magic = buf
        .get(..8)
        .ok_or(SegmentError::BadHeader("shorter than a segment header"))?;
    let (version, header_bytes) = if magic == SEGMENT_MAGIC {
        let salt: Salt = buf
            .get(16..32)
            .ok_or(SegmentError::BadHeader("shorter than a segment header"))?
            .try_into()
            .expect("16 bytes");
        (Version::V2(salt), HEADER_BYTES)
    } else if magic == SEGMENT_MAGIC_V1 {
        (Version::V1, HEADER_BYTES_V1)
    } else {
        return Err(SegmentError::BadHeader(
            "not a latchkey log segment of a version this build reads (magic)",
        ));
    };
    let header = buf
        .get(..header_bytes)
        .ok_or(SegmentError::BadHeader("shorter than a segment header"))?;
    let crc_at = header_bytes - 4;
    let stored = u32::from_le_bytes(header[crc_at..].try_into().expect("4 bytes"));
    if crc32(&[&header[..crc_at]]) != stored || header[8..16] != number.to_le_bytes() {
        return Err(SegmentError::BadHeader(
            "header checksum or segment number does not match the file name",
        ));
    }
    Ok((version, header_bytes))
}

/// Splits a segment file into frames. In the last segment (`last`), a damaged frame with no
/// good frame of the same segment anywhere after it is a torn group commit and ends the
/// segment; anything else damaged is [`SegmentError::Corrupt`], and so is a good frame of
/// version 2 out of its place in the sequence.
pub(crate) fn parse_segment(buf: &[u8], number: u64, last: bool) -> Result<Parsed, SegmentError> {
    let (version, mut off) = parse_header(buf, number)?;
    let mut frames = Vec::new();
    while off < buf.len() {
        let seq = frames.len() as u64;
        let found = match &version {
            Version::V1 => record_at(buf, off),
            Version::V2(salt) => match frame_at(buf, off, salt) {
                // A whole frame with a good tag: written by this log, but for another place.
                Ok((got, _)) if got != seq => {
                    return Err(SegmentError::Corrupt {
                        offset: off,
                        reason: "frame out of sequence",
                    })
                }
                found => found.map(|(_, frame)| frame),
            },
        };
        match found {
            Ok(frame) => {
                off = frame.body.end;
                frames.push(frame);
            }
            Err(_) if last && is_torn_tail(buf, off, &version, seq) => break,
            Err(reason) => {
                return Err(SegmentError::Corrupt {
                    offset: off,
                    reason,
                })
            }
        }
    }
    Ok(Parsed {
        version,
        frames,
        valid_len: off,
    })
}

/// Whether damage at `off`, where the `seq`th frame should be, can be a torn last write: no
/// good frame starts after it. (A frame's bytes inside the torn write are records, not
/// frames, so they do not count.) In version 2 a good frame is one whose tag holds under the
/// segment's salt and whose sequence number is later than `seq`; bytes a client chose cannot
/// be one (see the module comment). In version 1 any well-formed frame counts.
fn is_torn_tail(buf: &[u8], off: usize, version: &Version, seq: u64) -> bool {
    let kind_at = |p: usize| {
        buf.get(p)
            .is_some_and(|&k| k == FRAME_BATCH || k == FRAME_CHECKPOINT)
    };
    // Cheap fields first: most offsets fail there, before a checksum is computed.
    let good_frame_at = |p: usize| match version {
        Version::V1 => kind_at(p + RECORD_HEADER_BYTES - 1) && record_at(buf, p).is_ok(),
        Version::V2(salt) => {
            // Each frame between takes more than a header, so a later one is not far later.
            let later = |s: u64| s > seq && s - seq <= (buf.len() - off) as u64;
            kind_at(p + FRAME_HEADER_BYTES - 1)
                && claimed_seq(buf, p).is_some_and(later)
                && frame_at(buf, p, salt).is_ok()
        }
    };
    !(off + 1..buf.len()).any(good_frame_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SALT: Salt = *b"0123456789abcdef";

    /// The `seq`th frame of a segment salted with [`SALT`].
    fn frame(kind: u8, seq: u64, records: &[Record<'_>]) -> Vec<u8> {
        let mut buf = Vec::new();
        let start = begin_frame(&mut buf, kind, seq);
        for r in records {
            encode_record(&mut buf, r).unwrap();
        }
        end_frame(&mut buf, start, &SALT).unwrap();
        buf
    }

    /// Segment 7, salted with [`SALT`], holding `frames`.
    fn segment(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut buf = segment_header(7, &SALT).to_vec();
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
        let buf = segment(&[frame(FRAME_CHECKPOINT, 0, &[]), frame(FRAME_BATCH, 1, &all)]);
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
        let buf = segment(&[frame(FRAME_CHECKPOINT, 0, &[])]);
        assert!(matches!(
            parse_segment(&buf, 8, true),
            Err(SegmentError::BadHeader(_))
        ));
        let mut other = buf.clone();
        other[7] = 3;
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
        frame(FRAME_BATCH, 1, &entries)
    }

    #[test]
    fn every_cut_of_the_last_frame_is_a_torn_tail_only_in_the_last_segment() {
        let good = segment(&[frame(FRAME_CHECKPOINT, 0, &[])]);
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
        let good = segment(&[frame(FRAME_CHECKPOINT, 0, &[])]);
        let mut buf = good.clone();
        buf.extend_from_slice(&two_entry_batch());
        buf[good.len() + 2] ^= 0xFF; // the frame's length
        buf[good.len() + FRAME_HEADER_BYTES + 2] ^= 0xFF; // and the first record
        let parsed = parse_segment(&buf, 7, true).expect("torn tail");
        assert_eq!(parsed.valid_len, good.len());
    }

    #[test]
    fn damage_followed_by_a_valid_frame_is_corruption() {
        let first = segment(&[frame(FRAME_CHECKPOINT, 0, &[])]);
        let mut buf = first.clone();
        buf.extend_from_slice(&frame(FRAME_BATCH, 1, &[Record::Vote(b"v")]));
        buf.extend_from_slice(&frame(FRAME_BATCH, 2, &[Record::Vote(b"v")]));
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
        let good = segment(&[frame(FRAME_CHECKPOINT, 0, &[]), frame(FRAME_BATCH, 1, &[])]);
        for tail in [
            vec![0u8; 4096],
            (0..300u32).map(|i| (i * 7919) as u8).collect(),
        ] {
            let mut buf = good.clone();
            buf.extend_from_slice(&tail);
            assert_eq!(parse_segment(&buf, 7, true).unwrap().valid_len, good.len());
        }
    }

    /// A torn batch 2 whose payload holds a copy of `forged`: its first bytes lost (zeros), the
    /// rest, forged frame included, on disk.
    fn torn_batch_holding(forged: &[u8]) -> (Vec<u8>, usize) {
        let good = segment(&[
            frame(FRAME_CHECKPOINT, 0, &[]),
            frame(FRAME_BATCH, 1, &[Record::Vote(b"v")]),
        ]);
        let mut payload = vec![b'a'; 64];
        payload.extend_from_slice(forged);
        let mut buf = good.clone();
        buf.extend_from_slice(&frame(
            FRAME_BATCH,
            2,
            &[Record::Entry {
                index: 1,
                bytes: &payload,
            }],
        ));
        buf[good.len()..good.len() + 40].fill(0);
        (buf, good.len())
    }

    /// Issue #31: a client who knows the format but not the salt writes a frame into a payload.
    /// Whatever sequence number or salt it guesses, its frame does not count as one after damage.
    #[test]
    fn a_frame_forged_without_the_salt_inside_a_torn_batch_is_a_torn_tail() {
        let v1_frame = |kind: u8| {
            let mut f = Vec::new();
            let start = begin_record(&mut f, kind);
            f.extend_from_slice(b"xy");
            end_record(&mut f, start).unwrap();
            f
        };
        let guessed = |seq: u64, salt: &Salt| {
            let mut f = Vec::new();
            let start = begin_frame(&mut f, FRAME_BATCH, seq);
            f.extend_from_slice(b"xy");
            end_frame(&mut f, start, salt).unwrap();
            f
        };
        let mut near = SALT;
        near[15] ^= 1;
        for (what, forged) in [
            ("a version 1 frame", v1_frame(FRAME_BATCH)),
            ("the next frame under a zero salt", guessed(3, &[0; 16])),
            ("the next frame under a salt one bit off", guessed(3, &near)),
            ("a later frame under a zero salt", guessed(9, &[0; 16])),
        ] {
            let (buf, good) = torn_batch_holding(&forged);
            let parsed = parse_segment(&buf, 7, true).unwrap_or_else(|e| panic!("{what}: {e:?}"));
            assert_eq!(parsed.valid_len, good, "{what}");
        }
        // The same place holding a frame this log wrote (the right salt, a later sequence
        // number) is valid data after damage: corruption, as before.
        let (buf, good) = torn_batch_holding(&guessed(3, &SALT));
        assert!(matches!(
            parse_segment(&buf, 7, true),
            Err(SegmentError::Corrupt { offset, .. }) if offset == good
        ));
    }

    /// Damage to two frames followed by a good third: the good frame's sequence number is not
    /// the one after the first damaged frame, and it still makes the damage corruption.
    #[test]
    fn damage_followed_by_any_later_frame_is_corruption() {
        let first = segment(&[frame(FRAME_CHECKPOINT, 0, &[])]);
        let mut buf = first.clone();
        for seq in 1..=3 {
            buf.extend_from_slice(&frame(FRAME_BATCH, seq, &[Record::Vote(b"v")]));
        }
        let frame_len = (buf.len() - first.len()) / 3;
        buf[first.len() + 2] ^= 0x01;
        buf[first.len() + frame_len + 2] ^= 0x01;
        assert!(matches!(
            parse_segment(&buf, 7, true),
            Err(SegmentError::Corrupt { offset, .. }) if offset == first.len()
        ));
    }

    /// A frame is valid only at its place: a good frame repeated, or one of another segment
    /// (another salt), is not a later batch.
    #[test]
    fn a_frame_out_of_its_place_is_refused() {
        let checkpoint = frame(FRAME_CHECKPOINT, 0, &[]);
        let one = frame(FRAME_BATCH, 1, &[Record::Vote(b"v")]);
        let repeated = segment(&[checkpoint.clone(), one.clone(), one.clone()]);
        assert_eq!(
            parse_segment(&repeated, 7, true).err(),
            Some(SegmentError::Corrupt {
                offset: repeated.len() - one.len(),
                reason: "frame out of sequence"
            })
        );
        let mut other_salt = segment(&[checkpoint]);
        let len = other_salt.len();
        let mut foreign = Vec::new();
        let start = begin_frame(&mut foreign, FRAME_BATCH, 1);
        encode_record(&mut foreign, &Record::Vote(b"v")).unwrap();
        end_frame(&mut foreign, start, &[7; 16]).unwrap();
        other_salt.extend_from_slice(&foreign);
        let parsed = parse_segment(&other_salt, 7, true).expect("not a frame of this segment");
        assert_eq!(parsed.valid_len, len);
        assert!(parse_segment(&other_salt, 7, false).is_err());
    }

    /// Segments of version 1 (written by the build before issue #31) are read with their rule:
    /// unsalted frames laid out like records, any well-formed later frame makes damage
    /// corruption.
    #[test]
    fn a_version_1_segment_is_read_with_its_own_rule() {
        let v1_frame = |kind: u8, records: &[Record<'_>]| {
            let mut f = Vec::new();
            let start = begin_record(&mut f, kind);
            for r in records {
                encode_record(&mut f, r).unwrap();
            }
            end_record(&mut f, start).unwrap();
            f
        };
        let mut buf = segment_header_v1(7).to_vec();
        buf.extend_from_slice(&v1_frame(FRAME_CHECKPOINT, &[Record::Vote(b"v")]));
        let good = buf.len();
        let batch = v1_frame(
            FRAME_BATCH,
            &[Record::Entry {
                index: 1,
                bytes: b"e",
            }],
        );
        buf.extend_from_slice(&batch);
        let parsed = parse_segment(&buf, 7, false).unwrap();
        assert_eq!(parsed.version, Version::V1);
        assert_eq!(parsed.frames.len(), 2);
        assert_eq!(parsed.valid_len, buf.len());
        assert_eq!(parsed.frames[1].at, good);
        for cut in good + 1..buf.len() {
            assert_eq!(parse_segment(&buf[..cut], 7, true).unwrap().valid_len, good);
        }
        let mut twice = buf.clone();
        twice.extend_from_slice(&batch);
        twice[good + 2] ^= 0x01;
        assert!(matches!(
            parse_segment(&twice, 7, true),
            Err(SegmentError::Corrupt { offset, .. }) if offset == good
        ));
        assert!(matches!(
            parse_segment(&buf, 8, false),
            Err(SegmentError::BadHeader(_))
        ));
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
                    frame(FRAME_CHECKPOINT, 0, &[Record::Vote(b"v"), Record::Meta { key: "k", value: b"x" }]),
                    frame(FRAME_BATCH, 1, &[Record::Entry { index: 1, bytes: b"e1" }, Record::Truncate { from: 1 }]),
                    frame(FRAME_BATCH, 2, &[Record::Purge { upto: 0, last_purged: b"p" }]),
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
