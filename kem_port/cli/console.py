"""What the command says on stderr: progress, timings and the one-line error."""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field

from kem_port.errors import KemError


class CliError(Exception):
    """A failure the command reports in one line and exits 1 for."""

    @classmethod
    def of(cls, error: KemError) -> "CliError":
        return cls(f"{error.reason}: {one_line(error.detail)}")


def one_line(detail: str) -> str:
    """naga's report spans lines ("Validation Error", "Caused by:", a source
    excerpt): keep the line that names the error and where it is."""
    lines = [line.strip() for line in detail.splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    named = [line for line in lines[1:] if "error" in line.lower() and not line.startswith("In ")]
    message = named[0] if named else lines[-1]
    where = re.search(r"wgsl:(\d+):(\d+)", detail)
    at = f" at line {where.group(1)}, column {where.group(2)}" if where else ""
    return f"{message}{at} (kem check FILE shows the whole report)"


@dataclass
class Console:
    verbose: bool = False
    quiet: bool = False
    started: float = field(default_factory=time.perf_counter)

    def progress(self, message: str) -> None:
        """Long steps (device open, fetch, compile) are announced on a
        terminal, or always with -v; never on stdout."""
        if not self.quiet and (self.verbose or sys.stderr.isatty()):
            print(f"kem: {message}", file=sys.stderr, flush=True)

    def detail(self, message: str) -> None:
        if self.verbose:
            print(f"kem: {message}", file=sys.stderr, flush=True)

    def fail(self, message: str) -> None:
        print(f"kem: {message.splitlines()[0] if message else 'error'}", file=sys.stderr, flush=True)
