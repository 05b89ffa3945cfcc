// Failover: a 3-member cluster loses its leader; a held lock survives, a new lock is granted.
import { after, before, it } from "node:test";
import * as assert from "node:assert/strict";

import { Client } from "latchkey";
import { Cluster, waitUntil } from "./harness";

let cluster: Cluster;
before(async () => {
  cluster = await Cluster.start(3);
});
after(async () => {
  await cluster?.stop();
});

it("keeps a held lock and grants a new one after the leader is killed", async () => {
  const client = new Client(cluster.endpoints());
  try {
    const session = await client.session({ ttl: 15 });
    const guard = await session.lock("survivor", { wait: 5 });
    const old = await cluster.leader(5_000);
    await cluster.kill(old.id);
    const failovers = session.failovers;
    // A renewal after the election reaches the new leader (followed hints or the seeds).
    await waitUntil("a renewal after the failover", 20_000, () => session.failovers > failovers);
    assert.equal(guard.isLost(), false, guard.lostReason());
    const info = await client.describe("survivor");
    assert.equal(info.holder?.token, guard.token);
    assert.equal(info.holder?.sessionId, session.id);
    const fresh = await client.lock("fresh", { ttl: 15, wait: 10 });
    assert.ok(fresh.token > guard.token);
    await fresh.release();
    await guard.release();
    assert.equal((await client.describe("survivor")).holder, undefined);
    await session.close();
  } finally {
    await client.close();
  }
});
