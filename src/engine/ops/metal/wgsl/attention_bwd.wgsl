// Causal grouped-query attention backward by recomputation (FlashAttention-2's split): probabilities are rebuilt
// from the forward's log-sum-exp, never stored. Shapes, the sliding window (p.window) and packed rows (p.packed,
// row_starts) as in attention_fwd.wgsl: query i sees the keys first_key(i) ..= i. The same tiling: 256 threads
// per workgroup, 64 x 64 tiles of scores with a 4 x 4 register micro-tile per thread (vec4s, products over
// slices of DC = 8 of the head dim staged transposed in workgroup memory), the 64 x 64 matrix that feeds the next
// product in `pt`, and a second split of the threads for the 64 x HEAD_DIM results (RO rows x VO vec4 columns
// in the named registers of struct Acc) against rows staged KC at a time. Fully masked tiles are never visited;
// the others are masked per element.
// - attention_bwd_dq: one workgroup per (64 queries, batch x head), last blocks first. It writes
//   delta_i = sum_c dO_ic O_ic, then for each key tile from the one holding its first query's first key up to its
//   diagonal forms S = q k^T and dP = dO v^T in the same pass, dS = P (dP - delta) into pt, and dq += dS k.
// - attention_bwd_dkdv: one workgroup per (64 keys, batch x kv head), summing over every query head of its group
//   and every query tile from its diagonal on (so no atomics) until the first whose first query sees no key of
//   this tile (first keys only grow along a row, so no later query does either): S^T = k q^T and dP^T = v dO^T,
//   P^T into pt for dv += P^T dO, then dS^T into pt for dk += dS^T q.
// Workgroup memory: 8.5 + 17 + 0.75 KiB.
// Params, first_key/masked (the masking rule), the loads of q/k/v and the output micro-tile (Acc, accumulate) are
// in attention_common.wgsl, which wgsl.rs puts before this file.

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
@group(0) @binding(11) var<storage, read> row_starts: array<u32>;

const BT: u32 = 64u;
const THREADS: u32 = 256u;
const PAD4: u32 = 17u;
const DC: u32 = 8u;
const D4: u32 = HEAD_DIM / 4u;
const VO: u32 = max(1u, HEAD_DIM / 32u);
const TXO: u32 = D4 / VO;
const RO: u32 = BT * TXO / THREADS;
const KC: u32 = min(BT, 2048u / HEAD_DIM / 16u * 16u);
const NEG: f32 = -3.0e38;

// Four transposed slices (DC x 64, padded) for the scores, or KC x D4 rows for the results.
var<workgroup> stage: array<vec4<f32>, 4u * DC * PAD4>;
var<workgroup> pt: array<vec4<f32>, BT * PAD4>;
var<workgroup> row_lse: array<vec4<f32>, BT / 4u>;
var<workgroup> row_delta: array<vec4<f32>, BT / 4u>;
// attention_bwd_dkdv: the first key of each query of the tile.
var<workgroup> row_lo: array<vec4<u32>, BT / 4u>;

fn ld4_do(i: u32, ok: bool) -> vec4<f32> {
    if (ok) { return load4_d_o(i); }
    return vec4<f32>();
}

// Head-dim entries dd .. dd + 3 of row r into the transposed slice `s` (0..4) of the stage.
fn put4_t(s: u32, dd: u32, r: u32, x: vec4<f32>) {
    let at = (s * DC + dd) * PAD4 + r / 4u;
    let c = r % 4u;
    stage[at][c] = x.x;
    stage[at + PAD4][c] = x.y;
    stage[at + 2u * PAD4][c] = x.z;
    stage[at + 3u * PAD4][c] = x.w;
}
fn get_t(s: u32, dd: u32, i: u32) -> vec4<f32> { return stage[(s * DC + dd) * PAD4 + i]; }

// Row i (0 or 1) of acc's micro-tile, vec4 column u.
fn acc_get(acc: Acc, i: u32, u: u32) -> vec4<f32> {
    if (i == 0u) { return select(select(select(acc.a0, acc.a1, u == 1u), acc.a2, u == 2u), acc.a3, u == 3u); }
    return select(select(select(acc.b0, acc.b1, u == 1u), acc.b2, u == 2u), acc.b3, u == 3u);
}

// P^T of key `key` against the queries `cols` (first keys `lo`, log-sum-exps `ls`): 0 where a query past the
// sequence, before the key or with its first key after it does not see it.
fn seen_by(s: vec4<f32>, ls: vec4<f32>, key: u32, cols: vec4<u32>, lo: vec4<u32>) -> vec4<f32> {
    let seen = (cols < vec4<u32>(p.seq)) & (cols >= vec4<u32>(key)) & (lo <= vec4<u32>(key));
    return select(vec4<f32>(), exp(s - ls), seen);
}

// Writes P^T's dS^T (or dS) micro-tile rows into pt.
fn put_tile(rr: u32, tx: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>) {
    pt[rr * PAD4 + tx] = x0;
    pt[(rr + 1u) * PAD4 + tx] = x1;
    pt[(rr + 2u) * PAD4 + tx] = x2;
    pt[(rr + 3u) * PAD4 + tx] = x3;
}

// Four rows of a score micro-tile.
struct Tile4 { r0: vec4<f32>, r1: vec4<f32>, r2: vec4<f32>, r3: vec4<f32> }

// A 4-wide run of head-dim slice d0 of the tile's rows, staged transposed: the query side (q pre-scaled, and dO)
// into slots `q_slot`, `q_slot + 1` from rows q_row0.. of q_base, the key side (k and v) into `k_slot`, `k_slot + 1`
// from rows k_row0.. of kv_base. Threads 0..128 take the side in slots 0 and 1, the others the other.
fn stage_slices(lid: u32, d0: u32, q_slot: u32, q_base: u32, q_row0: u32, k_base: u32, k_row0: u32) {
    let e = lid % 128u;
    let dd = (e % 2u) * 4u;
    let r = e / 2u;
    let k_slot = 2u - q_slot;
    if ((lid < 128u) == (q_slot == 0u)) {
        let qi = q_base + (q_row0 + r) * HEAD_DIM + d0 + dd;
        put4_t(q_slot, dd, r, ld4_q(qi, q_row0 + r < p.seq) * p.scale);
        put4_t(q_slot + 1u, dd, r, ld4_do(qi, q_row0 + r < p.seq));
    } else {
        let ki = k_base + (k_row0 + r) * HEAD_DIM + d0 + dd;
        put4_t(k_slot, dd, r, ld4_k(ki, k_row0 + r < p.seq));
        put4_t(k_slot + 1u, dd, r, ld4_v(ki, k_row0 + r < p.seq));
    }
}

// t += the outer product of a (the tile's four rows) and b (four columns).
fn add_outer(t: ptr<function, Tile4>, a: vec4<f32>, b: vec4<f32>) {
    (*t).r0 += a.x * b;
    (*t).r1 += a.y * b;
    (*t).r2 += a.z * b;
    (*t).r3 += a.w * b;
}

// The staged slice's share of the two products: s += slot 0 x slot 2 (the scores), g += slot 1 x slot 3 (dP).
fn slice_products(ty: u32, tx: u32, s: ptr<function, Tile4>, g: ptr<function, Tile4>) {
    for (var dd = 0u; dd < DC; dd++) {
        add_outer(s, get_t(0u, dd, ty), get_t(2u, dd, tx));
        add_outer(g, get_t(1u, dd, ty), get_t(3u, dd, tx));
    }
}

// Row `i` (inside the sequence when ok) of q (which 0), k (1) or dO (2) at element `at`, as a vec4 run.
fn ld4_of(which: u32, at: u32, ok: bool) -> vec4<f32> {
    if (which == 0u) { return ld4_q(at, ok); }
    if (which == 1u) { return ld4_k(at, ok); }
    return ld4_do(at, ok);
}

// acc += pt (the 64 x 64 tile already in it) x rows row0 .. row0 + 64 of q, k or dO (`which`, as ld4_of) at
// `base`, staged KC rows at a time.
fn accumulate_rows(acc: ptr<function, Acc>, which: u32, base: u32, row0: u32, lid: u32, tyo: u32, txo: u32) {
    for (var c = 0u; c < BT; c += KC) {
        if (c > 0u) { workgroupBarrier(); }
        for (var e = lid; e < KC * D4; e += THREADS) {
            let i = row0 + c + e / D4;
            stage[e] = ld4_of(which, base + i * HEAD_DIM + (e % D4) * 4u, i < p.seq);
        }
        workgroupBarrier();
        accumulate(acc, tyo * RO, c, txo);
    }
}

@compute @workgroup_size(256)
fn attention_bwd_dq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let bh = wid.y;
    let h = bh % p.heads;
    let bi = bh / p.heads;
    let kvh = h / (p.heads / p.kv_heads);
    let qt = (p.seq + BT - 1u) / BT - 1u - wid.x;
    let q0 = qt * BT;
    let q_base = bh * p.seq * HEAD_DIM;
    let kv_base = (bi * p.kv_heads + kvh) * p.seq * HEAD_DIM;
    let ty = lid / 16u;
    let tx = lid % 16u;
    let rr = ty * 4u;
    let tyo = lid / TXO;
    let txo = lid % TXO;
    let r0 = q0 + rr;
    // This thread's rows' first keys.
    let lo = first_keys(bi, r0);

    // delta = rowsum(dO o): four threads per row, met in pt.
    {
        let r = lid / 4u;
        let part = lid % 4u;
        var sum = 0.0;
        if (q0 + r < p.seq) {
            let base = q_base + (q0 + r) * HEAD_DIM + part * D4;
            for (var c = 0u; c < D4; c++) { sum += load_d_o(base + c) * load_o(base + c); }
        }
        pt[r][part] = sum;
    }
    workgroupBarrier();
    if (lid < BT) {
        let row = q0 + lid;
        let x = pt[lid];
        let dl = (x.x + x.y) + (x.z + x.w);
        var lv = 0.0;
        if (row < p.seq) {
            delta[bh * p.seq + row] = dl;
            lv = lse[bh * p.seq + row];
        }
        row_delta[lid / 4u][lid % 4u] = dl;
        row_lse[lid / 4u][lid % 4u] = lv;
    }

    var acc = Acc();
    for (var kt = first_key(bi, q0) / BT; kt <= qt; kt++) {
        let j0 = kt * BT;
        var s = Tile4();
        var g = Tile4();
        for (var d0 = 0u; d0 < HEAD_DIM; d0 += DC) {
            workgroupBarrier();
            // Threads 0..128 stage a 4-wide run of a q row and its dO row, the others of a k row and its v row.
            stage_slices(lid, d0, 0u, q_base, q0, kv_base, j0);
            workgroupBarrier();
            slice_products(ty, tx, &s, &g);
        }
        let c0 = j0 + tx * 4u;
        let ls = row_lse[ty];
        let dl = row_delta[ty];
        let ds0 = exp(masked(s.r0, r0, lo.x, c0) - ls.x) * (g.r0 - dl.x);
        let ds1 = exp(masked(s.r1, r0 + 1u, lo.y, c0) - ls.y) * (g.r1 - dl.y);
        let ds2 = exp(masked(s.r2, r0 + 2u, lo.z, c0) - ls.z) * (g.r2 - dl.z);
        let ds3 = exp(masked(s.r3, r0 + 3u, lo.w, c0) - ls.w) * (g.r3 - dl.w);
        // Every thread is done with the staged slices (and the last tile's pt): dS and k's first rows go in.
        workgroupBarrier();
        put_tile(rr, tx, ds0, ds1, ds2, ds3);
        accumulate_rows(&acc, 1u, kv_base, j0, lid, tyo, txo);
    }
    for (var i = 0u; i < RO; i++) {
        let row = q0 + tyo * RO + i;
        if (row < p.seq) {
            let base = q_base + row * HEAD_DIM + txo * 4u;
            for (var u = 0u; u < VO; u++) { store4_dq(base + u * TXO * 4u, acc_get(acc, i, u) * p.scale); }
        }
    }
}

@compute @workgroup_size(256)
fn attention_bwd_dkdv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let bkv = wid.y;
    let kvh = bkv % p.kv_heads;
    let bi = bkv / p.kv_heads;
    let group = p.heads / p.kv_heads;
    let kt = wid.x;
    let k0 = kt * BT;
    let kv_base = bkv * p.seq * HEAD_DIM;
    let blocks = (p.seq + BT - 1u) / BT;
    let ty = lid / 16u;
    let tx = lid % 16u;
    let rr = ty * 4u;
    let tyo = lid / TXO;
    let txo = lid % TXO;

    var acc_k = Acc();
    var acc_v = Acc();
    for (var g = 0u; g < group; g++) {
        let bh = bi * p.heads + kvh * group + g;
        let q_base = bh * p.seq * HEAD_DIM;
        // Causal: query tiles before this key tile see none of its keys; windows and examples: nor do those
        // from the first whose first query's first key lies past this tile.
        for (var qt = kt; qt < blocks; qt++) {
            let i0 = qt * BT;
            if (first_key(bi, i0) >= k0 + BT) { break; }
            var s = Tile4();
            var g = Tile4();
            for (var d0 = 0u; d0 < HEAD_DIM; d0 += DC) {
                workgroupBarrier();
                // Threads 0..128 stage a k row and its v row, the others a q row and its dO row.
                stage_slices(lid, d0, 2u, q_base, i0, kv_base, k0);
                if (d0 == 0u && lid < BT) {
                    let row = i0 + lid;
                    var lv = 0.0;
                    var dl = 0.0;
                    var first = 0u;
                    if (row < p.seq) {
                        lv = lse[bh * p.seq + row];
                        dl = delta[bh * p.seq + row];
                        first = first_key(bi, row);
                    }
                    row_lse[lid / 4u][lid % 4u] = lv;
                    row_delta[lid / 4u][lid % 4u] = dl;
                    row_lo[lid / 4u][lid % 4u] = first;
                }
                workgroupBarrier();
                slice_products(ty, tx, &s, &g);
            }
            // Rows are keys (k0 + rr ..), columns queries (i0 + tx * 4 ..): a key is seen by the queries at or
            // after it, inside the sequence, whose first key is not after it.
            let r0 = k0 + rr;
            let c0 = i0 + tx * 4u;
            let ls = row_lse[tx];
            let dl = row_delta[tx];
            let lo = row_lo[tx];
            let cols = vec4<u32>(c0) + vec4<u32>(0u, 1u, 2u, 3u);
            let p0 = seen_by(s.r0, ls, r0, cols, lo);
            let p1 = seen_by(s.r1, ls, r0 + 1u, cols, lo);
            let p2 = seen_by(s.r2, ls, r0 + 2u, cols, lo);
            let p3 = seen_by(s.r3, ls, r0 + 3u, cols, lo);
            workgroupBarrier();
            put_tile(rr, tx, p0, p1, p2, p3);
            accumulate_rows(&acc_v, 2u, q_base, i0, lid, tyo, txo);
            workgroupBarrier();
            put_tile(rr, tx, p0 * (g.r0 - dl), p1 * (g.r1 - dl), p2 * (g.r2 - dl), p3 * (g.r3 - dl));
            accumulate_rows(&acc_k, 0u, q_base, i0, lid, tyo, txo);
        }
    }
    for (var i = 0u; i < RO; i++) {
        let row = k0 + tyo * RO + i;
        if (row < p.seq) {
            let base = kv_base + row * HEAD_DIM + txo * 4u;
            for (var u = 0u; u < VO; u++) {
                store4_dk(base + u * TXO * 4u, acc_get(acc_k, i, u) * p.scale);
                store4_dv(base + u * TXO * 4u, acc_get(acc_v, i, u));
            }
        }
    }
}
