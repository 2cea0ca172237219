// Causal grouped-query attention forward without the T x T matrix (FlashAttention's blocked online softmax):
// q (b, hq, t, d), k/v (b, hkv, t, d), o (b, hq, t, d), lse (b * hq * t, f32: the row's log-sum-exp for the
// backward's recomputation). One workgroup per (block of BQ queries, batch x head); each thread owns one query
// row (q and the output accumulator in registers) and the keys/values stream through workgroup memory in tiles
// of BK rows. HEAD_DIM comes from the prelude.

struct Params { batch: u32, heads: u32, kv_heads: u32, seq: u32, scale: f32, pad0: u32, pad1: u32, pad2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<ET>;
@group(0) @binding(2) var<storage, read> k: array<ET>;
@group(0) @binding(3) var<storage, read> v: array<ET>;
@group(0) @binding(4) var<storage, read_write> o: array<ET>;
@group(0) @binding(5) var<storage, read_write> lse: array<f32>;

const BQ: u32 = 64u;
const BK: u32 = 16u;
var<workgroup> k_tile: array<f32, BK * HEAD_DIM>;
var<workgroup> v_tile: array<f32, BK * HEAD_DIM>;

@compute @workgroup_size(64)
fn attention_fwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let bh = wid.y;
    let h = bh % p.heads;
    let bi = bh / p.heads;
    let kvh = h / (p.heads / p.kv_heads);
    let q0 = wid.x * BQ;
    let i = q0 + lid;
    let valid = i < p.seq;
    let q_base = (bh * p.seq + min(i, p.seq - 1u)) * HEAD_DIM;
    let kv_base = (bi * p.kv_heads + kvh) * p.seq * HEAD_DIM;

    var qr: array<f32, HEAD_DIM>;
    var acc: array<f32, HEAD_DIM>;
    for (var c = 0u; c < HEAD_DIM; c++) {
        qr[c] = f32(q[q_base + c]) * p.scale;
        acc[c] = 0.0;
    }
    var m = -3.0e38;
    var l = 0.0;
    // Causal: this block's last query sees keys up to q0 + BQ - 1.
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
            k_tile[e] = kv;
            v_tile[e] = vv;
        }
        workgroupBarrier();
        if (valid && j0 <= i) {
            var s: array<f32, BK>;
            var tile_max = m;
            for (var jj = 0u; jj < BK; jj++) {
                let j = j0 + jj;
                var sc = -3.0e38;
                if (j <= i) {
                    sc = 0.0;
                    for (var c = 0u; c < HEAD_DIM; c++) { sc += qr[c] * k_tile[jj * HEAD_DIM + c]; }
                }
                s[jj] = sc;
                tile_max = max(tile_max, sc);
            }
            let corr = exp(m - tile_max);
            l *= corr;
            for (var c = 0u; c < HEAD_DIM; c++) { acc[c] *= corr; }
            for (var jj = 0u; jj < BK; jj++) {
                if (j0 + jj <= i) {
                    let pr = exp(s[jj] - tile_max);
                    l += pr;
                    for (var c = 0u; c < HEAD_DIM; c++) { acc[c] += pr * v_tile[jj * HEAD_DIM + c]; }
                }
            }
            m = tile_max;
        }
    }
    if (valid) {
        let inv = 1.0 / l;
        for (var c = 0u; c < HEAD_DIM; c++) { o[q_base + c] = ET(acc[c] * inv); }
        lse[bh * p.seq + i] = m + log(l);
    }
}
