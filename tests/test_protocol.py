"""The wire: envelopes, argument checks, malformed frames, stdout isolation,
many requests in flight, exit on EOF. All against the real port process."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from concurrent.futures import wait

import erlang
import numpy as np
import pytest

from conftest import start_port
from kem_port.wire import terms
from kem_port.client import PortError


def error_of(port, *call):
    with pytest.raises(PortError) as info:
        port.call(*call)
    return info.value.reason, info.value.detail


def test_hello_ping_adapter_info(port):
    assert port.call("hello") == b"Hello world!"
    assert terms.atom_name(port.call("ping")) == "pong"
    info = json.loads(port.call("adapter_info"))
    for key in ("name", "vendor", "device", "driver", "backend", "driver_info", "adapter_type"):
        assert key in info
    # The original's types: PCI ids as integers, backend lower-case.
    assert isinstance(info["vendor"], int) and isinstance(info["device"], int)
    assert info["vendor"] == info["vendor_id"] and info["device"] == info["device_id"]
    assert info["backend"] == info["backend"].lower() and info["backend"]
    assert info["limits"]["max_storage_buffer_binding_size"] > 0


def test_version_names_the_package_and_the_protocol(port):
    """The node checks this at start-up: the package version comes from
    kem_port.__version__ alone, the protocol number from protocol.py."""
    import kem_port
    from kem_port.wire.protocol import PROTOCOL_VERSION

    got = port.call("version")
    assert sorted(terms.atom_name(k) for k in got) == ["package", "protocol"]
    assert terms.binary_bytes(got[terms.atom("package")]) == kem_port.__version__.encode()
    assert got[terms.atom("protocol")] == PROTOCOL_VERSION
    assert PROTOCOL_VERSION == 4 and kem_port.__version__ == "0.2.0"
    with pytest.raises(PortError) as err:
        port.call("version", 1)
    assert err.value.reason == "bad_args"


def test_stats_counts_calls_and_errors(port):
    before = port.call("stats")
    port.call("execute_kernel", b"double", b"abcd", 1)
    error_of(port, "execute_kernel", b"missing", b"abcd", 1)
    after = port.call("stats")
    calls = terms.atom("calls")
    assert after[calls] - before[calls] == 3
    errors = after[terms.atom("errors")]
    assert errors[terms.atom("kernel_not_found")] >= 1


@pytest.mark.parametrize(
    "call,reason",
    [
        (("execute_kernel", b"double", b"abcd", 0), "bad_args"),
        (("execute_kernel", b"double", b"abcd", -1), "bad_args"),
        (("execute_kernel", b"double", 42, 1), "bad_args"),
        (("execute_kernel", b"double", b"abcd"), "bad_args"),
        (("execute_kernel", b"../etc/passwd", b"abcd", 1), "invalid_kernel_id"),
        (("execute_kernel", b"a/b", b"abcd", 1), "invalid_kernel_id"),
        (("execute_kernel", b"", b"abcd", 1), "invalid_kernel_id"),
        (("execute_kernel", b"no_such_kernel", b"abcd", 1), "kernel_not_found"),
        (("execute_kernel", b"double", b"abcd", 2**40), "too_large"),
        (("execute_kernel_with_params", b"double", b"abcd", b"\x01\x00\x00\x00"), "bad_args"),
        (("execute_kernel", b"pixelize", b"abcd", 1), "bad_args"),
        (("execute_kernel_with_params", b"pixelize", b"abcd", b""), "bad_args"),
        (("execute", b"double", b"abcd", {"bogus": 1}), "bad_args"),
        (("execute", b"double", b"abcd", {"output_size": 4, "output_size_hint": 1}), "bad_args"),
        (("execute", b"double", b"abcd", {"workgroups": (0, 1, 1)}), "bad_args"),
        (("execute", b"double", b"abcd", {"workgroups": (70000, 1, 1)}), "too_large"),
        (("execute", b"double", b"abcd", {"entry_point": b"nope"}), "bad_kernel"),
        (("execute", b"double", b"abcd", []), "bad_args"),
        (("hello", 1), "bad_args"),
        (("no_such_method",), "unknown_method"),
    ],
)
def test_bad_arguments_get_clear_errors(port, call, reason):
    got, detail = error_of(port, *call)
    assert got == reason, detail
    assert detail


def test_limits_are_configurable(kernel_dir):
    with start_port(KEM_MAX_OUTPUT_BYTES="1024") as port:
        assert port.call("execute_kernel", b"double", bytes(256), 4) == bytes(1024)
        reason, detail = error_of(port, "execute_kernel", b"double", bytes(256), 5)
        assert reason == "too_large" and "KEM_MAX_OUTPUT_BYTES" in detail


BAD_WGSL = "fn main( {"
WRONG_BINDINGS = """
@group(1) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64) fn main() { out[0] = 1u; }
"""
NOT_COMPUTE = """
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> b: array<u32>;
@vertex fn main() -> @builtin(position) vec4<f32> { return vec4<f32>(); }
"""
TYPE_ERROR = """
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> b: array<u32>;
@compute @workgroup_size(64) fn main() { b[0] = 1.5; }
"""
CONST_SIZE = """
const WG: u32 = 64u;
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> b: array<u32>;
@compute @workgroup_size(WG) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x < arrayLength(&b)) { b[g.x] = a[g.x] + 3u; }
}
"""


def test_bad_kernels(kernel_dir):
    for name, text in {"bad": BAD_WGSL, "wrong": WRONG_BINDINGS, "vertex": NOT_COMPUTE, "typed": TYPE_ERROR, "constwg": CONST_SIZE}.items():
        (kernel_dir / f"{name}.wgsl").write_text(text)
    with start_port(KEM_KERNEL_DIR=str(kernel_dir)) as port:
        reason, detail = error_of(port, "execute_kernel", b"bad", b"abcd", 1)
        assert reason == "shader_error" and "expected" in detail  # naga's own words
        reason, detail = error_of(port, "execute_kernel", b"typed", b"abcd", 1)
        assert reason == "shader_error"
        reason, detail = error_of(port, "execute_kernel", b"wrong", b"abcd", 1)
        assert reason == "bad_kernel" and "group 0" in detail
        reason, detail = error_of(port, "execute_kernel", b"vertex", b"abcd", 1)
        assert reason == "bad_kernel"
        # workgroup_size from a const: kem reads the const (constants.resolve_entry),
        # so the default dispatch applies...
        assert port.call("execute_kernel", b"constwg", struct.pack("<I", 41), 1) == struct.pack("<I", 44)
        # ...and the caller's explicit workgroups still run it.
        out = port.call("execute", b"constwg", struct.pack("<2I", 1, 2), {"workgroups": (1, 1, 1)})
        assert struct.unpack("<2I", out) == (4, 5)
        # The port is still fine after all of that.
        assert port.call("execute_kernel", b"double", bytes([1, 3, 5, 7]), 1) == bytes([2, 6, 10, 14])


def raw_reply(port, payload: bytes):
    """Send a raw frame; the reply carries ReqId undefined, so it is unmatched."""
    n = len(port.unmatched)
    port.send_raw(payload)
    deadline = time.monotonic() + 10
    while len(port.unmatched) == n and time.monotonic() < deadline:
        time.sleep(0.005)
    return port.unmatched[n]


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"garbage",
        b"\x83",
        b"\x83h\x04",  # truncated tuple
        erlang.term_to_binary((1, 2, 3)),
        erlang.term_to_binary((terms.atom("call"), -1, terms.atom("ping"), ())),
        erlang.term_to_binary((terms.atom("call"), terms.atom("x"), terms.atom("ping"), ())),
        erlang.term_to_binary((terms.atom("call"), 1, terms.atom("ping"), ())) + b"junk",
        b"\x83P\x00\x00\x10\x00x\x9c\x03\x00\x00\x00\x00\x01",  # compressed term
        b"\x83" + b"l\x00\x00\x00\x01" * 50000 + b"jj",  # nested too deeply
    ],
)
def test_malformed_frames_get_error_and_port_survives(port, payload):
    reply = raw_reply(port, payload)
    assert terms.atom_name(reply[0]) == "reply" and reply[1] is None
    status, (reason, detail) = reply[2]
    assert terms.atom_name(status) == "error"
    assert terms.atom_name(reason) in ("bad_frame", "bad_request")
    assert port.call("ping") is not None


def test_oversized_frame_is_skipped(kernel_dir):
    with start_port(KEM_MAX_INPUT_BYTES="4096") as port:
        big = erlang.term_to_binary(
            (terms.atom("call"), 5, terms.atom("execute_kernel"), (terms.Binary(b"double"), terms.Binary(bytes(1 << 20)), 1))
        )
        reply = raw_reply(port, big)
        assert terms.atom_name(reply[2][1][0]) == "too_large"
        assert port.call("execute_kernel", b"double", bytes([1, 3, 5, 7]), 1) == bytes([2, 6, 10, 14])


def test_stdout_noise_cannot_corrupt_frames(port):
    assert terms.atom_name(port.call("test_hook", terms.atom("stdout_noise"))) == "ok"
    for _ in range(20):
        assert port.call("execute_kernel", b"double", bytes([1, 3, 5, 7]), 1) == bytes([2, 6, 10, 14])
    assert port.unmatched == [] or all(r[1] is None for r in port.unmatched)


def test_many_requests_in_flight(port, rng):
    inputs = [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in rng.integers(1, 5000, 300)]
    futures = [port.call_async("execute_kernel", b"double", data, 1 + i % 3) for i, data in enumerate(inputs)]
    futures.append(port.call_async("ping"))
    wait(futures, timeout=120)
    for i, (data, fut) in enumerate(zip(inputs, futures)):
        assert fut.result() == __import__("reference").double(data, len(data) * (1 + i % 3))


def test_exit_zero_on_eof():
    port = start_port()
    assert port.call("hello") == b"Hello world!"
    assert port.close(timeout=10) == 0


def test_exit_on_eof_while_gpu_busy():
    port = start_port()
    port.call_async("test_hook", terms.atom("sleep_gpu"), 30_000)
    port.call_async("execute_kernel", b"double", b"abcd", 1)
    time.sleep(0.3)
    started = time.monotonic()
    assert port.close(timeout=10) == 0
    assert time.monotonic() - started < 10.0  # the GPU thread sleeps 30 s


def test_erl_made_frames_are_understood(tmp_path):
    """Frames from a real `erl` term_to_binary, fed to the port as Erlang would."""
    erl = "erl"
    script = (
        'F = fun(T) -> B = term_to_binary(T), [<<(byte_size(B)):32>>, B] end, '
        'ok = file:write_file("%s", [F({call, 1, hello, {}}), '
        'F({call, 2, execute_kernel, {<<"double">>, <<1,3,5,7>>, 1}}), '
        'F({call, 3, execute, {<<"double">>, <<1,2,3,4,5>>, #{output_size_hint => 2, workgroups => {1,1,1}}}}), '
        'F({call, 18446744073709551615, ping, {}})]), halt().' % (tmp_path / "frames")
    )
    try:
        subprocess.run([erl, "-noshell", "-eval", script], check=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("erl is not installed")
    frames = (tmp_path / "frames").read_bytes()
    # Keep stdin open until all four replies are in: at EOF the port exits
    # at once, by design, even with work still queued.
    proc = subprocess.Popen([sys.executable, "-m", "kem_port"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    proc.stdin.write(frames)
    proc.stdin.flush()
    replies = {}
    while len(replies) < 4:
        (n,) = struct.unpack(">I", proc.stdout.read(4))
        reply = erlang.binary_to_term(proc.stdout.read(n))
        if terms.atom_name(reply[0]) == "reply":  # not a log frame (docs/protocol.md)
            replies[reply[1]] = reply[2]
    proc.stdin.close()
    assert proc.wait(30) == 0
    assert terms.binary_bytes(replies[1][1]) == b"Hello world!"
    assert terms.binary_bytes(replies[2][1]) == bytes([2, 6, 10, 14])
    assert terms.binary_bytes(replies[3][1]) == __import__("reference").double(b"\x01\x02\x03\x04\x05", 10)
    assert terms.atom_name(replies[2**64 - 1][1]) == "pong"


def test_shared_memory_transfer(tmp_path, rng):
    """{shm, Path} input and output_shm, as Erlang's kem_shm sends them; paths
    outside KEM_SHM_DIR are refused."""
    shm = tmp_path / "shm"
    shm.mkdir(mode=0o700)  # private, as kem_shm_dir makes it (tests/test_shm.py)
    data = rng.integers(0, 256, 3 * 1024 * 1024 + 3, dtype=np.uint8).tobytes()
    (shm / "1.in").write_bytes(data)
    (tmp_path / "outside.in").write_bytes(data)
    with start_port(KEM_SHM_DIR=str(shm)) as port:
        got = port.call("execute", b"double", (terms.atom("shm"), str(shm / "1.in").encode()),
                        {"output_size_hint": 2, "output_shm": str(shm / "1.out").encode()})
        assert terms.atom_name(got[0]) == "shm" and got[2] == 2 * len(data)
        assert (shm / "1.out").read_bytes() == __import__("reference").double(data, 2 * len(data))
        for bad in (str(tmp_path / "outside.in"), str(shm / ".." / "outside.in"), str(shm / "missing.in")):
            reason, _ = error_of(port, "execute", b"double", (terms.atom("shm"), bad.encode()), {})
            assert reason == "bad_args"
        reason, _ = error_of(port, "execute", b"double", b"abcd", {"output_shm": str(tmp_path / "x.out").encode()})
        assert reason == "bad_args"
    with start_port() as port:  # no KEM_SHM_DIR: no shared memory at all
        reason, _ = error_of(port, "execute", b"double", (terms.atom("shm"), str(shm / "1.in").encode()), {})
        assert reason == "bad_args"


@pytest.mark.parametrize("key, named", [
    (erlang.OtpErlangAtom(b"outptu"), "'outptu'"),
    (erlang.OtpErlangBinary(b"1x", 8), "'1x'"),
    (7, "7"),
    (erlang.OtpErlangBinary(b"\x1b[31m" + b"a" * 100, 8), "'\\x1b[31m" + "a" * 32 + "...'"),
])
def test_a_bad_key_is_named_in_plain_words_not_pythons_repr(key, named):
    """Untrusted keys in refusals read as the caller wrote them (an Erlang
    caller once read `unknown option OtpErlangAtom('outptu')`), escaped and
    bounded."""
    from kem_port.errors import KemError
    from kem_port.wire import protocol

    with pytest.raises(KemError) as caught:
        protocol.options({key: 1}, ("output_size",), "Opts", "option")
    assert caught.value.detail == f"unknown option {named}; known: output_size"
    assert "Otp" not in caught.value.detail
    with pytest.raises(KemError) as caught:
        protocol.constants({key: 1}) if not isinstance(key, erlang.OtpErlangAtom) else protocol.constants({(1, 2): 1})
    assert "Otp" not in caught.value.detail and "(1, 2)" not in caught.value.detail
