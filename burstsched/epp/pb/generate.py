"""Regenerate ``ext_proc_pb2.py`` and its stub ``ext_proc_pb2.pyi`` from ``ext_proc.proto`` (grpcio-tools).

``python -m burstsched.epp.pb.generate [OUT_DIR]``: writes into the repository (default) or under
``OUT_DIR`` (the test that checks the committed modules writes to a temporary folder).
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO = Path("burstsched") / "epp" / "pb" / "ext_proc.proto"
ROOT = Path(__file__).resolve().parents[3]


def generate(out_dir: Path) -> int:
    """Run protoc on the proto, modules under ``out_dir`` (at the proto's own relative path)."""
    from importlib.resources import files

    from grpc_tools import protoc  # dev dependency: only regeneration needs it

    well_known = files("grpc_tools") / "_proto"  # google/protobuf/*.proto
    args = ["protoc", f"-I{ROOT}", f"-I{well_known}", f"--python_out={out_dir}", f"--pyi_out={out_dir}"]
    args.append(str(ROOT / PROTO))
    code: int = protoc.main(args)
    return code


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    return generate(out)


if __name__ == "__main__":
    raise SystemExit(main())
