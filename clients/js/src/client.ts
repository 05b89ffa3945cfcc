// `Client`: endpoints, leader routing, and the retry loop every RPC goes through
// (crates/client/src/client.rs is the reference).
import * as os from "node:os";
import * as path from "node:path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

import {
  classify,
  Conflict,
  ERROR_REASON_KEY,
  errorGroup,
  Failure,
  GROUP_KEY,
  Holder,
  InvalidArgument,
  LatchkeyError,
  LEADER_ADDR_KEY,
  Owner,
  ProtocolError,
  TlsError,
  tlsMismatch,
  TransportError,
  Unavailable,
} from "./errors";
import { checkGroups, groupOf, groupOfSession } from "./groups";
import * as limits from "./limits";
import { Aborted, now, sleep } from "./util";
import { checkMode, checkValue, modeFromWire, validateName } from "./lock";
import type { CampaignOptions, Leadership, LockGuard, LockMode, LockOptions } from "./lock";
import { Leader, leaderOf, Observe } from "./election";
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
  /**
   * Coalescing (issue #35; the Rust client's `ClientConfig::batch`), on by default (`false`
   * sends every operation in a call of its own): the
   * acquires, releases and closes this client's sessions send to one member while an earlier
   * batch to it is in flight wait for its answer and then go together, as one `Batch` call (at
   * most BATCH_CALL_OPS_MAX operations). A call made alone goes at once, so one call at a time
   * waits for nothing. Each operation keeps its own retries, leader hints and errors; an
   * acquire that must wait is answered in its batch and then long-polls in a call of its own.
   */
  batch?: boolean;
}

export interface RetryPolicy {
  /** Attempts of one request, the first included. */
  attemptsMax: number;
  /** Time from the first attempt after which no new attempt starts. */
  elapsedMaxMs: number;
  /**
   * The shorter time after which no new attempt starts while no attempt has reached a server
   * (every name failed to resolve, every connection was refused): an election answers "no
   * leader yet", a dead or misspelled endpoint does not answer.
   */
  unreachableMaxMs: number;
  /** Backoff before the second attempt; doubles after each failure. */
  backoffInitialMs: number;
  /** Cap of the doubling. */
  backoffMaxMs: number;
}

export const DEFAULT_RETRY: RetryPolicy = {
  attemptsMax: limits.CLIENT_ATTEMPTS_MAX,
  elapsedMaxMs: limits.CLIENT_RETRY_ELAPSED_MS_MAX,
  unreachableMaxMs: limits.CLIENT_UNREACHABLE_MS_MAX,
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
  /**
   * The Raft group the request is about (docs/protocol.md 2.4): it goes to that group's
   * leader. Default 0, the only group of a cluster of one; ANY_MEMBER for calls any member
   * answers.
   */
  group?: number;
  /** Each attempt rides the next `Batch` call to its member when the client batches. */
  batch?: boolean;
}

/** The route of calls any member answers (`NodeStatus`): kept apart from every group's, so that the member that answered is not taken for a group's leader. */
export const ANY_MEMBER = -1;

/** An answer, with who gave it and after how many failed attempts. */
export interface Answered<T> {
  response: T;
  endpoint: string;
  failedAttempts: number;
}

/** One lock as the leader sees it. */
export interface LockInfo {
  name: string;
  /** Undefined when the lock is free; of several holders (readers, permits), the first granted. */
  holder?: Holder;
  /**
   * How it is held: "exclusive" (a mutex or a writer; also a free lock), "shared" (readers) or
   * "permits" (a semaphore of `permits` permits).
   */
  mode: LockMode;
  /** A semaphore's number of permits; 0 with the other modes. */
  permits: number;
  /** Every holder, in the order granted: one for a mutex or a writer. */
  holders: Holder[];
  /** Sessions queued for the lock. */
  waiters: number;
  /** Waiters in queue order, each with how it asked. */
  queue: Array<{ sessionId: bigint; waitedMs: number; owner?: Owner; mode: LockMode }>;
  /** The holder's lock-delay in ms (0: none; docs/primitives.md). */
  lockDelayMs: number;
  /** Ms left of a running lock-delay (the lock then has no holder); undefined: none runs. */
  delayRemainingMs?: number;
  /** The lost grant's token while a lock-delay runs: `forceRelease` with it and `endDelay` ends the delay. */
  delayToken?: bigint;
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
  /**
   * End the lock's running lock-delay instead of taking a holder (only the one under `token`;
   * undefined token: the delay's, read first): its first waiter gets the lock now. Conflict
   * `no-lock-delay` if none runs. Without it, a release never ends a delay.
   */
  endDelay?: boolean;
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
  /** The Raft group whose log holds the record (0 in a cluster of one): `index` is of that group's log. */
  group: number;
  /** The authenticated identity; undefined without access control ("anonymous"). */
  identity?: string;
  /** What the operator's tool said about them (e.g. user@host). */
  operator: string;
  reason: string;
}

/** One node's view of its Raft group (`nodeStatus`). */
export interface NodeStatus {
  id: bigint;
  /** "leader", "follower", "candidate", "learner", "outside" (replica subsets: not in this group) or "shutdown". */
  role: string;
  term: bigint;
  /** 0n when no leader is known. */
  leaderId: bigint;
  members: Array<{ id: bigint; addr: string }>;
  clusterId: string;
  /** The cluster's Raft groups (1 for a server from before groups). The fields above are group 0's. */
  groups: number;
  /** This node's view of each group, in group order (empty from a server before groups). */
  groupStatus: GroupStatus[];
}

/** One node's view of one Raft group (`NodeStatus.groupStatus`). */
export interface GroupStatus {
  group: number;
  /** "leader", "follower", "candidate", "learner", "outside" (replica subsets: not in this group) or "shutdown". */
  role: string;
  term: bigint;
  lastLogIndex: bigint;
  appliedIndex: bigint;
  /** 0n when no leader is known. */
  leaderId: bigint;
  sessions: number;
  locks: number;
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
    value: valueFromWire(info.value),
  };
}

function grantFromWire(h: Wire): Holder {
  return {
    sessionId: BigInt(h.session),
    token: BigInt(h.token),
    heldForMs: Number(h.held_for_ms),
    owner: ownerFromWire(h.owner),
    value: valueFromWire(h.value),
  };
}

/** A wire `optional bytes value`: undefined when unset (proto-loader leaves it out). */
export function valueFromWire(v: unknown): Buffer | undefined {
  if (v === undefined || v === null) return undefined;
  if (Buffer.isBuffer(v)) return v;
  if (v instanceof Uint8Array) return Buffer.from(v);
  throw new ProtocolError(`an election value came as ${typeof v}, not bytes`);
}

function lockInfoFromWire(info: Wire): LockInfo {
  const holder = holderFromWire(info);
  const holders: Holder[] = (info.holders ?? []).map(grantFromWire);
  // A server from before issue #32 names its one holder only.
  if (holder && holders.length === 0) holders.push(holder);
  return {
    name: info.name,
    holder,
    mode: modeFromWire(info.mode, info.name),
    permits: Number(info.permits ?? 0),
    holders,
    waiters: Number(info.waiters),
    queue: (info.queue ?? []).map((w: Wire) => ({
      sessionId: BigInt(w.session),
      waitedMs: Number(w.waited_ms),
      owner: ownerFromWire(w.owner),
      mode: modeFromWire(w.mode, info.name),
    })),
    lockDelayMs: Number(info.lock_delay_ms ?? 0),
    delayRemainingMs: info.delay_remaining_ms === undefined || info.delay_remaining_ms === null ? undefined : Number(info.delay_remaining_ms),
    delayToken: info.delay_token === undefined || info.delay_token === null ? undefined : BigInt(info.delay_token),
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
    group: Number(r.group ?? 0),
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
  /**
   * The node believed to lead each Raft group (by group; ANY_MEMBER for NodeStatus): the last
   * one that answered a call for it, or the last hint. At most GROUPS_MAX + 1 entries.
   */
  leaders = new Map<number, string>();
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
  /** The session's group: the batch goes to that group's leader (`opts.group`). */
  opts: CallOpts & { group: number };
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
  /** The cluster's Raft group count, once a server said it (CreateSession, NodeStatus). */
  private groupCount?: number;
  /** `options.batch`: acquires, releases and closes ride `Batch` calls. */
  readonly batch: boolean;
  /** With `batch`, the operations waiting for a `Batch` call, per member (made on first use). */
  private readonly batchQueues = new Map<string, BatchQueue>();

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
    this.batch = options.batch ?? true;
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
    checkMode(options); // bad input fails before a session is made
    const session = await this.session({ ttl: options.ttl, owner: options.owner });
    try {
      const guard = await session.lock(name, {
        wait: options.wait,
        signal: options.signal,
        shared: options.shared,
        permits: options.permits,
        lockDelayMs: options.lockDelayMs,
        onPosition: options.onPosition,
      });
      guard.ownsSession = true;
      return guard;
    } catch (e) {
      await session.close().catch(() => undefined);
      throw e;
    }
  }

  /**
   * Leads the election `name` in a session of its own (`ttl` seconds): see `Session.campaign`.
   * `leadership.resign()` (or `await using`) resigns and closes that session.
   */
  async campaign(name: string, value: string | Uint8Array, options: CampaignOptions & SessionOptions = {}): Promise<Leadership> {
    checkValue(value); // bad input fails before a session is made
    const session = await this.session({ ttl: options.ttl, owner: options.owner });
    try {
      const leadership = await session.campaign(name, value, { wait: options.wait, signal: options.signal });
      leadership.ownsSession = true;
      return leadership;
    } catch (e) {
      await session.close().catch(() => undefined);
      throw e;
    }
  }

  /**
   * The current leader of the election `name` (its exclusive holder; a linearizable read on the
   * leader), or undefined when nobody leads. Needs `read` on the name.
   */
  async leader(name: string): Promise<Leader | undefined> {
    return leaderOf(await this.describe(name));
  }

  /**
   * Every change of leader or value of the election `name`, from its current leader on:
   * `for await (const leader of await client.observe(name))` (see Observe; `close()` ends it).
   * Needs `read` on the name.
   */
  async observe(name: string): Promise<Observe> {
    validateName(name);
    const observe = new Observe(this, name);
    await observe.start();
    return observe;
  }

  /** @internal A server-streaming call (Watch) on `t`, open-ended. */
  stream(t: string, method: string, request: unknown): grpc.ClientReadableStream<Wire> {
    const md = new grpc.Metadata();
    if (this.authToken !== undefined) md.set("authorization", `Bearer ${this.authToken}`);
    const c = this.channel(t) as unknown as Record<string, Function>;
    return c[method].call(c, request, md) as grpc.ClientReadableStream<Wire>;
  }

  /** @internal The transport to `t` failed (a broken watch stream): try another member next. */
  streamBroke(t: string): void {
    this.unreachable(t);
  }

  /** One lock's holder and queue, read on the leader (of the lock's Raft group). */
  async describe(name: string): Promise<LockInfo> {
    return (await this.describeRead(name))[0];
  }

  /**
   * @internal `describe`, with the index of the last log entry applied when it was read
   * (DescribeResponse.read_index): every watch event at or below it is reflected in the answer.
   */
  async describeRead(name: string): Promise<[LockInfo, bigint]> {
    const { response } = await this.call<Wire>("Describe", { name }, this.forLock(name));
    if (!response.lock) throw new ProtocolError("Describe answered without a lock");
    return [lockInfoFromWire(response.lock), BigInt(response.read_index ?? 0)];
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
    let groups = this.groupCount;
    if (groups === undefined) {
      // Not known yet: asked as of a cluster of one, which is what most are; a cluster of
      // several refuses a List without a group, and is then asked how many it has.
      try {
        const { response } = await this.call<Wire>("List", { prefix, limit }, this.short());
        return { locks: (response.locks ?? []).map(lockInfoFromWire), truncated: Boolean(response.truncated) };
      } catch (e) {
        if (!isNotWithGroups(e)) throw e;
      }
      groups = await this.groups();
    }
    if (groups === 1) {
      const { response } = await this.call<Wire>("List", { prefix, limit }, this.short());
      return { locks: (response.locks ?? []).map(lockInfoFromWire), truncated: Boolean(response.truncated) };
    }
    // Each group at its leader, at once, the answers merged in name order.
    const answers = await Promise.all(
      Array.from({ length: groups }, (_, g) =>
        this.call<Wire>("List", { prefix, limit, group: g }, { ...this.short(), group: g }).then((a) => a.response),
      ),
    );
    return mergeLists(answers, limit === 0 ? limits.LIST_RESULTS_MAX : limit);
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
   *
   * A release of a holder that asked for a lock-delay starts the delay; a retry of it answers
   * the first attempt's grant and ends nothing, and a lock in a delay has no holder to take
   * (`lock-not-held`). Ending the delay is `endDelay: true`, which answers the grant whose
   * loss started it.
   */
  async forceRelease(name: string, options: ForceReleaseOptions): Promise<ForceReleased> {
    validateName(name);
    if (options === null || typeof options !== "object") throw new InvalidArgument("forceRelease needs options with a reason");
    const reason = checkReason(options.reason);
    const operator = checkOperator(options.operator);
    let token = options.token === undefined ? undefined : checkU64("the token", options.token, 1n);
    if (options.endDelay !== undefined && typeof options.endDelay !== "boolean") {
      throw new InvalidArgument("endDelay is true or false");
    }
    const endDelay = options.endDelay === true;
    if (token === undefined) {
      // Of several holders (readers, permits), the first granted's; with endDelay, the
      // running delay's.
      const info = await this.describe(name);
      const quoted = JSON.stringify(name);
      if (endDelay) {
        if (info.delayToken === undefined) throw new Conflict("no-lock-delay", `no lock-delay of ${quoted} is running`);
        token = info.delayToken;
      } else if (info.holder !== undefined) token = info.holder.token;
      else if (info.delayToken !== undefined) {
        throw new Conflict(
          "lock-not-held",
          `lock ${quoted} is not held: it is in the lock-delay that began when its grant ${info.delayToken} was lost ` +
            "(ending the delay is its own request: forceRelease(name, { endDelay: true, ... }))",
        );
      } else throw new Conflict("lock-not-held", `lock ${quoted} is not held`);
    }
    const { response } = await this.call<Wire>(
      "AdminRelease",
      { name, token: String(token), reason, operator, end_delay: endDelay },
      this.forLock(name),
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
    const { response } = await this.call<Wire>(
      "AdminRevoke",
      { session: String(session), reason, operator },
      { ...this.short(), group: this.groupCount === undefined ? 0 : groupOfSession(session, this.groupCount) },
    );
    return { locks: Number(response.locks) };
  }

  /**
   * The audit log (force-releases and revocations), oldest first, read on the leader: at most
   * AUDIT_RECORDS_MAX records, the oldest dropped first. Needs `read` on every lock (prefix "")
   * under access control.
   */
  async audit(): Promise<AuditRecord[]> {
    let groups = this.groupCount;
    if (groups === undefined) {
      try {
        const { response } = await this.call<Wire>("Audit", {}, this.short());
        return (response.records ?? []).map(auditRecordFromWire);
      } catch (e) {
        if (!isNotWithGroups(e)) throw e;
      }
      groups = await this.groups();
    }
    if (groups === 1) {
      const { response } = await this.call<Wire>("Audit", {}, this.short());
      return (response.records ?? []).map(auditRecordFromWire);
    }
    // With several Raft groups: each group's log at its leader, the records merged by time
    // (stable: one group's records stay in log order; each names its group).
    const logs = await Promise.all(
      Array.from({ length: groups }, (_, g) => this.call<Wire>("Audit", { group: g }, { ...this.short(), group: g })),
    );
    const records = logs.flatMap(({ response }) => (response.records ?? []).map(auditRecordFromWire));
    return records.sort((a, b) => a.atMs - b.atMs);
  }

  /**
   * The view of its Raft group of the node this client is talking to (any node answers; no
   * retry to the leader): its id, role, term, the leader it knows (0n: none), the voters.
   */
  async nodeStatus(): Promise<NodeStatus> {
    const { response: r } = await this.call<Wire>("NodeStatus", {}, { ...this.short(), group: ANY_MEMBER });
    return {
      id: BigInt(r.id),
      role: r.role,
      term: BigInt(r.term),
      leaderId: BigInt(r.leader_id),
      members: (r.members ?? []).map((m: Wire) => ({ id: BigInt(m.id), addr: m.addr })),
      clusterId: r.cluster_id,
      groups: Math.max(1, Number(r.groups ?? 0)),
      groupStatus: (r.group_status ?? []).map((g: Wire) => ({
        group: Number(g.group),
        role: g.role,
        term: BigInt(g.term),
        lastLogIndex: BigInt(g.last_log_index ?? 0),
        appliedIndex: BigInt(g.applied_index ?? 0),
        leaderId: BigInt(g.leader_id),
        sessions: Number(g.sessions),
        locks: Number(g.locks),
      })),
    };
  }

  /**
   * The cluster's Raft group count (`serve --groups`; 1 for a server from before groups):
   * known from a session's creation, else asked of any member once (NodeStatus) and kept.
   */
  async groups(): Promise<number> {
    if (this.groupCount !== undefined) return this.groupCount;
    const { response } = await this.call<Wire>("NodeStatus", {}, { ...this.short(), group: ANY_MEMBER });
    return this.learnedGroups(Number(response.groups ?? 0), "NodeStatus");
  }

  /**
   * @internal The group count a server answered (0 from a server before groups: one),
   * remembered; it must not change.
   */
  learnedGroups(answered: number, what: string): number {
    const groups = Math.max(1, answered);
    try {
      checkGroups(groups);
    } catch (e) {
      throw new ProtocolError(`${what}: ${(e as Error).message}`);
    }
    if (this.groupCount !== undefined && this.groupCount !== groups) {
      throw new ProtocolError(`the cluster answered ${groups} Raft groups, and ${this.groupCount} before`);
    }
    this.groupCount = groups;
    return groups;
  }

  /** @internal The group count, if a server said it already. */
  knownGroups(): number | undefined {
    return this.groupCount;
  }

  /**
   * The options of a short call about the lock `name`: to its group's leader. Before the
   * group count is known, group 0's route: the server routes the call itself, and an error of
   * another group names it (`latchkey-group`), whose route the retry then takes.
   */
  private forLock(name: string): CallOpts {
    return { ...this.short(), group: this.groupCount === undefined ? 0 : groupOf(name, this.groupCount) };
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
   * @internal Renews `session` (of Raft group `opts.group`) with the next batch of this
   * client's keepalives: the first renewal to join an empty batch sends it on the next turn of
   * the event loop (in a cluster of several groups, KEEPALIVE_GATHER_MS later: the group
   * sessions of a logical session are due at one instant, but their timers fire apart), with
   * every renewal that joined meanwhile (up to KEEPALIVE_SESSIONS_MAX per request). With
   * several groups, one request per member that leads any of the batch's groups.
   */
  keepAlive(session: WireSession, opts: CallOpts & { group: number }): Promise<Renewed> {
    return new Promise((reply) => {
      this.keepalives.push({ session, opts, reply });
      if (this.keepalives.length !== 1) return;
      const send = () => {
        while (this.keepalives.length > 0) {
          const batch = this.keepalives.splice(0, limits.KEEPALIVE_SESSIONS_MAX);
          for (const part of this.byLeader(batch)) void this.sendKeepAlives(part);
        }
      };
      if ((this.groupCount ?? 1) > 1) setTimeout(send, limits.KEEPALIVE_GATHER_MS);
      else setImmediate(send);
    });
  }

  /** The batch split by the member each session's group is routed to: one request each. */
  private byLeader(batch: KeepAliveWaiting[]): KeepAliveWaiting[][] {
    const by = new Map<string, KeepAliveWaiting[]>();
    for (const w of batch) {
      const t = this.pick(w.opts.group);
      const part = by.get(t);
      if (part === undefined) by.set(t, [w]);
      else part.push(w);
    }
    return [...by.values()];
  }

  private async sendKeepAlives(batch: KeepAliveWaiting[]): Promise<void> {
    // The longest attempt any member allows (each session stops waiting at its own deadline),
    // the shortest backoff cap. Every group of the batch is routed to the member its first
    // session's group is (`byLeader`); an error names its group, whose route it then moves.
    const caps = batch.map((w) => w.opts.backoffMaxMs).filter((v): v is number => v !== undefined);
    const opts: CallOpts = {
      attemptTimeoutMs: Math.max(...batch.map((w) => w.opts.attemptTimeoutMs)),
      backoffMaxMs: caps.length > 0 ? Math.min(...caps) : undefined,
      group: batch[0].opts.group,
    };
    try {
      const answered = await this.call<Wire>("KeepAlive", { sessions: batch.map((w) => w.session) }, opts);
      // The groups the member did not renew (it does not lead them now): each moves its route
      // to the hint, as an error of that group would, and its sessions' renewals fail this
      // time, to be retried on their schedule's next step, at that group's leader. Only the
      // groups this batch carries: the route map stays within them whatever a server sends.
      const refused = new Map<number, Unavailable>();
      for (const r of answered.response.refused ?? []) {
        const group = Number(r.group);
        if (!batch.some((w) => w.opts.group === group) || refused.has(group)) continue;
        this.reroute(group, answered.endpoint, r.leader_addr ? r.leader_addr : undefined);
        refused.set(group, new Unavailable(answered.failedAttempts + 1, 0, `${answered.endpoint}: ${r.message} (${r.reason})`));
      }
      for (const w of batch) {
        const error = refused.get(w.opts.group);
        if (error !== undefined) {
          w.reply({ ok: false, error });
          continue;
        }
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
        "grpc.keepalive_time_ms": limits.CLIENT_PING_INTERVAL_MS,
        "grpc.keepalive_timeout_ms": limits.CLIENT_PING_TIMEOUT_MS,
        "grpc.keepalive_permit_without_calls": 0,
        // This client's connections are its own: close() closes them.
        "grpc.use_local_subchannel_pool": 1,
      });
      this.route.channels.set(t, c);
    }
    return c;
  }

  /** @internal The target the next attempt for `group` goes to. */
  pick(group: number): string {
    const r = this.route;
    // Any member answers NodeStatus: the one it asked last, else group 0's leader, else a seed.
    const leader = r.leaders.get(group) ?? (group === ANY_MEMBER ? r.leaders.get(0) : undefined);
    return leader ?? this.seeds[r.nextSeed % this.seeds.length];
  }

  private answered(group: number, t: string): void {
    if (this.route.refused?.target === t) this.route.refused = undefined;
    this.route.leaders.set(group, t);
  }

  /**
   * `t` is not the leader of `group`: go to the hint unless it names a member that just
   * refused us, else to the next seed. Whether it follows a hint.
   */
  private reroute(group: number, t: string, hint?: string): boolean {
    const at = now();
    let h: string | undefined;
    try {
      h = hint === undefined ? undefined : target(hint).target;
    } catch {
      h = undefined;
    }
    if (h !== undefined && h === t) {
      // The member names itself: it leads but cannot answer yet. Stay, after the backoff.
      this.route.leaders.set(group, h);
      return false;
    }
    if (h !== undefined && !this.route.recentlyRefused(h, at)) {
      this.route.leaders.set(group, h);
      return true;
    }
    this.route.leaders.delete(group);
    this.nextSeed(t, at);
    return false;
  }

  /** `t` failed in transport: forget it as every group's leader, go to the next seed, and leave hints naming it alone for a while. */
  private unreachable(t: string): void {
    const at = now();
    this.route.refused = { target: t, at };
    for (const [group, leader] of this.route.leaders) if (leader === t) this.route.leaders.delete(group);
    this.nextSeed(t, at);
  }

  private nextSeed(t: string, at: number): void {
    const n = this.seeds.length;
    if (this.seeds[this.route.nextSeed % n] === t) this.route.nextSeed++;
    if (n > 1 && this.route.recentlyRefused(this.seeds[this.route.nextSeed % n], at)) this.route.nextSeed++;
  }

  // ---- coalescing (`options.batch`; crates/client/src/batch.rs, Coalescer) ----

  /**
   * One attempt in the next `Batch` call to `t`: the answer its own call would have had, or
   * its error (a ServiceError rebuilt from the operation's BatchError, classified as that
   * call's). The operation that finds no batch in flight starts the sender: it goes at once.
   * A caller that gives up (its signal, its deadline) leaves its operation in the batch and
   * drops the answer.
   */
  private attemptBatched<T>(t: string, method: string, request: unknown, timeoutMs: number, signal?: AbortSignal): Promise<T> {
    return new Promise((resolve, reject) => {
      let q = this.batchQueues.get(t);
      if (q === undefined) {
        q = { sending: false, waiting: [] };
        this.batchQueues.set(t, q);
      }
      let settled = false;
      const onAbort = () => finish({ ok: false, error: new Aborted() });
      // The batch in flight, then this one: each bounded by rpcTimeoutMs; the extra second
      // only bounds a lost answer.
      const timer = setTimeout(
        () => finish({ ok: false, error: deadlineError(`${t} did not answer within ${timeoutMs} ms`) }),
        timeoutMs + this.rpcTimeoutMs + 1_000,
      );
      const finish = (a: BatchAnswer) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        if (a.ok) resolve(a.value as T);
        else reject(a.error);
      };
      if (signal?.aborted) return finish({ ok: false, error: new Aborted() });
      signal?.addEventListener("abort", onAbort, { once: true });
      q.waiting.push({ op: BATCH_OPS[method], request, settle: finish });
      if (!q.sending) {
        q.sending = true;
        void this.sendBatches(t, q);
      }
    });
  }

  /** Sends batches to `t` while operations wait; ends when none do. */
  private async sendBatches(t: string, q: BatchQueue): Promise<void> {
    for (;;) {
      const batch = q.waiting.splice(0, limits.BATCH_CALL_OPS_MAX);
      if (batch.length === 0) {
        q.sending = false;
        return;
      }
      try {
        const ops = batch.map((w) => ({ [w.op]: w.request }));
        const response = await this.attempt<Wire>(t, "Batch", { ops }, this.rpcTimeoutMs, this.closed.signal);
        const answers = batchAnswers(batch, response);
        batch.forEach((w, i) => w.settle(answers[i]));
      } catch (e) {
        // The call failed as a whole (transport, deadline, the client closed): each operation
        // fails with its status, as its own call would have.
        for (const w of batch) w.settle({ ok: false, error: e });
      }
    }
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
    let group = opts.group ?? 0;
    // Whether an attempt reached a server: until one has, the shorter budget applies, once
    // every seed was tried (one dead member whose connection times out took the whole budget
    // in one attempt, issue #34's nemesis).
    let reached = false;
    const untried = new Set<string>(this.seeds);
    for (;;) {
      if (signal.aborted) throw new Aborted();
      attempts++;
      const t = this.pick(group);
      untried.delete(t);
      let failure: Failure;
      try {
        const response =
          opts.batch && this.batch && BATCH_OPS[method] !== undefined
            ? await this.attemptBatched<T>(t, method, request, opts.attemptTimeoutMs, signal)
            : await this.attempt<T>(t, method, request, opts.attemptTimeoutMs, signal);
        this.answered(group, t);
        return { response, endpoint: t, failedAttempts: attempts - 1 };
      } catch (e) {
        if (e instanceof Aborted) throw e;
        // An operation's answer this client cannot read (a Batch call's wrong result).
        if (e instanceof LatchkeyError) throw e;
        const err = e as grpc.ServiceError;
        const mismatch = tlsMismatch(t, err);
        if (mismatch !== undefined) throw new TlsError(mismatch);
        failure = classify(err);
        if (failure.kind === "transport") failure = { ...failure, message: `cannot reach ${t}: ${failure.message}` };
        // An error of a cluster of several groups names its group: its leader hint is that
        // group's leader, and the request (about one lock or session, whose group the server
        // picked) goes on there. Only a group the cluster has: the route map stays bounded
        // whatever a server sends.
        const named = group === ANY_MEMBER ? undefined : errorGroup(err);
        if (named !== undefined && named < (this.groupCount ?? limits.GROUPS_MAX)) group = named;
      }
      let hinted = false;
      if (failure.kind === "fatal") throw failure.error;
      if (failure.kind === "unavailable") hinted = this.reroute(group, t, failure.leaderAddr);
      else this.unreachable(t);
      reached ||= failure.kind !== "transport" || failure.connected !== false;
      const budget =
        reached || untried.size > 0 ? policy.elapsedMaxMs : Math.min(policy.elapsedMaxMs, policy.unreachableMaxMs);
      const elapsed = now() - start;
      if (attempts >= policy.attemptsMax || elapsed >= budget) {
        if (failure.kind === "unavailable") throw new Unavailable(attempts, elapsed, failure.message);
        throw new TransportError(attempts, elapsed, failure.message);
      }
      // A fresh leader hint is worth trying at once, but only the first time in a row.
      if (!(hinted && attempts === 1)) {
        // Equal jitter: uniformly in [ceiling/2, ceiling].
        const delay = ceiling / 2 + Math.random() * (ceiling / 2);
        ceiling = Math.min(ceiling * 2, cap);
        await sleep(Math.min(delay, Math.max(0, budget - (now() - start))), signal);
      }
    }
  }
}

/** The calls that may ride a `Batch` call, and the BatchOp/BatchResult field each one is. */
const BATCH_OPS: Record<string, string> = { Acquire: "acquire", Release: "release", CloseSession: "close_session" };

type BatchAnswer = { ok: true; value: Wire } | { ok: false; error: unknown };

interface BatchWaiting {
  op: string;
  request: unknown;
  settle: (a: BatchAnswer) => void;
}

interface BatchQueue {
  /** A batch to this member is in flight (its sender runs). */
  sending: boolean;
  waiting: BatchWaiting[];
}

/** A status as grpc-js reports one: what `classify` reads. */
function serviceError(code: number, message: string, metadata: grpc.Metadata): grpc.ServiceError {
  return Object.assign(new Error(`${code} ${grpc.status[code] ?? ""}: ${message}`), { code, details: message, metadata });
}

function deadlineError(message: string): grpc.ServiceError {
  return serviceError(grpc.status.DEADLINE_EXCEEDED, message, new grpc.Metadata());
}

/**
 * The status the operation's own call would have failed with: its BatchError's code and
 * message, and its reason, leader hint and group as that call's metadata.
 */
export function batchErrorStatus(e: Wire): grpc.ServiceError {
  const md = new grpc.Metadata();
  if (e.reason) md.set(ERROR_REASON_KEY, String(e.reason));
  if (e.leader_addr) md.set(LEADER_ADDR_KEY, String(e.leader_addr));
  // `optional uint32 group`: present when proto-loader names it in the synthetic oneof.
  if (e._group === "group" && e.group !== undefined && e.group !== null) md.set(GROUP_KEY, String(e.group));
  return serviceError(Number(e.code), String(e.message ?? ""), md);
}

/** Each operation's answer out of a Batch call's: its own response, or its error. */
export function batchAnswers(batch: Array<{ op: string }>, response: Wire): BatchAnswer[] {
  const results: Wire[] = response?.results ?? [];
  if (results.length !== batch.length) {
    const error = new ProtocolError(`a Batch call of ${batch.length} operations was answered with ${results.length} results`);
    return batch.map(() => ({ ok: false, error }));
  }
  return batch.map((w, i) => {
    const r = results[i];
    if (r.result === "error") return { ok: false, error: batchErrorStatus(r.error) };
    if (r.result === w.op && r[w.op] !== undefined && r[w.op] !== null) return { ok: true, value: r[w.op] };
    return { ok: false, error: new ProtocolError(`a Batch call answered a ${w.op} operation with ${r.result ?? "no result"}`) };
  });
}

/** A cluster of several Raft groups refused a call that must name its group. */
export function isNotWithGroups(e: unknown): boolean {
  return e instanceof Conflict && e.reason === "not-with-groups";
}

/** UTF-8 byte order, the server's order of names (JavaScript's `<` compares UTF-16 units). */
function byName(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));
}

/**
 * The List answers of every group merged in name order, at most `max` locks. A truncated
 * group's answer ends at its last name: the merged list stops there too, or it would skip that
 * group's names after it and still look like a sorted prefix.
 */
export function mergeLists(answers: Wire[], max: number): LockList {
  let truncated = false;
  let cut: string | undefined;
  const locks: LockInfo[] = [];
  for (const answer of answers) {
    const mine: LockInfo[] = (answer.locks ?? []).map(lockInfoFromWire);
    if (answer.truncated) {
      truncated = true;
      const last = mine.reduce<string | undefined>((m, l) => (m === undefined || byName(l.name, m) > 0 ? l.name : m), undefined);
      if (last !== undefined && (cut === undefined || byName(last, cut) < 0)) cut = last;
    }
    locks.push(...mine);
  }
  let merged = cut === undefined ? locks : locks.filter((l) => byName(l.name, cut!) <= 0);
  merged.sort((a, b) => byName(a.name, b.name));
  if (merged.length > max) {
    merged = merged.slice(0, max);
    truncated = true;
  }
  return { locks: merged, truncated };
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
