// Binding 3 is a uniform: a step gives its bytes (buffers => #{extra => Bin}),
// since session buffers are storage; without them the step is bad_args.
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@group(0) @binding(3) var<uniform> extra: vec4<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < arrayLength(&output_words)) {
        output_words[gid.x] = extra.x;
    }
}
