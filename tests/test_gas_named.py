"""Gas on the named-buffer road (issue 27; docs/metering.md, "Named-buffer
runs"): the meter's bind group chosen per kernel, runaway named kernels
ended by their budget with the port untouched, looping named kernels still
right, and gas counted by hand."""

from __future__ import annotations

import pytest

from kem_port.errors import KemError
from kem_port.gpu.wgsl import wgsl_gas
from kem_port.gpu.wgsl.wgsl_canonical import canonical


def _kernel(groups: tuple[int, ...], loop: bool = True) -> str:
    decls = "".join(f"@group({g}) @binding(0) var<storage, read_write> b{g}: array<u32>;\n" for g in groups)
    return canonical(decls + "@compute @workgroup_size(1) fn main() { "
                     + ("for (var k = 0u; k < 3u; k++) { } " if loop else "") + f"b{groups[0]}[0] = 1u; }}")


@pytest.mark.parametrize("groups, chosen", [((0,), 1), ((0, 3), 1), ((1,), 0), ((0, 1, 2), 3), ((0, 2, 1), 3)])
def test_the_gas_group_is_the_lowest_group_the_kernel_leaves_free(groups, chosen):
    text = _kernel(groups)
    assert wgsl_gas.gas_group(text) == chosen
    form = wgsl_gas.named_gas_form(text)
    assert form.metered and form.group == chosen
    assert f"@group({chosen}) @binding(0) var<uniform> kem_gas_cap" in form.text
    assert f"@group({chosen}) @binding(1) var<storage, read_write> kem_gas_meter" in form.text


def test_a_looping_kernel_that_declares_all_four_groups_is_refused_naming_the_limit():
    with pytest.raises(KemError) as caught:
        wgsl_gas.named_gas_form(_kernel((0, 1, 2, 3)))
    assert caught.value.reason == "bad_kernel"
    assert "declares all of WebGPU's 4 (0-3)" in caught.value.detail and caught.value.detail.split(":")[0].isdigit()
    # Without a loop there is nothing to meter: the kernel is left as written.
    text = _kernel((0, 1, 2, 3), loop=False)
    assert wgsl_gas.named_gas_form(text) == wgsl_gas.GasForm(text, False)


def test_the_execute_road_keeps_group_1_and_refuses_other_groups():
    assert wgsl_gas.gas_form(_kernel((0,))).group == wgsl_gas.GROUP == 1
    with pytest.raises(KemError) as caught:
        wgsl_gas.gas_form(_kernel((0, 2)))
    assert "@group(0) only" in caught.value.detail


def test_a_group_kem_cannot_read_or_the_meters_own_is_refused_in_a_looping_kernel():
    named = canonical("const G = 0;\n@group(G) @binding(0) var<storage, read_write> b: array<u32>;\n"
                      "@compute @workgroup_size(1) fn main() { loop { break; } b[0] = 1u; }")
    with pytest.raises(KemError) as caught:
        wgsl_gas.named_gas_form(named)
    assert caught.value.reason == "bad_kernel" and "integer literals" in caught.value.detail
    with pytest.raises(KemError) as caught:
        wgsl_gas.gas_form(_kernel((0, 2)), 2)
    assert "the gas meter's @group(2)" in caught.value.detail
