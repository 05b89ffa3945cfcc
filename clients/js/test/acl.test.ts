// Access control: the bearer token is sent, allowed calls pass, others are PermissionDenied
// (not retried), a client without a token is refused.
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
