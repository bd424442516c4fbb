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
    declared, placeholders = describe_overrides(shape, constants)
    supply["constants"] = [f"{o['name']}: {o['type'] or '?'} (no default)" for o in declared if o["required"] and o["given"] is None]
    overrides = tuple(sorted(((constants or {}) | placeholders).items())) or None
    if not problems:
        try:
            runner.executor.named.check_constants(source, overrides)
            probe = NamedCall(source.kernel_id, buffers, outputs, None, entry_point, (1, 1, 1), overrides)
            admitted = runner.guard.admit_for_session(source, entry_point, overrides, gas=True)
            runner.executor.named.compile(admitted, probe)
        except KemError as exc:
            problems.append(f"{exc.reason}: {exc.detail}")
    return {"ok": not problems, "supply": supply, "problems": problems, "overrides": declared,
            "compiled_with": placeholders,
            "dispatch_rule": "none: grid or workgroups required (kem's default rules are for kem@1.0-shaped kernels)"}


# What stands in for an override without a default that the check was not
# given: 1 is a valid value of every override type (a u32 workgroup size, an
# f32 scale, a bool) and divides nothing by zero. The report says so.
PLACEHOLDER = 1


def describe_overrides(shape: Any, constants: dict | None) -> tuple[list[dict], dict]:
    """Each override the kernel declares: its type, @id, default (a number,
    "an expression", or None), whether a call must give it, and the value
    given to this check; and the placeholders the probe compile uses for
    required overrides not given (a missing one is no problem of the
    kernel's: every call must give it, and a call without it is refused
    bad_args naming it)."""
    given = constants or {}
    declared, placeholders = [], {}
    for o in shape.overrides:
        value = given.get(o.name, given.get(str(o.id)) if o.id is not None else None)
        default = o.default if o.default is not None else ("an expression" if o.has_default else None)
        declared.append({"name": o.name, "type": o.type, "id": o.id, "default": default,
                         "required": not o.has_default, "given": value})
        if not o.has_default and value is None:
            placeholders[o.name] = PLACEHOLDER
    return declared, placeholders


def declared_role(b: Any) -> str:
    """A binding's role by its declaration: input, output (or in/out), uniform, or not a buffer."""
    from kem_port.gpu.named.binding_model import role_of

    try:
        return role_of(b)
    except KemError:
        return "not a buffer (kem binds buffers only)"


def print_named(report: dict) -> None:
    named = report["named"]
    for o in named["overrides"]:
        at = f" @id({o['id']})" if o["id"] is not None else ""
        default = f"default {o['default']}" if o["default"] is not None else "no default: every call must give it"
        given = f"; given {o['given']}" if o["given"] is not None else ""
        stand_in = f"; checked with {o['name']} = {named['compiled_with'][o['name']]}" if o["name"] in named["compiled_with"] else ""
        print(f"override  {o['name']}: {o['type'] or '?'}{at}, {default}{given}{stand_in}")
    for kind in ("inputs", "uniforms", "outputs", "constants"):
        if named["supply"][kind]:
            print(f"named     {kind}: {'; '.join(named['supply'][kind])}")
    for problem in named["problems"]:
        print(f"named     problem: {problem}")
    verdict = "runs by named buffers (kem:run/3, kem run --buffer/--out, api.run_named)" if named["ok"] else "cannot run by named buffers"
    print(f"named     {verdict}; dispatch: --grid or --workgroups")
