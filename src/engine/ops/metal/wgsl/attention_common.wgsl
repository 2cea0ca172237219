// What the attention kernels (attention_fwd.wgsl, attention_bwd.wgsl) share, put before each by wgsl.rs: the
// uniform parameters, the masking rule, the loads, and the output micro-tile with its update from P (or dS) in
// `pt` and rows staged in `stage`. Each kernel file declares the bindings (p, q, k, v, row_starts), the
// workgroup arrays and the tile constants these read (WGSL lets module-scope names come in any order).

// seq: queries; q_offset: the first query's position (keys: q_offset + seq, from position 0; the backward has 0);
// window: 0 = none; packed: 0 = row_starts is not read (packed rows have q_offset 0).
struct Params { batch: u32, heads: u32, kv_heads: u32, seq: u32, scale: f32, window: u32, packed: u32, q_offset: u32 }

// Keys per (batch row, kv head): those before the queries (a cache) and the queries' own.
fn key_count() -> u32 { return p.q_offset + p.seq; }

// An output micro-tile: row 0 in a*, row 1 (RO == 2) in b*, vec4 columns 0..VO.
struct Acc { a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>,
             b0: vec4<f32>, b1: vec4<f32>, b2: vec4<f32>, b3: vec4<f32> }

fn ld4_q(i: u32, ok: bool) -> vec4<f32> {
    if (ok) { return load4_q(i); }
    return vec4<f32>();
}

fn ld4_k(i: u32, ok: bool) -> vec4<f32> {
    if (ok) { return load4_k(i); }
    return vec4<f32>();
}

fn ld4_v(i: u32, ok: bool) -> vec4<f32> {
    if (ok) { return load4_v(i); }
    return vec4<f32>();
}

// The first key query `row` (< seq, at position q_offset + row) of batch row `bi` sees: its window's edge, its
// example's start.
fn first_key(bi: u32, row: u32) -> u32 {
    let at = p.q_offset + row;
    var lo = 0u;
    if (p.window > 0u && at >= p.window) { lo = at + 1u - p.window; }
    if (p.packed != 0u) { lo = max(lo, row_starts[bi * p.seq + row]); }
    return lo;
}

// The first keys of queries r0 .. r0 + 3 (rows past the sequence take the last row's: their results are dropped).
fn first_keys(bi: u32, r0: u32) -> vec4<u32> {
    let last = p.seq - 1u;
    return vec4<u32>(first_key(bi, min(r0, last)), first_key(bi, min(r0 + 1u, last)),
                     first_key(bi, min(r0 + 2u, last)), first_key(bi, min(r0 + 3u, last)));
}

// Keys col0 .. col0 + 3 of a score vec4 are masked outside lo ..= q_offset + row (query `row`, its first key `lo`).
fn masked(s: vec4<f32>, row: u32, lo: u32, col0: u32) -> vec4<f32> {
    let cols = vec4<u32>(col0) + vec4<u32>(0u, 1u, 2u, 3u);
    return select(s, vec4<f32>(NEG), (cols > vec4<u32>(p.q_offset + row)) | (cols < vec4<u32>(lo)));
}

// One key of the output update: acc rows += (x, y) * the staged row at `base` (vec4 columns col, col + TXO, ..).
fn acc_key(acc: ptr<function, Acc>, x: f32, y: f32, base: u32) {
    let v0 = stage[base];
    (*acc).a0 += x * v0;
    if (RO > 1u) { (*acc).b0 += y * v0; }
    if (VO > 1u) {
        let v1 = stage[base + TXO];
        (*acc).a1 += x * v1;
        if (RO > 1u) { (*acc).b1 += y * v1; }
    }
    if (VO > 2u) {
        let v2 = stage[base + 2u * TXO];
        (*acc).a2 += x * v2;
        if (RO > 1u) { (*acc).b2 += y * v2; }
    }
    if (VO > 3u) {
        let v3 = stage[base + 3u * TXO];
        (*acc).a3 += x * v3;
        if (RO > 1u) { (*acc).b3 += y * v3; }
    }
}

// acc (rows r0, r0 + 1) += pt[rows, c0 .. c0 + KC] x the KC staged rows (vec4 column `col` onwards).
fn accumulate(acc: ptr<function, Acc>, r0: u32, c0: u32, col: u32) {
    for (var c = 0u; c < KC; c += 4u) {
        let x = pt[r0 * PAD4 + (c0 + c) / 4u];
        var y = vec4<f32>();
        if (RO > 1u) { y = pt[(r0 + 1u) * PAD4 + (c0 + c) / 4u]; }
        let base = c * D4 + col;
        acc_key(acc, x.x, y.x, base);
        acc_key(acc, x.y, y.y, base + D4);
        acc_key(acc, x.z, y.z, base + 2u * D4);
        acc_key(acc, x.w, y.w, base + 3u * D4);
    }
}
