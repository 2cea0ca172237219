// RMS norm over the last axis: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
// Forward: one workgroup per row. Backward in two passes: dx per row (rstd recomputed and saved per row),
// then dw per column (a sum over rows, no atomics). `ET` and the buffers' loads and stores come from the prelude;
// each thread writes its elements in pairs (bf16 writes whole words).

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
        let v = load_x(base + j);
        ss += v * v;
    }
    reduce2(lid, ss, 0.0);
    let rstd = inverseSqrt(red[0] / f32(p.cols) + p.eps);
    for (var j = 2u * lid; j < p.cols; j += 2u * WG) {
        let y0 = load_x(base + j) * rstd * load_w(j);
        if (j + 1u < p.cols) {
            store2_out(base + j, vec2<f32>(y0, load_x(base + j + 1u) * rstd * load_w(j + 1u)));
        } else {
            store_out(base + j, y0);
        }
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
        let v = load_x(base + j);
        ss += v * v;
        dot += load_dy(base + j) * load_w(j) * v;
    }
    reduce2(lid, ss, dot);
    let n = f32(p.cols);
    let rstd = inverseSqrt(red[0] / n + p.eps);
    let c = red2[0] / n * rstd * rstd;
    for (var j = 2u * lid; j < p.cols; j += 2u * WG) {
        let dx0 = rstd * (load_w(j) * load_dy(base + j) - load_x(base + j) * c);
        if (j + 1u < p.cols) {
            let k = j + 1u;
            store2_out(base + j, vec2<f32>(dx0, rstd * (load_w(k) * load_dy(base + k) - load_x(base + k) * c)));
        } else {
            store_out(base + j, dx0);
        }
    }
    if (lid == 0u) { rstd_buf[row] = rstd; }
}

// dw_j = sum_rows dy[r, j] * x[r, j] * rstd[r]: one thread per pair of columns.
@compute @workgroup_size(256)
fn rms_norm_bwd_dw(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = 2u * gid.x;
    if (j >= p.cols) { return; }
    let pair = j + 1u < p.cols;
    var acc = vec2<f32>();
    for (var r = 0u; r < p.rows; r++) {
        let i = r * p.cols + j;
        acc.x += load_dy(i) * load_x(i) * rstd_buf[r];
        if (pair) { acc.y += load_dy(i + 1u) * load_x(i + 1u) * rstd_buf[r]; }
    }
    if (pair) { store2_out(j, acc); } else { store_out(j, acc.x); }
}
