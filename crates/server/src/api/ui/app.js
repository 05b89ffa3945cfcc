// latchkey's web page: reads this node's JSON API and renders it, once a second.
//
// Why polling and not a watch: one GET of each route per second is simple, bounded (one
// request of each kind in flight at a time, the next only after the last answered) and
// stateless on the server; a page left open costs the node what a `latchkey list` a second
// costs it.
//
// Every string from the server goes into the page as text (textContent, createTextNode),
// never parsed as HTML; the page's Content-Security-Policy runs only this script.
//
// Access: with `--acl` the API wants `Authorization: Bearer TOKEN`; the token typed in the
// field is kept in sessionStorage (this tab only) and sent with every call. The page only
// reads (GET routes), but for one admin action: force-release (POST /v1/admin/release), whose
// button each held lock shows when the viewer may have the admin permission: a token was
// entered, or the node has no access control (`access_control` in the status). The page
// probes nothing: a token without the permission gets the API's refusal, shown as is.
//
// Read-write locks and semaphores (docs/primitives.md): each lock's row says how it is held
// (exclusive, shared by N readers, or "k of N permits") and lists every holder, one line each,
// with a force-release button per grant (readers granted together share a token: one button).
//
// Lock-delay (docs/primitives.md): a name whose holder's grant was lost, and that is granted to
// nobody until its delay ends, has a row with no holder that says "lock-delay until <time>
// (<remaining> left)" (`delay_remaining_ms`, counted from this page's clock); a held lock whose
// grant asked for one says so under how it is held.
//
// Raft groups (`groups` in the status above 1): the page lists the locks of each group
// (`GET /v1/locks?group=G`; a list is its group leader's, to which a follower forwards it) and
// shows every group, with its leader, in the "Raft groups" table.
"use strict";

const REFRESH_MS = 1000;
// Locks whose queue the list cut short get a describe each, at most this many per refresh.
const DESCRIBES_PER_REFRESH_MAX = 10;
const TOKEN_KEY = "latchkey.token";

const $ = (id) => document.getElementById(id);

function el(tag, text, attrs) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

function row(cells, attrs) {
  const tr = el("tr", null, attrs);
  for (const cell of cells) {
    tr.appendChild(cell instanceof Node ? cell : el("td", cell));
  }
  return tr;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function duration(ms) {
  if (ms < 1000) return `${ms} ms`;
  const s = Math.floor(ms / 1000);
  if (s < 120) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 120) return `${m} min ${s % 60} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

function owner(o) {
  if (!o) return "";
  const who = [o.user, o.host].filter(Boolean).join("@");
  const parts = [who, o.pid ? `pid ${o.pid}` : "", o.text].filter(Boolean);
  return parts.join(", ");
}

class ApiError extends Error {}

// The last status's `access_control`; null until one arrived.
let accessControl = null;

async function call(path, init) {
  const headers = { Accept: "application/json", ...(init.headers || {}) };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const response = await fetch(path, { ...init, headers, cache: "no-store" });
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    let message = body && body.message ? `${body.code}: ${body.message}` : `HTTP ${response.status}`;
    if (body && body.code === "not-leader") {
      message += ` (the leader is member ${body.leader_id ?? "?"} at ${body.leader_addr ?? "?"};` +
        " open /ui on its --http-listen address)";
    }
    throw new ApiError(message);
  }
  return body;
}

const get = (path) => call(path, { method: "GET" });

const post = (path, body) =>
  call(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });

function mayForceRelease() {
  return accessControl === false || Boolean(sessionStorage.getItem(TOKEN_KEY));
}

// Opens the reason form (outside the table, which each refresh rebuilds) for this grant: a
// holder's, or the lost grant of a running lock-delay (`delay`): that request says so
// (`end_delay`), since a plain release never ends a delay.
function askForceRelease(name, token, delay = false) {
  $("release-effect").textContent = delay
    ? "its lock-delay ends and the next waiter gets it"
    : "the holder loses it";
  $("release-lock").textContent = name;
  $("release-token").textContent = String(token);
  $("release").dataset.lock = name;
  $("release").dataset.token = String(token);
  $("release").dataset.endDelay = delay ? "true" : "";
  $("release-error").textContent = "";
  $("release-result").textContent = "";
  $("release").hidden = false;
  $("release-reason").focus();
}

async function forceRelease(event) {
  event.preventDefault();
  const form = $("release");
  const name = form.dataset.lock;
  // Only the grant the page showed: if another took the lock since, the API says token-mismatch.
  const token = Number(form.dataset.token);
  const reason = $("release-reason").value.trim();
  $("release-error").textContent = "";
  $("release-result").textContent = "";
  if (!reason) {
    $("release-error").textContent = "give a reason: the audit log records it";
    return;
  }
  $("release-confirm").disabled = true;
  try {
    const endDelay = form.dataset.endDelay === "true";
    // end_delay only when true: a member of a build before it refuses the field.
    const body = endDelay ? { name, token, reason, end_delay: true } : { name, token, reason };
    const taken = await post("/v1/admin/release", body);
    $("release-result").textContent = endDelay
      ? `ended the lock-delay of ${name} (begun when session ${taken.session} lost token ${taken.token})`
      : `force-released ${name} (session ${taken.session}, token ${taken.token})`;
    $("release-reason").value = "";
    form.hidden = true;
  } catch (e) {
    const why = e instanceof ApiError ? e.message : `cannot reach the node: ${e.message}`;
    $("release-error").textContent = why;
  } finally {
    $("release-confirm").disabled = false;
  }
}

function renderStatus(s) {
  // With several Raft groups these facts are group 0's; the groups table has each group's.
  const of = groupCount(s) > 1 ? " (group 0)" : "";
  const facts = [
    ["this node", `member ${s.id}`],
    ["role", `${s.role}${of}`],
    ["leader", (s.leader_id === null ? "none known" : `member ${s.leader_id}`) + of],
    ["term", s.term],
    ["last log index", s.last_log_index],
    ["commit index", s.committed_index],
    ["applied index", s.applied_index],
    ["cluster id", s.cluster_id],
  ];
  fill($("node").tBodies[0], facts.map(([k, v]) => row([el("th", k), el("td", v)], { "data-fact": k })));
  const members = s.members.map((m) => {
    const role = m.id === s.leader_id ? "leader" : "voter";
    const attrs = { "data-member": m.id };
    if (role === "leader") attrs.class = "leader";
    const me = m.id === s.id ? " (this node)" : "";
    return row([`${m.id}${me}`, el("td", m.addr, { class: "mono" }), role], attrs);
  });
  const learners = s.learners.map((m) =>
    row([`${m.id}${m.id === s.id ? " (this node)" : ""}`, el("td", m.addr, { class: "mono" }), "learner"],
      { "data-member": m.id }));
  fill($("members").tBodies[0], members.concat(learners));
  $("members-of").textContent = of;
  $("sessions-total").textContent = String(sessionsTotal(s));
  accessControl = s.access_control;
  renderGroups(s);
}

// The cluster's Raft groups (a server from before groups says nothing: one).
function groupCount(s) {
  return s.groups ?? 1;
}

function groupStatus(s) {
  return s.group_status ?? [];
}

// This node's tables' sessions in all its groups (each group's table as this node applied it).
function sessionsTotal(s) {
  return groupCount(s) > 1 ? groupStatus(s).reduce((n, g) => n + g.sessions, 0) : s.sessions;
}

function locksTotal(s) {
  return groupCount(s) > 1 ? groupStatus(s).reduce((n, g) => n + g.locks, 0) : s.locks;
}

function renderGroups(s) {
  $("groups-section").hidden = groupCount(s) <= 1;
  const rows = groupStatus(s).map((g) => {
    const leader = g.leader_id === null ? "none known"
      : g.leader_id === s.id ? `member ${g.leader_id} (this node)`
      : `member ${g.leader_id}${g.leader_addr ? ` at ${g.leader_addr}` : ""}`;
    const attrs = { "data-group": g.group };
    if (g.role === "leader") attrs.class = "leader";
    return row([String(g.group), g.role, leader, g.term, g.last_log_index, g.locks, g.sessions], attrs);
  });
  fill($("groups").tBodies[0], rows);
}

// Every holder (a server from before read-write locks lists `holder` alone).
function holdersOf(lock) {
  if (lock.holders) return lock.holders;
  return lock.holder ? [lock.holder] : [];
}

// The value an election's leader published (a campaign's grant), or undefined: a plain lock.
function leaderValue(lock) {
  const [first] = holdersOf(lock);
  return (lock.mode ?? "exclusive") === "exclusive" && first && typeof first.value === "string" ? first.value : undefined;
}

// How the name is held: "exclusive", "leader" (an election's), "shared by 2 readers",
// "2 of 3 permits"; "" when free.
function modeText(lock) {
  const n = holdersOf(lock).length;
  if (lock.mode === "permits") return `${n} of ${lock.permits} permit${lock.permits === 1 ? "" : "s"}`;
  if (n === 0) return "";
  if (lock.mode === "shared") return `shared by ${n} reader${n === 1 ? "" : "s"}`;
  return leaderValue(lock) === undefined ? "exclusive" : "leader";
}

// Whether a lock-delay runs: the name is granted to nobody until it ends.
function inDelay(lock) {
  return typeof lock.delay_remaining_ms === "number" && holdersOf(lock).length === 0;
}

// What the "held as" cell says of a lock-delay: the running one's end (by this page's clock:
// the server's figure is an estimate for display), or the one a holder's grant asked for;
// "" for none.
function delayText(lock) {
  if (inDelay(lock)) {
    const until = new Date(Date.now() + lock.delay_remaining_ms).toLocaleTimeString();
    return `lock-delay until ${until} (${duration(lock.delay_remaining_ms)} left)`;
  }
  if (typeof lock.lock_delay_ms === "number" && holdersOf(lock).length > 0) {
    return `lock-delay ${duration(lock.lock_delay_ms)} if lost`;
  }
  return "";
}

// The "held as" cell; an election's leader value under it. The value is user input: set as
// text (el), never parsed as HTML. A lock-delay under it too.
function modeCell(lock) {
  const td = el("td", null);
  td.appendChild(el("span", modeText(lock), { "data-mode": lock.mode ?? "exclusive" }));
  const value = leaderValue(lock);
  if (value !== undefined) td.appendChild(el("div", value, { "data-value": "", class: "mono" }));
  const delay = delayText(lock);
  if (delay) td.appendChild(el("div", delay, { "data-delay": "", class: inDelay(lock) ? "delay" : "note" }));
  return td;
}

// One line per holder in a cell: `line(holder)` is its text, `attrs(holder)` its attributes.
function holderLines(holders, line, attrs, empty, cellAttrs) {
  const td = el("td", null, cellAttrs);
  if (holders.length === 0) {
    td.textContent = empty;
    return td;
  }
  for (const h of holders) td.appendChild(el("div", line(h), attrs ? attrs(h) : {}));
  return td;
}

function queueCell(lock) {
  const td = el("td");
  if (lock.waiters === 0) {
    td.textContent = "none";
    return td;
  }
  // Of a read-write lock (a reader holds or waits), each waiter says which it is.
  const rw = lock.mode === "shared" || lock.queue.some((w) => w.mode === "shared");
  const ol = el("ol");
  for (const w of lock.queue) {
    const as = w.mode === "shared" ? ", reader" : rw && w.mode === "exclusive" ? ", writer" : "";
    const text = `session ${w.session}${w.owner ? ` (${owner(w.owner)})` : ""}${as}, waiting ${duration(w.waited_ms)}`;
    ol.appendChild(el("li", text, { "data-waiter": w.session }));
  }
  td.appendChild(ol);
  if (lock.queue.length < lock.waiters) {
    td.appendChild(el("div", `and ${lock.waiters - lock.queue.length} more`, { class: "note" }));
  }
  return td;
}

// A force-release button per grant: per permit, per writer, per batch of readers granted
// together (one token; the API takes all of them); of a running lock-delay, a button that ends
// it (a force-release of the lost grant, `delay_token`).
function adminCell(lock) {
  const td = el("td");
  if (!mayForceRelease()) return td;
  if (inDelay(lock) && lock.delay_token !== undefined) {
    const button = el("button", "end lock-delay", { type: "button", class: "end-delay", "data-release-token": lock.delay_token });
    button.addEventListener("click", () => askForceRelease(lock.name, lock.delay_token, true));
    td.appendChild(el("div")).appendChild(button);
  }
  const tokens = [...new Set(holdersOf(lock).map((h) => h.token))];
  for (const token of tokens) {
    const label = tokens.length > 1 ? `force-release token ${token}` : "force-release";
    const button = el("button", label, { type: "button", class: "force-release", "data-release-token": token });
    button.addEventListener("click", () => askForceRelease(lock.name, token));
    td.appendChild(el("div")).appendChild(button);
  }
  return td;
}

function renderLocks(locks, truncated, elsewhere) {
  const rows = locks.map((lock) => {
    const holders = holdersOf(lock);
    return row([
      el("td", lock.name, { class: "mono" }),
      modeCell(lock),
      holderLines(holders, (h) => String(h.session), (h) => ({ "data-holder": h.session }), inDelay(lock) ? "nobody (lock-delay)" : "free"),
      holderLines(holders, (h) => String(h.token), (h) => ({ "data-token": h.token }), "", { class: "mono" }),
      holderLines(holders, (h) => owner(h.owner), null, ""),
      holderLines(holders, (h) => duration(h.held_for_ms), null, ""),
      queueCell(lock),
      adminCell(lock),
    ], { "data-lock": lock.name });
  });
  fill($("locks").tBodies[0], rows);
  $("locks-note").textContent =
    `${locks.length} lock${locks.length === 1 ? "" : "s"}` +
    (truncated ? " (the list was cut short: narrow the prefix)" : "") +
    (elsewhere.length ? `; not listed here, the locks of group${elsewhere.length === 1 ? "" : "s"} ` +
      `${elsewhere.join(", ")}, which this node cannot reach (see Raft groups)` : "");
}

function renderSessions(locks) {
  const sessions = new Map();
  const entry = (id, o) => {
    if (!sessions.has(id)) sessions.set(id, { owner: o, holds: [], waits: [] });
    return sessions.get(id);
  };
  for (const lock of locks) {
    for (const h of holdersOf(lock)) entry(h.session, h.owner).holds.push(lock.name);
    lock.queue.forEach((w, i) => entry(w.session, w.owner).waits.push(`${lock.name} (#${i + 1})`));
  }
  const rows = [...sessions.entries()]
    .sort((a, b) => a[0] - b[0])
    .map(([id, s]) => row([String(id), owner(s.owner), s.holds.join(", "), s.waits.join(", ")], { "data-session": id }));
  fill($("sessions").tBodies[0], rows);
}

function renderMetrics(s, locks) {
  const held = locks.filter((l) => l.holder).length;
  const waiting = locks.reduce((n, l) => n + l.waiters, 0);
  const longest = locks.reduce((best, l) => (l.waiters > (best ? best.waiters : 0) ? l : best), null);
  const facts = [
    ["sessions", sessionsTotal(s)],
    ["locks (in the table)", locksTotal(s)],
    ["locks held (listed)", held],
    ["waiters (listed)", waiting],
    ["longest queue", longest ? `${longest.name}: ${longest.waiters}` : "none"],
    ["commit index - applied index", s.committed_index - s.applied_index],
  ];
  fill($("metrics").tBodies[0], facts.map(([k, v]) => row([el("th", k), el("td", v)], { "data-metric": k })));
}

async function refresh() {
  const status = await get("/v1/cluster/status");
  renderStatus(status);
  const prefix = $("prefix").value;
  const query = `/v1/locks?prefix=${encodeURIComponent(prefix)}`;
  let locks = [];
  let truncated = false;
  const elsewhere = [];
  if (groupCount(status) > 1) {
    // Each group's list is its leader's: a follower forwards the request there (issue #33);
    // a group this node is outside of, or whose leader it cannot forward to (TLS, a
    // certificate's identity), is named instead.
    for (const g of groupStatus(status)) {
      if (g.role === "outside") {
        elsewhere.push(g.group);
        continue;
      }
      let listed;
      try {
        listed = await get(`${query}&group=${g.group}`);
      } catch (e) {
        if (g.role === "leader") throw e;
        elsewhere.push(g.group);
        continue;
      }
      locks = locks.concat(listed.locks);
      truncated = truncated || listed.truncated;
    }
    locks.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  } else {
    const listed = await get(query);
    locks = listed.locks;
    truncated = listed.truncated;
  }
  // The list carries the first few waiters of each queue; describe fills in the rest.
  const cut = locks.filter((l) => l.queue.length < l.waiters).slice(0, DESCRIBES_PER_REFRESH_MAX);
  for (const lock of cut) {
    const described = await get(`/v1/lock?name=${encodeURIComponent(lock.name)}`);
    lock.queue = described.lock.queue;
    lock.waiters = described.lock.waiters;
  }
  renderLocks(locks, truncated, elsewhere);
  renderSessions(locks);
  renderMetrics(status, locks);
}

async function loop() {
  try {
    await refresh();
    $("error").textContent = "";
    $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
  } catch (e) {
    const why = e instanceof ApiError ? e.message : `cannot reach the node: ${e.message}`;
    $("error").textContent = `${why} (the tables show the last refresh that worked)`;
  }
  setTimeout(loop, REFRESH_MS);
}

$("token").value = sessionStorage.getItem(TOKEN_KEY) || "";
$("auth").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = $("token").value.trim();
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
});
$("release").addEventListener("submit", forceRelease);
$("release-cancel").addEventListener("click", () => {
  $("release").hidden = true;
});
loop();
