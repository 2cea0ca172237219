// Adapter dropout: out = x * mask, the mask drawn in the kernel (dropout_mask.wgsl); kept elements are scaled by
// 1 / keep. One thread per pair of elements (bf16 writes whole words).

struct Params { n: u32, base_lo: u32, base_hi: u32, threshold: u32, scale: f32, pad0: u32, pad1: u32, pad2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<ET>;
@group(0) @binding(2) var<storage, read_write> out: array<ET>;

// x times the mask's element: 1 / keep in the element type (as the mask the other devices multiply by holds it)
// or 0, multiplied rather than selected so a dropped element is the product's (-0 for a negative x).
fn dropped(i: u32) -> f32 {
    let kept = dropout_keeps(vec2<u32>(p.base_lo, p.base_hi), i, p.threshold);
    return load_x(i) * select(0.0, to_et(p.scale), kept);
}

@compute @workgroup_size(256)
fn dropout_apply(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = 2u * (gid.x + gid.y * nwg.x * 256u);
    if (i >= p.n) { return; }
    if (i + 1u < p.n) {
        store2_out(i, vec2<f32>(dropped(i), dropped(i + 1u)));
    } else {
        store_out(i, dropped(i));
    }
}
