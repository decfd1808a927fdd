"""Regenerate `et_def_pb2.py` from `et_def.proto` with grpc_tools' bundled protoc.

    python -m chakra_schema.regenerate_proto           # rewrite et_def_pb2.py
    python -m chakra_schema.regenerate_proto --check   # exit 1 when the committed file is stale

The generated module is committed so that installing lumos-sim needs no protoc; `--check` (run by the
tests) catches a .proto edit that was not followed by a regeneration. Needs `grpcio-tools` (dev extra).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "et_def.proto"
GENERATED = HERE / "et_def_pb2.py"


def generate() -> str:
    """Run protoc on et_def.proto and return the generated Python source."""
    try:
        from grpc_tools import protoc
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SystemExit("grpcio-tools is not installed (pip install 'lumos-sim[dev]')") from e
    import importlib.resources

    # protoc needs the well-known types' include dir even though et_def.proto imports none of them
    include = str(importlib.resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory() as out:
        rc = protoc.main(["protoc", f"-I{HERE}", f"-I{include}", f"--python_out={out}", str(PROTO.name)])
        if rc != 0:
            raise SystemExit(f"protoc failed on {PROTO} (exit {rc})")
        return (Path(out) / "et_def_pb2.py").read_text()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed file instead of writing; exit 1 when they differ")
    args = parser.parse_args(argv)
    fresh = generate()
    current = GENERATED.read_text() if GENERATED.exists() else None
    if args.check:
        if current != fresh:
            print(f"{GENERATED.name} is out of date with {PROTO.name}: run python -m chakra_schema.regenerate_proto",
                  file=sys.stderr)
            return 1
        print(f"{GENERATED.name} is up to date")
        return 0
    if current == fresh:
        print(f"{GENERATED.name} already up to date")
        return 0
    tmp = GENERATED.with_suffix(".py.tmp")
    tmp.write_text(fresh)
    os.replace(tmp, GENERATED)  # atomic: an import never sees a half-written module
    print(f"wrote {GENERATED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
