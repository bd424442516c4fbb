// double_table: the double kernel written for the call table (docs/dispatch.md):
// kem runs every small call to it in one batch as one dispatch.
//
// Input, output: as double.wgsl -- output word i is 2 * input word i, and 0 for
//         words past the end of the input.
// Dispatch: one invocation per output word of all the batch's calls; row
//         kem_calls[c] says where call c's input and output words are.
struct KemCall { input_offset: u32, input_words: u32, output_offset: u32, output_words: u32 }

@group(0) @binding(0) var<storage, read> input_words: array<u32>;
@group(0) @binding(1) var<storage, read_write> output_words: array<u32>;
@group(0) @binding(3) var<storage, read> kem_calls: array<KemCall>;

// The call that owns output word `item`: rows ascend by output_offset.
fn kem_call_of(item: u32) -> KemCall {
    var lo = 0u;
    var hi = arrayLength(&kem_calls) - 1u;
    while (lo < hi) {
        let mid = (lo + hi + 1u) / 2u;
        if (kem_calls[mid].output_offset <= item) { lo = mid; } else { hi = mid - 1u; }
    }
    return kem_calls[lo];
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>,
        @builtin(num_workgroups) groups: vec3<u32>) {
    let item = gid.x + gid.y * groups.x * 256u;
    if (item >= arrayLength(&output_words)) {
        return;
    }
    let call = kem_call_of(item);
    let k = item - call.output_offset;
    var value = 0u;
    if (k < call.input_words) {
        value = input_words[call.input_offset + k];
    }
    output_words[item] = value * 2u;
}
