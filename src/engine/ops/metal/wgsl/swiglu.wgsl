// SwiGLU: out = silu(g) * u. Backward: du = dout * silu(g), dg = dout * u * silu'(g) with
// silu'(g) = sig(g) (1 + g (1 - sig(g))). One thread per pair of elements (bf16 writes whole words); the backward
// writes dg and du.

struct Params { n: u32, pad0: u32, pad1: u32, pad2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> g: array<ET>;
@group(0) @binding(2) var<storage, read> u: array<ET>;
@group(0) @binding(3) var<storage, read> dout: array<ET>;
@group(0) @binding(4) var<storage, read_write> out: array<ET>;
@group(0) @binding(5) var<storage, read_write> out2: array<ET>;

fn sigmoid(v: f32) -> f32 { return 1.0 / (1.0 + exp(-v)); }

// The first element of this thread's pair.
fn pair(gid: vec3<u32>, nwg: vec3<u32>) -> u32 { return 2u * (gid.x + gid.y * nwg.x * 256u); }

fn fwd_at(i: u32) -> f32 {
    let gv = load_g(i);
    return gv * sigmoid(gv) * load_u(i);
}

// (dg, du) of element i.
fn bwd_at(i: u32) -> vec2<f32> {
    let gv = load_g(i);
    let sg = sigmoid(gv);
    let d = load_dout(i);
    return vec2<f32>(d * load_u(i) * sg * (1.0 + gv * (1.0 - sg)), d * gv * sg);
}

@compute @workgroup_size(256)
fn swiglu_fwd(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = pair(gid, nwg);
    if (i >= p.n) { return; }
    if (i + 1u < p.n) {
        store2_out(i, vec2<f32>(fwd_at(i), fwd_at(i + 1u)));
    } else {
        store_out(i, fwd_at(i));
    }
}

// out = dg, out2 = du.
@compute @workgroup_size(256)
fn swiglu_bwd(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = pair(gid, nwg);
    if (i >= p.n) { return; }
    let a = bwd_at(i);
    if (i + 1u < p.n) {
        let b = bwd_at(i + 1u);
        store2_out(i, vec2<f32>(a.x, b.x));
        store2_out2(i, vec2<f32>(a.y, b.y));
    } else {
        store_out(i, a.x);
        store_out2(i, a.y);
    }
}
