"""``python -m kem_port.warm SOCKET [IDLE_SECONDS]``: the warm process
(started by client.py, with the default idle exit; the tests pass a short one)."""

from __future__ import annotations

import sys
from pathlib import Path

from kem_port.warm.server import serve

if __name__ == "__main__":
    raise SystemExit(serve(Path(sys.argv[1]), *(float(a) for a in sys.argv[2:3])))
