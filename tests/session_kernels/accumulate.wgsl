// accumulate: acc[i] += input word (i mod input words); state stays in the session.
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@group(0) @binding(3) var<storage, read_write> acc: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * 64u;
    if (i >= arrayLength(&acc)) {
        return;
    }
    acc[i] = acc[i] + input_words[i % arrayLength(&input_words)];
    if (i < arrayLength(&output_words)) {
        output_words[i] = acc[i];
    }
}
