// bf16 storage for the kernels (prelude for Precision::Bf16; WGSL has no bf16 type): a buffer of bf16 values is an
// array of u32 words, element i in the low (even i) or high (odd i) half of word i / 2, as the bytes of a bf16
// tensor lie in memory on a little-endian GPU. Loads widen exactly (a bf16 is the top half of an f32); stores
// round to nearest even, as Candle's (the half crate's) f32 -> bf16 does, NaN kept a NaN. A store writes whole
// words, so the kernels write elements in even-aligned pairs (two threads never share a word).

alias ET = u32;

fn bf16_at(word: u32, i: u32) -> f32 {
    return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u));
}

fn bf16_bits(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    if ((b & 0x7fffffffu) > 0x7f800000u) { return (b >> 16u) | 0x40u; }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}

fn bf16_pair(v: vec2<f32>) -> u32 { return bf16_bits(v.x) | (bf16_bits(v.y) << 16u); }

// `v` rounded to the element type (a scalar the other devices hold in it, such as dropout's 1 / keep).
fn to_et(v: f32) -> f32 { return bitcast<f32>(bf16_bits(v) << 16u); }
