// One pass of a bitonic sort, out of place as the WebGPU samples' is: each
// invocation writes its own element of dst from src and its partner.
struct Pass { k: u32, j: u32 }
@group(0) @binding(0) var<uniform> pass_: Pass;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= arrayLength(&dst)) {
        return;
    }
    let p = i ^ pass_.j;
    let mine = src[i];
    let theirs = src[p];
    let ascending = (i & pass_.k) == 0u;
    let low = min(mine, theirs);
    let high = max(mine, theirs);
    if ((i < p) == ascending) {
        dst[i] = low;
    } else {
        dst[i] = high;
    }
}
