// Adapter dropout: out = x * mask, the mask drawn in the kernel (dropout_mask.wgsl); kept elements are scaled by
// 1 / keep.

struct Params { n: u32, base_lo: u32, base_hi: u32, threshold: u32, scale: f32, pad0: u32, pad1: u32, pad2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<ET>;
@group(0) @binding(2) var<storage, read_write> out: array<ET>;

fn flat(gid: vec3<u32>, nwg: vec3<u32>) -> u32 { return gid.x + gid.y * nwg.x * 256u; }

@compute @workgroup_size(256)
fn dropout_apply(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    // x times the mask's element: 1 / keep in the element type (as the mask the other devices multiply by holds
    // it) or 0, multiplied rather than selected so a dropped element is the product's (-0 for a negative x).
    let kept = dropout_keeps(vec2<u32>(p.base_lo, p.base_hi), i, p.threshold);
    out[i] = ET(f32(x[i]) * select(0.0, f32(ET(p.scale)), kept));
}
