"""Helpers the file-input and shared-memory tests share."""

from __future__ import annotations

from kem_port.errors import KemError
from kem_port.gpu.calls import Job, KernelCall
from kem_port.kernel_store import default_stores


def run_double(executor, calls: list[KernelCall]) -> list:
    """Run calls of the packaged `double` kernel as one batch; each call's
    result bytes or its KemError, in order (each answered exactly once)."""
    double = default_stores(None)[0].lookup("double")
    got: list[list] = [[] for _ in calls]
    jobs = [Job(c, double, reply=lambda v, k=k: got[k].append(bytes(v)), fail=lambda e, k=k: got[k].append(e))
            for k, c in enumerate(calls)]
    executor.run(jobs)
    assert all(len(g) == 1 for g in got)
    return [g[0] for g in got]


def reason_of(fn, *args) -> str | None:
    """The KemError reason fn(*args) raises, or None if it returns."""
    try:
        fn(*args)
    except KemError as exc:
        return exc.reason
    return None
