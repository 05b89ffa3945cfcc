// `Session`: a lease on the server, renewed in the background, and the client's own idea of
// when it may have run out (crates/client/src/session.rs is the reference).
//
// The server expires a session `ttl` after it last received a renewal. The client cannot see
// that clock, so it keeps a conservative one of its own: the send time of the last renewal the
// server acknowledged, plus the TTL, minus a safety margin (`ClientLease`). The server received
// that renewal after it was sent, so its deadline is later than the client's by at least the
// margin. When the client's deadline passes, every guard of the session reports lost while the
// server still holds the locks for the margin: the time a holder has to stop working.
import { EventEmitter } from "node:events";
import * as os from "node:os";

import type { Client, CallOpts, Wire, WireSession } from "./client";
import { isNotWithGroups } from "./client";
import { InvalidArgument, LatchkeyError, Owner, ProtocolError, SessionLost, SessionNotFound } from "./errors";
import { groupOf, groupOfSession } from "./groups";
import * as limits from "./limits";
import { CampaignOptions, Leadership, LockGuard, LockOptions, acquire, campaign } from "./lock";
import { Aborted, now, Semaphore, sleepUntil } from "./util";

/** The safety margin for a lease of `ttlMs`: max(ttl / 5, 200 ms). */
/**
 * The contended names after a keepalive's list: all of them, or, `truncated`, the first of them
 * in name order, which says nothing of the names after its last one: what was known of those is
 * kept; names up to it that it does not list are not contended (docs/protocol.md 6.8). Names are
 * compared by their UTF-8 bytes, the server's order (JavaScript's `<` compares UTF-16 units).
 */
export function mergeContended(old: Set<string>, listed: string[], truncated: boolean): Set<string> {
  const next = new Set(listed);
  if (truncated) {
    const after = (a: string, b: string) => Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8")) > 0;
    let cut: string | undefined;
    for (const n of listed) if (cut === undefined || after(n, cut)) cut = n;
    for (const n of old) if (cut === undefined || after(n, cut)) next.add(n);
  }
  return next;
}

export function safetyMarginMs(ttlMs: number): number {
  return Math.max(ttlMs / limits.CLIENT_SAFETY_MARGIN_TTL_DIVISOR, limits.CLIENT_SAFETY_MARGIN_MS_MIN);
}

/** A session's lease as the client sees it: pure arithmetic on instants (ms of `now()`), no I/O. */
export class ClientLease {
  ttlMs: number;
  marginMs: number;
  /** Send time of the newest acknowledged renewal (or of the CreateSession). */
  ackedSent: number;
  /** After a failed renewal: when to try again (sooner than the regular schedule). */
  retryAt?: number;
  /**
   * The group sessions of one logical session renew on one schedule (issue #16): each renewal
   * falls on `grid + k * interval`, the first such instant at most an interval after the last
   * acknowledged send, so that all of them are due at the same instant and travel in the same
   * keepalive requests, however far apart they were made.
   */
  grid?: number;

  constructor(sent: number, ttlMs: number, grid?: number) {
    this.ttlMs = ttlMs;
    this.marginMs = safetyMarginMs(ttlMs);
    this.ackedSent = sent;
    this.grid = grid;
  }

  /** After this instant the locks may be lost. */
  deadline(): number {
    return this.ackedSent + Math.max(0, this.ttlMs - this.marginMs);
  }

  /** When to send the next renewal. */
  nextRenewal(): number {
    if (this.retryAt !== undefined) return this.retryAt;
    const interval = this.ttlMs / limits.CLIENT_RENEWAL_TTL_DIVISOR;
    const regular = this.ackedSent + interval;
    if (this.grid !== undefined && regular > this.grid && interval > 0) {
      // The last grid instant at or before the regular time: after the last send, and never
      // later than the regular schedule.
      const aligned = regular - ((regular - this.grid) % interval);
      if (aligned > this.ackedSent) return aligned;
    }
    return regular;
  }

  /** The server acknowledged a renewal sent at `sent`, granting `serverTtlMs`. An older ack never moves the deadline back; a shorter server TTL is believed. */
  acknowledged(sent: number, serverTtlMs: number): void {
    if (sent >= this.ackedSent) this.ackedSent = sent;
    if (serverTtlMs > 0 && serverTtlMs < this.ttlMs) {
      this.ttlMs = serverTtlMs;
      this.marginMs = safetyMarginMs(serverTtlMs);
    }
    this.retryAt = undefined;
  }

  /** A renewal failed at `at`: try again after a tenth of the TTL (at least 100 ms), never later than the deadline. */
  failed(at: number): void {
    this.retryAt = Math.min(at + Math.max(this.ttlMs / 10, 100), this.deadline());
  }
}

/**
 * The sequence numbers of a session's unanswered requests. A new request waits while its number
 * would be SESSION_SEQ_WINDOW_MAX or more past the oldest unanswered one, so that the server's
 * memory of outcomes still holds the oldest one's when it is retried.
 */
export class SeqWindow {
  private next: number;
  private unanswered = new Set<number>();
  private waiting: Array<() => void> = [];

  constructor(first = 1) {
    this.next = first;
  }

  tryBegin(): number | undefined {
    let oldest = this.next;
    for (const s of this.unanswered) oldest = Math.min(oldest, s);
    if (this.next - oldest >= limits.SESSION_SEQ_WINDOW_MAX) return undefined;
    const seq = this.next++;
    this.unanswered.add(seq);
    return seq;
  }

  async begin(): Promise<number> {
    for (;;) {
      const seq = this.tryBegin();
      if (seq !== undefined) return seq;
      await new Promise<void>((resolve) => this.waiting.push(resolve));
    }
  }

  /** Request `seq` was answered, or will never be sent again. */
  end(seq: number): void {
    this.unanswered.delete(seq);
    const waiting = this.waiting;
    this.waiting = [];
    for (const w of waiting) w();
  }
}

export interface SessionOptions {
  /** Lease length in seconds (1 to 3600; default 15). */
  ttl?: number;
  /**
   * Shown by describe next to this session's holds and waits. Default: this process (host
   * name, pid, user), as the CLI and the Python client say it.
   */
  owner?: Owner;
}

/** Bytes of UTF-8 `s` keeps at most `max` of, cut at a character boundary. */
function cutUtf8(s: string, max: number): string {
  const bytes = Buffer.from(s, "utf8");
  if (bytes.length <= max) return s;
  let end = max;
  while (end > 0 && (bytes[end] & 0xc0) === 0x80) end--;
  return bytes.subarray(0, end).toString("utf8");
}

/** This process as a session's owner: host name, pid, the user's name (or uid), and `text`. */
export function ownerOfThisProcess(text = ""): Owner {
  let user = "";
  try {
    user = os.userInfo().username;
  } catch {
    // No passwd entry for this uid (a container): the uid says who it is.
    user = typeof process.getuid === "function" ? String(process.getuid()) : "";
  }
  return {
    host: cutUtf8(os.hostname(), limits.OWNER_HOST_BYTES_MAX),
    pid: process.pid,
    user: cutUtf8(user, limits.OWNER_USER_BYTES_MAX),
    text: cutUtf8(text, limits.OWNER_TEXT_BYTES_MAX),
  };
}

const WHY_CLOSED = "the session was closed";

/** What CreateSession answered, and when it was sent. */
interface Opened {
  wire: WireSession;
  /** Before the first attempt: the lease starts no earlier than this on the server. */
  sent: number;
  /** The lease asked for, and the one granted (believed when shorter). */
  ttlMs: number;
  grantedTtlMs: number;
  endpoint: string;
  /** The cluster's Raft groups, as the answer said. */
  groups: number;
}

/**
 * Opens a session of `ttlMs` in Raft group `group` (undefined: the field left unset, as for a
 * cluster of one group). A retry after a lost answer may leave an orphan session on the
 * server; it holds nothing and expires after its TTL.
 */
async function open(client: Client, ttlMs: number, owner: Owner | undefined, group: number | undefined): Promise<Opened> {
  const request: Wire = { ttl_ms: String(ttlMs), owner: owner ?? null };
  if (group !== undefined) request.group = group;
  const sent = now();
  const { response, endpoint } = await client.call<Wire>("CreateSession", request, { ...client.short(), group: group ?? 0 });
  if (!response.session) throw new ProtocolError("CreateSession answered without a session");
  const groups = client.learnedGroups(Number(response.groups ?? 0), "CreateSession");
  const wire = { id: response.session.id, secret: response.session.secret };
  if (groups > 1 && groupOfSession(BigInt(wire.id), groups) !== (group ?? 0)) {
    throw new ProtocolError(`CreateSession in group ${group ?? 0} answered session ${wire.id}, of another group`);
  }
  return { wire, sent, ttlMs, grantedTtlMs: Number(response.ttl_ms), endpoint, groups };
}

/**
 * @internal One Raft group's session of a logical `Session` (docs/protocol.md 2.4): in a
 * cluster of one group, the only one. Its locks are those of its group; its lease, sequence
 * numbers, in-flight budgets and force-released grants are its own, its loss is the logical
 * session's.
 */
export class GroupSession {
  readonly session: Session;
  readonly group: number;
  readonly id: bigint;
  readonly client: Client;
  readonly wire: WireSession;
  readonly window = new SeqWindow(1);
  readonly waits = new Semaphore(limits.SESSION_WAITS_IN_FLIGHT_MAX);
  /** Separate from `waits`: a release, which may be what ends those waits, never queues behind them. */
  readonly shortRequests = new Semaphore(limits.SESSION_SHORT_REQUESTS_IN_FLIGHT_MAX);
  /** Names of the locks a live guard holds: a grant of any other lock to this session is one nobody wants. */
  readonly guarded = new Set<string>();
  /** Grants of this session an operator force-released, as the last keepalive said (tokens of this group's log). */
  taken = { tokens: new Set<bigint>(), through: 0n };
  /**
   * Conflict events: the held names the last keepalive answers said someone waits for (an
   * answer cut short, `contended_truncated`, keeps what was known of the names it does not list).
   */
  contended = new Set<string>();
  /** "taken" when `taken` changed, "contended" when `contended` did. */
  readonly events: EventEmitter = new EventEmitter();
  readonly lease: ClientLease;
  renewal?: Promise<void>;
  private lastEndpoint: string;
  private disrupted = false;

  constructor(session: Session, group: number, opened: Opened, grid: number | undefined) {
    this.session = session;
    this.client = session.client;
    this.group = group;
    this.wire = opened.wire;
    this.id = BigInt(opened.wire.id);
    this.lease = new ClientLease(opened.sent, opened.ttlMs, grid);
    this.lease.acknowledged(opened.sent, opened.grantedTtlMs);
    this.lastEndpoint = opened.endpoint;
    this.events.setMaxListeners(0);
  }

  /** The logical session's loss, if it is lost. */
  lostError(): SessionLost | undefined {
    return this.session.lostError();
  }

  /** Turns a server's "no such session" into the (logical) session being lost. */
  check(e: unknown): unknown {
    if (e instanceof SessionNotFound) {
      this.session.markLost(this.why(`the server does not know the session: ${e.message}`));
      return this.lostError() ?? e;
    }
    return e;
  }

  spawnBackground(task: (signal: AbortSignal) => Promise<void>): void {
    this.session.spawnBackground(task);
  }

  /** The logical session's lost signal. */
  get signal(): AbortSignal {
    return this.session.signal;
  }

  /** Options of a short call of this session: to its group's leader. */
  short(): CallOpts {
    return { ...this.client.short(), group: this.group };
  }

  /** `why`, naming this group's session when it is not the logical session's own id. */
  private why(why: string): string {
    return this.id === this.session.id ? why : `${why} (session ${this.id} of Raft group ${this.group})`;
  }

  /** CloseSession at the group's leader; one already gone counts as closed. */
  async closeOnServer(): Promise<void> {
    try {
      await this.client.call("CloseSession", { session: this.wire }, { ...this.short(), batch: true });
    } catch (e) {
      // Already gone (expired, or a retry of a close that went through): closed all the same.
      if (!(e instanceof SessionNotFound)) throw e;
    }
  }

  /** The renewal loop: one per group session, stopped by the logical session's `stopped`. */
  async renew(): Promise<void> {
    const signal = this.session.stopped.signal;
    const lease = this.lease;
    try {
      for (;;) {
        await sleepUntil(Math.min(lease.deadline(), lease.nextRenewal()), signal);
        if (now() >= lease.deadline()) break;
        const sent = now();
        // A renewal races its deadline: short attempts (a paused node must not hold it for
        // long) and frequent retries, so that it reaches a new leader soon after an election.
        const opts: CallOpts & { group: number } = {
          attemptTimeoutMs: Math.max(
            1,
            Math.min(
              this.client.rpcTimeoutMs,
              Math.max(lease.ttlMs / limits.CLIENT_RENEWAL_ATTEMPT_TTL_DIVISOR, limits.CLIENT_RENEWAL_ATTEMPT_MS_MIN),
              lease.deadline() - sent,
            ),
          ),
          backoffMaxMs: Math.max(lease.ttlMs / limits.CLIENT_RENEWAL_BACKOFF_TTL_DIVISOR, limits.CLIENT_RENEWAL_BACKOFF_MS_MIN),
          group: this.group,
        };
        const deadlineStop = new AbortController();
        const result = await Promise.race([
          this.client.keepAlive(this.wire, opts),
          sleepUntil(lease.deadline(), AbortSignal.any([signal, deadlineStop.signal])).then(
            () => "deadline" as const,
            () => "aborted" as const,
          ),
        ]);
        deadlineStop.abort();
        if (result === "aborted") return;
        if (result === "deadline") break;
        // An answer that arrives after the deadline counts for nothing (the guards may already
        // have reported lost, and lost is final), however the race above went: after a suspend
        // the timer behind `sleepUntil` fires late, while the clock has moved on.
        if (now() >= lease.deadline()) break;
        if (signal.aborted) return;
        if (result.ok) {
          const l = result.lease;
          if (l === undefined) {
            lease.failed(now());
          } else if (!l.alive) {
            this.session.markLost(this.why("the server says the session has expired"));
            return;
          } else {
            this.takenNow(l.revoked_tokens ?? [], l.revoked_through ?? "0");
            this.contendedNow(l.contended ?? [], l.contended_truncated === true);
            lease.acknowledged(sent, Number(l.ttl_ms));
            const failover = this.disrupted || result.failedAttempts > 0 || result.endpoint !== this.lastEndpoint;
            this.disrupted = false;
            this.lastEndpoint = result.endpoint;
            if (failover) this.session.failedOver();
          }
        } else if (result.error instanceof SessionNotFound) {
          this.session.markLost(this.why(`the server does not know the session: ${result.error.message}`));
          return;
        } else if (result.error instanceof Aborted) {
          return;
        } else {
          this.disrupted = true;
          lease.failed(now());
        }
      }
    } catch (e) {
      if (e instanceof Aborted) return;
      throw e;
    }
    this.session.markLost(this.why("no renewal was acknowledged before the lease deadline (TTL minus safety margin)"));
  }

  /**
   * A keepalive's list of held names that someone waits for: all of them, or, `truncated`, some
   * of them (what was known of the others is kept until an answer that lists all).
   */
  contendedNow(names: string[], truncated: boolean): void {
    const next = mergeContended(this.contended, names, truncated);
    const changed = next.size !== this.contended.size || [...next].some((n) => !this.contended.has(n));
    this.contended = next;
    if (changed) this.events.emit("contended");
  }

  /** A guard of `name` ended: what the keepalives said of its waiters is not a later grant's. */
  forgetContended(name: string): void {
    this.contended.delete(name);
  }

  private takenNow(tokens: string[], through: string): void {
    const next = { tokens: new Set(tokens.map((t) => BigInt(t))), through: BigInt(through) };
    const changed = next.through !== this.taken.through || [...next.tokens].some((t) => !this.taken.tokens.has(t));
    this.taken = next;
    if (changed) this.events.emit("taken");
  }
}

/**
 * A session: a lease on the server that keeps this client's locks alive, renewed every TTL/3
 * until `close()`. An open session keeps the Node process alive (its renewal timer).
 *
 * In a cluster of several Raft groups (`serve --groups`) it is a *logical* session: a session
 * in group 0 (its `id`), made at once, and one in each other group it takes a lock in, made at
 * the first lock of that group with the same TTL, all renewed on one schedule. It is lost when
 * any of them is (every guard, in every group, reports lost), and the others are then closed.
 */
export class Session {
  /** Group 0's session id (the only session's, in a cluster of one group). */
  readonly id: bigint;
  /** @internal */ readonly client: Client;
  /** @internal Aborted by close() and by loss: stops the renewals and the background clean-ups. */
  readonly stopped = new AbortController();
  /** @internal "failover" */ readonly events: EventEmitter = new EventEmitter();
  /** The cluster's Raft groups, as the creation answered. */
  private readonly groupCount: number;
  /** Group 0's session. */
  private readonly home: GroupSession;
  /** The other groups' sessions, made at the first lock of each (several groups only). */
  private readonly others = new Map<number, GroupSession>();
  /** Group sessions being made, so that two locks of one group make one. */
  private readonly making = new Map<number, Promise<GroupSession>>();
  /** The TTL group 0's session was granted: every group session asks for the same. */
  private readonly groupTtlMs: number;
  private readonly owner?: Owner;
  private lostWhy?: string;
  private readonly lostController = new AbortController();
  private readonly background = new Set<Promise<void>>();
  private closing?: Promise<void>;
  private failoverCount = 0;

  private constructor(client: Client, opened: Opened, owner: Owner | undefined) {
    this.client = client;
    this.id = BigInt(opened.wire.id);
    this.groupCount = opened.groups;
    this.owner = owner;
    this.events.setMaxListeners(0);
    // With several groups, every group session renews on the grid of this one's creation.
    this.home = new GroupSession(this, 0, opened, opened.groups > 1 ? opened.sent : undefined);
    this.groupTtlMs = this.home.lease.ttlMs;
  }

  /** @internal */
  static async create(client: Client, given: SessionOptions): Promise<Session> {
    const options = { ...given, owner: given.owner ?? ownerOfThisProcess() };
    const ttlMs = Math.round((options.ttl ?? limits.SESSION_TTL_MS_DEFAULT / 1000) * 1000);
    if (!Number.isFinite(ttlMs) || ttlMs < limits.SESSION_TTL_MS_MIN || ttlMs > limits.SESSION_TTL_MS_MAX) {
      throw new InvalidArgument(
        `ttl ${options.ttl} s is out of range ${limits.SESSION_TTL_MS_MIN / 1000}..=${limits.SESSION_TTL_MS_MAX / 1000} s`,
      );
    }
    // Group 0's session first: its answer says how many groups there are. The group is named
    // only once the cluster is known to have several; before that the request is as of a
    // cluster of one, and a cluster of several refuses it (not-with-groups), which nothing
    // was made by: then again in group 0.
    const known = client.knownGroups();
    let opened: Opened;
    if (known !== undefined && known > 1) {
      opened = await open(client, ttlMs, options.owner, 0);
    } else {
      try {
        opened = await open(client, ttlMs, options.owner, undefined);
      } catch (e) {
        if (known !== undefined || !isNotWithGroups(e)) throw e;
        opened = await open(client, ttlMs, options.owner, 0);
      }
    }
    const session = new Session(client, opened, options.owner);
    session.home.renewal = session.home.renew();
    return session;
  }

  /**
   * @internal The group session that takes the lock `name`: made at the first lock of its
   * group (a CreateSession at that group's leader, then its renewal).
   */
  async forLock(name: string): Promise<GroupSession> {
    if (this.groupCount === 1) return this.home;
    const group = groupOf(name, this.groupCount);
    if (group === 0) return this.home;
    const made = this.others.get(group);
    if (made !== undefined) return made;
    let making = this.making.get(group);
    if (making === undefined) {
      const lost = this.lostError();
      if (lost) throw lost;
      making = this.openGroup(group).finally(() => this.making.delete(group));
      this.making.set(group, making);
    }
    return making;
  }

  private async openGroup(group: number): Promise<GroupSession> {
    const opened = await open(this.client, this.groupTtlMs, this.owner, group);
    const gs = new GroupSession(this, group, opened, this.home.lease.grid);
    const lost = this.lostError();
    if (lost) {
      // Lost (or closed) while it was being made: it must not outlive the logical session.
      await gs.closeOnServer().catch(() => undefined);
      throw lost;
    }
    this.others.set(group, gs);
    gs.renewal = gs.renew();
    return gs;
  }

  /** Every group session made so far: group 0's first. */
  private groupSessions(): GroupSession[] {
    return [this.home, ...[...this.others.entries()].sort((a, b) => a[0] - b[0]).map((e) => e[1])];
  }

  /** The lease length the server granted, in ms. */
  get ttlMs(): number {
    return this.home.lease.ttlMs;
  }

  /** How long before the server's earliest possible expiry this client declares the session lost, in ms. */
  get safetyMarginMs(): number {
    return this.home.lease.marginMs;
  }

  /**
   * The client-side deadline, on the client's clock: compare it with the package's `now()`.
   * With several Raft groups, the earliest of its group sessions' deadlines.
   */
  get deadline(): number {
    return Math.min(...this.groupSessions().map((gs) => gs.lease.deadline()));
  }

  /**
   * Each group session made so far, as `{ group, sessionId, deadline }`, group 0's first: one
   * element in a cluster of one group. A lock's holder (`describe`) is its group's session.
   */
  get groupSessionIds(): Array<{ group: number; sessionId: bigint; deadline: number }> {
    return this.groupSessions().map((gs) => ({ group: gs.group, sessionId: gs.id, deadline: gs.lease.deadline() }));
  }

  /**
   * The id of the session that takes the lock `name`: `id` in a cluster of one group; with
   * several, this session's in the lock's group, which the first call for a group makes
   * there (as its first lock would, and failing as that would).
   */
  async sessionIdFor(name: string): Promise<bigint> {
    return (await this.forLock(name)).id;
  }

  /** Renewals acknowledged by another node than the previous one, or only after failures (of any of its group sessions). */
  get failovers(): number {
    return this.failoverCount;
  }

  /** Aborted when the session may be lost (reason: a SessionLost). */
  get signal(): AbortSignal {
    return this.lostController.signal;
  }

  /** Lost, or past the deadline on this client's clock (exact even when the renewal timer has not run, as after a pause). */
  isLost(): boolean {
    if (this.lostWhy !== undefined) return true;
    const at = now();
    return this.groupSessions().some((gs) => at >= gs.lease.deadline());
  }

  /** Why the session is lost, once it is. */
  get lostReason(): string | undefined {
    return this.lostWhy;
  }

  /** @internal */
  lostError(): SessionLost | undefined {
    return this.lostWhy === undefined ? undefined : new SessionLost(this.id, this.lostWhy);
  }

  /** @internal A group session renewed after a failover. */
  failedOver(): void {
    this.failoverCount++;
    this.events.emit("failover", this.failoverCount);
  }

  /** @internal Lost in any group: lost everywhere. With several groups, the others are closed. */
  markLost(why: string): void {
    if (this.lostWhy !== undefined) return;
    this.lostWhy = why;
    if (why !== WHY_CLOSED) process.emitWarning(`latchkey: session ${this.id} lost: ${why}`, { code: "LATCHKEY_SESSION_LOST" });
    this.stopped.abort();
    this.lostController.abort(new SessionLost(this.id, why));
    if (why !== WHY_CLOSED && this.groupCount > 1) {
      // The client gives up every group's locks, so that they go to their waiters now rather
      // than when each lease runs out (best effort: close() sends them again).
      for (const gs of this.groupSessions()) void gs.closeOnServer().catch(() => undefined);
    }
  }

  /** @internal Turns a server's "no such session" into the session being lost. */
  check(e: unknown): unknown {
    return this.home.check(e);
  }

  /**
   * Takes the lock `name`, waiting in its FIFO queue at most `wait` seconds (undefined: until
   * granted; 0: try once, never queue). Throws WaitTimeout (Held, a WaitTimeout, when a
   * try-lock found it held), SessionLost if the session is lost meanwhile.
   *
   * Exclusive by default (a mutex, or a read-write lock's writer); `shared: true` takes it as a
   * reader, `permits: N` as one of a semaphore's N permits. A name in use as the other kind
   * throws KindConflict, a semaphore with another N PermitsConflict, N outside 1..=1024
   * PermitsOutOfRange (docs/primitives.md).
   */
  lock(name: string, options: LockOptions = {}): Promise<LockGuard> {
    return acquire(this, name, options);
  }

  /**
   * Campaigns in the election `name`: waits in its FIFO queue (no herd) at most `wait` seconds
   * (undefined: until this session leads; 0: only if nobody leads) and resolves with the
   * Leadership, whose token is the term's fencing token and whose `value` (a string, sent as
   * UTF-8, or bytes; at most 1,024 bytes) `Client.leader` and `Client.observe` show. An election
   * is an exclusive lock whose grant publishes a value: it fails as `lock` does (WaitTimeout,
   * Held, SessionLost, KindConflict) and ends as a grant does.
   */
  campaign(name: string, value: string | Uint8Array, options: CampaignOptions = {}): Promise<Leadership> {
    return campaign(this, name, value, options);
  }

  /** Takes `name` as a reader of a read-write lock: `lock(name, { ...options, shared: true })`. */
  lockShared(name: string, options: Omit<LockOptions, "shared" | "permits"> = {}): Promise<LockGuard> {
    return acquire(this, name, { ...options, shared: true });
  }

  /** Takes one of the `permits` permits of the semaphore `name`: `lock(name, { ...options, permits })`. */
  acquirePermit(name: string, permits: number, options: Omit<LockOptions, "shared" | "permits"> = {}): Promise<LockGuard> {
    return acquire(this, name, { ...options, permits });
  }

  /** Takes the lock if it is free now; null if it is held. */
  async tryLock(name: string): Promise<LockGuard | null> {
    try {
      return await acquire(this, name, { wait: 0 });
    } catch (e) {
      if (e instanceof LatchkeyError && e.code === "wait-timeout") return null;
      throw e;
    }
  }

  /** @internal Runs `task` until it ends or the session stops; close() waits for it. */
  spawnBackground(task: (signal: AbortSignal) => Promise<void>): void {
    if (this.stopped.signal.aborted) return;
    const p: Promise<void> = task(this.stopped.signal)
      .catch(() => undefined)
      .finally(() => this.background.delete(p));
    this.background.add(p);
  }

  /**
   * Ends the session: stops the renewal, then asks the server to release its locks and drop
   * its waits (in every group it has a session in). Every guard reports lost from here on.
   * Idempotent.
   */
  close(): Promise<void> {
    this.closing ??= this.closeOnce();
    return this.closing;
  }

  private async closeOnce(): Promise<void> {
    this.markLost(WHY_CLOSED);
    // A group session being made closes itself once made (it sees the loss).
    await Promise.allSettled([...this.making.values()]);
    const sessions = this.groupSessions();
    await Promise.allSettled(sessions.map((gs) => gs.renewal));
    await Promise.allSettled([...this.background]);
    this.client.forget(this);
    // Every group's session, each at its group's leader, at once; the first error wins.
    const closes = await Promise.allSettled(sessions.map((gs) => gs.closeOnServer()));
    const failed = closes.find((c): c is PromiseRejectedResult => c.status === "rejected");
    if (failed) throw failed.reason;
  }
}
