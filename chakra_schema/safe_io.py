"""Safe file I/O shared by every reader and writer: atomic output files and bounded decompression.

- `atomic_output(path)`: write to a temporary file beside the target and rename it into place, so a
  failure (an exception, Ctrl-C, SIGTERM) never leaves a half-written target; the parent directory is
  created as `mkdir -p` would, and the file gets the usual permissions (0666 & ~umask, not mkstemp's 0600).
  OS errors become one-line `TraceInputError`s naming the target.
- `read_input_bytes(path)` / `iter_decompressed(path)` / `iter_lines(path)`: a file's bytes (in one
  buffer, never joined: peak memory is the content once), blocks or lines, gunzipped on the fly when it
  is gzip, refusing input that decompresses to more than `max_input_bytes()` (a gzip bomb would
  otherwise fill memory). The limit is `DEFAULT_MAX_INPUT_BYTES`, or LUMOS_SIM_MAX_INPUT_SIZE, or the
  CLI's `--max-input-size`.
- `refuse_overwriting_inputs(output, inputs)`: an output that is one of the inputs is refused up front.
"""
from __future__ import annotations

import os
import re
import tempfile
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import IO, BinaryIO, Callable, Iterator, Union

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


def input_too_large(path: PathLike, limit: int, what: str | None = None) -> TraceInputError:
    """`what`: the kind of file a fixed cap of the caller's is for (a config.json), not the user's limit."""
    if what:
        return TraceInputError(path, f"holds more than {_human(limit)}: too large for a {what}")
    return TraceInputError(path, f"decompresses to more than {_human(limit)} (the input size limit); if the "
                                 "file is genuine, raise it with --max-input-size or LUMOS_SIM_MAX_INPUT_SIZE")


def _human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


def iter_decompressed(path: PathLike, block: int = _BLOCK, limit: int | None = None,
                      what: str | None = None) -> Iterator[bytes]:
    """The bytes of `path` in blocks, gunzipped when it starts with the gzip magic (several members
    allowed), with at most `limit` (default `max_input_bytes()`) bytes produced in all (`what`: the kind of
    file a caller's own cap is for, named when it is passed)."""
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
            yield from _plain_blocks(path, fh, first, block, limit, what)
            return
        yield from _gunzip_blocks(path, fh, first, block, limit, what)


def _plain_blocks(path, fh: BinaryIO, first: bytes, block: int, limit: int, what: str | None) -> Iterator[bytes]:
    total = 0
    data = first
    while data:
        total += len(data)
        if total > limit:
            raise input_too_large(path, limit, what)
        yield data
        data = fh.read(block)


def _gunzip_blocks(path, fh: BinaryIO, first: bytes, block: int, limit: int, what: str | None) -> Iterator[bytes]:
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
                raise input_too_large(path, limit, what)
            yield out
    if in_member:
        raise TraceInputError(path, "truncated or corrupt gzip data (end of stream not found)")


def read_input_bytes(path: PathLike, limit: int | None = None) -> bytearray:
    """The whole (decompressed) content of `path`, within the input size limit, in one buffer."""
    return _read_into_buffer(path, limit, json=False)


def read_json_input(path: PathLike, limit: int | None = None, what: str | None = None) -> bytearray:
    """Like `read_input_bytes`, but stops at the first block when the content cannot be JSON (so a
    gzip of a gigabyte of zeros is refused after one block, not after decompressing it all), and an
    input of only whitespace is refused as "empty file" (callers need not scan it again)."""
    return _read_into_buffer(path, limit, json=True, what=what)


def _size_hint(path: PathLike) -> int:
    """The content size of a plain file (0 for gzip: its ISIZE trailer is only the size mod 2^32, and
    a forged one must not make us allocate gigabytes for a small input)."""
    try:
        with open(path, "rb") as fh:
            return 0 if fh.read(2) == b"\x1f\x8b" else os.fstat(fh.fileno()).st_size
    except OSError:
        return 0


def _read_into_buffer(path: PathLike, limit: int | None, json: bool, what: str | None = None) -> bytearray:
    """Blocks appended to one bytearray, never joined: peak memory is the content plus one block (a
    join held the list of blocks and the joined copy, twice the content). A plain file's buffer is
    allocated at its size; a gzip's grows in place (realloc of a large block remaps pages, it does not
    copy them)."""
    limit = max_input_bytes() if limit is None else limit
    buf = bytearray(min(_size_hint(path), limit))
    filled = 0
    for block in (iter_json_input(path, limit, what) if json else iter_decompressed(path, limit=limit, what=what)):
        end = filled + len(block)
        if end <= len(buf):
            buf[filled:end] = block
        else:
            del buf[filled:]
            buf += block
        filled = end
    del buf[filled:]
    return buf


def iter_json_input(path: PathLike, limit: int | None = None, what: str | None = None) -> Iterator[bytes]:
    """`iter_decompressed` for a JSON document: content that cannot be JSON is refused at its first
    non-blank block, and only whitespace is "empty file"."""
    checked = False
    for block in iter_decompressed(path, limit=limit, what=what):
        if not checked and not block.isspace():
            if block.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] not in (b"{", b"["):    # a UTF-8 BOM may lead
                raise TraceInputError(path, "not a JSON document (it does not start with '{' or '[')")
            checked = True
        yield block
    if not checked:
        raise TraceInputError(path, "empty file")


MAX_LINE_BYTES = 64 << 20   # one JSON-lines record; a longer line is refused, not parsed


def iter_lines(path: PathLike, max_line: int = MAX_LINE_BYTES, limit: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of `path`'s non-blank lines, through the same bounded (gunzipping) reader
    as the traces: at most `limit` bytes in all, and a line longer than `max_line` is a one-line error
    (it is not accumulated first). Blank runs are skipped by one search, not line by line, so a file
    of gigabytes of newlines costs its decompression only."""
    number = 0
    tail = bytearray()           # the start of a line that continues in the next block
    for block in iter_decompressed(path, limit=limit):
        start = 0
        while start < len(block):
            if not tail:
                m = _NON_SPACE.search(block, start)
                if m is None:                       # the rest of the block is blank
                    number += block.count(b"\n", start)
                    break
                number += block.count(b"\n", start, m.start())
                start = m.start()
            end = block.find(b"\n", start)
            piece = block[start:] if end < 0 else block[start:end]
            if len(tail) + len(piece) > max_line:
                raise TraceInputError(path, f"line {number + 1} is longer than {_human(max_line)} "
                                            "(not a JSON-lines record)")
            if end < 0:
                tail += piece
                break
            number += 1
            line = bytes(tail + piece) if tail else piece
            tail = bytearray()
            if not line.isspace():
                yield number, line
            start = end + 1
    if tail and not tail.isspace():
        yield number + 1, bytes(tail)


_NON_SPACE = re.compile(rb"\S")


def refuse_overwriting_inputs(output: PathLike | None, inputs, flag: str = "output") -> None:
    """A one-line error when `output` is one of the files `inputs` name (the same file by path, symlink
    or hard link): writing it would destroy what it is computed from (`jsonize x.et -o x.et`,
    `replay job --timeline job.0.et`, `report r.parquet -o r.parquet`). An input may be a file, a
    `.et` prefix (PREFIX.<rank>.et) or a `{rank}` pattern; folders are not expanded."""
    if output is None:
        return
    out = Path(output)
    try:
        out_id = (out.stat().st_dev, out.stat().st_ino)
    except OSError:
        out_id = None
    out_real = os.path.realpath(out)
    for item in inputs:
        if not item:
            continue
        for src in _input_files(str(item)):
            same = os.path.realpath(src) == out_real
            if not same and out_id is not None:
                try:
                    st = os.stat(src)
                    same = (st.st_dev, st.st_ino) == out_id
                except OSError:
                    pass
            if same:
                raise TraceInputError(output, f"the {flag} is the input {src}: writing it would destroy the "
                                              "input; choose another file name")


def _input_files(item: str) -> list[str]:
    import glob
    if "{rank}" in item:
        return glob.glob(glob.escape(item).replace(glob.escape("{rank}"), "*"))
    return [item] + glob.glob(glob.escape(item) + ".*.et") + glob.glob(glob.escape(item) + ".*.et.gz")


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
def atomic_output(path: PathLike, mode: str = "wb", encoding: str | None = None,
                  check: Callable[[str], None] | None = None) -> Iterator[IO]:
    """Yield a file object whose content replaces `path` only when the block ends without an error.
    `mode` "w" gives a text file (`encoding`, default UTF-8); `check(temp_path)` runs on the complete
    file before it is renamed into place (e.g. "does the written preset load?"): if it raises, the
    target is untouched."""
    target = prepare_output(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise TraceInputError(path, f"cannot write: {exc.strerror or exc}") from None
    default_permissions(fd)
    if "b" not in mode and encoding is None:
        encoding = "utf-8"
    try:
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f
        if check is not None:
            check(tmp)
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError):
            raise TraceInputError(path, f"cannot write: {exc.strerror or exc}") from None
        raise
