// A hand-written copy (what a chain needed before copy steps), kem@1.0-shaped:
// a step names its buffers with input and output.
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst_copy: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < arrayLength(&dst_copy)) {
        dst_copy[gid.x] = src[gid.x];
    }
}
