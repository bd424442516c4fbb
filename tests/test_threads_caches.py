"""Caches of the GPU layer that more than one port thread fills at once.

NamedRuns keeps each kernel's reflected shape (named_run._shape). The
port asks it from three threads: the reader (``small``, before a named
call may run inline: port/run_methods.py), the fetch threads
(``check_constants``, after a fetch and before admission) and the GPU
thread (planning). Its bound was kept by popping ``next(iter(dict))``:
two threads past the bound at once met "dictionary changed size during
iteration" or a KeyError (both evicting the same oldest key), and the
call was answered ``internal``. Seen failing here before the fix in 8
threads of 768 fresh kernels each, at the port's own switch interval
(port/server.py, 0.2 ms), in every run of three.
"""

from __future__ import annotations

import sys
import threading

import pytest

from kem_port.config import Config
from kem_port.gpu.device import Device
from kem_port.gpu.named.binding_model import NamedCall
from kem_port.gpu.named.named_pipelines import PIPELINES
from kem_port.gpu.named.named_run import NamedRuns
from kem_port.kernel_store import KernelSource, source_from_bytes
from kem_port.stats import Stats

THREADS = 8
KERNELS_EACH = 12 * PIPELINES  # each thread alone passes the bound many times


def _kernel(n: int, size: int) -> KernelSource:
    """A kernel of its own (its own sha256) writing n, workgroup size `size`."""
    text = (f"@group(0) @binding(0) var<storage, read_write> y_{n}: array<u32>;\n"
            f"@compute @workgroup_size({size}) fn main(@builtin(global_invocation_id) g: vec3<u32>) {{ y_{n}[g.x] = {n}u; }}\n")
    return source_from_bytes(f"k{n}", text.encode(), "test", "local")


def _all_at_once(caller) -> None:
    """caller(0) .. caller(THREADS - 1), each on its own thread, all joined."""
    threads = [threading.Thread(target=caller, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@pytest.fixture
def port_switch_interval():
    """The port's own GIL switch interval (port/server.py sets it)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)
    yield
    sys.setswitchinterval(before)


def test_kernel_shapes_filled_from_many_threads_at_once(port_switch_interval):
    """The reader's ``small`` and the fetch threads' ``check_constants``
    on fresh kernels at once, each past the cache's bound: none raises,
    and each answer is its own kernel's (64 invocations small, 64 x 4096
    not; a workgroup of 64 or 128 decides)."""
    stats = Stats()
    runs = NamedRuns(Device(Config(), stats), stats)
    failures: list[str] = []
    wrong: list[int] = []

    def caller(thread: int) -> None:
        try:
            for i in range(KERNELS_EACH):
                n = thread * 100_000 + i
                size = 64 if n % 2 else 128
                source = _kernel(n, size)
                if thread % 2:  # a fetch thread's question
                    runs.check_constants(source, None)
                    continue
                # the reader's: 4096 workgroups of 64 are 262144 invocations, past a lone call's 16384
                small = runs.small(source, NamedCall(source.kernel_id, {}, {"y": 4}, workgroups=(1, 1, 1)))
                large = runs.small(source, NamedCall(source.kernel_id, {}, {"y": 4}, workgroups=(4096, 1, 1)))
                if not small or large:
                    wrong.append(n)
        except Exception as exc:  # what the port would answer as internal
            failures.append(f"{type(exc).__name__}: {exc}")

    _all_at_once(caller)
    assert failures == []
    assert wrong == []
    assert len(runs._shapes) <= PIPELINES  # still bounded


def test_kept_caches_stay_bounded_and_right_under_many_threads(port_switch_interval):
    """gpu/kept.py, which every shape cache and NamedRuns' reached-names
    cache fill through: 8 threads over keys that overlap, both bounds (a
    count, and costs summed) passed all the time; each gets its own key's
    value, never an error, and the costs kept add up."""
    from kem_port.gpu.kept import Kept

    cache: Kept = Kept(16, budget=100)
    failures: list[str] = []

    def caller(thread: int) -> None:
        try:
            for i in range(5000):
                key = (i * 7 + thread) % 300  # threads share keys
                if cache.get(key, lambda k=key: ("shape", k), cost=key % 13) != ("shape", key):
                    failures.append(f"wrong value for {key}")
        except Exception as exc:
            failures.append(f"{type(exc).__name__}: {exc}")

    _all_at_once(caller)
    assert failures == []
    assert len(cache) <= 16 and cache.cost <= 100
    assert cache.cost == sum(cost for _, cost in cache._items.values())
    made: list[int] = []
    for _ in range(3):  # None is kept too, not made again
        assert cache.get("none", lambda: made.append(1)) is None
    assert made == [1]


def test_a_shape_over_the_byte_budget_is_kept_alone_and_the_budget_holds():
    """Red team 5: a 540 KB kernel of 20,000 overrides reflects to 8.6 MB, so
    1,024 shapes by count alone could reach ~9 GB. The texts' bytes bound
    the cache too; one text over the whole budget is kept alone."""
    from kem_port.gpu.kept import Kept

    cache: Kept = Kept(1024, budget=1000)
    for key in range(50):
        cache.get(key, lambda: object(), cost=100)
    assert len(cache) == 10 and cache.cost == 1000
    assert cache.get("huge", lambda: "big", cost=5000) == "big"
    assert len(cache) == 1 and cache.cost == 5000
    cache.get("small", lambda: "s", cost=10)
    assert len(cache) == 1 and cache.cost == 10  # the huge one goes first
