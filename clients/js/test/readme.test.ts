// The book's "TypeScript / Node" page (docs/client-typescript.md) shows examples/hold-a-lock.mjs
// verbatim; run it.
import { after, before, it } from "node:test";
import * as assert from "node:assert/strict";
import { execFile } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";

import { Server } from "./harness";

const pkg = path.resolve(__dirname, "..");
const example = path.join(pkg, "examples", "hold-a-lock.mjs");
let server: Server;
before(async () => {
  server = await Server.start();
});
after(async () => {
  await server?.stop();
});

it("the book shows the example as it is", (t) => {
  const page = path.resolve(pkg, "..", "..", "docs", "client-typescript.md");
  if (!fs.existsSync(page)) return t.skip("not in a repository checkout");
  assert.ok(fs.readFileSync(page, "utf8").includes(fs.readFileSync(example, "utf8")), "docs/client-typescript.md embeds examples/hold-a-lock.mjs");
});

it("the example holds a fenced lock", async () => {
  const out = await new Promise<string>((resolve, reject) =>
    execFile(process.execPath, [example], { env: { ...process.env, LATCHKEY_ENDPOINT: server.addr }, timeout: 30_000 }, (err, stdout, stderr) =>
      err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout),
    ),
  );
  assert.match(out, /^holding jobs\/nightly-report with token \d+n \{\n?\s*'latchkey-lock': 'jobs\/nightly-report',\s*'latchkey-token': '\d+'\s*\}/);
});
