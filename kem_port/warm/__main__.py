"""``python -m kem_port.warm SOCKET``: the warm process (started by client.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from kem_port.warm.server import serve

if __name__ == "__main__":
    raise SystemExit(serve(Path(sys.argv[1])))
