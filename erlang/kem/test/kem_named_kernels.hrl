%% Kernels written as their authors write them, for the named-buffer
%% tests (kem_run_tests, dev_kem_run_tests): two inputs and an output at
%% binding 2; a uniform at binding 0, an in-place buffer and an output in a
%% second bind group.
-define(ADD, <<"@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read> b: array<u32>;
@group(0) @binding(2) var<storage, read_write> c: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < arrayLength(&c)) { c[i] = a[i] + b[i]; }
}
">>).
-define(SCALE, <<"struct Params { factor: u32, count: u32 }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> values: array<u32>;
@group(1) @binding(2) var<storage, read_write> doubled: array<u32>;
@compute @workgroup_size(32)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < params.count) {
        values[i] = values[i] * params.factor;
        doubled[i] = values[i] * 2u;
    }
}
">>).
