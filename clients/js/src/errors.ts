// The client's errors, one class per cause, and the one place where a gRPC status becomes one.
import { Metadata, status as Code, ServiceError } from "@grpc/grpc-js";

/** Metadata keys a latchkey node puts on every error status (crates/proto/src/lib.rs). */
export const ERROR_REASON_KEY = "latchkey-error";
export const LEADER_ADDR_KEY = "latchkey-leader-addr";
/** The Raft group an error of a cluster of several groups came from (decimal): its leader hint is that group's leader. */
export const GROUP_KEY = "latchkey-group";

/** Base of every error this library throws. `code` is a stable kebab-case name of the class. */
export class LatchkeyError extends Error {
  readonly code: string;
  constructor(code: string, message: string) {
    super(message);
    this.code = code;
    this.name = new.target.name;
  }
}

/** Bad input (empty or over-long name, TTL out of range, unusable endpoint). Not retried. */
export class InvalidArgument extends LatchkeyError {
  constructor(message: string) {
    super("invalid-argument", message);
  }
}

/** A semaphore has 1 to `max` (HOLDERS_PER_LOCK_MAX) permits; refused before any call. An InvalidArgument. */
export class PermitsOutOfRange extends InvalidArgument {
  /** Undefined when only the server's message said it. */
  readonly permits?: number;
  readonly max?: number;
  constructor(permits: number | undefined, max: number | undefined, message?: string) {
    super(message ?? `a semaphore has 1 to ${max} permits, not ${permits}`);
    this.permits = permits;
    this.max = max;
  }
}

/** The server does not know the session (expired, closed, or wrong secret). */
export class SessionNotFound extends LatchkeyError {
  constructor(message: string) {
    super("session-not-found", message);
  }
}

/**
 * The session's lease may have run out: its deadline on this client's clock passed without an
 * acknowledged renewal, the server said it is gone, or it was closed. Its locks may already be
 * someone else's.
 */
export class SessionLost extends LatchkeyError {
  readonly sessionId: bigint;
  readonly why: string;
  constructor(sessionId: bigint, why: string) {
    super("lost", `session ${sessionId} lost: ${why}`);
    this.sessionId = sessionId;
    this.why = why;
  }
}

/** A release found that the grant was no longer current: the lock was lost before it. */
export class NotHeld extends LatchkeyError {
  readonly lock: string;
  readonly token: bigint;
  constructor(lock: string, token: bigint) {
    super("not-held", `lock ${JSON.stringify(lock)} with token ${token} was not held any more`);
    this.lock = lock;
    this.token = token;
  }
}

/** A server limit was hit (sessions, locks per session, queue full, ...). */
export class LimitReached extends LatchkeyError {
  readonly reason: string;
  constructor(reason: string, message: string) {
    super("limit-reached", `limit reached (${reason}): ${message}`);
    this.reason = reason;
  }
}

/** The request conflicts with the state (already held, already waiting, request too old, ...). */
export class Conflict extends LatchkeyError {
  readonly reason: string;
  constructor(reason: string, message: string) {
    super("conflict", `conflict (${reason}): ${message}`);
    this.reason = reason;
  }
}

/**
 * A name in use as a semaphore was asked for as a lock (exclusive or shared), or the reverse:
 * nothing changed; it can be taken so once it is free. A Conflict (`kind-conflict`).
 */
export class KindConflict extends Conflict {
  constructor(message: string) {
    super("kind-conflict", message);
  }
}

/**
 * A semaphore's permit was asked with another count than the one its holders and waiters use
 * (fixed by the acquire that found the name free): nothing changed. A Conflict (`permits-conflict`).
 */
export class PermitsConflict extends Conflict {
  constructor(message: string) {
    super("permits-conflict", message);
  }
}

/**
 * A proclaim by a leadership whose term has ended (resigned, the session lost, an operator
 * force-released it): the published value is unchanged. A Conflict (`not-election-leader`).
 */
export class NotElectionLeader extends Conflict {
  constructor(message: string) {
    super("not-election-leader", message);
  }
}

/** The wait for a lock ended without a grant (also a try-lock, `wait: 0`, that found it held). */
export class WaitTimeout extends LatchkeyError {
  readonly lock: string;
  constructor(lock: string, message?: string) {
    super("wait-timeout", message ?? `timed out waiting for lock ${JSON.stringify(lock)}`);
    this.lock = lock;
  }
}

/** A lock's holder as the server reported it. */
export interface Holder {
  sessionId: bigint;
  token: bigint;
  heldForMs: number;
  owner?: Owner;
  /** What a campaign's grant published (undefined: taken as a plain lock). */
  value?: Buffer;
}

/** What a client said about who runs a session (shown by describe); not authenticated. */
export interface Owner {
  host: string;
  pid: number;
  user: string;
  text: string;
}

/** A try-lock (`wait: 0`) found the lock held; `holder` is who held it then. A WaitTimeout. */
export class Held extends WaitTimeout {
  readonly holder: Holder;
  constructor(lock: string, holder: Holder) {
    super(lock, `lock ${JSON.stringify(lock)} is held by session ${holder.sessionId} (token ${holder.token})`);
    this.holder = holder;
  }
}

/** Servers answered, but none could serve the request (no leader, shutting down) within the retry budget. */
export class Unavailable extends LatchkeyError {
  readonly attempts: number;
  constructor(attempts: number, elapsedMs: number, last: string) {
    super("unavailable", `unavailable after ${attempts} attempts in ${(elapsedMs / 1000).toFixed(1)}s: ${last}`);
    this.attempts = attempts;
  }
}

/** No server could be reached (refused, reset, no answer in time) within the retry budget. */
export class TransportError extends LatchkeyError {
  readonly attempts: number;
  constructor(attempts: number, elapsedMs: number, last: string) {
    super("transport", `${last} (${attempts} attempts in ${(elapsedMs / 1000).toFixed(1)}s)`);
    this.attempts = attempts;
  }
}

/** Access control refused the call (`permission-denied`, `unauthenticated`). Not retried. */
export class PermissionDenied extends LatchkeyError {
  readonly reason: string;
  constructor(reason: string, message: string) {
    super("permission-denied", `permission denied (${reason}): ${message}`);
    this.reason = reason;
  }
}

/**
 * The client and the server do not speak the same protocol (TLS to a plaintext port or the
 * reverse) or do not trust each other's certificates. Not retried: only a change of
 * configuration fixes it; the message says which.
 */
export class TlsError extends LatchkeyError {
  constructor(message: string) {
    super("tls", `TLS: ${message}`);
  }
}

/** What the server says to a plaintext client of its TLS port (crates/core/src/lib.rs). */
export const TLS_REQUIRED_MESSAGE = "latchkey: this server speaks TLS: use https:// and --ca";

/**
 * A protocol or certificate mismatch with the server at `target`, recognised in a status that
 * did not come from a latchkey node (it names a reason on every status), as the Rust client's
 * `tls::mismatch` does; undefined for any other failure.
 */
export function tlsMismatch(target: string, err: ServiceError): string | undefined {
  if (meta(err.metadata, ERROR_REASON_KEY) !== undefined) return undefined;
  const text = `${err.details ?? ""} ${err.message ?? ""}`;
  if (text.includes(TLS_REQUIRED_MESSAGE) || (err.code === Code.PERMISSION_DENIED && /Protocol not secure enough/.test(text))) {
    return `the server at ${target} speaks TLS: use https://${target} and options.tls.ca`;
  }
  if (/wrong version number|packet length too long|unknown protocol/i.test(text)) {
    return `the server at ${target} does not speak TLS: use ${target} without https:// (or its TLS port)`;
  }
  if (/unable to verify|self[- ]signed certificate|unable to get (local )?issuer|certificate verify failed|Hostname\/IP does not match/i.test(text)) {
    return `the certificate of the server at ${target} is not trusted by options.tls.ca (${err.details})`;
  }
  if (/certificate required/i.test(text)) {
    return `the server at ${target} requires a client certificate: give options.tls.cert and options.tls.key`;
  }
  if (/alert (certificate unknown|bad certificate|unknown ca|decrypt error)/i.test(text)) {
    return `the server at ${target} refused this client's certificate (${err.details})`;
  }
  return undefined;
}

/** The server answered something this client does not understand. */
export class ProtocolError extends LatchkeyError {
  constructor(message: string) {
    super("protocol", `protocol error: ${message}`);
  }
}

/** The server failed in a way that is not a client error (INTERNAL, UNIMPLEMENTED, ...). */
export class ServerError extends LatchkeyError {
  readonly grpcCode: string;
  constructor(grpcCode: string, message: string) {
    super("server", `server error (${grpcCode}): ${message}`);
    this.grpcCode = grpcCode;
  }
}

/** What to do with one failed attempt. */
export type Failure =
  | { kind: "unavailable"; leaderAddr?: string; message: string }
  /** `connected` false: the attempt reached no server (the name did not resolve, the connection was refused). */
  | { kind: "transport"; message: string; connected?: boolean }
  | { kind: "fatal"; error: LatchkeyError };

/** Whether grpc-js's details say the attempt reached no server: no connection, or no address for the name. */
function neverConnected(details: string): boolean {
  return details.includes("No connection established") || details.includes("Name resolution failed");
}

/** A transport failure's cause in a few words, as the Rust client says it. */
function transportCause(code: number, details: string): string {
  if (details.includes("Name resolution failed")) return `no such host (${details})`;
  if (details.includes("ECONNREFUSED")) return "connection refused";
  if (details.includes("ETIMEDOUT")) return "timed out";
  return `${Code[code]}: ${details}`;
}

function meta(md: Metadata | undefined, key: string): string | undefined {
  const v = md?.get(key)?.[0];
  if (v === undefined) return undefined;
  return typeof v === "string" ? v : v.toString("utf8");
}

/** The group an error names (`latchkey-group`), if it names one. */
export function errorGroup(err: ServiceError): number | undefined {
  const v = meta(err.metadata, GROUP_KEY);
  if (v === undefined || !/^\d{1,10}$/.test(v)) return undefined;
  return Number(v);
}

/**
 * Classifies a failed attempt. A latchkey node sets `latchkey-error` on every status it
 * returns, so an UNAVAILABLE without it came from the transport (grpc-js), not from a node.
 */
export function classify(err: ServiceError): Failure {
  const reason = meta(err.metadata, ERROR_REASON_KEY);
  const message = err.details || err.message;
  switch (err.code) {
    case Code.UNAVAILABLE:
      if (reason !== undefined) {
        const hint = meta(err.metadata, LEADER_ADDR_KEY);
        return { kind: "unavailable", leaderAddr: hint ? hint : undefined, message: `${message} (${reason})` };
      }
      return { kind: "transport", message: transportCause(err.code, message), connected: !neverConnected(message) };
    case Code.CANCELLED:
    case Code.DEADLINE_EXCEEDED:
      return { kind: "transport", message: `${Code[err.code]}: ${message}` };
    case Code.UNKNOWN:
    case Code.INTERNAL:
      // grpc-js reports connection-level failures (a reset stream) as these, without a reason.
      if (reason === undefined) return { kind: "transport", message: `${Code[err.code]}: ${message}` };
      return { kind: "fatal", error: new ServerError(Code[err.code], `${message} (${reason})`) };
    case Code.INVALID_ARGUMENT:
      if (reason === "permits-out-of-range") return { kind: "fatal", error: new PermitsOutOfRange(undefined, undefined, message) };
      return { kind: "fatal", error: new InvalidArgument(message) };
    case Code.NOT_FOUND:
      return { kind: "fatal", error: new SessionNotFound(message) };
    case Code.RESOURCE_EXHAUSTED:
      return { kind: "fatal", error: new LimitReached(reason ?? "resource-exhausted", message) };
    case Code.PERMISSION_DENIED:
    case Code.UNAUTHENTICATED:
      return { kind: "fatal", error: new PermissionDenied(reason ?? Code[err.code].toLowerCase(), message) };
    case Code.FAILED_PRECONDITION:
      if (reason === "kind-conflict") return { kind: "fatal", error: new KindConflict(message) };
      if (reason === "permits-conflict") return { kind: "fatal", error: new PermitsConflict(message) };
      if (reason === "not-election-leader") return { kind: "fatal", error: new NotElectionLeader(message) };
      return { kind: "fatal", error: new Conflict(reason ?? "failed-precondition", message) };
    default:
      return {
        kind: "fatal",
        error: new ServerError(Code[err.code] ?? String(err.code), reason ? `${message} (${reason})` : message),
      };
  }
}
