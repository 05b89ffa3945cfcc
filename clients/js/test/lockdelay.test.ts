// Lock-delay, conflict events and queue positions (issue #32 items 4 and 5,
// docs/primitives.md) against a real `latchkey serve`.
import { after, before, describe, it } from "node:test";
import * as assert from "node:assert/strict";
import { spawn } from "node:child_process";
import * as path from "node:path";
import * as readline from "node:readline";

import { Client, Conflict, InvalidArgument, LockGuard, Session } from "latchkey";
import { Server, waitUntil } from "./harness";

// A holder's session TTL (s), and a lock-delay well above it: a waiter granted at the expiry
// without the delay would be granted within about a TTL of the holder's death.
const TTL = 2;
const DELAY_MS = 6_000;

// A holder in a process of its own, so that it can die without a word (SIGKILL): it takes the
// lock with a lock-delay, prints its token, and holds (its renewal timer keeps it running).
const HOLDER = `
const { Client } = require(process.argv[1]);
(async () => {
  const client = new Client([process.argv[2]]);
  const session = await client.session({ ttl: Number(process.argv[4]) });
  const guard = await session.lock(process.argv[3], { wait: 0, lockDelayMs: Number(process.argv[5]) });
  console.log(String(guard.token));
})().catch((e) => { console.error(e); process.exit(1); });
`;

describe("lock-delay, conflict events and queue positions", () => {
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

  async function sessions(n: number, ttl = 10): Promise<Session[]> {
    return Promise.all(Array.from({ length: n }, () => client.session({ ttl })));
  }

  async function closeAll(ss: Session[]): Promise<void> {
    await Promise.allSettled(ss.map((s) => s.close()));
  }

  it("checks a lock-delay before any call", async () => {
    const [s] = await sessions(1);
    try {
      for (const [bad, words] of [
        [300_000.5, /at most 300000 ms, not 300001/],
        [Infinity, /at most 300000 ms/],
        [-1, /0 or more ms/],
        [NaN, /0 or more ms/],
        ["5", /not string/],
      ] as Array<[unknown, RegExp]>) {
        await assert.rejects(s.lock("delay/bad", { wait: 0, lockDelayMs: bad as number }), (e: unknown) => e instanceof InvalidArgument && words.test(e.message));
      }
      await assert.rejects(s.lock("delay/bad", { wait: 0, shared: true, lockDelayMs: 1 }), /exclusive lock \(a mutex\) only/);
      await assert.rejects(s.lock("delay/bad", { wait: 0, permits: 3, lockDelayMs: 1 }), /exclusive lock \(a mutex\) only/);
      await assert.rejects(client.lock("delay/bad", { lockDelayMs: 300_001 }), InvalidArgument);
      assert.equal((await client.describe("delay/bad")).holder, undefined, "nothing was asked");
      // Rounded up to whole ms; the most allowed is taken, and shown as the holder's.
      const g = await s.lock("delay/bad", { wait: 0, lockDelayMs: 299_999.2 });
      const info = await client.describe("delay/bad");
      assert.equal(info.holder?.token, g.token);
      assert.equal(info.lockDelayMs, 300_000);
      assert.equal(info.delayRemainingMs, undefined);
      await g.release();
      // A lock in a session of its own asks for it too.
      const own = await client.lock("delay/own", { wait: 0, lockDelayMs: 1_500 });
      assert.equal((await client.describe("delay/own")).lockDelayMs, 1_500);
      await own.release();
    } finally {
      await closeAll([s]);
    }
  });

  it("keeps a dead holder's lock from a waiter for its lock-delay", async () => {
    const dist = path.resolve(__dirname, "..", "dist");
    const holder = spawn(process.execPath, ["-e", HOLDER, dist, server.addr, "delay/dead", String(TTL), String(DELAY_MS)], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    const [w] = await sessions(1);
    try {
      const lines = readline.createInterface({ input: holder.stdout! });
      const line: string = await new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error("the holder process said nothing in 20 s")), 20_000);
        lines.once("line", (l) => {
          clearTimeout(timer);
          resolve(l);
        });
      });
      lines.close();
      const token = BigInt(line.trim());
      const info = await client.describe("delay/dead");
      assert.equal(info.holder?.token, token);
      assert.equal(info.lockDelayMs, DELAY_MS);
      let grantedAt = 0;
      const waiting = w.lock("delay/dead", { wait: 60 }).then((g) => {
        grantedAt = Date.now();
        return g;
      });
      await waitUntil("the waiter queued", 5000, async () => (await client.describe("delay/dead")).waiters === 1);
      const killedAt = Date.now();
      holder.kill("SIGKILL");
      // The holder's session expires about a TTL later; then the delay runs: no holder, the
      // waiter keeps its place.
      await waitUntil("the delay runs", (3 * TTL + 5) * 1000, async () => (await client.describe("delay/dead")).delayRemainingMs !== undefined);
      const during = await client.describe("delay/dead");
      assert.equal(during.holder, undefined);
      assert.deepEqual(during.queue.map((q) => q.sessionId), [w.id]);
      assert.equal(during.delayToken, token, "the lost grant's token, which forceRelease names to end the delay");
      const granted = await waiting;
      assert.ok(grantedAt - killedAt >= DELAY_MS, `granted ${grantedAt - killedAt} ms after the holder died, within its ${DELAY_MS} ms lock-delay`);
      assert.ok(granted.token > token);
      await granted.release();
    } finally {
      holder.kill("SIGKILL");
      await closeAll([w]);
    }
  });

  it("keeps the delay a retried forceRelease started, and ends it only with endDelay", async () => {
    const [a, b] = await sessions(2);
    try {
      const g = await a.lock("delay/forced", { wait: 0, lockDelayMs: 300_000 });
      let granted: LockGuard | undefined;
      const waiting = b.lock("delay/forced", { wait: 60 }).then((w) => (granted = w));
      await waitUntil("the waiter queued", 5000, async () => (await client.describe("delay/forced")).waiters === 1);
      const first = await client.forceRelease("delay/forced", { token: g.token, reason: "wedged" });
      assert.deepEqual(first, { sessionId: a.id, token: g.token });
      // The same call again (a retry after a lost answer): the same answer, the delay kept.
      assert.deepEqual(await client.forceRelease("delay/forced", { token: g.token, reason: "wedged" }), first);
      const stillDelayed = async () => {
        const info = await client.describe("delay/forced");
        assert.equal(info.holder, undefined);
        assert.equal(info.delayToken, g.token);
        assert.deepEqual(info.queue.map((q) => q.sessionId), [b.id]);
      };
      await stillDelayed();
      await assert.rejects(
        client.forceRelease("delay/forced", { reason: "wedged" }),
        (e: unknown) => e instanceof Conflict && e.reason === "lock-not-held" && /endDelay/.test(e.message),
      );
      await stillDelayed();
      assert.equal(granted, undefined, "granted during the delay");
      assert.deepEqual(await client.forceRelease("delay/forced", { reason: "the job is gone", endDelay: true }), first);
      const w = await waiting;
      assert.ok(w.token > g.token);
      for (const token of [undefined, g.token]) {
        await assert.rejects(
          client.forceRelease("delay/forced", { token, reason: "again", endDelay: true }),
          (e: unknown) => e instanceof Conflict && e.reason === "no-lock-delay",
        );
      }
      assert.equal((await client.describe("delay/forced")).holder?.token, w.token);
      await assert.rejects(client.forceRelease("delay/forced", { reason: "r", endDelay: "yes" as unknown as boolean }), InvalidArgument);
      await w.release();
    } finally {
      await closeAll([a, b]);
    }
  });

  it("hands a lock over at once on a clean release despite a lock-delay", async () => {
    const [a, b] = await sessions(2);
    try {
      const g = await a.lock("delay/clean", { wait: 0, lockDelayMs: 300_000 });
      const waiting = b.lock("delay/clean", { wait: 60 });
      await waitUntil("the waiter queued", 5000, async () => (await client.describe("delay/clean")).waiters === 1);
      const releasedAt = Date.now();
      await g.release();
      const granted = await waiting;
      // Not after the 300 s delay: a release starts none (bounded far below it).
      assert.ok(Date.now() - releasedAt < 30_000);
      assert.equal((await client.describe("delay/clean")).delayRemainingMs, undefined);
      await granted.release();
    } finally {
      await closeAll([a, b]);
    }
  });

  it("tells a holder it is contended and a waiter its position as the queue drains", async () => {
    // TTL 3 s: renewed each second, so a holder hears of a waiter within about a second.
    const ss = await sessions(3, 3);
    const [a, b, c] = ss;
    const within = <T>(p: Promise<T>, ms: number, what: string): Promise<T> =>
      Promise.race([p, new Promise<T>((_, reject) => setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms).unref())]);
    try {
      const held = await a.lock("contended/q", { wait: 0 });
      assert.equal(held.isContended(), false);
      const bPositions: number[] = [];
      const cPositions: number[] = [];
      const bWaits = b.lock("contended/q", { wait: 60, onPosition: (p) => bPositions.push(p) });
      bWaits.catch(() => undefined); // a failure below closes the sessions: not this test's error
      await waitUntil("b queued", 5000, async () => (await client.describe("contended/q")).waiters === 1);
      await within(held.contended(), 10_000, "the holder was told that b waits");
      assert.equal(held.isContended(), true);
      const cWaits = c.lock("contended/q", { wait: 60, onPosition: (p) => cPositions.push(p) });
      cWaits.catch(() => undefined);
      // The first long-poll answers PENDING after at most ACQUIRE_POLL_MS_MAX (10 s).
      await waitUntil("c at position 2", 25_000, () => cPositions.includes(2));
      assert.deepEqual([...new Set(bPositions)], [1]);
      await held.release();
      const gb: LockGuard = await bWaits;
      // The queue ahead of c drained by one: 2 -> 1 at its next long-poll answer.
      await waitUntil("c at position 1", 25_000, () => cPositions[cPositions.length - 1] === 1);
      assert.deepEqual(cPositions, [...cPositions].sort((x, y) => y - x));
      await within(gb.contended(), 10_000, "b's guard was told that c waits");
      await gb.release();
      const gc = await cWaits;
      // Nobody waits for c's lock: two renewals later it is still not contended.
      await new Promise((r) => setTimeout(r, 2_500));
      assert.equal(gc.isContended(), false);
      await gc.release();
    } finally {
      await closeAll(ss);
    }
  });

  it("keeps what it knew of the names after a cut contended list", async () => {
    const [s] = await sessions(1);
    try {
      const g = await s.lock("contended/cut", { wait: 0 });
      const gs = g.groupSession;
      gs.contendedNow(["contended/cut", "y"], false);
      assert.equal(g.isContended(), true);
      // Cut after "a": it says nothing of the names after it, which stay.
      gs.contendedNow(["a"], true);
      assert.deepEqual([...gs.contended].sort(), ["a", "contended/cut", "y"]);
      assert.equal(g.isContended(), true);
      // Cut after "y": "contended/cut", before it and not listed, is not contended.
      gs.contendedNow(["y"], true);
      assert.deepEqual([...gs.contended].sort(), ["y"]);
      assert.equal(g.isContended(), false);
      gs.contendedNow(["z", "contended/cut"], false);
      assert.equal(g.isContended(), true);
      // All of them: only what is listed.
      gs.contendedNow(["z"], false);
      assert.equal(g.isContended(), false);
      await g.release();
    } finally {
      await closeAll([s]);
    }
  });

  it("forgets a released guard's contention, so a later guard of the name is not told of it", async () => {
    // Regression: the session kept a released guard's name among the contended ones, so the next
    // guard of that name was "contended" from the old grant's waiters until a keepalive answer
    // said otherwise. TTL 60: no renewal (every 20 s) comes between the steps.
    const [s] = await sessions(1, 60);
    try {
      const first = await s.lock("contended/forget", { wait: 0 });
      first.groupSession.contendedNow(["contended/forget"], false); // what a keepalive answer would say
      assert.equal(first.isContended(), true);
      await first.release();
      const second = await s.lock("contended/forget", { wait: 0 });
      assert.equal(second.isContended(), false, "a later guard was told of the old grant's waiters");
      assert.equal(second.groupSession.contended.has("contended/forget"), false);
      await second.release();
    } finally {
      await closeAll([s]);
    }
  });

  it("ends a wait for contention when the lock may be lost", async () => {
    const [s] = await sessions(1);
    const g = await s.lock("contended/lost", { wait: 0 });
    const waiting = g.contended();
    await s.close();
    await waiting; // resolves (the test would time out otherwise)
    assert.equal(g.isLost(), true);
  });
});
