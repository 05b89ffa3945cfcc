// Small helpers: the client's clock, abortable sleeps, a semaphore.
import { performance } from "node:perf_hooks";

/**
 * The clock every deadline of this client is measured on: milliseconds of `performance.now()`,
 * which is monotonic (never jumps with the wall clock). On Linux it is CLOCK_MONOTONIC, which
 * does NOT advance while the machine is suspended (the Rust client uses CLOCK_BOOTTIME, which
 * does). After a suspend the deadline this client computes is later than the server's: see the
 * README ("Node: what is different").
 */
export function now(): number {
  return performance.now();
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
