// The lock namespace split over Raft groups (issue #16; crates/core/src/groups.rs is the
// reference, docs/protocol.md section 2.4 the specification): which group a lock name belongs
// to, and which group a session id was made in. Every client computes these the same way.
//
// 64-bit arithmetic is done in bigint, masked to 64 bits after every product, as Rust's
// wrapping_mul does; the jump hash's division and product are IEEE-754 doubles, as specified.
import { InvalidArgument } from "./errors";
import * as limits from "./limits";

const MASK64 = (1n << 64n) - 1n;
const FNV_OFFSET = 0xcbf29ce484222325n;
const FNV_PRIME = 0x100000001b3n;

/** FNV-1a 64 over `bytes`. */
export function fnv1a64(bytes: Uint8Array): bigint {
  let h = FNV_OFFSET;
  for (const b of bytes) h = ((h ^ BigInt(b)) * FNV_PRIME) & MASK64;
  return h;
}

/** MurmurHash3's 64-bit finalizer. */
export function fmix64(k: bigint): bigint {
  k &= MASK64;
  k ^= k >> 33n;
  k = (k * 0xff51afd7ed558ccdn) & MASK64;
  k ^= k >> 33n;
  k = (k * 0xc4ceb9fe1a85ec53n) & MASK64;
  k ^= k >> 33n;
  return k;
}

/** Lamping and Veach's jump consistent hash of `key` onto `0..buckets`. */
export function jump(key: bigint, buckets: number): number {
  let b = -1;
  let j = 0;
  key &= MASK64;
  while (j < buckets) {
    b = j;
    key = (key * 2862933555777941757n + 1n) & MASK64;
    // (key >> 33) < 2^31 and b + 1 <= 2^31 are exact as doubles; the rest is the spec's double arithmetic.
    j = Math.trunc((b + 1) * (2 ** 31 / (Number(key >> 33n) + 1)));
  }
  return b;
}

/** `groups` as a cluster may have it: an integer in 1..=GROUPS_MAX. */
export function checkGroups(groups: number): number {
  if (!Number.isInteger(groups) || groups < 1 || groups > limits.GROUPS_MAX) {
    throw new InvalidArgument(`the number of groups must be between 1 and ${limits.GROUPS_MAX}, not ${groups}`);
  }
  return groups;
}

/** The Raft group of the lock `name` in a cluster of `groups` groups (docs/protocol.md 2.4). */
export function groupOf(name: string, groups: number): number {
  checkGroups(groups);
  return jump(fmix64(fnv1a64(Buffer.from(name, "utf8"))), groups);
}

/** The Raft group that knows the session `id` (its id is `index * groups + group`). */
export function groupOfSession(id: bigint, groups: number): number {
  checkGroups(groups);
  return Number(id % BigInt(groups));
}
