#!/usr/bin/env bash
# Regenerates the shipped src/latchkey/_proto/latchkey_pb2.py(i) from the repo's .proto.
# Needs grpcio-tools (pip install 'grpcio-tools>=1.85'); tests/test_proto.py checks the result.
# If grpcio-tools' protobuf major version changes, update the protobuf pin in pyproject.toml.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python -m grpc_tools.protoc -I "$here/../../crates/proto/proto" \
    --python_out="$here/src/latchkey/_proto" --pyi_out="$here/src/latchkey/_proto" latchkey.proto
