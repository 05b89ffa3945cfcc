// `Client`: endpoints, leader routing, and the retry loop every RPC goes through
// (crates/client/src/client.rs is the reference).
import * as os from "node:os";
import * as path from "node:path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

import {
  classify,
  Conflict,
  Failure,
  Holder,
  InvalidArgument,
  LatchkeyError,
  Owner,
  ProtocolError,
  TlsError,
  tlsMismatch,
  TransportError,
  Unavailable,
} from "./errors";
import * as limits from "./limits";
import { Aborted, now, sleep } from "./util";
import { validateName } from "./lock";
import type { LockGuard, LockOptions } from "./lock";
import { Session, SessionOptions } from "./session";

/** Settings of a Client; every field is optional. */
export interface ClientOptions {
  /** Deadline of one attempt of a short RPC (everything but the Acquire long-poll). Default 5000. */
  rpcTimeoutMs?: number;
  /** Retries on UNAVAILABLE and transport errors. */
  retry?: Partial<RetryPolicy>;
  /** Sent with every call as `authorization: Bearer TOKEN` (servers with `--acl`). */
  authToken?: string;
  /**
   * TLS to every member (also implied by `https://` endpoints): the CA that signed the servers'
   * certificates (PEM), and a client certificate and key (PEM) for mutual TLS.
   */
  tls?: { ca: Buffer | string; cert?: Buffer | string; key?: Buffer | string };
}

export interface RetryPolicy {
  /** Attempts of one request, the first included. */
  attemptsMax: number;
  /** Time from the first attempt after which no new attempt starts. */
  elapsedMaxMs: number;
  /** Backoff before the second attempt; doubles after each failure. */
  backoffInitialMs: number;
  /** Cap of the doubling. */
  backoffMaxMs: number;
}

export const DEFAULT_RETRY: RetryPolicy = {
  attemptsMax: limits.CLIENT_ATTEMPTS_MAX,
  elapsedMaxMs: limits.CLIENT_RETRY_ELAPSED_MS_MAX,
  backoffInitialMs: limits.CLIENT_BACKOFF_MS_INITIAL,
  backoffMaxMs: limits.CLIENT_BACKOFF_MS_MAX,
};

/** Options of one logical request. */
export interface CallOpts {
  /** Deadline of each attempt (also sent to the server as grpc-timeout). */
  attemptTimeoutMs: number;
  /** A lower cap on the backoff than the policy's (renewals racing their deadline). */
  backoffMaxMs?: number;
  /** Stops the request: the attempt in flight is cancelled, the call rejects with Aborted. */
  signal?: AbortSignal;
}

/** An answer, with who gave it and after how many failed attempts. */
export interface Answered<T> {
  response: T;
  endpoint: string;
  failedAttempts: number;
}

/** One lock as the leader sees it. */
export interface LockInfo {
  name: string;
  /** Undefined when the lock is free. */
  holder?: Holder;
  /** Sessions queued for the lock. */
  waiters: number;
  /** Waiters in queue order. */
  queue: Array<{ sessionId: bigint; waitedMs: number; owner?: Owner }>;
}

/** The answer of `list`: held locks in name order, and whether more matched than came back. */
export interface LockList {
  /** Each with at most LIST_WAITERS_SHOWN_MAX waiters of its queue's head (`waiters` counts them all). */
  locks: LockInfo[];
  /** More locks match than were returned (LIST_RESULTS_MAX, the `limit`, or the answer's byte bound). */
  truncated: boolean;
}

/** Options of `list`. */
export interface ListOptions {
  /** At most this many locks, 1..=LIST_RESULTS_MAX; undefined: the server's maximum. */
  limit?: number;
}

/** Options of `forceRelease`. */
export interface ForceReleaseOptions {
  /**
   * Take the grant only if it has this token. Undefined: the current holder's token is read
   * first (`describe`) and the release made conditional on it, so that a retry after a lost
   * answer can never take the next holder's grant.
   */
  token?: bigint;
  /** Why (required, at most AUDIT_REASON_BYTES_MAX bytes): recorded in the audit log. */
  reason: string;
  /** Who says they are doing it, recorded beside the authenticated identity. Default: `user@host` of this process. */
  operator?: string;
}

/** The grant `forceRelease` took. */
export interface ForceReleased {
  sessionId: bigint;
  token: bigint;
}

/** Options of `revoke`. */
export interface RevokeOptions {
  /** Why (required, at most AUDIT_REASON_BYTES_MAX bytes): recorded in the audit log. */
  reason: string;
  /** As in ForceReleaseOptions. */
  operator?: string;
}

/** What `revoke` ended. */
export interface Revoked {
  /** Locks the session held (handed to their next waiters). */
  locks: number;
}

/** One administrative action of the audit log (`audit`). */
export interface AuditRecord {
  /** The log index of the entry that did it. */
  index: bigint;
  /** The leader's wall clock then, Unix ms. */
  atMs: number;
  /** "force-release" or "revoke". */
  action: string;
  /** force-release: the lock; undefined for a revoke. */
  lock?: string;
  /** force-release: the session whose grant was taken; revoke: the session ended. */
  sessionId: bigint;
  /** force-release: the grant taken; undefined for a revoke. */
  token?: bigint;
  /** force-release: the next waiter's grant; undefined when nobody waited (and for a revoke). */
  nextToken?: bigint;
  /** revoke: how many locks the session held; undefined for a force-release. */
  locks?: number;
  /** The authenticated identity; undefined without access control ("anonymous"). */
  identity?: string;
  /** What the operator's tool said about them (e.g. user@host). */
  operator: string;
  reason: string;
}

/** One node's view of its Raft group (`nodeStatus`). */
export interface NodeStatus {
  id: bigint;
  /** "leader", "follower", "candidate", "learner" or "shutdown". */
  role: string;
  term: bigint;
  /** 0n when no leader is known. */
  leaderId: bigint;
  members: Array<{ id: bigint; addr: string }>;
  clusterId: string;
}

// ---- the wire: the .proto, loaded at run time ----

/** Where the build put the .proto (scripts/copy-proto.js): `<package>/proto`. */
const PROTO_PATH = path.join(__dirname, "..", "proto", "latchkey.proto");

// 64-bit integers travel as decimal strings (`longs: String`): JavaScript numbers lose
// precision above 2^53, and the client turns them into bigint at its edge.
const packageDefinition = protoLoader.loadSync(PROTO_PATH, {
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
});
// eslint-disable-next-line @typescript-eslint/no-explicit-any
const proto = grpc.loadPackageDefinition(packageDefinition) as any;
const LocksClient: grpc.ServiceClientConstructor = proto.latchkey.v1.Locks;

/** A session as the wire carries it (64-bit fields as decimal strings). */
export interface WireSession {
  id: string;
  secret: string;
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Wire = any;

export function ownerFromWire(o: Wire): Owner | undefined {
  if (!o) return undefined;
  return { host: o.host, pid: Number(o.pid), user: o.user, text: o.text };
}

export function holderFromWire(info: Wire): Holder | undefined {
  if (!info || !info.held) return undefined;
  return {
    sessionId: BigInt(info.session),
    token: BigInt(info.token),
    heldForMs: Number(info.held_for_ms),
    owner: ownerFromWire(info.owner),
  };
}

function lockInfoFromWire(info: Wire): LockInfo {
  return {
    name: info.name,
    holder: holderFromWire(info),
    waiters: Number(info.waiters),
    queue: (info.queue ?? []).map((w: Wire) => ({
      sessionId: BigInt(w.session),
      waitedMs: Number(w.waited_ms),
      owner: ownerFromWire(w.owner),
    })),
  };
}

/** Unicode White_Space, as Rust's `str::trim` (the server's test of an empty reason) knows it. */
const BLANK = /^[\t\n\v\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*$/;

/** An administrative action's reason: required, at most AUDIT_REASON_BYTES_MAX bytes (`validate_reason`). */
function checkReason(reason: unknown): string {
  if (typeof reason !== "string" || BLANK.test(reason)) throw new InvalidArgument("a reason is required (it is recorded in the audit log)");
  const bytes = Buffer.byteLength(reason, "utf8");
  if (bytes > limits.AUDIT_REASON_BYTES_MAX) {
    throw new InvalidArgument(`the reason is ${bytes} bytes, more than ${limits.AUDIT_REASON_BYTES_MAX}`);
  }
  return reason;
}

/** The operator string: the caller's (at most AUDIT_ACTOR_BYTES_MAX bytes), or `user@host` of this process, cut to fit. */
function checkOperator(operator: unknown): string {
  if (operator === undefined) return cutUtf8(defaultOperator(), limits.AUDIT_ACTOR_BYTES_MAX);
  if (typeof operator !== "string") throw new InvalidArgument("the operator must be a string");
  const bytes = Buffer.byteLength(operator, "utf8");
  if (bytes > limits.AUDIT_ACTOR_BYTES_MAX) {
    throw new InvalidArgument(`the operator is ${bytes} bytes, more than ${limits.AUDIT_ACTOR_BYTES_MAX}`);
  }
  return operator;
}

/** `user@host` as the CLI records it (crates/cli/src/admin.rs `operator`). */
function defaultOperator(): string {
  const user = (process.env.USER ?? process.env.LOGNAME ?? process.env.USERNAME ?? "").trim();
  let host = "";
  try {
    host = os.hostname().trim();
  } catch {
    host = "";
  }
  if (user !== "" && host !== "") return `${user}@${host}`;
  if (user !== "") return user;
  return host === "" ? "" : `@${host}`;
}

function cutUtf8(s: string, maxBytes: number): string {
  const b = Buffer.from(s, "utf8");
  if (b.length <= maxBytes) return s;
  let end = maxBytes;
  while (end > 0 && (b[end] & 0xc0) === 0x80) end--;
  return b.subarray(0, end).toString("utf8");
}

const U64_MAX = (1n << 64n) - 1n;

/** A 64-bit id or token given by the caller: a bigint in `min..=2^64-1`. */
function checkU64(what: string, v: unknown, min: bigint): bigint {
  if (typeof v !== "bigint") throw new InvalidArgument(`${what} must be a bigint (64-bit values lose precision as numbers)`);
  if (v < min || v > U64_MAX) throw new InvalidArgument(`${what} ${v} is out of range ${min}..=${U64_MAX}`);
  return v;
}

function auditRecordFromWire(r: Wire): AuditRecord {
  const release = r.action === "force-release";
  return {
    index: BigInt(r.index),
    atMs: Number(r.at_ms),
    action: r.action,
    lock: release ? r.lock : undefined,
    sessionId: BigInt(r.session),
    token: release ? BigInt(r.token) : undefined,
    nextToken: release && BigInt(r.next_token) !== 0n ? BigInt(r.next_token) : undefined,
    locks: release ? undefined : Number(r.locks),
    identity: r.identity === "" ? undefined : r.identity,
    operator: r.operator,
    reason: r.reason,
  };
}

/** `host:port` from an endpoint as the user wrote it (`host:port`, `http://...`, `https://...`). */
function target(endpoint: string): { target: string; tls: boolean } {
  const e = endpoint.trim();
  if (e === "") throw new InvalidArgument("empty endpoint");
  let rest = e;
  let tls = false;
  const m = /^([a-z]+):\/\/(.*)$/.exec(e);
  if (m) {
    if (m[1] === "https") tls = true;
    else if (m[1] !== "http") throw new InvalidArgument(`endpoint ${JSON.stringify(endpoint)}: unknown scheme ${m[1]}`);
    rest = m[2].replace(/\/$/, "");
  }
  if (!/^(\[[0-9a-fA-F:.]+\]|[^\s:/[\]]+):\d{1,5}$/.test(rest)) {
    throw new InvalidArgument(`endpoint ${JSON.stringify(endpoint)}: expected HOST:PORT`);
  }
  return { target: rest, tls };
}

/** Where the next attempt goes. */
class Route {
  /** One lazily connected gRPC client per target (seeds and leader hints). */
  channels = new Map<string, grpc.Client>();
  /** The node believed to lead: the last one that answered, or the last hint. */
  leader?: string;
  /** Round-robin position in the seeds when no leader is known. */
  nextSeed = 0;
  /** The target whose last attempt failed in transport, and when (issue #11). */
  refused?: { target: string; at: number };

  recentlyRefused(t: string, at: number): boolean {
    return this.refused !== undefined && this.refused.target === t && at - this.refused.at < limits.CLIENT_REFUSED_HINT_IGNORE_MS;
  }
}

interface KeepAliveWaiting {
  session: WireSession;
  opts: CallOpts;
  reply: (r: Renewed) => void;
}

/** One session's keepalive answer: its lease (undefined: the server left it out), or the error. */
export type Renewed =
  | { ok: true; lease?: Wire; endpoint: string; failedAttempts: number }
  | { ok: false; error: unknown };

/**
 * A handle on a latchkey cluster. Connections open lazily, so the constructor does not fail
 * when no server is up yet; the first call does, after its retries. `close()` ends every
 * session it opened and closes the connections (an open session keeps the process alive).
 */
export class Client {
  readonly rpcTimeoutMs: number;
  readonly retry: RetryPolicy;
  private readonly seeds: string[];
  private readonly credentials: grpc.ChannelCredentials;
  private readonly authToken?: string;
  private readonly route = new Route();
  /** Aborted by close(): every call and sleep of this client stops. */
  private readonly closed = new AbortController();
  /** Sessions opened by this client and not closed yet. */
  private readonly sessions = new Set<Session>();
  /** Keepalives waiting to go out together (crates/client/src/keepalive.rs). */
  private keepalives: KeepAliveWaiting[] = [];

  constructor(endpoints: string[], options: ClientOptions = {}) {
    if (!Array.isArray(endpoints) || endpoints.length === 0) throw new InvalidArgument("no endpoints");
    const parsed = endpoints.map(target);
    this.seeds = parsed.map((p) => p.target);
    const tls = parsed.some((p) => p.tls) || options.tls !== undefined;
    if (tls && options.tls === undefined) {
      throw new InvalidArgument("an https:// endpoint needs options.tls.ca: the CA that signed the servers' certificates");
    }
    const buf = (v?: Buffer | string) => (v === undefined ? null : Buffer.isBuffer(v) ? v : Buffer.from(v));
    this.credentials = tls
      ? grpc.credentials.createSsl(buf(options.tls!.ca), buf(options.tls!.key), buf(options.tls!.cert))
      : grpc.credentials.createInsecure();
    if (options.authToken !== undefined && !/^[\x21-\x7e]+$/.test(options.authToken)) {
      throw new InvalidArgument("the auth token must be printable ASCII without spaces");
    }
    this.authToken = options.authToken;
    this.rpcTimeoutMs = options.rpcTimeoutMs ?? limits.CLIENT_RPC_TIMEOUT_MS_DEFAULT;
    this.retry = { ...DEFAULT_RETRY, ...(options.retry ?? {}) };
  }

  /** Opens a session (a lease, `ttl` seconds, default 15) and starts its renewal every TTL/3. */
  async session(options: SessionOptions = {}): Promise<Session> {
    this.checkOpen();
    const session = await Session.create(this, options);
    this.sessions.add(session);
    return session;
  }

  /**
   * Takes `name` in a session of its own (`ttl` seconds), waiting at most `wait` seconds
   * (undefined: until granted; 0: try once). Throws WaitTimeout (Held for a busy try-lock).
   * `guard.release()` releases the lock and closes that session.
   */
  async lock(name: string, options: LockOptions & SessionOptions = {}): Promise<LockGuard> {
    const session = await this.session({ ttl: options.ttl, owner: options.owner });
    try {
      const guard = await session.lock(name, { wait: options.wait, signal: options.signal });
      guard.ownsSession = true;
      return guard;
    } catch (e) {
      await session.close().catch(() => undefined);
      throw e;
    }
  }

  /** One lock's holder and queue, read on the leader. */
  async describe(name: string): Promise<LockInfo> {
    const { response } = await this.call<Wire>("Describe", { name }, this.short());
    if (!response.lock) throw new ProtocolError("Describe answered without a lock");
    return lockInfoFromWire(response.lock);
  }

  /**
   * The held locks whose names start with `prefix` (every held lock with the default ""), in
   * name order, read on the leader. One request: the protocol does not page. At most
   * LIST_RESULTS_MAX locks (or `limit`), each with at most LIST_WAITERS_SHOWN_MAX waiters;
   * `truncated` says when more matched (narrow the prefix to see them).
   */
  async list(prefix = "", options: ListOptions = {}): Promise<LockList> {
    if (typeof prefix !== "string") throw new InvalidArgument("the prefix must be a string");
    const bytes = Buffer.byteLength(prefix, "utf8");
    if (bytes > limits.LOCK_NAME_BYTES_MAX) {
      throw new InvalidArgument(`the prefix is ${bytes} bytes, more than ${limits.LOCK_NAME_BYTES_MAX}`);
    }
    const limit = options.limit ?? 0;
    if (options.limit !== undefined && (!Number.isInteger(limit) || limit < 1 || limit > limits.LIST_RESULTS_MAX)) {
      throw new InvalidArgument(`limit ${options.limit} is out of range 1..=${limits.LIST_RESULTS_MAX}`);
    }
    const { response } = await this.call<Wire>("List", { prefix, limit }, this.short());
    return { locks: (response.locks ?? []).map(lockInfoFromWire), truncated: Boolean(response.truncated) };
  }

  /**
   * Force-releases `name` (an operator's incident tool; needs `admin` on the name under access
   * control): the next waiter gets it with a higher token, and the holder's client learns at
   * its next renewal that the grant is gone (its guard reports lost; a release throws NotHeld).
   * Answers the grant taken. Recorded in the audit log with `reason` and `operator`.
   *
   * The call is not sequenced, so it always goes out with a token: without `token`, the
   * holder's is read first (`describe`, which needs `read` on the name). A retry after a lost
   * answer then fails with Conflict `token-mismatch` or `lock-not-held` instead of taking the
   * next holder's grant; so does a release of a free lock (`lock-not-held`).
   */
  async forceRelease(name: string, options: ForceReleaseOptions): Promise<ForceReleased> {
    validateName(name);
    if (options === null || typeof options !== "object") throw new InvalidArgument("forceRelease needs options with a reason");
    const reason = checkReason(options.reason);
    const operator = checkOperator(options.operator);
    let token = options.token === undefined ? undefined : checkU64("the token", options.token, 1n);
    if (token === undefined) {
      const holder = (await this.describe(name)).holder;
      if (holder === undefined) throw new Conflict("lock-not-held", `lock ${JSON.stringify(name)} is not held`);
      token = holder.token;
    }
    const { response } = await this.call<Wire>(
      "AdminRelease",
      { name, token: String(token), reason, operator },
      this.short(),
    );
    return { sessionId: BigInt(response.session), token: BigInt(response.token) };
  }

  /**
   * Ends session `sessionId` as an expiry would (an operator's tool; needs `admin` on every
   * lock, prefix "", under access control): its locks go to their next waiters, its waits leave
   * their queues, its client reports it lost. Answers how many locks it held. Recorded in the
   * audit log. A session that does not exist (or a retry of a revoke that went through) is
   * SessionNotFound.
   */
  async revoke(sessionId: bigint, options: RevokeOptions): Promise<Revoked> {
    const session = checkU64("the session id", sessionId, 0n);
    if (options === null || typeof options !== "object") throw new InvalidArgument("revoke needs options with a reason");
    const reason = checkReason(options.reason);
    const operator = checkOperator(options.operator);
    const { response } = await this.call<Wire>("AdminRevoke", { session: String(session), reason, operator }, this.short());
    return { locks: Number(response.locks) };
  }

  /**
   * The audit log (force-releases and revocations), oldest first, read on the leader: at most
   * AUDIT_RECORDS_MAX records, the oldest dropped first. Needs `read` on every lock (prefix "")
   * under access control.
   */
  async audit(): Promise<AuditRecord[]> {
    const { response } = await this.call<Wire>("Audit", {}, this.short());
    return (response.records ?? []).map(auditRecordFromWire);
  }

  /**
   * The view of its Raft group of the node this client is talking to (any node answers; no
   * retry to the leader): its id, role, term, the leader it knows (0n: none), the voters.
   */
  async nodeStatus(): Promise<NodeStatus> {
    const { response: r } = await this.call<Wire>("NodeStatus", {}, this.short());
    return {
      id: BigInt(r.id),
      role: r.role,
      term: BigInt(r.term),
      leaderId: BigInt(r.leader_id),
      members: (r.members ?? []).map((m: Wire) => ({ id: BigInt(m.id), addr: m.addr })),
      clusterId: r.cluster_id,
    };
  }

  /** Ends every session of this client (releasing their locks) and closes its connections. */
  async close(): Promise<void> {
    await Promise.allSettled([...this.sessions].map((s) => s.close()));
    this.closed.abort();
    for (const c of this.route.channels.values()) c.close();
    this.route.channels.clear();
  }

  /** @internal */
  forget(session: Session): void {
    this.sessions.delete(session);
  }

  /** @internal */
  checkOpen(): void {
    if (this.closed.signal.aborted) throw new InvalidArgument("the client is closed");
  }

  /** @internal */
  short(signal?: AbortSignal): CallOpts {
    return { attemptTimeoutMs: this.rpcTimeoutMs, signal };
  }

  /**
   * @internal Renews `session` with the next batch of this client's keepalives: the first
   * renewal to join an empty batch sends it on the next turn of the event loop, with every
   * renewal that joined meanwhile (up to KEEPALIVE_SESSIONS_MAX per request).
   */
  keepAlive(session: WireSession, opts: CallOpts): Promise<Renewed> {
    return new Promise((reply) => {
      this.keepalives.push({ session, opts, reply });
      if (this.keepalives.length !== 1) return;
      setImmediate(() => {
        while (this.keepalives.length > 0) {
          const batch = this.keepalives.splice(0, limits.KEEPALIVE_SESSIONS_MAX);
          void this.sendKeepAlives(batch);
        }
      });
    });
  }

  private async sendKeepAlives(batch: KeepAliveWaiting[]): Promise<void> {
    // The longest attempt any member allows (each session stops waiting at its own deadline),
    // the shortest backoff cap.
    const caps = batch.map((w) => w.opts.backoffMaxMs).filter((v): v is number => v !== undefined);
    const opts: CallOpts = {
      attemptTimeoutMs: Math.max(...batch.map((w) => w.opts.attemptTimeoutMs)),
      backoffMaxMs: caps.length > 0 ? Math.min(...caps) : undefined,
    };
    try {
      const answered = await this.call<Wire>("KeepAlive", { sessions: batch.map((w) => w.session) }, opts);
      for (const w of batch) {
        const lease = (answered.response.leases ?? []).find((l: Wire) => l.id === w.session.id);
        w.reply({ ok: true, lease, endpoint: answered.endpoint, failedAttempts: answered.failedAttempts });
      }
    } catch (error) {
      for (const w of batch) w.reply({ ok: false, error });
    }
  }

  // ---- routing ----

  private channel(t: string): grpc.Client {
    let c = this.route.channels.get(t);
    if (c === undefined) {
      c = new LocksClient(t, this.credentials, {
        "grpc.max_receive_message_length": limits.CLIENT_MESSAGE_BYTES_MAX,
        "grpc.max_send_message_length": limits.CLIENT_MESSAGE_BYTES_MAX,
        "grpc.initial_reconnect_backoff_ms": limits.CLIENT_RECONNECT_BACKOFF_MS_INITIAL,
        "grpc.max_reconnect_backoff_ms": limits.CLIENT_RECONNECT_BACKOFF_MS_MAX,
        // This client's connections are its own: close() closes them.
        "grpc.use_local_subchannel_pool": 1,
      });
      this.route.channels.set(t, c);
    }
    return c;
  }

  private pick(): string {
    return this.route.leader ?? this.seeds[this.route.nextSeed % this.seeds.length];
  }

  private answered(t: string): void {
    if (this.route.refused?.target === t) this.route.refused = undefined;
    this.route.leader = t;
  }

  /** `t` is not the leader: go to the hint unless it names a member that just refused us, else to the next seed. Whether it follows a hint. */
  private reroute(t: string, hint?: string): boolean {
    const at = now();
    let h: string | undefined;
    try {
      h = hint === undefined ? undefined : target(hint).target;
    } catch {
      h = undefined;
    }
    if (h !== undefined && h === t) {
      // The member names itself: it leads but cannot answer yet. Stay, after the backoff.
      this.route.leader = h;
      return false;
    }
    if (h !== undefined && !this.route.recentlyRefused(h, at)) {
      this.route.leader = h;
      return true;
    }
    this.nextSeed(t, at);
    return false;
  }

  private unreachable(t: string): void {
    const at = now();
    this.route.refused = { target: t, at };
    this.nextSeed(t, at);
  }

  private nextSeed(t: string, at: number): void {
    this.route.leader = undefined;
    const n = this.seeds.length;
    if (this.seeds[this.route.nextSeed % n] === t) this.route.nextSeed++;
    if (n > 1 && this.route.recentlyRefused(this.seeds[this.route.nextSeed % n], at)) this.route.nextSeed++;
  }

  // ---- the retry loop ----

  private attempt<T>(t: string, method: string, request: unknown, timeoutMs: number, signal?: AbortSignal): Promise<T> {
    return new Promise((resolve, reject) => {
      const md = new grpc.Metadata();
      if (this.authToken !== undefined) md.set("authorization", `Bearer ${this.authToken}`);
      const c = this.channel(t) as unknown as Record<string, Function>;
      let settled = false;
      const onAbort = () => call.cancel();
      const call = c[method].call(
        c,
        request,
        md,
        { deadline: Date.now() + timeoutMs },
        (err: grpc.ServiceError | null, response: T) => {
          if (settled) return;
          settled = true;
          signal?.removeEventListener("abort", onAbort);
          if (signal?.aborted) reject(new Aborted());
          else if (err) reject(err);
          else resolve(response);
        },
      ) as grpc.ClientUnaryCall;
      if (signal?.aborted) call.cancel();
      else signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  /**
   * @internal Runs one logical request: the same `request` (same sequence number, if it has
   * one) on every attempt, until an answer, a non-retryable error, or the end of the retry
   * budget. Rejects with Aborted when `opts.signal` or close() stops it.
   */
  async call<T>(method: string, request: unknown, opts: CallOpts): Promise<Answered<T>> {
    const signal = opts.signal ? AbortSignal.any([opts.signal, this.closed.signal]) : this.closed.signal;
    const policy = this.retry;
    const cap = opts.backoffMaxMs === undefined ? policy.backoffMaxMs : Math.min(policy.backoffMaxMs, opts.backoffMaxMs);
    let ceiling = Math.min(policy.backoffInitialMs, cap);
    const start = now();
    let attempts = 0;
    for (;;) {
      if (signal.aborted) throw new Aborted();
      attempts++;
      const t = this.pick();
      let failure: Failure;
      try {
        const response = await this.attempt<T>(t, method, request, opts.attemptTimeoutMs, signal);
        this.answered(t);
        return { response, endpoint: t, failedAttempts: attempts - 1 };
      } catch (e) {
        if (e instanceof Aborted) throw e;
        const err = e as grpc.ServiceError;
        const mismatch = tlsMismatch(t, err);
        if (mismatch !== undefined) throw new TlsError(mismatch);
        failure = classify(err);
        if (failure.kind === "transport") failure = { kind: "transport", message: `cannot reach ${t}: ${failure.message}` };
      }
      let hinted = false;
      if (failure.kind === "fatal") throw failure.error;
      if (failure.kind === "unavailable") hinted = this.reroute(t, failure.leaderAddr);
      else this.unreachable(t);
      const elapsed = now() - start;
      if (attempts >= policy.attemptsMax || elapsed >= policy.elapsedMaxMs) {
        if (failure.kind === "unavailable") throw new Unavailable(attempts, elapsed, failure.message);
        throw new TransportError(attempts, elapsed, failure.message);
      }
      // A fresh leader hint is worth trying at once, but only the first time in a row.
      if (!(hinted && attempts === 1)) {
        // Equal jitter: uniformly in [ceiling/2, ceiling].
        const delay = ceiling / 2 + Math.random() * (ceiling / 2);
        ceiling = Math.min(ceiling * 2, cap);
        await sleep(Math.min(delay, Math.max(0, policy.elapsedMaxMs - (now() - start))), signal);
      }
    }
  }
}

/** Request-too-old: the server no longer remembers the request's outcome. */
export function isTooOld(e: unknown): boolean {
  return e instanceof Conflict && e.reason === "request-too-old";
}

/** Retry-worthy: the call's budget ran out but the cluster may come back. */
export function isRetryable(e: unknown): boolean {
  return e instanceof Unavailable || e instanceof TransportError;
}

export { LatchkeyError };
