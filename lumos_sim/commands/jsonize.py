"""`lumos-sim jsonize`: dump a Chakra `.et` file as one JSON document, message by message.

Output: {"metadata": {"version", "attrs", "attr_types"}, "nodes": [{"id", "name", "type", "ctrl_deps",
"data_deps", "start_time_micros", "duration_micros", "inputs", "outputs", "attrs", "attr_types"}, ...]}.
`attrs` maps names to values; `attr_types` names the protobuf oneof member each value was stored in
(what ASTRA-sim's feeder is sensitive to). The file is streamed: memory stays flat however big it is.
"""
from __future__ import annotations

import base64
import sys
import tempfile
from typing import Any, BinaryIO

import orjson

from chakra_schema.et_io import iter_et
from chakra_schema.graph import NodeType
from chakra_schema.graph_io import attr_to_value
from chakra_schema.safe_io import atomic_output, refuse_overwriting_inputs


def register(sub) -> None:
    p = sub.add_parser("jsonize", help="dump a Chakra .et file as JSON",
                       description="Write a Chakra .et (or .et.gz) file as one JSON document "
                                   '{"metadata": ..., "nodes": [...]}.')
    p.add_argument("file", metavar="FILE.et", help="the .et (or .et.gz) file to write as JSON")
    p.add_argument("-o", "--output", metavar="OUT.json", help="write here (atomically) instead of stdout")
    p.set_defaults(func=main)


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [base64.b64encode(v).decode() for v in value]
    return value


def _attrs(attrs) -> tuple[dict, dict]:
    values, types = {}, {}
    for a in attrs:
        values[a.name] = _json_value(attr_to_value(a))
        types[a.name] = a.WhichOneof("value")
    return values, types


def _io(io) -> dict:
    return {"values": io.values, "shapes": io.shapes, "types": io.types}


def _type_name(t: int) -> str:
    try:
        return NodeType(t).name
    except ValueError:
        return str(t)


def write_json(path: str, out: BinaryIO) -> int:
    """Stream the file as JSON into `out`; returns the number of nodes."""
    messages = iter_et(path)
    md = next(messages)
    values, types = _attrs(md.attr)
    out.write(b'{"metadata":')
    out.write(orjson.dumps({"version": md.version, "attrs": values, "attr_types": types}))
    out.write(b',"nodes":[')
    n = 0
    for node in messages:
        values, types = _attrs(node.attr)
        doc = {
            "id": node.id, "name": node.name, "type": _type_name(node.type),
            "ctrl_deps": list(node.ctrl_deps), "data_deps": list(node.data_deps),
            "start_time_micros": node.start_time_micros, "duration_micros": node.duration_micros,
            "inputs": _io(node.inputs) if node.HasField("inputs") else None,
            "outputs": _io(node.outputs) if node.HasField("outputs") else None,
            "attrs": values, "attr_types": types,
        }
        if n:
            out.write(b",")
        out.write(b"\n")
        out.write(orjson.dumps(doc))
        n += 1
    out.write(b"\n]}\n")
    return n


def main(args) -> int:
    if not args.output:
        # parse fully before printing anything would need the whole file in memory; instead buffer to a
        # temp file so a bad input still prints nothing but the one-line error
        with tempfile.TemporaryFile() as tmp:
            write_json(args.file, tmp)
            tmp.seek(0)
            out = sys.stdout.buffer
            while chunk := tmp.read(1 << 20):
                out.write(chunk)
            out.flush()
        return 0
    refuse_overwriting_inputs(args.output, [args.file])
    with atomic_output(args.output) as f:
        n = write_json(args.file, f)
    from lumos_sim.tables import say
    say(f"wrote {args.output} ({n} nodes)")
    return 0
