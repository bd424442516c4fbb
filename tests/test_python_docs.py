"""docs/python.md's examples run as they stand: each ```python block in a
fresh Python process (its own device, its own port where it starts one)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import cli_env

PAGE = Path(__file__).resolve().parents[1] / "docs" / "python.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)


def test_the_page_has_an_example_of_each_part():
    text = "\n".join(BLOCKS)
    for call in ("api.run(", "api.run_named(", "api.run_debug(", "port.session()", ".chain(", "api.health()",
                 "api.adapters()", "except KemError"):
        assert call in text, call


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_each_example_runs(tmp_path, index):
    done = subprocess.run([sys.executable, "-c", BLOCKS[index]], capture_output=True, cwd=tmp_path,
                          env=cli_env(tmp_path), timeout=240)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    # No driver noise (Mesa's XDG_RUNTIME_DIR notice) and no traceback; a
    # started port's own warnings (a CPU fall-back) are re-logged, as asked.
    assert b"XDG_RUNTIME_DIR" not in done.stderr and b"Traceback" not in done.stderr, done.stderr.decode()[-3000:]
