"""Stateless chains of one request shape, queued together, in one submission.

Chains without a session that repeat a kept shape (chain_kit.py) and wait
in the GPU queue behind each other (port/gpu_loop.py gathers them) run as
a batch of kem@1.0 calls runs: every chain's bytes written to its own
kit, one encoder holding each kit's commands in turn, one submit, one
wait, each kit's staging read. Each chain keeps its own kit -- its own
temporaries, uniforms and staging, so the chains of a submission share no
byte -- so the n-th chain of a batch takes the shape's n-th replica kit
(chain_kits.py), planned from the shape's first chain. Kits hold only
loop-free steps (keepable): no gas meters to split.

A road beside the single chain's: paid for by 64 callers of 10-step
chains on the H100, 1.26k and 1.04k chains/s before, 5.06k and 4.08k with
it, same sitting, runs alternating (docs/benchmarks.md, "Roads side by
side"; `scripts/bench roads`).
"""

from __future__ import annotations

from typing import Any

from kem_port.gpu.hot_path import read_each
from kem_port.gpu.native import NativePath
from kem_port.gpu.session.chain import ChainResult, ChainRunner, kit_result
from kem_port.gpu.session.chain_gas import plan_gas
from kem_port.gpu.session.chain_kit import ChainKit, keepable
from kem_port.gpu.session.kit_commands import encode_native

# (its kit, its request's input bytes, its request's steps)
Run = tuple[ChainKit, bytes, Any]


def run_together(path: NativePath, runs: list[Run], spin_s: float) -> list[tuple[list[bytes], int]]:
    """Each run's returned buffers and gas, after one submission; a
    wgpu.GPUError fails them all (the caller drops their kits)."""
    commands = path.errors.call(_encode, path, runs)
    index = path.submit(commands)
    return read_each(path, [(kit.staging, kit.staging_size, lambda kit=kit: kit.read(path)) for kit, _, _ in runs], spin_s, index)


def _encode(path: NativePath, runs: list[Run]) -> Any:
    for kit, data, steps in runs:
        kit.upload(path, data, steps)
    return encode_native(path, [kit.commands(path) for kit, _, _ in runs])


def run_kits_together(runner: ChainRunner, key: tuple, items: list[tuple[bytes, Any]]) -> list[ChainResult | None]:
    """Stateless repeats of one kept shape, queued together, in one
    submission, each on its own kit: the shape's, then replicas. None for a
    run with no kit (no fit, the wrappers' path, a replica that cannot be
    kept): the caller runs it alone."""
    kit, path = runner.kits.get(key), runner.gpu.hot
    if kit is None or kit.session is not None or not kit.fits(None, runner.gpu.device) or not isinstance(path, NativePath):
        return [None] * len(items)
    kits = [kit] + [runner.kits.replica(key, n, lambda: _replica(runner, kit)) for n in range(1, len(items))]
    runs = [(k, data, steps) for k, (data, steps) in zip(kits, items) if k is not None]
    try:
        outs = iter(run_together(path, runs, runner.gpu.spin_s))
    except BaseException:
        runner.kits.drop(key)  # their buffers' state is unknown
        raise
    runner.kits.used(key)
    runner.stats.bump((("chain_steps", kit.steps * len(runs)), ("chain_kit_runs", len(runs)), ("chain_batches", 1)))
    return [None if k is None else kit_result(k, *next(outs)) for k in kits]


def _replica(runner: ChainRunner, kit: ChainKit) -> ChainKit | None:
    """Another kit of a stateless shape, planned from its first chain."""
    plan = runner.plan(kit.chain)
    gpu = runner.gpu
    gas = plan_gas(plan, kit.chain.gas_limit, runner.gas_limit, gpu.storage_align, gpu.gas_turns)
    if not keepable(plan, gas, kit.chain):
        return None
    runner.stats.inc("chain_kits_built")
    return ChainKit(gpu.require(), kit.chain, plan, gas, gpu.uniform_align)
