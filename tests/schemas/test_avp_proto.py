"""The generated AVP protobuf module: up to date, wire-identical to the SDK's schema, importable with it."""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

from m2mwire.schemas import avp_pb2

# google.protobuf ships no type information; keep it untyped without per-line ignores.
descriptor_pb2: Any = importlib.import_module("google.protobuf.descriptor_pb2")

ROOT = Path(__file__).resolve().parents[2]
PROTO = "m2mwire/schemas/avp.proto"


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    """Fails when avp.proto changed without `make proto` (or with another grpcio-tools version)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            ".",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            PROTO,
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=60,
    )
    for name in ("avp_pb2.py", "avp_pb2.pyi"):
        fresh = (tmp_path / "m2mwire" / "schemas" / name).read_text()
        committed = (ROOT / "m2mwire" / "schemas" / name).read_text()
        assert committed == fresh, f"m2mwire/schemas/{name} is stale: run `make proto`"


def _gencode_version() -> tuple[int, int, int]:
    text = (ROOT / "m2mwire" / "schemas" / "avp_pb2.py").read_text()
    m = re.search(
        r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),",
        text,
    )
    assert m is not None
    return int(m[1]), int(m[2]), int(m[3])


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def test_declared_protobuf_range_admits_the_generated_code() -> None:
    """protobuf refuses gencode newer than the runtime: pyproject's lower bound must cover it."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if re.match(r"protobuf\b", d))
    lower = re.search(r">=\s*([\d.]+)", spec)
    upper = re.search(r"<\s*([\d.]+)", spec)
    assert lower is not None and upper is not None, spec
    gencode = _gencode_version()
    assert _version(lower[1]) >= gencode, f"{spec!r} admits runtimes older than the gencode {gencode}"
    assert _version(upper[1]) > gencode
    assert _version(importlib.metadata.version("protobuf")) >= gencode


def _fields(message: Any) -> list[tuple[Any, ...]]:
    return [
        (f.name, f.number, f.label, f.type, f.type_name.rsplit(".", 1)[-1], f.proto3_optional, f.oneof_index)
        for f in message.field
    ]


def _file(module: Any) -> Any:
    fd = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(fd)
    return fd


def test_schema_is_wire_identical_to_the_sdk() -> None:
    from avp import avp_pb2 as sdk_pb2

    ours, theirs = _file(avp_pb2), _file(sdk_pb2)
    assert ours.syntax == theirs.syntax == "proto3"
    assert [m.name for m in ours.message_type] == [m.name for m in theirs.message_type]
    for a, b in zip(ours.message_type, theirs.message_type, strict=True):
        assert _fields(a) == _fields(b)
        assert [o.name for o in a.oneof_decl] == [o.name for o in b.oneof_decl]
        assert [(r.start, r.end) for r in a.reserved_range] == [(r.start, r.end) for r in b.reserved_range]
        assert [(n.name, _fields(n), n.options.map_entry) for n in a.nested_type] == [
            (n.name, _fields(n), n.options.map_entry) for n in b.nested_type
        ]
    enums_theirs = {e.name: [(v.name, v.number) for v in e.value] for e in theirs.enum_type}
    # The SDK's descriptor still lists PayloadType EMBEDDING = 2, which its decoder rejects.
    enums_theirs["PayloadType"].remove(("EMBEDDING", 2))
    assert {e.name: [(v.name, v.number) for v in e.value] for e in ours.enum_type} == enums_theirs


def test_metadata_fields_as_specified() -> None:
    md = avp_pb2.Metadata.DESCRIPTOR
    numbers = {f.name: f.number for f in md.fields}
    assert numbers == {
        "session_id": 1,
        "source_agent_id": 2,
        "target_agent_id": 3,
        "model_id": 4,
        "hidden_dim": 5,
        "num_layers": 6,
        "payload_type": 7,
        "dtype": 8,
        "tensor_shape": 9,
        "mode": 10,
        "compression": 11,
        "avp_map_id": 13,
        "extra": 14,
        "payload_checksum": 15,
    }
    assert md.fields_by_name["compression"].has_presence
    assert md.fields_by_name["payload_checksum"].has_presence
    assert not md.fields_by_name["hidden_dim"].has_presence
    assert avp_pb2.DataType.Value("INT8") == 3
    assert avp_pb2.CommunicationMode.Value("JSON_MODE") == 1


IMPORT_BOTH = """
import importlib, sys
first, second = sys.argv[1:]
a = importlib.import_module(first)
b = importlib.import_module(second)
from avp import avp_pb2 as sdk
from m2mwire.schemas import avp_pb2 as ours
assert sdk.DESCRIPTOR.name == "avp.proto" and ours.DESCRIPTOR.name == "m2mwire/schemas/avp.proto"
m = ours.Metadata(model_id="x", payload_checksum=1).SerializeToString()
assert sdk.Metadata.FromString(m).model_id == "x"
print("ok")
"""


def test_importable_together_with_the_sdk_in_either_order() -> None:
    for order in (("avp", "m2mwire.schemas.avp_pb2"), ("m2mwire.schemas.avp_pb2", "avp")):
        out = subprocess.run(
            [sys.executable, "-c", IMPORT_BOTH, *order], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "ok"
