// Leader election (issue #32): reading the leader and observing its changes; crates/client/src/
// election.rs is the reference. Campaigning is `Session.campaign` (lock.ts, `Leadership`).
//
// `observe` is built on a watch of the election's name in its Raft group: every member applies
// the same log, so an event's position (log index, ordinal) is the same everywhere, and a stream
// that breaks (or goes silent) is resumed on another member from where it got to, dropping what
// was delivered already (`WatchCursor`). On top of it, fencing tokens strictly increase per name,
// so an observer that applies only grants above the last token it knows never goes back to an
// older leader, and reports a change only when (leader, token, value) changes (`Observed`).
import * as grpc from "@grpc/grpc-js";

import type { Client, LockInfo, Wire } from "./client";
import { valueFromWire } from "./client";
import { classify, ProtocolError, Unavailable } from "./errors";
import { groupOf } from "./groups";
import * as limits from "./limits";
import { sleep } from "./util";

/** An election's leader as a read or an event tells it. */
export interface Leader {
  sessionId: bigint;
  /** The leader's term: its grant's fencing token. */
  token: bigint;
  /** What it published (empty when it took the name as a plain lock, without a value). */
  value: Buffer;
  /** How long it has led, by the Raft leader's clock (undefined from a watch event, which carries no time). */
  heldForMs?: number;
}

/** @internal The leader a Describe shows: the exclusive holder, if any (`Client.leader`). */
export function leaderOf(info: LockInfo): Leader | undefined {
  const h = info.holder;
  if (h === undefined || info.mode !== "exclusive") return undefined;
  return { sessionId: h.sessionId, token: h.token, value: h.value ?? Buffer.alloc(0), heldForMs: h.heldForMs };
}

/** @internal A watch event as the wire carries it (64-bit fields as decimal strings). */
interface WireEvent {
  index: string;
  ordinal: number;
  kind: string;
  lock: string;
  session: string;
  token: string;
  mode?: string | number;
  value?: Buffer;
}

/** @internal What an observe knows (election.rs `Observed`): pure, fed the leader reads and the name's watch events. */
export class Observed {
  /** The leader now (undefined: nobody leads). */
  current?: Leader;
  /** The leader last delivered. */
  delivered?: Leader;
  /** The highest token seen for the name: a grant at or below it is old news. */
  lastToken = 0n;
  /**
   * The log index the last read reflects: an event at or below it is in the read already (a
   * lagging member may replay it after the read; a proclaim replayed then would bring an older
   * value back under the same token).
   */
  readIndex = 0n;

  /**
   * A read of the leader reflecting the log up to `index` (DescribeResponse.read_index); one
   * older than what the events already said (it raced them) is ignored.
   */
  read(leader: Leader | undefined, index = 0n): void {
    if (leader !== undefined) {
      if (leader.token < this.lastToken) return;
      this.lastToken = leader.token;
    }
    if (index > this.readIndex) this.readIndex = index;
    this.current = leader;
  }

  apply(e: WireEvent): void {
    if (BigInt(e.index) <= this.readIndex) return;
    const token = BigInt(e.token);
    const value = valueFromWire(e.value) ?? Buffer.alloc(0);
    const cur = this.current;
    switch (e.kind) {
      case "granted": {
        const exclusive = e.mode === "LOCK_MODE_EXCLUSIVE" || e.mode === 0;
        if (exclusive && token > this.lastToken) {
          this.lastToken = token;
          this.current = { sessionId: BigInt(e.session), token, value };
        }
        return;
      }
      case "proclaimed":
        if (cur !== undefined && cur.token === token) this.current = { ...cur, value };
        return;
      case "released":
      case "expired":
      case "revoked":
      case "force_released":
        if (cur !== undefined && cur.token === token) this.current = undefined;
        return;
      default:
        return;
    }
  }

  /** The leader to deliver, if it is news: another leader or value than the last delivered. */
  news(): Leader | undefined {
    const now = this.current;
    if (now === undefined) return undefined;
    const d = this.delivered;
    if (d !== undefined && d.sessionId === now.sessionId && d.token === now.token && d.value.equals(now.value)) return undefined;
    this.delivered = now;
    return now;
  }
}

/** "Every event of this index delivered": after any ordinal of it. */
const WHOLE_ENTRY = 2 ** 32 - 1;

/** The events after `afterIndex` up to `throughIndex` could not be sent (the member no longer keeps them). */
export interface WatchMissed {
  kind: "missed";
  afterIndex: bigint;
  throughIndex: bigint;
}

/** @internal Where a watch stream got to (watch.rs `GroupWatch::accept`). */
export class WatchCursor {
  last?: [bigint, number];

  resumeIndex(): bigint | undefined {
    if (this.last === undefined) return undefined;
    const [i, o] = this.last;
    return o === WHOLE_ENTRY ? i : i - 1n;
  }

  /** The event or missed notice to deliver, or undefined (a progress, or already delivered). */
  accept(message: Wire): WireEvent | WatchMissed | undefined {
    let position: [bigint, number];
    let out: WireEvent | WatchMissed | undefined;
    if (message.progress) {
      position = [BigInt(message.progress.index), WHOLE_ENTRY];
    } else if (message.missed) {
      const m = message.missed;
      position = [BigInt(m.through_index), WHOLE_ENTRY];
      out = { kind: "missed", afterIndex: BigInt(m.after_index), throughIndex: BigInt(m.through_index) };
    } else if (message.event) {
      const e = message.event as WireEvent;
      position = [BigInt(e.index), Number(e.ordinal)];
      out = e;
    } else {
      throw new ProtocolError("Watch sent an empty message");
    }
    const last = this.last;
    if (last !== undefined && (position[0] < last[0] || (position[0] === last[0] && position[1] <= last[1]))) return undefined;
    this.last = position;
    return out;
  }
}

function isMissed(x: WireEvent | WatchMissed): x is WatchMissed {
  return (x as WatchMissed).kind === "missed";
}

/** Thrown inside an observe once it was closed: its iteration ends. */
class Closed extends Error {}

/** @internal One election name's watch in its Raft group, resumed on another member when it breaks or goes silent. */
class NameWatch {
  readonly cursor = new WatchCursor();
  private stream?: grpc.ClientReadableStream<Wire>;
  private target = "";
  /** Messages, and the end of the stream (an error, or undefined for a clean end), not yet taken. */
  private queue: Array<{ message?: Wire; end?: { error?: grpc.ServiceError } }> = [];
  private wake?: () => void;
  private broken = 0;
  closed = false;

  constructor(
    private readonly client: Client,
    private readonly name: string,
  ) {}

  private async open(): Promise<void> {
    const groups = await this.client.groups();
    const group = groupOf(this.name, groups);
    const t = this.client.pick(group);
    const request: Wire = { prefix: this.name };
    const after = this.cursor.resumeIndex();
    if (after !== undefined) request.after_index = after.toString();
    if (groups > 1) request.group = group;
    const stream = this.client.stream(t, "Watch", request);
    this.queue = [];
    const push = (item: { message?: Wire; end?: { error?: grpc.ServiceError } }) => {
      if (this.stream !== stream) return;
      this.queue.push(item);
      this.wake?.();
    };
    stream.on("data", (message: Wire) => push({ message }));
    stream.on("error", (error: grpc.ServiceError) => push({ end: { error } }));
    stream.on("end", () => push({ end: {} }));
    this.stream = stream;
    this.target = t;
  }

  /** The next item of the stream, or undefined after CLIENT_WATCH_SILENCE_MS of silence. */
  private async take(): Promise<{ message?: Wire; end?: { error?: grpc.ServiceError } } | undefined> {
    if (this.queue.length === 0) {
      let timer: NodeJS.Timeout | undefined;
      await new Promise<void>((resolve) => {
        this.wake = resolve;
        timer = setTimeout(resolve, limits.CLIENT_WATCH_SILENCE_MS);
      });
      clearTimeout(timer);
      this.wake = undefined;
    }
    return this.queue.shift();
  }

  private lostStream(): void {
    const s = this.stream;
    this.stream = undefined;
    if (s !== undefined) {
      s.cancel();
      if (!this.closed) this.client.streamBroke(this.target);
    }
  }

  /** The next event or missed notice, or undefined once the position moved without one. */
  async nextStep(): Promise<WireEvent | WatchMissed | undefined> {
    for (;;) {
      if (this.closed) throw new Closed();
      if (this.stream === undefined) {
        this.broken++;
        if (this.broken > this.client.retry.attemptsMax) {
          throw new Unavailable(this.broken - 1, 0, `watch: ${this.broken - 1} streams in a row broke before delivering anything`);
        }
        if (this.broken > 1) await sleep(Math.min(this.client.retry.backoffMaxMs, 50 * 2 ** Math.min(this.broken, 8)));
        if (this.closed) throw new Closed();
        await this.open();
      }
      const item = await this.take();
      if (this.closed) throw new Closed();
      if (item === undefined) {
        this.lostStream(); // silent past CLIENT_WATCH_SILENCE_MS
        continue;
      }
      if (item.end !== undefined) {
        const err = item.end.error;
        if (err !== undefined) {
          const failure = classify(err);
          const code = err.code;
          // An access or argument error is not cured by another member.
          if (failure.kind === "fatal" && (code === grpc.status.PERMISSION_DENIED || code === grpc.status.UNAUTHENTICATED || code === grpc.status.INVALID_ARGUMENT)) {
            this.close();
            throw failure.error;
          }
        }
        this.lostStream();
        continue;
      }
      this.broken = 0;
      const before = this.cursor.last;
      const out = this.cursor.accept(item.message);
      if (out !== undefined) return out;
      if (this.cursor.last !== before) return undefined;
    }
  }

  close(): void {
    this.closed = true;
    const s = this.stream;
    this.stream = undefined;
    s?.cancel();
    this.wake?.();
  }
}

/**
 * The leaders of an election (`Client.observe`), as etcd's Observe: an async iterator of
 * `Leader`s, the current leader first (if one leads), then each new leader and each new value of
 * a leader; never the same twice in a row, never an older leader after a newer one (tokens
 * increase). A time with no leader is not an item (`Client.leader` says whether anyone leads
 * now). It resumes across member failures; if a member can no longer replay what was missed, it
 * re-reads the leader. `close()` ends it (a pending `next()` resolves as done).
 */
export class Observe implements AsyncIterableIterator<Leader> {
  /** @internal */
  readonly watch: NameWatch;
  private readonly state = new Observed();

  /** @internal */
  constructor(
    private readonly client: Client,
    private readonly name: string,
  ) {
    this.watch = new NameWatch(client, name);
  }

  /** @internal The watch first, then the read: whatever changes in between comes as events, which the tokens put in their place. */
  async start(): Promise<void> {
    try {
      while (this.watch.cursor.last === undefined) {
        const item = await this.watch.nextStep();
        if (item !== undefined) await this.apply(item);
      }
      await this.resync();
    } catch (e) {
      this.close();
      throw e;
    }
  }

  private async resync(): Promise<void> {
    const [info, index] = await this.client.describeRead(this.name);
    this.state.read(leaderOf(info), index);
  }

  private async apply(item: WireEvent | WatchMissed): Promise<void> {
    if (isMissed(item)) await this.resync();
    else if (item.lock === this.name) this.state.apply(item);
  }

  /** The next leader, or the leader's next value. */
  async next(): Promise<IteratorResult<Leader>> {
    try {
      for (;;) {
        const news = this.state.news();
        if (news !== undefined) return { done: false, value: news };
        const item = await this.watch.nextStep();
        if (item !== undefined) await this.apply(item);
      }
    } catch (e) {
      if (e instanceof Closed) return { done: true, value: undefined };
      throw e;
    }
  }

  async return(): Promise<IteratorResult<Leader>> {
    this.close();
    return { done: true, value: undefined };
  }

  [Symbol.asyncIterator](): Observe {
    return this;
  }

  /** Ends the observe: its stream is cancelled. */
  close(): void {
    this.watch.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }
}
