#!/usr/bin/env bash
# The Node client's CI: a real install from the npm registry (package-lock.json), the build
# (tsc, the .proto copied into the package), and the tests against real `latchkey serve`
# processes ($LATCHKEY_BIN, default: the repository's target/debug/latchkey, built beforehand).
set -euo pipefail
cd "$(dirname "$0")"
export LATCHKEY_BIN="${LATCHKEY_BIN:-$(cd ../.. && pwd)/target/debug/latchkey}"
if [[ ! -x "$LATCHKEY_BIN" ]]; then
  echo "clients/js/ci.sh: no server binary at $LATCHKEY_BIN (cargo build -p latchkey-cli, or set LATCHKEY_BIN)" >&2
  exit 1
fi
node -e 'const [major] = process.versions.node.split(".").map(Number); if (major < 20) { console.error(`Node ${process.version}: need 20 or newer`); process.exit(1); }'
npm ci --no-audit --no-fund
npm run build
npm test
# The package as a user installs it: packed, installed in a fresh project, compiled strict.
scripts/check-package.sh
