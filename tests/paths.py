"""Where the repository is, for tests in any folder of tests/ (they mirror the source tree, so their depth varies)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints"
