// double: every little-endian u32 word of the input, times two (wrapping).
//
// Input:  any bytes; kem zero-pads the last word to 4 bytes.
// Output: output_size bytes (len(input) x hint); word i is 2 * input word i,
//         and 0 for words past the end of the input.
// Dispatch: one invocation per output word. Past 65,535 workgroups kem
//         spills into y, so the index is flattened with num_workgroups.
// Example: <<1,3,5,7>> is the word 0x07050301; doubled 0x0E0A0602, which is
//         <<2,6,10,14>>.
@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * 256u;
    if (i >= arrayLength(&output_words)) {
        return;
    }
    var value = 0u;
    if (i < arrayLength(&input_words)) {
        value = input_words[i];
    }
    output_words[i] = value * 2u;
}
