// Several outputs: sum and difference of a and b, both new buffers.
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read> b: array<u32>;
@group(0) @binding(2) var<storage, read_write> total: array<u32>;
@group(0) @binding(3) var<storage, read_write> diff: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < arrayLength(&total)) {
        total[gid.x] = a[gid.x] + b[gid.x];
        diff[gid.x] = a[gid.x] - b[gid.x];
    }
}
