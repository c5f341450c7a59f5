"""Regenerate the protobuf modules: ``python -m lighthouse._codegen OUT_DIR`` (``make proto``).

Runs grpcio-tools' bundled protoc over ``proto/*.proto`` and writes the message
modules (``*_pb2.py`` and their ``*_pb2.pyi`` stubs) that ``lighthouse.wire``
uses. No gRPC service stubs (``*_pb2_grpc.py``): servers and clients register
raw-bytes handlers from the method table in ``lighthouse.services``, which a
test compares with the service definitions. Earlier generated files in
``OUT_DIR`` are removed first, so a stale one cannot survive. The output is
deterministic for a pinned grpcio-tools; a test regenerates into a temporary
directory and compares.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent.parent / "proto"
_GENERATED = ("*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py")


def generate(out_dir: Path, proto_dir: Path = PROTO_DIR) -> list[Path]:
    """Generate ``*_pb2.py`` and ``*_pb2.pyi`` into ``out_dir``; return every
    ``.py``/``.pyi`` file there afterwards."""
    from grpc_tools import protoc  # dev-only dependency, imported lazily

    protos = sorted(proto_dir.glob("*.proto"))
    if not protos:
        raise FileNotFoundError(f"no .proto files in {proto_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for pattern in _GENERATED:
        for stale in out_dir.glob(pattern):
            stale.unlink()
    args = [
        "grpc_tools.protoc",
        f"-I{proto_dir}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        *(str(p) for p in protos),
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit status {rc}: {' '.join(args)}")
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
