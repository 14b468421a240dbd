"""Regenerate the Python gRPC code in ``core/v1`` (installed as ``offcut.v1``) from ``protos/``.

Usage (from the repository root, needs the ``dev`` extra for grpcio-tools)::

    python tools/gen_protos.py          # rewrite core/v1/*_pb2*.py
    python tools/gen_protos.py --check  # exit 1 if the checked-in code is stale (CI)
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PROTO_DIR = PROTO_ROOT / "offcut" / "v1"
OUT_DIR = ROOT / "core" / "v1"


def generate(into: Path) -> list[Path]:
    """Run protoc over every ``protos/offcut/v1/*.proto``; return the generated files."""
    from grpc_tools import protoc
    import grpc_tools

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_DIR.glob("*.proto"))
    include = str(Path(grpc_tools.__file__).parent / "_proto")
    args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={into}",
            f"--pyi_out={into}", f"--grpc_python_out={into}", *protos]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted((into / "offcut" / "v1").glob("*_pb2*.py*"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generated = generate(Path(tmp))
        names = {p.name for p in generated}
        existing = {p.name for p in OUT_DIR.glob("*_pb2*.py*")}
        if args.check:
            stale = sorted(n for n in names if not (OUT_DIR / n).exists()
                           or not filecmp.cmp(Path(tmp) / "offcut" / "v1" / n, OUT_DIR / n, shallow=False))
            stale += sorted(existing - names)
            if stale:
                print("generated protobuf code is stale: " + ", ".join(stale)
                      + "\nrun: python tools/gen_protos.py", file=sys.stderr)
                return 1
            print(f"generated protobuf code is fresh ({len(names)} files)")
            return 0
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        for old in existing - names:
            (OUT_DIR / old).unlink()
        for path in generated:
            shutil.copyfile(path, OUT_DIR / path.name)
        print(f"wrote {len(generated)} files to {OUT_DIR.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
