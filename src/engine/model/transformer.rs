//! The Llama-family decoder (llama, mistral, qwen2, qwen3, gemma3's text model, olmo2, phi3, smollm3, granite)
//! written for fine-tuning: every projection is a [`Linear`] that can carry a LoRA adapter, `forward` returns
//! hidden states for every position, and attention reads and extends a [`KvCache`] without copying it each token.
//!
//! The model ties its blocks together: embeddings, decoder layers (decoder_layer.rs, attention.rs, mlp.rs,
//! each owning its forward, training forward, backward and decode step), the final norm and the head.

use super::attention::attention_mask;
use super::config::ModelConfig;
use super::decoder_layer::DecoderLayer;
use super::kv_cache::KvCache;
use super::linear::Linear;
use super::norm::RmsNorm;
use super::quant::{type_name, BaseQuant, VocabRole};
use super::rotary::RotaryTables;
use super::safetensors_weights::Weights;
use super::sequence::{packed_positions, LocalAttention, PackedRows, SequenceContext};
use super::vocab_matrix::VocabMatrix;
use super::weight_loader::WeightLoader;
use crate::engine::ops;
use crate::engine::Result;
use candle_core::{DType, Device, Tensor};

pub use super::config::module_group;

/// Hugging Face name of a decoder layer's linear, e.g. `model.layers.3.self_attn.q_proj`.
pub fn hf_linear_name(layer: usize, module: &str) -> String {
    format!("model.layers.{layer}.{}.{module}", module_group(module))
}

/// The decoder-only language model.
#[derive(Debug, Clone)]
pub struct Transformer {
    pub config: ModelConfig,
    embed_tokens: VocabMatrix,
    pub layers: Vec<DecoderLayer>,
    /// The final norm; granite's `1 / logits_scaling` is folded into the factor it runs with
    /// ([`RmsNorm::scaled`]), its stored weight is what exports write.
    norm: RmsNorm,
    /// None when the embeddings are tied.
    lm_head: Option<VocabMatrix>,
    rotary: RotaryTables,
    /// The sliding layers' rope tables when they have a base of their own (gemma3).
    local_rotary: Option<RotaryTables>,
    dtype: DType,
    device: Device,
}

impl Transformer {
    /// Build from a weight source with dense projections; every tensor is checked against the config's shapes.
    pub fn load(config: &ModelConfig, weights: &Weights, dtype: DType, device: &Device) -> Result<Self> {
        Self::load_with(config, weights, dtype, device, BaseQuant::None)
    }

    /// Build from a weight source, holding the decoder layers' projections and the vocabulary matrices
    /// (embeddings, head) as `quant` says (norms stay dense in `dtype`).
    pub fn load_with(
        config: &ModelConfig,
        weights: &Weights,
        dtype: DType,
        device: &Device,
        quant: BaseQuant,
    ) -> Result<Self> {
        let w = WeightLoader { weights, dtype, device, quant };
        let (v, h) = (config.vocab_size, config.hidden_size);
        // Some checkpoints say tie_word_embeddings=false yet ship no lm_head: they are tied in effect.
        let tied = config.tie_word_embeddings || !weights.contains("lm_head.weight");
        let vocab_matrix = |name, role| VocabMatrix::load(weights, (name, role), (v, h), dtype, device, quant);
        let embeddings_role = if tied { VocabRole::Head } else { VocabRole::Embeddings };
        let embed_tokens = vocab_matrix("model.embed_tokens.weight", embeddings_role)?;
        let layers = (0..config.num_layers).map(|i| DecoderLayer::new(config, &w, i)).collect::<Result<Vec<_>>>()?;
        let norm =
            RmsNorm::new("norm", w.get("model.norm.weight", &[h])?, config.norm_weight_offset, config.rms_norm_eps)?
                .scaled(1.0 / config.logits_scaling)?;
        let lm_head = if tied { None } else { Some(vocab_matrix("lm_head.weight", VocabRole::Head)?) };
        let mut config = config.clone();
        config.tie_word_embeddings = lm_head.is_none();
        Ok(Self {
            rotary: RotaryTables::new(&config, dtype, device)?,
            local_rotary: RotaryTables::local(&config, dtype, device)?,
            config,
            embed_tokens,
            layers,
            norm,
            lm_head,
            dtype,
            device: device.clone(),
        })
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Final hidden states (b, t, hidden) for token ids (b, t) placed at `start_pos`.
    pub fn forward_hidden(
        &self,
        input_ids: &Tensor,
        start_pos: usize,
        mut cache: Option<&mut KvCache>,
    ) -> Result<Tensor> {
        let mut x = self.embed(input_ids, start_pos)?;
        // A residual add the fused decode left for the next norm (`DecoderLayer::forward_pending`).
        let mut pending = None;
        for (i, layer) in self.layers.iter().enumerate() {
            let layer_cache = cache.as_deref_mut().map(|c| c.layer(i));
            (x, pending) = layer.forward_pending(&x, pending.take(), self.rotary_for(layer), start_pos, layer_cache)?;
        }
        match pending {
            Some(delta) => Ok(ops::cuda::decode::add_rms_norm(&x, &delta, self.norm.factor(), self.norm.eps)?.1),
            None => self.final_norm(&x),
        }
    }

    /// Whether a single-token decode step runs entirely on the device through the fused decode kernels, with
    /// nothing read back to the host on the way: what a captured CUDA graph replays (model/decode_graph.rs).
    /// Quantized embeddings must be rows our CUDA kernel looks up (`VocabMatrix::looks_up_on_device`); an
    /// embedding multiplier is uploaded.
    pub fn decode_step_stays_on_device(&self) -> bool {
        self.embed_tokens.looks_up_on_device(&self.device)
            && self.config.embedding_multiplier == 1.0
            && self.layers.iter().all(|layer| {
                self.rotary_for(layer).decode_table.is_some() && layer.fused_decode_ready(&self.device, self.dtype)
            })
    }

    /// The rope tables a layer rotates with: the local ones for gemma3's sliding layers.
    fn rotary_for(&self, layer: &DecoderLayer) -> &RotaryTables {
        match &self.local_rotary {
            Some(local) if layer.self_attn.local => local,
            _ => &self.rotary,
        }
    }

    /// The final RMS norm.
    pub fn final_norm(&self, x: &Tensor) -> Result<Tensor> {
        self.norm.forward(x)
    }

    /// `(x + pending, final_norm(x + pending))` (`x` itself without `pending`): the last layer's residual add in
    /// one pass with the final norm where a kernel does both.
    pub fn final_norm_after(&self, x: &Tensor, pending: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
        match pending {
            Some(delta) => self.norm.add_forward(x, delta),
            None => Ok((x.clone(), self.final_norm(x)?)),
        }
    }

    /// The input gradient of [`Self::final_norm`] at `x` for the output gradient `dy`.
    pub fn final_norm_backward(&self, x: &Tensor, dy: &Tensor) -> Result<Tensor> {
        self.norm.backward(x, dy)
    }

    /// Token embeddings (b, t, hidden) for ids (b, t) placed at `start_pos`, times granite's
    /// `embedding_multiplier`; an error when they would run past the context length.
    pub fn embed(&self, input_ids: &Tensor, start_pos: usize) -> Result<Tensor> {
        let (b, t) = input_ids.dims2()?;
        let context = self.config.max_position_embeddings;
        if start_pos + t > context {
            return Err(crate::engine::Error::PromptTooLong { prompt_tokens: start_pos + t, context_len: context });
        }
        let x = self.embed_tokens.rows(&input_ids.flatten_all()?)?.reshape((b, t, self.config.hidden_size))?;
        if self.config.embedding_multiplier == 1.0 {
            return Ok(x);
        }
        // transformers casts the multiplier to the weights' dtype first (gemma3: sqrt(3072) is 55.5 in bf16). Rounded
        // here on the host, so no f64 tensor and no cast kernel exist (Metal has neither).
        let m = self.config.embedding_multiplier;
        let multiplier = match self.dtype {
            DType::BF16 => Tensor::new(half::bf16::from_f64(m), &self.device)?,
            DType::F16 => Tensor::new(half::f16::from_f64(m), &self.device)?,
            _ => Tensor::new(m as f32, &self.device)?.to_dtype(self.dtype)?,
        };
        Ok(x.broadcast_mul(&multiplier)?)
    }

    /// Run decoder layer `index` without a cache or gradients (the frozen layers below every adapter).
    pub fn layer_forward(&self, index: usize, x: &Tensor) -> Result<Tensor> {
        let layer = &self.layers[index];
        layer.forward(x, self.rotary_for(layer), 0, None)
    }

    /// Rotary cos/sin tables (len, rotary_dim / 2) for positions `start..start + len` of one forward.
    pub fn rotary_slice(&self, start: usize, len: usize) -> Result<(Tensor, Tensor)> {
        self.rotary.slice(start, len)
    }

    /// What every layer's training forward and backward share for a batch of `batch` sequences of `seq_len`
    /// tokens from position 0: the global layers' rope tables and mask, and the sliding layers' own when the
    /// model mixes the two (gemma3). With `row_starts` (packed rows, `data::packing`) each token rotates by its
    /// position in its own example and attention stays inside it (fused or blocked; no (t, t) mask is made).
    pub fn sequence_context(
        &self,
        batch: usize,
        seq_len: usize,
        dropout: bool,
        row_starts: Option<&[u32]>,
    ) -> Result<SequenceContext> {
        let window = self.layers.iter().find(|l| !l.self_attn.local).and_then(|l| l.self_attn.sliding_window);
        let local_layer = self.layers.iter().find(|l| l.self_attn.local);
        if let Some(starts) = row_starts {
            return self.packed_context(batch, seq_len, dropout, starts, local_layer.map(|l| self.rotary_for(l)));
        }
        let (cos, sin) = self.rotary_slice(0, seq_len)?;
        // The fused and the blocked attention mask per block; only the composed one reads the (t, t) masks.
        let fused = ops::fused_attention_applies(&self.device, self.dtype, self.config.head_dim)
            || (seq_len > 1 && ops::blocked_attention_applies(&self.device, self.dtype, self.config.head_dim, seq_len));
        let mask_for = |window: Option<usize>| -> Result<Option<Tensor>> {
            if fused {
                Ok(None)
            } else {
                attention_mask(seq_len, 0, seq_len, window, &self.device)
            }
        };
        let mask = mask_for(window)?;
        let local = match local_layer {
            Some(layer) => {
                let (cos, sin) = self.rotary_for(layer).slice(0, seq_len)?;
                let mask = mask_for(layer.self_attn.sliding_window)?;
                Some(LocalAttention { cos, sin, mask })
            }
            None => None,
        };
        Ok(SequenceContext { batch, seq_len, cos, sin, mask, local, dropout, packed: None })
    }

    /// [`Self::sequence_context`] for packed rows: per-token rope tables gathered at each token's position in
    /// its example, and the starts the attention masks by.
    fn packed_context(
        &self,
        batch: usize,
        seq_len: usize,
        dropout: bool,
        starts: &[u32],
        local_rotary: Option<&RotaryTables>,
    ) -> Result<SequenceContext> {
        if starts.len() != batch * seq_len {
            return Err(candle_core::Error::Msg(format!(
                "packed rows: {} row starts for {batch} rows of {seq_len} tokens",
                starts.len()
            ))
            .into());
        }
        let positions = packed_positions(starts, seq_len);
        let longest = positions.iter().map(|&p| p as usize + 1).max().unwrap_or(1);
        let positions = Tensor::from_vec(positions, batch * seq_len, &self.device)?;
        let (cos, sin) = self.rotary.gather(&positions, (batch, seq_len), longest)?;
        let local = match local_rotary {
            Some(rotary) => {
                let (cos, sin) = rotary.gather(&positions, (batch, seq_len), longest)?;
                Some(LocalAttention { cos, sin, mask: None })
            }
            None => None,
        };
        let packed = PackedRows {
            starts: Tensor::from_vec(starts.to_vec(), (batch, seq_len), &self.device)?,
            starts_host: starts.to_vec(),
        };
        Ok(SequenceContext { batch, seq_len, cos, sin, mask: None, local, dropout, packed: Some(packed) })
    }

    /// What multiplies the final RMS norm's normalised input (its weight, plus 1 for gemma3, divided by
    /// granite's logits scaling).
    pub fn final_norm_weight(&self) -> &Tensor {
        self.norm.factor()
    }

    /// The output projection (vocab, hidden): lm_head, or the embeddings when tied.
    pub fn head(&self) -> &VocabMatrix {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }

    /// Logits (…, vocab) for hidden states (…, hidden).
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(self.head().logits(hidden)?)
    }

    /// The head and loss over `targets` after `hidden` (n, hidden), without a logits tensor of all rows (see
    /// `ops::head_nll`): the sum of `-log p(target)`, and with `grad_scale` the gradient of that sum times
    /// `grad_scale` for `hidden`.
    pub fn head_nll(&self, hidden: &Tensor, targets: &[u32], grad_scale: Option<f64>) -> Result<ops::HeadLoss> {
        Ok(self.head().head_nll(hidden, targets, grad_scale, None)?)
    }

    /// `-log p(targets[i] | hidden[i])` for every row (scoring).
    pub fn head_token_nll(&self, hidden: &Tensor, targets: &[u32]) -> Result<Vec<f64>> {
        let mut rows = Vec::with_capacity(targets.len());
        self.head().head_nll(hidden, targets, None, Some(&mut rows))?;
        Ok(rows)
    }

    /// Logits for every position: (b, t, vocab).
    pub fn forward(&self, input_ids: &Tensor, start_pos: usize, cache: Option<&mut KvCache>) -> Result<Tensor> {
        let hidden = self.forward_hidden(input_ids, start_pos, cache)?;
        self.logits(&hidden)
    }

    /// Logits of the last position only, as f32: (b, vocab). What generation needs.
    pub fn forward_last(&self, input_ids: &Tensor, start_pos: usize, cache: Option<&mut KvCache>) -> Result<Tensor> {
        let hidden = self.forward_hidden(input_ids, start_pos, cache)?;
        let t = hidden.dim(1)?;
        let last = hidden.narrow(1, t - 1, 1)?.squeeze(1)?;
        Ok(self.logits(&last)?.to_dtype(DType::F32)?)
    }

    /// Logits of the last position, as f32 (1, vocab), after running the ids of the one sequence `ids` that
    /// `cache` does not hold yet (all of them when it is empty). When those positions run past LongRoPE's
    /// original context while the cache holds keys rotated with the short factors, the cache is dropped and
    /// the whole sequence recomputed (transformers' Phi3 generation does the same), so cached decoding always
    /// equals one forward over the sequence.
    pub fn forward_last_cached(&self, ids: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        let mut start = cache.len();
        if start >= ids.len() {
            return Err(
                candle_core::Error::Msg(format!("{} ids, all already in the cache of {start}", ids.len())).into()
            );
        }
        if self.rotary.restarts_cache(start, ids.len() - start) {
            *cache = KvCache::new(self.config.num_layers);
            start = 0;
        }
        let input = Tensor::new(&ids[start..], &self.device)?.unsqueeze(0)?;
        self.forward_last(&input, start, Some(cache))
    }

    /// Every linear in the model with its (layer, module) name, for attaching adapters, in model order.
    pub fn linears_mut(&mut self) -> Vec<(usize, &'static str, &mut Linear)> {
        let mut out = Vec::new();
        for (i, layer) in self.layers.iter_mut().enumerate() {
            let a = &mut layer.self_attn;
            out.extend(a.qkv.linears.iter_mut().map(|(name, l)| (i, *name, l)));
            out.push((i, "o_proj", &mut a.o_proj));
            let m = &mut layer.mlp;
            out.extend(m.gate_up.linears.iter_mut().map(|(name, l)| (i, *name, l)));
            out.push((i, "down_proj", &mut m.down_proj));
        }
        out
    }

    /// Every linear, read-only.
    pub fn linears(&self) -> Vec<(usize, &'static str, &Linear)> {
        let mut out = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let (a, m) = (&layer.self_attn, &layer.mlp);
            out.extend(a.qkv.linears.iter().map(|(name, l)| (i, *name, l)));
            out.push((i, "o_proj", &a.o_proj));
            out.extend(m.gate_up.linears.iter().map(|(name, l)| (i, *name, l)));
            out.push((i, "down_proj", &m.down_proj));
        }
        out
    }

    /// Bytes the base model's weights hold in memory (quantized projections at their quantized size; adapters
    /// not counted).
    pub fn base_weights_bytes(&self) -> u64 {
        let mut total = self.embed_tokens.size_in_bytes()
            + self.norm.size_in_bytes()
            + self.lm_head.as_ref().map_or(0, VocabMatrix::size_in_bytes);
        for layer in &self.layers {
            total += layer.norms.iter().map(RmsNorm::size_in_bytes).sum::<u64>();
            total += [&layer.self_attn.q_norm, &layer.self_attn.k_norm]
                .iter()
                .filter_map(|n| n.as_ref())
                .map(|n| n.size_in_bytes())
                .sum::<u64>();
        }
        let linears: u64 = self.linears().iter().map(|(_, _, l)| l.weight.size_in_bytes() as u64).sum();
        total + linears
    }

    /// How the projections are held, for display: `dense`, or the quantized types and how many linears have
    /// each (`q4_1 x 210`, plus `dense x N` for those left dense).
    pub fn base_storage(&self) -> String {
        let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
        for (_, _, l) in self.linears() {
            let name = l.weight.quantized_type().map_or_else(|| "dense".to_string(), type_name);
            *counts.entry(name).or_default() += 1;
        }
        if counts.len() == 1 && counts.contains_key("dense") {
            return "dense".into();
        }
        counts.iter().map(|(name, n)| format!("{name} x {n}")).collect::<Vec<_>>().join(", ")
    }

    /// Every weight under its Hugging Face name, with adapters merged in (W + scale * (A B)^T, DoRA's
    /// rows rescaled: `adapter::merge_weight`), on the CPU.
    pub fn merged_named_weights(&self) -> Result<std::collections::HashMap<String, Tensor>> {
        let mut out = std::collections::HashMap::new();
        let cpu = |t: &Tensor| -> Result<Tensor> { Ok(t.to_device(&Device::Cpu)?) };
        let vocab = |m: &VocabMatrix| -> Result<Tensor> { Ok(m.to_dense(self.dtype)?.to_device(&Device::Cpu)?) };
        out.insert("model.embed_tokens.weight".to_string(), vocab(&self.embed_tokens)?);
        out.insert("model.norm.weight".to_string(), cpu(&self.norm.weight)?);
        if let Some(head) = &self.lm_head {
            out.insert("lm_head.weight".to_string(), vocab(head)?);
        }
        for (i, layer) in self.layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            for norm in layer.norms.iter() {
                out.insert(format!("{p}.{}.weight", norm.name), cpu(&norm.weight)?);
            }
            for norm in [&layer.self_attn.q_norm, &layer.self_attn.k_norm].into_iter().flatten() {
                out.insert(format!("{p}.self_attn.{}.weight", norm.name), cpu(&norm.weight)?);
            }
        }
        for (i, module, linear) in self.linears() {
            let name = hf_linear_name(i, module);
            let mut w = linear.weight.to_dense(DType::F32)?;
            if let Some(a) = &linear.adapter {
                let magnitude = a.dora.as_ref().map(|d| d.magnitude.as_tensor().to_device(w.device())).transpose()?;
                w = super::adapter::merge_weight(&w, &a.delta()?.to_device(w.device())?, magnitude.as_ref())?;
            }
            out.insert(format!("{name}.weight"), w.to_dtype(self.dtype)?.to_device(&Device::Cpu)?);
            if let Some(b) = &linear.bias {
                out.insert(format!("{name}.bias"), cpu(b)?);
            }
        }
        Ok(out)
    }
}
