"""An independent decoder of Chakra `.et` files, written from the wire facts alone.

It uses no protobuf library and imports nothing from the project, so tests can check what our writers
(the `.et` writer, the converters, the workload generators) put on the wire without trusting the code
under test. It reads the whole file into memory: it is a test oracle, not a production reader.

Wire facts used (see shared/reference/chakra-wire-format.md):
- a file is a sequence of varint length prefixes each followed by one protobuf message; the first is
  GlobalMetadata (version=1 string, attr=2 repeated AttributeProto), the rest are Nodes;
- a zero-length message ends the file (Chakra's convention); `1f 8b` at the start means gzip;
- Node: id=1, name=2, type=3, ctrl_deps=4, data_deps=5 (packed or not), start_time_micros=6,
  duration_micros=7, inputs=8, outputs=9 (IOInfo: values=1, shapes=2, types=3), attr=10;
- AttributeProto: name=1, doc_string=2, oneof value in fields 3..32, each `*_list` a message whose
  field 1 is the repeated value.

`decode_et(path) -> (metadata, nodes)`:
  metadata = {"version": str, "attr": [attr...], "attrs": {name: value}}
  node     = {"id", "name", "type", "ctrl_deps", "data_deps", "start_time_micros", "duration_micros",
              "inputs": {"values", "shapes", "types"} or None, "outputs": same,
              "attr": [attr...], "attrs": {name: value}}
  attr     = {"name": str, "doc_string": str, "field": "int64_val" (which oneof member, None if unset),
              "value": decoded Python value (list for *_list)}
"""
from __future__ import annotations

import gzip
import struct
from pathlib import Path

# ------------------------------------------------------------------ low level


class WireError(ValueError):
    """The bytes are not a valid Chakra .et stream."""


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Unsigned LEB128 at `pos` -> (value, new position)."""
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError("varint longer than 10 bytes")


def iter_fields(buf: bytes):
    """Yield (field_number, wire_type, value) of one message; value is an int for varint/fixed wire
    types (raw bits) and bytes for length-delimited fields."""
    pos = 0
    n = len(buf)
    while pos < n:
        key, pos = read_varint(buf, pos)
        field, wtype = key >> 3, key & 7
        if field == 0:
            raise WireError("field number 0")
        if wtype == 0:
            value, pos = read_varint(buf, pos)
        elif wtype == 1:
            if pos + 8 > n:
                raise WireError("truncated fixed64")
            value = struct.unpack_from("<Q", buf, pos)[0]
            pos += 8
        elif wtype == 5:
            if pos + 4 > n:
                raise WireError("truncated fixed32")
            value = struct.unpack_from("<I", buf, pos)[0]
            pos += 4
        elif wtype == 2:
            length, pos = read_varint(buf, pos)
            if pos + length > n:
                raise WireError("truncated length-delimited field")
            value = bytes(buf[pos:pos + length])
            pos += length
        else:
            raise WireError(f"unsupported wire type {wtype}")
        yield field, wtype, value


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _signed32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def _zigzag(v: int) -> int:
    return (v >> 1) ^ -(v & 1)


# Scalar kinds: how to turn the raw wire value into a Python value, and the wire types it can arrive in.
_VARINT, _F64, _F32, _LEN = 0, 1, 5, 2
_SCALARS = {
    "double": (_F64, lambda v: struct.unpack("<d", struct.pack("<Q", v))[0]),
    "float": (_F32, lambda v: struct.unpack("<f", struct.pack("<I", v))[0]),
    "int32": (_VARINT, _signed32),
    "int64": (_VARINT, _signed64),
    "uint32": (_VARINT, lambda v: v & 0xFFFFFFFF),
    "uint64": (_VARINT, lambda v: v),
    "sint32": (_VARINT, _zigzag),
    "sint64": (_VARINT, _zigzag),
    "fixed32": (_F32, lambda v: v),
    "fixed64": (_F64, lambda v: v),
    "sfixed32": (_F32, _signed32),
    "sfixed64": (_F64, _signed64),
    "bool": (_VARINT, lambda v: v != 0),
    "string": (_LEN, lambda v: v.decode("utf-8")),
    "bytes": (_LEN, lambda v: v),
}
# AttributeProto oneof: field 3 = double_val, 4 = double_list, 5 = float_val, ... in this order.
_ATTR_ORDER = ["double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64", "fixed32",
               "fixed64", "sfixed32", "sfixed64", "bool", "string", "bytes"]
ATTR_FIELDS: dict[int, tuple[str, str, bool]] = {}  # field number -> (oneof name, scalar kind, is_list)
for _i, _kind in enumerate(_ATTR_ORDER):
    ATTR_FIELDS[3 + 2 * _i] = (f"{_kind}_val", _kind, False)
    ATTR_FIELDS[4 + 2 * _i] = (f"{_kind}_list", _kind, True)


def _unpack_packed(data: bytes, wire: int) -> list[int]:
    """Raw values of a packed repeated scalar field."""
    out: list[int] = []
    pos = 0
    if wire == _VARINT:
        while pos < len(data):
            v, pos = read_varint(data, pos)
            out.append(v)
    else:
        size, fmt = (8, "<Q") if wire == _F64 else (4, "<I")
        if len(data) % size:
            raise WireError("packed fixed-width field with a partial element")
        out = [struct.unpack_from(fmt, data, p)[0] for p in range(0, len(data), size)]
    return out


def _repeated_scalar(raw_items: list[tuple[int, object]], kind: str) -> list:
    """Decode repeated occurrences of a field (packed and/or unpacked) of scalar `kind`."""
    wire, conv = _SCALARS[kind]
    out = []
    for wtype, value in raw_items:
        if wtype == wire:
            out.append(conv(value))
        elif wtype == _LEN and wire != _LEN:
            out.extend(conv(v) for v in _unpack_packed(value, wire))
        else:
            raise WireError(f"{kind} element with wire type {wtype}")
    return out


# ------------------------------------------------------------------ messages


def decode_attr(buf: bytes) -> dict:
    attr = {"name": "", "doc_string": "", "field": None, "value": None}
    for field, wtype, value in iter_fields(buf):
        if field == 1 and wtype == _LEN:
            attr["name"] = value.decode("utf-8")
        elif field == 2 and wtype == _LEN:
            attr["doc_string"] = value.decode("utf-8")
        elif field in ATTR_FIELDS:
            oneof, kind, is_list = ATTR_FIELDS[field]
            if is_list:
                if wtype != _LEN:
                    raise WireError(f"{oneof} is not a message")
                items = [(w, v) for f, w, v in iter_fields(value) if f == 1]
                decoded = _repeated_scalar(items, kind)
            else:
                decoded = _repeated_scalar([(wtype, value)], kind)[0]
            # a later oneof member replaces an earlier one (protobuf's last-one-wins rule)
            attr["field"], attr["value"] = oneof, decoded
    return attr


def decode_io(buf: bytes) -> dict:
    io = {"values": "", "shapes": "", "types": ""}
    names = {1: "values", 2: "shapes", 3: "types"}
    for field, wtype, value in iter_fields(buf):
        if field in names and wtype == _LEN:
            io[names[field]] = value.decode("utf-8")
    return io


def decode_metadata(buf: bytes) -> dict:
    md = {"version": "", "attr": []}
    for field, wtype, value in iter_fields(buf):
        if field == 1 and wtype == _LEN:
            md["version"] = value.decode("utf-8")
        elif field == 2 and wtype == _LEN:
            md["attr"].append(decode_attr(value))
    md["attrs"] = {a["name"]: a["value"] for a in md["attr"]}
    return md


def decode_node(buf: bytes) -> dict:
    node = {"id": 0, "name": "", "type": 0, "ctrl_deps": [], "data_deps": [], "start_time_micros": 0,
            "duration_micros": 0, "inputs": None, "outputs": None, "attr": []}
    ctrl: list = []
    data: list = []
    for field, wtype, value in iter_fields(buf):
        if field == 1 and wtype == _VARINT:
            node["id"] = value
        elif field == 2 and wtype == _LEN:
            node["name"] = value.decode("utf-8")
        elif field == 3 and wtype == _VARINT:
            node["type"] = _signed32(value)  # enums are int32 on the wire
        elif field == 4:
            ctrl.append((wtype, value))
        elif field == 5:
            data.append((wtype, value))
        elif field == 6 and wtype == _VARINT:
            node["start_time_micros"] = value
        elif field == 7 and wtype == _VARINT:
            node["duration_micros"] = value
        elif field == 8 and wtype == _LEN:
            node["inputs"] = decode_io(value)
        elif field == 9 and wtype == _LEN:
            node["outputs"] = decode_io(value)
        elif field == 10 and wtype == _LEN:
            node["attr"].append(decode_attr(value))
    node["ctrl_deps"] = _repeated_scalar(ctrl, "uint64")
    node["data_deps"] = _repeated_scalar(data, "uint64")
    node["attrs"] = {a["name"]: a["value"] for a in node["attr"]}
    return node


# ------------------------------------------------------------------ files


def split_messages(raw: bytes) -> list[bytes]:
    """Split a decompressed .et stream into its message payloads (stops at a zero-length message)."""
    out: list[bytes] = []
    pos = 0
    while pos < len(raw):
        length, pos = read_varint(raw, pos)
        if length == 0:
            break
        if pos + length > len(raw):
            raise WireError(f"message of {length} bytes at offset {pos} runs past the end")
        out.append(raw[pos:pos + length])
        pos += length
    return out


def read_bytes(path) -> bytes:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return raw


def decode_et(path) -> tuple[dict, list[dict]]:
    """Decode a whole `.et` (or `.et.gz`) file: (metadata, nodes in file order)."""
    messages = split_messages(read_bytes(path))
    if not messages:
        raise WireError(f"{path}: no messages")
    return decode_metadata(messages[0]), [decode_node(m) for m in messages[1:]]
