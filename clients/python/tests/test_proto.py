"""The shipped latchkey_pb2 matches crates/proto/proto/latchkey.proto (regenerate with
clients/python/gen-proto.sh when this fails)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2

from latchkey._proto import latchkey_pb2

PROTO_DIR = Path(__file__).resolve().parents[3] / "crates" / "proto" / "proto"


def test_shipped_stubs_match_the_proto(tmp_path):
    out = tmp_path / "set.bin"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}",
                    f"--descriptor_set_out={out}", "latchkey.proto"], check=True)
    fresh = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    shipped = descriptor_pb2.FileDescriptorProto()
    latchkey_pb2.DESCRIPTOR.CopyToProto(shipped)
    # protoc fills in json_name in a descriptor set; the python_out serialization omits it.
    for message in fresh.message_type:
        for f in message.field:
            f.ClearField("json_name")
    assert shipped == fresh, "regenerate: clients/python/gen-proto.sh"
