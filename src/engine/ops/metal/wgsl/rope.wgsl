// Rotary position embedding, Llama's "half" layout (x1 = x[..d/2], x2 = x[d/2..]) on (b, h, t, d):
// out1 = x1 cos - sign * x2 sin, out2 = x2 cos + sign * x1 sin with cos/sin of shape (t, d/2).
// sign = 1 is the forward; sign = -1 (rotation by -theta) is the backward, the transpose of the rotation.
// One thread per (row, pair).

struct Params { rows: u32, seq: u32, half_dim: u32, sign: f32 }

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
    let k = i % p.half_dim;
    let pos = row % p.seq;
    let d = 2u * p.half_dim;
    let a = f32(x[row * d + k]);
    let b = f32(x[row * d + k + p.half_dim]);
    let c = f32(cos_t[pos * p.half_dim + k]);
    let s = p.sign * f32(sin_t[pos * p.half_dim + k]);
    out[row * d + k] = ET(a * c - b * s);
    out[row * d + k + p.half_dim] = ET(b * c + a * s);
}
