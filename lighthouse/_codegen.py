"""Regenerate the gRPC stubs: ``python -m lighthouse._codegen OUT_DIR`` (``make proto``).

Runs grpcio-tools' bundled protoc over ``proto/*.proto`` and rewrites the one
absolute import protoc emits in ``*_pb2_grpc.py`` into a package-relative one,
so the stubs work as ``lighthouse._gen``. The output is deterministic for a
pinned grpcio-tools; a test regenerates into a temporary directory and compares.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent.parent / "proto"


def generate(out_dir: Path, proto_dir: Path = PROTO_DIR) -> list[Path]:
    """Generate ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` into ``out_dir``."""
    from grpc_tools import protoc  # dev-only dependency, imported lazily

    protos = sorted(proto_dir.glob("*.proto"))
    if not protos:
        raise FileNotFoundError(f"no .proto files in {proto_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{proto_dir}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(p) for p in protos),
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit status {rc}: {' '.join(args)}")
    stems = [p.stem for p in protos]
    for grpc_file in out_dir.glob("*_pb2_grpc.py"):
        text = grpc_file.read_text()
        for stem in stems:
            text = re.sub(
                rf"^import {stem}_pb2 as", f"from . import {stem}_pb2 as", text, flags=re.M
            )
        grpc_file.write_text(text)
    init = out_dir / "__init__.py"
    init.write_text('"""Generated from proto/ by `make proto`; never edit by hand."""\n')
    return sorted(p for p in out_dir.iterdir() if p.suffix in (".py", ".pyi"))


def main(argv: list[str] | None = None) -> int:
    """CLI entry: one argument, the output directory."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m lighthouse._codegen OUT_DIR", file=sys.stderr)
        return 2
    for path in generate(Path(args[0])):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
