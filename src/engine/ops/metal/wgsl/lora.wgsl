// The LoRA update of a linear, one row per workgroup, rank <= MAX_RANK:
// - lora_epilogue (inference): out = y + scale * (x A^T) B^T, y the base output (rows, n_out), x (rows, n_in),
//   A (rank, n_in), B (n_out, rank). The rank-sized x A^T stays in workgroup memory, so the adapter costs one
//   launch and no (rows, rank) tensor.
// - lowrank_add (training): out = y + scale * x B^T with x (rows, rank) given, the x A the step keeps for its
//   backward (or, in the backward, dy B with B := A^T): the product and the sum in one launch. n_in is unused.
//   With `masked`, the product is multiplied by a dropout mask over (rows, n_out) drawn in the kernel
//   (dropout_mask.wgsl): the backward's dx + mask * (dy B) A^T through a dropped-out adapter input.
// The factors are read where they lie, so no transposed copy is made for the kernels: A's element (rank k, input
// j) is a[k * a_k + j * a_j] and B's (output o, rank k) b[k * b_k + o * b_o], for (rank, n_in) and (n_out, rank)
// rows or the adapter's own (n_in, rank) A and (rank, n_out) B.

struct Params { rows: u32, n_in: u32, n_out: u32, rank: u32, scale: f32, b_k: u32, b_o: u32, a_k: u32, a_j: u32,
                masked: u32, mask_lo: u32, mask_hi: u32, threshold: u32, mask_scale: f32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> y: array<ET>;
@group(0) @binding(2) var<storage, read> x: array<ET>;
@group(0) @binding(3) var<storage, read> a: array<ET>;
@group(0) @binding(4) var<storage, read> b: array<ET>;
@group(0) @binding(5) var<storage, read_write> out: array<ET>;

const WG: u32 = 256u;
const MAX_RANK: u32 = 128u;
var<workgroup> red: array<f32, WG>;
var<workgroup> xa: array<f32, MAX_RANK>;

@compute @workgroup_size(256)
fn lora_epilogue(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let row = wid.x + wid.y * 65535u;
    if (row >= p.rows) { return; }
    let lid = lid3.x;
    let xbase = row * p.n_in;
    for (var k = 0u; k < p.rank; k++) {
        var acc = 0.0;
        for (var j = lid; j < p.n_in; j += WG) {
            acc += load_x(xbase + j) * load_a(k * p.a_k + j * p.a_j);
        }
        red[lid] = acc;
        workgroupBarrier();
        for (var st = WG / 2u; st > 0u; st = st >> 1u) {
            if (lid < st) { red[lid] += red[lid + st]; }
            workgroupBarrier();
        }
        if (lid == 0u) { xa[k] = red[0] * p.scale; }
        workgroupBarrier();
    }
    add_update(row, lid);
}

@compute @workgroup_size(256)
fn lowrank_add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let row = wid.x + wid.y * 65535u;
    if (row >= p.rows) { return; }
    let lid = lid3.x;
    for (var k = lid; k < p.rank; k += WG) {
        xa[k] = load_x(row * p.rank + k) * p.scale;
    }
    workgroupBarrier();
    add_update(row, lid);
}

// out[row] = y[row] + xa B^T (xa already scaled, in workgroup memory), the product masked when `masked`; each
// thread writes its outputs in pairs (bf16 writes whole words).
fn add_update(row: u32, lid: u32) {
    let ybase = row * p.n_out;
    for (var o = 2u * lid; o < p.n_out; o += 2u * WG) {
        let y0 = updated(ybase, o);
        if (o + 1u < p.n_out) {
            store2_out(ybase + o, vec2<f32>(y0, updated(ybase, o + 1u)));
        } else {
            store_out(ybase + o, y0);
        }
    }
}

// Output o of the row at `ybase`: y + xa B^T, or y + mask * xa B^T.
fn updated(ybase: u32, o: u32) -> f32 {
    if (p.masked == 0u) {
        var acc = load_y(ybase + o);
        for (var k = 0u; k < p.rank; k++) {
            acc += xa[k] * load_b(k * p.b_k + o * p.b_o);
        }
        return acc;
    }
    var product = 0.0;
    for (var k = 0u; k < p.rank; k++) {
        product += xa[k] * load_b(k * p.b_k + o * p.b_o);
    }
    let kept = dropout_keeps(vec2<u32>(p.mask_lo, p.mask_hi), ybase + o, p.threshold);
    return load_y(ybase + o) + product * select(0.0, to_et(p.mask_scale), kept);
}
