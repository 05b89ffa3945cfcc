// `list` and the admin calls (force-release, revoke, audit) against a real `latchkey serve`:
// what an operator sees, what the holder's client sees, and the input refused before any call.
import { after, before, describe, it } from "node:test";
import * as assert from "node:assert/strict";

import { Client, Conflict, InvalidArgument, limits, NotHeld, SessionLost, SessionNotFound } from "latchkey";
import { Server } from "./harness";

/** Resolves with `p`'s value, or rejects after `ms`. */
function within<T>(ms: number, what: string, p: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout;
  return Promise.race([
    p.finally(() => clearTimeout(timer)),
    new Promise<T>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`not within ${ms} ms: ${what}`)), ms);
    }),
  ]);
}

describe("list and admin calls", () => {
  let server: Server;
  /** The operator's client. */
  let admin: Client;
  /** A second client, the holders'. */
  let holders: Client;
  before(async () => {
    server = await Server.start();
    admin = new Client([server.addr]);
    holders = new Client([server.addr]);
  });
  after(async () => {
    await holders?.close();
    await admin?.close();
    await server?.stop();
  });

  it("lists the held locks under a prefix with holder, token and queue", async () => {
    const s1 = await holders.session({ ttl: 5, owner: { host: "h", pid: 7, user: "u", text: "lister" } });
    const s2 = await holders.session({ ttl: 5 });
    try {
      const b = await s1.lock("list/b", { wait: 5 });
      const a = await s1.lock("list/a", { wait: 5 });
      const other = await s2.lock("other/list", { wait: 5 });
      const waiting = s2.lock("list/a", { wait: 10 });
      // Queued when describe counts it.
      for (let i = 0; (await admin.describe("list/a")).waiters === 0; i++) {
        assert.ok(i < 100, "the waiter queued");
        await new Promise((r) => setTimeout(r, 20));
      }
      const list = await admin.list("list/");
      assert.equal(list.truncated, false);
      assert.deepEqual(
        list.locks.map((l) => l.name),
        ["list/a", "list/b"],
        "held locks of the prefix only, in name order",
      );
      const [la, lb] = list.locks;
      assert.equal(la.holder?.token, a.token);
      assert.equal(typeof la.holder?.token, "bigint");
      assert.equal(la.holder?.sessionId, s1.id);
      assert.equal(la.holder?.owner?.text, "lister");
      assert.equal(lb.holder?.token, b.token);
      assert.equal(la.waiters, 1);
      assert.deepEqual(
        la.queue.map((w) => w.sessionId),
        [s2.id],
      );
      // A limit cuts the answer, and says so.
      const one = await admin.list("list/", { limit: 1 });
      assert.deepEqual(
        one.locks.map((l) => l.name),
        ["list/a"],
      );
      assert.equal(one.truncated, true);
      // The default prefix is every lock.
      const all = (await admin.list()).locks.map((l) => l.name);
      assert.ok(all.includes("other/list") && all.includes("list/a"), all.join(","));
      assert.deepEqual((await admin.list("list/none/")).locks, []);
      await a.release();
      await (await waiting).release();
      await b.release();
      await other.release();
      assert.deepEqual((await admin.list("list/")).locks, []);
    } finally {
      await s1.close();
      await s2.close();
    }
  });

  it("force-releases another client's lock: its guard reports lost, the waiter and then anyone gets it", async () => {
    const holder = await holders.session({ ttl: 3 });
    const waiterSession = await admin.session({ ttl: 5 });
    try {
      const guard = await holder.lock("force/a", { wait: 5 });
      const kept = await holder.lock("force/kept", { wait: 5 });
      const waiting = waiterSession.lock("force/a", { wait: 20 });
      const taken = await admin.forceRelease("force/a", { reason: "INC-42: stuck deploy", operator: "alice@ops" });
      assert.deepEqual(taken, { sessionId: holder.id, token: guard.token });
      // The waiter is granted at once, with a higher token.
      const next = await within(5_000, "the waiter's grant", waiting);
      assert.ok(next.token > guard.token);
      // The holder's client learns it from its next keepalive (every TTL/3 = 1 s).
      const why = await within(5_000, "the holder's guard reports lost", guard.lost);
      assert.match(why, /force-released/);
      assert.ok(guard.signal.reason instanceof NotHeld, String(guard.signal.reason));
      assert.equal(guard.isLost(), true);
      // Only that grant: the session and its other lock live on.
      assert.equal(holder.isLost(), false);
      assert.equal(kept.isLost(), false);
      await assert.rejects(guard.release(), NotHeld);
      await kept.release();
      // The audit log names it, with the reason.
      const record = (await admin.audit()).find((r) => r.action === "force-release" && r.lock === "force/a");
      assert.ok(record, "a force-release record");
      assert.equal(record.sessionId, holder.id);
      assert.equal(record.token, guard.token);
      assert.equal(record.nextToken, next.token);
      assert.equal(record.reason, "INC-42: stuck deploy");
      assert.equal(record.operator, "alice@ops");
      assert.equal(record.identity, undefined, "anonymous without access control");
      assert.equal(typeof record.index, "bigint");
      assert.ok(Math.abs(record.atMs - Date.now()) < 60_000);
      // Force-release without a token reads the holder's: the waiter's grant is taken now, and
      // the lock is free for anyone after it.
      assert.deepEqual(await admin.forceRelease("force/a", { reason: "again" }), { sessionId: waiterSession.id, token: next.token });
      const again = await holders.lock("force/a", { ttl: 3, wait: 0 });
      assert.ok(again.token > next.token);
      await again.release();
      const last = (await admin.audit()).at(-1)!;
      assert.equal(last.reason, "again");
      assert.equal(last.nextToken, undefined, "nobody waited");
    } finally {
      await holder.close();
      await waiterSession.close();
    }
  });

  it("force-release is conditional on the token: a stale one or a free lock is a Conflict", async () => {
    const guard = await holders.lock("force/cond", { ttl: 3, wait: 5 });
    try {
      await assert.rejects(
        admin.forceRelease("force/cond", { token: guard.token + 1000n, reason: "stale" }),
        (e) => e instanceof Conflict && e.reason === "token-mismatch",
      );
      assert.equal((await admin.describe("force/cond")).holder?.token, guard.token, "still held");
    } finally {
      await guard.release();
    }
    await assert.rejects(admin.forceRelease("force/cond", { reason: "free" }), (e) => e instanceof Conflict && e.reason === "lock-not-held");
    await assert.rejects(
      admin.forceRelease("force/cond", { token: guard.token, reason: "free" }),
      (e) => e instanceof Conflict && e.reason === "lock-not-held",
    );
  });

  it("revokes a session: its locks go to their waiters, its client reports it lost", async () => {
    const victim = await holders.session({ ttl: 3 });
    const waiterSession = await admin.session({ ttl: 5 });
    try {
      const g1 = await victim.lock("revoke/a", { wait: 5 });
      const g2 = await victim.lock("revoke/b", { wait: 5 });
      const waiting = waiterSession.lock("revoke/a", { wait: 20 });
      for (let i = 0; (await admin.describe("revoke/a")).waiters === 0; i++) {
        assert.ok(i < 100, "the waiter queued");
        await new Promise((r) => setTimeout(r, 20));
      }
      assert.deepEqual(await admin.revoke(victim.id, { reason: "runaway job" }), { locks: 2 });
      const next = await within(5_000, "the waiter's grant", waiting);
      assert.ok(next.token > g1.token);
      assert.equal((await admin.describe("revoke/b")).holder, undefined);
      await within(5_000, "the revoked session's guards report lost", Promise.all([g1.lost, g2.lost]));
      assert.ok(g2.signal.reason instanceof SessionLost, String(g2.signal.reason));
      assert.equal(victim.isLost(), true);
      await assert.rejects(g2.release(), SessionLost);
      await next.release();
      // Gone: a second revoke (as a retry that went through would) is SessionNotFound.
      await assert.rejects(admin.revoke(victim.id, { reason: "again" }), SessionNotFound);
      const record = (await admin.audit()).find((r) => r.action === "revoke" && r.sessionId === victim.id);
      assert.ok(record, "a revoke record");
      assert.equal(record.locks, 2);
      assert.equal(record.reason, "runaway job");
      assert.equal(record.lock, undefined);
      assert.equal(record.token, undefined);
    } finally {
      await victim.close();
      await waiterSession.close();
    }
  });

  it("takes a reason of exactly the limit", async () => {
    const guard = await holders.lock("force/long", { ttl: 3, wait: 5 });
    try {
      const reason = "é".repeat(limits.AUDIT_REASON_BYTES_MAX / 2); // 2 bytes each
      await admin.forceRelease("force/long", { token: guard.token, reason, operator: "o".repeat(limits.AUDIT_ACTOR_BYTES_MAX) });
      assert.equal((await admin.audit()).at(-1)?.reason, reason);
    } finally {
      await guard.release().catch(() => undefined);
    }
  });

  it("refuses bad input before any call", async () => {
    // Nothing listens on port 1: a call that went out would fail with TransportError.
    const offline = new Client(["127.0.0.1:1"], { retry: { attemptsMax: 1 } });
    const bad = (p: Promise<unknown>, what: RegExp) =>
      assert.rejects(p, (e) => {
        assert.ok(e instanceof InvalidArgument, `${e}`);
        assert.match((e as Error).message, what);
        return true;
      });
    try {
      const reason = "r";
      await bad(offline.forceRelease("", { reason }), /empty/);
      await bad(offline.forceRelease("x".repeat(limits.LOCK_NAME_BYTES_MAX + 1), { reason }), /bytes/);
      await bad(offline.forceRelease("a\nb", { reason }), /control/);
      await bad(offline.forceRelease("a", { reason: "" }), /reason is required/);
      await bad(offline.forceRelease("a", { reason: " \t\u3000" }), /reason is required/);
      await bad(offline.forceRelease("a", {} as { reason: string }), /reason is required/);
      await bad(offline.forceRelease("a", { reason: "é".repeat(limits.AUDIT_REASON_BYTES_MAX / 2 + 1) }), /1026 bytes, more than 1024/);
      await bad(offline.forceRelease("a", { reason, operator: "o".repeat(limits.AUDIT_ACTOR_BYTES_MAX + 1) }), /operator/);
      await bad(offline.forceRelease("a", { reason, token: 0n }), /token/);
      await bad(offline.forceRelease("a", { reason, token: 1n << 64n }), /token/);
      await bad(offline.forceRelease("a", { reason, token: 5 as unknown as bigint }), /bigint/);
      await bad(offline.revoke(-1n, { reason }), /session id/);
      await bad(offline.revoke(7 as unknown as bigint, { reason }), /bigint/);
      await bad(offline.revoke(7n, { reason: "" }), /reason is required/);
      await bad(offline.list("x".repeat(limits.LOCK_NAME_BYTES_MAX + 1)), /prefix/);
      await bad(offline.list("", { limit: 0 }), /limit/);
      await bad(offline.list("", { limit: limits.LIST_RESULTS_MAX + 1 }), /limit/);
    } finally {
      await offline.close();
    }
  });
});
