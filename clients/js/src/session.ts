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

import type { Client, CallOpts, Wire, WireSession } from "./client";
import { InvalidArgument, LatchkeyError, Owner, ProtocolError, SessionLost, SessionNotFound } from "./errors";
import * as limits from "./limits";
import { LockGuard, LockOptions, acquire } from "./lock";
import { Aborted, now, Semaphore, sleepUntil } from "./util";

/** The safety margin for a lease of `ttlMs`: max(ttl / 5, 200 ms). */
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

  constructor(sent: number, ttlMs: number) {
    this.ttlMs = ttlMs;
    this.marginMs = safetyMarginMs(ttlMs);
    this.ackedSent = sent;
  }

  /** After this instant the locks may be lost. */
  deadline(): number {
    return this.ackedSent + Math.max(0, this.ttlMs - this.marginMs);
  }

  /** When to send the next renewal. */
  nextRenewal(): number {
    return this.retryAt ?? this.ackedSent + this.ttlMs / limits.CLIENT_RENEWAL_TTL_DIVISOR;
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
  /** Shown by describe next to this session's holds and waits. */
  owner?: Owner;
}

const WHY_CLOSED = "the session was closed";

/**
 * A session: a lease on the server that keeps this client's locks alive, renewed every TTL/3
 * until `close()`. An open session keeps the Node process alive (its renewal timer).
 */
export class Session {
  readonly id: bigint;
  /** @internal */ readonly client: Client;
  /** @internal */ readonly wire: WireSession;
  /** @internal */ readonly window = new SeqWindow(1);
  /** @internal */ readonly waits = new Semaphore(limits.SESSION_WAITS_IN_FLIGHT_MAX);
  /** @internal Separate from `waits`: a release, which may be what ends those waits, never queues behind them. */
  readonly shortRequests = new Semaphore(limits.SESSION_SHORT_REQUESTS_IN_FLIGHT_MAX);
  /** @internal Names of the locks a live guard holds: a grant of any other lock to this session is one nobody wants. */
  readonly guarded = new Set<string>();
  /** @internal Aborted by close() and by loss: stops the renewal and the background clean-ups. */
  readonly stopped = new AbortController();
  /** @internal Grants of this session an operator force-released, as the last keepalive said. */
  taken = { tokens: new Set<bigint>(), through: 0n };
  /** @internal */ readonly events = new EventEmitter();
  private lease: ClientLease;
  private lostWhy?: string;
  private readonly lostController = new AbortController();
  private readonly background = new Set<Promise<void>>();
  private renewal?: Promise<void>;
  private closing?: Promise<void>;
  private failoverCount = 0;
  private lastEndpoint: string;
  private disrupted = false;

  private constructor(client: Client, wire: WireSession, lease: ClientLease, endpoint: string) {
    this.client = client;
    this.wire = wire;
    this.id = BigInt(wire.id);
    this.lease = lease;
    this.lastEndpoint = endpoint;
    this.events.setMaxListeners(0);
  }

  /** @internal */
  static async create(client: Client, options: SessionOptions): Promise<Session> {
    const ttlMs = Math.round((options.ttl ?? limits.SESSION_TTL_MS_DEFAULT / 1000) * 1000);
    if (!Number.isFinite(ttlMs) || ttlMs < limits.SESSION_TTL_MS_MIN || ttlMs > limits.SESSION_TTL_MS_MAX) {
      throw new InvalidArgument(
        `ttl ${options.ttl} s is out of range ${limits.SESSION_TTL_MS_MIN / 1000}..=${limits.SESSION_TTL_MS_MAX / 1000} s`,
      );
    }
    // Before the first attempt: the lease starts no earlier than this on the server. A retry
    // after a lost answer may leave an orphan session on the server; it holds nothing and
    // expires after its TTL.
    const sent = now();
    const { response, endpoint } = await client.call<Wire>(
      "CreateSession",
      { ttl_ms: String(ttlMs), owner: options.owner ?? null },
      client.short(),
    );
    if (!response.session) throw new ProtocolError("CreateSession answered without a session");
    const lease = new ClientLease(sent, ttlMs);
    lease.acknowledged(sent, Number(response.ttl_ms));
    const session = new Session(client, { id: response.session.id, secret: response.session.secret }, lease, endpoint);
    session.renewal = session.renew();
    return session;
  }

  /** The lease length the server granted, in ms. */
  get ttlMs(): number {
    return this.lease.ttlMs;
  }

  /** How long before the server's earliest possible expiry this client declares the session lost, in ms. */
  get safetyMarginMs(): number {
    return this.lease.marginMs;
  }

  /** The client-side deadline, on the client's clock: compare it with the package's `now()`. */
  get deadline(): number {
    return this.lease.deadline();
  }

  /** Renewals acknowledged by another node than the previous one, or only after failures. */
  get failovers(): number {
    return this.failoverCount;
  }

  /** Aborted when the session may be lost (reason: a SessionLost). */
  get signal(): AbortSignal {
    return this.lostController.signal;
  }

  /** Lost, or past the deadline on this client's clock (exact even when the renewal timer has not run, as after a pause). */
  isLost(): boolean {
    return this.lostWhy !== undefined || now() >= this.lease.deadline();
  }

  /** Why the session is lost, once it is. */
  get lostReason(): string | undefined {
    return this.lostWhy;
  }

  /** @internal */
  lostError(): SessionLost | undefined {
    return this.lostWhy === undefined ? undefined : new SessionLost(this.id, this.lostWhy);
  }

  /** @internal */
  markLost(why: string): void {
    if (this.lostWhy !== undefined) return;
    this.lostWhy = why;
    if (why !== WHY_CLOSED) process.emitWarning(`latchkey: session ${this.id} lost: ${why}`, { code: "LATCHKEY_SESSION_LOST" });
    this.stopped.abort();
    this.lostController.abort(new SessionLost(this.id, why));
  }

  /** @internal Turns a server's "no such session" into the session being lost. */
  check(e: unknown): unknown {
    if (e instanceof SessionNotFound) {
      this.markLost(`the server does not know the session: ${e.message}`);
      return this.lostError() ?? e;
    }
    return e;
  }

  /**
   * Takes the lock `name`, waiting in its FIFO queue at most `wait` seconds (undefined: until
   * granted; 0: try once, never queue). Throws WaitTimeout (Held, a WaitTimeout, when a
   * try-lock found it held), SessionLost if the session is lost meanwhile.
   */
  lock(name: string, options: LockOptions = {}): Promise<LockGuard> {
    return acquire(this, name, options);
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
   * its waits. Every guard reports lost from here on. Idempotent.
   */
  close(): Promise<void> {
    this.closing ??= this.closeOnce();
    return this.closing;
  }

  private async closeOnce(): Promise<void> {
    this.markLost(WHY_CLOSED);
    await this.renewal;
    await Promise.allSettled([...this.background]);
    this.client.forget(this);
    try {
      await this.client.call("CloseSession", { session: this.wire }, this.client.short());
    } catch (e) {
      // Already gone (expired, or a retry of a close that went through): closed all the same.
      if (!(e instanceof SessionNotFound)) throw e;
    }
  }

  /** The renewal loop: one per session, stopped by `stopped`. */
  private async renew(): Promise<void> {
    const signal = this.stopped.signal;
    const lease = this.lease;
    try {
      for (;;) {
        await sleepUntil(Math.min(lease.deadline(), lease.nextRenewal()), signal);
        if (now() >= lease.deadline()) break;
        const sent = now();
        // A renewal races its deadline: short attempts (a paused node must not hold it for
        // long) and frequent retries, so that it reaches a new leader soon after an election.
        const opts: CallOpts = {
          attemptTimeoutMs: Math.max(
            1,
            Math.min(
              this.client.rpcTimeoutMs,
              Math.max(lease.ttlMs / limits.CLIENT_RENEWAL_ATTEMPT_TTL_DIVISOR, limits.CLIENT_RENEWAL_ATTEMPT_MS_MIN),
              lease.deadline() - sent,
            ),
          ),
          backoffMaxMs: Math.max(lease.ttlMs / limits.CLIENT_RENEWAL_BACKOFF_TTL_DIVISOR, limits.CLIENT_RENEWAL_BACKOFF_MS_MIN),
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
        if (result.ok) {
          const l = result.lease;
          if (l === undefined) {
            lease.failed(now());
          } else if (!l.alive) {
            this.markLost("the server says the session has expired");
            return;
          } else {
            this.takenNow(l.revoked_tokens ?? [], l.revoked_through ?? "0");
            lease.acknowledged(sent, Number(l.ttl_ms));
            const failover = this.disrupted || result.failedAttempts > 0 || result.endpoint !== this.lastEndpoint;
            this.disrupted = false;
            this.lastEndpoint = result.endpoint;
            if (failover) {
              this.failoverCount++;
              this.events.emit("failover", this.failoverCount);
            }
          }
        } else if (result.error instanceof SessionNotFound) {
          this.markLost(`the server does not know the session: ${result.error.message}`);
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
    this.markLost("no renewal was acknowledged before the lease deadline (TTL minus safety margin)");
  }

  private takenNow(tokens: string[], through: string): void {
    const next = { tokens: new Set(tokens.map((t) => BigInt(t))), through: BigInt(through) };
    const changed = next.through !== this.taken.through || [...next.tokens].some((t) => !this.taken.tokens.has(t));
    this.taken = next;
    if (changed) this.events.emit("taken");
  }
}
