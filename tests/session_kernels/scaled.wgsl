// kem@1.0-shaped with an override: output = input * SCALE, one word each.
override SCALE: u32 = 2u;
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < arrayLength(&output_words)) {
        output_words[gid.x] = input_words[gid.x] * SCALE;
    }
}
