// Taking a lock (`acquire`) and holding it (`LockGuard`); crates/client/src/lock.rs is the
// reference.
import type { Wire } from "./client";
import { isRetryable, isTooOld } from "./client";
import { Held, InvalidArgument, LatchkeyError, NotElectionLeader, NotHeld, PermitsOutOfRange, ProtocolError, SessionLost, WaitTimeout } from "./errors";
import { holderFromWire } from "./client";
import * as limits from "./limits";
import type { GroupSession, Session } from "./session";
import { Aborted, now, sleepUntil } from "./util";

/** Header that carries the fencing token to a fenced resource. */
export const TOKEN_HEADER = "latchkey-token";
/** Header that carries the lock name to a fenced resource. */
export const LOCK_HEADER = "latchkey-lock";

export interface LockOptions {
  /** Seconds to wait in the queue: undefined waits until granted, 0 tries once. */
  wait?: number;
  /**
   * Take it as a reader of a read-write lock: any number of readers hold together, never beside
   * an exclusive holder (a writer); a reader behind a waiting writer waits (docs/primitives.md).
   */
  shared?: boolean;
  /**
   * Take one of the `permits` permits of a counting semaphore (1..=HOLDERS_PER_LOCK_MAX; every
   * acquire of the name must say the same count while it is in use, else PermitsConflict).
   * Each permit's grant has its own token.
   */
  permits?: number;
  /**
   * A lock-delay (docs/primitives.md), in ms: if this grant is lost (its session expires or is
   * revoked, or an operator force-releases it; not a release or close), the server grants the
   * name to nobody for this long, for a resource that cannot check fencing tokens. At most
   * LOCK_DELAY_MS_MAX (5 minutes), rounded up to whole ms; a mutex's only (InvalidArgument with
   * `shared` or `permits`). 0 or undefined: none.
   */
  lockDelayMs?: number;
  /**
   * Called with this waiter's 1-based place in the queue each time a long-poll answers it
   * (PENDING: about every 10 s, and at each re-send); never when granted at once.
   */
  onPosition?: (position: number) => void;
  /**
   * Abandons the wait (the promise rejects with the signal's reason). The server may still
   * have the waiter: a background task of the session settles it and releases a late grant.
   */
  signal?: AbortSignal;
}

/** Lock names: 1..=512 bytes of UTF-8, no control characters (the server's rule). */
export function validateName(name: string): void {
  if (typeof name !== "string" || name.length === 0) throw new InvalidArgument("the lock name is empty");
  const bytes = Buffer.byteLength(name, "utf8");
  if (bytes > limits.LOCK_NAME_BYTES_MAX) {
    throw new InvalidArgument(`the lock name is ${bytes} bytes, more than ${limits.LOCK_NAME_BYTES_MAX}`);
  }
  // eslint-disable-next-line no-control-regex
  const at = name.search(/[\u0000-\u001f\u007f-\u009f]/);
  if (at >= 0) throw new InvalidArgument(`the lock name has a control character at ${at}`);
}

/** How a name is taken, or held (`LockInfo.mode`): see docs/primitives.md. */
export type LockMode = "exclusive" | "shared" | "permits";

/** An Acquire's `mode` and `permits` fields, and a campaign's election `value`. */
interface WireMode {
  mode: "LOCK_MODE_EXCLUSIVE" | "LOCK_MODE_SHARED" | "LOCK_MODE_PERMITS";
  permits: number;
  /** Set: a campaign (exclusive only) whose grant publishes it. */
  value?: Buffer;
  /** The lock-delay asked for, whole ms (0: none). */
  lockDelayMs: number;
}

/** An election value as sent: a string as UTF-8, bytes as they are; at most ELECTION_VALUE_BYTES_MAX bytes. */
export function checkValue(value: unknown): Buffer {
  let b: Buffer;
  if (typeof value === "string") b = Buffer.from(value, "utf8");
  else if (value instanceof Uint8Array) b = Buffer.from(value);
  else throw new InvalidArgument(`an election value is a string or bytes, not ${value === null ? "null" : typeof value}`);
  if (b.length > limits.ELECTION_VALUE_BYTES_MAX) {
    throw new InvalidArgument(`an election value is at most ${limits.ELECTION_VALUE_BYTES_MAX} bytes, not ${b.length}`);
  }
  return b;
}

/**
 * A lock-delay as sent: whole ms, rounded up (a delay asked for is never shortened, and 0.5 ms
 * is not none), as the Rust client's `LockRequest::lock_delay`. InvalidArgument for a negative
 * or non-finite number, or above LOCK_DELAY_MS_MAX (the server's words).
 */
export function checkLockDelayMs(lockDelayMs: unknown): number {
  if (lockDelayMs === undefined) return 0;
  if (typeof lockDelayMs !== "number") throw new InvalidArgument(`lockDelayMs is a number of ms, not ${lockDelayMs === null ? "null" : typeof lockDelayMs}`);
  if (Number.isNaN(lockDelayMs) || lockDelayMs < 0) throw new InvalidArgument(`a lock-delay is 0 or more ms, not ${lockDelayMs}`);
  const ms = Math.ceil(lockDelayMs);
  if (ms > limits.LOCK_DELAY_MS_MAX) throw new InvalidArgument(`a lock-delay is at most ${limits.LOCK_DELAY_MS_MAX} ms, not ${ms}`);
  return ms;
}

/**
 * The mode `options` ask for, checked before any call as the Rust client's `LockRequest::wait`
 * does: PermitsOutOfRange for 0 or more than HOLDERS_PER_LOCK_MAX permits; InvalidArgument for
 * a lock-delay out of range or with a reader or permits (a mutex's only).
 */
export function checkMode(options: Pick<LockOptions, "shared" | "permits" | "lockDelayMs" | "onPosition">): WireMode {
  const { shared, permits } = options;
  if (shared !== undefined && typeof shared !== "boolean") throw new InvalidArgument("shared must be a boolean");
  if (options.onPosition !== undefined && typeof options.onPosition !== "function") throw new InvalidArgument("onPosition must be a function");
  const lockDelayMs = checkLockDelayMs(options.lockDelayMs);
  if (lockDelayMs > 0 && (shared || permits !== undefined)) throw new InvalidArgument("a lock-delay is for an exclusive lock (a mutex) only");
  if (permits === undefined) return { mode: shared ? "LOCK_MODE_SHARED" : "LOCK_MODE_EXCLUSIVE", permits: 0, lockDelayMs };
  if (shared) throw new InvalidArgument("a lock is taken shared (a reader) or as one of a semaphore's permits, not both");
  if (!Number.isInteger(permits) || permits < 1 || permits > limits.HOLDERS_PER_LOCK_MAX) {
    throw new PermitsOutOfRange(permits, limits.HOLDERS_PER_LOCK_MAX);
  }
  return { mode: "LOCK_MODE_PERMITS", permits, lockDelayMs };
}

/** @internal A wire LockMode (a string, or its number from an older proto-loader) as a LockMode. */
export function modeFromWire(mode: unknown, name: string): LockMode {
  switch (mode) {
    case undefined:
    case null:
    case 0:
    case "LOCK_MODE_EXCLUSIVE":
      return "exclusive";
    case 1:
    case "LOCK_MODE_SHARED":
      return "shared";
    case 2:
    case "LOCK_MODE_PERMITS":
      return "permits";
    default:
      throw new ProtocolError(`lock ${JSON.stringify(name)} is held in an unknown mode ${String(mode)}`);
  }
}

/** One Acquire call (with its retries) for request `seq`, waiting until `deadline`. */
async function acquireOnce(
  session: GroupSession,
  name: string,
  mode: WireMode,
  seq: number,
  deadline: number | undefined,
  signal: AbortSignal,
  first = false,
): Promise<Wire> {
  const waitMs =
    deadline === undefined
      ? limits.WAIT_TIMEOUT_MS_MAX
      : Math.min(Math.max(0, Math.floor(deadline - now())), limits.WAIT_TIMEOUT_MS_MAX);
  // With `batch`, the first send rides a Batch call, where a request that must wait answers
  // PENDING at once (the server does not long-poll it there): later sends are Acquires of
  // their own, which long-poll.
  const batched = first && session.client.batch;
  try {
    const { response } = await session.client.call<Wire>(
      "Acquire",
      {
        session: session.wire,
        seq: String(seq),
        name,
        wait_timeout_ms: String(waitMs),
        mode: mode.mode,
        permits: mode.permits,
        lock_delay_ms: String(mode.lockDelayMs),
        ...(mode.value === undefined ? {} : { value: mode.value }),
      },
      {
        // The server long-polls at most ACQUIRE_POLL_MS_MAX whatever we ask, so every attempt
        // allows a full poll.
        attemptTimeoutMs: batched ? session.client.rpcTimeoutMs : limits.ACQUIRE_POLL_MS_MAX + session.client.rpcTimeoutMs,
        backoffMaxMs: limits.CLIENT_ACQUIRE_BACKOFF_MS_MAX,
        signal,
        group: session.group,
        batch: batched,
      },
    );
    return response;
  } catch (e) {
    throw session.check(e);
  }
}

type Race =
  | { kind: "answer"; response: Wire }
  | { kind: "error"; error: unknown }
  | { kind: "lost" }
  | { kind: "give-up" }
  | { kind: "abandoned" };

/** @internal See `Session.lock`. Async, so that bad input rejects rather than throws. */
export async function acquire(logical: Session, name: string, options: LockOptions): Promise<LockGuard> {
  validateName(name);
  return take(logical, name, checkMode(options), options);
}

/** @internal See `Session.campaign`. */
export async function campaign(logical: Session, name: string, value: string | Uint8Array, options: CampaignOptions): Promise<Leadership> {
  validateName(name);
  const mode: WireMode = { mode: "LOCK_MODE_EXCLUSIVE", permits: 0, value: checkValue(value), lockDelayMs: 0 };
  const guard = await take(logical, name, mode, options);
  if (!(guard instanceof Leadership)) throw new ProtocolError("a campaign was granted as a plain lock");
  return guard;
}

/** How long a campaign waits, and what abandons it (as `LockOptions`). */
export type CampaignOptions = Pick<LockOptions, "wait" | "signal">;

async function take(logical: Session, name: string, mode: WireMode, options: Pick<LockOptions, "wait" | "signal" | "onPosition">): Promise<LockGuard> {
  const wait = options.wait;
  if (wait !== undefined && (!Number.isFinite(wait) || wait < 0)) {
    throw new InvalidArgument(`wait ${wait} s must be a number of seconds >= 0 (undefined: forever)`);
  }
  const lost = logical.lostError();
  if (lost) throw lost;
  options.signal?.throwIfAborted();
  // The session of the lock's Raft group (made at the first lock of that group); the caller's
  // signal abandons the wait for it too (the group session, once made, stays for later locks).
  let session: GroupSession;
  if (options.signal) {
    const stop = new AbortController();
    const making = logical.forLock(name);
    try {
      const raced = await Promise.race([making, onAbort(options.signal, stop.signal).then(() => undefined)]);
      if (raced === undefined) {
        making.catch(() => {}); // its failure, if any, is nobody's now
        throw options.signal.reason ?? new Aborted();
      }
      session = raced;
    } finally {
      stop.abort();
    }
  } else {
    session = await logical.forLock(name);
  }
  const releasePermit = await session.waits.acquire();
  try {
    const deadline = wait === undefined ? undefined : now() + wait * 1000;
    for (;;) {
      // One logical request: its seq is fixed here and reused by every re-send.
      const seq = await session.window.begin();
      let armed = true;
      // The first send of this seq (in a batch, with `batch`); re-sends long-poll alone.
      let first = true;
      try {
        for (;;) {
          const sent = now();
          const giveUpAt = deadline === undefined ? undefined : deadline + limits.CLIENT_UNANSWERED_AFTER_DEADLINE_MS_MAX;
          const stop = new AbortController();
          const races: Array<Promise<Race>> = [
            acquireOnce(session, name, mode, seq, deadline, stop.signal, first).then(
              (response): Race => ({ kind: "answer", response }),
              (error): Race => ({ kind: "error", error }),
            ),
            onAbort(session.signal, stop.signal).then((): Race => ({ kind: "lost" })),
          ];
          if (giveUpAt !== undefined) {
            races.push(sleepUntil(giveUpAt, stop.signal).then((): Race => ({ kind: "give-up" }), (): Race => ({ kind: "abandoned" })));
          }
          if (options.signal) races.push(onAbort(options.signal, stop.signal).then((): Race => ({ kind: "abandoned" })));
          const r = await Promise.race(races);
          stop.abort();
          switch (r.kind) {
            case "lost":
              armed = false;
              throw session.lostError() ?? new SessionLost(logical.id, "lost");
            case "give-up":
              // Still armed: the background task settles the request.
              throw new WaitTimeout(name);
            case "abandoned":
              if (options.signal?.aborted) throw options.signal.reason ?? new Aborted();
              continue; // the give-up timer was aborted by `stop` after another branch won
            case "error": {
              const e = r.error;
              if (e instanceof Aborted) {
                // Only close() of the client or the session aborts a call that won the race.
                const lostNow = session.lostError();
                if (lostNow) {
                  armed = false;
                  throw lostNow;
                }
                throw e;
              }
              // The retry budget of one call ran out (a long election, a partition): keep
              // trying under the same seq while the session and the wait last.
              if (isRetryable(e) && (giveUpAt === undefined || now() < giveUpAt)) continue;
              if (isTooOld(e)) {
                // Granted or not, the outcome is forgotten: a grant would be held with no
                // guard, so look and release it.
                armed = false;
                session.spawnBackground(() => releaseOrphan(session, name));
              } else if (e instanceof SessionLost) {
                armed = false;
              }
              throw e;
            }
            case "answer":
              first = false;
              break;
          }
          const response = r.response;
          switch (response.result) {
            case "ACQUIRE_RESULT_GRANTED":
              armed = false;
              if (mode.value !== undefined) return new Leadership(logical, session, name, BigInt(response.token), mode.value);
              return new LockGuard(logical, session, name, BigInt(response.token));
            case "ACQUIRE_RESULT_NOT_GRANTED": {
              armed = false;
              if (deadline === undefined) break; // only after the server's own cap on a wait (a day): again
              const holder = holderFromWire(response.held_by);
              if (holder) throw new Held(name, holder);
              throw new WaitTimeout(name);
            }
            case "ACQUIRE_RESULT_PENDING":
              options.onPosition?.(Number(response.position));
              if (deadline !== undefined && sent > deadline + limits.CLIENT_PENDING_AFTER_DEADLINE_MS_MAX) {
                throw new WaitTimeout(name); // still armed: the background task settles it
              }
              continue;
            default:
              armed = false;
              throw new ProtocolError(`Acquire answered an unknown result ${response.result}`);
          }
          break; // NOT_GRANTED of an endless wait: a new logical request
        }
      } finally {
        if (armed) settleInBackground(session, name, mode, seq, deadline);
        else session.window.end(seq);
      }
    }
  } finally {
    releasePermit();
  }
}

/** Resolves when `signal` aborts; never, if `stop` aborts first (then it lets go of the listener). */
function onAbort(signal: AbortSignal, stop: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const done = () => {
      signal.removeEventListener("abort", done);
      stop.removeEventListener("abort", done);
      if (signal.aborted) resolve();
    };
    signal.addEventListener("abort", done, { once: true });
    stop.addEventListener("abort", done, { once: true });
  });
}

/**
 * An Acquire whose outcome the caller will never see: keep re-sending it (same seq) until it is
 * decided, and release a late grant, so that a lock nobody holds a guard for does not stay held
 * until the session ends. Ends when the session stops (closing it releases everything anyway).
 */
function settleInBackground(session: GroupSession, name: string, mode: WireMode, seq: number, deadline: number | undefined): void {
  if (session.lostError()) {
    session.window.end(seq);
    return;
  }
  session.spawnBackground(async (signal) => {
    try {
      for (;;) {
        let response: Wire;
        try {
          response = await acquireOnce(session, name, mode, seq, deadline, signal);
        } catch (e) {
          if (isTooOld(e)) return void (await releaseOrphan(session, name));
          if (isRetryable(e)) continue;
          return;
        }
        if (response.result === "ACQUIRE_RESULT_PENDING") continue;
        if (response.result === "ACQUIRE_RESULT_GRANTED") {
          await releaseOnServer(session, name, BigInt(response.token)).catch(() => undefined);
        }
        return;
      }
    } finally {
      session.window.end(seq);
    }
  });
}

/**
 * An Acquire of `name` by this session was granted or not, and its outcome is lost to us: if the
 * server says the session holds `name` while no guard of ours does, release it.
 */
async function releaseOrphan(session: GroupSession, name: string): Promise<void> {
  const info = await session.client.describe(name).catch(() => undefined);
  // Of a name with several holders (readers, permits), this session's grant.
  const holder = info?.holders.find((h) => h.sessionId === session.id);
  if (!holder || session.guarded.has(name)) return;
  await releaseOnServer(session, name, holder.token).catch(() => undefined);
}

/** @internal */
export async function releaseOnServer(session: GroupSession, name: string, token: bigint): Promise<void> {
  const releasePermit = await session.shortRequests.acquire();
  const seq = await session.window.begin();
  try {
    const { response } = await session.client.call<Wire>(
      "Release",
      { session: session.wire, seq: String(seq), name, token: token.toString() },
      { ...session.short(), batch: true },
    );
    if (!response.released) throw new NotHeld(name, token);
  } catch (e) {
    throw session.check(e);
  } finally {
    session.window.end(seq);
    releasePermit();
  }
}

/**
 * A held lock. Its fencing token goes with every write to the protected resource
 * (`fencingHeaders()`). Release it with `await guard.release()` (in a `finally`), or hold it
 * with `await using guard = await client.lock(...)`.
 *
 * The lost signal, three ways: `guard.lost` (a Promise that resolves with the reason),
 * `guard.signal` (an AbortSignal, for fetch and friends), `guard.onLost(callback)`. It fires when
 * the session's deadline on this client's clock passed without an acknowledged renewal, the
 * server said the session is gone, the session was closed, or a keepalive said an operator
 * force-released this grant. Stop working under the lock at once: the server keeps it for the
 * session's safety margin at most.
 */
export class LockGuard {
  readonly name: string;
  /**
   * The fencing token of this grant, larger than that of every earlier grant of the lock. A
   * bigint: tokens are unsigned 64-bit on the wire, and a JavaScript number is exact only up to
   * 2^53; a rounded token could compare equal to (or below) an older one and break fencing.
   */
  readonly token: bigint;
  readonly session: Session;
  /** @internal The session of the lock's Raft group (`session` itself in a cluster of one group). */
  readonly groupSession: GroupSession;
  /** Resolves with the reason once the lock may be lost. Never rejects. */
  readonly lost: Promise<string>;
  /** @internal release() also closes the session (a guard from `Client.lock`). */
  ownsSession = false;
  private readonly controller = new AbortController();
  /** @internal */
  protected released?: Promise<void>;

  /** @internal */
  constructor(session: Session, groupSession: GroupSession, name: string, token: bigint) {
    this.session = session;
    this.groupSession = groupSession;
    this.name = name;
    this.token = token;
    groupSession.guarded.add(name);
    this.lost = new Promise((resolve) => {
      this.controller.signal.addEventListener("abort", () => resolve(this.lostReason() ?? "lost"), { once: true });
    });
    const onSessionLost = () => this.fire();
    const onTaken = () => {
      if (this.taken()) this.fire();
    };
    if (session.signal.aborted) this.fire();
    else session.signal.addEventListener("abort", onSessionLost, { once: true });
    groupSession.events.on("taken", onTaken);
    this.detach = () => {
      session.signal.removeEventListener("abort", onSessionLost);
      groupSession.events.off("taken", onTaken);
    };
    this.controller.signal.addEventListener("abort", this.detach, { once: true });
  }

  /** Stops listening to the session: after release() the lost signal no longer fires. */
  private readonly detach: () => void;

  private fire(): void {
    if (!this.controller.signal.aborted) {
      this.controller.abort(
        this.taken() ? new NotHeld(this.name, this.token) : (this.session.lostError() ?? new SessionLost(this.session.id, "lost")),
      );
    }
  }

  /**
   * The id of the session that holds the lock, as `describe` names the holder: `session.id` in
   * a cluster of one group, this session's in the lock's group with several.
   */
  get sessionId(): bigint {
    return this.groupSession.id;
  }

  private taken(): boolean {
    // Tokens of this group's log, as the group session's keepalives report them.
    const t = this.groupSession.taken;
    return this.token <= t.through || t.tokens.has(this.token);
  }

  /** Aborted once the lock may be lost; its reason is a SessionLost (or NotHeld, force-released). */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** Calls `callback(reason)` once the lock may be lost (at once if it already may be). Returns the function that unsubscribes. */
  onLost(callback: (reason: string) => void): () => void {
    const handler = () => callback(this.lostReason() ?? "lost");
    if (this.controller.signal.aborted) {
      queueMicrotask(handler);
      return () => undefined;
    }
    this.controller.signal.addEventListener("abort", handler, { once: true });
    return () => this.controller.signal.removeEventListener("abort", handler);
  }

  /**
   * Whether the lock may be lost: the signal fired, or the session's deadline passed on this
   * client's clock (checked here, not left to a timer, so that a holder that resumes from a
   * pause and asks before writing gets the true answer).
   */
  isLost(): boolean {
    return this.controller.signal.aborted || this.session.isLost() || this.taken();
  }

  /** Why the lock may be lost, once it may be. */
  lostReason(): string | undefined {
    if (this.taken()) return `an operator force-released it (token ${this.token}); see \`latchkey audit\``;
    if (this.session.lostReason !== undefined) return this.session.lostReason;
    return this.session.isLost() ? "the session's deadline passed without an acknowledged renewal" : undefined;
  }

  /** Whether the last keepalive answer said someone waits for this lock. */
  isContended(): boolean {
    return this.groupSession.contended.has(this.name);
  }

  /**
   * Resolves when someone is seen waiting for this lock (Chubby's "conflicting lock request"),
   * so that a long holder can finish up and release it: the session's keepalive answers list
   * its held names that have waiters, so it resolves within about a renewal interval (a third
   * of the TTL) of the first waiter queueing, or at once if one waits already. It also resolves
   * when the lock may be lost (`lost`): nobody needs it released then. Never rejects; never
   * resolves for a lock nobody asks for (nor, after `release()`, for a loss).
   */
  contended(): Promise<void> {
    if (this.isContended() || this.isLost()) return Promise.resolve();
    return new Promise((resolve) => {
      const events = this.groupSession.events;
      const signal = this.controller.signal;
      const done = () => {
        events.off("contended", check);
        signal.removeEventListener("abort", done);
        resolve();
      };
      const check = () => {
        if (this.isContended()) done();
      };
      events.on("contended", check);
      signal.addEventListener("abort", done, { once: true });
    });
  }

  /** `{"latchkey-lock": name, "latchkey-token": "<token>"}`: send both to a fenced resource. */
  fencingHeaders(): { [LOCK_HEADER]: string; [TOKEN_HEADER]: string } {
    return { [LOCK_HEADER]: this.name, [TOKEN_HEADER]: this.token.toString() };
  }

  /**
   * Releases the lock (and closes the session if this guard came from `Client.lock`). Throws
   * SessionLost at once, without asking a server, if the lock may already be lost (the server
   * ends the session within its safety margin, releasing it), and NotHeld if the server says the
   * grant was no longer current. A second call returns the first one's outcome. From the call
   * on, the lost signal no longer fires (`lost` stays pending, `onLost` callbacks are not called).
   */
  release(): Promise<void> {
    this.released ??= this.releaseOnce();
    return this.released;
  }

  private async releaseOnce(): Promise<void> {
    // Released on purpose: closing the guard's own session is no loss to report.
    this.detach();
    this.groupSession.guarded.delete(this.name);
    this.groupSession.forgetContended(this.name);
    try {
      if (this.taken()) throw new NotHeld(this.name, this.token);
      if (this.session.isLost()) {
        throw this.session.lostError() ?? new SessionLost(this.session.id, this.lostReason() ?? "lost");
      }
      await releaseOnServer(this.groupSession, this.name, this.token);
    } finally {
      if (this.ownsSession) await this.session.close().catch(() => undefined);
    }
  }

  /**
   * For `await using`: releases, and does not throw when the lock was already lost (SessionLost,
   * NotHeld): either way it is not held any more, which is what leaving the scope wants. Other
   * errors (no server reachable) are thrown.
   */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.release();
    } catch (e) {
      if (e instanceof SessionLost || e instanceof NotHeld) return;
      throw e;
    }
  }
}

/**
 * This session leads an election (`Session.campaign`): the grant of its campaign, a LockGuard
 * (`token` is the term's fencing token; `lost`, `signal`, `fencingHeaders()`) that also
 * publishes a `value`. `resign()` gives it up; `await using` resigns on leaving the scope.
 */
export class Leadership extends LockGuard {
  /** The value published now (what the campaign or the last proclaim sent). */
  value: Buffer;

  /** @internal */
  constructor(session: Session, groupSession: GroupSession, name: string, token: bigint, value: Buffer) {
    super(session, groupSession, name, token);
    this.value = value;
  }

  /**
   * Replaces the published value without giving up leadership. Throws NotElectionLeader if this
   * term has ended (resigned, force-released), SessionLost if the session is lost.
   */
  async proclaim(value: string | Uint8Array): Promise<void> {
    const v = checkValue(value);
    if (this.released !== undefined) {
      throw new NotElectionLeader(`the leadership of ${JSON.stringify(this.name)} (token ${this.token}) was resigned`);
    }
    const session = this.groupSession;
    const releasePermit = await session.shortRequests.acquire();
    const seq = await session.window.begin();
    try {
      await session.client.call<Wire>(
        "Proclaim",
        { session: session.wire, seq: String(seq), name: this.name, token: this.token.toString(), value: v },
        session.short(),
      );
    } catch (e) {
      throw session.check(e);
    } finally {
      session.window.end(seq);
      releasePermit();
    }
    this.value = v;
  }

  /** Gives up leadership: the next candidate in the queue leads with a higher token (as `release()`). */
  resign(): Promise<void> {
    return this.release();
  }
}

export { LatchkeyError };
