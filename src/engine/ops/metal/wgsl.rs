//! The catalogue of our WGSL kernels (the `.wgsl` files beside this one): each kernel's source with its element
//! type prelude, its entry points, the bindings each entry point reads and writes, the uniform parameters and
//! the launch grid for a shape. Plain data on every platform, so the wgpu test harness (Linux, Vulkan) and the
//! Metal glue (macOS, through naga's MSL) launch the very same kernels in the very same way.
//!
//! Binding 0 is always the uniform parameter block; bindings `1..` are storage buffers in the order
//! [`Launch::bindings`] lists them (inputs first, then outputs). On Metal, binding N is `[[buffer(N)]]`.

pub use super::element_access::Precision;

/// One WGSL module (one `.wgsl` file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// RMS norm forward, backward dx (saving rstd), backward dw.
    RmsNorm,
    /// Rotary embedding (forward; backward = rotation by -sin).
    Rope,
    /// silu(g) * u and its two input gradients.
    Swiglu,
    /// Per-row cross-entropy loss and its logits gradient in one launch.
    CrossEntropy,
    /// y + scale * (x A^T) B^T in one launch (inference), and y + scale * x B^T for a given x A (training).
    LoraEpilogue,
    /// Blocked causal GQA attention forward (output + log-sum-exp), with a sliding window and packed rows.
    AttentionFwd,
    /// Its backward: dq (+ delta), then dk/dv.
    AttentionBwd,
    /// x times a dropout mask drawn in the kernel from its seed (ops/dropout.rs).
    Dropout,
}

impl Kernel {
    /// Every kernel, for validation and translation tests.
    pub const ALL: [Kernel; 8] = [
        Kernel::RmsNorm,
        Kernel::Rope,
        Kernel::Swiglu,
        Kernel::CrossEntropy,
        Kernel::LoraEpilogue,
        Kernel::AttentionFwd,
        Kernel::AttentionBwd,
        Kernel::Dropout,
    ];

    /// The WGSL body, without the prelude.
    pub fn body(self) -> &'static str {
        match self {
            Kernel::RmsNorm => include_str!("wgsl/rms_norm.wgsl"),
            Kernel::Rope => include_str!("wgsl/rope.wgsl"),
            Kernel::Swiglu => include_str!("wgsl/swiglu.wgsl"),
            Kernel::CrossEntropy => include_str!("wgsl/cross_entropy.wgsl"),
            // Both dropout-drawing modules start with the mask's generator.
            Kernel::LoraEpilogue => concat!(include_str!("wgsl/dropout_mask.wgsl"), include_str!("wgsl/lora.wgsl")),
            Kernel::Dropout => concat!(include_str!("wgsl/dropout_mask.wgsl"), include_str!("wgsl/dropout.wgsl")),
            // Both attention modules start with what they share (parameters, masking, the output micro-tile).
            Kernel::AttentionFwd => {
                concat!(include_str!("wgsl/attention_common.wgsl"), include_str!("wgsl/attention_fwd.wgsl"))
            }
            Kernel::AttentionBwd => {
                concat!(include_str!("wgsl/attention_common.wgsl"), include_str!("wgsl/attention_bwd.wgsl"))
            }
        }
    }

    /// The compute entry points the module defines.
    pub fn entry_points(self) -> &'static [&'static str] {
        match self {
            Kernel::RmsNorm => &["rms_norm_fwd", "rms_norm_bwd_dx", "rms_norm_bwd_dw"],
            Kernel::Rope => &["rope"],
            Kernel::Swiglu => &["swiglu_fwd", "swiglu_bwd"],
            Kernel::CrossEntropy => &["cross_entropy_fwd_bwd"],
            Kernel::LoraEpilogue => &["lora_epilogue", "lowrank_add"],
            Kernel::AttentionFwd => &["attention_fwd"],
            Kernel::AttentionBwd => &["attention_bwd_dq", "attention_bwd_dkdv"],
            Kernel::Dropout => &["dropout_apply"],
        }
    }

    /// Whether the source is specialised by head size (`HEAD_DIM`, sizing register and tile arrays).
    pub fn needs_head_dim(self) -> bool {
        matches!(self, Kernel::AttentionFwd | Kernel::AttentionBwd)
    }

    /// Threads per workgroup (the `@workgroup_size` of every entry point of the module).
    pub fn workgroup_size(self) -> u32 {
        if self.needs_head_dim() {
            ATTENTION_THREADS
        } else {
            256
        }
    }
}

/// Queries (or keys) per attention workgroup: the side of the 64 x 64 score tiles its threads share.
pub const ATTENTION_BLOCK: u32 = 64;
/// Threads per attention workgroup: a 16 x 16 grid, each with a 4 x 4 micro-tile of a score tile.
pub const ATTENTION_THREADS: u32 = 256;
/// Head sizes the attention kernels are specialised for (`HEAD_DIM` sizes their staging and output splits; at
/// most 30 KiB of workgroup memory for every one, within the 32 KiB of lavapipe and Apple GPUs; the wgpu device
/// asks for the adapter's own limits).
pub const ATTENTION_HEAD_DIMS: [u32; 5] = [16, 32, 64, 96, 128];
/// Largest LoRA rank the epilogue holds in workgroup memory (`MAX_RANK` in lora.wgsl).
pub const LORA_MAX_RANK: u32 = 128;
/// Workgroups per grid dimension that every backend accepts; larger launches spill into y.
const GRID_LIMIT: u32 = 65535;

/// The full WGSL source of `kernel` for `precision` (and `head_dim` for attention): the prelude that names the
/// element type `ET` with the loads and stores of the kernel's buffers (element_access.rs; and `HEAD_DIM`), then
/// the body.
pub fn source(kernel: Kernel, precision: Precision, head_dim: u32) -> String {
    let mut prelude = super::element_access::prelude(precision, kernel.body());
    if kernel.needs_head_dim() {
        prelude.push_str(&format!("const HEAD_DIM: u32 = {head_dim}u;\n"));
    }
    prelude + kernel.body()
}

/// What a storage binding holds: the kernel's element type, f32 (statistics such as rstd or log-sum-exp), i32 or
/// u32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// The kernel's element type [`Precision`].
    Et,
    /// Always f32.
    F32,
    /// Always i32 (token ids; negative = ignored).
    I32,
    /// Always u32 (packed rows' example starts).
    U32,
}

impl Elem {
    /// The tensor dtype of such a binding in a launch whose element type is `et`.
    pub fn dtype(self, et: candle_core::DType) -> candle_core::DType {
        match self {
            Elem::Et => et,
            Elem::F32 => candle_core::DType::F32,
            Elem::I32 => candle_core::DType::I32,
            Elem::U32 => candle_core::DType::U32,
        }
    }
}

/// A storage buffer of a launch: its binding, element kind and length in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    /// `@binding(N)` in the module (and `[[buffer(N)]]` in its MSL).
    pub index: u32,
    /// Element kind.
    pub elem: Elem,
    /// Length in elements.
    pub len: usize,
}

/// One dispatch: the entry point, its uniform words, its storage bindings (inputs, then `outputs` outputs) and
/// the grid in workgroups.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    /// The module.
    pub kernel: Kernel,
    /// The entry point in it.
    pub entry: &'static str,
    /// The uniform block, as 32-bit words (u32 or f32 bits), padded to 16 bytes.
    pub params: Vec<u32>,
    /// Storage bindings: inputs first, then outputs.
    pub bindings: Vec<Binding>,
    /// How many of `bindings` (the last ones) are written.
    pub outputs: usize,
    /// Workgroups in x, y, z.
    pub groups: [u32; 3],
}

impl Launch {
    /// The input bindings.
    pub fn inputs(&self) -> &[Binding] {
        &self.bindings[..self.bindings.len() - self.outputs]
    }

    /// The output bindings.
    pub fn output_bindings(&self) -> &[Binding] {
        &self.bindings[self.bindings.len() - self.outputs..]
    }
}

fn b(index: u32, elem: Elem, len: usize) -> Binding {
    Binding { index, elem, len }
}

/// One workgroup per row: row = wid.x + wid.y * 65535 in the shaders.
fn row_grid(rows: usize) -> [u32; 3] {
    let rows = rows as u32;
    if rows <= GRID_LIMIT {
        [rows.max(1), 1, 1]
    } else {
        [GRID_LIMIT, rows.div_ceil(GRID_LIMIT), 1]
    }
}

/// One thread per item with 256-thread workgroups: item = gid.x + gid.y * nwg.x * 256 in the shaders (an item is
/// a pair of elements where the kernel writes pairs).
fn flat_grid(items: usize) -> [u32; 3] {
    let groups = (items as u32).div_ceil(256).max(1);
    if groups <= GRID_LIMIT {
        [groups, 1, 1]
    } else {
        [GRID_LIMIT, groups.div_ceil(GRID_LIMIT), 1]
    }
}

fn words(values: &[u32]) -> Vec<u32> {
    let mut w = values.to_vec();
    w.resize(values.len().div_ceil(4) * 4, 0);
    w
}

/// RMS norm forward of x (rows, cols) with weight (cols): inputs x, w; output y.
pub fn rms_norm_fwd(rows: usize, cols: usize, eps: f32) -> Launch {
    let (r, c) = (rows as u32, cols as u32);
    Launch {
        kernel: Kernel::RmsNorm,
        entry: "rms_norm_fwd",
        params: words(&[r, c, eps.to_bits()]),
        bindings: vec![b(1, Elem::Et, rows * cols), b(2, Elem::Et, cols), b(4, Elem::Et, rows * cols)],
        outputs: 1,
        groups: row_grid(rows),
    }
}

/// RMS norm backward, pass 1: inputs x, w, dy; outputs dx and rstd (rows, f32).
pub fn rms_norm_bwd_dx(rows: usize, cols: usize, eps: f32) -> Launch {
    let n = rows * cols;
    Launch {
        kernel: Kernel::RmsNorm,
        entry: "rms_norm_bwd_dx",
        params: words(&[rows as u32, cols as u32, eps.to_bits()]),
        bindings: vec![
            b(1, Elem::Et, n),
            b(2, Elem::Et, cols),
            b(3, Elem::Et, n),
            b(4, Elem::Et, n),
            b(5, Elem::F32, rows),
        ],
        outputs: 2,
        groups: row_grid(rows),
    }
}

/// RMS norm backward, pass 2: inputs x, dy, rstd (from pass 1); output dw (cols).
pub fn rms_norm_bwd_dw(rows: usize, cols: usize, eps: f32) -> Launch {
    let n = rows * cols;
    Launch {
        kernel: Kernel::RmsNorm,
        entry: "rms_norm_bwd_dw",
        params: words(&[rows as u32, cols as u32, eps.to_bits()]),
        bindings: vec![b(1, Elem::Et, n), b(3, Elem::Et, n), b(5, Elem::F32, rows), b(4, Elem::Et, cols)],
        outputs: 1,
        groups: flat_grid(cols.div_ceil(2)),
    }
}

/// Rotary embedding of x (rows = b * heads * t, 2 * half_dim) at positions row % seq with cos/sin (seq,
/// half_dim), or, with `tables` = b > 1 (packed rows), batch i's rows turned by table i of cos/sin (b, seq,
/// half_dim); `sign` 1 forward, -1 backward. Inputs x, cos, sin; output the rotated x.
pub fn rope(rows: usize, seq: usize, half_dim: usize, sign: f32, tables: usize) -> Launch {
    let n = rows * half_dim * 2;
    let batch_rows = if tables > 1 { rows / tables } else { 0 };
    let table = tables.max(1) * seq * half_dim;
    Launch {
        kernel: Kernel::Rope,
        entry: "rope",
        params: words(&[rows as u32, seq as u32, half_dim as u32, sign.to_bits(), batch_rows as u32]),
        bindings: vec![b(1, Elem::Et, n), b(2, Elem::Et, table), b(3, Elem::Et, table), b(4, Elem::Et, n)],
        outputs: 1,
        groups: flat_grid(rows * half_dim),
    }
}

/// silu(g) * u over `n` elements: inputs g, u; output the product.
pub fn swiglu_fwd(n: usize) -> Launch {
    Launch {
        kernel: Kernel::Swiglu,
        entry: "swiglu_fwd",
        params: words(&[n as u32]),
        bindings: vec![b(1, Elem::Et, n), b(2, Elem::Et, n), b(4, Elem::Et, n)],
        outputs: 1,
        groups: flat_grid(n.div_ceil(2)),
    }
}

/// Its backward: inputs g, u, dout; outputs dg, du.
pub fn swiglu_bwd(n: usize) -> Launch {
    Launch {
        kernel: Kernel::Swiglu,
        entry: "swiglu_bwd",
        params: words(&[n as u32]),
        bindings: vec![b(1, Elem::Et, n), b(2, Elem::Et, n), b(3, Elem::Et, n), b(4, Elem::Et, n), b(5, Elem::Et, n)],
        outputs: 2,
        groups: flat_grid(n.div_ceil(2)),
    }
}

/// `n` elements times the dropout mask `mask`: input x; output the product.
pub fn dropout(n: usize, mask: Mask) -> Launch {
    Launch {
        kernel: Kernel::Dropout,
        entry: "dropout_apply",
        params: words(&[&[n as u32][..], &mask.words()].concat()),
        bindings: vec![b(1, Elem::Et, n), b(2, Elem::Et, n)],
        outputs: 1,
        groups: flat_grid(n.div_ceil(2)),
    }
}

/// Cross-entropy of logits (rows, vocab) against targets (rows, i32; negative = ignored), the gradient scaled
/// by `grad_scale` (1 / counted tokens for a mean). Inputs logits, targets; outputs grad (rows, vocab) and
/// loss (rows, f32).
pub fn cross_entropy(rows: usize, vocab: usize, grad_scale: f32) -> Launch {
    Launch {
        kernel: Kernel::CrossEntropy,
        entry: "cross_entropy_fwd_bwd",
        params: words(&[rows as u32, vocab as u32, grad_scale.to_bits()]),
        bindings: vec![
            b(1, Elem::Et, rows * vocab),
            b(2, Elem::I32, rows),
            b(3, Elem::Et, rows * vocab),
            b(4, Elem::F32, rows),
        ],
        outputs: 2,
        groups: row_grid(rows),
    }
}

/// How one LoRA factor lies in memory (lora.wgsl reads either without a copy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Factor {
    /// As an adapter keeps it: A (n_in, rank), B (rank, n_out).
    AsKept,
    /// Transposed: A as (rank, n_in) rows, B as (n_out, rank) rows.
    Transposed,
}

/// y (rows, n_out) + scale * (x (rows, n_in) A) B with A (n_in, rank) and B (rank, n_out) laid out as `a` and `b`
/// say, rank <= [`LORA_MAX_RANK`]. Inputs y, x, a, b; output the sum.
pub fn lora_epilogue(rows: usize, n_in: usize, n_out: usize, rank: usize, scale: f32, a: Factor, b: Factor) -> Launch {
    lora_launch("lora_epilogue", rows, n_in, n_out, rank, scale, (Some(a), b))
}

/// y (rows, n_out) + scale * x (rows, rank) B, rank <= [`LORA_MAX_RANK`], B (rank, n_out) laid out as `b` says: a
/// training step's LoRA update from the x A it keeps (and its backward's dx + dy B A^T), the product multiplied by
/// the dropout mask `mask` over (rows, n_out) when given. Inputs y, x, b; output the sum.
pub fn lowrank_add(rows: usize, rank: usize, n_out: usize, scale: f32, b: Factor, mask: Option<Mask>) -> Launch {
    let mut launch = lora_launch("lowrank_add", rows, rank, n_out, rank, scale, (None, b));
    if let Some(mask) = mask {
        // Words 9..14 of lora.wgsl's Params: masked, then the mask's words.
        launch.params[9] = 1;
        launch.params[10..14].copy_from_slice(&mask.words());
    }
    launch
}

/// A dropout mask as the kernels draw it (ops/dropout.rs): the generator's start, the kept-below threshold on 24
/// bits and the kept elements' value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mask {
    pub base: u64,
    pub threshold: u32,
    pub scale: f32,
}

impl Mask {
    /// As the kernels' Params hold it: the generator's start (low word, high word), the threshold, the kept value.
    fn words(self) -> [u32; 4] {
        [self.base as u32, (self.base >> 32) as u32, self.threshold, self.scale.to_bits()]
    }
}

/// A launch of lora.wgsl's `entry` (one workgroup a row): y, x (rows, n_in), A when it has one, B.
fn lora_launch(
    entry: &'static str,
    rows: usize,
    n_in: usize,
    n_out: usize,
    rank: usize,
    scale: f32,
    (a, b_is): (Option<Factor>, Factor),
) -> Launch {
    let mut bindings = vec![b(1, Elem::Et, rows * n_out), b(2, Elem::Et, rows * n_in)];
    if a.is_some() {
        bindings.push(b(3, Elem::Et, rank * n_in));
    }
    bindings.extend([b(4, Elem::Et, n_out * rank), b(5, Elem::Et, rows * n_out)]);
    let (n_in, n_out, rank) = (n_in as u32, n_out as u32, rank as u32);
    // The steps between B's ranks and outputs (b_k, b_o), and between A's ranks and inputs (a_k, a_j).
    let (b_k, b_o) = match b_is {
        Factor::AsKept => (n_out, 1),
        Factor::Transposed => (1, rank),
    };
    let (a_k, a_j) = match a.unwrap_or(Factor::AsKept) {
        Factor::AsKept => (1, rank),
        Factor::Transposed => (n_in, 1),
    };
    // lora.wgsl's Params is 16 words: these, then the mask's (none: zeros).
    let mut params = words(&[rows as u32, n_in, n_out, rank, scale.to_bits(), b_k, b_o, a_k, a_j]);
    params.resize(16, 0);
    Launch { kernel: Kernel::LoraEpilogue, entry, params, bindings, outputs: 1, groups: row_grid(rows) }
}

/// The shape of a causal GQA attention: q (batch, heads, seq, head_dim) at positions q_offset .., k/v (batch,
/// kv_heads, q_offset + seq, head_dim) from position 0, and what else hides keys from a query: a sliding window and
/// packed rows. The query at position i sees key j iff j <= i, i - j < window (0: no window) and, packed,
/// j >= row_starts[batch row, i].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    /// Batch size.
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Queries (and keys, when `q_offset` is 0).
    pub seq: usize,
    /// The first query's position: the keys before it (a cache) come first. The forward only; training and the
    /// backward have 0.
    pub q_offset: usize,
    /// Head size, one of [`ATTENTION_HEAD_DIMS`].
    pub head_dim: usize,
    /// Score scale, usually 1 / sqrt(head_dim).
    pub scale: f32,
    /// Sliding window: a query sees no key `window` or more positions back; 0 for none.
    pub window: usize,
    /// Packed rows: the launches take a u32 (batch, seq) input of where each query's example starts in its row
    /// (nondecreasing along a row, as `data::packing` makes them), and a query sees no key before it. Unpacked,
    /// that input is one placeholder element the kernels never read.
    pub packed: bool,
}

impl AttentionShape {
    fn params(&self) -> Vec<u32> {
        let s = self;
        let (window, packed, offset) = (s.window as u32, u32::from(s.packed), s.q_offset as u32);
        let (batch, heads, kv_heads, seq) = (s.batch as u32, s.heads as u32, s.kv_heads as u32, s.seq as u32);
        words(&[batch, heads, kv_heads, seq, s.scale.to_bits(), window, packed, offset])
    }
    fn q_len(&self) -> usize {
        self.batch * self.heads * self.seq * self.head_dim
    }
    fn kv_len(&self) -> usize {
        self.batch * self.kv_heads * (self.q_offset + self.seq) * self.head_dim
    }
    fn rows(&self) -> usize {
        self.batch * self.heads * self.seq
    }
    fn blocks(&self) -> u32 {
        (self.seq as u32).div_ceil(ATTENTION_BLOCK)
    }
    /// The row starts' input at binding `index`: (batch, seq) packed, one placeholder element otherwise.
    fn row_starts(&self, index: u32) -> Binding {
        b(index, Elem::U32, if self.packed { self.batch * self.seq } else { 1 })
    }
}

/// Attention forward: inputs q, k, v, row starts ([`AttentionShape::packed`]); outputs o and the log-sum-exp per
/// query row (f32).
pub fn attention_fwd(s: &AttentionShape) -> Launch {
    Launch {
        kernel: Kernel::AttentionFwd,
        entry: "attention_fwd",
        params: s.params(),
        bindings: vec![
            b(1, Elem::Et, s.q_len()),
            b(2, Elem::Et, s.kv_len()),
            b(3, Elem::Et, s.kv_len()),
            s.row_starts(6),
            b(4, Elem::Et, s.q_len()),
            b(5, Elem::F32, s.rows()),
        ],
        outputs: 2,
        groups: [s.blocks(), (s.batch * s.heads) as u32, 1],
    }
}

/// Attention backward, pass 1: inputs q, k, v, o, dO, lse, row starts; outputs dq and delta (f32 per query row).
pub fn attention_bwd_dq(s: &AttentionShape) -> Launch {
    let (q, kv) = (s.q_len(), s.kv_len());
    Launch {
        kernel: Kernel::AttentionBwd,
        entry: "attention_bwd_dq",
        params: s.params(),
        bindings: vec![
            b(1, Elem::Et, q),
            b(2, Elem::Et, kv),
            b(3, Elem::Et, kv),
            b(4, Elem::Et, q),
            b(5, Elem::Et, q),
            b(6, Elem::F32, s.rows()),
            s.row_starts(11),
            b(7, Elem::Et, q),
            b(10, Elem::F32, s.rows()),
        ],
        outputs: 2,
        groups: [s.blocks(), (s.batch * s.heads) as u32, 1],
    }
}

/// Attention backward, pass 2: inputs q, k, v, dO, lse, delta (from pass 1), row starts; outputs dk, dv.
pub fn attention_bwd_dkdv(s: &AttentionShape) -> Launch {
    let (q, kv) = (s.q_len(), s.kv_len());
    Launch {
        kernel: Kernel::AttentionBwd,
        entry: "attention_bwd_dkdv",
        params: s.params(),
        bindings: vec![
            b(1, Elem::Et, q),
            b(2, Elem::Et, kv),
            b(3, Elem::Et, kv),
            b(5, Elem::Et, q),
            b(6, Elem::F32, s.rows()),
            b(10, Elem::F32, s.rows()),
            s.row_starts(11),
            b(8, Elem::Et, kv),
            b(9, Elem::Et, kv),
        ],
        outputs: 2,
        groups: [s.blocks(), (s.batch * s.kv_heads) as u32, 1],
    }
}
