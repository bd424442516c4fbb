"""``kem check FILE.wgsl``: is this a valid kem kernel, what does it bind,
and what dispatch would kem give it?

Every rule comes from the port's own code: the contract checks
(gpu/contract.check_layout, run by the pipeline cache before it compiles),
naga through a real compile on the adapter, and the dispatch rule
(gpu/dispatch.plan_dispatch).
Nothing here decides validity by itself.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from kem_port.cli import common, inputs
from kem_port.cli.check_named import declared_role, named_report, print_named
from kem_port.cli.console import CliError, Console
from kem_port.errors import KemError

if TYPE_CHECKING:  # the module is reached at run time through api.gpu_layer()
    from kem_port.gpu.wgsl.wgsl_reflect import KernelShape

PLACEHOLDER_PARAMS = bytes(16)  # compiles a params kernel when none are given
ROLES = {(0, 0): "input", (0, 1): "output", (0, 2): "params"}


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "check",
        help="validate a kernel, show its bindings and dispatch",
        description=(
            "Validate a WGSL kernel against kem's contract and compile it on the adapter (naga), "
            "show its entry points and bindings, and the dispatch kem would use for an input size."
        ),
        epilog="example: kem check mykernel.wgsl --input-size 1M",
    )
    parser.add_argument("kernel", metavar="FILE", help="a .wgsl file (or a kernel id)")
    parser.add_argument("--input-size", type=inputs.size, default=4096, metavar="BYTES", help="input size for the dispatch shown (default 4096)")
    common.add_call_options(parser)
    parser.add_argument("--json", action="store_true", help="the report as JSON on stdout")
    parser.add_argument("--warm", action="store_true", help="check in the warm kem process, as kem run --warm (docs/cli.md)")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, console: Console) -> int:
    if args.warm and not common.in_warm_process():
        from kem_port.warm.client import forward

        return forward(args.argv, console)
    params = inputs.parse_params(args.params, args.params_hex, None)
    runner = common.runner()
    source = common.resolve(runner, args.kernel, console)
    report = build_report(runner, source, args, params, console)
    _print(report, args)
    if not report["ok"] and not report["named"]["ok"]:
        raise CliError(f"{args.kernel}: not a valid kem kernel: {report['reason']}")
    return 0


def build_report(runner, source, args, params: bytes | None, console: Console) -> dict:
    """The whole check of one kernel (the playground's as-you-type check
    runs this too): ``args`` carries the call options add_call_options
    defines, and input_size."""
    from kem_port.api import gpu_layer

    shape = gpu_layer().reflect(source.text)
    report: dict = {"kernel": source.origin, "sha256": source.sha256, **describe_shape(shape)}
    takes_params = shape.binding(0, 2) is not None
    given = params if params is not None else (PLACEHOLDER_PARAMS if takes_params else None)
    try:
        call = runner.call(
            source, bytes(args.input_size), output_size=args.output_size, hint=args.hint, params=given,
            workgroups=args.workgroups, entry_point=args.entry_point,
            grid=args.grid, constants=dict(args.constant) if args.constant else None,
            debug=getattr(args, "debug", False),  # the playground checks as its Run calls: a debug channel is bound
        )
        report["output_size"] = call.output_size
        common.open_device(runner, console)
        console.progress(f"compiling {source.kernel_id}")
        report["adapter"] = runner.executor.info.get("name")
        report["dispatch_rule"] = runner.dispatch_rule(source, call)  # named even when it refuses the call
        report["dispatch"] = _dispatch(runner, source, call, report["dispatch_rule"], params is None and takes_params)
        report["ok"] = True
    except KemError as exc:
        report.update(ok=False, reason=exc.reason, error=exc.detail)
    report["named"] = named_report(runner, source, shape, args.entry_point, dict(args.constant) if args.constant else None)
    return report


def describe_shape(shape: KernelShape) -> dict:
    return {
        "entry_points": [
            {
                "name": e.name,
                "stage": e.stage,
                "workgroup_size": list(e.workgroup_size) if e.workgroup_size else e.workgroup_size_text,
                "builtins": sorted(e.builtins),
            }
            for e in shape.entry_points.values()
            if e.stage is not None
        ],
        "bindings": [
            {
                "group": b.group, "binding": b.binding, "name": b.name, "address_space": b.address_space,
                "access": b.access, "role": declared_role(b), "kem@1.0": ROLES.get((b.group, b.binding), "not bound"),
            }
            for b in shape.bindings
        ],
    }


def _dispatch(runner, source, call, rule: str, params_missing: bool) -> list[int] | str:
    """kem's workgroups for this call; a note instead when they hang on params not given."""
    if params_missing and rule == "image":
        return "set by params: (ceil(width/wx), ceil(height/wy), 1); pass --params to see it"
    return list(runner.dispatch(source, call))  # compiles: naga and the contract speak here


def _print(report: dict, args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"kernel    {report['kernel']}  (sha256 {report['sha256'][:16]}...)")
    for e in report["entry_points"]:
        size = e["workgroup_size"]
        size_text = ", ".join(map(str, size)) if isinstance(size, list) else size
        builtins = f"  builtins: {', '.join(e['builtins'])}" if e["builtins"] else ""
        print(f"entry     {e['name']}: @{e['stage'] or '?'} @workgroup_size({size_text}){builtins}")
    for b in report["bindings"]:
        access = f", {b['access']}" if b["access"] else ""
        print(f"binding   @group({b['group']}) @binding({b['binding']}) {b['name']}: var<{b['address_space']}{access}>  -> {b['role']}")
    if "output_size" in report:
        print(f"call      {args.input_size} bytes in, {report['output_size']} bytes out")
    if report["ok"]:
        dispatch = report["dispatch"]
        shown = f"({', '.join(map(str, dispatch))}) workgroups" if isinstance(dispatch, list) else dispatch
        print(f"dispatch  {shown}  (rule: {report['dispatch_rule']})")
        print(f"ok        a valid kem kernel (compiled on {report['adapter']})")
    else:
        stream = sys.stdout if report["named"]["ok"] else sys.stderr  # not an error when it runs by named buffers
        print(f"kem@1.0   {'not this contract' if report['named']['ok'] else 'error'}: {report['reason']}:", file=stream)
        print("  " + report["error"].replace("\n", "\n  "), file=stream)
    print_named(report)
