// Causal grouped-query attention backward by recomputation (FlashAttention-2's split): probabilities are rebuilt
// from the forward's log-sum-exp, never stored. Pass 1 (attention_bwd_dq, one thread per query row) writes dq and
// delta_i = sum_c dO_ic O_ic; pass 2 (attention_bwd_dkdv, one thread per key row of a kv head) sums over every
// query head of its group and every later query, so no atomics are needed. Shapes as in attention_fwd.wgsl.

struct Params { batch: u32, heads: u32, kv_heads: u32, seq: u32, scale: f32, pad0: u32, pad1: u32, pad2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<ET>;
@group(0) @binding(2) var<storage, read> k: array<ET>;
@group(0) @binding(3) var<storage, read> v: array<ET>;
@group(0) @binding(4) var<storage, read> o: array<ET>;
@group(0) @binding(5) var<storage, read> d_o: array<ET>;
@group(0) @binding(6) var<storage, read> lse: array<f32>;
@group(0) @binding(7) var<storage, read_write> dq: array<ET>;
@group(0) @binding(8) var<storage, read_write> dk: array<ET>;
@group(0) @binding(9) var<storage, read_write> dv: array<ET>;
@group(0) @binding(10) var<storage, read_write> delta: array<f32>;

const BQ: u32 = 64u;
const BK: u32 = 16u;
var<workgroup> tile_a: array<f32, BK * HEAD_DIM>;
var<workgroup> tile_b: array<f32, BK * HEAD_DIM>;
var<workgroup> row_lse: array<f32, BK>;
var<workgroup> row_delta: array<f32, BK>;

@compute @workgroup_size(64)
fn attention_bwd_dq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let bh = wid.y;
    let h = bh % p.heads;
    let bi = bh / p.heads;
    let kvh = h / (p.heads / p.kv_heads);
    let q0 = wid.x * BQ;
    let i = q0 + lid;
    let valid = i < p.seq;
    let row = bh * p.seq + min(i, p.seq - 1u);
    let q_base = row * HEAD_DIM;
    let kv_base = (bi * p.kv_heads + kvh) * p.seq * HEAD_DIM;

    var qr: array<f32, HEAD_DIM>;
    var dor: array<f32, HEAD_DIM>;
    var acc: array<f32, HEAD_DIM>;
    var dl = 0.0;
    for (var c = 0u; c < HEAD_DIM; c++) {
        qr[c] = f32(q[q_base + c]) * p.scale;
        dor[c] = f32(d_o[q_base + c]);
        dl += dor[c] * f32(o[q_base + c]);
        acc[c] = 0.0;
    }
    let li = lse[row];
    let kv_end = min(p.seq, q0 + BQ);
    for (var j0 = 0u; j0 < kv_end; j0 += BK) {
        workgroupBarrier();
        for (var e = lid; e < BK * HEAD_DIM; e += BQ) {
            let jr = j0 + e / HEAD_DIM;
            var kv = 0.0;
            var vv = 0.0;
            if (jr < p.seq) {
                kv = f32(k[kv_base + jr * HEAD_DIM + e % HEAD_DIM]);
                vv = f32(v[kv_base + jr * HEAD_DIM + e % HEAD_DIM]);
            }
            tile_a[e] = kv;
            tile_b[e] = vv;
        }
        workgroupBarrier();
        if (valid) {
            for (var jj = 0u; jj < BK; jj++) {
                if (j0 + jj <= i) {
                    var sc = 0.0;
                    var dp = 0.0;
                    for (var c = 0u; c < HEAD_DIM; c++) {
                        sc += qr[c] * tile_a[jj * HEAD_DIM + c];
                        dp += dor[c] * tile_b[jj * HEAD_DIM + c];
                    }
                    let ds = exp(sc - li) * (dp - dl);
                    for (var c = 0u; c < HEAD_DIM; c++) { acc[c] += ds * tile_a[jj * HEAD_DIM + c]; }
                }
            }
        }
    }
    if (valid) {
        for (var c = 0u; c < HEAD_DIM; c++) { dq[q_base + c] = ET(acc[c] * p.scale); }
        delta[row] = dl;
    }
}

@compute @workgroup_size(64)
fn attention_bwd_dkdv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let bkv = wid.y;
    let kvh = bkv % p.kv_heads;
    let bi = bkv / p.kv_heads;
    let group = p.heads / p.kv_heads;
    let k0 = wid.x * BQ;
    let j = k0 + lid;
    let valid = j < p.seq;
    let k_base = (bkv * p.seq + min(j, p.seq - 1u)) * HEAD_DIM;

    var kr: array<f32, HEAD_DIM>;
    var vr: array<f32, HEAD_DIM>;
    var dka: array<f32, HEAD_DIM>;
    var dva: array<f32, HEAD_DIM>;
    for (var c = 0u; c < HEAD_DIM; c++) {
        kr[c] = f32(k[k_base + c]) * p.scale;
        vr[c] = f32(v[k_base + c]);
        dka[c] = 0.0;
        dva[c] = 0.0;
    }
    for (var g = 0u; g < group; g++) {
        let bh = bi * p.heads + kvh * group + g;
        // Causal: queries before this block's first key see none of its keys.
        for (var i0 = k0 - k0 % BK; i0 < p.seq; i0 += BK) {
            workgroupBarrier();
            for (var e = lid; e < BK * HEAD_DIM; e += BQ) {
                let ir = i0 + e / HEAD_DIM;
                var qv = 0.0;
                var dov = 0.0;
                if (ir < p.seq) {
                    qv = f32(q[(bh * p.seq + ir) * HEAD_DIM + e % HEAD_DIM]);
                    dov = f32(d_o[(bh * p.seq + ir) * HEAD_DIM + e % HEAD_DIM]);
                }
                tile_a[e] = qv;
                tile_b[e] = dov;
            }
            if (lid < BK) {
                let ir = i0 + lid;
                var lv = 0.0;
                var dv0 = 0.0;
                if (ir < p.seq) {
                    lv = lse[bh * p.seq + ir];
                    dv0 = delta[bh * p.seq + ir];
                }
                row_lse[lid] = lv;
                row_delta[lid] = dv0;
            }
            workgroupBarrier();
            if (valid) {
                for (var ii = 0u; ii < BK; ii++) {
                    let i = i0 + ii;
                    if (i >= j && i < p.seq) {
                        var sc = 0.0;
                        var dp = 0.0;
                        for (var c = 0u; c < HEAD_DIM; c++) {
                            sc += kr[c] * tile_a[ii * HEAD_DIM + c];
                            dp += vr[c] * tile_b[ii * HEAD_DIM + c];
                        }
                        let pr = exp(sc - row_lse[ii]);
                        let ds = pr * (dp - row_delta[ii]);
                        for (var c = 0u; c < HEAD_DIM; c++) {
                            dva[c] += pr * tile_b[ii * HEAD_DIM + c];
                            dka[c] += ds * tile_a[ii * HEAD_DIM + c];
                        }
                    }
                }
            }
        }
    }
    if (valid) {
        for (var c = 0u; c < HEAD_DIM; c++) {
            dk[k_base + c] = ET(dka[c] * p.scale);
            dv[k_base + c] = ET(dva[c]);
        }
    }
}
