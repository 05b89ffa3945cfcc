// Copies the wire API's .proto into the package (proto/), so that the published package is
// self-contained: the client loads it at run time with @grpc/proto-loader. The repository's
// crates/proto/proto/latchkey.proto stays the one source; proto/ is not committed.
//
// Outside the repository (a copy of clients/js, e.g. an unpacked tarball being packed again)
// the source is not there: the proto/ copy made by an earlier build is kept, and without one
// the build says where the file comes from.
"use strict";
const fs = require("node:fs");
const path = require("node:path");
const source = path.join(__dirname, "..", "..", "..", "crates", "proto", "proto", "latchkey.proto");
const target = path.join(__dirname, "..", "proto", "latchkey.proto");
if (!fs.existsSync(source)) {
  if (fs.existsSync(target)) {
    console.log(`copy-proto: ${source} is not here (not in the repository); keeping ${target}`);
    process.exit(0);
  }
  console.error(
    `copy-proto: neither ${source} (the repository's wire API) nor ${target} exists: build the ` +
      "package in the repository's clients/js, or copy crates/proto/proto/latchkey.proto to proto/",
  );
  process.exit(1);
}
fs.mkdirSync(path.dirname(target), { recursive: true });
fs.copyFileSync(source, target);
