// Cross-site requests from a real headless chromium for crates/cli/tests/web_ui.rs: a web page
// of another origin than the node's tries to write to the node's HTTP API, as any page a user
// of the node opens could (issue #31 item 3).
//
//   node cross_site.mjs PLAN
//
// PLAN is JSON: {"node": "http://127.0.0.1:PORT", "targets": [{"path", "body"}, ...]} (body:
// the JSON object a forged request sends to path). The script serves an empty page of its own
// on a free 127.0.0.1 port and opens it under two origins: http://127.0.0.1:PORT2 (another
// port of the node's host: another origin of the same site) and http://localhost:PORT2 (another
// site: a name, where the node is an address). From each, against each target, the page
// submits a form into a frame with enctype text/plain (its one field's name and value spelling
// the JSON body around the '=' the encoding puts between them, where a string of the body
// allows it), application/x-www-form-urlencoded and multipart/form-data, then calls fetch with
// mode no-cors (Content-Type text/plain, the JSON body), mode cors with text/plain (no
// preflight) and mode cors with application/json (preflighted). With LATCHKEY_UI_CERT and
// LATCHKEY_UI_KEY (PEM files) the browser presents that client certificate to the node (an
// https:// node), as a browser holding an operator's certificate does; with
// "status_needs_identity" in PLAN it first checks that the node answers its GET of
// /v1/cluster/status (under --acl only an identity is answered).
//
// It prints one JSON line: {"attempts": [{origin, path, kind, outcome}], "responses":
// [{method, url, status, code}]}: every answer of the node the browser received, with its JSON
// error's code where the browser lets it be read (a preflighted request the node did not allow
// is never sent); then it exits 0. On a failure it prints the reason on stderr and exits 1.
// Every wait is bounded.
import { chromium } from "playwright-core";
import { createServer } from "node:http";

const WAIT_MS = 20_000;
const plan = JSON.parse(process.argv[2] || "null");
if (!plan || !plan.node || !Array.isArray(plan.targets)) {
  console.error("usage: node cross_site.mjs '{\"node\": URL, \"targets\": [{\"path\", \"body\"}]}'");
  process.exit(2);
}

const attacker = createServer((req, res) => {
  res.writeHead(200, { "Content-Type": "text/html; charset=utf-8" });
  res.end("<!doctype html><title>a page of another origin</title><body></body>");
});
await new Promise((resolve) => attacker.listen(0, "127.0.0.1", resolve));
const port = attacker.address().port;
const origins = [`http://127.0.0.1:${port}`, `http://localhost:${port}`];

const browser = await chromium.launch({
  executablePath: process.env.LATCHKEY_CHROMIUM || "/usr/bin/chromium",
});
const contextOptions = { ignoreHTTPSErrors: true };
if (process.env.LATCHKEY_UI_CERT) {
  contextOptions.clientCertificates = [{
    origin: plan.node,
    certPath: process.env.LATCHKEY_UI_CERT,
    keyPath: process.env.LATCHKEY_UI_KEY,
  }];
}
const context = await browser.newContext(contextOptions);
const page = await context.newPage();
const responses = [];
const bodies = [];
page.on("response", (r) => {
  if (!r.url().startsWith(plan.node)) return;
  const entry = { method: r.request().method(), url: r.url(), status: r.status() };
  responses.push(entry);
  // The error's code; an opaque answer (a no-cors fetch) has no body to read.
  bodies.push(r.text().then((t) => { entry.code = JSON.parse(t).code; }, () => {}));
});

async function fail(what, e) {
  console.error(`${what}: ${e && e.stack || e}`);
  await browser.close();
  attacker.close();
  process.exit(1);
}

// The text/plain form: the field's name and value joined by '=' spell the body, the '=' inside
// the body's last string (the body must end with `"}`), or null when no string ends the body.
function plainFormField(body) {
  const text = JSON.stringify(body);
  if (!text.endsWith('"}')) return null;
  return { name: text.slice(0, -2), value: '"}' };
}

// In the attacker's page: one attempt, resolving to what the page could tell of it.
async function attempt(kind, url, body, field) {
  if (kind.startsWith("form")) {
    const enctype = kind.slice("form ".length);
    const frame = document.createElement("iframe");
    frame.name = `f${Math.random().toString(36).slice(2)}`;
    document.body.appendChild(frame);
    const form = document.createElement("form");
    form.method = "POST";
    form.action = url;
    form.enctype = enctype;
    form.target = frame.name;
    const input = document.createElement("input");
    input.type = "hidden";
    if (enctype === "text/plain" && field) {
      input.name = field.name;
      input.value = field.value;
    } else {
      input.name = "json";
      input.value = JSON.stringify(body);
    }
    form.appendChild(input);
    document.body.appendChild(form);
    const loaded = new Promise((resolve) => frame.addEventListener("load", () => resolve("submitted"), { once: true }));
    form.submit();
    return await Promise.race([loaded, new Promise((resolve) => setTimeout(() => resolve("no load event"), 10_000))]);
  }
  const init = {
    "fetch no-cors": { mode: "no-cors", headers: { "Content-Type": "text/plain" } },
    "fetch cors text/plain": { mode: "cors", headers: { "Content-Type": "text/plain" } },
    "fetch cors json": { mode: "cors", headers: { "Content-Type": "application/json" } },
  }[kind];
  try {
    const r = await fetch(url, { method: "POST", body: JSON.stringify(body), credentials: "include", ...init });
    return r.type === "opaque" ? "opaque answer" : `readable answer ${r.status}`;
  } catch (e) {
    return `fetch failed: ${e.message}`;
  }
}

if (plan.status_needs_identity) {
  // The node's status needs an identity: answered, the browser presented the certificate.
  try {
    const status = await page.goto(`${plan.node}/v1/cluster/status`, { timeout: WAIT_MS });
    if (status.status() !== 200) throw new Error(`answered ${status.status()}: ${await status.text()}`);
  } catch (e) {
    await fail("reading the node's status with the client certificate", e);
  }
}

const kinds = [
  "form text/plain",
  "form application/x-www-form-urlencoded",
  "form multipart/form-data",
  "fetch no-cors",
  "fetch cors text/plain",
  "fetch cors json",
];
const attempts = [];
for (const origin of origins) {
  try {
    await page.goto(`${origin}/attack`, { timeout: WAIT_MS });
  } catch (e) {
    await fail(`opening ${origin}/attack`, e);
  }
  for (const { path, body } of plan.targets) {
    for (const kind of kinds) {
      const field = plainFormField(body);
      try {
        // `attempt` runs in the attacker's page: its source, called with this attempt's values.
        const call = [kind, plan.node + path, body, field].map((v) => JSON.stringify(v)).join(", ");
        const outcome = await page.evaluate(`(${attempt.toString()})(${call})`);
        attempts.push({ origin, path, kind, outcome });
      } catch (e) {
        await fail(`${kind} from ${origin} to ${path}`, e);
      }
    }
  }
}
await Promise.all(bodies);
console.log(JSON.stringify({ attempts, responses }));
await browser.close();
attacker.close();
process.exit(0);
