// Cross-entropy of one row of logits against its target, with the gradient written in the same launch:
// loss[r] = logsumexp(z) - z[t], dz[r, j] = grad_scale * (softmax(z)_j - [j == t]). A negative target is an
// ignored position: loss 0, gradient 0. One workgroup per row; each thread keeps an online (max, sum) over
// its strided columns, merged in workgroup memory, so the logits are read twice (loss pass, gradient pass). The
// gradient is written in pairs of columns (bf16 writes whole words).

struct Params { rows: u32, vocab: u32, grad_scale: f32, pad: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<ET>;
@group(0) @binding(2) var<storage, read> targets: array<i32>;
@group(0) @binding(3) var<storage, read_write> grad: array<ET>;
@group(0) @binding(4) var<storage, read_write> loss: array<f32>;

const WG: u32 = 256u;
var<workgroup> red_m: array<f32, WG>;
var<workgroup> red_s: array<f32, WG>;

@compute @workgroup_size(256)
fn cross_entropy_fwd_bwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let row = wid.x + wid.y * 65535u;
    if (row >= p.rows) { return; }
    let lid = lid3.x;
    let base = row * p.vocab;
    let target_id = targets[row];
    if (target_id < 0) {
        for (var j = 2u * lid; j < p.vocab; j += 2u * WG) {
            if (j + 1u < p.vocab) { store2_grad(base + j, vec2<f32>()); } else { store_grad(base + j, 0.0); }
        }
        if (lid == 0u) { loss[row] = 0.0; }
        return;
    }
    var m = -3.0e38;
    var s = 0.0;
    for (var j = lid; j < p.vocab; j += WG) {
        let z = load_logits(base + j);
        if (z > m) {
            s = s * exp(m - z) + 1.0;
            m = z;
        } else {
            s += exp(z - m);
        }
    }
    red_m[lid] = m;
    red_s[lid] = s;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st = st >> 1u) {
        if (lid < st) {
            let m2 = red_m[lid + st];
            let s2 = red_s[lid + st];
            let m1 = red_m[lid];
            let mm = max(m1, m2);
            red_s[lid] = red_s[lid] * exp(m1 - mm) + s2 * exp(m2 - mm);
            red_m[lid] = mm;
        }
        workgroupBarrier();
    }
    let row_max = red_m[0];
    let lse = row_max + log(red_s[0]);
    let t = u32(target_id);
    for (var j = 2u * lid; j < p.vocab; j += 2u * WG) {
        let g0 = gradient(base, j, lse, t);
        if (j + 1u < p.vocab) {
            store2_grad(base + j, vec2<f32>(g0, gradient(base, j + 1u, lse, t)));
        } else {
            store_grad(base + j, g0);
        }
    }
    if (lid == 0u) { loss[row] = lse - load_logits(base + t); }
}

// The gradient of column j of the row at `base` with log-sum-exp `lse` and target t.
fn gradient(base: u32, j: u32, lse: f32, t: u32) -> f32 {
    var g = exp(load_logits(base + j) - lse);
    if (j == t) { g -= 1.0; }
    return g * p.grad_scale;
}
