"""Streaming reader and writer of Chakra `.et` files (protobuf messages with varint length prefixes).

Reading never loads a whole file: `iter_et` reads the stream in 1 MiB chunks, slices out one message at
a time and parses it. Gzip (`1f 8b` at the start) is read transparently. Every defect of the input
raises `TraceInputError(path, problem)` with the byte offset, never a protobuf or zlib traceback.

Writing goes to a temporary file beside the target that is renamed over it only when the `with` block
ends without an exception, so a crash never leaves a half-written trace behind.

Framing facts (shared/reference/chakra-wire-format.md): the first message is `GlobalMetadata`, every
later one a `Node`; a zero-length message is end-of-file for Chakra's reader, so a message that would
serialize to zero bytes (an all-default Node or GlobalMetadata) must never be written.
"""
from __future__ import annotations

import gzip
import os
import tempfile
import zlib
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Union

from google.protobuf import unknown_fields
from google.protobuf.message import DecodeError

from chakra_schema.errors import TraceInputError
from chakra_schema.safe_io import default_permissions, prepare_output
from chakra_schema.et_def_pb2 import GlobalMetadata, Node

__all__ = ["EtWriter", "MAX_MESSAGE_BYTES", "iter_et", "iter_et_messages", "read_et", "GlobalMetadata",
           "Node", "encode_varint"]

PathLike = Union[str, os.PathLike]

MAX_MESSAGE_BYTES = 1 << 30   # protobuf itself refuses messages of 2 GiB; no real node comes near 1 GiB
_CHUNK = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"


# ------------------------------------------------------------------ reading


def _open_stream(path: PathLike) -> BinaryIO:
    """Open `path` for binary reading, decompressing when it starts with the gzip magic."""
    if os.path.isdir(path):
        raise TraceInputError(path, "is a directory, not an .et file")
    try:
        f = open(path, "rb")
    except OSError as e:
        raise TraceInputError(path, f"cannot open: {e.strerror or e}") from None
    head = f.read(2)
    if head == _GZIP_MAGIC:
        f.seek(0)
        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    f.seek(0)
    return f


def _read_chunk(path: PathLike, f: BinaryIO, n: int) -> bytes:
    try:
        return f.read(n)
    except (EOFError, OSError, zlib.error) as e:
        # gzip raises EOFError for a truncated stream, BadGzipFile (OSError) / zlib.error for corruption
        raise TraceInputError(path, f"truncated or corrupt gzip stream: {e}") from None


def iter_et_messages(path: PathLike) -> Iterator[tuple[int, bytes]]:
    """Yield `(offset, payload)` for each length-prefixed message, stopping at a zero-length message or
    at the end of the stream. `offset` is the position of the length prefix in the (decompressed) stream.
    """
    f = _open_stream(path)
    try:
        buf = bytearray()
        pos = 0          # read position inside buf
        base = 0         # stream offset of buf[0]
        eof = False

        def refill(need: int) -> None:
            """Make at least `need` bytes available from `pos` unless the stream ends first."""
            nonlocal buf, pos, base, eof
            if pos:
                del buf[:pos]
                base += pos
                pos = 0
            while len(buf) < need and not eof:
                data = _read_chunk(path, f, max(_CHUNK, need - len(buf)))
                if not data:
                    eof = True
                else:
                    buf += data

        first = True
        while True:
            if len(buf) - pos < 10 and not eof:
                refill(10)
            if pos >= len(buf):
                if first:
                    raise TraceInputError(path, "empty file (no GlobalMetadata)")
                return
            # varint length prefix (unsigned LEB128, at most 10 bytes)
            start = pos
            length = 0
            shift = 0
            while True:
                if pos >= len(buf):
                    raise TraceInputError(path, f"truncated length prefix at byte {base + start}")
                b = buf[pos]
                pos += 1
                length |= (b & 0x7F) << shift
                if not b & 0x80:
                    break
                shift += 7
                if shift >= 70:
                    raise TraceInputError(path, f"corrupt length prefix at byte {base + start}")
            if length == 0:
                if first:
                    raise TraceInputError(path, "first message is empty (no GlobalMetadata)")
                return  # Chakra's end-of-file convention
            if length > MAX_MESSAGE_BYTES:
                raise TraceInputError(path, f"corrupt length prefix at byte {base + start}: "
                                            f"{length} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit")
            if len(buf) - pos < length:
                refill(length)
                if len(buf) - pos < length:
                    raise TraceInputError(path, f"message at byte {base + start} claims {length} bytes but only "
                                                f"{len(buf) - pos} remain (truncated file or corrupt length prefix)")
            yield base + start, bytes(buf[pos:pos + length])
            pos += length
            first = False
    finally:
        f.close()


def _parse_metadata(path: PathLike, payload: bytes) -> GlobalMetadata | None:
    """The file's GlobalMetadata; None when the first message is a Node instead (a file of the older
    Chakra schema, before GlobalMetadata: ASTRA-sim's 2023 example workloads)."""
    try:
        md = GlobalMetadata.FromString(payload)
    except DecodeError:
        md = None
    # A Node parsed as GlobalMetadata usually "succeeds" with unknown fields (id is a varint where
    # version is a string); real metadata has none, and every attribute has a name.
    if md is None or len(unknown_fields.UnknownFieldSet(md)) or any(not a.name for a in md.attr):
        if _is_node(payload):
            return None
        raise TraceInputError(path, "first message is neither a Chakra GlobalMetadata nor a Node (not an .et file?)")
    return md


def _is_node(payload: bytes) -> bool:
    try:
        node = Node.FromString(payload)
    except DecodeError:
        return False
    return bool(node.name) and not len(unknown_fields.UnknownFieldSet(node)) and all(a.name for a in node.attr)


def iter_et(path: PathLike, node_class: type = Node) -> Iterator[GlobalMetadata | Node]:
    """Yield the file's GlobalMetadata, then each Node in file order, parsing one message at a time. A
    file without GlobalMetadata (the older Chakra schema) yields an empty one first.

    `node_class` may be another message class wire-compatible with Node (the graph reader uses a view
    whose attrs stay serialized bytes)."""
    messages = iter_et_messages(path)
    parse = node_class.FromString
    for _offset, payload in messages:
        md = _parse_metadata(path, payload)
        if md is None:
            yield GlobalMetadata()
            yield parse(payload)
        else:
            yield md
        break
    for k, (offset, payload) in enumerate(messages, start=1):
        try:
            yield parse(payload)
        except DecodeError:
            raise TraceInputError(path, f"message {k} at byte {offset} does not parse as a Chakra Node") from None


def read_et(path: PathLike) -> tuple[GlobalMetadata, list[Node]]:
    """Whole-file convenience: (metadata, nodes)."""
    it = iter_et(path)
    md = next(it)
    return md, list(it)  # type: ignore[arg-type]


# ------------------------------------------------------------------ writing


def encode_varint(n: int) -> bytes:
    """Unsigned LEB128."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class EtWriter:
    """Write a `.et` file atomically: metadata first, then nodes.

        with EtWriter("out.0.et", metadata) as w:
            for node in nodes:
                w.write_node(node)

    Gzips when the name ends in `.gz`. The target appears (by rename) only when the block exits
    cleanly; on an exception the temporary file is deleted and the target is left untouched.
    """

    def __init__(self, path: PathLike, metadata: GlobalMetadata | None = None, compresslevel: int = 6):
        self.path = Path(path)
        self._metadata = metadata
        self._compresslevel = compresslevel
        self._tmp: Path | None = None
        self._raw: BinaryIO | None = None
        self._out: BinaryIO | None = None
        self._buf = bytearray()
        self._wrote_metadata = False
        self.nodes_written = 0

    # context manager --------------------------------------------------------
    def __enter__(self) -> "EtWriter":
        parent = prepare_output(self.path).parent
        try:
            fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{self.path.name}.", suffix=".tmp")
        except OSError as e:
            raise TraceInputError(self.path, f"cannot write: {e.strerror or e}") from None
        self._tmp = Path(tmp)
        self._raw = os.fdopen(fd, "wb")
        default_permissions(fd)
        if self.path.name.endswith(".gz"):
            # mtime=0 keeps the output byte-identical across runs
            self._out = gzip.GzipFile(filename="", fileobj=self._raw, mode="wb",
                                      compresslevel=self._compresslevel, mtime=0)  # type: ignore[assignment]
        else:
            self._out = self._raw
        if self._metadata is not None:
            try:
                self.write_metadata(self._metadata)
            except BaseException:  # __exit__ is not called when __enter__ raises
                self._discard()
                raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None and not self._wrote_metadata:
                raise ValueError(f"{self.path}: no GlobalMetadata written")
            if exc_type is None:
                self._flush()
            if self._out is not self._raw and self._out is not None:
                self._out.close()
            if self._raw is not None:
                self._raw.close()
        except BaseException:
            self._discard()
            raise
        if exc_type is not None:
            self._discard()
            return
        os.replace(self._tmp, self.path)  # type: ignore[arg-type]

    def _discard(self) -> None:
        for f in (self._out, self._raw):
            try:
                if f is not None:
                    f.close()
            except Exception:
                pass
        if self._tmp is not None:
            try:
                self._tmp.unlink()
            except FileNotFoundError:
                pass

    # writing ----------------------------------------------------------------
    def _append(self, payload: bytes) -> None:
        self._buf += encode_varint(len(payload))
        self._buf += payload
        if len(self._buf) >= _CHUNK:
            self._flush()

    def _flush(self) -> None:
        if self._buf:
            self._out.write(self._buf)  # type: ignore[union-attr]
            self._buf.clear()

    def write_metadata(self, metadata: GlobalMetadata) -> None:
        if self._out is None:
            raise ValueError("EtWriter must be used as a context manager")
        if self._wrote_metadata:
            raise ValueError(f"{self.path}: GlobalMetadata written twice")
        payload = metadata.SerializeToString()
        if not payload:
            raise ValueError(f"{self.path}: an all-default GlobalMetadata serializes to zero bytes, which "
                             "readers take for end-of-file; set its version")
        self._append(payload)
        self._wrote_metadata = True

    def write_node(self, node: Node) -> None:
        self.write_node_bytes(node.SerializeToString())

    def write_node_bytes(self, payload: bytes) -> None:
        """Write an already serialized Node (the graph writer's fast path)."""
        if not self._wrote_metadata:
            raise ValueError(f"{self.path}: write the GlobalMetadata before any Node")
        if not payload:
            raise ValueError(f"{self.path}: an all-default Node serializes to zero bytes, which readers "
                             "take for end-of-file")
        self._append(payload)
        self.nodes_written += 1

    def write_nodes(self, nodes: Iterable[Node]) -> None:
        for node in nodes:
            self.write_node(node)
