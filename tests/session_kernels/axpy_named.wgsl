// y += k * x in place, in the style of ML kernel libraries: the uniform at
// binding 0, the in/out buffer last. Not kem@1.0-shaped: every buffer by name.
struct Params { n: u32, k: u32 }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < params.n) {
        y[gid.x] = y[gid.x] + params.k * x[gid.x];
    }
}
