// latchkey for Node: a client of the latchkey lock service over gRPC.
//
//   client.ts   endpoints, leader routing, the retry loop, keepalive batches, `batch: true`'s
//               coalescing of acquires/releases/closes into Batch calls, list, the admin calls
//   session.ts  a session's lease, its renewal every TTL/3, the deadline rule; one per Raft group
//   groups.ts   which Raft group a lock name or a session id belongs to (serve --groups)
//   lock.ts     acquire (long-poll, same seq across re-sends, release of unwanted grants), LockGuard,
//               a campaign's Leadership (proclaim, resign)
//   election.ts leader reads and `observe` (a watch of the name, resumed on another member)
//   errors.ts   one error class per cause; gRPC status -> error
//   limits.ts   every bound, copied from crates/core/src/limits.rs

// `await using` needs Symbol.asyncDispose; Node 20 has had it since 20.4 (as a Node symbol). On an
// older runtime, define it before any class that uses it is evaluated.
// eslint-disable-next-line @typescript-eslint/no-explicit-any
(Symbol as any).asyncDispose ??= Symbol.for("nodejs.asyncDispose");

export { Client, DEFAULT_RETRY } from "./client";
export type {
  ClientOptions,
  RetryPolicy,
  LockInfo,
  LockList,
  ListOptions,
  NodeStatus,
  GroupStatus,
  ForceReleaseOptions,
  ForceReleased,
  RevokeOptions,
  Revoked,
  AuditRecord,
} from "./client";
export { Session, ownerOfThisProcess, safetyMarginMs } from "./session";
export { now } from "./util";
export { groupOf, groupOfSession } from "./groups";
export type { SessionOptions } from "./session";
export { LockGuard, Leadership, LOCK_HEADER, TOKEN_HEADER } from "./lock";
export type { LockOptions, LockMode, CampaignOptions } from "./lock";
export { Observe } from "./election";
export type { Leader } from "./election";
export {
  LatchkeyError,
  InvalidArgument,
  SessionNotFound,
  SessionLost,
  NotHeld,
  LimitReached,
  Conflict,
  KindConflict,
  PermitsConflict,
  NotElectionLeader,
  PermitsOutOfRange,
  WaitTimeout,
  Held,
  Unavailable,
  TransportError,
  PermissionDenied,
  TlsError,
  ProtocolError,
  ServerError,
} from "./errors";
export type { Holder, Owner } from "./errors";
export * as limits from "./limits";
export * as testing from "./testing";
