//! The autograd reference of the training loss: the model's forward written again from the Hugging Face
//! formulas with plain differentiable Candle ops (composed RMS norm, rotate-half rotary on the leading
//! rotary dimensions, repeated K/V heads, composed softmax, SiLU and tanh-gelu, the families' norm layouts, a
//! whole log-softmax, granite's multipliers, fused q|k|v and gate|up outputs split by narrowing), reading the
//! model's weights and adapters. Candle's autograd through it gives the gradients the hand-written training
//! pass must reproduce. Test support only: the engine never runs it.

use candle_core::{DType, Tensor, D};
use metal_candle::engine::data::Batch;
use metal_candle::engine::model::attention::Attention;
use metal_candle::engine::model::config::MlpActivation;
use metal_candle::engine::model::decoder_layer::DecoderLayer;
use metal_candle::engine::model::linear::Linear;
use metal_candle::engine::model::norm::RmsNorm;
use metal_candle::engine::model::transformer::Transformer;
use metal_candle::engine::train::loss;

type R<T> = candle_core::Result<T>;

/// Sum over the batch's target tokens of their negative log-likelihood, as a scalar tensor whose backward
/// reaches every active adapter. Adapter dropout masks are drawn in the training pass's order (per layer:
/// q, k, v (or qkv), o, gate, up (or gate_up), down), so seeding both the same way gives the same masks.
pub fn nll_sum(model: &Transformer, batch: &Batch) -> R<Tensor> {
    let device = model.device();
    let (b, t) = (batch.batch_size, batch.seq_len);
    let input = Tensor::from_vec(batch.input_ids.clone(), (b, t), device)?;
    let mut x = model.embed(&input, 0).map_err(candle_core::Error::wrap)?.reshape((b * t, model.config.hidden_size))?;
    // The rope tables (global, and gemma3's local ones) are the model's; the masks are built here.
    let ctx = model.sequence_context(b, t, false, None).map_err(candle_core::Error::wrap)?;
    for layer in &model.layers {
        let (cos, sin, _) = ctx.attention(layer.self_attn.local);
        x = decoder_layer(layer, &x, b, t, cos, sin)?;
    }
    let x = rms_norm(&x, model.final_norm_weight(), model.config.rms_norm_eps)?;
    let (sources, targets) = loss::target_positions(batch);
    let picked = x.index_select(&Tensor::from_vec(sources, targets.len(), device)?, 0)?;
    let head = model.head().to_dense(x.dtype())?;
    let logits = picked.matmul(&head.t()?)?.to_dtype(wide(x.dtype()))?;
    let log_probs = log_softmax(&logits)?;
    let index = Tensor::from_vec(targets.clone(), (targets.len(), 1), device)?;
    log_probs.gather(&index, 1)?.sum_all()?.neg()
}

/// Half precision computes norms and softmax in f32, as Hugging Face does.
fn wide(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

/// A layer's norm when it has one (its factor: the weight, plus 1 for gemma3), else the identity.
fn norm(n: &Option<RmsNorm>, x: &Tensor) -> R<Tensor> {
    match n {
        Some(n) => rms_norm(x, n.factor(), n.eps),
        None => Ok(x.clone()),
    }
}

fn decoder_layer(layer: &DecoderLayer, x: &Tensor, b: usize, t: usize, cos: &Tensor, sin: &Tensor) -> R<Tensor> {
    let n = &layer.norms;
    let residual = layer.residual_multiplier;
    let normed = norm(&n.attention_input, x)?;
    let attn = norm(&n.attention_output, &attention(&layer.self_attn, &normed, b, t, cos, sin)?)?;
    let x = (x + (attn * residual)?)?;
    let normed = norm(&n.mlp_input, &x)?;
    let m = &layer.mlp;
    let [gate, up]: [Tensor; 2] = group(&m.gate_up.linears, &normed, &[1, 1])?.try_into().unwrap();
    let act = match m.activation {
        MlpActivation::Silu => (&gate * (gate.neg()?.exp()? + 1.0)?.recip()?)?,
        // 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3)))
        MlpActivation::GeluTanh => {
            let inner = ((&gate + (gate.powf(3.0)? * 0.044715)?)? * (2.0 / std::f64::consts::PI).sqrt())?;
            ((&gate * (inner.tanh()? + 1.0)?)? * 0.5)?
        }
    };
    x + (norm(&n.mlp_output, &linear(&m.down_proj, &(act * up)?)?)? * residual)?
}

fn attention(a: &Attention, x: &Tensor, b: usize, t: usize, cos: &Tensor, sin: &Tensor) -> R<Tensor> {
    let d = a.head_dim;
    let heads = |y: Tensor, n: usize| -> R<Tensor> { y.reshape((b, t, n, d))?.transpose(1, 2)?.contiguous() };
    let [mut q, mut k, v]: [Tensor; 3] =
        group(&a.qkv.linears, x, &[a.num_heads, a.num_kv_heads, a.num_kv_heads])?.try_into().unwrap();
    let norms = a.q_norm.as_ref().zip(a.k_norm.as_ref());
    if let Some((qn, kn)) = norms.filter(|_| a.qk_norm_over_projection) {
        q = rms_norm(&q, qn.factor(), qn.eps)?;
        k = rms_norm(&k, kn.factor(), kn.eps)?;
    }
    let (mut q, mut k, v) = (heads(q, a.num_heads)?, heads(k, a.num_kv_heads)?, heads(v, a.num_kv_heads)?);
    if let Some((qn, kn)) = norms.filter(|_| !a.qk_norm_over_projection) {
        q = rms_norm(&q, qn.factor(), qn.eps)?;
        k = rms_norm(&k, kn.factor(), kn.eps)?;
    }
    let (q, k) = if a.use_rope { (rotate(&q, cos, sin)?, rotate(&k, cos, sin)?) } else { (q, k) };
    // Hugging Face's repeat_kv: each KV head serves `rep` consecutive query heads.
    let rep = a.num_heads / a.num_kv_heads;
    let repeat = |y: Tensor| -> R<Tensor> {
        let (b, kv, t, d) = y.dims4()?;
        y.unsqueeze(2)?.broadcast_as((b, kv, rep, t, d))?.contiguous()?.reshape((b, kv * rep, t, d))
    };
    let (k, v) = (repeat(k)?, repeat(v)?);
    let scores = (q.matmul(&k.t()?)? * a.attention_scale)?.to_dtype(wide(q.dtype()))?;
    let scores = scores.broadcast_add(&causal_mask(t, a.sliding_window, scores.dtype(), x.device())?)?;
    let probs = softmax(&scores)?.to_dtype(v.dtype())?;
    let out = probs.matmul(&v)?.transpose(1, 2)?.reshape((b * t, a.num_heads * d))?;
    linear(&a.o_proj, &out)
}

/// `x W^T + b + scale * dropout(x) A B`, differentiable in A and B.
fn linear(l: &Linear, x: &Tensor) -> R<Tensor> {
    let mut y = x.matmul(&l.weight.to_dense(x.dtype())?.t()?)?;
    if let Some(bias) = &l.bias {
        y = y.broadcast_add(bias)?;
    }
    let Some(adapter) = l.active_adapter() else { return Ok(y) };
    let x_in = if adapter.dropout > 0.0 { adapter.next_dropout().apply(x)? } else { x.clone() };
    let (a, b) = (adapter.a.as_tensor().to_dtype(x.dtype())?, adapter.b.as_tensor().to_dtype(x.dtype())?);
    y + (x_in.matmul(&a)?.matmul(&b)? * adapter.scale)?
}

fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> R<Tensor> {
    let xf = x.to_dtype(wide(x.dtype()))?;
    let inv = (xf.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?;
    xf.broadcast_div(&inv)?.to_dtype(x.dtype())?.broadcast_mul(weight)
}

/// The outputs of projections sharing an input: one per linear, or one fused output split into parts in
/// proportion to `widths` (heads for q|k|v, equal halves for gate|up).
fn group(linears: &[(&'static str, Linear)], x: &Tensor, widths: &[usize]) -> R<Vec<Tensor>> {
    let outs: Vec<Tensor> = linears.iter().map(|(_, l)| linear(l, x)).collect::<R<_>>()?;
    if outs.len() == widths.len() {
        return Ok(outs);
    }
    let unit = outs[0].dim(D::Minus1)? / widths.iter().sum::<usize>();
    let mut start = 0;
    widths
        .iter()
        .map(|w| {
            let part = outs[0].narrow(D::Minus1, start, w * unit);
            start += w * unit;
            part
        })
        .collect()
}

/// Rotate-half rotary embedding on the leading `2 * cos.dim(1)` dimensions (the rest pass through);
/// `x`: (b, heads, t, d), `cos`/`sin`: (t, rotary_dim / 2).
fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> R<Tensor> {
    let (d, rotary) = (x.dim(D::Minus1)?, 2 * cos.dim(D::Minus1)?);
    if rotary < d {
        let turned = rotate(&x.narrow(D::Minus1, 0, rotary)?, cos, sin)?;
        return Tensor::cat(&[turned, x.narrow(D::Minus1, rotary, d - rotary)?], D::Minus1);
    }
    let half = x.dim(D::Minus1)? / 2;
    let (x1, x2) = (x.narrow(D::Minus1, 0, half)?, x.narrow(D::Minus1, half, half)?);
    let (cos, sin) = (cos.unsqueeze(0)?.unsqueeze(0)?, sin.unsqueeze(0)?.unsqueeze(0)?);
    let out1 = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
    let out2 = (x2.broadcast_mul(&cos)? + x1.broadcast_mul(&sin)?)?;
    Tensor::cat(&[out1, out2], D::Minus1)
}

fn causal_mask(t: usize, window: Option<usize>, dtype: DType, device: &candle_core::Device) -> R<Tensor> {
    let window = window.unwrap_or(usize::MAX);
    let mask: Vec<f32> = (0..t * t)
        .map(|k| {
            let (i, j) = (k / t, k % t);
            if j > i || i - j >= window {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Tensor::from_vec(mask, (t, t), device)?.to_dtype(dtype)
}

fn softmax(x: &Tensor) -> R<Tensor> {
    let shifted = x.broadcast_sub(&x.max_keepdim(D::Minus1)?.detach())?;
    let e = shifted.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

fn log_softmax(x: &Tensor) -> R<Tensor> {
    let shifted = x.broadcast_sub(&x.max_keepdim(D::Minus1)?.detach())?;
    shifted.broadcast_sub(&shifted.exp()?.sum_keepdim(D::Minus1)?.log()?)
}
