#!/usr/bin/env bash
# The package as a user gets it (issue #33): `npm pack` here, then, in a fresh project outside
# the repository, an install of the tarball and of today's TypeScript and @types/node from the
# registry, and a strict compile WITHOUT skipLibCheck of a program against it (the package's
# own .d.ts files are checked too), which then runs. The same tarball is packed again from an
# unpacked copy outside the repository (proto/ is kept).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$here"
tarball="$(npm pack --silent --pack-destination "$work" | tail -1)"
mkdir "$work/app"
cd "$work/app"
npm init -y >/dev/null
npm install --silent --no-audit --no-fund "$work/$tarball" typescript @types/node
cat > main.ts <<'TS'
import { Client, TransportError, limits } from "latchkey";

async function main(): Promise<void> {
  // No server: a typed error within the fail-fast budget, which proves the package loads and
  // runs (its .proto, its gRPC stack).
  const client = new Client(["127.0.0.1:1"], { retry: { unreachableMaxMs: 200 } });
  try {
    await client.lock("jobs/x", { wait: 1000 });
    throw new Error("locked with no server");
  } catch (e) {
    if (!(e instanceof TransportError)) throw e;
    console.log(`package ok: ${e.message} (limit ${limits.CLIENT_UNREACHABLE_MS_MAX} ms)`);
  } finally {
    await client.close();
  }
}
main().catch((e) => {
  console.error(e);
  process.exit(1);
});
TS
cat > tsconfig.json <<'JSON'
{
  "compilerOptions": {
    "target": "ES2022",
    "module": "commonjs",
    "strict": true,
    "skipLibCheck": false,
    "esModuleInterop": true,
    "outDir": "out"
  },
  "files": ["main.ts"]
}
JSON
npx tsc -p .
node out/main.js
# Packed again from an unpacked copy, outside the repository.
mkdir "$work/copy"
tar -xzf "$work/$tarball" -C "$work/copy"
cd "$work/copy/package"
cp "$here/package-lock.json" "$here/tsconfig.json" . && cp -r "$here/src" "$here/scripts" .
npm ci --silent --no-audit --no-fund
npm pack --silent --pack-destination "$work/copy" >/dev/null
echo "check-package: packed, installed, compiled strict without skipLibCheck, ran, repacked from a copy"
