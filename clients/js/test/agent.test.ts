// The conformance agent, driven as the conformance suite will drive it: JSON lines over stdio.
import { after, before, describe, it } from "node:test";
import * as assert from "node:assert/strict";
import { ChildProcess, spawn } from "node:child_process";
import * as path from "node:path";
import * as readline from "node:readline";

import { Server } from "./harness";

const AGENT = path.resolve(__dirname, "..", "dist", "conformance-agent.js");

/** One agent process; `send` writes a command, `answer(id)` awaits the line with that id. */
class Agent {
  readonly child: ChildProcess;
  private readonly answers = new Map<string, (a: any) => void>();
  private readonly early = new Map<string, any>();
  readonly stderr: string[] = [];
  readonly exited: Promise<number | null>;

  constructor(endpoints: string) {
    this.child = spawn(process.execPath, [AGENT, "--endpoints", endpoints], { stdio: ["pipe", "pipe", "pipe"] });
    this.exited = new Promise((r) => this.child.once("exit", (code) => r(code)));
    readline.createInterface({ input: this.child.stdout! }).on("line", (line) => {
      const a = JSON.parse(line);
      const key = String(a.id);
      const waiter = this.answers.get(key);
      if (waiter) {
        this.answers.delete(key);
        waiter(a);
      } else this.early.set(key, a);
    });
    readline.createInterface({ input: this.child.stderr! }).on("line", (l) => this.stderr.push(l));
  }

  send(cmd: object | string): void {
    this.child.stdin!.write((typeof cmd === "string" ? cmd : JSON.stringify(cmd)) + "\n");
  }

  answer(id: string | null, timeoutMs = 20_000): Promise<any> {
    const key = String(id);
    if (this.early.has(key)) {
      const a = this.early.get(key);
      this.early.delete(key);
      return Promise.resolve(a);
    }
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no answer to ${key}; stderr:\n${this.stderr.join("\n")}`)), timeoutMs);
      this.answers.set(key, (a) => {
        clearTimeout(timer);
        resolve(a);
      });
    });
  }

  async call(cmd: { id: string; [k: string]: unknown }): Promise<any> {
    this.send(cmd);
    return this.answer(cmd.id);
  }
}

describe("conformance agent", () => {
  let server: Server;
  before(async () => {
    server = await Server.start();
  });
  after(async () => {
    await server?.stop();
  });

  it("answers the protocol's commands", async () => {
    const agent = new Agent(server.addr);
    try {
      const s1 = await agent.call({ id: "1", op: "session", session: "s1", ttl_ms: 4000 });
      assert.equal(s1.ok, true);
      assert.equal(typeof s1.session_id, "number");
      assert.equal((await agent.call({ id: "2", op: "session", session: "s2", ttl_ms: 4000 })).ok, true);
      const lock = await agent.call({ id: "3", op: "lock", session: "s1", name: "x", wait_ms: 3000 });
      assert.equal(lock.ok, true, JSON.stringify(lock));
      assert.match(lock.guard, /^g-/);
      // A blocked lock does not stop later commands; its answer comes when it is granted.
      agent.send({ id: "4", op: "lock", session: "s2", name: "x", wait_ms: 10000 });
      const d = await agent.call({ id: "5", op: "describe", name: "x" });
      assert.deepEqual(d, {
        id: "5",
        ok: true,
        held: true,
        token: lock.token,
        session_id: s1.session_id,
        waiters: d.waiters,
        mode: "exclusive",
        permits: 0,
        holders: [{ session_id: s1.session_id, token: lock.token }],
      });
      assert.deepEqual(await agent.call({ id: "6", op: "fencing_headers", guard: lock.guard }), {
        id: "6",
        ok: true,
        headers: { "latchkey-lock": "x", "latchkey-token": String(lock.token) },
      });
      assert.deepEqual(await agent.call({ id: "7", op: "lost", guard: lock.guard }), { id: "7", ok: true, lost: false });
      assert.deepEqual(await agent.call({ id: "8", op: "release", guard: lock.guard }), { id: "8", ok: true });
      const second = await agent.answer("4");
      assert.equal(second.ok, true);
      assert.ok(second.token > lock.token);
      // Try-lock of a held lock.
      const busy = await agent.call({ id: "9", op: "lock", session: "s1", name: "x", wait_ms: 0 });
      assert.equal(busy.error, "wait-timeout");
      // Exactly-once: one request sent twice is granted once, with one token.
      const retry = await agent.call({ id: "10", op: "inject_retry", session: "s1", name: "y" });
      assert.equal(retry.ok, true, JSON.stringify(retry));
      assert.equal(retry.tokens.length, 2);
      assert.ok(retry.tokens[0] > 0);
      assert.equal(retry.tokens[0], retry.tokens[1]);
      const y = await agent.call({ id: "11", op: "describe", name: "y" });
      assert.equal(y.token, retry.tokens[0]);
      assert.equal(y.session_id, s1.session_id);
      // Errors.
      assert.deepEqual(await agent.call({ id: "12", op: "fly" }), { id: "12", ok: false, error: "unknown-op", message: "fly" });
      agent.send("{not json");
      assert.deepEqual(await agent.answer(null), { id: null, ok: false, error: "bad-command" });
      assert.deepEqual(await agent.call({ id: "13", op: "close", session: "s2" }), { id: "13", ok: true });
      assert.equal((await agent.call({ id: "14", op: "lost", guard: second.guard })).lost, true);
      // EOF: sessions closed, exit 0.
      agent.child.stdin!.end();
      assert.equal(await agent.exited, 0);
    } finally {
      agent.child.kill("SIGKILL");
    }
  });

  it("reports a lost lock when the server is paused past the deadline", async () => {
    const agent = new Agent(server.addr);
    try {
      assert.equal((await agent.call({ id: "1", op: "session", session: "s", ttl_ms: 2000 })).ok, true);
      const lock = await agent.call({ id: "2", op: "lock", session: "s", name: "p", wait_ms: 3000 });
      assert.equal(lock.ok, true);
      // Another session queues behind it: its blocked lock ends when its session is lost too.
      assert.equal((await agent.call({ id: "3", op: "session", session: "t", ttl_ms: 2000 })).ok, true);
      agent.send({ id: "4", op: "lock", session: "t", name: "p" });
      server.pause();
      try {
        const started = performance.now();
        assert.deepEqual(await agent.call({ id: "5", op: "wait_lost", guard: lock.guard, timeout_ms: 20000 }), {
          id: "5",
          ok: true,
          lost: true,
        });
        // Before the TTL passes from the last renewal (which was at most TTL/3 before the pause).
        assert.ok(performance.now() - started < 2000, `${performance.now() - started} ms`);
        assert.equal((await agent.call({ id: "6", op: "lost", guard: lock.guard })).lost, true);
        const release = await agent.call({ id: "7", op: "release", guard: lock.guard });
        assert.equal(release.error, "lost", JSON.stringify(release));
        assert.equal((await agent.answer("4")).error, "lost");
      } finally {
        server.resume();
      }
      agent.child.stdin!.end();
      assert.equal(await agent.exited, 0);
    } finally {
      agent.child.kill("SIGKILL");
    }
  });
});
