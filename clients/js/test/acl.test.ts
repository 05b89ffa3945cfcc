// Access control: the bearer token is sent, allowed calls pass, others are PermissionDenied
// (not retried), a client without a token is refused; the admin calls need `admin`.
import { after, before, it } from "node:test";
import * as assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";

import { Client, PermissionDenied } from "latchkey";
import { Server } from "./harness";

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "latchkey-js-acl-"));
const token = randomBytes(24).toString("hex");
const adminToken = randomBytes(24).toString("hex");
let server: Server;

before(async () => {
  const acl = path.join(dir, "acl.toml");
  fs.writeFileSync(
    acl,
    `[roles.deployer]
lock = ["deploy/"]
read = ["deploy/", "probe/"]

[identities.ci]
token_sha256 = "${createHash("sha256").update(token).digest("hex")}"
roles = ["deployer"]

[roles.root]
admin = [""]

[identities.ops]
token_sha256 = "${createHash("sha256").update(adminToken).digest("hex")}"
roles = ["root"]
`,
  );
  server = await Server.start(["--acl", acl], { authToken: token });
});

after(async () => {
  await server?.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

it("sends the bearer token and reports refusals as PermissionDenied", async () => {
  const client = new Client([server.addr], { authToken: token });
  const anonymous = new Client([server.addr]);
  try {
    const guard = await client.lock("deploy/web", { ttl: 5, wait: 5 });
    assert.equal((await client.describe("deploy/web")).holder?.token, guard.token);
    await guard.release();
    const session = await client.session({ ttl: 5 });
    await assert.rejects(session.lock("other/x", { wait: 0 }), (e) => e instanceof PermissionDenied && e.reason === "permission-denied");
    await session.close();
    await assert.rejects(anonymous.describe("deploy/web"), (e) => e instanceof PermissionDenied && e.reason === "unauthenticated");
  } finally {
    await client.close();
    await anonymous.close();
  }
});

it("the admin calls need admin: a non-admin token is PermissionDenied, an admin's is audited under its identity", async () => {
  const deployer = new Client([server.addr], { authToken: token });
  const ops = new Client([server.addr], { authToken: adminToken });
  const denied = (e: unknown) => e instanceof PermissionDenied && e.reason === "permission-denied";
  try {
    const session = await deployer.session({ ttl: 5 });
    const guard = await session.lock("deploy/admin", { wait: 5 });
    // `read` on deploy/ lists it; not every lock.
    assert.deepEqual(
      (await deployer.list("deploy/")).locks.map((l) => [l.name, l.holder?.token]),
      [["deploy/admin", guard.token]],
    );
    await assert.rejects(deployer.list(""), denied);
    await assert.rejects(deployer.forceRelease("deploy/admin", { token: guard.token, reason: "mine" }), denied);
    await assert.rejects(deployer.revoke(session.id, { reason: "mine" }), denied);
    await assert.rejects(deployer.audit(), denied);
    assert.equal((await ops.describe("deploy/admin")).holder?.token, guard.token, "still held");
    // The admin may.
    assert.deepEqual(await ops.forceRelease("deploy/admin", { reason: "INC-7" }), { sessionId: session.id, token: guard.token });
    const record = (await ops.audit()).at(-1)!;
    assert.equal(record.action, "force-release");
    assert.equal(record.identity, "ops");
    assert.equal(record.reason, "INC-7");
    assert.deepEqual(await ops.revoke(session.id, { reason: "INC-7 cleanup" }), { locks: 0 });
    await assert.rejects(guard.release());
  } finally {
    await deployer.close();
    await ops.close();
  }
});
