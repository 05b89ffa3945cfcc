// Drives the web page in a real headless chromium for crates/cli/tests/web_ui.rs: read-write
// locks, semaphores and elections (docs/primitives.md).
//
//   node primitives.mjs URL EXPECTED_JSON SHOT_DIR
//
// EXPECTED_JSON: [{"lock": NAME, "mode": TEXT, "holders": [[SESSION, TOKEN], ...],
// "waiters": [TEXT, ...], "value": VALUE?, "delay": REGEX?}, ...]. Loads URL (a node's /ui) and waits until each
// NAME's row says it is held as TEXT (the "held as" cell: "shared by 2 readers", "2 of 3
// permits", "leader"), an election's leader VALUE shown as text (it is user input: no element
// of its markup may be in the row, and no script of it may have run: window.__pwned), lists
// every holder, one line each, with its session and token in that order, and shows its
// waiters, each line including its TEXT ("writer"), and a lock-delay line matching REGEX
// (a running one: "lock-delay until <time> (<remaining> left)"), or none without REGEX; takes SHOT_DIR/held.png and prints
// "shown". Then, for each NAME with "end_delay": REASON, clicks its "end lock-delay" button (one
// for a running delay, none otherwise), gives REASON, confirms, waits for the page to say it
// force-released NAME, and prints "ended". Then waits for the line "released" on stdin, waits until every NAME's row is gone,
// takes SHOT_DIR/released.png and prints "gone". Every wait is bounded; on a failure it takes
// SHOT_DIR/failure.png, prints the reason on stderr and exits 1. Errors of the page's own
// script fail the run too.
import { chromium } from "playwright-core";
import { createInterface } from "node:readline";
import { join } from "node:path";

const WAIT_MS = 20_000;
const [url, expectedJson, shots] = process.argv.slice(2);
if (!shots) {
  console.error("usage: node primitives.mjs URL EXPECTED_JSON SHOT_DIR");
  process.exit(2);
}
const expected = JSON.parse(expectedJson);
const stdinLines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

const browser = await chromium.launch({
  executablePath: process.env.LATCHKEY_CHROMIUM || "/usr/bin/chromium",
});
const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
const pageErrors = [];
page.on("pageerror", (e) => pageErrors.push(String(e)));
page.on("console", (m) => {
  if (m.type() === "error") pageErrors.push(`console: ${m.text()}`);
});

// What the page shows of each lock: null for a lock without a row.
function rows(names) {
  return names.map((name) => {
    const row = [...document.querySelectorAll("#locks tbody tr")].find((r) => r.dataset.lock === name);
    if (!row) return null;
    return {
      lock: name,
      mode: row.querySelector("[data-mode]").textContent,
      holders: [...row.querySelectorAll("[data-holder]")].map((h, i) =>
        [Number(h.textContent), Number(row.querySelectorAll("[data-token]")[i].textContent)]),
      waiters: [...row.querySelectorAll("[data-waiter]")].map((w) => w.textContent),
      buttons: row.querySelectorAll("button.force-release").length,
      endDelay: row.querySelectorAll("button.end-delay").length,
      value: row.querySelector("[data-value]")?.textContent ?? null,
      delay: row.querySelector("[data-delay]")?.textContent ?? null,
      // Elements a value's markup would have made, had the page parsed it as HTML.
      injected: row.querySelectorAll("img, script, iframe, object, embed").length,
      pwned: window.__pwned ?? null,
    };
  });
}

function matches(shown, want) {
  return shown !== null && shown.mode === want.mode &&
    (want.value === undefined || shown.value === want.value) &&
    (want.delay === undefined ? shown.delay === null : shown.delay !== null && new RegExp(want.delay).test(shown.delay)) &&
    JSON.stringify(shown.holders) === JSON.stringify(want.holders) &&
    shown.waiters.length === want.waiters.length &&
    want.waiters.every((text, i) => shown.waiters[i].includes(text));
}

async function step(what, fn) {
  try {
    return await fn();
  } catch (e) {
    await page.screenshot({ path: join(shots, "failure.png"), fullPage: true }).catch(() => {});
    const shown = await page.evaluate(() => document.body.innerText).catch(() => "?");
    console.error(`${what}: ${e.message}\npage errors: ${JSON.stringify(pageErrors)}\nthe page showed:\n${shown}`);
    await browser.close();
    process.exit(1);
  }
}

function noPageErrors() {
  if (pageErrors.length) throw new Error(`the page's script failed: ${pageErrors.join("; ")}`);
}

// Polls the page (every 100 ms, for at most WAIT_MS) until `ok(rows)` holds.
async function until(ok) {
  const names = expected.map((e) => e.lock);
  const deadline = Date.now() + WAIT_MS;
  let shown = null;
  while (Date.now() < deadline) {
    shown = await page.evaluate(rows, names);
    if (ok(shown)) return shown;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`not within ${WAIT_MS} ms; the rows were ${JSON.stringify(shown)}`);
}

await step("loading the page", async () => {
  await page.goto(url, { timeout: WAIT_MS });
  noPageErrors();
});

await step(`waiting for ${expectedJson}`, async () => {
  const shown = await until((rs) => rs.every((r, i) => matches(r, expected[i])));
  // A force-release button per grant (no access control: the viewer may).
  for (const r of shown) {
    if (r.injected !== 0 || r.pwned !== null) {
      throw new Error(`${r.lock}: a value's markup came to life (${r.injected} elements, window.__pwned=${r.pwned})`);
    }
    const tokens = new Set(r.holders.map(([, token]) => token)).size;
    if (r.buttons !== tokens) throw new Error(`${r.lock}: ${r.buttons} force-release buttons for ${tokens} tokens`);
    const running = r.holders.length === 0 && r.delay !== null;
    if (r.endDelay !== (running ? 1 : 0)) throw new Error(`${r.lock}: ${r.endDelay} end-lock-delay buttons`);
  }
  noPageErrors();
  await page.screenshot({ path: join(shots, "held.png"), fullPage: true });
});
console.log("shown");

for (const want of expected.filter((e) => e.end_delay !== undefined)) {
  await step(`ending ${want.lock}'s lock-delay`, async () => {
    await page.click(`#locks tbody tr[data-lock="${want.lock}"] button.end-delay`, { timeout: WAIT_MS });
    await page.fill("#release-reason", want.end_delay, { timeout: WAIT_MS });
    await page.click("#release-confirm", { timeout: WAIT_MS });
    await page.waitForFunction(
      (name) => document.getElementById("release-result").textContent.startsWith(`ended the lock-delay of ${name} `),
      want.lock, { timeout: WAIT_MS });
    noPageErrors();
  });
}
if (expected.some((e) => e.end_delay !== undefined)) console.log("ended");

await step("waiting for the test to release the locks", async () => {
  const line = await stdinLines.next();
  if (line.done || line.value.trim() !== "released") throw new Error(`expected "released", read ${JSON.stringify(line.value)}`);
});

await step("waiting for the rows to go", async () => {
  await until((rs) => rs.every((r) => r === null));
  noPageErrors();
  await page.screenshot({ path: join(shots, "released.png"), fullPage: true });
});
console.log("gone");
await browser.close();
process.exit(0);
