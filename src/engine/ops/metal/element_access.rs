//! The element types of our WGSL kernels ([`Precision`]) and the prelude every kernel starts with: its element type
//! and, for each storage buffer of that type the kernel declares (`var<storage, read> x: array<ET>;`), the
//! functions its body reads and writes it through, so one body serves every precision:
//!
//! - `load_x(i) -> f32` and `load4_x(i) -> vec4<f32>` (i a multiple of 2);
//! - for `read_write` buffers, `store2_x(i, vec2<f32>)` and `store4_x(i, vec4<f32>)` (i a multiple of 2), and
//!   `store_x(i, f32)` for a length's odd last element, which bf16 launches never have (`metal::takes` gives bf16
//!   tensors to the kernels only with an even last dimension);
//! - `to_et(f32) -> f32`, a value rounded to the element type.
//!
//! f32 and f16 index their arrays directly. bf16 has no WGSL type: its buffers are arrays of u32 words holding two
//! elements each (wgsl/bf16.wgsl), read by widening a half word and written a whole word (two elements) at a time,
//! which is why the kernels write in even-aligned pairs.

/// Element type of a kernel's tensors. Arithmetic is f32 in all; f16 needs wgpu's `SHADER_F16` (WGSL
/// `enable f16;`); bf16, which WGSL lacks, travels as u32 words of two elements (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    /// 32-bit float storage.
    F32,
    /// 16-bit float storage (`enable f16;`).
    F16,
    /// bfloat16 storage, two elements to a u32 word.
    Bf16,
}

impl Precision {
    /// Every precision, for validation and translation tests.
    pub const ALL: [Precision; 3] = [Precision::F32, Precision::F16, Precision::Bf16];

    /// The precision that stores `dtype`, or `None` (f64 and the integer types have no kernels).
    pub fn for_dtype(dtype: candle_core::DType) -> Option<Self> {
        match dtype {
            candle_core::DType::F32 => Some(Self::F32),
            candle_core::DType::F16 => Some(Self::F16),
            candle_core::DType::BF16 => Some(Self::Bf16),
            _ => None,
        }
    }

    /// Bytes of one element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
        }
    }
}

/// The element-type prelude of a kernel whose body is `body`: the type, the bf16 helpers where needed, and the
/// accessors of every `array<ET>` storage buffer `body` declares.
pub fn prelude(precision: Precision, body: &str) -> String {
    let mut out = String::from(match precision {
        Precision::F32 => "alias ET = f32;\nfn to_et(v: f32) -> f32 { return v; }\n",
        Precision::F16 => "enable f16;\nalias ET = f16;\nfn to_et(v: f32) -> f32 { return f32(f16(v)); }\n",
        Precision::Bf16 => include_str!("wgsl/bf16.wgsl"),
    });
    for (name, written) in element_buffers(body) {
        out.push_str(&accessors(precision, name, written));
    }
    out
}

/// The `array<ET>` storage buffers `body` declares: (name, whether it is `read_write`).
fn element_buffers(body: &str) -> Vec<(&str, bool)> {
    body.lines()
        .filter_map(|line| {
            let (_, declared) = line.split_once("var<storage, ")?;
            let (access, rest) = declared.split_once('>')?;
            let (name, ty) = rest.trim().split_once(':')?;
            (ty.trim() == "array<ET>;").then(|| (name.trim(), access.trim() == "read_write"))
        })
        .collect()
}

/// The load (and, for a written buffer, store) functions of buffer `n`.
fn accessors(precision: Precision, n: &str, written: bool) -> String {
    let mut out = match precision {
        Precision::F32 | Precision::F16 => format!(
            "fn load_{n}(i: u32) -> f32 {{ return f32({n}[i]); }}\n\
             fn load4_{n}(i: u32) -> vec4<f32> {{\n    \
                 return vec4<f32>(f32({n}[i]), f32({n}[i + 1u]), f32({n}[i + 2u]), f32({n}[i + 3u]));\n}}\n"
        ),
        Precision::Bf16 => format!(
            "fn load_{n}(i: u32) -> f32 {{ return bf16_at({n}[i >> 1u], i); }}\n\
             fn load4_{n}(i: u32) -> vec4<f32> {{\n    \
                 let w0 = {n}[i >> 1u];\n    let w1 = {n}[(i >> 1u) + 1u];\n    \
                 return vec4<f32>(bf16_at(w0, 0u), bf16_at(w0, 1u), bf16_at(w1, 0u), bf16_at(w1, 1u));\n}}\n"
        ),
    };
    if !written {
        return out;
    }
    out.push_str(&match precision {
        Precision::F32 | Precision::F16 => format!(
            "fn store_{n}(i: u32, v: f32) {{ {n}[i] = ET(v); }}\n\
             fn store2_{n}(i: u32, v: vec2<f32>) {{ {n}[i] = ET(v.x); {n}[i + 1u] = ET(v.y); }}\n\
             fn store4_{n}(i: u32, v: vec4<f32>) {{\n    \
                 {n}[i] = ET(v.x); {n}[i + 1u] = ET(v.y); {n}[i + 2u] = ET(v.z); {n}[i + 3u] = ET(v.w);\n}}\n"
        ),
        // `store_` rewrites its half of a word without an atomic: only for an odd length's last element, whose
        // word no other thread writes (bf16 launches have even lengths, so it never runs).
        Precision::Bf16 => format!(
            "fn store_{n}(i: u32, v: f32) {{\n    \
                 let w0 = {n}[i >> 1u];\n    let bits = bf16_bits(v);\n    \
                 {n}[i >> 1u] = select((w0 & 0xffff0000u) | bits, (w0 & 0xffffu) | (bits << 16u), (i & 1u) == 1u);\n\
             }}\n\
             fn store2_{n}(i: u32, v: vec2<f32>) {{ {n}[i >> 1u] = bf16_pair(v); }}\n\
             fn store4_{n}(i: u32, v: vec4<f32>) {{\n    \
                 {n}[i >> 1u] = bf16_pair(v.xy);\n    {n}[(i >> 1u) + 1u] = bf16_pair(v.zw);\n}}\n"
        ),
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_element_buffers_and_their_access() {
        let body = "@group(0) @binding(1) var<storage, read> x: array<ET>;\n\
                    @group(0) @binding(2) var<storage, read> ids: array<i32>;\n\
                    @group(0) @binding(3) var<storage, read_write> out: array<ET>;\n\
                    @group(0) @binding(4) var<storage, read_write> lse: array<f32>;\n";
        assert_eq!(element_buffers(body), vec![("x", false), ("out", true)]);
        let bf16 = prelude(Precision::Bf16, body);
        assert!(bf16.contains("alias ET = u32;") && bf16.contains("fn store2_out(") && !bf16.contains("store2_x"));
        assert!(prelude(Precision::F16, body).starts_with("enable f16;"));
    }
}
