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
        return cls(f"{error.reason}: {cli_words(one_line(error.detail))}")


def one_line(detail: str) -> str:
    """naga's report spans lines ("Validation Error", "Caused by:", a source
    excerpt, "= cause" notes): keep the line that names the error, its most
    specific cause and where it is (line, column)."""
    lines = [line.strip() for line in detail.splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    named = [line for line in lines[1:] if "error" in line.lower() and not line.startswith("In ")]
    message = (named[0] if named else lines[-1]).replace("Shader '' ", "")
    # A validation error's cause is in naga's "= ..." notes, most specific
    # last ("= Expression [8] is invalid", "= Abstract types may only ...").
    causes = [line[1:].strip() for line in lines if line.startswith("= ")]
    cause = f": {causes[-1]}" if causes and causes[-1] not in message else ""
    # The excerpt's "┌─ wgsl:3:11" (a parse error) or "┌─ :5:23" (validation).
    where = re.search(r"┌─\s*[^\s:]*:(\d+):(\d+)", detail) or re.search(r"wgsl:(\d+):(\d+)", detail)
    at = f" at line {where.group(1)}, column {where.group(2)}" if where else ""
    return f"{message}{cause}{at} (kem check FILE shows the whole report)"


# The port words its refusals for its Erlang callers (option maps, atoms);
# the command's user typed flags, so each phrase becomes the flag that sets
# it. Most specific first: "grid => {X, Y, Z}" before the bare "{X, Y, Z}".
_FLAGS: tuple[tuple[str, str], ...] = (
    (r"\bcall with debug => true", "run with --debug"),
    (r"\bdebug => true", "--debug"),
    (r"\bgrid => \{X, ?Y, ?Z\}", "--grid X,Y,Z"),
    (r"\bworkgroups => \{X, ?Y, ?Z\}", "--workgroups X,Y,Z"),
    (r"\boutputs => #\{(\w+) => Bytes\}", r"--out \1=BYTES"),
    (r"(--out (\w+)=BYTES), or its bytes\b", r"\1, or --buffer \2=@FILE"),
    (r"\bconstants => #\{(\w+) => Value\}", r"--constant \1=VALUE"),
    (r"\bconstants must be a map #\{Name => Number\}", "--constant takes NAME=VALUE"),
    (r"\{X, ?Y, ?Z\}", "X,Y,Z"),
    (r" \((?:atoms or binaries|atom or binary)\)", ""),
    (r"^constants keys\b", "--constant names"),
    (r"^constants(?=:| value of)", "--constant"),
    (r"\boutput_size_hint\b", "--hint"),
    (r"\boutput_size\b", "--output-size"),
    (r"\bentry_point\b", "--entry-point"),
    (r"(?<=\bgive )grid\b|(?<=\bnor )grid\b|^grid(?= must)", "--grid"),
    (r"(?<=\bor )workgroups\b(?!\s*=)|(?<=\bpass )workgroups\b|(?<=\bnor )workgroups\b|^workgroups(?= must)", "--workgroups"),
    (r"(?<=\bneither )params\b", "--params"),
)


def cli_words(detail: str) -> str:
    """A refusal's detail in the command's words: flags for option names,
    plain text for Erlang terms and decoder types."""
    for pattern, flag in _FLAGS:
        detail = re.sub(pattern, flag, detail)
    return detail


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
