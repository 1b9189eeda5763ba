"""The docs tests import the docs build's own helpers (docs/_ext), so both check the same thing."""

import sys
from pathlib import Path

EXT = Path(__file__).resolve().parents[2] / "docs" / "_ext"
if str(EXT) not in sys.path:
    sys.path.insert(0, str(EXT))
