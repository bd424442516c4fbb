// data *= SCALE in place; the host picks the workgroup size (WG) and SCALE.
override WG: u32;
override SCALE: u32 = 3u;
@group(0) @binding(0) var<storage, read_write> data: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < arrayLength(&data)) {
        data[gid.x] = data[gid.x] * SCALE;
    }
}
