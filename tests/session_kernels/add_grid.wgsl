// c = a + b on a rows x cols grid: two inputs, a second bind group for the
// output and a shape uniform at a high binding, 2-D workgroups (needs a grid).
struct Shape { rows: u32, cols: u32 }
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read> b: array<u32>;
@group(1) @binding(0) var<storage, read_write> c: array<u32>;
@group(1) @binding(7) var<uniform> shape: Shape;

@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < shape.cols && gid.y < shape.rows) {
        let i = gid.y * shape.cols + gid.x;
        c[i] = a[i] + b[i];
    }
}
