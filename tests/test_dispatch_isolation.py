"""A dispatch only ever sees its own calls' bytes (issue 24, items 2 and 3).

The attack: a published call-table kernel that returns every word it can
reach in its bound input (and the bound input's arrayLength), called in
the same batches as victims running `double` and `double_table` on
secrets, as single calls (a calls frame [attacker, double(victim),
attacker], where today's code bound the attacker's dispatch from its first
call's input to its last, the victim's between) and as group frames.
Through the real port on the real adapter: the attacker never sees a
victim byte, its arrayLength is its own input's words, victims' outputs
are numpy's. With KEM_SHARED_TABLE_KERNELS listing the attacker its rows
share a dispatch (stats), still never another kernel's bytes. With
KEM_CROSS_CALLER_DISPATCH=off nothing is shared: no slot form, one
call-table dispatch per call. On an executor of the real device: random
batches of singles and groups of both (listed and unlisted attackers,
victims), and the slot form's canary (a slot form that writes outside a
slot fails its group with `internal`, is logged and retired).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from conftest import start_port
from kem_port.wire import group_frames, terms
from kem_port.config import Config
from kem_port.gpu.calls import Job, KernelCall
from kem_port.gpu.executor import Executor
from kem_port.gpu.group.slot_dispatch import SlotForm
from kem_port.gpu.group.slot_kernel import SlotKernel
from kem_port.kernel_store import default_stores, source_from_bytes
from kem_port.stats import Stats
from test_call_table import TABLE_ENTRY, TABLE_PREAMBLE
from test_group_table import group_job

# Output word 0 of a call: arrayLength of the bound input; word 1 + i: the
# bound input's word i (every word the kernel can reach), 0 past it.
ATTACKER = TABLE_PREAMBLE + TABLE_ENTRY + """
    let reach = arrayLength(&input_words);
    var x = 0u;
    if (k == 0u) { x = reach; } else if (k - 1u < reach) { x = input_words[k - 1u]; }
    output_words[item] = x;
}
"""
ATTACKER_OUT = 16 * 1024  # 4,095 words of reach: more than any batch here binds
STATS = ("table_dispatches", "table_calls", "slot_dispatches", "slot_calls", "group_jobs", "batches")


def start(kernels, **env: str):
    (kernels / "attacker.wgsl").write_text(ATTACKER)
    return start_port(KEM_KERNEL_DIR=str(kernels), KEM_CACHE_DIR=str(kernels / "cache"), **env)


@pytest.fixture(scope="module")
def default_port(tmp_path_factory):
    with start(tmp_path_factory.mktemp("kernels")) as client:
        warm(client)
        yield client


def warm(client) -> None:
    for kernel in (b"attacker", b"double", b"double_table"):
        client.call("execute_kernel", kernel, bytes(8), 1)  # admitted and compiled: a group is one job


def counts(port) -> dict[str, int]:
    stats = port.call_plain("stats")
    return {key: stats.get(key, 0) for key in STATS}


def delta(after: dict, before: dict) -> dict:
    return {key: after[key] - before[key] for key in after}


def secrets(rng, n: int, size: int) -> list[bytes]:
    """Words no attacker input holds (their top bit is set; attackers' is clear)."""
    return [(rng.integers(1 << 31, 1 << 32, size // 4, dtype=np.uint64).astype("<u4")).tobytes() for _ in range(n)]


def attacker_inputs(rng, n: int, size: int) -> list[bytes]:
    return [(rng.integers(1, 1 << 31, size // 4, dtype=np.uint64).astype("<u4")).tobytes() for _ in range(n)]


def send_mixed(port, rng, rounds_busy_ms: int = 400) -> tuple[list, list, dict]:
    """Behind a sleeping GPU (so they share batches): a calls frame
    [attacker, double(victim), attacker, double_table(victim), attacker],
    a group of double victims, a group of attackers, a group of
    double_table victims. Returns (attacker (input, reply) pairs, victim
    (kernel, input, reply) triples, stats moved)."""
    busy = port.call_async("test_hook", terms.atom("sleep_gpu"), rounds_busy_ms)
    time.sleep(0.1)
    before = counts(port)
    size_a, size_v = 4 * int(rng.integers(1, 12)), 4 * int(rng.integers(1, 40))
    att = attacker_inputs(rng, 3 + 6, size_a)
    vic = secrets(rng, 2 + 8 + 5, size_v)
    ids = port.next_req_ids(5)
    singles = [(b"attacker", att[0]), (b"double", vic[0]), (b"attacker", att[1]), (b"double_table", vic[1]), (b"attacker", att[2])]
    frames = [_call(r, k, d) for r, (k, d) in zip(ids, singles)]
    order = list(zip(ids, singles))
    for kernel, inputs in ((b"double", vic[2:10]), (b"attacker", att[3:9]), (b"double_table", vic[10:15])):
        group_ids = port.next_req_ids(len(inputs))
        frames.append(group_frames.encode_group(kernel, _hint(kernel, len(inputs[0])), [(r, 60000) for r in group_ids], inputs))
        order += [(r, (kernel, d)) for r, d in zip(group_ids, inputs)]
    futures = port.call_raw_batch(frames, [r for r, _ in order])
    attackers, victims = [], []
    for fut, (_, (kernel, data)) in zip(futures, order):
        reply = fut.result(60)
        (attackers if kernel == b"attacker" else victims).append((kernel, data, reply) if kernel != b"attacker" else (data, reply))
    busy.result(30)
    return attackers, victims, delta(counts(port), before)


def _hint(kernel: bytes, size: int) -> int:
    return -(-ATTACKER_OUT // size) if kernel == b"attacker" else 1


def _call(req_id: int, kernel: bytes, data: bytes) -> bytes:
    return terms.encode((terms.atom("call"), req_id, terms.atom("execute_kernel"),
                         (terms.Binary(kernel), terms.Binary(data), _hint(kernel, len(data)))))


def seen_by(data: bytes, reply: bytes) -> tuple[int, np.ndarray]:
    """What an attacker's reply says: arrayLength of its bound input, and the words it read."""
    words = np.frombuffer(reply[: reply.__len__() // 4 * 4], "<u4")
    return int(words[0]), words[1:]


def check_victims(victims: list) -> None:
    for kernel, data, reply in victims:
        x = np.frombuffer(data, "<u4")
        assert reply == (x * np.uint32(2)).tobytes(), kernel


@pytest.mark.parametrize("round_", range(3))
def test_an_attacker_sees_only_its_own_input(default_port, rng, round_):
    """BEFORE (main at 71af1b6): the calls frame's attacker read the double
    caller's secret and reported the span of all three as its arrayLength."""
    attackers, victims, moved = send_mixed(default_port, rng)
    victim_words = {int(w) for _, data, _ in victims for w in np.frombuffer(data, "<u4")}
    for data, reply in attackers:
        reach, words = seen_by(data, reply)
        own = np.frombuffer(data, "<u4")
        assert not victim_words & {int(w) for w in words}, "an attacker read a victim's secret"
        assert reach == len(own), "the attacker's bound input is more than its own"
        assert words[: len(own)].tolist() == own.tolist() and not words[len(own):].any()
    check_victims(victims)
    # Nobody listed: every call-table call (9 attackers, 6 double_table victims) a dispatch of its own.
    assert moved["table_calls"] == 15 and moved["table_dispatches"] == 15


@pytest.fixture(scope="module")
def sharing_port(tmp_path_factory):
    with start(tmp_path_factory.mktemp("kernels"), KEM_SHARED_TABLE_KERNELS="attacker") as client:
        warm(client)
        yield client


@pytest.mark.parametrize("round_", range(2))
def test_a_listed_kernel_shares_only_its_own_rows(sharing_port, rng, round_):
    """The attacker listed: its calls share dispatches (fewer dispatches
    than calls), and what it reaches is attackers' words only."""
    attackers, victims, moved = send_mixed(sharing_port, rng)
    victim_words = {int(w) for _, data, _ in victims for w in np.frombuffer(data, "<u4")}
    attacker_words = {int(w) for data, _ in attackers for w in np.frombuffer(data, "<u4")}
    for data, reply in attackers:
        reach, words = seen_by(data, reply)
        assert not victim_words & {int(w) for w in words}
        assert {int(w) for w in words[:reach]} <= attacker_words | {0}  # padding between rows is zeros
    check_victims(victims)
    # double_table (unlisted): 6 dispatches; the 9 attackers share, one dispatch a batch they are in.
    assert moved["table_calls"] == 15 and 6 + 1 <= moved["table_dispatches"] <= 6 + moved["batches"] < 15


@pytest.fixture(scope="module")
def solo_port(tmp_path_factory):
    with start(tmp_path_factory.mktemp("kernels"), KEM_CROSS_CALLER_DISPATCH="off", KEM_SHARED_TABLE_KERNELS="attacker") as client:
        warm(client)
        yield client


def test_cross_caller_dispatch_off_shares_nothing(solo_port, rng):
    """Off: a plain kernel's group takes a dispatch per call (no slot form),
    a listed call-table kernel too; values numpy's, attackers see their own."""
    attackers, victims, moved = send_mixed(solo_port, rng)
    for data, reply in attackers:
        reach, words = seen_by(data, reply)
        assert reach == len(data) // 4 and words[:reach].tobytes() == data
    check_victims(victims)
    assert (moved["slot_dispatches"], moved["table_dispatches"], moved["table_calls"]) == (0, 15, 15)
    before = counts(solo_port)
    inputs = secrets(rng, 32, 64)
    replies = [f.result(60) for f in solo_port.call_group_async(b"double", inputs)]
    assert replies == [(np.frombuffer(d, "<u4") * np.uint32(2)).tobytes() for d in inputs]
    assert delta(counts(solo_port), before)["slot_dispatches"] == 0


def test_the_default_port_still_runs_a_plain_group_as_one_slot_dispatch(default_port, rng):
    before = counts(default_port)
    inputs = secrets(rng, 32, 64)
    replies = [f.result(60) for f in default_port.call_group_async(b"double", inputs)]
    assert replies == [(np.frombuffer(d, "<u4") * np.uint32(2)).tobytes() for d in inputs]
    assert delta(counts(default_port), before)["slot_dispatches"] == 1


# -- on an executor of the real device: one batch, whatever the mix ------------------


@pytest.fixture(scope="module")
def executor():
    ex = Executor(Config(max_batch=512, shared_table_kernels=["listed"]), Stats())
    ex.open()
    return ex


def test_random_batches_never_show_an_attacker_anothers_bytes(executor, rng):
    """Singles and groups of a listed and an unlisted attacker, of double and
    double_table victims, in random order, one batch each round: an unlisted
    attacker reaches exactly its own input; a listed one only listed
    attackers' words; victims get numpy's values. Both attackers are one
    text, so one compiled pipeline: sharing goes by the id the caller named
    (before that, whichever id compiled first decided for both, and a
    listed attacker read the unlisted one's callers)."""
    sources = {name: source_from_bytes(name, ATTACKER.encode(), "test", "local") for name in ("listed", "unlisted")}
    store = default_stores(None)[0]
    sources.update({name: store.lookup(name) for name in ("double", "double_table")})
    for _ in range(4):
        jobs, answers, sent = [], {}, []
        for key in range(int(rng.integers(6, 20))):
            kernel = str(rng.choice(list(sources)))
            attacker = kernel in ("listed", "unlisted")
            size = 4 * int(rng.integers(1, 30))
            n = int(rng.choice([1, 1, 2, 5, 17]))
            inputs = (attacker_inputs if attacker else secrets)(rng, n, size)
            out = ATTACKER_OUT if attacker else size
            sent += [(kernel, (key, k), data) for k, data in enumerate(inputs)]
            if n == 1:
                jobs.append(Job(KernelCall(kernel, inputs[0], out), sources[kernel],
                                reply=lambda v, k=(key, 0): answers.__setitem__(k, bytes(v)), fail=lambda e, k=(key, 0): answers.__setitem__(k, e)))
            else:
                slots: dict = {}
                job = group_job(sources[kernel], inputs, out, slots)
                job.call = KernelCall(kernel, inputs[0], out)
                jobs.append(job)
                answers[key, "slots"] = slots
        executor.run(jobs)
        for key in [k for k in answers if k[1] == "slots"]:
            answers.update({(key[0], slot): got for slot, got in answers.pop(key).items()})
        listed_words = {int(w) for kernel, _, data in sent if kernel == "listed" for w in np.frombuffer(data, "<u4")}
        for kernel, key, data in sent:
            reply = answers[key]
            own = np.frombuffer(data, "<u4")
            if kernel == "unlisted":
                reach, words = seen_by(data, reply)
                assert reach == len(own) and words[:reach].tolist() == own.tolist() and not words[reach:].any()
            elif kernel == "listed":
                reach, words = seen_by(data, reply)
                assert {int(w) for w in words} <= listed_words | {0}
            else:
                assert reply == (own * np.uint32(2)).tobytes(), kernel


# A "slot form" that does what a fooled rewrite could: slot 3 writes one word
# past its call's output (where the canaries are), the rest double as they should.
STRAY = """
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@group(0) @binding(2) var<uniform> kem_slots: vec4<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let slot = wid.z;
    let i = gid.x;
    if (i < kem_slots.z) { output_words[slot * kem_slots.w + i] = input_words[slot * kem_slots.y + i] * 2u; }
    if (i == 0u && slot == 3u) { output_words[slot * kem_slots.w + kem_slots.z] = 7u; }
}
"""


def run_double_group(ex, inputs: list[bytes]) -> dict:
    answers: dict = {}
    job = group_job(default_stores(None)[0].lookup("double"), inputs, len(inputs[0]), answers)
    job.call = KernelCall("double", inputs[0], len(inputs[0]))
    ex.run([job])
    return answers


def test_a_slot_form_writing_outside_a_slot_fails_its_group_and_is_retired(rng, caplog):
    ex = Executor(Config(), Stats())
    ex.open()
    inputs = secrets(rng, 12, 16)
    want = {k: (np.frombuffer(d, "<u4") * np.uint32(2)).tobytes() for k, d in enumerate(inputs)}
    assert run_double_group(ex, inputs) == want  # its real slot form: canaries intact
    assert ex.stats.count("slot_dispatches") == 1 and ex.stats.count("slot_faults") == 0
    (serial, form), = ex.pipelines.slots._forms.items()
    device = ex.gpu.require()
    stray = device.create_compute_pipeline(
        layout=device.create_pipeline_layout(bind_group_layouts=[form.layout]),
        compute={"module": device.create_shader_module(code=STRAY), "entry_point": "main"})
    ex.pipelines.slots._forms[serial] = SlotForm(stray, form.layout, SlotKernel(STRAY, "main", 4, 4))
    ex.pipelines.slots._groups.clear()  # bind groups are per form's layout: the same layout, kept anyway
    with caplog.at_level(logging.ERROR, logger="kem_port.gpu.group.group_stage"):
        got = run_double_group(ex, secrets(rng, 12, 16))
    assert sorted(got) == list(range(12))
    assert {(e.reason, "outside a call's slot" in e.detail) for e in got.values()} == {("internal", True)}
    assert any("wrote outside a slot" in r.getMessage() and "double" in r.getMessage() for r in caplog.records)
    assert ex.stats.count("slot_faults") == 1 and ex.stats.count("slot_dispatches") == 2
    for _ in range(2):  # later groups: one dispatch per call, right values
        inputs = secrets(rng, 9, 64)
        assert run_double_group(ex, inputs) == {k: (np.frombuffer(d, "<u4") * np.uint32(2)).tobytes() for k, d in enumerate(inputs)}
    assert ex.stats.count("slot_dispatches") == 2
    ex.rebuild()  # a new device, caches cleared: still retired
    inputs = secrets(rng, 5, 16)
    assert len(run_double_group(ex, inputs)) == 5 and ex.stats.count("slot_dispatches") == 2
