// Adapter dropout: out = x * mask, the mask drawn where it is used and never stored. Element i is kept when the
// top 24 bits of splitmix64's output i + 1, started at `base`, fall below `threshold`; kept elements are scaled by
// 1 / keep. The same integer arithmetic as ops/dropout.rs (CPU) and ops/cuda/training.cuh, so every device draws
// the same mask. WGSL has no 64-bit integers: a u64 is vec2<u32>(low word, high word) here.

struct Params { n: u32, base_lo: u32, base_hi: u32, threshold: u32, scale: f32, pad0: u32, pad1: u32, pad2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<ET>;
@group(0) @binding(2) var<storage, read_write> out: array<ET>;

const GOLDEN = vec2<u32>(0x7F4A7C15u, 0x9E3779B9u);

fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

// The whole 64-bit product of two words, from their 16-bit halves.
fn wide_mul(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xFFFFu;
    let a1 = a >> 16u;
    let b0 = b & 0xFFFFu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let mid = (p00 >> 16u) + (p01 & 0xFFFFu) + (p10 & 0xFFFFu);
    return vec2<u32>((mid << 16u) | (p00 & 0xFFFFu), a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}

// The low 64 bits of a * b (u32 products wrap, as the high words' share must).
fn mul64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let low = wide_mul(a.x, b.x);
    return vec2<u32>(low.x, low.y + a.x * b.y + a.y * b.x);
}

// a ^ (a >> k) for 0 < k < 32.
fn xor_shift(a: vec2<u32>, k: u32) -> vec2<u32> {
    return a ^ vec2<u32>((a.x >> k) | (a.y << (32u - k)), a.y >> k);
}

// splitmix64's finaliser.
fn mix(z0: vec2<u32>) -> vec2<u32> {
    let z1 = mul64(xor_shift(z0, 30u), vec2<u32>(0x1CE4E5B9u, 0xBF58476Du));
    let z2 = mul64(xor_shift(z1, 27u), vec2<u32>(0x133111EBu, 0x94D049BBu));
    return xor_shift(z2, 31u);
}

fn flat(gid: vec3<u32>, nwg: vec3<u32>) -> u32 { return gid.x + gid.y * nwg.x * 256u; }

@compute @workgroup_size(256)
fn dropout_apply(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = flat(gid, nwg);
    if (i >= p.n) { return; }
    let z = mix(add64(vec2<u32>(p.base_lo, p.base_hi), mul64(vec2<u32>(i + 1u, 0u), GOLDEN)));
    // x times the mask's element: 1 / keep in the element type (as the mask the other devices multiply by holds
    // it) or 0, multiplied rather than selected so a dropped element is the product's (-0 for a negative x).
    let mask = select(0.0, f32(ET(p.scale)), (z.y >> 8u) < p.threshold);
    out[i] = ET(f32(x[i]) * mask);
}
