// TLS: a client with the CA (and a client certificate, for a server that requires one) holds a
// lock over `https://`; a client without the CA is refused before dialing.
import { after, before, it } from "node:test";
import * as assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";

import { Client, InvalidArgument, TlsError } from "latchkey";
import { Server } from "./harness";

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "latchkey-js-tls-"));
const file = (name: string) => path.join(dir, name);
let server: Server;

function openssl(...args: string[]): void {
  execFileSync("openssl", args, { cwd: dir, stdio: ["ignore", "ignore", "pipe"] });
}

before(async () => {
  // As in the book's "TLS" section (docs/securing.md): a CA, then a member and a client certificate.
  openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
    "-subj", "/CN=latchkey CA", "-keyout", "ca.key", "-out", "ca.pem",
    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign");
  openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
    "-subj", "/CN=another CA", "-keyout", "other.key", "-out", "other.pem",
    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign");
  for (const name of ["member-1", "client"]) {
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", `/CN=${name}`,
      "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", `${name}.key`, "-out", `${name}.csr`);
    openssl("x509", "-req", "-in", `${name}.csr`, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
      "-days", "1", "-copy_extensions", "copy", "-out", `${name}.pem`);
  }
  const tls = { ca: fs.readFileSync(file("ca.pem")), cert: fs.readFileSync(file("client.pem")), key: fs.readFileSync(file("client.key")) };
  server = await Server.start(
    ["--tls-cert", file("member-1.pem"), "--tls-key", file("member-1.key"), "--tls-ca", file("ca.pem")],
    { tls },
  );
});

after(async () => {
  await server?.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

it("holds a lock over mutual TLS", async () => {
  const client = new Client([server.endpoint], {
    tls: { ca: fs.readFileSync(file("ca.pem")), cert: fs.readFileSync(file("client.pem")), key: fs.readFileSync(file("client.key")) },
  });
  try {
    const guard = await client.lock("tls/lock", { ttl: 5, wait: 5 });
    assert.equal((await client.describe("tls/lock")).holder?.token, guard.token);
    await guard.release();
  } finally {
    await client.close();
  }
});

it("refuses an https endpoint without a CA", () => {
  assert.throws(() => new Client([server.endpoint]), InvalidArgument);
});

it("names a protocol or certificate mismatch at once, without retrying", async () => {
  const ca = fs.readFileSync(file("ca.pem"));
  const cases: Array<[string, string, ConstructorParameters<typeof Client>[1], RegExp]> = [
    ["plaintext client", server.addr, {}, /speaks TLS: use https:\/\//],
    ["untrusted server", server.endpoint, { tls: { ca: fs.readFileSync(file("other.pem")) } }, /not trusted by options.tls.ca/],
    ["no client certificate", server.endpoint, { tls: { ca } }, /requires a client certificate/],
    ["unknown client certificate", server.endpoint, { tls: { ca, cert: fs.readFileSync(file("other.pem")), key: fs.readFileSync(file("other.key")) } }, /refused this client's certificate/],
  ];
  for (const [what, endpoint, options, message] of cases) {
    const client = new Client([endpoint], options);
    try {
      const started = performance.now();
      await assert.rejects(client.describe("x"), (e) => e instanceof TlsError && message.test(e.message), what);
      assert.ok(performance.now() - started < 2000, `${what}: not retried`);
    } finally {
      await client.close();
    }
  }
});
