//! The Llama-family decoder (llama, mistral, qwen2, qwen3) written for fine-tuning: every projection is a
//! [`Linear`] that can carry a LoRA adapter, `forward` returns hidden states for every position, and
//! attention reads and extends a [`KvCache`] without copying it each token.
//!
//! Read top-down: rotary tables, the blocks (attention, MLP, decoder layer), then the public model.

use super::config::{ModelConfig, RopeScaling};
use super::linear::Linear;
use super::safetensors_weights::Weights;
use crate::engine::generate::{KvCache, LayerCache};
use crate::engine::ops;
use crate::engine::Result;
use candle_core::{DType, Device, Tensor};

/// The block a projection belongs to in Hugging Face names: `self_attn` or `mlp`.
pub fn module_group(module: &str) -> &'static str {
    match module {
        "q_proj" | "k_proj" | "v_proj" | "o_proj" => "self_attn",
        _ => "mlp",
    }
}

/// Hugging Face name of a decoder layer's linear, e.g. `model.layers.3.self_attn.q_proj`.
pub fn hf_linear_name(layer: usize, module: &str) -> String {
    format!("model.layers.{layer}.{}.{module}", module_group(module))
}

/// Options for one forward pass.
#[derive(Debug, Clone, Copy, Default)]
pub struct ForwardOptions {
    /// Keep gradients flowing (differentiable ops) and apply adapter dropout.
    pub train: bool,
}

/// Precomputed cos/sin tables for every position up to the context length.
#[derive(Debug, Clone)]
struct RotaryTables {
    cos: Tensor,
    sin: Tensor,
    /// (positions, head_dim) rows of [cos | sin] in f32 for the fused CUDA decode kernels; None elsewhere.
    decode_table: Option<Tensor>,
}

impl RotaryTables {
    fn new(cfg: &ModelConfig, dtype: DType, device: &Device) -> Result<Self> {
        let dim = cfg.head_dim;
        let mut inv_freq: Vec<f64> =
            (0..dim / 2).map(|i| 1.0 / cfg.rope_theta.powf(2.0 * i as f64 / dim as f64)).collect();
        let mut position_scale = 1.0;
        match &cfg.rope_scaling {
            Some(RopeScaling::Llama3(s)) => {
                let low_wavelen = s.original_max_position_embeddings as f64 / s.low_freq_factor;
                let high_wavelen = s.original_max_position_embeddings as f64 / s.high_freq_factor;
                for f in inv_freq.iter_mut() {
                    let wavelen = 2.0 * std::f64::consts::PI / *f;
                    *f = if wavelen < high_wavelen {
                        *f
                    } else if wavelen > low_wavelen {
                        *f / s.factor
                    } else {
                        let smooth = (s.original_max_position_embeddings as f64 / wavelen - s.low_freq_factor)
                            / (s.high_freq_factor - s.low_freq_factor);
                        (1.0 - smooth) * *f / s.factor + smooth * *f
                    };
                }
            }
            Some(RopeScaling::Linear { factor }) => position_scale = 1.0 / factor,
            None => {}
        }
        let max_len = cfg.max_position_embeddings;
        let mut angles = Vec::with_capacity(max_len * dim / 2);
        for pos in 0..max_len {
            let p = pos as f64 * position_scale;
            angles.extend(inv_freq.iter().map(|f| (p * f) as f32));
        }
        let angles = Tensor::from_vec(angles, (max_len, dim / 2), device)?;
        let (cos, sin) = (angles.cos()?, angles.sin()?);
        let decode_table = if ops::cuda_decode::available(device, dtype) {
            Some(Tensor::cat(&[&cos, &sin], 1)?.contiguous()?)
        } else {
            None
        };
        Ok(Self { cos: cos.to_dtype(dtype)?, sin: sin.to_dtype(dtype)?, decode_table })
    }

    fn slice(&self, start: usize, len: usize) -> Result<(Tensor, Tensor)> {
        Ok((self.cos.narrow(0, start, len)?, self.sin.narrow(0, start, len)?))
    }
}

/// Self-attention with grouped-query heads, optional q/k norms (qwen3) and biases (qwen2).
#[derive(Debug, Clone)]
pub struct Attention {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    pub(crate) q_norm: Option<Tensor>,
    pub(crate) k_norm: Option<Tensor>,
    pub(crate) num_heads: usize,
    pub(crate) num_kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) rms_norm_eps: f64,
    pub(crate) sliding_window: Option<usize>,
    /// On CUDA: q, k and v weights (and biases) in one tensor, of which the three projections' weights are
    /// row views; decoding multiplies by it once. None on other devices.
    fused_qkv: Option<FusedWeight>,
}

impl Attention {
    fn new(cfg: &ModelConfig, w: &WeightLoader, prefix: &str) -> Result<Self> {
        let (h, q, kv) = (cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim);
        let norm = |name: &str| -> Result<Option<Tensor>> {
            if cfg.qk_norm {
                Ok(Some(w.get(&format!("{prefix}.{name}.weight"), &[cfg.head_dim])?))
            } else {
                Ok(None)
            }
        };
        let ([q_proj, k_proj, v_proj], fused_qkv) = w.fused_linears(
            [&format!("{prefix}.q_proj"), &format!("{prefix}.k_proj"), &format!("{prefix}.v_proj")],
            h,
            [q, kv, kv],
            cfg.qkv_bias,
        )?;
        Ok(Self {
            q_proj,
            k_proj,
            v_proj,
            fused_qkv,
            o_proj: w.linear(&format!("{prefix}.o_proj"), q, h, cfg.o_bias)?,
            q_norm: norm("q_norm")?,
            k_norm: norm("k_norm")?,
            num_heads: cfg.num_attention_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            rms_norm_eps: cfg.rms_norm_eps,
            sliding_window: cfg.sliding_window,
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        rotary: &RotaryTables,
        start_pos: usize,
        cache: Option<&mut LayerCache>,
        opts: ForwardOptions,
    ) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let grad = opts.train;
        let heads =
            |y: Tensor, n: usize| -> Result<Tensor> { Ok(y.reshape((b, t, n, self.head_dim))?.transpose(1, 2)?) };
        let mut q = heads(self.q_proj.forward(x, opts.train)?, self.num_heads)?;
        let mut k = heads(self.k_proj.forward(x, opts.train)?, self.num_kv_heads)?;
        let v = heads(self.v_proj.forward(x, opts.train)?, self.num_kv_heads)?;
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            q = ops::rms_norm(&q, qn, self.rms_norm_eps, grad)?;
            k = ops::rms_norm(&k, kn, self.rms_norm_eps, grad)?;
        }
        let (cos, sin) = rotary.slice(start_pos, t)?;
        let q = ops::rope(&q, &cos, &sin, grad)?;
        let k = ops::rope(&k, &cos, &sin, grad)?;
        let (k, v) = match cache {
            Some(c) => c.append(&k, &v)?,
            None => (k, v.contiguous()?),
        };
        let total = k.dim(2)?;

        // Grouped-query attention without repeating K/V: fold the query heads that share a KV head into
        // the row dimension, (b, kv, rep * t, d).
        let rep = self.num_heads / self.num_kv_heads;
        let q = q.contiguous()?.reshape((b, self.num_kv_heads, rep * t, self.head_dim))?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let scores = ops::matmul(&q, &k.t()?)?;
        let mask = attention_mask(t, start_pos, total, self.sliding_window, x.device())?;
        let probs = ops::scaled_masked_softmax(&scores, scale, mask.as_ref(), grad)?.to_dtype(v.dtype())?;
        let out = ops::matmul(&probs, &v)?; // (b, kv, rep * t, d)
        let out = out.reshape((b, self.num_heads, t, self.head_dim))?.transpose(1, 2)?.reshape((
            b,
            t,
            self.num_heads * self.head_dim,
        ))?;
        Ok(self.o_proj.forward(&out, opts.train)?)
    }
}

/// Additive mask (t, total): query i sits at absolute position start_pos + i and sees keys at or before it
/// (and, with a sliding window, no further back than the window). None when nothing is masked.
pub(crate) fn attention_mask(
    t: usize,
    start_pos: usize,
    total: usize,
    window: Option<usize>,
    device: &Device,
) -> Result<Option<Tensor>> {
    let window = window.unwrap_or(usize::MAX);
    if t == 1 && total <= window {
        return Ok(None);
    }
    let mut mask = vec![0f32; t * total];
    for i in 0..t {
        let pos = start_pos + i;
        for j in 0..total {
            if j > pos || pos - j >= window {
                mask[i * total + j] = f32::NEG_INFINITY;
            }
        }
    }
    Ok(Some(Tensor::from_vec(mask, (t, total), device)?))
}

/// The SwiGLU feed-forward block.
#[derive(Debug, Clone)]
pub struct Mlp {
    pub gate_proj: Linear,
    pub up_proj: Linear,
    pub down_proj: Linear,
    /// On CUDA: gate and up weights in one tensor (their weights are row views of it). None elsewhere.
    fused_gate_up: Option<Tensor>,
}

impl Mlp {
    fn new(cfg: &ModelConfig, w: &WeightLoader, prefix: &str) -> Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let ([gate_proj, up_proj], fused) =
            w.fused_linears([&format!("{prefix}.gate_proj"), &format!("{prefix}.up_proj")], h, [i, i], false)?;
        Ok(Self {
            gate_proj,
            up_proj,
            down_proj: w.linear(&format!("{prefix}.down_proj"), i, h, false)?,
            fused_gate_up: fused.map(|(weight, _)| weight),
        })
    }

    fn forward(&self, x: &Tensor, opts: ForwardOptions) -> Result<Tensor> {
        let gated = ops::silu_mul(&self.gate_proj.forward(x, opts.train)?, &self.up_proj.forward(x, opts.train)?)?;
        Ok(self.down_proj.forward(&gated, opts.train)?)
    }
}

/// One pre-norm decoder layer.
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    pub self_attn: Attention,
    pub mlp: Mlp,
    pub(crate) input_layernorm: Tensor,
    pub(crate) post_attention_layernorm: Tensor,
    pub(crate) rms_norm_eps: f64,
}

impl DecoderLayer {
    fn new(cfg: &ModelConfig, w: &WeightLoader, index: usize) -> Result<Self> {
        let prefix = format!("model.layers.{index}");
        Ok(Self {
            self_attn: Attention::new(cfg, w, &format!("{prefix}.self_attn"))?,
            mlp: Mlp::new(cfg, w, &format!("{prefix}.mlp"))?,
            input_layernorm: w.get(&format!("{prefix}.input_layernorm.weight"), &[cfg.hidden_size])?,
            post_attention_layernorm: w
                .get(&format!("{prefix}.post_attention_layernorm.weight"), &[cfg.hidden_size])?,
            rms_norm_eps: cfg.rms_norm_eps,
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        rotary: &RotaryTables,
        start_pos: usize,
        cache: Option<&mut LayerCache>,
        opts: ForwardOptions,
    ) -> Result<Tensor> {
        match cache {
            Some(cache) if self.decodes_fused(x, rotary, start_pos, cache, opts)? => {
                self.decode_fused(x, rotary, cache)
            }
            cache => self.forward_composed(x, rotary, start_pos, cache, opts),
        }
    }

    fn forward_composed(
        &self,
        x: &Tensor,
        rotary: &RotaryTables,
        start_pos: usize,
        cache: Option<&mut LayerCache>,
        opts: ForwardOptions,
    ) -> Result<Tensor> {
        let normed = ops::rms_norm(x, &self.input_layernorm, self.rms_norm_eps, opts.train)?;
        let x = (x + self.self_attn.forward(&normed, rotary, start_pos, cache, opts)?)?;
        let normed = ops::rms_norm(&x, &self.post_attention_layernorm, self.rms_norm_eps, opts.train)?;
        Ok((&x + self.mlp.forward(&normed, opts)?)?)
    }
}

/// The fused CUDA decode path (see [`ops::cuda_decode`]): one new token, the model's fused weights, and no
/// active adapter on the fused projections or q/k norm, which the kernels do not model.
impl DecoderLayer {
    fn decodes_fused(
        &self,
        x: &Tensor,
        rotary: &RotaryTables,
        start_pos: usize,
        cache: &LayerCache,
        opts: ForwardOptions,
    ) -> Result<bool> {
        let (a, m) = (&self.self_attn, &self.mlp);
        Ok(!opts.train
            && !ops::cuda_decode::disabled_by_env()
            && x.dim(1)? == 1
            && start_pos == cache.len()
            && rotary.decode_table.is_some()
            && a.fused_qkv.is_some()
            && m.fused_gate_up.is_some()
            && a.q_norm.is_none()
            && ![&a.q_proj, &a.k_proj, &a.v_proj, &m.gate_proj, &m.up_proj].iter().any(|l| l.has_active_adapter()))
    }

    /// Ten launches per layer: norm, qkv product, cache write, attention, o_proj, add + norm, gate|up product,
    /// SwiGLU, down_proj, residual add (plus any adapter on o_proj or down_proj).
    fn decode_fused(&self, x: &Tensor, rotary: &RotaryTables, cache: &mut LayerCache) -> Result<Tensor> {
        let (a, m) = (&self.self_attn, &self.mlp);
        let (Some((qkv_weight, qkv_bias)), Some(gate_up), Some(table)) =
            (&a.fused_qkv, &m.fused_gate_up, &rotary.decode_table)
        else {
            return Err(candle_core::Error::Msg("fused decode without fused weights".into()).into());
        };
        let b = x.dim(0)?;
        let normed = ops::rms_norm(x, &self.input_layernorm, self.rms_norm_eps, false)?;
        let mut qkv = ops::frozen_matmul_t(&normed, qkv_weight)?;
        if let Some(bias) = qkv_bias {
            qkv = qkv.broadcast_add(bias)?;
        }
        let pos = cache.len();
        let shape = ops::cuda_decode::DecodeShape {
            heads: a.num_heads,
            kv_heads: a.num_kv_heads,
            head_dim: a.head_dim,
            pos,
            first_visible: a.sliding_window.map(|w| (pos + 1).saturating_sub(w)).unwrap_or(0),
        };
        let buf = cache.reserve(b, a.num_kv_heads, a.head_dim, 1, x.dtype(), x.device())?;
        ops::cuda_decode::kv_write(&buf, &qkv, table, shape)?;
        cache.advance(1);
        let attn = a.o_proj.forward(&ops::cuda_decode::attention(&qkv, &buf, table, shape)?, false)?;
        let (x, normed) = ops::cuda_decode::add_rms_norm(x, &attn, &self.post_attention_layernorm, self.rms_norm_eps)?;
        let gated = ops::cuda_decode::silu_mul_halves(&ops::frozen_matmul_t(&normed, gate_up)?)?;
        Ok((x + m.down_proj.forward(&gated, false)?)?)
    }
}

/// Projections' weights concatenated along the output dimension, and their biases if they have them.
type FusedWeight = (Tensor, Option<Tensor>);

/// Reads named tensors with the right shape, dtype and device.
struct WeightLoader<'a> {
    weights: &'a Weights,
    dtype: DType,
    device: &'a Device,
}

impl WeightLoader<'_> {
    fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.weights.get(name, shape, self.dtype, self.device)
    }

    fn linear(&self, prefix: &str, in_features: usize, out_features: usize, bias: bool) -> Result<Linear> {
        let weight = self.get(&format!("{prefix}.weight"), &[out_features, in_features])?;
        let bias = if bias { Some(self.get(&format!("{prefix}.bias"), &[out_features])?) } else { None };
        Ok(Linear::new(weight, bias))
    }

    /// Projections that read the same input. Where the fused decode kernels run, their weights (and biases)
    /// are concatenated into one tensor, returned too, and each linear holds a row view of it (no extra memory).
    fn fused_linears<const N: usize>(
        &self,
        prefixes: [&str; N],
        in_features: usize,
        out_features: [usize; N],
        bias: bool,
    ) -> Result<([Linear; N], Option<FusedWeight>)> {
        let linears = prefixes
            .iter()
            .zip(out_features)
            .map(|(p, out)| self.linear(p, in_features, out, bias))
            .collect::<Result<Vec<_>>>()?;
        let array = |v: Vec<Linear>| -> [Linear; N] { v.try_into().unwrap_or_else(|_| unreachable!("N linears")) };
        if !ops::cuda_decode::available(self.device, self.dtype) {
            return Ok((array(linears), None));
        }
        let weight = Tensor::cat(&linears.iter().map(|l| &l.weight).collect::<Vec<_>>(), 0)?;
        let biases: Option<Vec<&Tensor>> = linears.iter().map(|l| l.bias.as_ref()).collect();
        let bias = biases.map(|b| Tensor::cat(&b, 0)).transpose()?;
        let mut start = 0;
        let views = out_features
            .iter()
            .map(|&out| {
                let view = Linear::new(
                    weight.narrow(0, start, out)?,
                    bias.as_ref().map(|b| b.narrow(0, start, out)).transpose()?,
                );
                start += out;
                Ok(view)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((array(views), Some((weight, bias))))
    }
}

/// The decoder-only language model.
#[derive(Debug, Clone)]
pub struct Transformer {
    pub config: ModelConfig,
    embed_tokens: Tensor,
    pub layers: Vec<DecoderLayer>,
    norm: Tensor,
    /// None when the embeddings are tied.
    lm_head: Option<Tensor>,
    rotary: RotaryTables,
    dtype: DType,
    device: Device,
}

impl Transformer {
    /// Build from a weight source; every tensor is checked against the config's shapes.
    pub fn load(config: &ModelConfig, weights: &Weights, dtype: DType, device: &Device) -> Result<Self> {
        let w = WeightLoader { weights, dtype, device };
        let (v, h) = (config.vocab_size, config.hidden_size);
        let embed_tokens = w.get("model.embed_tokens.weight", &[v, h])?;
        let layers = (0..config.num_layers).map(|i| DecoderLayer::new(config, &w, i)).collect::<Result<Vec<_>>>()?;
        let norm = w.get("model.norm.weight", &[h])?;
        // Some checkpoints say tie_word_embeddings=false yet ship no lm_head: they are tied in effect.
        let lm_head = if !config.tie_word_embeddings && weights.contains("lm_head.weight") {
            Some(w.get("lm_head.weight", &[v, h])?)
        } else {
            None
        };
        let mut config = config.clone();
        config.tie_word_embeddings = lm_head.is_none();
        Ok(Self {
            rotary: RotaryTables::new(&config, dtype, device)?,
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
        opts: ForwardOptions,
    ) -> Result<Tensor> {
        let mut x = self.embed(input_ids, start_pos)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let layer_cache = cache.as_deref_mut().map(|c| c.layer(i));
            x = layer.forward(&x, &self.rotary, start_pos, layer_cache, opts)?;
        }
        Ok(ops::rms_norm(&x, &self.norm, self.config.rms_norm_eps, opts.train)?)
    }

    /// Token embeddings (b, t, hidden) for ids (b, t) placed at `start_pos`; an error when they would run
    /// past the context length.
    pub(crate) fn embed(&self, input_ids: &Tensor, start_pos: usize) -> Result<Tensor> {
        let (b, t) = input_ids.dims2()?;
        let context = self.config.max_position_embeddings;
        if start_pos + t > context {
            return Err(crate::engine::Error::PromptTooLong { prompt_tokens: start_pos + t, context_len: context });
        }
        Ok(self.embed_tokens.index_select(&input_ids.flatten_all()?, 0)?.reshape((b, t, self.config.hidden_size))?)
    }

    /// Run decoder layer `index` without a cache or gradients (the frozen layers below every adapter).
    pub(crate) fn layer_forward(&self, index: usize, x: &Tensor) -> Result<Tensor> {
        self.layers[index].forward(x, &self.rotary, 0, None, ForwardOptions::default())
    }

    /// Rotary cos/sin tables (len, head_dim / 2) for positions `start..start + len`.
    pub(crate) fn rotary_slice(&self, start: usize, len: usize) -> Result<(Tensor, Tensor)> {
        self.rotary.slice(start, len)
    }

    /// The final RMS norm's weight.
    pub(crate) fn final_norm_weight(&self) -> &Tensor {
        &self.norm
    }

    /// The output projection (vocab, hidden): lm_head, or the embeddings when tied.
    pub(crate) fn head_weight(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }

    /// Logits (…, vocab) for hidden states (…, hidden).
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        Ok(ops::frozen_matmul_t(hidden, head)?)
    }

    /// Logits for every position: (b, t, vocab).
    pub fn forward(&self, input_ids: &Tensor, start_pos: usize, cache: Option<&mut KvCache>) -> Result<Tensor> {
        let hidden = self.forward_hidden(input_ids, start_pos, cache, ForwardOptions::default())?;
        self.logits(&hidden)
    }

    /// Logits of the last position only, as f32: (b, vocab). What generation needs.
    pub fn forward_last(&self, input_ids: &Tensor, start_pos: usize, cache: Option<&mut KvCache>) -> Result<Tensor> {
        let hidden = self.forward_hidden(input_ids, start_pos, cache, ForwardOptions::default())?;
        let t = hidden.dim(1)?;
        let last = hidden.narrow(1, t - 1, 1)?.squeeze(1)?;
        Ok(self.logits(&last)?.to_dtype(DType::F32)?)
    }

    /// Every linear in the model with its (layer, module) name, for attaching adapters.
    pub fn linears_mut(&mut self) -> Vec<(usize, &'static str, &mut Linear)> {
        let mut out = Vec::new();
        for (i, layer) in self.layers.iter_mut().enumerate() {
            let a = &mut layer.self_attn;
            out.push((i, "q_proj", &mut a.q_proj));
            out.push((i, "k_proj", &mut a.k_proj));
            out.push((i, "v_proj", &mut a.v_proj));
            out.push((i, "o_proj", &mut a.o_proj));
            let m = &mut layer.mlp;
            out.push((i, "gate_proj", &mut m.gate_proj));
            out.push((i, "up_proj", &mut m.up_proj));
            out.push((i, "down_proj", &mut m.down_proj));
        }
        out
    }

    /// Every linear, read-only.
    pub fn linears(&self) -> Vec<(usize, &'static str, &Linear)> {
        let mut out = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let a = &layer.self_attn;
            let m = &layer.mlp;
            for (name, lin) in [
                ("q_proj", &a.q_proj),
                ("k_proj", &a.k_proj),
                ("v_proj", &a.v_proj),
                ("o_proj", &a.o_proj),
                ("gate_proj", &m.gate_proj),
                ("up_proj", &m.up_proj),
                ("down_proj", &m.down_proj),
            ] {
                out.push((i, name, lin));
            }
        }
        out
    }

    /// Every weight under its Hugging Face name, with adapters merged in (W + scale * (A B)^T), on the CPU.
    pub fn merged_named_weights(&self) -> Result<std::collections::HashMap<String, Tensor>> {
        let mut out = std::collections::HashMap::new();
        let cpu = |t: &Tensor| -> Result<Tensor> { Ok(t.to_device(&Device::Cpu)?) };
        out.insert("model.embed_tokens.weight".to_string(), cpu(&self.embed_tokens)?);
        out.insert("model.norm.weight".to_string(), cpu(&self.norm)?);
        if let Some(head) = &self.lm_head {
            out.insert("lm_head.weight".to_string(), cpu(head)?);
        }
        for (i, layer) in self.layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            out.insert(format!("{p}.input_layernorm.weight"), cpu(&layer.input_layernorm)?);
            out.insert(format!("{p}.post_attention_layernorm.weight"), cpu(&layer.post_attention_layernorm)?);
            if let (Some(q), Some(k)) = (&layer.self_attn.q_norm, &layer.self_attn.k_norm) {
                out.insert(format!("{p}.self_attn.q_norm.weight"), cpu(q)?);
                out.insert(format!("{p}.self_attn.k_norm.weight"), cpu(k)?);
            }
        }
        for (i, module, linear) in self.linears() {
            let name = hf_linear_name(i, module);
            let mut w = linear.weight.to_dtype(DType::F32)?;
            if let Some(a) = &linear.adapter {
                let delta = (a.a.as_tensor().matmul(a.b.as_tensor())?.t()? * a.scale)?;
                let delta = delta.to_device(w.device())?;
                w = (w + delta)?;
            }
            out.insert(format!("{name}.weight"), w.to_dtype(self.dtype)?.to_device(&Device::Cpu)?);
            if let Some(b) = &linear.bias {
                out.insert(format!("{name}.bias"), cpu(b)?);
            }
        }
        Ok(out)
    }
}
