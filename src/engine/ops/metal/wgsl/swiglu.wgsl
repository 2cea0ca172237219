// SwiGLU: out = silu(g) * u. Backward: du = dout * silu(g), dg = dout * u * silu'(g) with
// silu'(g) = sig(g) (1 + g (1 - sig(g))). One thread per element; the backward writes dg and du.

struct Params { n: u32, pad0: u32, pad1: u32, pad2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> g: array<ET>;
@group(0) @binding(2) var<storage, read> u: array<ET>;
@group(0) @binding(3) var<storage, read> dout: array<ET>;
@group(0) @binding(4) var<storage, read_write> out: array<ET>;
@group(0) @binding(5) var<storage, read_write> out2: array<ET>;

fn sigmoid(v: f32) -> f32 { return 1.0 / (1.0 + exp(-v)); }

fn flat(gid: vec3<u32>, nwg: vec3<u32>) -> u32 { return gid.x + gid.y * nwg.x * 256u; }

@compute @workgroup_size(256)
fn swiglu_fwd(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    let gv = f32(g[i]);
    out[i] = ET(gv * sigmoid(gv) * f32(u[i]));
}

// out = dg, out2 = du.
@compute @workgroup_size(256)
fn swiglu_bwd(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    let gv = f32(g[i]);
    let sg = sigmoid(gv);
    let d = f32(dout[i]);
    out[i] = ET(d * f32(u[i]) * sg * (1.0 + gv * (1.0 - sg)));
    out2[i] = ET(d * gv * sg);
}
