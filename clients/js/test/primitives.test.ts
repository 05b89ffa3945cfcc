// Read-write locks and counting semaphores (issue #32, docs/primitives.md) against a real
// `latchkey serve`.
import { after, before, describe, it } from "node:test";
import * as assert from "node:assert/strict";

import { Client, Conflict, Held, InvalidArgument, KindConflict, limits, LockGuard, PermitsConflict, PermitsOutOfRange, Session } from "latchkey";
import { Server, waitUntil } from "./harness";

describe("read-write locks and semaphores", () => {
  let server: Server;
  let client: Client;
  before(async () => {
    server = await Server.start();
    client = new Client([server.addr]);
  });
  after(async () => {
    await client?.close();
    await server?.stop();
  });

  async function sessions(n: number): Promise<Session[]> {
    return Promise.all(Array.from({ length: n }, () => client.session({ ttl: 10 })));
  }

  async function closeAll(ss: Session[]): Promise<void> {
    await Promise.allSettled(ss.map((s) => s.close()));
  }

  it("holds readers together, a writer alone, and queues a reader behind a waiting writer", async () => {
    const ss = await sessions(4);
    const [r1, r2, w, r3] = ss;
    try {
      const g1 = await r1.lockShared("rw/cfg", { wait: 0 });
      const g2 = await r2.lock("rw/cfg", { wait: 0, shared: true });
      assert.ok(g2.token > g1.token, "two entries, two tokens in order");
      let info = await client.describe("rw/cfg");
      assert.equal(info.mode, "shared");
      assert.equal(info.permits, 0);
      assert.deepEqual(info.holders.map((h) => h.sessionId), [r1.id, r2.id]);
      assert.deepEqual(info.holders.map((h) => h.token), [g1.token, g2.token]);
      assert.deepEqual(info.holder, info.holders[0]);
      // A writer finds readers: a try-lock names the first of them.
      await assert.rejects(w.lock("rw/cfg", { wait: 0 }), (e: unknown) => e instanceof Held && e.holder.sessionId === r1.id);
      const writer = w.lock("rw/cfg", { wait: 20 });
      await waitUntil("the writer queued", 5000, async () => (await client.describe("rw/cfg")).waiters === 1);
      // A reader that comes behind the waiting writer waits too, though readers hold.
      await assert.rejects(r3.lockShared("rw/cfg", { wait: 0 }), Held);
      info = await client.describe("rw/cfg");
      assert.deepEqual(info.queue.map((q) => [q.sessionId, q.mode]), [[w.id, "exclusive"]]);
      await g1.release();
      await g2.release();
      const gw = await writer;
      assert.ok(gw.token > g2.token);
      info = await client.describe("rw/cfg");
      assert.equal(info.mode, "exclusive");
      assert.deepEqual(info.holders.map((h) => h.sessionId), [w.id]);
      // The writer holds alone: a reader waits for it, then gets a higher token.
      const reader = r3.lockShared("rw/cfg", { wait: 20 });
      await waitUntil("the reader queued", 5000, async () => (await client.describe("rw/cfg")).waiters === 1);
      await gw.release();
      const gr = await reader;
      assert.ok(gr.token > gw.token);
      await gr.release();
    } finally {
      await closeAll(ss);
    }
  });

  it("holds N permits of a semaphore and queues the next", async () => {
    const ss = await sessions(4);
    try {
      const guards: LockGuard[] = [];
      for (const s of ss.slice(0, 3)) guards.push(await s.acquirePermit("sem/jobs", 3, { wait: 0 }));
      const tokens = guards.map((g) => g.token);
      for (let i = 1; i < tokens.length; i++) assert.ok(tokens[i] > tokens[i - 1], "a token of its own each, increasing");
      const info = await client.describe("sem/jobs");
      assert.equal(info.mode, "permits");
      assert.equal(info.permits, 3);
      assert.deepEqual(info.holders.map((h) => h.sessionId), ss.slice(0, 3).map((s) => s.id));
      assert.deepEqual(info.holders.map((h) => h.token), tokens);
      await assert.rejects(ss[3].lock("sem/jobs", { wait: 0, permits: 3 }), Held);
      const fourth = ss[3].acquirePermit("sem/jobs", 3, { wait: 20 });
      await waitUntil("the fourth queued", 5000, async () => (await client.describe("sem/jobs")).waiters === 1);
      await guards[1].release();
      const g4 = await fourth;
      assert.ok(g4.token > tokens[2]);
      assert.deepEqual((await client.describe("sem/jobs")).holders.map((h) => h.sessionId), [ss[0].id, ss[2].id, ss[3].id]);
      assert.equal(g4.fencingHeaders()["latchkey-token"], g4.token.toString());
    } finally {
      await closeAll(ss);
    }
    assert.equal((await client.describe("sem/jobs")).holder, undefined);
  });

  it("refuses another kind or count with a typed error that changes nothing", async () => {
    const ss = await sessions(2);
    const [a, b] = ss;
    try {
      const g = await a.acquirePermit("sem/kind", 2, { wait: 0 });
      await assert.rejects(b.lock("sem/kind", { wait: 0 }), (e: unknown) => {
        assert.ok(e instanceof KindConflict && e instanceof Conflict, String(e));
        assert.equal(e.reason, "kind-conflict");
        assert.match(e.message, /semaphore of 2 permits/);
        return true;
      });
      await assert.rejects(b.lockShared("sem/kind", { wait: 5 }), KindConflict);
      await assert.rejects(b.acquirePermit("sem/kind", 5, { wait: 5 }), (e: unknown) => {
        assert.ok(e instanceof PermitsConflict, String(e));
        assert.equal(e.reason, "permits-conflict");
        assert.match(e.message, /not 5/);
        return true;
      });
      const info = await client.describe("sem/kind");
      assert.equal(info.permits, 2);
      assert.deepEqual(info.holders.map((h) => h.sessionId), [a.id]);
      assert.equal(info.waiters, 0);
      // The session is still good: the right count is granted.
      assert.ok((await b.acquirePermit("sem/kind", 2, { wait: 0 })).token > g.token);
      // And a name held as a lock refuses a permit.
      await a.lock("lock/kind", { wait: 0 });
      await assert.rejects(b.acquirePermit("lock/kind", 2, { wait: 0 }), KindConflict);
    } finally {
      await closeAll(ss);
    }
  });

  it("refuses bad permits before any call", async () => {
    const [s] = await sessions(1);
    try {
      for (const bad of [0, limits.HOLDERS_PER_LOCK_MAX + 1, 1.5]) {
        await assert.rejects(s.acquirePermit("sem/bad", bad, { wait: 0 }), (e: unknown) => {
          assert.ok(e instanceof PermitsOutOfRange && e instanceof InvalidArgument, String(e));
          assert.equal(e.permits, bad);
          assert.equal(e.max, 1024);
          return true;
        });
      }
      await assert.rejects(s.lock("sem/bad", { wait: 0, shared: true, permits: 2 }), InvalidArgument);
      await assert.rejects(client.lock("sem/bad", { permits: 0 }), PermitsOutOfRange);
      // The top of the range is fine.
      await (await s.acquirePermit("sem/bad", limits.HOLDERS_PER_LOCK_MAX, { wait: 0 })).release();
    } finally {
      await s.close();
    }
    assert.equal((await client.describe("sem/bad")).holder, undefined);
  });

  it("takes a reader or a permit in a session of its own with Client.lock", async () => {
    const r1 = await client.lock("ctx/cfg", { ttl: 5, wait: 0, shared: true });
    const r2 = await client.lock("ctx/cfg", { ttl: 5, wait: 0, shared: true });
    const info = await client.describe("ctx/cfg");
    assert.equal(info.mode, "shared");
    assert.deepEqual(new Set(info.holders.map((h) => h.sessionId)), new Set([r1.sessionId, r2.sessionId]));
    await r1.release();
    await r2.release();
    const p1 = await client.lock("ctx/sem", { ttl: 5, wait: 0, permits: 2 });
    const p2 = await client.lock("ctx/sem", { ttl: 5, wait: 0, permits: 2 });
    await assert.rejects(client.lock("ctx/sem", { ttl: 5, wait: 0, permits: 2 }), Held);
    assert.equal((await client.describe("ctx/sem")).holders.length, 2);
    await p1.release();
    await p2.release();
    assert.equal((await client.describe("ctx/sem")).holder, undefined);
  });

  it("lists each name's mode, permits and every holder", async () => {
    const ss = await sessions(2);
    const [a, b] = ss;
    try {
      await a.acquirePermit("listed/sem", 4, { wait: 0 });
      await b.acquirePermit("listed/sem", 4, { wait: 0 });
      await a.lockShared("listed/rw", { wait: 0 });
      const byName = new Map((await client.list("listed/")).locks.map((l) => [l.name, l]));
      assert.equal(byName.get("listed/sem")?.mode, "permits");
      assert.equal(byName.get("listed/sem")?.permits, 4);
      assert.deepEqual(byName.get("listed/sem")?.holders.map((h) => h.sessionId), [a.id, b.id]);
      assert.equal(byName.get("listed/rw")?.mode, "shared");
    } finally {
      await closeAll(ss);
    }
  });

  it("reads a mutex as one exclusive holder", async () => {
    const g = await client.lock("plain/mutex", { ttl: 5, wait: 0 });
    let info = await client.describe("plain/mutex");
    assert.equal(info.mode, "exclusive");
    assert.equal(info.permits, 0);
    assert.deepEqual(info.holders, [info.holder]);
    assert.equal(info.holder?.token, g.token);
    await g.release();
    info = await client.describe("plain/mutex");
    assert.equal(info.holder, undefined);
    assert.deepEqual(info.holders, []);
  });
});
