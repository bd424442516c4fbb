"""``kem check``'s second answer: can the kernel run by named buffers
(`kem:run/3`, `kem run --buffer`), and what must such a call supply? Every
binding's role is read off its declaration (gpu/named/binding_model.py),
every problem listed at once, and the kernel is admitted and compiled the
way a call by named buffers compiles it (not run)."""

from __future__ import annotations

from typing import Any

from kem_port.errors import KemError


def named_report(runner: Any, source: Any, shape: Any, entry_point: str, constants: dict | None) -> dict:
    from kem_port.gpu.named.binding_model import NamedCall, role_of

    supply: dict[str, list[str]] = {"inputs": [], "uniforms": [], "outputs": []}
    problems: list[str] = []
    buffers, outputs = {}, {}
    from kem_port.gpu.wgsl.wgsl_calls import used_names

    used = used_names(source.text, entry_point)  # the bindings the entry point reaches, as a run binds them
    for b in sorted(shape.bindings, key=lambda b: (b.group, b.binding)):
        if used is not None and b.name not in used:
            continue
        where = f"{b.name} (@group({b.group}) @binding({b.binding}))"
        try:
            role = role_of(b)
        except KemError as exc:
            problems.append(exc.detail)
            continue
        if role == "uniform":
            size = b.min_size or 4
            supply["uniforms"].append(f"{where}: {size} bytes" if b.min_size else where)
            buffers[b.name] = bytes(size)
        elif role == "input":
            supply["inputs"].append(where)
            buffers[b.name] = bytes(4)
        else:
            supply["outputs"].append(f"{where}: its size, or its bytes to use it in place")
            outputs[b.name] = 4
    if not shape.bindings:
        problems.append("the kernel declares no buffers")
    overrides = tuple(sorted((constants or {}).items())) or None
    if not problems:
        try:
            runner.executor.named.check_constants(source, overrides)
            probe = NamedCall(source.kernel_id, buffers, outputs, None, entry_point, (1, 1, 1), overrides)
            admitted = runner.guard.admit_for_session(source, entry_point, overrides)
            runner.executor.named.compile(admitted, probe)
        except KemError as exc:
            problems.append(f"{exc.reason}: {exc.detail}")
    return {"ok": not problems, "supply": supply, "problems": problems,
            "dispatch_rule": "none: grid or workgroups required (kem's default rules are for kem@1.0-shaped kernels)"}


def declared_role(b: Any) -> str:
    """A binding's role by its declaration: input, output (or in/out), uniform, or not a buffer."""
    from kem_port.gpu.named.binding_model import role_of

    try:
        return role_of(b)
    except KemError:
        return "not a buffer (kem binds buffers only)"


def print_named(report: dict) -> None:
    named = report["named"]
    for kind in ("inputs", "uniforms", "outputs"):
        if named["supply"][kind]:
            print(f"named     {kind}: {'; '.join(named['supply'][kind])}")
    for problem in named["problems"]:
        print(f"named     problem: {problem}")
    verdict = "runs by named buffers (kem:run/3, kem run --buffer/--out, api.run_named)" if named["ok"] else "cannot run by named buffers"
    print(f"named     {verdict}; dispatch: --grid or --workgroups")
