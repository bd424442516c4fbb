"""``python -m kem_port``: the port program.

Before anything that could print is imported (wgpu loads native libraries
at import time): descriptor 1 is taken for frames, descriptor 2 is captured
for the log pipeline (native_stderr.py), and Mesa gets a valid
``XDG_RUNTIME_DIR`` (runtime_dir.py).
"""

from kem_port.port import native_stderr, runtime_dir
from kem_port.wire.stdio_guard import claim_protocol_fds


def main() -> int:
    in_fd, out_fd = claim_protocol_fds()
    captured = native_stderr.capture()
    runtime_dir.ensure()
    from kem_port.port.server import serve

    return serve(in_fd, out_fd, captured)


if __name__ == "__main__":
    raise SystemExit(main())
