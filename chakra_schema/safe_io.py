"""Safe file I/O shared by every reader and writer: atomic output files and bounded decompression.

- `atomic_output(path)`: write to a temporary file beside the target and rename it into place, so a
  failure (an exception, Ctrl-C, SIGTERM) never leaves a half-written target; the parent directory is
  created as `mkdir -p` would, and the file gets the usual permissions (0666 & ~umask, not mkstemp's 0600).
  OS errors become one-line `TraceInputError`s naming the target.
- `read_input_bytes(path)` / `iter_decompressed(path)`: a file's bytes, gunzipped on the fly when it is
  gzip, refusing input that decompresses to more than `max_input_bytes()` (a gzip bomb would otherwise
  fill memory). The limit is `DEFAULT_MAX_INPUT_BYTES`, or LUMOS_SIM_MAX_INPUT_SIZE, or the CLI's
  `--max-input-size`.
"""
from __future__ import annotations

import os
import tempfile
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator, Union

from chakra_schema.errors import TraceInputError

PathLike = Union[str, os.PathLike]

DEFAULT_MAX_INPUT_BYTES = 4 << 30    # 4 GiB of decompressed JSON per file: above the traces we know of
_BLOCK = 1 << 20
_limit: int | None = None


def max_input_bytes() -> int:
    """The decompressed-size limit for one input file, in bytes."""
    if _limit is not None:
        return _limit
    env = os.environ.get("LUMOS_SIM_MAX_INPUT_SIZE")
    if env:
        try:
            return parse_byte_size(env)
        except ValueError:
            raise TraceInputError(None, f"LUMOS_SIM_MAX_INPUT_SIZE={env!r} is not a size (e.g. 32GiB)") from None
    return DEFAULT_MAX_INPUT_BYTES


def set_max_input_bytes(limit: int | None) -> None:
    """Raise (or lower) the decompressed-size limit; None restores the default."""
    global _limit
    if limit is not None and limit <= 0:
        raise ValueError("the input size limit must be > 0")
    _limit = limit


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}


def parse_byte_size(text: str) -> int:
    """'512MiB', '2GB', '1e9' -> bytes."""
    t = text.strip().upper()
    num = t.rstrip("KMGTIB")
    unit = t[len(num):]
    try:
        value = float(num) * _UNITS[unit]
    except (ValueError, KeyError):
        raise ValueError(f"not a size: '{text}' (e.g. 512MiB, 2GB, 1e9)") from None
    if not 0 < value < 1 << 62:
        raise ValueError(f"size out of range: '{text}'")
    return int(value)


def input_too_large(path: PathLike, limit: int) -> TraceInputError:
    return TraceInputError(path, f"decompresses to more than {_human(limit)} (the input size limit); if the "
                                 "file is genuine, raise it with --max-input-size or LUMOS_SIM_MAX_INPUT_SIZE")


def _human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


def iter_decompressed(path: PathLike, block: int = _BLOCK, limit: int | None = None) -> Iterator[bytes]:
    """The bytes of `path` in blocks, gunzipped when it starts with the gzip magic (several members
    allowed), with at most `limit` (default `max_input_bytes()`) bytes produced in all."""
    limit = max_input_bytes() if limit is None else limit
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise TraceInputError(path, f"cannot read: {exc.strerror or exc}") from None
    with fh:
        try:
            first = fh.read(block)
        except OSError as exc:
            raise TraceInputError(path, f"cannot read: {exc.strerror or exc}") from None
        if first[:2] != b"\x1f\x8b":
            yield from _plain_blocks(path, fh, first, block, limit)
            return
        yield from _gunzip_blocks(path, fh, first, block, limit)


def _plain_blocks(path, fh: BinaryIO, first: bytes, block: int, limit: int) -> Iterator[bytes]:
    total = 0
    data = first
    while data:
        total += len(data)
        if total > limit:
            raise input_too_large(path, limit)
        yield data
        data = fh.read(block)


def _gunzip_blocks(path, fh: BinaryIO, first: bytes, block: int, limit: int) -> Iterator[bytes]:
    total = 0
    dec = zlib.decompressobj(16 + zlib.MAX_WBITS)
    in_member = False                      # a member has begun and not yet ended
    pending = first
    while True:
        if not pending:
            pending = fh.read(block)
            if not pending:
                break
        in_member = True
        try:
            # max_length bounds what one call may produce: a bomb never expands past `block` at once
            out = dec.decompress(pending, block)
        except zlib.error as exc:
            raise TraceInputError(path, f"truncated or corrupt gzip data ({exc})") from None
        pending = dec.unconsumed_tail
        if dec.eof:
            in_member = False
            rest = dec.unused_data
            dec = zlib.decompressobj(16 + zlib.MAX_WBITS)   # next member of a multi-member file
            pending = pending + rest if rest.strip(b"\0") else b""
        if out:
            total += len(out)
            if total > limit:
                raise input_too_large(path, limit)
            yield out
    if in_member:
        raise TraceInputError(path, "truncated or corrupt gzip data (end of stream not found)")


def read_input_bytes(path: PathLike, limit: int | None = None) -> bytes:
    """The whole (decompressed) content of `path`, within the input size limit."""
    return b"".join(iter_decompressed(path, limit=limit))


def read_json_input(path: PathLike, limit: int | None = None) -> bytes:
    """Like `read_input_bytes`, but stops at the first block when the content cannot be JSON (so a
    gzip of a gigabyte of zeros is refused after one block, not after decompressing it all)."""
    blocks = []
    checked = False
    for block in iter_decompressed(path, limit=limit):
        if not checked and block.strip():
            if block.lstrip()[:1] not in (b"{", b"["):
                raise TraceInputError(path, "not a JSON document (it does not start with '{' or '[')")
            checked = True
        blocks.append(block)
    return b"".join(blocks)


# ------------------------------------------------------------------------------------------ writing
def default_permissions(fd: int) -> None:
    """mkstemp creates files 0600; give the final file the mode a plain open() would (0666 & ~umask)."""
    mask = os.umask(0)
    os.umask(mask)
    try:
        os.fchmod(fd, 0o666 & ~mask)
    except OSError:  # e.g. a filesystem without permissions: the file is still written
        pass


def prepare_output(path: PathLike) -> Path:
    """Check that `path` can be an output file and create its parent directories; one-line errors."""
    target = Path(path)
    if target.is_dir() or str(path).endswith(os.sep):
        raise TraceInputError(path, "is a directory; give a file name")
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TraceInputError(path, f"cannot create directory {parent}: {exc.strerror or exc}") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise TraceInputError(path, f"cannot write: directory {parent} is not writable")
    return target


@contextmanager
def atomic_output(path: PathLike, mode: str = "wb") -> Iterator[BinaryIO]:
    """Yield a file object whose content replaces `path` only when the block ends without an error."""
    target = prepare_output(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise TraceInputError(path, f"cannot write: {exc.strerror or exc}") from None
    default_permissions(fd)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError):
            raise TraceInputError(path, f"cannot write: {exc.strerror or exc}") from None
        raise
