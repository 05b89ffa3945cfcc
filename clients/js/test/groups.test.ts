// Several Raft groups (`serve --groups G`, docs/protocol.md 2.4): which group a lock belongs to
// (the protocol's test vectors), one logical session with a session per group, routing to each
// group's leader, merged lists, keepalives of several groups in one request per member, a
// loss in one group that is a loss in all, and groups placed on some members only
// (`serve --replicas`), reached through any one of them.
import { after, before, describe, it } from "node:test";
import * as assert from "node:assert/strict";

import { Client, groupOf, groupOfSession, LockGuard, NotHeld, Session, SessionLost, limits, testing } from "latchkey";
import type { AuditRecord } from "latchkey";
import { Cluster, Server, waitUntil } from "./harness";

const { fnv1a64, fmix64, jump, mergeLists, ClientLease } = testing;

it("group_of matches the protocol's test vectors", () => {
  // docs/protocol.md 2.4 and crates/core/src/groups.rs `VECTORS`.
  const vectors: Array<[string, number, number]> = [
    ["", 4, 1],
    ["a", 4, 3],
    ["jobs/nightly", 8, 4],
    ["orders/42", 3, 2],
    ["\u00dcn\u00efc\u00f6d\u00e9", 16, 14],
    ["x", 64, 36],
  ];
  for (const [name, groups, group] of vectors) assert.equal(groupOf(name, groups), group, `${JSON.stringify(name)} of ${groups}`);
  // The steps' published values (groups.rs `the_hash_steps_match_their_published_values`).
  assert.equal(fnv1a64(Buffer.from("")), 0xcbf29ce484222325n);
  assert.equal(fnv1a64(Buffer.from("a")), 0xaf63dc4c8601ec8cn);
  assert.equal(fmix64(0n), 0n);
  assert.equal(jump(12345n, 1), 0);
  assert.equal(jump(0n, 1000), 0);
  for (const name of ["", "a", "x/y/z", "0123456789"]) assert.equal(groupOf(name, 1), 0);
  assert.equal(groupOfSession(3n * 5n + 4n, 5), 4);
  assert.throws(() => groupOf("a", 0));
  assert.throws(() => groupOf("a", limits.GROUPS_MAX + 1));
});

it("group_of spreads names evenly and growing the count moves names only to the new group", () => {
  for (const groups of [2, 3, 8]) {
    const counts = new Array<number>(groups).fill(0);
    const n = 6_000;
    for (let i = 0; i < n; i++) counts[groupOf(`lock-${i}`, groups)]++;
    for (const c of counts) assert.ok(Math.abs(c - n / groups) / (n / groups) < 0.15, `${groups}: ${counts}`);
  }
  let moved = 0;
  for (let i = 0; i < 4_000; i++) {
    const [before, afterwards] = [groupOf(`n${i}`, 4), groupOf(`n${i}`, 5)];
    if (before !== afterwards) {
      assert.equal(afterwards, 4, `n${i}`);
      moved++;
    }
  }
  assert.ok(moved > 600 && moved < 1_000, `${moved} of 4000 moved`);
});

it("group sessions renew on one grid", () => {
  // crates/client/src/session.rs `group_sessions_renew_on_one_grid`.
  const t0 = 1_000;
  const ttl = 15_000;
  assert.equal(new ClientLease(t0, ttl, t0).nextRenewal(), t0 + 5_000);
  // Made 2.3 s later: renewed at the grid's 5 s, not at 7.3 s.
  const late = new ClientLease(t0 + 2_300, ttl, t0);
  assert.equal(late.nextRenewal(), t0 + 5_000);
  late.acknowledged(t0 + 5_003, ttl);
  assert.equal(late.nextRenewal(), t0 + 10_000);
  assert.equal(new ClientLease(t0 + 5_000, ttl, t0).nextRenewal(), t0 + 10_000);
  for (const offset of [0, 1, 999, 2_500, 4_999, 5_000, 5_001, 12_345]) {
    const next = new ClientLease(t0 + offset, ttl, t0).nextRenewal();
    assert.ok(next > t0 + offset && next <= t0 + offset + 5_000, `${offset}`);
  }
  // Without a grid (one group): the regular schedule.
  assert.equal(new ClientLease(t0 + 2_300, ttl).nextRenewal(), t0 + 7_300);
});

it("merged lists are in name order and stop where a truncated group's answer stops", () => {
  const wire = (names: string[], truncated = false) => ({
    locks: names.map((name) => ({ name, held: true, session: "1", token: "1", held_for_ms: "0", waiters: 0, queue: [] })),
    truncated,
  });
  const names = (l: { locks: Array<{ name: string }> }) => l.locks.map((x) => x.name);
  const whole = mergeLists([wire(["b", "d"]), wire(["a", "c"])], 10);
  assert.deepEqual(names(whole), ["a", "b", "c", "d"]);
  assert.equal(whole.truncated, false);
  // Group 1 stopped at "c": its names after it may exist, so the merged list stops there too.
  const cut = mergeLists([wire(["a", "d", "e"]), wire(["b", "c"], true)], 10);
  assert.deepEqual(names(cut), ["a", "b", "c"]);
  assert.equal(cut.truncated, true);
  // At most `max` in all.
  const capped = mergeLists([wire(["a", "c"]), wire(["b", "d"])], 3);
  assert.deepEqual(names(capped), ["a", "b", "c"]);
  assert.equal(capped.truncated, true);
  // The server's order is UTF-8 bytes: U+FF5E sorts before U+1F600 there, after it in UTF-16.
  assert.deepEqual(names(mergeLists([wire(["\u{1F600}"]), wire(["\uFF5E"])], 10)), ["\uFF5E", "\u{1F600}"]);
});

/** One lock name of each of `groups` groups, found by counting. */
function namesByGroup(prefix: string, groups: number): string[] {
  const names: string[] = [];
  for (let i = 0; names.filter(Boolean).length < groups && i < 10_000; i++) {
    const name = `${prefix}${i}`;
    const g = groupOf(name, groups);
    if (names[g] === undefined) names[g] = name;
  }
  assert.equal(names.filter(Boolean).length, groups, "a name of every group");
  return names;
}

/** Takes every lock of `names` in `session` `rounds` times (release between), checking tokens strictly increase per lock. */
async function tokensIncrease(client: Client, session: Session, names: string[], rounds: number): Promise<void> {
  const last = new Map<string, bigint>();
  for (let r = 0; r < rounds; r++) {
    for (const name of names) {
      const guard = await session.lock(name, { wait: 10 });
      const before = last.get(name);
      if (before !== undefined) assert.ok(guard.token > before, `${name}: ${guard.token} after ${before}`);
      last.set(name, guard.token);
      const info = await client.describe(name);
      assert.equal(info.holder?.sessionId, guard.sessionId, name);
      assert.equal(info.holder?.token, guard.token, name);
      await guard.release();
    }
  }
}

describe("one member, three groups", () => {
  const GROUPS = 3;
  let server: Server;
  let client: Client;
  before(async () => {
    server = await Server.start([], {}, { groups: GROUPS, metrics: true });
    client = new Client([server.addr]);
  });
  after(async () => {
    await client?.close();
    await server?.stop();
  });

  it("takes locks in every group with a session per group and increasing tokens", async () => {
    const session = await client.session({ ttl: 5 });
    try {
      assert.equal(await client.groups(), GROUPS);
      assert.equal(groupOfSession(session.id, GROUPS), 0, "the logical session's id is group 0's");
      const names = namesByGroup("every/", GROUPS);
      await tokensIncrease(client, session, names, 3);
      // One session per group, each in its group, made once.
      const made = session.groupSessionIds;
      assert.deepEqual(
        made.map((s) => s.group),
        [0, 1, 2],
      );
      for (const s of made) assert.equal(groupOfSession(s.sessionId, GROUPS), s.group);
      for (const name of names) assert.equal(groupOfSession(await session.sessionIdFor(name), GROUPS), groupOf(name, GROUPS));
      // Exactly once per group: a re-sent Acquire answers the same grant.
      const [a, b] = await testing.acquireTwiceWithSameSeq(session, names[2]);
      assert.ok(a > 0n && a === b);
      // The member's view of each group: it leads all three, each log past that grant's index
      // in group 2.
      const status = await client.nodeStatus();
      assert.deepEqual(status.groupStatus.map((g) => [g.group, g.role]), [[0, "leader"], [1, "leader"], [2, "leader"]]);
      assert.ok(status.groupStatus[2].lastLogIndex >= a && status.groupStatus[2].appliedIndex >= a, "group 2's indexes");
    } finally {
      await session.close();
    }
    // The close reached every group: nothing is held.
    assert.deepEqual((await client.list("every/")).locks, []);
  });

  it("a lock of its own session (Client.lock) in any group", async () => {
    for (const name of namesByGroup("own/", GROUPS)) {
      const guard = await client.lock(name, { ttl: 3, wait: 5 });
      assert.equal((await client.describe(name)).holder?.sessionId, guard.sessionId);
      await guard.release();
      assert.equal((await client.describe(name)).holder, undefined);
    }
  });

  it("lists every group, merged in name order", async () => {
    const session = await client.session({ ttl: 5 });
    const guards: LockGuard[] = [];
    try {
      const names = Array.from({ length: 12 }, (_, i) => `merged/${String(i).padStart(2, "0")}`);
      assert.ok(new Set(names.map((n) => groupOf(n, GROUPS))).size === GROUPS, "names of every group");
      for (const name of [...names].reverse()) guards.push(await session.lock(name, { wait: 5 }));
      // A fresh client, which does not know the group count: it learns it from the refusal.
      const fresh = new Client([server.addr]);
      try {
        const listed = await fresh.list("merged/");
        assert.deepEqual(
          listed.locks.map((l) => l.name),
          names,
        );
        assert.equal(listed.truncated, false);
        for (const l of listed.locks) {
          assert.equal(l.holder?.sessionId, guards.find((g) => g.name === l.name)!.sessionId, l.name);
        }
        const limited = await fresh.list("merged/", { limit: 5 });
        assert.deepEqual(
          limited.locks.map((l) => l.name),
          names.slice(0, 5),
        );
        assert.equal(limited.truncated, true);
      } finally {
        await fresh.close();
      }
    } finally {
      await session.close();
    }
  });

  it("renews the sessions of every group in one KeepAlive request per member", async () => {
    const session = await client.session({ ttl: 1.5 });
    try {
      for (const name of namesByGroup("renew/", GROUPS)) await session.lock(name, { wait: 5 });
      assert.equal(session.groupSessionIds.length, GROUPS);
      const requests = await server.metric("latchkey_requests_total", 'method="keep_alive"');
      const renewed = await server.metric("latchkey_keepalive_sessions_total");
      // A renewal every 500 ms: some five rounds.
      await new Promise((r) => setTimeout(r, 2_600));
      assert.equal(session.isLost(), false, session.lostReason);
      const rounds = (await server.metric("latchkey_requests_total", 'method="keep_alive"')) - requests;
      const sessions = (await server.metric("latchkey_keepalive_sessions_total")) - renewed;
      assert.ok(rounds >= 3, `${rounds} keepalive requests`);
      // One request per renewal round carries all three group sessions (one request per group
      // would make this 1). A round split by a late timer may carry fewer.
      assert.ok(sessions / rounds >= 2.5, `${sessions} sessions in ${rounds} requests`);
    } finally {
      await session.close();
    }
  });

  it("a group session revoked makes the logical session lost in every group", async () => {
    const session = await client.session({ ttl: 5 });
    const names = namesByGroup("revoked/", GROUPS);
    const guards = await Promise.all(names.map((n) => session.lock(n, { wait: 5 })));
    const lost = guards.map((g) => g.lost);
    // Revoke the session of group 2 only (an operator, with another client).
    const admin = new Client([server.addr]);
    try {
      const victim = guards[2].sessionId;
      assert.notEqual(victim, session.id);
      assert.deepEqual(await admin.revoke(victim, { reason: "test: one group's session" }), { locks: 1 });
      // The next renewal (within a third of the TTL) finds it gone: every guard reports lost.
      const all = Promise.all(lost);
      const timeout = new Promise<never>((_, reject) => setTimeout(() => reject(new Error("not lost within 4 s")), 4_000));
      await Promise.race([all, timeout]);
      for (const g of guards) {
        assert.equal(g.isLost(), true, g.name);
        assert.ok(g.signal.reason instanceof SessionLost, g.name);
      }
      assert.equal(session.isLost(), true);
      await assert.rejects(session.lock("revoked/after", { wait: 0 }), SessionLost);
      // The client closed the other groups' sessions: their locks are free at once, not at
      // their leases' end.
      await waitUntil("the other groups' locks freed", 3_000, async () => (await admin.list("revoked/")).locks.length === 0);
      await assert.rejects(guards[0].release(), SessionLost);
    } finally {
      await admin.close();
      await session.close();
    }
  });

  it("force-releases and audits in every group", async () => {
    const session = await client.session({ ttl: 5 });
    try {
      const names = namesByGroup("audited/", GROUPS);
      const guards = await Promise.all(names.map((n) => session.lock(n, { wait: 5 })));
      const admin = new Client([server.addr]);
      try {
        for (const g of guards) {
          assert.deepEqual(await admin.forceRelease(g.name, { reason: "test" }), { sessionId: g.sessionId, token: g.token });
        }
        const audit: AuditRecord[] = await admin.audit();
        const records = audit.filter((r) => r.action === "force-release" && r.lock?.startsWith("audited/"));
        assert.deepEqual(records.map((r) => r.lock).sort(), [...names].sort());
        for (const r of records) assert.equal(r.group, groupOf(r.lock!, GROUPS));
        // Each holder learns it from its own group session's keepalive.
        await waitUntil("every guard taken", 5_000, () => guards.every((g) => g.isLost()));
        for (const g of guards) await assert.rejects(g.release(), NotHeld);
        assert.equal(session.isLost(), false, "a force-release is not the session's loss");
      } finally {
        await admin.close();
      }
    } finally {
      await session.close();
    }
  });
});

describe("three members, three groups", () => {
  const GROUPS = 3;
  let cluster: Cluster;
  before(async () => {
    cluster = await Cluster.start(3, { groups: GROUPS, metrics: true });
  });
  after(async () => {
    await cluster?.stop();
  });

  it("takes locks in every group at its leader, lists them all, renews one request per leading member", async () => {
    const leaders = await cluster.groupLeaders(10_000);
    const client = new Client(cluster.endpoints());
    try {
      const session = await client.session({ ttl: 2 });
      const names = namesByGroup("cluster/", GROUPS);
      await tokensIncrease(client, session, names, 2);
      const guards = await Promise.all(names.map((n) => session.lock(n, { wait: 5 })));
      assert.deepEqual(
        (await client.list("cluster/")).locks.map((l) => l.name),
        [...names].sort(),
      );
      const requests = await cluster.metric("latchkey_requests_total", 'method="keep_alive"');
      // Renewals every 667 ms: some four rounds, one request to each member that leads a group.
      await new Promise((r) => setTimeout(r, 2_800));
      for (const g of guards) assert.equal(g.isLost(), false, g.lostReason());
      const rounds = (await cluster.metric("latchkey_requests_total", 'method="keep_alive"')) - requests;
      const members = new Set(leaders.map((l) => l.id)).size;
      // Per round: one request per leading member (not one per group when a member leads several).
      assert.ok(rounds >= 3 * members && rounds <= 6 * members + 2, `${rounds} requests, ${members} leading members`);
      for (const g of guards) await g.release();
      await session.close();
    } finally {
      await client.close();
    }
  });

  it("keeps its locks in every group when a group leader is killed", async () => {
    const client = new Client(cluster.endpoints());
    try {
      const session = await client.session({ ttl: 6 });
      const names = namesByGroup("survive/", GROUPS);
      const guards = await Promise.all(names.map((n) => session.lock(n, { wait: 5 })));
      const leaders = await cluster.groupLeaders(10_000);
      await cluster.kill(leaders[0].id);
      const failovers = session.failovers;
      await waitUntil("a renewal after the failover", 20_000, () => session.failovers > failovers);
      // Every group session renewed past the old deadlines.
      const start = Date.now();
      await waitUntil("two more renewal rounds", 10_000, () => Date.now() - start > 4_500);
      for (const g of guards) {
        assert.equal(g.isLost(), false, g.lostReason());
        const info = await client.describe(g.name);
        assert.equal(info.holder?.token, g.token, g.name);
      }
      const fresh = await session.lock(`${names[0]}/fresh`, { wait: 10 });
      await fresh.release();
      for (const g of guards) await g.release();
      await session.close();
    } finally {
      await client.close();
    }
  });
});

describe("four members, four groups of three replicas", () => {
  const GROUPS = 4;
  // `serve --replicas 3`: group g on the (g mod 4)-th member by id and the next two, wrapping.
  const PLACEMENT = [
    [1, 2, 3],
    [2, 3, 4],
    [3, 4, 1],
    [4, 1, 2],
  ];
  let cluster: Cluster;
  before(async () => {
    cluster = await Cluster.start(4, { groups: GROUPS, replicas: 3, metrics: true });
  });
  after(async () => {
    await cluster?.stop();
  });

  it("a client given only member 1, outside group 1, holds and renews a lock in every group", async () => {
    // Every member runs every group, `outside` those it is not placed in (a replica is
    // one too until its group's founder has reached it).
    await waitUntil("every member runs the placement", 10_000, async () => {
      for (const m of cluster.members) {
        const c = new Client([m.addr], { rpcTimeoutMs: 1000, retry: { attemptsMax: 1 } });
        try {
          const status = await c.nodeStatus();
          if (status.groupStatus.some((g) => (g.role === "outside") === PLACEMENT[g.group].includes(m.id))) return false;
        } finally {
          await c.close();
        }
      }
      return true;
    });
    const leaders = await cluster.groupLeaders(10_000);
    const first = cluster.members[0].addr;
    const client = new Client([first]);
    try {
      const session = await client.session({ ttl: 3 });
      const guards: LockGuard[] = [];
      for (const name of namesByGroup("replicas/", GROUPS)) guards.push(await session.lock(name, { wait: 5 }));
      assert.deepEqual(
        guards.map((g) => groupOfSession(g.sessionId, GROUPS)),
        [0, 1, 2, 3],
      );
      for (const g of guards) {
        const info = await client.describe(g.name);
        assert.equal(info.holder?.sessionId, g.sessionId, g.name);
        assert.equal(info.holder?.token, g.token, g.name);
      }
      assert.deepEqual(
        (await client.list("replicas/")).locks.map((l) => [l.name, l.holder?.token]),
        guards.map((g) => [g.name, g.token]).sort(([a], [b]) => (a < b ? -1 : 1)),
      );
      // Each group's requests go to its leader, group 1's too, found through the hints.
      assert.deepEqual(
        [0, 1, 2, 3].map((g) => client.pick(g)),
        leaders.map((l) => l.addr),
      );
      const requests = await cluster.metric("latchkey_requests_total", 'method="keep_alive"');
      // Renewals every second: two rounds at least, each a request to every member (each
      // leads one group).
      await new Promise((r) => setTimeout(r, 2_300));
      for (const g of guards) assert.equal(g.isLost(), false, g.lostReason());
      assert.equal(session.isLost(), false, session.lostReason);
      const sent = (await cluster.metric("latchkey_requests_total", 'method="keep_alive"')) - requests;
      assert.ok(sent >= 2 * 4, `${sent} keepalive requests`);

      // Each KeepAlive a member answered: (member, groups of its sessions, groups refused).
      const answered: Array<{ member: string; groups: number[]; refused: number[] }> = [];
      const call = client.call.bind(client);
      client.call = async <T>(method: string, request: unknown, opts: Parameters<Client["call"]>[2]) => {
        const out = await call<T>(method, request, opts);
        if (method === "KeepAlive") {
          const sessions = (request as { sessions: Array<{ id: string }> }).sessions;
          const refused = (out.response as { refused?: Array<{ group: number }> }).refused ?? [];
          answered.push({
            member: out.endpoint,
            groups: [...new Set(sessions.map((s) => groupOfSession(BigInt(s.id), GROUPS)))].sort((a, b) => a - b),
            refused: refused.map((r) => Number(r.group)).sort((a, b) => a - b),
          });
        }
        return out;
      };
      // Misrouted just after a renewal round, so that the next one carries every group's
      // sessions at once: the client believes member 1 leads every group, group 1 too. Member 1
      // renews the sessions of the groups it leads and refuses the others', group 1's with a
      // hint to one of its replicas, rather than failing the request as a whole (which would
      // leave every group unrenewed); the client renews them where the hints lead. The route
      // map is private: no public call puts a group's route on a member that does not lead it.
      await waitUntil("a renewal round", 3_000, () => new Set(answered.flatMap((k) => k.groups)).size === GROUPS);
      answered.length = 0;
      const route = (client as unknown as { route: { leaders: Map<number, string> } }).route;
      for (let g = 0; g < GROUPS; g++) route.leaders.set(g, first);
      const renewedAtItsLeader = (g: number) => (k: (typeof answered)[number]) => k.member === leaders[g].addr && k.groups.includes(g) && !k.refused.includes(g);
      await waitUntil("every group renewed at its leader after the misroute", 4_000, () => [0, 1, 2, 3].every((g) => answered.some(renewedAtItsLeader(g))));
      const misrouted = answered.find((k) => k.member === first && k.groups.includes(1));
      assert.ok(misrouted !== undefined && misrouted.groups.length > 1 && misrouted.refused.includes(1), JSON.stringify(answered));
      assert.deepEqual(
        misrouted.refused,
        misrouted.groups.filter((g) => leaders[g].addr !== first),
        JSON.stringify(answered),
      );
      // Group 1's route followed the hints to its leader (one of its replicas, not member 1).
      assert.deepEqual(
        [0, 1, 2, 3].map((g) => client.pick(g)),
        leaders.map((l) => l.addr),
      );
      answered.length = 0;
      await new Promise((r) => setTimeout(r, 2_300));
      for (const g of guards) assert.equal(g.isLost(), false, g.lostReason());
      assert.equal(session.isLost(), false, session.lostReason);
      for (let g = 0; g < GROUPS; g++) assert.ok(answered.filter(renewedAtItsLeader(g)).length >= 2, `group ${g}: ${JSON.stringify(answered)}`);

      for (const g of guards) {
        assert.equal((await client.describe(g.name)).holder?.token, g.token, g.name);
        await g.release();
      }
      assert.deepEqual((await client.list("replicas/")).locks, []);
      await session.close();
    } finally {
      await client.close();
    }
  });
});
