// The client against a real `latchkey serve`.
import { after, before, describe, it } from "node:test";
import * as assert from "node:assert/strict";

import { Client, Held, InvalidArgument, LockGuard, now, SessionLost, WaitTimeout } from "latchkey";
import { Server, waitUntil } from "./harness";

describe("client", () => {
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

  it("takes, fences and releases a lock", async () => {
    const guard = await client.lock("round/trip", { ttl: 5, wait: 5 });
    let lostAfterRelease: string | undefined;
    guard.onLost((why) => (lostAfterRelease = why));
    try {
      assert.equal(typeof guard.token, "bigint");
      assert.ok(guard.token > 0n);
      assert.deepEqual(guard.fencingHeaders(), { "latchkey-lock": "round/trip", "latchkey-token": guard.token.toString() });
      const info = await client.describe("round/trip");
      assert.equal(info.holder?.token, guard.token);
      assert.equal(info.holder?.sessionId, guard.session.id);
      // Issue #33: a session says whose it is by default (this process), as the CLI's do.
      assert.equal(info.holder?.owner?.pid, process.pid);
      assert.ok(info.holder?.owner?.host, "a host name");
      assert.equal(guard.isLost(), false);
    } finally {
      await guard.release();
    }
    assert.equal((await client.describe("round/trip")).holder, undefined);
    // The guard's own session was closed with the release.
    assert.equal(guard.session.isLost(), true);
    await new Promise((r) => setImmediate(r));
    assert.equal(lostAfterRelease, undefined, "a release is not a loss");
    assert.equal(guard.signal.aborted, false);
  });

  it("releases at the end of an `await using` scope", async () => {
    let token: bigint;
    {
      await using guard = await client.lock("scoped", { ttl: 5, wait: 5 });
      token = guard.token;
      assert.equal((await client.describe("scoped")).holder?.token, token);
    }
    assert.equal((await client.describe("scoped")).holder, undefined);
  });

  it("grants in FIFO order with increasing tokens", async () => {
    const sessions = await Promise.all([1, 2, 3].map(() => client.session({ ttl: 5 })));
    try {
      const first = await sessions[0].lock("fifo", { wait: 5 });
      const order: number[] = [];
      const waits: Promise<LockGuard>[] = [];
      // Queue the others one at a time, in a known order.
      for (const i of [1, 2]) {
        waits.push(
          sessions[i].lock("fifo", { wait: 20 }).then((g) => {
            order.push(i);
            return g;
          }),
        );
        await waitUntil(`waiter ${i} queued`, 5000, async () => (await client.describe("fifo")).waiters === i);
      }
      const info = await client.describe("fifo");
      assert.deepEqual(info.queue.map((w) => w.sessionId), [sessions[1].id, sessions[2].id]);
      await first.release();
      const second = await waits[0];
      assert.ok(second.token > first.token, `${second.token} > ${first.token}`);
      await second.release();
      const third = await waits[1];
      assert.ok(third.token > second.token, `${third.token} > ${second.token}`);
      await third.release();
      assert.deepEqual(order, [1, 2]);
    } finally {
      await Promise.all(sessions.map((s) => s.close()));
    }
  });

  it("times out a wait and refuses a busy try-lock, naming the holder", async () => {
    const holder = await client.lock("busy", { ttl: 5, wait: 5 });
    try {
      const started = performance.now();
      await assert.rejects(client.lock("busy", { ttl: 5, wait: 0.5 }), (e) => e instanceof WaitTimeout && !(e instanceof Held));
      assert.ok(performance.now() - started >= 450, "waited about the timeout");
      await assert.rejects(client.lock("busy", { ttl: 5, wait: 0 }), (e) => {
        assert.ok(e instanceof Held && e instanceof WaitTimeout);
        assert.equal(e.holder.token, holder.token);
        return true;
      });
      // The timed-out waiter left the queue.
      assert.equal((await client.describe("busy")).waiters, 0);
      const session = await client.session({ ttl: 5 });
      assert.equal(await session.tryLock("busy"), null);
      await session.close();
    } finally {
      await holder.release();
    }
  });

  it("releases a grant that comes after its wait was abandoned", async () => {
    const holder = await client.lock("late", { ttl: 5, wait: 5 });
    const session = await client.session({ ttl: 5 });
    try {
      const abandon = new AbortController();
      const wait = session.lock("late", { wait: 30, signal: abandon.signal });
      await waitUntil("the waiter queued", 5000, async () => (await client.describe("late")).waiters === 1);
      abandon.abort(new Error("not needed any more"));
      await assert.rejects(wait, /not needed any more/);
      // The server still has the waiter: the release hands it the lock, which nobody wants.
      assert.equal((await client.describe("late")).waiters, 1);
      await holder.release();
      await waitUntil("the late grant released", 10_000, async () => (await client.describe("late")).holder === undefined);
      // The session is still good for other locks.
      const again = await session.lock("late", { wait: 5 });
      await again.release();
    } finally {
      await session.close();
    }
  });

  it("rejects bad input before sending it", async () => {
    await assert.rejects(client.lock("", { ttl: 5 }), InvalidArgument);
    await assert.rejects(client.lock("x".repeat(513), { ttl: 5 }), InvalidArgument);
    await assert.rejects(client.lock("bad\nname", { ttl: 5 }), InvalidArgument);
    await assert.rejects(client.session({ ttl: 0.5 }), InvalidArgument);
    await assert.rejects(client.session({ ttl: 3601 }), InvalidArgument);
    assert.throws(() => new Client([]), InvalidArgument);
    assert.throws(() => new Client(["no port"]), InvalidArgument);
  });

  it("signals lost when the server is paused past the deadline", async () => {
    const ttlMs = 2000;
    const session = await client.session({ ttl: ttlMs / 1000 });
    const guard = await session.lock("paused", { wait: 5 });
    const callback = new Promise<string>((resolve) => guard.onLost(resolve));
    const deadline = session.deadline;
    server.pause();
    try {
      const why = await guard.lost;
      const firedAt = now();
      assert.match(why, /no renewal was acknowledged/);
      // Not before the deadline (the send time of the last acknowledged renewal + TTL -
      // margin), and before the server's own expiry (a TTL after it last heard of us).
      assert.ok(firedAt >= deadline - 1, `fired ${deadline - firedAt} ms before the deadline`);
      assert.ok(firedAt < deadline + session.safetyMarginMs, "fired within the margin");
      assert.ok(guard.signal.aborted);
      assert.ok(guard.signal.reason instanceof SessionLost);
      assert.equal(await callback, why);
      assert.equal(guard.isLost(), true);
      // Releasing a lost lock answers at once, without a server.
      const started = performance.now();
      await assert.rejects(guard.release(), SessionLost);
      assert.ok(performance.now() - started < 100);
      await assert.rejects(session.lock("other", { wait: 0 }), SessionLost);
    } finally {
      server.resume();
    }
    await session.close();
    // The server expires the session on its own clock: the lock becomes free.
    await waitUntil("the server freed the lock", 10_000, async () => (await client.describe("paused")).holder === undefined);
  });
});
