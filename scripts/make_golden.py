"""Write the committed golden files and their manifest under golden/ (byte-identical on every run)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compare.problem.golden import GOLDEN_DIR, write_all

if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else GOLDEN_DIR
    manifest = write_all(out)
    print(f"wrote {len(manifest['files'])} golden files and MANIFEST.json to {out}")
