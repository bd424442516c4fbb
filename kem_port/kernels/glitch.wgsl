// glitch: tear an RGBA8 image into shifted horizontal bands with split colour.
//
// Input:  width x height pixels, RGBA8, row-major, one u32 word a pixel.
// Params: width, height, seed, strength (largest shift in pixels; 0 acts
//         as 1).
// Output: the same size as the input. Rows are grouped in bands of 8; a
//         hash of (band, seed) picks about one band in four and a shift s
//         below strength. In such a band red is read s pixels to the right
//         and blue s pixels to the left (both wrapping within the row);
//         green and alpha stay. Other bands are copied unchanged.
// Dispatch: (ceil(width/16), ceil(height/16), 1), from the first two params.
struct Params {
    width: u32,
    height: u32,
    seed: u32,
    strength: u32,
}

@group(0) @binding(0) var<storage, read> input_pixels: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_pixels: array<u32>;
@group(0) @binding(2) var<uniform> params: Params;

// A small integer hash (a permuted congruential step); every operation
// wraps at 32 bits, so numpy's uint32 arithmetic reproduces it exactly.
fn mix(v: u32) -> u32 {
    let state = v * 747796405u + 2891336453u;
    let word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
    return (word >> 22u) ^ word;
}

@compute @workgroup_size(16, 16)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let x = gid.x;
    let y = gid.y;
    let w = params.width;
    if (x >= w || y >= params.height) {
        return;
    }
    let r = mix((y / 8u) ^ (params.seed * 2654435761u));
    var shift = 0u;
    if ((r & 3u) == 0u) {
        shift = ((r >> 2u) % max(params.strength, 1u)) % w;
    }
    let row = y * w;
    let red = input_pixels[row + (x + shift) % w];
    let here = input_pixels[row + x];
    let blue = input_pixels[row + (x + w - shift) % w];
    output_pixels[row + x] = (red & 0xffu) | (here & 0xff00ff00u) | (blue & 0xff0000u);
}
