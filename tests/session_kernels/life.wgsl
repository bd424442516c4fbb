// life: one generation of Conway's game of life on a w x h torus of u32 cells (0 or 1).
struct Size { w: u32, h: u32 }
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@group(0) @binding(2) var<uniform> size: Size;
@group(0) @binding(3) var<storage, read> cur: array<u32>;
@group(0) @binding(4) var<storage, read_write> next: array<u32>;

@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let w = size.w;
    let h = size.h;
    if (gid.x >= w || gid.y >= h) {
        return;
    }
    var n = 0u;
    for (var dy = 0u; dy < 3u; dy++) {
        for (var dx = 0u; dx < 3u; dx++) {
            if (dx != 1u || dy != 1u) {
                let x = (gid.x + w + dx - 1u) % w;
                let y = (gid.y + h + dy - 1u) % h;
                n += cur[y * w + x];
            }
        }
    }
    let alive = cur[gid.y * w + gid.x];
    next[gid.y * w + gid.x] = select(0u, 1u, n == 3u || (alive == 1u && n == 2u));
}
