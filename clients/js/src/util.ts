// Small helpers: the client's clock, abortable sleeps, a semaphore.
import { performance } from "node:perf_hooks";

import * as limits from "./limits";

/**
 * A monotonic clock that also counts time the machine spent suspended, from two sources: a
 * monotonic clock that may stop during a suspend (`performance.now()`: CLOCK_MONOTONIC on
 * Linux) and the wall clock, which keeps running through one (`Date.now()`). Node has no
 * CLOCK_BOOTTIME, which the Rust and Python clients read. A suspend shows as the wall clock
 * running ahead of the monotonic one; every such lead of more than `CLIENT_SUSPEND_DETECT_MS`
 * is added to the reading from then on, so a lease deadline measured on this clock comes at
 * once after a suspend. A wall clock stepped forward (by hand, or NTP) counts the same way,
 * which can only make a lease end sooner on the client; one stepped back is ignored. The
 * reading never decreases and never runs slower than the monotonic source.
 */
export class SuspendAwareClock {
  private monoAt: number;
  private wallAt: number;
  private skipped = 0;

  constructor(
    private readonly mono: () => number,
    private readonly wall: () => number,
  ) {
    this.monoAt = mono();
    this.wallAt = wall();
  }

  /** Milliseconds since an arbitrary origin. */
  now(): number {
    const mono = this.mono();
    const wall = this.wall();
    // How far the wall clock ran ahead of the monotonic one since the last re-anchoring. Small
    // differences are the two clocks' resolution and NTP's slewing: they are not added, or
    // their noise would add up.
    const lead = wall - this.wallAt - (mono - this.monoAt);
    // A wall clock behind the anchor (a step back, or jitter) moves the anchor at once, so
    // that a later suspend is measured in full, not less that lag.
    if (lead > limits.CLIENT_SUSPEND_DETECT_MS || lead < 0) {
      if (lead > 0) this.skipped += lead;
      this.monoAt = mono;
      this.wallAt = wall;
    }
    return mono + this.skipped;
  }
}

const clock = new SuspendAwareClock(
  () => performance.now(),
  () => Date.now(),
);

/**
 * The clock every deadline of this client is measured on, in milliseconds: `performance.now()`
 * plus the time the machine spent suspended, as `SuspendAwareClock` detects it. Exported:
 * `Session.deadline` is on this clock, so compare it with `now()`, never with
 * `performance.now()`, which leaves the suspends out.
 */
export function now(): number {
  return clock.now();
}

/** Thrown into a sleep or a call when its AbortSignal fires. */
export class Aborted extends Error {
  constructor() {
    super("aborted");
    this.name = "Aborted";
  }
}

/** Resolves after `ms` (at least 1 ms, the timer's resolution), or rejects with Aborted. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(new Aborted());
    const onAbort = () => {
      clearTimeout(timer);
      reject(new Aborted());
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.max(1, Math.ceil(ms)));
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Sleeps until `now()` reads `at`; a late timer is re-armed until the clock really got there. */
export async function sleepUntil(at: number, signal?: AbortSignal): Promise<void> {
  for (;;) {
    const left = at - now();
    if (left <= 0) return;
    await sleep(left, signal);
  }
}

/** A counting semaphore; `acquire` resolves with the function that gives the permit back. */
export class Semaphore {
  private waiting: Array<() => void> = [];
  constructor(private permits: number) {}

  async acquire(): Promise<() => void> {
    if (this.permits > 0) {
      this.permits--;
    } else {
      await new Promise<void>((resolve) => this.waiting.push(resolve));
    }
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.waiting.shift();
      if (next) next();
      else this.permits++;
    };
  }
}
