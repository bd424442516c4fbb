// out[i] = 0 + 1 + ... + (inp[i] - 1): inp[i] turns an invocation, none past the
// data. The gas tests' kernel whose gas is counted by hand (pytest and eunit read it).
@group(0) @binding(0) var<storage, read> inp: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  if (g.x >= arrayLength(&out)) { return; }
  var acc = 0u;
  for (var k = 0u; k < inp[g.x]; k++) { acc += k; }
  out[g.x] = acc;
}
