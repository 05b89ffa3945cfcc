// Client-side coalescing (`batch: true`, issue #35 item 2) against a real `latchkey serve`:
// many sessions of one client taking and releasing their own locks at once go in `Batch` calls
// (fewer calls than operations, counted by the server's metrics), each getting its own answer;
// a call made alone goes at once, alone; an acquire that must wait answers PENDING in its batch
// and then long-polls alone until granted; one operation's error fails only its own call, as
// the error its own call raises.
import { after, before, describe, it } from "node:test";
import * as assert from "node:assert/strict";

import { Client, LockGuard, PermitsConflict, Session } from "latchkey";
import { readMetric, Server, waitUntil } from "./harness";

const SESSIONS = 32;
const ROUNDS = 3;
/** Seconds: bound for anything that should take a moment. */
const T = 20;

describe("batch", () => {
  let server: Server;
  before(async () => {
    server = await Server.start([], {}, { metrics: true });
  });
  after(async () => {
    await server?.stop();
  });

  const requests = (method: string) => readMetric(server.metricsAddr!, "latchkey_requests_total", `method="${method}"`);
  /** Calls that carried an acquire, release or close: each alone, or a Batch of them. */
  const rpcs = async () => {
    let n = 0;
    for (const m of ["acquire", "release", "close_session", "batch"]) n += await requests(m);
    return n;
  };
  /** name -> [session, token] of the held locks under `prefix`. */
  const held = async (client: Client, prefix: string) => {
    const out: Record<string, [bigint, bigint]> = {};
    for (const l of (await client.list(prefix)).locks) if (l.holder) out[l.name] = [l.holder.sessionId, l.holder.token];
    return out;
  };

  it("sends concurrent operations of one client in batches, each with its own answer", async () => {
    // The default batches (issue #35: clients coalesce automatically).
    const client = new Client([server.addr]);
    try {
      const sessions: Session[] = [];
      for (let i = 0; i < SESSIONS; i++) sessions.push(await client.session({ ttl: 15 }));
      const [before, batches] = [await rpcs(), await requests("batch")];
      for (let round = 0; round < ROUNDS; round++) {
        const guards = await Promise.all(sessions.map((s, i) => s.lock(`own/${i}`, { wait: T })));
        // Each call got its own answer: its lock, held by its session under its token.
        const want: Record<string, [bigint, bigint]> = {};
        sessions.forEach((s, i) => (want[`own/${i}`] = [s.id, guards[i].token]));
        assert.deepEqual(await held(client, "own/"), want);
        await Promise.all(guards.map((g) => g.release()));
        assert.deepEqual(await held(client, "own/"), {});
      }
      const calls = (await rpcs()) - before;
      const ops = 2 * SESSIONS * ROUNDS;
      console.log(`${ops} acquires and releases in ${calls} calls`);
      assert.ok((await requests("batch")) > batches, "no Batch call");
      assert.ok(calls < ops, `${calls} calls for ${ops} operations`);
    } finally {
      await client.close();
    }
  });

  it("sends a call made alone at once, alone", async () => {
    // One attempt per call: a call held back until its attempt's time is up fails instead of
    // passing on a retry.
    const client = new Client([server.addr], { batch: true, retry: { attemptsMax: 1 } });
    try {
      const s = await client.session({ ttl: 15 });
      const [before, batches] = [await rpcs(), await requests("batch")];
      for (let i = 0; i < 10; i++) await (await s.lock(`alone/${i}`, { wait: T })).release();
      assert.equal((await rpcs()) - before, 20);
      assert.equal((await requests("batch")) - batches, 20);
    } finally {
      await client.close();
    }
  });

  it("grants an acquire answered PENDING in its batch once the holder releases", async () => {
    const client = new Client([server.addr], { batch: true });
    try {
      const [a, b] = [await client.session({ ttl: 15 }), await client.session({ ttl: 15 })];
      const first = await a.lock("contended", { wait: T });
      const acquires = await requests("acquire");
      let done = false;
      const waiting = b.lock("contended", { wait: T }).finally(() => (done = true));
      await waitUntil("b waits in the queue", T * 1000, async () => (await client.describe("contended")).waiters === 1);
      // Answered PENDING in its batch, it long-polls in an Acquire of its own.
      await waitUntil("b long-polls alone", T * 1000, async () => (await requests("acquire")) > acquires);
      assert.equal(done, false);
      await first.release();
      const second = await waiting;
      assert.ok(second.token > first.token);
      assert.deepEqual(await held(client, "contended"), { contended: [b.id, second.token] });
      await second.release();
    } finally {
      await client.close();
    }
  });

  /** The outcomes of acquires made at once, one of which (index 3) conflicts with its lock's kind. */
  async function withConflict(batch: boolean, prefix: string): Promise<unknown> {
    const client = new Client([server.addr], { batch });
    try {
      const sessions: Session[] = [];
      for (let i = 0; i < 8; i++) sessions.push(await client.session({ ttl: 15 }));
      const permit = await sessions[0].acquirePermit(`${prefix}/sem`, 2, { wait: T });
      const outcomes = await Promise.allSettled(
        sessions.map((s, i) => (i === 3 ? s.acquirePermit(`${prefix}/sem`, 5, { wait: T }) : s.lock(`${prefix}/${i}`, { wait: T }))),
      );
      // Only the conflicting acquire failed; each other got its own lock.
      assert.deepEqual(
        outcomes.map((o) => o.status),
        sessions.map((_, i) => (i === 3 ? "rejected" : "fulfilled")),
      );
      const want: Record<string, [bigint, bigint]> = { [`${prefix}/sem`]: [sessions[0].id, permit.token] };
      outcomes.forEach((o, i) => {
        if (o.status === "fulfilled") want[`${prefix}/${i}`] = [sessions[i].id, o.value.token];
      });
      assert.deepEqual(await held(client, `${prefix}/`), want);
      for (const o of outcomes) if (o.status === "fulfilled") await (o.value as LockGuard).release();
      await permit.release();
      return (outcomes[3] as PromiseRejectedResult).reason;
    } finally {
      await client.close();
    }
  }

  it("fails only the operation in error, with the error its own call raises", async () => {
    const alone = await withConflict(false, "err1");
    const before = await requests("batch");
    const batched = await withConflict(true, "err2");
    assert.ok((await requests("batch")) > before, "no Batch call");
    assert.ok(alone instanceof PermitsConflict, String(alone));
    assert.ok(batched instanceof PermitsConflict, String(batched));
    assert.equal((batched as PermitsConflict).reason, (alone as PermitsConflict).reason);
  });
});
