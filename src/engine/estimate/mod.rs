//! The one parameter-and-memory estimate, shared by the CLI and the studio: trainable parameters of an
//! adapter, and the memory a training run will need (base weights, adapter state, activations kept for the
//! backward pass, logits). Estimates, not measurements: they say what grows with which setting.
//!
//! Everything here works from a [`ModelShape`], plain numbers a front end can keep without the model itself.

use crate::engine::lora::adapted_layers;
use crate::engine::lora::{Target, Targets};
use crate::engine::model::quant::{bytes_per_weight, fitting_type, vocab_type, BaseQuant, VocabRole};
use crate::engine::model::transformer::Transformer;
use crate::engine::model::ModelConfig;
use crate::engine::train::{Checkpointing, LoraSettings, ModelLimits, TrainConfig};
use crate::engine::Result;

/// The sizes of a model that the estimates and the settings validation need.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelShape {
    pub parameters: usize,
    pub layers: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub attention_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    /// One (vocab, hidden) matrix serves as embeddings and head.
    #[serde(default)]
    pub tied_embeddings: bool,
    pub context_length: usize,
    /// Bytes per element of the compute dtype.
    pub dtype_bytes: usize,
    /// (module, in_features, out_features) for each adaptable linear of a decoder layer.
    pub linear_shapes: Vec<(String, usize, usize)>,
    /// What the loaded base's weights hold in memory, measured (quantized projections at their size); None
    /// for a shape known only from its config (then parameters x dtype bytes).
    #[serde(default)]
    pub base_weights_bytes: Option<u64>,
    /// Attention runs in the fused (flash) kernels, as on CUDA in half precision, or in blocks (the portable graph,
    /// Metal, other dtypes): no (T x T) scores are ever built, so attention's memory grows with T, not T squared.
    /// False for a shape known only from its config, and for our CPU f32 kernels (blocked only at long T).
    /// The serde name stays for saved estimates.
    #[serde(default)]
    pub fused_attention: bool,
    /// `--checkpointing offload` moves the kept layer inputs off the device (CUDA; see `ops::offload_applies`).
    #[serde(default)]
    pub offloads_checkpoints: bool,
    /// A checkpointed recompute defers the MLP to the backward (no norm after the MLP: `model::mlp::Mlp::defer`).
    #[serde(default)]
    pub defers_mlp: bool,
    /// The head is quantized and its loss dequantizes some or all of it for the pass (CUDA:
    /// `ops::kernel_takes_quantized_head`; how much: `ops::dequantized_head_rows`).
    #[serde(default)]
    pub dequantizes_head: bool,
}

impl ModelShape {
    /// The LoRA targets this model's decoder layers have (phi3: its fused projections), in model order.
    pub fn linear_targets(&self) -> Vec<Target> {
        self.linear_shapes.iter().filter_map(|(name, _, _)| name.parse().ok()).collect()
    }

    /// `lora`'s targets among this model's linears ([`Targets::among`]: phi3's fused projections).
    pub fn targets_of(&self, lora: &LoraSettings) -> Result<Targets> {
        lora.targets.among(&self.linear_targets(), "this model")
    }

    /// The shape of a model with this config, computing in a dtype of `dtype_bytes` bytes per element.
    pub fn of(config: &ModelConfig, dtype_bytes: usize) -> Self {
        Self {
            parameters: config.parameter_count(),
            layers: config.num_layers,
            hidden_size: config.hidden_size,
            intermediate_size: config.intermediate_size,
            attention_heads: config.num_attention_heads,
            kv_heads: config.num_kv_heads,
            head_dim: config.head_dim,
            vocab_size: config.vocab_size,
            tied_embeddings: config.tie_word_embeddings,
            context_length: config.max_position_embeddings,
            dtype_bytes,
            linear_shapes: Target::ALL
                .iter()
                .filter_map(|t| config.linear_shape(t.name()).map(|(i, o)| (t.name().to_string(), i, o)))
                .collect(),
            base_weights_bytes: None,
            fused_attention: false,
            offloads_checkpoints: false,
            defers_mlp: !config.norm_layout.norms_mlp_output(),
            dequantizes_head: false,
        }
    }

    /// The shape of a loaded model, with the bytes its base weights really hold (dense or quantized).
    pub fn of_model(model: &Transformer) -> Self {
        Self {
            base_weights_bytes: Some(model.base_weights_bytes()),
            // Blocked attention at every length counts; on our CPU f32 kernels only long rows take it (the
            // estimate stays on the safe side there).
            fused_attention: crate::engine::ops::blocked_attention_applies(
                model.device(),
                model.dtype(),
                model.config.head_dim,
                2,
            ) || crate::engine::ops::fused_attention_applies(
                model.device(),
                model.dtype(),
                model.config.head_dim,
            ),
            offloads_checkpoints: crate::engine::ops::offload_applies(model.device()),
            dequantizes_head: model.head().quantized_type().is_some()
                && crate::engine::ops::kernel_takes_quantized_head(model.device(), model.dtype()),
            ..Self::of(&model.config, model.dtype().size_in_bytes())
        }
    }

    /// What [`TrainConfig::validate_for_model`] checks settings against.
    pub fn limits(&self) -> ModelLimits {
        ModelLimits { context_length: self.context_length, num_layers: self.layers }
    }
}

/// LoRA parameters: `r * (in + out)` per adapted linear, plus `out` (the magnitude) with DoRA.
pub fn trainable_params(model: &ModelShape, lora: &LoraSettings) -> Result<usize> {
    let targets = model.targets_of(lora)?;
    let per_layer: usize = model
        .linear_shapes
        .iter()
        .filter(|(name, _, _)| targets.contains_name(name))
        .map(|(_, i, o)| lora.rank * (i + o) + if lora.dora { *o } else { 0 })
        .sum();
    Ok(per_layer * adapted_layers(model.layers, lora.layers).len())
}

/// Bytes of the base weights if the model were loaded with `quant` (`none` and `keep` count dense: a
/// GGUF's own types are only known once loaded, see [`ModelShape::base_weights_bytes`]). Projections whose
/// rows fit no block of the type stay dense, as the loader does. A quantized base holds its vocabulary matrices
/// (embeddings, and the head unless tied) in [`vocab_type`] (`model/vocab_matrix.rs`).
pub fn base_weights_bytes_with(model: &ModelShape, quant: BaseQuant) -> u64 {
    let dense_bytes = model.dtype_bytes.max(1) as f64;
    let (mut linear_params, mut linear_bytes) = (0usize, 0f64);
    for (_, i, o) in &model.linear_shapes {
        let per_weight = quant.target_type().and_then(|t| fitting_type(t, *i)).map_or(dense_bytes, bytes_per_weight);
        linear_params += i * o;
        linear_bytes += (i * o) as f64 * per_weight;
    }
    // The vocabulary matrices (embeddings, and the head unless tied) as the loader holds them.
    let matrix_params = model.vocab_size * model.hidden_size;
    let vocab_bytes = |role| {
        matrix_params as f64 * vocab_type(quant, role, model.hidden_size, false).map_or(dense_bytes, bytes_per_weight)
    };
    let (vocab_params, vocab_bytes) = if model.tied_embeddings {
        (matrix_params, vocab_bytes(VocabRole::Head))
    } else {
        (2 * matrix_params, vocab_bytes(VocabRole::Head) + vocab_bytes(VocabRole::Embeddings))
    };
    let other_params = model.parameters.saturating_sub(linear_params * model.layers + vocab_params);
    (other_params as f64 * dense_bytes + linear_bytes * model.layers as f64 + vocab_bytes) as u64
}

/// A base quantization that would make `config`'s run fit `budget_bytes`, with its estimate, when the model
/// as loaded does not fit: the largest of q8_0, q6k, q4k that fits (None when it fits already, when even
/// q4k does not, or when the budget is unknown). What the model panel proposes.
pub fn quantization_that_fits(
    model: &ModelShape,
    config: &TrainConfig,
    budget_bytes: Option<u64>,
) -> Option<(BaseQuant, MemoryEstimate)> {
    let budget = budget_bytes?;
    if training_memory(model, config).total_bytes() <= budget {
        return None;
    }
    [BaseQuant::Q8_0, BaseQuant::Q6K, BaseQuant::Q4K].into_iter().find_map(|q| {
        let shape = ModelShape { base_weights_bytes: Some(base_weights_bytes_with(model, q)), ..model.clone() };
        let est = training_memory(&shape, config);
        (est.total_bytes() <= budget).then_some((q, est))
    })
}

/// Memory for training, by part: the peak of a training step on the CPU, where every byte is counted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryEstimate {
    pub base_weights_bytes: u64,
    /// Adapter weights, their gradients and AdamW's two moments, all f32.
    pub adapter_state_bytes: u64,
    /// Activations kept for the backward pass: every trained layer's tape, or with checkpointing each
    /// layer's input plus the one layer being recomputed.
    pub activations_bytes: u64,
    /// The chunked head and loss: final hidden states and their gradient, one chunk of logits.
    pub logits_bytes: u64,
    /// The largest short-lived buffers of one layer's backward (attention scores and their gradients, or the
    /// MLP's gradients), on top of what is kept.
    pub transient_bytes: u64,
    /// The process itself: code, tokenizer, thread stacks, allocator arenas.
    pub runtime_bytes: u64,
    /// Whether the activations are those of a checkpointed run.
    pub checkpointing: bool,
    /// GRPO's sampling phase: the KV caches and logits of a micro-batch's completions decoding together. Sampling
    /// and the training passes take turns (the caches are freed before the passes), so the larger of the two
    /// counts.
    pub generation_bytes: u64,
}

impl MemoryEstimate {
    pub fn total_bytes(&self) -> u64 {
        let step = self.activations_bytes + self.logits_bytes + self.transient_bytes;
        self.base_weights_bytes + self.adapter_state_bytes + step.max(self.generation_bytes) + self.runtime_bytes
    }
}

/// Rows of a quantized head its CUDA loss over `tokens` rows holds dense at once (`ops::dequantized_head_rows`: a
/// block of its rows for one chunk of rows, all of them past it).
fn dequantized_head_rows(model: &ModelShape, tokens: u64) -> u64 {
    let block_rows = crate::engine::model::vocab_matrix::VocabMatrix::rows_per_block(model.hidden_size);
    crate::engine::ops::dequantized_head_rows(model.vocab_size, block_rows, tokens as usize) as u64
}

/// What the process holds besides the model and the step: measured on the CPU builds (binary, BLAS and
/// thread pools, allocator arenas), plus the tokenizer, which grows with the vocabulary.
fn runtime_bytes(vocab: u64) -> u64 {
    RUNTIME_BASE_BYTES + vocab * RUNTIME_BYTES_PER_TOKEN
}
const RUNTIME_BASE_BYTES: u64 = 60 << 20;
const RUNTIME_BYTES_PER_TOKEN: u64 = 400;

/// The estimate for training `model` with `config` (one micro-batch of `batch_size` x `seq_len` in flight, twice
/// that for a preference method: a pair is two sequences),
/// with checkpointing as `config` says (`auto` counts as off: what the run needs without it).
pub fn training_memory(model: &ModelShape, config: &TrainConfig) -> MemoryEstimate {
    training_memory_with(model, config, config.checkpointing.recomputes())
}

/// [`training_memory`] with checkpointing on or off.
pub fn training_memory_with(model: &ModelShape, config: &TrainConfig, checkpointing: bool) -> MemoryEstimate {
    let bytes = model.dtype_bytes.max(1) as u64;
    // A GRPO sequence is a prompt of up to `seq_len` tokens and its completion.
    let completion = if config.method.is_reinforcement() { config.grpo.max_new_tokens as u64 } else { 0 };
    let (b, t) = (config.rows_per_batch().max(1) as u64, config.seq_len.max(1) as u64 + completion);
    let tokens = b * t;
    let (h, i) = (model.hidden_size as u64, model.intermediate_size as u64);
    let (q, kv) = ((model.attention_heads * model.head_dim) as u64, (model.kv_heads * model.head_dim) as u64);
    // The backward runs from the top down to the lowest adapted layer.
    let trained_layers = adapted_layers(model.layers, config.lora.layers).len() as u64;
    // One layer's tape per token: the layer input, the mid residual, q, k, v, the attention output, gate and
    // up; then the attention probabilities (heads x T per token), or with the fused kernels one f32 logsumexp per
    // head; then per adapted linear x·A (rank) (a dropout mask is kept as its seed and drawn again in the
    // backward). The inputs of adapted linears (a frozen product's input gradient needs no input) are made again
    // in the backward: the attention norm's output (q|k|v) and the MLP norm's output (gate|up) from the residuals
    // the tape keeps, the SwiGLU product (down) from gate and up. A checkpointed layer's recompute, read at once,
    // keeps the two normed inputs.
    let targets = model.targets_of(&config.lora).unwrap_or_else(|_| config.lora.targets.clone());
    let adapted_linears: Vec<&(String, usize, usize)> =
        model.linear_shapes.iter().filter(|(name, _, _)| targets.contains_name(name)).collect();
    let adapted = |names: &[&str]| adapted_linears.iter().any(|(name, _, _)| names.contains(&name.as_str()));
    let kept_inputs = [
        (adapted(&["q_proj", "k_proj", "v_proj", "qkv_proj"]), h),
        (adapted(&["gate_proj", "up_proj", "gate_up_proj"]), h),
    ];
    let inputs_per_token: u64 = kept_inputs.iter().filter(|(kept, _)| *kept).map(|(_, width)| width).sum();
    let rank = config.lora.rank as u64;
    // DoRA also keeps each adapted linear's output before its magnitude factor (its magnitude's gradient reads it).
    let dora_per_token: u64 =
        if config.lora.dora { adapted_linears.iter().map(|(_, _, out)| *out as u64).sum() } else { 0 };
    let lora_per_token: u64 = rank * adapted_linears.len() as u64 + dora_per_token;
    let heads = model.attention_heads as u64;
    let (probs_per_token, lse_bytes_per_token) = if model.fused_attention { (0, heads * 4) } else { (heads * t, 0) };
    let tape_per_token = 2 * h + 2 * q + 2 * kv + 2 * i + probs_per_token + lora_per_token;
    let layer_tape = tokens * (tape_per_token * bytes + lse_bytes_per_token);
    let recompute_inputs = tokens * inputs_per_token * bytes;
    // A checkpointed recompute that defers the MLP keeps none of its activations (gate and up); its backward holds
    // six (rows x intermediate) tensors for one block of rows at a time.
    let deferred = checkpointing && model.defers_mlp;
    let mlp_tape = tokens * 2 * i * bytes;
    let recomputed_tape = recompute_inputs + if deferred { layer_tape.saturating_sub(mlp_tape) } else { layer_tape };
    // Offloaded layer inputs wait in host memory: on the device only the layer being recomputed (and the next
    // input on its way back).
    let kept_inputs_bytes = match checkpointing && config.checkpointing.offloads() && model.offloads_checkpoints {
        true => 2 * tokens * h * bytes,
        false => trained_layers * tokens * h * bytes,
    };
    let activations_bytes =
        if checkpointing { kept_inputs_bytes + recomputed_tape } else { trained_layers * layer_tape };
    // Attention backward: the probabilities' gradient and the scores' gradient (f32 on the CPU, through f32
    // upcasts in half precision), or with the fused kernels dq, dk, dv and one f32 per head and token; MLP
    // backward: three (tokens x intermediate) gradients.
    let attention = if model.fused_attention {
        tokens * ((q + 2 * kv) * bytes + heads * 4)
    } else {
        b * heads * t * t * (bytes + 4 + if bytes < 4 { 12 } else { 0 })
    };
    let mlp = match deferred {
        true => {
            6 * tokens.min(crate::engine::model::mlp::deferred_block_rows(model.intermediate_size) as u64) * i * bytes
        }
        false => 3 * tokens * i * bytes,
    };
    let vocab = model.vocab_size as u64;
    let chunk_rows = crate::engine::ops::logits_chunk_rows(model.vocab_size, true) as u64;
    // f32 logits of one chunk (and, in half precision, the composed path's f32 temporaries), the final
    // hidden states, their norm, the picked rows and their gradients.
    let logits_chunk = chunk_rows.min(tokens) * vocab * if bytes < 4 { 4 * 4 + bytes } else { 4 };
    MemoryEstimate {
        base_weights_bytes: model.base_weights_bytes.unwrap_or(model.parameters as u64 * bytes),
        adapter_state_bytes: trainable_params(model, &config.lora).unwrap_or(0) as u64 * 16,
        activations_bytes,
        // A quantized head's loss on CUDA holds a dense copy of one block of its rows, or of all of them at length.
        logits_bytes: logits_chunk
            + 4 * tokens * h * bytes.max(4)
            + if model.dequantizes_head { dequantized_head_rows(model, tokens) * h * bytes } else { 0 },
        transient_bytes: attention.max(mlp) + 2 * tokens * h * bytes,
        runtime_bytes: runtime_bytes(vocab),
        checkpointing,
        generation_bytes: if completion > 0 {
            // A micro-batch's prompts decode together: batch_size groups.
            let rows = (config.grpo.num_generations * config.batch_size) as u64;
            rows * t * model.layers as u64 * 2 * kv * bytes + rows * vocab * 4
        } else {
            0
        },
    }
}

/// The config an estimate should use for a dataset whose longest training row is `longest_row_tokens`: a
/// micro-batch is padded to its longest row (truncated at `seq_len`), never to `seq_len` itself, so the worst
/// batch the sampler can draw is that long. With short rows this is what separates 400 GiB from 3 GB. Without
/// a dataset (None) the config is used as is: rows of the full `seq_len`.
pub fn padded_to_data(config: &TrainConfig, longest_row_tokens: Option<usize>) -> TrainConfig {
    let mut padded = config.clone();
    if let Some(longest) = longest_row_tokens.filter(|n| *n > 0) {
        padded.seq_len = longest.min(config.seq_len);
    }
    padded
}

/// What the estimate assumed about row lengths, for the card and the CLI's note.
pub fn padding_assumption(config: &TrainConfig, longest_row_tokens: Option<usize>) -> String {
    if let Some(longest) = longest_row_tokens.filter(|n| *n > 0 && config.packing) {
        return format!(
            "assumes the fullest packed row, {} tokens: packing fills rows of up to the sequence length {}",
            longest.min(config.seq_len),
            config.seq_len
        );
    }
    match longest_row_tokens.filter(|n| *n > 0) {
        Some(longest) if longest < config.seq_len => format!(
            "assumes the dataset's longest row, {longest} tokens: batches are padded to their longest row, not to \
             the sequence length {}",
            config.seq_len
        ),
        Some(_) => format!(
            "assumes rows of the sequence length {}: the longest reach it (longer ones are cut)",
            config.seq_len
        ),
        None => format!("assumes rows of the full sequence length {} (no dataset rows known)", config.seq_len),
    }
}

/// A change of settings that makes a run fit its memory budget: what the studio offers as a one-click fix and
/// the CLI names in its warning. (A quantized base, which needs a reload, is [`quantization_that_fits`].)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryFix {
    /// Turn gradient checkpointing on.
    Checkpointing,
    /// Checkpointing with the kept layer inputs in host memory (CUDA).
    OffloadCheckpoints,
    /// Lower the batch size to this.
    BatchSize(usize),
    /// Lower the sequence length to this.
    SeqLen(usize),
}

impl MemoryFix {
    /// What the fix does, for a button or a warning ("turn checkpointing on").
    pub fn describe(self) -> String {
        match self {
            Self::Checkpointing => "turn gradient checkpointing on (--checkpointing on)".into(),
            Self::OffloadCheckpoints => {
                "keep the checkpointed layer inputs in host memory (--checkpointing offload)".into()
            }
            Self::BatchSize(n) => format!("lower the batch size to {n} (--batch-size {n})"),
            Self::SeqLen(n) => format!("lower the sequence length to {n} (--seq-len {n})"),
        }
    }

    pub fn apply(self, config: &mut TrainConfig) {
        match self {
            Self::Checkpointing => config.checkpointing = Checkpointing::On,
            Self::OffloadCheckpoints => config.checkpointing = Checkpointing::Offload,
            Self::BatchSize(n) => config.batch_size = n,
            Self::SeqLen(n) => config.seq_len = n,
        }
    }
}

/// Whether a run checkpoints, and why (for the CLI's note and the studio's settings).
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointingDecision {
    pub enabled: bool,
    /// With the kept layer inputs in host memory (`offload`).
    pub offload: bool,
    pub reason: String,
}

impl CheckpointingDecision {
    /// The setting this decision stands for (what run.json records for `auto`).
    pub fn setting(&self) -> Checkpointing {
        match (self.enabled, self.offload) {
            (false, _) => Checkpointing::Off,
            (true, false) => Checkpointing::On,
            (true, true) => Checkpointing::Offload,
        }
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// The one rule for `checkpointing = auto`: on when the run would not fit `budget_bytes` (named
/// `budget_name`) without it, and offloaded where the device offloads and the kept inputs alone would not fit
/// either; off when it fits or the budget is unknown. `on`, `offload` and `off` are taken as set.
pub fn checkpointing_decision(
    model: &ModelShape,
    config: &TrainConfig,
    budget_bytes: Option<u64>,
    budget_name: &str,
) -> CheckpointingDecision {
    let without = training_memory_with(model, config, false).total_bytes();
    let decided = |enabled, offload, reason: String| CheckpointingDecision { enabled, offload, reason };
    match (config.checkpointing, budget_bytes) {
        (Checkpointing::On, _) => decided(true, false, "set to on".into()),
        (Checkpointing::Offload, _) if model.offloads_checkpoints => decided(true, true, "set to offload".into()),
        (Checkpointing::Offload, _) => decided(
            true,
            true,
            "set to offload, the same as on for this device (offloading moves them off an NVIDIA GPU)".into(),
        ),
        (Checkpointing::Off, _) => decided(false, false, "set to off".into()),
        (Checkpointing::Auto, None) => decided(
            false,
            false,
            format!("auto: off, {budget_name} is unknown (the run needs about {:.1} GiB)", gib(without)),
        ),
        (Checkpointing::Auto, Some(budget)) if without > budget => {
            let on = TrainConfig { checkpointing: Checkpointing::On, ..config.clone() };
            let with_inputs = training_memory_with(model, &on, true).total_bytes();
            if with_inputs > budget && model.offloads_checkpoints {
                return decided(
                    true,
                    true,
                    format!(
                        "auto: offload, the run needs about {:.1} GiB without checkpointing and {:.1} GiB with the \
                         kept inputs on the device, and {budget_name} is {:.1} GiB",
                        gib(without),
                        gib(with_inputs),
                        gib(budget)
                    ),
                );
            }
            decided(
                true,
                false,
                format!(
                    "auto: on, the run needs about {:.1} GiB without it and {budget_name} is {:.1} GiB",
                    gib(without),
                    gib(budget)
                ),
            )
        }
        (Checkpointing::Auto, Some(budget)) => CheckpointingDecision {
            enabled: false,
            offload: false,
            reason: format!(
                "auto: off, the run fits {budget_name} without it ({:.1} of {:.1} GiB)",
                gib(without),
                gib(budget)
            ),
        },
    }
}

/// Replace `checkpointing = auto` in `config` by the decision of [`checkpointing_decision`] (what run.json
/// then records) and return the note to show; None when it was set explicitly. Every front end calls it
/// before starting a run.
pub fn resolve_checkpointing(
    model: &ModelShape,
    config: &mut TrainConfig,
    budget_bytes: Option<u64>,
    budget_name: &str,
) -> Option<String> {
    if config.checkpointing != Checkpointing::Auto {
        return None;
    }
    let decision = checkpointing_decision(model, config, budget_bytes, budget_name);
    config.checkpointing = decision.setting();
    Some(format!("gradient checkpointing {}", decision.reason))
}

/// The estimate of the run as it will start: `auto` checkpointing decided against the budget.
pub fn run_memory(
    model: &ModelShape,
    config: &TrainConfig,
    budget_bytes: Option<u64>,
    budget_name: &str,
) -> MemoryEstimate {
    let decision = checkpointing_decision(model, config, budget_bytes, budget_name);
    let decided = TrainConfig { checkpointing: decision.setting(), ..config.clone() };
    training_memory_with(model, &decided, decision.enabled)
}

/// The first settings change that makes the run fit `budget_bytes`: checkpointing on, then offloaded (where the
/// device offloads), then a smaller batch,
/// then a shorter sequence (halving down to 1 sequence and 64 tokens), with its estimate; None when the run
/// fits already, when the budget is unknown, or when no such change fits.
pub fn memory_fix(
    model: &ModelShape,
    config: &TrainConfig,
    budget_bytes: Option<u64>,
    budget_name: &str,
) -> Option<(MemoryFix, MemoryEstimate)> {
    let budget = budget_bytes?;
    if run_memory(model, config, budget_bytes, budget_name).total_bytes() <= budget {
        return None;
    }
    let mut candidates = Vec::new();
    if !config.checkpointing.recomputes() {
        candidates.push(MemoryFix::Checkpointing);
    }
    if model.offloads_checkpoints && config.checkpointing != Checkpointing::Offload {
        candidates.push(MemoryFix::OffloadCheckpoints);
    }
    candidates.extend(
        std::iter::successors(Some(config.batch_size / 2), |n| Some(n / 2))
            .take_while(|&n| n >= 1)
            .map(MemoryFix::BatchSize),
    );
    candidates.extend(
        std::iter::successors(Some(config.seq_len / 2), |n| Some(n / 2))
            .take_while(|&n| n >= 64)
            .map(MemoryFix::SeqLen),
    );
    candidates.into_iter().find_map(|fix| {
        let mut changed = config.clone();
        fix.apply(&mut changed);
        let est = run_memory(model, &changed, budget_bytes, budget_name);
        (est.total_bytes() <= budget).then_some((fix, est))
    })
}

/// The warning every front end shows before a run whose estimate exceeds the memory the device can use
/// (`budget_bytes`, named `budget_name`: RAM, GPU memory, or a Mac's recommended GPU working set, past which
/// macOS swaps), naming the change that makes it fit; None when it fits or the budget is unknown.
pub fn memory_warning(
    model: &ModelShape,
    config: &TrainConfig,
    budget_bytes: Option<u64>,
    budget_name: &str,
) -> Option<String> {
    let budget = budget_bytes?;
    let estimate = run_memory(model, config, budget_bytes, budget_name);
    let total = estimate.total_bytes();
    if total <= budget {
        return None;
    }
    let advice = match memory_fix(model, config, budget_bytes, budget_name) {
        Some((fix, est)) => format!("{} (then about {:.1} GiB)", fix.describe(), gib(est.total_bytes())),
        None => match quantization_that_fits(model, config, budget_bytes) {
            Some((q, est)) => {
                format!("load the base quantized (--quantize {q}, then about {:.1} GiB)", gib(est.total_bytes()))
            }
            None => "lower the batch size, the sequence length or the rank, or quantize the base".into(),
        },
    };
    Some(format!(
        "this run needs about {:.1} GiB but {budget_name} is {:.1} GiB: it would swap or fail; {advice}",
        gib(total),
        gib(budget),
    ))
}

mod offload_host;
mod run_plan;
pub use offload_host::{offload_host_note, OffloadedLayers};
pub use run_plan::{longest_train_row, plan_run_memory, MemoryPlan};

#[cfg(test)]
mod tests;
