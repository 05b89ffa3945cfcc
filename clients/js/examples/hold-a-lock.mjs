// hold-a-lock.mjs: take a lock, do fenced work while holding it, release it.
import { Client, WaitTimeout } from "latchkey";

const client = new Client([process.env.LATCHKEY_ENDPOINT ?? "127.0.0.1:7420"]);
try {
  // A session of its own (15 s lease, renewed every 5 s); wait up to 30 s in the FIFO queue.
  const guard = await client.lock("jobs/nightly-report", { ttl: 15, wait: 30 });
  try {
    guard.onLost((why) => console.error(`lock may be lost, stopping: ${why}`));
    // Send these headers with every write to the protected resource (it rejects old tokens);
    // pass guard.signal to fetch() so that a write in flight is aborted when the lock is lost.
    console.log("holding", guard.name, "with token", guard.token, guard.fencingHeaders());
  } finally {
    await guard.release(); // releases the lock and closes its session
  }
} catch (e) {
  if (!(e instanceof WaitTimeout)) throw e;
  console.error("someone else holds it; try later");
} finally {
  await client.close();
}
