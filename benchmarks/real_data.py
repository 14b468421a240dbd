"""What the real-log benchmarks share: where the BFTrainer data is, the parser every one of
them starts from, and the clear skip when the data is absent (it is never part of the
repository; docs/replay-and-policies.md, "Replaying the real public log", says what it is and
where it goes)."""

from __future__ import annotations

import argparse
from pathlib import Path

#: ../shared/data/bftrainer beside the repository
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "bftrainer"
#: the two-week node log of the 4,734-node machine
NODE_LOG = "ndstat-10sdn6-evt.tar.gz"


def parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser described by ``doc``'s first paragraph, with ``--data-dir`` and
    ``--out`` (default: a temporary folder)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0].replace("\n", " "),
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA,
                    help="the BFTrainer data folder (node log and job sets; ../shared/data)")
    ap.add_argument("--out", type=Path, default=None, help="default: a temporary folder")
    return ap


def require(data_dir: Path, *names: str) -> None:
    """Exit with a clear skip message unless ``data_dir`` holds every file of ``names``."""
    missing = [n for n in names if not (data_dir / n).exists()]
    if missing:
        raise SystemExit(f"skipped: the real BFTrainer data is not at {data_dir} (missing "
                         f"{', '.join(missing)}; see docs/replay-and-policies.md, 'Replaying the real public log')")
