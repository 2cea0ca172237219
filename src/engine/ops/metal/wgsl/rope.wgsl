// Rotary position embedding, Llama's "half" layout (x1 = x[..d/2], x2 = x[d/2..]) on (b, h, t, d):
// out1 = x1 cos - sign * x2 sin, out2 = x2 cos + sign * x1 sin with cos/sin of shape (t, d/2), or (b, t, d/2) for
// packed rows (each token's own position in its example): then batch_rows = h * t rows share a batch's table, and
// 0 when one table serves every batch.
// sign = 1 is the forward; sign = -1 (rotation by -theta) is the backward, the transpose of the rotation.
// One thread per pair of adjacent outputs of a row (bf16 writes whole words), each output from its two inputs.

struct Params { rows: u32, seq: u32, half_dim: u32, sign: f32, batch_rows: u32, pad0: u32, pad1: u32, pad2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<ET>;
@group(0) @binding(2) var<storage, read> cos_t: array<ET>;
@group(0) @binding(3) var<storage, read> sin_t: array<ET>;
@group(0) @binding(4) var<storage, read_write> out: array<ET>;

@compute @workgroup_size(256)
fn rope(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.rows * p.half_dim) { return; }
    let row = i / p.half_dim;
    let j = 2u * (i % p.half_dim);
    let at = row * 2u * p.half_dim;
    let batch_table = select(0u, (row / max(p.batch_rows, 1u)) * p.seq, p.batch_rows > 0u);
    let pos = batch_table + row % p.seq;
    store2_out(at + j, vec2<f32>(turned(at, pos, j), turned(at, pos, j + 1u)));
}

// Output j of the row at `at` (table row `pos`): x1 cos - sign x2 sin in the first half, x2 cos + sign x1 sin in
// the second.
fn turned(at: u32, pos: u32, j: u32) -> f32 {
    let h = p.half_dim;
    let k = select(j, j - h, j >= h);
    let c = load_cos_t(pos * h + k);
    let s = p.sign * load_sin_t(pos * h + k);
    if (j < h) { return load_x(at + k) * c - load_x(at + k + h) * s; }
    return load_x(at + k + h) * c + load_x(at + k) * s;
}
