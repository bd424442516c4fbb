// spin: waits for a word no one writes (input word 0 == 12345): a runaway
// that only its gas budget ends (docs/metering.md, "Sessions and chains").
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    var turns = 0u;
    while (input_words[0] != 12345u) {
        turns += 1u;
    }
    if (gid.x < arrayLength(&output_words)) {
        output_words[gid.x] = turns;
    }
}
