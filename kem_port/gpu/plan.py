"""Laying out a batch: each call checked and given its pipeline and
workgroups (:func:`prepare`), then placed in the batch's shared buffers
(:class:`BatchPlan`) and uploaded. Calls to a kernel that declares the call
table are grouped (:class:`TableGroup`): one dispatch per group, outputs
back to back (gpu/call_table.py); a group job of such a kernel joins them,
or past one dispatch's limits has chunked dispatches of its own
(gpu/group_table.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field


from kem_port.gpu.group import call_table, group_table
from kem_port.gpu import contract, gas_meter
from kem_port.gpu.gas_meter import GasSlot
from kem_port.gpu.calls import Job
from kem_port.transfer.file_inputs import FILE_INPUTS, PACK_LIMIT
from kem_port.gpu.session.chain_budget import ChainBudget
from kem_port.gpu.input_upload import pack_slots, upload_file, write_padded, write_slots
from kem_port.gpu.device import Device
from kem_port.gpu.dispatch import plan_dispatch
from kem_port.gpu.pipelines import Pipeline, Pipelines

# Past a plain group's output in each slot: 4 canary words
# (group_stage.CANARY_BYTES), then the slot form's spare element (a vec4 at
# most, 16 bytes) at the slot's end.
SLOT_ROOM = 16 + 16


@dataclass(slots=True)
class Prepared:
    job: Job
    pipeline: Pipeline
    groups: tuple[int, int, int]
    in_size: int
    out_size: int
    u_size: int = 0
    in_offset: int = 0
    out_offset: int = 0
    u_offset: int = 0
    # A group job's slots (gpu/group_job.py) sit this far apart, from the offsets above.
    in_stride: int = 0
    out_stride: int = 0
    # A plain group run through its slot form: the canary bytes of each slot
    # (start, end from the slot's start) to check after the dispatch (group_stage.py).
    canary: tuple[int, int] | None = None
    gas: GasSlot | None = None  # a metered pipeline's cap and meter (gpu/gas_meter.py)


def prepare(job: Job, device: Device, pipelines: Pipelines) -> Prepared:
    """Everything that can fail for one caller alone: limits, compile, dispatch."""
    call = job.call
    contract.check_sizes(call, device.binding_limit, device.uniform_limit)
    pipeline = pipelines.get(device.require(), job.source, call)
    if pipeline.tabled:  # checked per call: the pipeline cache does not key on workgroups
        contract.check_table_call(pipeline.entry, call)
    groups = plan_dispatch(pipeline.entry, call.output_size, call.param_words, call.workgroups, device.dispatch_limits, call.grid)
    if call.workgroups is not None or call.grid is not None:
        # A caller's own workgroups (or grid) are bounded as a chain step's
        # are (red team: {65535, 65535, 64} on a 16-byte call held the GPU
        # thread until the caller's timeout; each dimension alone was checked).
        ChainBudget(device.config.max_output_bytes).add_dispatch(pipeline.entry, groups)
    return Prepared(
        job, pipeline, groups,
        contract.input_binding_size(call), contract.output_binding_size(call), contract.params_binding_size(call),
        gas=None if pipeline.gas_layout is None and call.gas_limit is None else gas_meter.launch_slot(call, pipeline, groups, device.config.gas_limit, device.gas_turns),
    )



class BatchPreparer:
    """prepare() for the calls of one batch. Calls of one shape (kernel,
    entry point, sizes, no params, no explicit workgroups) share what
    prepare() found for the first of them: the checks and the dispatch
    depend on nothing else, and the pipeline is the cached one. At 64
    small calls a batch on lavapipe this took prepare from ~2.4 to ~0.7 us
    a call (scripts/batch_curve.py --stages 64, runs alternating with main)."""

    def __init__(self, device: Device, pipelines: Pipelines) -> None:
        self._device = device
        self._pipelines = pipelines
        self._seen: dict[tuple, Prepared] = {}
        self.reused = 0  # calls that reused a shape: pipeline cache hits not counted by Pipelines.get

    def __call__(self, job: Job) -> Prepared:
        call = job.call
        if call.params is not None or call.workgroups is not None or call.grid is not None or call.constants is not None:
            return prepare(job, self._device, self._pipelines)  # a shape key without them would share across them
        key = (job.source.sha256, call.entry_point, call.debug, len(call.input), call.output_size)
        first = self._seen.get(key)
        if first is None:
            first = self._seen[key] = prepare(job, self._device, self._pipelines)
            return first
        self.reused += 1
        gas = None if first.gas is None and call.gas_limit is None else gas_meter.launch_slot(call, first.pipeline, first.groups, self._device.config.gas_limit, self._device.gas_turns)
        return Prepared(job, first.pipeline, first.groups, first.in_size, first.out_size, first.u_size, gas=gas)


@dataclass
class TableGroup:
    """Calls to one call-table kernel that share one dispatch: the input
    range bound for them, their outputs back to back, their table rows.
    Its items are single calls and whole group jobs (N rows each)."""

    pipeline: Pipeline
    items: list[Prepared] = field(default_factory=list)
    in_offset: int = 0
    in_bytes: int = 0
    out_offset: int = 0
    out_bytes: int = 0
    table_offset: int = 0
    rows: bytes = b""
    words: int = 0  # invocations that do work: one per output word
    calls: int = 0  # rows
    _out: int = 0  # output bytes so far
    gas: GasSlot | None = None  # a metered kernel's: one meter for the dispatch (gpu/gas_meter.py)

    @property
    def alone(self) -> bool:
        """One call: dispatched as planned for it (a large one may spill into y)."""
        return self.calls == 1

    def fits(self, item: Prepared, binding_limit: int, max_words: int) -> bool:
        """Whether `item` (a small one, after the others in the input) can join."""
        if not self.items:
            return True
        span = group_table.input_end(item) - self.items[0].in_offset
        out = self._out + item.job.calls * item.out_size
        shares = _small(item) and _small(self.items[0])  # a large call dispatches alone
        return shares and span <= binding_limit and out <= binding_limit and (out // 4) <= max_words

    def add(self, item: Prepared) -> None:
        self.items.append(item)
        self.calls += item.job.calls
        self._out += item.job.calls * item.out_size

    def lay_out(self, out_start: int, table_start: int) -> None:
        """Outputs from out_start, rows from table_start; the input range
        bound is the span of the group's inputs."""
        self.in_offset = self.items[0].in_offset
        self.in_bytes = group_table.input_end(self.items[-1]) - self.in_offset
        self.rows, self.words = group_table.shared_rows(self.items, self.in_offset, out_start)
        self.out_offset, self.out_bytes = out_start, self.words * 4
        self.table_offset = table_start


def _out_stride(item: Prepared, storage_align: int) -> int:
    """A plain call's output start to the next's. A group's slots keep room
    past the output for the slot form's canary words and its spare element
    (SLOT_ROOM; group_stage.py): 256-byte outputs then sit 512 apart, which
    also lets them take the slot form (no spare element fit before)."""
    room = SLOT_ROOM if item.job.calls > 1 else 0
    return contract.align(item.out_size + room, storage_align)


def _small(item: Prepared) -> bool:
    return len(item.job.call.input) <= PACK_LIMIT and item.out_size <= call_table.MAX_CALL_BYTES


def _table_groups(items: list[Prepared], binding_limit: int, max_groups: int, sharing: call_table.Sharing) -> list[TableGroup]:
    """Group call-table items by pipeline, in input order, each group within
    the binding limit and one row of workgroups (no y spill for a shared
    dispatch; a call alone may spill, as plan_dispatch allowed it). Only a
    kernel that `sharing` lets share has more than one call a group."""
    groups: list[TableGroup] = []
    open_groups: dict[tuple, TableGroup] = {}
    for item in sorted(items, key=lambda i: i.in_offset):
        pipeline = item.pipeline
        size = pipeline.entry.workgroup_size if pipeline.entry is not None else None
        max_words = max_groups * (size[0] if size else 1)
        kernel = _table_key(item)
        group = open_groups.get(kernel)
        if item.gas is not None and item.job.call.usage:  # metered, its gas asked: a meter of its own
            groups.append(TableGroup(pipeline))
            groups[-1].add(item)
            continue
        if group is None or not sharing.shares_table(kernel[1]) or not group.fits(item, binding_limit, max_words):
            group = open_groups[kernel] = TableGroup(pipeline)
            groups.append(group)
        group.add(item)
    return groups


def _table_key(item: Prepared) -> tuple[int, str, int]:
    """Calls that may share a table: one pipeline, kernel id and gas limit (one meter, the strictest
    cap: gas_meter.shared_slot; a stranger's limit of 256 ended its whole table, red team of wave 3)."""
    return item.pipeline.serial, item.job.call.kernel_id, item.gas.limit if item.gas is not None else 0


def _input_order(plain: list[Prepared], shared: list[Prepared], chunked: list[Prepared]) -> tuple[list, list]:
    """(small, large) inputs in the order they are laid out. Small inputs
    first, so the packed upload covers them and nothing else; among them
    the plain calls', then the call-table calls that may share a table,
    each kernel's in one run (a table binds the span from its first call's
    input to its last's, which then holds that kernel's calls and the
    zeroed alignment between them, nobody else's: issue 24's attacker read
    a `double` caller's input between two of its own calls), then groups
    chunked into dispatches of their own. Large inputs, each bound alone, last."""
    by_kernel = sorted(shared, key=_table_key)  # stable: arrival order within
    ordered = plain + by_kernel + chunked
    small = [i for i in ordered if len(i.job.call.input) <= PACK_LIMIT]
    return small, [i for i in ordered if len(i.job.call.input) > PACK_LIMIT]


class BatchPlan:
    """Where each call's input, output and params sit in the batch's shared
    buffers (offsets aligned for binding), and the upload of them. Every
    dispatch binds its own calls' ranges only (docs/dispatch.md, "Who sees what")."""

    def __init__(
        self, items: list[Prepared], storage_align: int, uniform_align: int,
        binding_limit: int = 1 << 62, max_groups: int = 65535, sharing: call_table.Sharing = call_table.NO_SHARING,
    ) -> None:
        self.items = items
        self.plain = [i for i in items if not i.pipeline.tabled]
        # Group jobs share a dispatch with the kernel's other calls, or past one
        # dispatch's limits (or unshared) have chunks of their own (executor._prepare_all let in those that fit).
        shared, chunks = [], []
        self.group_tables = 0
        for item in (i for i in items if i.pipeline.tabled):
            chunk = 1
            if item.job.calls > 1:
                chunk = group_table.chunk_slots(item, storage_align, binding_limit, max_groups, sharing.shares_table(item.job.call.kernel_id))
                self.group_tables += 1
            if chunk < item.job.calls:
                chunks.append((item, chunk))
            else:
                shared.append(item)
        self.small, self.large = _input_order(self.plain, shared, [item for item, _ in chunks])
        self._lay_out_inputs(storage_align)
        out_total = u_total = 0
        for item in self.plain:
            item.out_stride = _out_stride(item, storage_align)
            item.out_offset, out_total = out_total, out_total + item.job.calls * item.out_stride
            if item.u_size:
                item.u_offset, u_total = u_total, u_total + contract.align(item.u_size, uniform_align)
        self.groups = [t for item, chunk in chunks for t in group_table.slot_tables(item, chunk, storage_align)]
        self.groups += _table_groups(shared, binding_limit, max_groups, sharing)
        t_total = 0
        for group in self.groups:
            group.lay_out(out_total, t_total)
            out_total += contract.align(group.out_bytes, storage_align)
            t_total += contract.align(len(group.rows), storage_align)
        self.gas = [i.gas for i in self.plain if i.gas is not None]
        if self.gas or any(i.gas is not None for i in items if i.pipeline.tabled):  # metered dispatches: a cap and meter each
            self.gas += gas_meter.table_slots(self.groups, max_groups)
            out_total, u_total = gas_meter.lay_out(self.gas, out_total, u_total, storage_align, uniform_align)
        self.out_total, self.u_total, self.t_total = out_total, u_total, t_total

    def _lay_out_inputs(self, storage_align: int) -> None:
        in_total = 0
        for item in self.small + self.large:
            item.in_stride = contract.align(item.in_size, storage_align)
            item.in_offset, in_total = in_total, in_total + item.job.calls * item.in_stride
        last = self.small[-1] if self.small else None
        # (A group's whole slots: pack_slots views them as one (N, stride) array.)
        self.small_end = last.in_offset + (last.in_size if last.job.calls == 1 else last.job.calls * last.in_stride) if last else 0
        self.in_total = in_total

    def upload(self, hot, in_buf, u_buf, t_buf=None, take=None) -> list[tuple]:
        """Small inputs and all params go up as one write each, zero-padded;
        large inputs are written from the caller's bytes without a copy, and
        inputs still in their file are read into upload buffers (`take`
        lends them). Returns the (upload buffer, input offset, size) copies
        the encoder must make before the pass."""
        copies = []
        if self.small:
            packed = bytearray(self.small_end)
            for item in self.small:
                if item.job.calls > 1:
                    pack_slots(packed, item)
                else:
                    packed[item.in_offset : item.in_offset + len(item.job.call.input)] = item.job.call.input
            hot.write(in_buf, 0, packed)
        for item in self.large:
            data = item.job.call.input
            if item.job.calls > 1:
                write_slots(hot, in_buf, item)
            elif isinstance(data, FILE_INPUTS):
                copy = upload_file(hot, in_buf, data, item, take)
                if copy is not None:
                    copies.append(copy)
            else:
                write_padded(hot, in_buf, data, item.in_offset, item.in_size)
        if self.u_total:
            params = bytearray(self.u_total)
            for item in self.items:
                if item.job.call.params is not None:
                    params[item.u_offset : item.u_offset + len(item.job.call.params)] = item.job.call.params
            if self.gas:
                gas_meter.write_caps(self.gas, params)
            hot.write(u_buf, 0, params)
        if self.t_total:
            rows = bytearray(self.t_total)
            for group in self.groups:
                rows[group.table_offset : group.table_offset + len(group.rows)] = group.rows
            hot.write(t_buf, 0, rows)
        return copies
