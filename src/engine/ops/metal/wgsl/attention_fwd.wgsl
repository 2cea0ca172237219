// Causal grouped-query attention forward without the T x T matrix (FlashAttention's blocked online softmax):
// q (b, hq, t, d) at positions q_offset .. q_offset + t, k/v (b, hkv, q_offset + t, d) from position 0 (a prefill
// after a cache has q_offset > 0; training and a first prefill 0), o (b, hq, t, d), lse (b * hq * t, f32: the row's
// log-sum-exp for the backward's recomputation). HEAD_DIM comes from the prelude. The query at position i sees the
// keys first_key(i) ..= i: with a sliding window (p.window > 0) none older than window - 1 positions back, and for
// packed rows (p.packed != 0; row_starts u32 (b, t), where each query's own example starts in its row) none before
// its example's start. Unpacked, row_starts is a one-element placeholder that is never read.
//
// One workgroup of 256 threads per (block of BQ = 64 queries, batch x head), heaviest (last) query blocks first;
// it walks the key tiles of BK = 64 from the one holding its first query's first key (the earliest any of its
// queries sees: window edges and example starts only grow along a row) up to the one holding its last query's
// position, so fully masked tiles are never visited. Per tile:
// - scores: the threads form a 16 x 16 grid, each owning a 4 x 4 register micro-tile of the 64 x 64 scores (rows
//   ty*4.., keys tx*4..) as four vec4s. q (pre-scaled) and k stream through workgroup memory in slices of DC = 16
//   of the head dim, stored transposed ([d][row], rows padded to 68 floats) so each step is two vec4 loads and
//   16 FMAs; keys outside a row's first_key ..= row are masked per element;
// - softmax: each thread's row maxima meet in `red` (64 x 16), every thread of a row reads them back (so all
//   agree on the running max m), turns its scores into P = exp(s - m) in `pt` (64 x 68) and keeps its partial
//   row sums, rescaled with m; the rescale factors go to `row_a` for the output's owners. A row may see none of
//   a visited tile's keys (a window's or an example's edge inside the tile): while it has seen none at all its
//   maximum stays at NEG and its probabilities are taken against 0, so they come out 0;
// - output: O (64 x HEAD_DIM) is owned in another split: 8 (4 for HEAD_DIM 16) threads across the head dim,
//   each holding RO rows x VO vec4 columns in named registers (struct Acc, no indexed arrays), and V streams
//   through the same staging buffer in KC rows at a time.
// The row sums meet in `red` once at the end (every query sees at least itself, so none is 0). Workgroup memory:
// 8.5 + 17 + 4 + 0.25 KiB, under the 32 KiB of lavapipe and Apple GPUs (the device asks for the adapter's
// limits). Deterministic: no atomics.
// Params, first_key/masked (the masking rule), the loads of q/k/v and the output micro-tile (Acc, accumulate) are
// in attention_common.wgsl, which wgsl.rs puts before this file.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<ET>;
@group(0) @binding(2) var<storage, read> k: array<ET>;
@group(0) @binding(3) var<storage, read> v: array<ET>;
@group(0) @binding(4) var<storage, read_write> o: array<ET>;
@group(0) @binding(5) var<storage, read_write> lse: array<f32>;
@group(0) @binding(6) var<storage, read> row_starts: array<u32>;

const BQ: u32 = 64u;
const BK: u32 = 64u;
const THREADS: u32 = 256u;
// vec4s per padded 64-float row of a transposed slice or of pt (68 floats: consecutive rows 4 banks apart).
const PAD4: u32 = 17u;
// Head-dim slice of q and k staged per step of the scores.
const DC: u32 = 16u;
const D4: u32 = HEAD_DIM / 4u;
// Output split: VO vec4 columns x RO rows per thread, TXO threads across the head dim.
const VO: u32 = max(1u, HEAD_DIM / 32u);
const TXO: u32 = D4 / VO;
const RO: u32 = BQ * TXO / THREADS;
// Rows of V staged at a time (fills the staging buffer; divides BK).
const KC: u32 = min(BK, 2048u / HEAD_DIM / 16u * 16u);
const NEG: f32 = -3.0e38;

var<workgroup> stage: array<vec4<f32>, 2u * DC * PAD4>;
var<workgroup> pt: array<vec4<f32>, BQ * PAD4>;
var<workgroup> red: array<vec4<f32>, BQ * 4u>;
var<workgroup> row_a: array<f32, BQ>;


// Head-dim entries dd .. dd + 3 of row r into the transposed slice `slot` (0: q, 1: k).
fn put4_t(slot: u32, dd: u32, r: u32, x: vec4<f32>) {
    let at = (slot * DC + dd) * PAD4 + r / 4u;
    let c = r % 4u;
    stage[at][c] = x.x;
    stage[at + PAD4][c] = x.y;
    stage[at + 2u * PAD4][c] = x.z;
    stage[at + 3u * PAD4][c] = x.w;
}

fn hmax(x: vec4<f32>) -> f32 { return max(max(x.x, x.y), max(x.z, x.w)); }
fn row_max(r: u32) -> f32 {
    return hmax(max(max(red[r * 4u], red[r * 4u + 1u]), max(red[r * 4u + 2u], red[r * 4u + 3u])));
}
fn row_sum(r: u32) -> f32 {
    let s = (red[r * 4u] + red[r * 4u + 1u]) + (red[r * 4u + 2u] + red[r * 4u + 3u]);
    return (s.x + s.y) + (s.z + s.w);
}

fn scale_acc(acc: ptr<function, Acc>, x: f32, y: f32) {
    (*acc).a0 *= x; (*acc).a1 *= x; (*acc).a2 *= x; (*acc).a3 *= x;
    (*acc).b0 *= y; (*acc).b1 *= y; (*acc).b2 *= y; (*acc).b3 *= y;
}

// Stages V rows j0 .. j0 + KC (zeros past the sequence) as KC x D4 vec4s.
fn stage_v(lid: u32, kv_base: u32, j0: u32) {
    for (var e = lid; e < KC * D4; e += THREADS) {
        let j = j0 + e / D4;
        stage[e] = ld4_v(kv_base + j * HEAD_DIM + (e % D4) * 4u, j < key_count());
    }
}

@compute @workgroup_size(256)
fn attention_fwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let bh = wid.y;
    let h = bh % p.heads;
    let bi = bh / p.heads;
    let kvh = h / (p.heads / p.kv_heads);
    let blocks = (p.seq + BQ - 1u) / BQ;
    let qt = blocks - 1u - wid.x;
    let q0 = qt * BQ;
    let q_base = bh * p.seq * HEAD_DIM;
    let kv_base = (bi * p.kv_heads + kvh) * key_count() * HEAD_DIM;
    // Score split.
    let ty = lid / 16u;
    let tx = lid % 16u;
    let r0 = q0 + ty * 4u;
    // Output split.
    let tyo = lid / TXO;
    let txo = lid % TXO;
    // This thread's rows' first keys.
    let lo = first_keys(bi, r0);

    var m = vec4<f32>(NEG);
    var l = vec4<f32>();
    var acc = Acc();
    // The last tile holds the block's last query's own key (or the last key, for a block past the queries' end).
    let last_tile = min(p.q_offset + q0 + BQ - 1u, key_count() - 1u) / BK;
    for (var kt = first_key(bi, q0) / BK; kt <= last_tile; kt++) {
        let j0 = kt * BK;
        var s0 = vec4<f32>();
        var s1 = vec4<f32>();
        var s2 = vec4<f32>();
        var s3 = vec4<f32>();
        for (var d0 = 0u; d0 < HEAD_DIM; d0 += DC) {
            workgroupBarrier();
            {
                // One 4-wide run of the head dim of one q row and one k row per thread.
                let dd = (lid % 4u) * 4u;
                let r = lid / 4u;
                put4_t(0u, dd, r, ld4_q(q_base + (q0 + r) * HEAD_DIM + d0 + dd, q0 + r < p.seq) * p.scale);
                put4_t(1u, dd, r, ld4_k(kv_base + (j0 + r) * HEAD_DIM + d0 + dd, j0 + r < key_count()));
            }
            workgroupBarrier();
            for (var dd = 0u; dd < DC; dd++) {
                let a = stage[dd * PAD4 + ty];
                let b = stage[(DC + dd) * PAD4 + tx];
                s0 += a.x * b;
                s1 += a.y * b;
                s2 += a.z * b;
                s3 += a.w * b;
            }
        }
        let c0 = j0 + tx * 4u;
        s0 = masked(s0, r0, lo.x, c0);
        s1 = masked(s1, r0 + 1u, lo.y, c0);
        s2 = masked(s2, r0 + 2u, lo.z, c0);
        s3 = masked(s3, r0 + 3u, lo.w, c0);
        let rr = ty * 4u;
        red[rr * 4u + tx / 4u][tx % 4u] = hmax(s0);
        red[(rr + 1u) * 4u + tx / 4u][tx % 4u] = hmax(s1);
        red[(rr + 2u) * 4u + tx / 4u][tx % 4u] = hmax(s2);
        red[(rr + 3u) * 4u + tx / 4u][tx % 4u] = hmax(s3);
        workgroupBarrier();
        let mn = max(m, vec4<f32>(row_max(rr), row_max(rr + 1u), row_max(rr + 2u), row_max(rr + 3u)));
        let alpha = exp(m - mn);
        m = mn;
        // A row that has seen no key yet (all masked so far: mn is NEG) takes its probabilities against 0, so
        // they are exp(NEG) = 0 rather than exp(NEG - NEG) = 1.
        let mref = select(mn, vec4<f32>(), mn == vec4<f32>(NEG));
        let p0 = exp(s0 - mref.x);
        let p1 = exp(s1 - mref.y);
        let p2 = exp(s2 - mref.z);
        let p3 = exp(s3 - mref.w);
        l = l * alpha + vec4<f32>(dot(p0, vec4<f32>(1.0)), dot(p1, vec4<f32>(1.0)), dot(p2, vec4<f32>(1.0)),
                                  dot(p3, vec4<f32>(1.0)));
        pt[rr * PAD4 + tx] = p0;
        pt[(rr + 1u) * PAD4 + tx] = p1;
        pt[(rr + 2u) * PAD4 + tx] = p2;
        pt[(rr + 3u) * PAD4 + tx] = p3;
        if (tx == 0u) {
            row_a[rr] = alpha.x;
            row_a[rr + 1u] = alpha.y;
            row_a[rr + 2u] = alpha.z;
            row_a[rr + 3u] = alpha.w;
        }
        // The scores' reads of the staging buffer ended at the barrier above: V's first rows go in now.
        stage_v(lid, kv_base, j0);
        workgroupBarrier();
        scale_acc(&acc, row_a[tyo * RO], row_a[min(tyo * RO + 1u, BQ - 1u)]);
        accumulate(&acc, tyo * RO, 0u, txo);
        for (var kc = KC; kc < BK; kc += KC) {
            workgroupBarrier();
            stage_v(lid, kv_base, j0 + kc);
            workgroupBarrier();
            accumulate(&acc, tyo * RO, kc, txo);
        }
    }
    // The row sums and maxima meet in red and row_a once every thread is past its last tile.
    workgroupBarrier();
    let rr = ty * 4u;
    red[rr * 4u + tx / 4u][tx % 4u] = l.x;
    red[(rr + 1u) * 4u + tx / 4u][tx % 4u] = l.y;
    red[(rr + 2u) * 4u + tx / 4u][tx % 4u] = l.z;
    red[(rr + 3u) * 4u + tx / 4u][tx % 4u] = l.w;
    if (tx == 0u) {
        row_a[rr] = m.x;
        row_a[rr + 1u] = m.y;
        row_a[rr + 2u] = m.z;
        row_a[rr + 3u] = m.w;
    }
    workgroupBarrier();
    for (var i = 0u; i < RO; i++) {
        let r = tyo * RO + i;
        let row = q0 + r;
        if (row < p.seq) {
            let sum = row_sum(r);
            let inv = 1.0 / sum;
            var x = acc.a0;
            var y = acc.a1;
            var z = acc.a2;
            var w = acc.a3;
            if (i == 1u) {
                x = acc.b0;
                y = acc.b1;
                z = acc.b2;
                w = acc.b3;
            }
            let base = q_base + row * HEAD_DIM + txo * 4u;
            store4_o(base, x * inv);
            if (VO > 1u) { store4_o(base + TXO * 4u, y * inv); }
            if (VO > 2u) { store4_o(base + 2u * TXO * 4u, z * inv); }
            if (VO > 3u) { store4_o(base + 3u * TXO * 4u, w * inv); }
            if (txo == 0u) { lse[bh * p.seq + row] = row_a[r] + log(sum); }
        }
    }
}
