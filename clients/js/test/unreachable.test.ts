// Issue #33: a dead or misspelled endpoint fails fast, naming the cause (no server needed).
import { it } from "node:test";
import * as assert from "node:assert/strict";

import { Client, limits, now, TransportError } from "latchkey";

it("endpoints that refuse connections fail within the fail-fast budget, naming the cause", async () => {
  // Nothing listens on ports 1 and 2 of localhost: connections are refused at once.
  const client = new Client(["127.0.0.1:1", "127.0.0.1:2"]);
  const start = now();
  try {
    await assert.rejects(client.describe("x"), (e: unknown) => {
      assert.ok(e instanceof TransportError, String(e));
      assert.match(e.message, /cannot reach 127\.0\.0\.1:\d: connection refused/);
      return true;
    });
    const took = now() - start;
    // Before: 64 attempts in about 12 s.
    assert.ok(took >= limits.CLIENT_UNREACHABLE_MS_MAX && took < 2 * limits.CLIENT_UNREACHABLE_MS_MAX, `${took} ms`);
  } finally {
    await client.close();
  }
});

it("an endpoint that does not resolve says no such host", async () => {
  const client = new Client(["nosuchhost.invalid:7420"]);
  const start = now();
  try {
    await assert.rejects(client.describe("x"), /cannot reach nosuchhost\.invalid:7420: no such host/);
    assert.ok(now() - start < 2 * limits.CLIENT_UNREACHABLE_MS_MAX);
  } finally {
    await client.close();
  }
});
