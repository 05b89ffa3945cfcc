// Drives the web page in a real headless chromium for crates/cli/tests/web_ui.rs.
//
//   node check.mjs URL LOCK TOKEN OWNER SHOT_DIR
//
// Loads URL (a node's /ui), waits until the page shows LOCK held with TOKEN, the owner text
// OWNER (as literal text: it is markup on purpose) and one waiter, takes SHOT_DIR/held.png,
// prints "shown"; then waits for the line "released" on stdin, waits until LOCK's row is gone,
// takes SHOT_DIR/released.png and prints "gone". Every wait is bounded; on a failure it takes
// SHOT_DIR/failure.png, prints the reason on stderr and exits 1. Errors of the page's own
// script fail the run too.
//
// With LATCHKEY_UI_TOKEN set (a node with --acl), it first waits for the page to show the
// API's "unauthenticated" error, then types the token into the page's field.
//
// With LATCHKEY_UI_GROUPS=N (a member of a cluster of N Raft groups, which leads LOCK's group
// but not every group), it waits for the page's "Raft groups" table to show the N groups, this
// node leading some and not all, and for the locks note to name no group as not listed (a
// follower's page lists every group's locks through forwarding, issue #33), instead of
// waiting for this node to lead group 0. With LATCHKEY_UI_ALSO=NAME too
// (a held lock of another group this node leads), it waits for NAME's row, held, before LOCK's
// (the page lists the groups it leads in name order).
//
// With LATCHKEY_UI_FORCE_RELEASE=REASON, after "shown" it clicks LOCK's force-release button,
// types REASON and confirms. With LATCHKEY_UI_EXPECT=denied it then waits for the page to show
// the API's "permission-denied" with LOCK still held, takes SHOT_DIR/denied.png, prints "denied"
// and goes on as above; else it waits until LOCK's row no longer shows TOKEN (the waiter may
// take it, then release it), takes SHOT_DIR/forced.png and prints "gone".
import { chromium } from "playwright-core";
import { createInterface } from "node:readline";
import { join } from "node:path";

const WAIT_MS = 20_000;
const [url, lock, token, ownerText, shots] = process.argv.slice(2);
if (!shots) {
  console.error("usage: node check.mjs URL LOCK TOKEN OWNER SHOT_DIR");
  process.exit(2);
}
const stdinLines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

const browser = await chromium.launch({
  executablePath: process.env.LATCHKEY_CHROMIUM || "/usr/bin/chromium",
});
const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
const bearer = process.env.LATCHKEY_UI_TOKEN;
const forceReason = process.env.LATCHKEY_UI_FORCE_RELEASE;
const expectDenied = process.env.LATCHKEY_UI_EXPECT === "denied";
const groups = Number(process.env.LATCHKEY_UI_GROUPS || "0");
const also = process.env.LATCHKEY_UI_ALSO;
const pageErrors = [];
page.on("pageerror", (e) => pageErrors.push(String(e)));
page.on("console", (m) => {
  // Before it has the token, the API answers the page 401, as it should.
  const expected = (bearer && m.text().includes("status of 401")) ||
    (expectDenied && m.text().includes("status of 403"));
  if (m.type() === "error" && !expected) pageErrors.push(`console: ${m.text()}`);
});

// What the page shows of LOCK: null when it has no row.
function lockRow([name]) {
  const row = [...document.querySelectorAll("#locks tbody tr")].find((r) => r.dataset.lock === name);
  if (!row) return null;
  // The first holder's token (each holder has a line of its own); "" when free.
  const token = row.querySelector("[data-token]");
  return {
    token: token ? token.textContent : "",
    text: row.textContent,
    waiters: row.querySelectorAll("[data-waiter]").length,
    elements: row.querySelectorAll("b, img, script").length,
  };
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

await step("loading the page", async () => {
  await page.goto(url, { timeout: WAIT_MS });
  if (bearer) {
    await page.waitForFunction(() => document.getElementById("error").textContent.startsWith("unauthenticated"),
      null, { timeout: WAIT_MS });
    await page.fill("#token", bearer);
    await page.click("#token-save");
  }
  if (groups) {
    await page.waitForFunction((n) => {
      const rows = [...document.querySelectorAll("#groups tbody tr")];
      const led = rows.filter((r) => r.classList.contains("leader")).length;
      return !document.getElementById("groups-section").hidden && rows.length === n &&
        led > 0 && led < n && !document.getElementById("locks-note").textContent.includes("not listed here");
    }, groups, { timeout: WAIT_MS });
    if (also) {
      await page.waitForFunction(([name, other]) => {
        const names = [...document.querySelectorAll("#locks tbody tr")].map((r) => r.dataset.lock);
        const row = [...document.querySelectorAll("#locks tbody tr")].find((r) => r.dataset.lock === other);
        return row && row.querySelector("[data-token]") !== null &&
          names.indexOf(other) >= 0 && names.indexOf(name) > names.indexOf(other);
      }, [lock, also], { timeout: WAIT_MS });
    }
  } else {
    await page.waitForFunction(() => {
      const role = document.querySelector('#node [data-fact="role"] td');
      return role && role.textContent === "leader";
    }, null, { timeout: WAIT_MS });
  }
  noPageErrors();
});

// Polls the page (every 100 ms, for at most WAIT_MS) until `ok(row)` holds for LOCK's row.
async function untilRow(ok) {
  const deadline = Date.now() + WAIT_MS;
  let row = null;
  while (Date.now() < deadline) {
    row = await page.evaluate(lockRow, [lock]);
    if (ok(row)) return row;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`not within ${WAIT_MS} ms; the row was ${JSON.stringify(row)}`);
}

await step(`waiting for ${lock} held with token ${token}, owner ${ownerText} and one waiter`, async () => {
  const row = await untilRow((r) => r && r.token === token && r.text.includes(ownerText) && r.waiters === 1);
  if (row.elements !== 0) throw new Error(`server text became markup in the page: ${JSON.stringify(row)}`);
  noPageErrors();
  await page.screenshot({ path: join(shots, "held.png"), fullPage: true });
});
console.log("shown");

if (forceReason) {
  await step(`force-releasing ${lock} from the page`, async () => {
    const button = page.locator(`#locks tbody tr[data-lock="${lock}"] button.force-release`);
    await button.click({ timeout: WAIT_MS });
    await page.fill("#release-reason", forceReason, { timeout: WAIT_MS });
    await page.click("#release-confirm", { timeout: WAIT_MS });
  });
  if (expectDenied) {
    await step("waiting for the page to show the refusal", async () => {
      await page.waitForFunction(() => document.getElementById("release-error").textContent.startsWith("permission-denied"),
        null, { timeout: WAIT_MS });
      const row = await page.evaluate(lockRow, [lock]);
      if (!row || row.token !== token) throw new Error(`the lock should still be held: ${JSON.stringify(row)}`);
      noPageErrors();
      await page.screenshot({ path: join(shots, "denied.png"), fullPage: true });
    });
    console.log("denied");
  } else {
    await step(`waiting for ${lock}'s row to lose token ${token}`, async () => {
      await untilRow((r) => r === null || r.token !== token);
      noPageErrors();
      await page.screenshot({ path: join(shots, "forced.png"), fullPage: true });
    });
    console.log("gone");
    await browser.close();
    process.exit(0);
  }
}

await step("waiting for the test to release the lock", async () => {
  const line = await stdinLines.next();
  if (line.done || line.value.trim() !== "released") throw new Error(`expected "released", read ${JSON.stringify(line.value)}`);
});

await step(`waiting for ${lock}'s row to go`, async () => {
  await untilRow((r) => r === null);
  noPageErrors();
  await page.screenshot({ path: join(shots, "released.png"), fullPage: true });
});
console.log("gone");
await browser.close();
process.exit(0);
