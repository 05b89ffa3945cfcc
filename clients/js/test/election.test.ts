// Leader election (issue #32, docs/primitives.md) against real `latchkey serve` processes:
// campaign, proclaim, resign, leader and observe.
import { after, before, describe, it } from "node:test";
import * as assert from "node:assert/strict";

import { Client, Conflict, Held, InvalidArgument, Leadership, limits, LockGuard, NotElectionLeader, NotHeld, Observe } from "latchkey";
import { Cluster, Server, waitUntil } from "./harness";

function text(b: Buffer | undefined): string | undefined {
  return b?.toString("utf8");
}

describe("leader election", () => {
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

  it("leads, proclaims, resigns, and the next candidate leads with a higher token", async () => {
    const a = await client.session({ ttl: 10 });
    const b = await client.session({ ttl: 10 });
    try {
      assert.equal(await client.leader("svc/leader"), undefined);
      const first = await a.campaign("svc/leader", "10.0.0.1:80", { wait: 0 });
      assert.ok(first instanceof Leadership && first instanceof LockGuard);
      assert.equal(text(first.value), "10.0.0.1:80");
      let leader = await client.leader("svc/leader");
      assert.equal(leader?.sessionId, a.id);
      assert.equal(leader?.token, first.token);
      assert.equal(text(leader?.value), "10.0.0.1:80");
      assert.ok(leader?.heldForMs !== undefined && leader.heldForMs >= 0);
      await assert.rejects(b.campaign("svc/leader", "10.0.0.2:80", { wait: 0 }), Held);
      const waiting = b.campaign("svc/leader", Buffer.from("10.0.0.2:80"), { wait: 20 });
      await waitUntil("the second candidate queued", 10_000, async () => (await client.describe("svc/leader")).waiters === 1);
      await first.proclaim("10.0.0.1:8080");
      assert.equal(text(first.value), "10.0.0.1:8080");
      leader = await client.leader("svc/leader");
      assert.equal(leader?.token, first.token);
      assert.equal(text(leader?.value), "10.0.0.1:8080");
      await first.resign();
      const second = await waiting;
      assert.ok(second.token > first.token);
      leader = await client.leader("svc/leader");
      assert.equal(leader?.sessionId, b.id);
      assert.equal(leader?.token, second.token);
      assert.equal(text(leader?.value), "10.0.0.2:80");
      await assert.rejects(first.proclaim("stale"), NotElectionLeader);
      await second.resign();
      assert.equal(await client.leader("svc/leader"), undefined);
    } finally {
      await a.close();
      await b.close();
    }
  });

  it("answers a proclaim after a force-release with NotElectionLeader and changes nothing", async () => {
    const leadership = await client.campaign("svc/forced", "mine", { ttl: 10 });
    try {
      await client.forceRelease("svc/forced", { reason: "test: end the term" });
      const e = await leadership.proclaim("still mine?").then(
        () => undefined,
        (err: unknown) => err,
      );
      assert.ok(e instanceof NotElectionLeader && e instanceof Conflict, String(e));
      assert.equal(e.reason, "not-election-leader");
      assert.equal(await client.leader("svc/forced"), undefined);
      await waitUntil("the leadership reports lost", 10_000, () => leadership.isLost());
      await assert.rejects(leadership.resign(), NotHeld);
    } finally {
      await leadership.session.close().catch(() => undefined);
    }
  });

  it("refuses bad values before any call", async () => {
    const s = await client.session({ ttl: 10 });
    try {
      await assert.rejects(s.campaign("svc/big", Buffer.alloc(limits.ELECTION_VALUE_BYTES_MAX + 1)), InvalidArgument);
      await assert.rejects(s.campaign("svc/big", 42 as unknown as string), InvalidArgument);
      assert.equal((await client.describe("svc/big")).holder, undefined);
      const l = await s.campaign("svc/big", Buffer.alloc(limits.ELECTION_VALUE_BYTES_MAX, 0x78), { wait: 0 });
      await assert.rejects(l.proclaim(Buffer.alloc(limits.ELECTION_VALUE_BYTES_MAX + 1)), InvalidArgument);
      assert.equal((await client.leader("svc/big"))?.value.length, limits.ELECTION_VALUE_BYTES_MAX);
      await l.resign();
      // A plain lock of the name leads with an empty value; a reader is no leader.
      const g = await s.lock("svc/big", { wait: 0 });
      const leader = await client.leader("svc/big");
      assert.equal(leader?.token, g.token);
      assert.equal(leader?.value.length, 0);
      await g.release();
      const r = await s.lockShared("svc/big", { wait: 0 });
      assert.equal(await client.leader("svc/big"), undefined);
      await r.release();
    } finally {
      await s.close();
    }
  });

  it("observes each leader and value once, in order", async () => {
    const a = await client.session({ ttl: 10 });
    const b = await client.session({ ttl: 10 });
    const observe = await (async () => {
      const first = await a.campaign("svc/obs", "a1");
      const o = await client.observe("svc/obs");
      return { o, first };
    })();
    const { o, first } = observe;
    try {
      let seen = await o.next();
      assert.equal(seen.done, false);
      assert.deepEqual([seen.value.sessionId, seen.value.token, text(seen.value.value)], [a.id, first.token, "a1"]);
      const waiting = b.campaign("svc/obs", "b1", { wait: 20 });
      await waitUntil("b queued", 10_000, async () => (await client.describe("svc/obs")).waiters === 1);
      await first.proclaim("a2");
      await first.proclaim("a2"); // the same value again: not news
      await first.proclaim("a3");
      await first.resign();
      const second = await waiting;
      const got = [];
      for (let i = 0; i < 3; i++) {
        const r = await o.next();
        assert.equal(r.done, false);
        got.push([r.value.sessionId, r.value.token, text(r.value.value)]);
      }
      assert.deepEqual(got, [
        [a.id, first.token, "a2"],
        [a.id, first.token, "a3"],
        [b.id, second.token, "b1"],
      ]);
      await second.resign();
      const third = await a.campaign("svc/obs", "a4", { wait: 0 });
      seen = await o.next();
      assert.deepEqual([seen.value.sessionId, seen.value.token, text(seen.value.value)], [a.id, third.token, "a4"]);
      await third.resign();
      // close() ends a pending next() and the iteration.
      const pending = o.next();
      o.close();
      assert.equal((await pending).done, true);
      const rest = [];
      for await (const l of o) rest.push(l);
      assert.deepEqual(rest, []);
    } finally {
      o.close();
      await a.close();
      await b.close();
    }
  });

  it("waits for the first leader of a name nobody leads (and not another name's)", async () => {
    const o: Observe = await client.observe("svc/empty");
    try {
      const next = o.next();
      const other = await client.campaign("svc/empty/other", "not this one", { ttl: 10 });
      const leadership = await client.campaign("svc/empty", "first", { ttl: 10 });
      const seen = await next;
      assert.equal(seen.done, false);
      assert.equal(seen.value?.token, leadership.token);
      assert.equal(text(seen.value?.value), "first");
      await leadership.resign();
      await other.resign();
    } finally {
      o.close();
    }
  });
});

describe("leader election across a member failure", () => {
  let cluster: Cluster;
  before(async () => {
    cluster = await Cluster.start(3);
  });
  after(async () => {
    await cluster?.stop();
  });

  it("resumes an observe on another member when its member dies", async () => {
    const client = new Client(cluster.endpoints());
    const candidate = new Client(cluster.endpoints());
    try {
      await cluster.leader(10_000);
      const s = await candidate.session({ ttl: 15 });
      const first = await s.campaign("svc/failover", "before");
      const o = await client.observe("svc/failover");
      assert.equal(text((await o.next()).value?.value), "before");
      const watched = (o.watch as unknown as { target: string }).target;
      const victim = cluster.members.find((m) => m.addr === watched);
      assert.ok(victim, `the watch is on ${watched}`);
      await cluster.kill(victim.id);
      await cluster.leader(20_000);
      await first.proclaim("after");
      const seen = await o.next();
      assert.equal(seen.value?.token, first.token);
      assert.equal(text(seen.value?.value), "after");
      assert.notEqual((o.watch as unknown as { target: string }).target, watched);
      o.close();
      await s.close();
    } finally {
      await client.close();
      await candidate.close();
    }
  });
});
