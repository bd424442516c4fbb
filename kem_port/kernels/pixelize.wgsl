// pixelize: mosaic an RGBA8 image into square blocks of their average colour.
//
// Input:  width x height pixels, RGBA8, row-major (4 bytes a pixel, so one
//         u32 word each: R in the low byte).
// Params: width, height, pixel_size (block edge in pixels; 0 acts as 1),
//         one unused word (the original kernel's vec4 layout).
// Output: the same size as the input. Each pixel gets the per-channel
//         integer mean (rounded down) of the block of pixel_size x pixel_size
//         pixels it falls in; blocks at the right and bottom edges are cut
//         to the image.
// Dispatch: kem covers width x height with 16x16 workgroups
//         (ceil(width/16), ceil(height/16), 1), from the first two params.
struct Params {
    width: u32,
    height: u32,
    pixel_size: u32,
    unused: u32,
}

@group(0) @binding(0) var<storage, read> input_pixels: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_pixels: array<u32>;
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(16, 16)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let x = gid.x;
    let y = gid.y;
    if (x >= params.width || y >= params.height) {
        return;
    }
    let size = max(params.pixel_size, 1u);
    let x0 = (x / size) * size;
    let y0 = (y / size) * size;
    let x1 = min(x0 + size, params.width);
    let y1 = min(y0 + size, params.height);
    var sum = vec4<u32>(0u, 0u, 0u, 0u);
    for (var yy = y0; yy < y1; yy = yy + 1u) {
        for (var xx = x0; xx < x1; xx = xx + 1u) {
            let p = input_pixels[yy * params.width + xx];
            sum = sum + vec4<u32>(p & 255u, (p >> 8u) & 255u, (p >> 16u) & 255u, p >> 24u);
        }
    }
    let n = (x1 - x0) * (y1 - y0);
    let m = sum / vec4<u32>(n, n, n, n);
    output_pixels[y * params.width + x] = m.x | (m.y << 8u) | (m.z << 16u) | (m.w << 24u);
}
