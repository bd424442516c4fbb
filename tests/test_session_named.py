"""Sessions and chains with the general binding model (issue 25 item 4) and
copy/clear steps (issue 29), against numpy on fresh random data, through a
real port (docs/sessions.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import reference
from conftest import start_port

from kem_port.client import PortError
from kem_port.gpu.named.binding_model import NEEDS_DISPATCH

KERNELS = str(Path(__file__).resolve().parent / "session_kernels")


def words(*values: int) -> bytes:
    return np.array(values, dtype="<u4").tobytes()


def u32(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<u4")


@pytest.fixture(scope="module")
def sport():
    with start_port(KEM_KERNEL_DIR=KERNELS) as client:
        yield client


@pytest.fixture
def session(sport):
    s = sport.session_open()
    yield s
    try:
        s.close()
    except PortError:
        pass


@pytest.mark.parametrize("n", [1, 63, 1000, 40_000])
def test_in_place_update_with_a_uniform_at_binding_0(session, rng, n):
    x, y = (rng.integers(0, 2**32, n, dtype=np.uint32) for _ in range(2))
    k = int(rng.integers(1, 2**32))
    session.create("x", x.tobytes())
    session.create("y", y.tobytes())
    got = session.call("axpy_named", buffers={"params": words(n, k)}, grid=(n, 1, 1))
    assert got == {}  # nothing made for the call; y changed in place
    assert np.array_equal(u32(session.read("y")), y + np.uint32(k) * x)
    # bind renames: the same kernel on other session buffers, twice in one chain.
    session.create("w", y.tobytes())
    step = {"kernel": "axpy_named", "buffers": {"params": words(n, k)}, "grid": (n, 1, 1), "bind": {"y": "w"}}
    assert session.chain([step, step], returns=["w"]) == {"w": (y + np.uint32(k) * x + np.uint32(k) * x).tobytes()}


@pytest.mark.parametrize("rows, cols", [(1, 1), (13, 37), (64, 100)])
def test_two_inputs_second_group_and_high_uniform_with_a_grid(session, rng, rows, cols):
    a, b = (rng.integers(0, 2**32, rows * cols, dtype=np.uint32) for _ in range(2))
    session.create("a", a.tobytes())
    got = session.call("add_grid", buffers={"b": b.tobytes(), "shape": words(rows, cols)},
                       outputs={"c": rows * cols * 4}, grid=(cols, rows, 1))
    assert got == {"c": (a + b).tobytes()}
    # The output made by one step is read by the next, and returned by name.
    steps = [{"kernel": "add_grid", "buffers": {"b": b.tobytes(), "shape": words(rows, cols)},
              "outputs": {"c": rows * cols * 4}, "grid": (cols, rows, 1)},
             {"kernel": "add_grid", "buffers": {"shape": words(rows, cols)}, "bind": {"b": "c", "c": "e"},
              "outputs": {"e": rows * cols * 4}, "grid": (cols, rows, 1)}]
    assert session.chain(steps, returns=["c", "e"]) == {"c": (a + b).tobytes(), "e": (a + a + b).tobytes()}


def test_several_outputs_come_back_by_name(sport, rng):
    for n in (5, 4096):
        a, b = (rng.integers(0, 2**32, n, dtype=np.uint32) for _ in range(2))
        got = sport.chain([{"kernel": "two_out", "buffers": {"a": a.tobytes(), "b": b.tobytes()},
                            "outputs": {"total": 4 * n, "diff": 4 * n}, "grid": (n, 1, 1)}])
        assert got == {"total": (a + b).tobytes(), "diff": (a - b).tobytes()}


@pytest.mark.parametrize("wg, scale", [(32, None), (64, 7), (256, 2**20)])
def test_constants_size_the_workgroup_and_scale(session, rng, wg, scale):
    n = int(rng.integers(1, 5000))
    data = rng.integers(0, 2**32, n, dtype=np.uint32)
    session.create("data", data.tobytes())
    constants = {"WG": wg} | ({"SCALE": scale} if scale is not None else {})
    session.call("scale_override", constants=constants, grid=(n, 1, 1))
    assert np.array_equal(u32(session.read("data")), data * np.uint32(3 if scale is None else scale))
    with pytest.raises(PortError) as exc:  # WG has no default
        session.call("scale_override", grid=(n, 1, 1))
    assert exc.value.reason in ("bad_args", "bad_kernel")


def test_no_guessed_dispatch_for_a_kernel_outside_kem_1_0s_shape(session, sport):
    session.create("x", 64)
    session.create("y", 64)
    with pytest.raises(PortError) as exc:
        session.call("axpy_named", buffers={"params": words(16, 1)})
    assert (exc.value.reason, exc.value.detail) == ("bad_args", NEEDS_DISPATCH)
    with pytest.raises(PortError) as exc:
        session.chain([{"kernel": "double"}, {"kernel": "axpy_named", "buffers": {"params": words(16, 1)}}], input=words(1))
    assert (exc.value.reason, exc.value.step, exc.value.detail) == ("bad_args", 2, NEEDS_DISPATCH)


def test_named_binding_refusals(session):
    session.create("x", 64)
    session.create("y", 64)
    p = {"params": words(16, 1)}
    cases = [
        ({"buffers": p, "grid": (16, 1, 1), "bind": {"x": "y"}}, "bad_args", "bound twice"),  # y read and written
        ({"grid": (16, 1, 1)}, "bad_args", "uniform 'params'"),  # a uniform takes the step's bytes
        ({"buffers": p, "grid": (16, 1, 1), "bind": {"y": "nope"}}, "no_buffer", "'nope'"),
        ({"buffers": p, "grid": (16, 1, 1), "params": words(1)}, "bad_args", "params"),  # kem@1.0's binding 2
        ({"buffers": p, "grid": (16, 1, 1), "outputs": {"x": 64}}, "bad_args", "var<storage, read>"),
        ({"buffers": p | {"zz": b"1234"}, "grid": (16, 1, 1)}, "bad_args", "'zz'"),
        ({"buffers": p, "grid": (16, 1, 1), "outputs": {"y": 64}}, "bad_args", "exists"),
    ]
    for opts, reason, words_in in cases:
        with pytest.raises(PortError) as exc:
            session.call("axpy_named", **opts)
        assert exc.value.reason == reason and words_in in exc.value.detail, (opts, exc.value.detail)
    assert session.read("y") == bytes(64)  # nothing ran


@pytest.mark.parametrize("size", [16, 4096, 100_000])
def test_kernel_copy_kernel_and_clear(session, rng, size):
    data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    session.create("keep", size)
    half = size // 2 // 4 * 4
    steps = [
        {"kernel": "double", "output": "t", "output_size": size},
        {"copy": ("t", 0, "keep", 0, size)},
        {"clear": ("t", half, size - half)},
        {"kernel": "double", "input": "t", "output": "u", "output_size": size},
    ]
    once = reference.double(data, size)
    got = session.chain(steps, input=data, returns=["keep", "t", "u"])
    cleared = once[:half] + bytes(size - half)
    assert got == {"keep": once, "t": cleared, "u": reference.double(cleared, size)}
    assert session.read("keep") == once  # the copy's destination is the session's


@pytest.mark.parametrize("n", [2, 64, 1024])
def test_bitonic_sort_with_copy_steps(session, rng, n):
    """The WebGPU samples' bitonic sort: one pass kernel per (k, j), each
    followed by a copy step back (was a hand-written copy kernel per pass)."""
    data = rng.integers(0, 2**32, n, dtype=np.uint32)
    session.create("src", data.tobytes())
    session.create("dst", 4 * n)
    steps = []
    k = 2
    while k <= n:
        j = k // 2
        while j >= 1:
            steps += [{"kernel": "bitonic_pass", "buffers": {"pass_": words(k, j)}, "grid": (n, 1, 1)},
                      {"copy": ("dst", 0, "src", 0, 4 * n)}]
            j //= 2
        k *= 2
    assert session.chain(steps, returns=["src"]) == {"src": np.sort(data).tobytes()}
    # The same sort with a copy kernel per pass, as it was written before copy steps.
    session.write("src", 0, data.tobytes())
    by_kernel = [{"kernel": "copy_words", "input": "dst", "output": "src"} if "copy" in step else step for step in steps]
    assert session.chain(by_kernel, returns=["src"]) == {"src": np.sort(data).tobytes()}


def test_copy_and_clear_refusals_name_the_step(session, rng):
    start = rng.integers(0, 2**32, 16, dtype=np.uint32).tobytes()
    session.create("a", start)
    session.create("b", 64)
    ok = {"copy": ("a", 0, "b", 0, 64)}
    cases = [
        ({"copy": ("a", 2, "b", 0, 4)}, "bad_args", "multiple of 4"),
        ({"copy": ("a", 0, "b", 0, 6)}, "bad_args", "multiple of 4"),
        ({"copy": ("a", 32, "b", 0, 64)}, "bad_args", "outside buffer 'a'"),
        ({"copy": ("a", 0, "b", 60, 8)}, "bad_args", "outside buffer 'b'"),
        ({"copy": ("a", 0, "a", 32, 16)}, "bad_args", "itself"),  # WebGPU: never within one buffer
        ({"copy": ("a", 0, "nope", 0, 4)}, "no_buffer", "'nope'"),
        ({"clear": ("b", 4, 64)}, "bad_args", "outside buffer 'b'"),
        ({"clear": ("b", 1, 4)}, "bad_args", "multiple of 4"),
        ({"copy": ("a", 0, "b", 0)}, "bad_args", "{Src, SrcOffset, Dst, DstOffset, Size}"),
        ({"clear": ("b", 0, 4), "kernel": "double"}, "bad_args", "alone"),
    ]
    for bad, reason, words_in in cases:
        with pytest.raises(PortError) as exc:
            session.chain([ok, bad], returns=["b"])
        assert (exc.value.reason, exc.value.step) == (reason, 2) and words_in in exc.value.detail, (bad, exc.value.detail)
    assert session.read("b") == bytes(64)  # step 1 never ran


def test_a_chain_steps_shader_error_names_its_kernel(tmp_path):
    (tmp_path / "broken.wgsl").write_text(
        "@group(0) @binding(0) var<storage, read> a: array<u32>;\n"
        "@group(0) @binding(1) var<storage, read_write> b: array<u32>;\n"
        "@compute @workgroup_size(64)\nfn main() { b[0] = a[0] +; }\n")
    with start_port(KEM_KERNEL_DIR=str(tmp_path)) as port:
        with pytest.raises(PortError) as exc:
            port.chain([{"kernel": "double"}, {"kernel": "broken"}], input=words(1))
        assert (exc.value.reason, exc.value.step) == ("shader_error", 2)
        assert "Shader 'broken'" in exc.value.detail and "Shader ''" not in exc.value.detail
        # session_call is one step: its refusal is a plain {Reason, Detail},
        # the admission's too (it came back as #{step => 1, ...}).
        with pytest.raises(PortError) as exc:
            port.session_open().call("broken", words(1))
        assert (exc.value.reason, exc.value.step) == ("shader_error", None)
        assert "Shader 'broken'" in exc.value.detail


def test_webgpu_limits_and_fixed_sizes_are_checked_before_submit(tmp_path):
    many = "".join(f"@group(0) @binding({i}) var<storage, read> in{i}: array<u32>;\n" for i in range(8))
    (tmp_path / "nine.wgsl").write_text(
        many + "@group(0) @binding(8) var<storage, read_write> out: array<u32>;\n"
        "@compute @workgroup_size(1)\nfn main() { out[0] = " + " + ".join(f"in{i}[0]" for i in range(8)) + "; }\n")
    (tmp_path / "fixed.wgsl").write_text(
        "@group(0) @binding(0) var<storage, read_write> table: array<u32, 64>;\n"
        "@compute @workgroup_size(64)\nfn main(@builtin(global_invocation_id) g: vec3<u32>) { table[g.x] = g.x; }\n")
    with start_port(KEM_KERNEL_DIR=str(tmp_path)) as port:
        s = port.session_open()
        with pytest.raises(PortError) as exc:
            s.call("nine", grid=(1, 1, 1))
        assert exc.value.reason == "bad_kernel" and "9 storage buffers" in exc.value.detail
        s.create("table", 64)  # 16 words of a 64-word array
        with pytest.raises(PortError) as exc:
            s.call("fixed", grid=(64, 1, 1))
        assert exc.value.reason == "bad_args" and "256 bytes" in exc.value.detail
        s.free("table")
        s.create("table", 256)
        assert s.call("fixed", grid=(64, 1, 1)) == {}
        assert s.read("table") == np.arange(64, dtype="<u4").tobytes()


def test_hostile_step_terms_are_refused_and_the_port_answers_after(session, sport):
    session.create("a", 64)
    session.create("b", 64)
    cases = [
        ({"copy": (7, 0, "b", 0, 4)}, "bad_args"),  # a name that is not one
        ({"copy": ("a", 0, "b", 0, 2**40)}, "too_large"),
        ({"copy": ("a", -4, "b", 0, 4)}, "bad_args"),
        ({"copy": ["a", 0, "b", 0, 4]}, "bad_args"),  # a list, not the tuple
        ({"copy": ("a", 0, "b", 0, 4), "clear": ("b", 0, 4)}, "bad_args"),
        ({"clear": ("a", 0, 2**40)}, "too_large"),
        ({"kernel": "axpy_named", "buffers": [1, 2], "grid": (1, 1, 1)}, "bad_args"),
        ({"kernel": "axpy_named", "buffers": {"params": [1]}, "grid": (1, 1, 1)}, "bad_args"),
        ({"kernel": "axpy_named", "buffers": {"params": words(1)}, "grid": (1, 1, 1)}, "bad_args"),  # shorter than Params
        ({"kernel": "double", "constants": {"NOPE": 1}}, "bad_args"),
    ]
    for bad, reason in cases:
        with pytest.raises(PortError) as exc:
            session.chain([{"clear": ("a", 0, 4)}, bad], returns=["a"])
        assert (exc.value.reason, exc.value.step) == (reason, 2), (bad, exc.value)
        assert "OtpErlang" not in exc.value.detail and "/work" not in exc.value.detail
    assert sport.call("execute", b"double", words(21), {}) == words(42)


@pytest.mark.parametrize("n", [1, 300, 20_000])
def test_constants_on_a_kem_1_0_shaped_step_and_input_no_step_reads(session, rng, n):
    data = rng.integers(0, 2**32, n, dtype=np.uint32)
    steps = [{"kernel": "scaled"}, {"kernel": "scaled", "constants": {"SCALE": 7}}, {"kernel": "scaled", "constants": {"SCALE": 2}}]
    assert session.chain(steps, input=data.tobytes()) == (data * np.uint32(28)).tobytes()
    session.create("x", 4 * n)
    session.create("y", 4 * n)
    with pytest.raises(PortError) as exc:  # a by-name kernel reads no Input: refused, not ignored
        session.call("axpy_named", data.tobytes(), buffers={"params": words(n, 1)}, grid=(n, 1, 1))
    assert (exc.value.reason, exc.value.step) == ("bad_args", None) and "no step reads them" in exc.value.detail
