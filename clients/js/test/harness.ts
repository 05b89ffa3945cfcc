// Real `latchkey serve` processes for the tests: random ports on 127.0.0.1, a temp data dir,
// every process killed when its test ends (and, as a last resort, when this process exits).
import { ChildProcess, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";

import { Client, ClientOptions } from "latchkey";

/** The server binary: $LATCHKEY_BIN, or the repository's debug build. */
export const LATCHKEY_BIN = process.env.LATCHKEY_BIN ?? path.resolve(__dirname, "..", "..", "..", "target", "debug", "latchkey");

const running = new Set<ChildProcess>();
process.on("exit", () => {
  for (const child of running) child.kill("SIGKILL");
});

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const port = (srv.address() as net.AddressInfo).port;
      srv.close(() => resolve(port));
    });
  });
}

/** Polls `check` every 50 ms until it is true, at most `timeoutMs`. */
export async function waitUntil(what: string, timeoutMs: number, check: () => Promise<boolean> | boolean): Promise<void> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return;
    if (Date.now() > end) throw new Error(`not within ${timeoutMs} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** How to found a server or cluster beyond its flags. */
export interface Founding {
  /** `--groups G`: the Raft groups the lock namespace is split over (default: the server's, 1). */
  groups?: number;
  /** `--replicas R`: each group on R of the founding members only (default: every member). */
  replicas?: number;
  /** `--metrics-listen` on a free port, read with `metric()`. */
  metrics?: boolean;
}

/** The `--groups`, `--replicas` and `--metrics-listen` flags of a founding. */
function foundingArgs(founding: Founding, metricsAddr: string | undefined): string[] {
  const args: string[] = [];
  if (founding.groups !== undefined) args.push("--groups", String(founding.groups));
  if (founding.replicas !== undefined) args.push("--replicas", String(founding.replicas));
  if (metricsAddr !== undefined) args.push("--metrics-listen", metricsAddr);
  return args;
}

/** The value of the Prometheus counter `name` (with `labels`, e.g. `method="keep_alive"`) at `metricsAddr`; 0 when absent. */
export async function readMetric(metricsAddr: string, name: string, labels = ""): Promise<number> {
  const res = await fetch(`http://${metricsAddr}/metrics`, { signal: AbortSignal.timeout(5_000) });
  const text = await res.text();
  const series = labels === "" ? name : `${name}{${labels}}`;
  for (const line of text.split("\n")) {
    if (line.startsWith(`${series} `)) return Number(line.slice(series.length + 1));
  }
  return 0;
}

/** One single-member `latchkey serve`. */
export class Server {
  addr = "";
  /** `--metrics-listen`, when the founding asked for metrics. */
  metricsAddr?: string;
  private child?: ChildProcess;
  readonly dir: string;
  readonly log: string;

  /** The endpoint clients use: `addr`, or `https://addr` for a TLS server. */
  get endpoint(): string {
    return this.options.tls ? `https://${this.addr}` : this.addr;
  }

  private constructor(
    private readonly args: string[],
    private readonly options: ClientOptions,
    private readonly founding: Founding,
  ) {
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), "latchkey-js-"));
    this.log = path.join(this.dir, "server.log");
  }

  /** Starts a server on a free port and waits until it serves a linearizable read. */
  static async start(args: string[] = [], options: ClientOptions = {}, founding: Founding = {}): Promise<Server> {
    if (!fs.existsSync(LATCHKEY_BIN)) throw new Error(`no server binary at ${LATCHKEY_BIN} (set LATCHKEY_BIN)`);
    const server = new Server(args, options, founding);
    let last: unknown;
    for (let i = 0; i < 5; i++) {
      server.addr = `127.0.0.1:${await freePort()}`;
      if (founding.metrics) server.metricsAddr = `127.0.0.1:${await freePort()}`;
      server.spawn();
      try {
        await server.waitReady();
        return server;
      } catch (e) {
        last = e; // most likely the port was taken meanwhile: try another
        server.kill();
      }
    }
    throw new Error(`server did not start: ${last}\n${server.logTail()}`);
  }

  private spawn(): void {
    const log = fs.openSync(this.log, "a");
    const args = [...foundingArgs(this.founding, this.metricsAddr), ...this.args];
    this.child = spawn(LATCHKEY_BIN, ["serve", "--listen", this.addr, "--data-dir", path.join(this.dir, "data"), ...args], {
      stdio: ["ignore", "ignore", log],
      env: { ...process.env, RUST_LOG: "info" },
    });
    fs.closeSync(log);
    running.add(this.child);
  }

  private async waitReady(): Promise<void> {
    const client = new Client([this.endpoint], { ...this.options, rpcTimeoutMs: 1000, retry: { attemptsMax: 1 } });
    try {
      await waitUntil(`${this.addr} ready`, 15_000, async () => {
        if (this.child?.exitCode !== null) throw new Error(`server exited: ${this.child?.exitCode}`);
        try {
          // With several groups, every group's leader answers (List goes to each).
          if ((this.founding.groups ?? 1) > 1) await client.list("probe/ready");
          else await client.describe("probe/ready");
          return true;
        } catch {
          return false;
        }
      });
    } finally {
      await client.close();
    }
  }

  /** A counter of this server's metrics (needs `metrics: true` at the founding). */
  metric(name: string, labels = ""): Promise<number> {
    if (this.metricsAddr === undefined) throw new Error("the server was started without metrics");
    return readMetric(this.metricsAddr, name, labels);
  }

  /** SIGSTOP: the node stops answering, its connections stay open. */
  pause(): void {
    this.child?.kill("SIGSTOP");
  }

  /** SIGCONT. */
  resume(): void {
    this.child?.kill("SIGCONT");
  }

  /** SIGKILL (a paused process dies of it too), and wait for the exit. */
  async kill(): Promise<void> {
    const child = this.child;
    if (!child) return;
    this.child = undefined;
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGKILL");
      await exited;
    }
    running.delete(child);
  }

  async stop(): Promise<void> {
    await this.kill();
    fs.rmSync(this.dir, { recursive: true, force: true });
  }

  logTail(): string {
    try {
      return fs.readFileSync(this.log, "utf8").split("\n").slice(-40).join("\n");
    } catch {
      return "";
    }
  }
}

/** `n` members founding one cluster (`--peers`), each on a free port. */
export class Cluster {
  readonly members: Array<{ id: number; addr: string; metricsAddr?: string; child?: ChildProcess; log: string }> = [];
  readonly dir: string;

  private constructor(
    n: number,
    ports: number[],
    readonly founding: Founding,
  ) {
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), "latchkey-js-cluster-"));
    for (let i = 0; i < n; i++) {
      this.members.push({
        id: i + 1,
        addr: `127.0.0.1:${ports[i]}`,
        metricsAddr: founding.metrics ? `127.0.0.1:${ports[n + i]}` : undefined,
        log: path.join(this.dir, `node-${i + 1}.log`),
      });
    }
  }

  static async start(n: number, founding: Founding = {}): Promise<Cluster> {
    if (!fs.existsSync(LATCHKEY_BIN)) throw new Error(`no server binary at ${LATCHKEY_BIN} (set LATCHKEY_BIN)`);
    const ports: number[] = [];
    while (ports.length < (founding.metrics ? 2 * n : n)) {
      const p = await freePort();
      if (!ports.includes(p)) ports.push(p);
    }
    const cluster = new Cluster(n, ports, founding);
    const peers = cluster.members.map((m) => `${m.id}=${m.addr}`).join(",");
    for (const m of cluster.members) {
      const log = fs.openSync(m.log, "a");
      m.child = spawn(
        LATCHKEY_BIN,
        [
          "serve",
          "--id",
          String(m.id),
          "--listen",
          m.addr,
          "--data-dir",
          path.join(cluster.dir, `data-${m.id}`),
          "--peers",
          peers,
          ...foundingArgs(founding, m.metricsAddr),
        ],
        { stdio: ["ignore", "ignore", log], env: { ...process.env, RUST_LOG: "info" } },
      );
      fs.closeSync(log);
      running.add(m.child);
    }
    try {
      await cluster.leader(20_000);
      if ((founding.groups ?? 1) > 1) await cluster.groupLeaders(20_000);
      const client = new Client(cluster.endpoints());
      try {
        await waitUntil("the cluster serves reads", 20_000, () =>
          ((founding.groups ?? 1) > 1 ? client.list("probe/ready") : client.describe("probe/ready")).then(
            () => true,
            () => false,
          ),
        );
      } finally {
        await client.close();
      }
    } catch (e) {
      await cluster.stop();
      throw e;
    }
    return cluster;
  }

  endpoints(): string[] {
    return this.members.filter((m) => m.child).map((m) => m.addr);
  }

  /** The member that a running member names as leader, once one does and it is running. */
  async leader(timeoutMs: number): Promise<{ id: number; addr: string }> {
    let found: { id: number; addr: string } | undefined;
    await waitUntil("a leader", timeoutMs, async () => {
      for (const m of this.members.filter((m) => m.child)) {
        const c = new Client([m.addr], { rpcTimeoutMs: 500, retry: { attemptsMax: 1 } });
        try {
          const s = await c.nodeStatus();
          const l = this.members.find((x) => BigInt(x.id) === s.leaderId && x.child);
          if (s.role === "leader" && l) {
            found = l;
            return true;
          }
        } catch {
          // not up yet
        } finally {
          await c.close();
        }
      }
      return false;
    });
    return found!;
  }

  /**
   * The member leading each Raft group (by group), once a running member says it leads it for
   * every group of the founding.
   */
  async groupLeaders(timeoutMs: number): Promise<Array<{ id: number; addr: string }>> {
    const groups = this.founding.groups ?? 1;
    const found = new Map<number, { id: number; addr: string }>();
    await waitUntil("a leader of every group", timeoutMs, async () => {
      found.clear();
      for (const m of this.members.filter((m) => m.child)) {
        const c = new Client([m.addr], { rpcTimeoutMs: 500, retry: { attemptsMax: 1 } });
        try {
          const s = await c.nodeStatus();
          for (const g of s.groupStatus) if (g.role === "leader") found.set(g.group, m);
        } catch {
          // not up yet
        } finally {
          await c.close();
        }
      }
      return found.size === groups;
    });
    return Array.from({ length: groups }, (_, g) => found.get(g)!);
  }

  /** The sum of a counter over the running members' metrics (needs `metrics: true`). */
  async metric(name: string, labels = ""): Promise<number> {
    let sum = 0;
    for (const m of this.members.filter((m) => m.child)) {
      if (m.metricsAddr === undefined) throw new Error("the cluster was founded without metrics");
      sum += await readMetric(m.metricsAddr, name, labels);
    }
    return sum;
  }

  async kill(id: number): Promise<void> {
    const m = this.members.find((x) => x.id === id)!;
    const child = m.child;
    m.child = undefined;
    if (child && child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGKILL");
      await exited;
    }
    if (child) running.delete(child);
  }

  async stop(): Promise<void> {
    for (const m of this.members) await this.kill(m.id);
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}
