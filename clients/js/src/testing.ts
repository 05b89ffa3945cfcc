// Test hooks: public so that the conformance agent (a thin script over the public API) can
// reach them, and documented as not for production use.
import type { Wire } from "./client";
import type { Session } from "./session";

/**
 * Sends ONE Acquire request of `session` for `name` twice, with the same sequence number, as a
 * retry after a lost answer would (try-lock: wait 0), and returns both tokens (0n: not
 * granted). Exactly-once means both are equal and the lock is held once. The grant is left held
 * by the session with no guard: release it through `Client.describe` + a new lock, or close the
 * session. For tests only.
 */
export async function acquireTwiceWithSameSeq(logical: Session, name: string): Promise<[bigint, bigint]> {
  const session = await logical.forLock(name);
  const seq = await session.window.begin();
  try {
    const request = { session: session.wire, seq: String(seq), name, wait_timeout_ms: "0" };
    const tokens: bigint[] = [];
    for (let i = 0; i < 2; i++) {
      const { response } = await session.client.call<Wire>("Acquire", request, session.short());
      tokens.push(response.result === "ACQUIRE_RESULT_GRANTED" ? BigInt(response.token) : 0n);
    }
    return [tokens[0], tokens[1]];
  } finally {
    session.window.end(seq);
  }
}

// The pure pieces, for unit tests: the lease arithmetic, the sequence window, the status mapping.
export { ClientLease, SeqWindow } from "./session";
export { Observed } from "./election";
export { classify } from "./errors";
export { mergeLists } from "./client";
export { fnv1a64, fmix64, jump } from "./groups";
export { SuspendAwareClock } from "./util";
