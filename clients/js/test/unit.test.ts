// The pure pieces: lease arithmetic (the deadline rule), the sequence window, status mapping,
// and the limits copied from the Rust tree.
import { it } from "node:test";
import * as assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import { Metadata, status } from "@grpc/grpc-js";

import { Conflict, InvalidArgument, LimitReached, PermissionDenied, safetyMarginMs, ServerError, SessionNotFound, limits, testing } from "latchkey";

const { ClientLease, SeqWindow, classify } = testing;

it("the margin is a fifth of the TTL with a floor", () => {
  assert.equal(safetyMarginMs(15_000), 3_000);
  assert.equal(safetyMarginMs(2_000), 400);
  assert.equal(safetyMarginMs(1_000), 200);
  assert.equal(safetyMarginMs(500), 200);
});

it("the deadline is the acknowledged renewal's send time + TTL - margin", () => {
  const t0 = 1_000;
  const lease = new ClientLease(t0, 15_000);
  assert.equal(lease.deadline(), t0 + 12_000);
  assert.equal(lease.nextRenewal(), t0 + 5_000);
  // A renewal sent at t0+5 s and acknowledged (whenever) moves the deadline to t0+17 s.
  lease.acknowledged(t0 + 5_000, 15_000);
  assert.equal(lease.deadline(), t0 + 17_000);
  assert.equal(lease.nextRenewal(), t0 + 10_000);
  // A late acknowledgement of an older renewal never moves it back.
  lease.acknowledged(t0 + 1_000, 15_000);
  assert.equal(lease.deadline(), t0 + 17_000);
});

it("a shorter server TTL is believed, a longer or absent one is not", () => {
  const lease = new ClientLease(0, 15_000);
  lease.acknowledged(0, 10_000);
  assert.equal(lease.deadline(), 8_000);
  lease.acknowledged(0, 0);
  assert.equal(lease.deadline(), 8_000);
  lease.acknowledged(0, 60_000);
  assert.equal(lease.deadline(), 8_000);
});

it("a failed renewal retries sooner, never past the deadline", () => {
  const lease = new ClientLease(0, 2_000);
  assert.equal(lease.deadline(), 1_600);
  lease.failed(700);
  assert.equal(lease.nextRenewal(), 900);
  lease.failed(1_550);
  assert.equal(lease.nextRenewal(), 1_600);
  lease.acknowledged(1_550, 2_000);
  assert.equal(lease.nextRenewal(), 1_550 + 2_000 / 3);
});

it("the first renewal comes before the deadline for every TTL", () => {
  for (const ttl of [limits.SESSION_TTL_MS_MIN, 2_000, 15_000, limits.SESSION_TTL_MS_MAX]) {
    const lease = new ClientLease(0, ttl);
    assert.ok(lease.nextRenewal() < lease.deadline(), `ttl ${ttl}`);
  }
});

it("a request waits while the oldest unanswered one is a window behind", () => {
  const w = new SeqWindow(1);
  const oldest = w.tryBegin()!;
  for (let expected = 2; expected <= limits.SESSION_SEQ_WINDOW_MAX; expected++) {
    const seq = w.tryBegin()!;
    assert.equal(seq, expected);
    w.end(seq);
  }
  assert.equal(w.tryBegin(), undefined);
  w.end(oldest);
  assert.equal(w.tryBegin(), limits.SESSION_SEQ_WINDOW_MAX + 1);
});

function statusError(code: status, meta: Record<string, string> = {}) {
  const metadata = new Metadata();
  for (const [k, v] of Object.entries(meta)) metadata.set(k, v);
  return Object.assign(new Error("msg"), { code, details: "msg", metadata });
}

it("maps gRPC statuses like the Rust client", () => {
  const hinted = classify(statusError(status.UNAVAILABLE, { "latchkey-error": "not-leader", "latchkey-leader-addr": "127.0.0.1:7421" }));
  assert.deepEqual(hinted, { kind: "unavailable", leaderAddr: "127.0.0.1:7421", message: "msg (not-leader)" });
  const empty = classify(statusError(status.UNAVAILABLE, { "latchkey-error": "not-leader", "latchkey-leader-addr": "" }));
  assert.equal(empty.kind === "unavailable" && empty.leaderAddr, undefined);
  for (const code of [status.UNAVAILABLE, status.UNKNOWN, status.DEADLINE_EXCEEDED, status.CANCELLED]) {
    assert.equal(classify(statusError(code)).kind, "transport", status[code]);
  }
  const fatal = (code: status, reason: string) => {
    const f = classify(statusError(code, { "latchkey-error": reason }));
    assert.equal(f.kind, "fatal");
    return (f as { error: Error }).error;
  };
  assert.ok(fatal(status.INVALID_ARGUMENT, "name-empty") instanceof InvalidArgument);
  assert.ok(fatal(status.NOT_FOUND, "session-not-found") instanceof SessionNotFound);
  const limit = fatal(status.RESOURCE_EXHAUSTED, "queue-full");
  assert.ok(limit instanceof LimitReached && limit.reason === "queue-full");
  const conflict = fatal(status.FAILED_PRECONDITION, "request-too-old");
  assert.ok(conflict instanceof Conflict && conflict.reason === "request-too-old");
  assert.ok(fatal(status.PERMISSION_DENIED, "permission-denied") instanceof PermissionDenied);
  assert.ok(fatal(status.UNAUTHENTICATED, "unauthenticated") instanceof PermissionDenied);
  assert.ok(fatal(status.UNKNOWN, "bug") instanceof ServerError);
});

it("the limits match crates/core/src/limits.rs", (t) => {
  const rust = path.resolve(__dirname, "..", "..", "..", "crates", "core", "src", "limits.rs");
  if (!fs.existsSync(rust)) return t.skip("not in a repository checkout");
  const text = fs.readFileSync(rust, "utf8");
  const value = (name: string): number => {
    const m = new RegExp(`pub const ${name}: \\w+ =\\s*([^;]+);`).exec(text);
    assert.ok(m, `${name} in limits.rs`);
    const expr = m[1].replace(/(\d)_(?=\d)/g, "$1").replace(/\b([A-Z][A-Z0-9_]+)\b/g, (n) => String(value(n)));
    assert.match(expr, /^[\d\s*+/()-]+$/, `${name} = ${m[1]}`);
    return Function(`return (${expr});`)() as number;
  };
  const copied: Record<string, number> = limits as unknown as Record<string, number>;
  const names = Object.keys(copied).filter((n) => text.includes(`pub const ${n}:`));
  assert.ok(names.length >= 25, `${names.length} names compared`);
  for (const n of names) assert.equal(copied[n], value(n), n);
});

// The client's clock: monotonic, and counting a suspend (which CLOCK_MONOTONIC, under
// performance.now(), does not) by the wall clock's lead over it.
function fakeClock() {
  const t = { mono: 1_000.25, wall: 1_700_000_000_000 };
  const clock = new testing.SuspendAwareClock(() => t.mono, () => t.wall);
  return { t, clock };
}

it("the clock follows the monotonic clock while the wall clock keeps pace", () => {
  const { t, clock } = fakeClock();
  const start = clock.now();
  t.mono += 5_000;
  t.wall += 5_000;
  assert.equal(clock.now() - start, 5_000);
});

it("a suspend (the wall clock ran on, the monotonic clock stood) is counted", () => {
  const { t, clock } = fakeClock();
  const lease = new ClientLease(clock.now(), 15_000);
  t.mono += 1_000;
  t.wall += 1_000;
  assert.ok(clock.now() < lease.deadline());
  // 20 s pass in a suspend: CLOCK_MONOTONIC advanced 3 ms of them, the wall clock all.
  t.wall += 20_000;
  t.mono += 3;
  assert.equal(clock.now() - (lease.deadline() - 12_000), 1_000 + 20_000);
  assert.ok(clock.now() >= lease.deadline(), "the lease is over at once after the suspend");
  // Afterwards the clock follows the monotonic one again, the suspend still counted.
  t.mono += 100;
  t.wall += 100;
  assert.equal(clock.now() - (lease.deadline() - 12_000), 21_100);
});

it("a wall clock stepped back is ignored and never moves the clock back", () => {
  const { t, clock } = fakeClock();
  const before = clock.now();
  t.wall -= 3_600_000;
  t.mono += 10;
  assert.equal(clock.now() - before, 10);
  t.wall += 10;
  t.mono += 10;
  assert.equal(clock.now() - before, 20);
});

it("the two clocks' jitter and small drift add nothing", () => {
  const { t, clock } = fakeClock();
  const start = clock.now();
  let seed = 7;
  const jitter = () => {
    seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31;
    return (seed % 3) - 1; // -1, 0 or 1 ms: Date.now()'s rounding
  };
  const wall0 = t.wall;
  for (let i = 1; i <= 100_000; i++) {
    t.mono += 0.37;
    t.wall = wall0 + Math.floor(i * 0.37) + jitter();
    const r = clock.now();
    assert.ok(r - start <= i * 0.37 + 1e-6, `reading ${i} ran ahead: ${r - start}`);
  }
});

it("the clock's reading never decreases, whatever the two sources do", () => {
  const { t, clock } = fakeClock();
  let seed = 11;
  const rnd = (n: number) => {
    seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31;
    return seed % n;
  };
  let last = clock.now();
  for (let i = 0; i < 10_000; i++) {
    t.mono += rnd(5);
    t.wall += rnd(200) - 60 + (rnd(100) === 0 ? 10_000 : 0) - (rnd(100) === 0 ? 10_000 : 0);
    const r = clock.now();
    assert.ok(r >= last, `step ${i}: ${r} < ${last}`);
    last = r;
  }
});

it("a wall clock that fell behind does not hide a later suspend", () => {
  const { t, clock } = fakeClock();
  const start = clock.now();
  // The wall clock falls 40 ms behind (below the detection threshold), then a 60 ms suspend.
  t.mono += 1_000;
  t.wall += 960;
  assert.equal(clock.now() - start, 1_000);
  t.wall += 60;
  assert.equal(clock.now() - start, 1_060, "the 60 ms suspend is counted in full");
});

// election.rs a_proclaim_replayed_after_a_read_that_reflects_a_later_one_is_not_news: a watch on a
// member that lags behind the one read replays proclaims the read already reflects.
it("observe: a proclaim replayed after a read that reflects a later one is not news", () => {
  const o = new testing.Observed();
  const leader = (value: string) => ({ sessionId: 1n, token: 10n, value: Buffer.from(value) });
  const event = (index: number, kind: string, value: string) => ({
    index: String(index),
    ordinal: 0,
    kind,
    lock: "svc",
    session: "1",
    token: "10",
    mode: kind === "granted" ? "LOCK_MODE_EXCLUSIVE" : undefined,
    value: Buffer.from(value),
  });
  o.read(leader("v2"), 30n);
  assert.deepEqual(o.news(), leader("v2"));
  for (const e of [event(10, "granted", "v0"), event(20, "proclaimed", "v1"), event(30, "proclaimed", "v2")]) {
    o.apply(e);
    assert.equal(o.news(), undefined, "an older value after a newer one");
  }
  o.apply(event(31, "proclaimed", "v3"));
  assert.deepEqual(o.news()?.value, Buffer.from("v3"));
});
