#!/usr/bin/env node
// The conformance agent (issue #15 item 5): a thin script over this library's PUBLIC API that
// the cross-client conformance suite drives with JSON lines. Protocol:
// /work/notes/conformance-agent.md (to become part of docs/protocol.md).
//
//   node dist/conformance-agent.js --endpoints HOST:PORT[,HOST:PORT...]
//
// One JSON command per stdin line, exactly one JSON answer per command on stdout (with the
// command's `id`). Commands run one at a time in order, except `lock`, `campaign` and `wait_lost`, which may
// block and run concurrently (their answers may come out of order). On stdin EOF every session is
// closed and the agent exits 0. Diagnostics go to stderr only.
//
// `inject_retry` uses the library's documented test hook `testing.acquireTwiceWithSameSeq`,
// which sends one Acquire (same session, same sequence number) twice, as a retry after a lost
// answer would.
import * as readline from "node:readline";

import {
  Client,
  InvalidArgument,
  KindConflict,
  LatchkeyError,
  Leadership,
  LockGuard,
  NotElectionLeader,
  NotHeld,
  PermissionDenied,
  PermitsConflict,
  Session,
  SessionLost,
  WaitTimeout,
  testing,
} from "./index";

type Json = null | boolean | number | string | bigint | Json[] | { [k: string]: Json };
type Command = { id?: unknown; op?: unknown; [k: string]: unknown };

/** JSON with u64 values (bigint) written as JSON numbers, exactly. */
function stringify(value: Json): string {
  const marker = "\u0000bigint:";
  return JSON.stringify(value, (_k, v) => (typeof v === "bigint" ? marker + v.toString() : v)).replace(
    /"\\u0000bigint:(\d+)"/g,
    "$1",
  );
}

function write(answer: { [k: string]: Json }): void {
  process.stdout.write(stringify(answer) + "\n");
}

function errorCode(e: unknown): string {
  if (e instanceof WaitTimeout) return "wait-timeout";
  if (e instanceof PermissionDenied) return "permission-denied";
  if (e instanceof SessionLost || e instanceof NotHeld) return "lost";
  if (e instanceof InvalidArgument) return "invalid-argument";
  if (e instanceof KindConflict) return "kind-conflict";
  if (e instanceof PermitsConflict) return "permits-conflict";
  if (e instanceof NotElectionLeader) return "not-election-leader";
  return "other";
}

function parseArgs(argv: string[]): string[] {
  const i = argv.indexOf("--endpoints");
  const value = i >= 0 ? argv[i + 1] : argv.find((a) => a.startsWith("--endpoints="))?.slice("--endpoints=".length);
  if (!value) {
    process.stderr.write("usage: conformance-agent --endpoints HOST:PORT[,HOST:PORT...]\n");
    process.exit(2);
  }
  return value.split(",").filter((e) => e.trim() !== "");
}

/** Queue positions kept per lock command: a wait hears one a long-poll (at most 10 s). */
const POSITIONS_KEPT_MAX = 64;

class Agent {
  private readonly client: Client;
  private readonly sessions = new Map<string, Session>();
  private readonly guards = new Map<string, LockGuard>();
  private nextGuard = 1;
  /**
   * The queue positions reported to a lock that asked (`"positions": true`), in order, by the
   * lock command's id; at most POSITIONS_KEPT_MAX each (the latest).
   */
  private readonly positions = new Map<string, number[]>();
  /** Commands that run concurrently (lock, wait_lost), awaited before exit. */
  private readonly inFlight = new Set<Promise<void>>();

  constructor(endpoints: string[]) {
    this.client = new Client(endpoints);
  }

  private str(cmd: Command, key: string): string {
    const v = cmd[key];
    if (typeof v !== "string") throw new BadCommand(`"${key}" must be a string`);
    return v;
  }

  private session(cmd: Command): Session {
    const name = this.str(cmd, "session");
    const s = this.sessions.get(name);
    if (!s) throw new Other(`no session ${JSON.stringify(name)}`);
    return s;
  }

  private guard(cmd: Command): LockGuard {
    const name = this.str(cmd, "guard");
    const g = this.guards.get(name);
    if (!g) throw new Other(`no guard ${JSON.stringify(name)}`);
    return g;
  }

  private leadership(cmd: Command): Leadership {
    const g = this.guard(cmd);
    if (!(g instanceof Leadership)) throw new Other(`guard ${JSON.stringify(cmd.guard)} is not a campaign's`);
    return g;
  }

  /** Handles one line; a blocking command is started and left running. */
  async line(text: string): Promise<void> {
    let cmd: Command;
    try {
      cmd = JSON.parse(text);
      if (typeof cmd !== "object" || cmd === null || Array.isArray(cmd) || typeof cmd.id !== "string" || typeof cmd.op !== "string") {
        throw new Error("not a command");
      }
    } catch {
      write({ id: null, ok: false, error: "bad-command" });
      return;
    }
    const id = cmd.id as string;
    const run = async () => {
      try {
        write({ id, ok: true, ...(await this.execute(cmd)) });
      } catch (e) {
        const error = e instanceof UnknownOp ? "unknown-op" : e instanceof BadCommand ? "bad-command" : errorCode(e);
        const message = e instanceof Error ? e.message : String(e);
        if (!(e instanceof LatchkeyError) && !(e instanceof AgentError)) process.stderr.write(`agent: ${id}: ${message}\n`);
        write({ id, ok: false, error, message });
      }
    };
    if (cmd.op === "lock" || cmd.op === "campaign" || cmd.op === "wait_lost") {
      const p: Promise<void> = run().finally(() => this.inFlight.delete(p));
      this.inFlight.add(p);
    } else {
      await run();
    }
  }

  private async execute(cmd: Command): Promise<{ [k: string]: Json }> {
    switch (cmd.op) {
      case "session": {
        const name = this.str(cmd, "session");
        const ttlMs = cmd.ttl_ms === undefined ? 15_000 : Number(cmd.ttl_ms);
        const session = await this.client.session({ ttl: ttlMs / 1000 });
        this.sessions.set(name, session);
        return { session_id: session.id };
      }
      case "lock": {
        const session = this.session(cmd);
        const name = this.str(cmd, "name");
        const wait = cmd.wait_ms === undefined || cmd.wait_ms === null ? undefined : Number(cmd.wait_ms) / 1000;
        // `"mode": "shared"` a reader, `"permits": N` one of a semaphore's N permits.
        const mode = cmd.mode ?? "exclusive";
        if (mode !== "exclusive" && mode !== "shared" && mode !== "permits") throw new BadCommand(`no mode ${String(mode)}`);
        const permits = cmd.permits === undefined || cmd.permits === null ? undefined : Number(cmd.permits);
        // `"lock_delay_ms": N` asks for a lock-delay (docs/primitives.md).
        const lockDelayMs = cmd.lock_delay_ms === undefined || cmd.lock_delay_ms === null ? undefined : Number(cmd.lock_delay_ms);
        // `"positions": true` records the queue positions reported while it waits (`positions`).
        let onPosition: ((position: number) => void) | undefined;
        if (cmd.positions === true) {
          const heard: number[] = [];
          this.positions.set(this.str(cmd, "id"), heard);
          onPosition = (position) => {
            if (heard.length === POSITIONS_KEPT_MAX) heard.shift();
            heard.push(position);
          };
        }
        const guard = await session.lock(name, { wait, shared: mode === "shared", permits, lockDelayMs, onPosition });
        const handle = `g-${this.nextGuard++}`;
        this.guards.set(handle, guard);
        return { token: guard.token, guard: handle };
      }
      case "campaign": {
        const session = this.session(cmd);
        const wait = cmd.wait_ms === undefined || cmd.wait_ms === null ? undefined : Number(cmd.wait_ms) / 1000;
        const leadership = await session.campaign(this.str(cmd, "name"), this.str(cmd, "value"), { wait });
        const handle = `g-${this.nextGuard++}`;
        this.guards.set(handle, leadership);
        return { token: leadership.token, guard: handle };
      }
      case "proclaim":
        await this.leadership(cmd).proclaim(this.str(cmd, "value"));
        return {};
      case "resign":
        await this.leadership(cmd).resign();
        return {};
      case "leader": {
        const leader = await this.client.leader(this.str(cmd, "name"));
        if (leader === undefined) return { leader: null };
        return { leader: { session_id: leader.sessionId, token: leader.token, value: leader.value.toString("utf8") } };
      }
      case "release": {
        // The library's contract: releasing a lost lock throws SessionLost at once (NotHeld if
        // the server says the grant was not current): both answer "lost".
        await this.guard(cmd).release();
        return {};
      }
      case "positions": {
        const lock = this.str(cmd, "lock");
        const heard = this.positions.get(lock);
        if (!heard) throw new Other(`no lock ${JSON.stringify(lock)} that asked for positions`);
        return { positions: [...heard] };
      }
      case "lost":
        return { lost: this.guard(cmd).isLost() };
      case "wait_lost": {
        const guard = this.guard(cmd);
        const timeoutMs = cmd.timeout_ms === undefined ? 20_000 : Number(cmd.timeout_ms);
        let timer: NodeJS.Timeout | undefined;
        const lost = await Promise.race([
          guard.lost.then(() => true),
          new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), timeoutMs))),
        ]);
        clearTimeout(timer);
        return { lost };
      }
      case "contended":
        return { contended: this.guard(cmd).isContended() };
      case "wait_contended": {
        const guard = this.guard(cmd);
        const timeoutMs = cmd.timeout_ms === undefined ? 20_000 : Number(cmd.timeout_ms);
        let timer: NodeJS.Timeout | undefined;
        const contended = await Promise.race([
          guard.contended().then(() => true),
          new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), timeoutMs))),
        ]);
        clearTimeout(timer);
        return { contended };
      }
      case "describe": {
        const info = await this.client.describe(this.str(cmd, "name"));
        return {
          held: info.holder !== undefined,
          token: info.holder?.token ?? null,
          session_id: info.holder?.sessionId ?? null,
          waiters: info.waiters,
          mode: info.mode,
          permits: info.permits,
          holders: info.holders.map((h) => ({ session_id: h.sessionId, token: h.token })),
        };
      }
      case "close": {
        const name = this.str(cmd, "session");
        const session = this.session(cmd);
        this.sessions.delete(name);
        await session.close();
        return {};
      }
      case "fencing_headers":
        return { headers: this.guard(cmd).fencingHeaders() };
      case "inject_retry": {
        const tokens = await testing.acquireTwiceWithSameSeq(this.session(cmd), this.str(cmd, "name"));
        return { tokens };
      }
      default:
        throw new UnknownOp(String(cmd.op));
    }
  }

  /** Closes every session (a blocked lock then fails with `lost`), then the client. */
  async shutdown(): Promise<void> {
    await Promise.allSettled([...this.sessions.values()].map((s) => s.close()));
    await Promise.allSettled([...this.inFlight]);
    await this.client.close();
  }
}

class AgentError extends Error {}
class UnknownOp extends AgentError {}
class BadCommand extends AgentError {}
class Other extends AgentError {}

async function main(): Promise<void> {
  const agent = new Agent(parseArgs(process.argv.slice(2)));
  const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  // Lines are handled one after another; `lock` and `wait_lost` only start theirs.
  for await (const text of lines) {
    if (text.trim() === "") continue;
    await agent.line(text);
  }
  await agent.shutdown();
  process.exitCode = 0;
}

main().catch((e) => {
  process.stderr.write(`agent: ${e instanceof Error ? e.stack : e}\n`);
  process.exit(1);
});
