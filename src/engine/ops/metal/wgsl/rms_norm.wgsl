// RMS norm over the last axis: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
// Forward: one workgroup per row. Backward in two passes: dx per row (rstd recomputed and saved per row),
// then dw per column (a sum over rows, no atomics). `ET` (the element type) comes from the prelude.

struct Params { rows: u32, cols: u32, eps: f32, pad: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<ET>;
@group(0) @binding(2) var<storage, read> w: array<ET>;
@group(0) @binding(3) var<storage, read> dy: array<ET>;
@group(0) @binding(4) var<storage, read_write> out: array<ET>;
@group(0) @binding(5) var<storage, read_write> rstd_buf: array<f32>;

const WG: u32 = 256u;
var<workgroup> red: array<f32, WG>;
var<workgroup> red2: array<f32, WG>;

// Sums `v` (and `v2`) over the workgroup; every thread gets the totals in red[0] / red2[0].
fn reduce2(lid: u32, v: f32, v2: f32) {
    red[lid] = v;
    red2[lid] = v2;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
            red2[lid] += red2[lid + s];
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(256)
fn rms_norm_fwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let row = wid.x + wid.y * 65535u;
    if (row >= p.rows) { return; }
    let lid = lid3.x;
    let base = row * p.cols;
    var ss = 0.0;
    for (var j = lid; j < p.cols; j += WG) {
        let v = f32(x[base + j]);
        ss += v * v;
    }
    reduce2(lid, ss, 0.0);
    let rstd = inverseSqrt(red[0] / f32(p.cols) + p.eps);
    for (var j = lid; j < p.cols; j += WG) {
        out[base + j] = ET(f32(x[base + j]) * rstd * f32(w[j]));
    }
}

// dx_j = rstd * (w_j dy_j - x_j rstd^2 * mean_k(w_k dy_k x_k)); rstd saved for the dw pass.
@compute @workgroup_size(256)
fn rms_norm_bwd_dx(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let row = wid.x + wid.y * 65535u;
    if (row >= p.rows) { return; }
    let lid = lid3.x;
    let base = row * p.cols;
    var ss = 0.0;
    var dot = 0.0;
    for (var j = lid; j < p.cols; j += WG) {
        let v = f32(x[base + j]);
        ss += v * v;
        dot += f32(dy[base + j]) * f32(w[j]) * v;
    }
    reduce2(lid, ss, dot);
    let n = f32(p.cols);
    let rstd = inverseSqrt(red[0] / n + p.eps);
    let c = red2[0] / n * rstd * rstd;
    for (var j = lid; j < p.cols; j += WG) {
        let v = f32(x[base + j]);
        out[base + j] = ET(rstd * (f32(w[j]) * f32(dy[base + j]) - v * c));
    }
    if (lid == 0u) { rstd_buf[row] = rstd; }
}

// dw_j = sum_rows dy[r, j] * x[r, j] * rstd[r]: one thread per column.
@compute @workgroup_size(256)
fn rms_norm_bwd_dw(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    if (j >= p.cols) { return; }
    var acc = 0.0;
    for (var r = 0u; r < p.rows; r++) {
        let i = r * p.cols + j;
        acc += f32(dy[i]) * f32(x[i]) * rstd_buf[r];
    }
    out[j] = ET(acc);
}
