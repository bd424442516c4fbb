// Not a session kernel: a texture, and kem binds buffers only.
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@group(0) @binding(3) var picture: texture_2d<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < arrayLength(&output_words)) {
        output_words[gid.x] = u32(textureLoad(picture, vec2<i32>(0, 0), 0).x);
    }
}
