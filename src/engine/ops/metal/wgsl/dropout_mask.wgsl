// Adapter dropout's mask, drawn where it is used and never stored (shared by dropout.wgsl and lora.wgsl, whose
// sources start with this one): element i of a mask whose generator starts at `base` is kept when the top 24 bits
// of splitmix64's output i + 1 fall below `threshold`. The same integer arithmetic as ops/dropout.rs (CPU) and
// ops/cuda/training.cuh, so every device draws the same mask. WGSL has no 64-bit integers: a u64 is
// vec2<u32>(low word, high word) here.

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

// Whether element i of the mask whose generator starts at `base` is kept.
fn dropout_keeps(base: vec2<u32>, i: u32, threshold: u32) -> bool {
    let z = mix(add64(base, mul64(vec2<u32>(i + 1u, 0u), GOLDEN)));
    return (z.y >> 8u) < threshold;
}
