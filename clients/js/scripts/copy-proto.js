// Copies the wire API's .proto into the package (proto/), so that the published package is
// self-contained: the client loads it at run time with @grpc/proto-loader. The repository's
// crates/proto/proto/latchkey.proto stays the one source; proto/ is not committed.
"use strict";
const fs = require("node:fs");
const path = require("node:path");
const source = path.join(__dirname, "..", "..", "..", "crates", "proto", "proto", "latchkey.proto");
const target = path.join(__dirname, "..", "proto", "latchkey.proto");
fs.mkdirSync(path.dirname(target), { recursive: true });
fs.copyFileSync(source, target);
