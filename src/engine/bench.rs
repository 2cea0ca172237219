//! Benchmarks of the engine: generation speed, training step speed and memory, and the LoRA layer
//! micro-benchmark (the rank explorer's probes are in [`super::rank_probe`]). They print numbers; no test times
//! anything.

use crate::engine::generate::{generate, GenerateRequest};
use crate::engine::model::LoadedModel;
use crate::engine::sampler::SamplingParams;
use crate::engine::Result;

/// Results of a generation benchmark (best of the repeats).
#[derive(Debug, Clone, serde::Serialize)]
pub struct GenerateBench {
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    pub prefill_tokens_per_sec: f64,
    pub decode_tokens_per_sec: f64,
    pub repeats: usize,
    /// The sampling every token went through (greedy unless asked).
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: usize,
    /// Tokens of the last run decoded by replaying a captured CUDA graph (0: none was used).
    pub graph_replays: usize,
    /// Why the last run stopped using a CUDA graph, when its capture failed.
    pub graph_fallback: Option<String>,
}

/// A deterministic prompt of exactly `n` tokens.
pub fn synthetic_prompt(model: &LoadedModel, n: usize) -> Result<Vec<u32>> {
    let text = "The quick brown fox jumps over the lazy dog while the curious cat watches from the window. ";
    let mut ids = Vec::with_capacity(n);
    let piece = model.tokenizer.encode(text, false)?;
    if piece.is_empty() {
        return Err(crate::engine::Error::Tokenizer("the benchmark text encodes to nothing".into()));
    }
    while ids.len() < n {
        ids.extend_from_slice(&piece);
    }
    ids.truncate(n);
    Ok(ids)
}

/// Generation of `new_tokens` (eos ignored) after a `prompt_tokens` prompt, sampled as `sampling` says (greedy:
/// [`SamplingParams::greedy`]), after one warm-up run.
pub fn bench_generate(
    model: &LoadedModel,
    prompt_tokens: usize,
    new_tokens: usize,
    repeats: usize,
    sampling: SamplingParams,
) -> Result<GenerateBench> {
    let (temperature, top_p, top_k) = (sampling.temperature, sampling.top_p, sampling.top_k);
    let req = GenerateRequest {
        prompt_ids: synthetic_prompt(model, prompt_tokens)?,
        max_new_tokens: new_tokens,
        sampling,
        eos_token_ids: vec![],
        ignore_eos: true,
        stop_strings: vec![],
    };
    let warmup = GenerateRequest { max_new_tokens: 4.min(new_tokens), ..req.clone() };
    generate(&model.model, &model.tokenizer, &warmup, &mut |_| true)?;
    let mut best = GenerateBench {
        prompt_tokens,
        new_tokens,
        prefill_tokens_per_sec: 0.0,
        decode_tokens_per_sec: 0.0,
        repeats: repeats.max(1),
        temperature,
        top_p,
        top_k,
        graph_replays: 0,
        graph_fallback: None,
    };
    for _ in 0..repeats.max(1) {
        let out = generate(&model.model, &model.tokenizer, &req, &mut |_| true)?;
        best.prefill_tokens_per_sec = best.prefill_tokens_per_sec.max(out.prefill_tokens_per_sec());
        best.decode_tokens_per_sec = best.decode_tokens_per_sec.max(out.decode_tokens_per_sec());
        best.graph_replays = out.graph_replays;
        best.graph_fallback = out.graph_fallback;
    }
    Ok(best)
}

/// Results of a training-step benchmark.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TrainBench {
    pub batch_size: usize,
    pub seq_len: usize,
    pub rank: usize,
    pub targets: Vec<String>,
    pub steps: usize,
    pub mean_step_secs: f64,
    pub median_step_secs: f64,
    pub tokens_per_sec: f64,
    pub trainable_params: usize,
    /// The last measured step's loss on its random batch (about ln(vocab) for an untrained model on random tokens).
    pub last_loss: f64,
    /// Peak process RSS during the measured steps (CPU), when the OS reports it.
    pub peak_rss_bytes: Option<u64>,
    /// The BLAS library doing CPU multiplies, if one was loaded.
    pub blas: Option<String>,
}

/// Deterministic random token batch (b, t) with every position after the first a target.
pub fn random_batch(vocab: usize, batch_size: usize, seq_len: usize, seed: u64) -> crate::engine::data::Batch {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let input_ids: Vec<u32> = (0..batch_size * seq_len).map(|_| rng.random_range(0..vocab as u32)).collect();
    let target_mask: Vec<f32> = (0..batch_size * seq_len).map(|i| if i % seq_len == 0 { 0.0 } else { 1.0 }).collect();
    crate::engine::data::Batch {
        input_ids,
        target_mask,
        batch_size,
        seq_len,
        target_tokens: batch_size * (seq_len - 1),
        lengths: vec![seq_len; batch_size],
        row_starts: None,
    }
}

/// Deterministic random preference batch: `pairs` pairs of `seq_len`-token sequences (2 x pairs rows, chosen
/// first), each pair sharing its first half (the prompt) and scoring its own second half (the completion).
pub fn random_pair_batch(vocab: usize, pairs: usize, seq_len: usize, seed: u64) -> crate::engine::data::Batch {
    let mut batch = random_batch(vocab, 2 * pairs, seq_len, seed);
    let prompt = seq_len / 2;
    for i in 0..pairs {
        let (chosen, rejected) = (i * seq_len, (pairs + i) * seq_len);
        batch.input_ids.copy_within(chosen..chosen + prompt, rejected);
        for row in [chosen, rejected] {
            batch.target_mask[row..row + prompt.max(1)].fill(0.0);
        }
    }
    batch.target_tokens = batch.target_mask.iter().filter(|&&m| m > 0.0).count();
    batch
}

/// What `bench train` measures: the adapter, the batch shape, how many steps, and the method.
#[derive(Debug, Clone)]
pub struct TrainBenchSpec {
    pub lora: crate::engine::train::LoraSettings,
    /// Sequences per batch, or pairs for a preference method (twice as many sequences).
    pub batch_size: usize,
    pub seq_len: usize,
    pub steps: usize,
    pub warmup_steps: usize,
    /// Gradient checkpointing, decided (on, off or offload).
    pub checkpointing: crate::engine::train::Checkpointing,
    pub method: crate::engine::train::Method,
}

/// Time full training steps (forward, backward, AdamW) on random batches of a fixed shape; for DPO and ORPO on
/// random pairs with their default settings (DPO's reference pass included).
pub fn bench_train(model: &LoadedModel, spec: &TrainBenchSpec) -> Result<TrainBench> {
    let TrainBenchSpec { lora, batch_size, seq_len, steps, warmup_steps, checkpointing, method } = spec.clone();
    crate::engine::train::validate::check_seq_len(seq_len, model.config.max_position_embeddings)?;
    let lora = &lora;
    let mut m = model.model.clone();
    crate::engine::lora::detach_adapters(&mut m);
    let params = crate::engine::lora::attach_new_adapters(&mut m, lora, 0)?;
    let trainable_params = params.iter().map(|p| p.elem_count()).sum();
    let mut runner = crate::engine::train::StepRunner::new(m, &params, 0.0, None, 0)?;
    runner.set_checkpointing(checkpointing)?;
    runner.preference = method
        .is_preference()
        .then(|| crate::engine::train::preference::PreferenceObjective::new(method, Default::default(), &model.model));
    let random_batch = |vocab, batch_size, seq_len, seed| match method.is_preference() {
        true => random_pair_batch(vocab, batch_size, seq_len, seed),
        false => random_batch(vocab, batch_size, seq_len, seed),
    };
    let vocab = model.config.vocab_size;
    for i in 0..warmup_steps {
        runner.step(&[random_batch(vocab, batch_size, seq_len, i as u64)], 1e-4)?;
    }
    crate::engine::device::reset_peak_rss();
    // As the trainer runs them: each step begun before the previous one is read, so a step's time is the
    // interval between two reads.
    let batch = |i: usize| [random_batch(vocab, batch_size, seq_len, 1000 + i as u64)];
    let steps = steps.max(1);
    let (mut step_secs, mut last_loss) = (Vec::new(), f64::NAN);
    let mut last_read = std::time::Instant::now();
    let mut ahead = Some(runner.begin(&batch(0))?);
    for i in 0..steps {
        let begun = ahead.take().expect("each step is begun before the previous one is read");
        let queued = runner.queue_update(begun, 1e-4)?;
        if i + 1 < steps {
            ahead = Some(runner.begin(&batch(i + 1))?);
        }
        (last_loss, _) = runner.finish(queued)?;
        if i + 1 == steps {
            // Off CUDA the last update may still be queued when its loss is read.
            model.model.device().synchronize()?;
        }
        step_secs.push(last_read.elapsed().as_secs_f64());
        last_read = std::time::Instant::now();
        if !last_loss.is_finite() {
            return Err(crate::engine::Error::Training(format!("bench step {}: the loss is {last_loss}", i + 1)));
        }
    }
    let mean_step_secs = step_secs.iter().sum::<f64>() / step_secs.len() as f64;
    step_secs.sort_by(f64::total_cmp);
    let median_step_secs = step_secs[step_secs.len() / 2];
    Ok(TrainBench {
        batch_size,
        seq_len,
        rank: lora.rank,
        targets: lora.targets.names(),
        steps,
        mean_step_secs,
        median_step_secs,
        tokens_per_sec: (batch_size * seq_len * if method.is_preference() { 2 } else { 1 }) as f64 / mean_step_secs,
        trainable_params,
        last_loss,
        peak_rss_bytes: crate::engine::device::peak_rss_bytes(),
        blas: if model.model.device().is_cpu() {
            crate::engine::blas::library_name().map(str::to_string)
        } else {
            None
        },
    })
}

/// One line of the LoRA micro-benchmark table.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct LoraMicroResult {
    /// "lora" for a LoRA linear, or "softmax" / "layer_norm" / "rms_norm".
    pub op: String,
    pub hidden: usize,
    pub rank: usize,
    pub forward_ms: f64,
    pub backward_ms: Option<f64>,
}

fn time_ms(repeats: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let started = std::time::Instant::now();
    for _ in 0..repeats.max(1) {
        f()?;
    }
    Ok(started.elapsed().as_secs_f64() * 1e3 / repeats.max(1) as f64)
}

/// LoRA linear forward and forward+backward for hidden 512/1024/2048 at rank 8 and ranks 4..64 at 1024,
/// plus softmax, layer norm and RMS norm at 1024 (forward: fused kernels; backward: the differentiable
/// versions training uses), on `device`, over a (4 x 128, hidden) input as the seeds' table.
pub fn bench_lora_micro(device: &candle_core::Device, repeats: usize) -> Result<Vec<LoraMicroResult>> {
    let mut out = lora_projection_cases(device, repeats)?;
    out.extend(norm_and_softmax_cases(device, repeats)?);
    Ok(out)
}

/// Rows of every micro case: a 4 x 128 token batch.
const MICRO_ROWS: usize = 4 * 128;

/// Wait for queued GPU work before the clock stops. (Reading one value with to_vec1 copied the whole buffer to
/// the host on CUDA: candle 0.11's to_vec1 copies the entire storage, then slices.)
fn sync(t: &candle_core::Tensor) -> Result<()> {
    t.device().synchronize()?;
    Ok(())
}

/// A frozen projection with an adapter, forward and the training pass's backward, across widths and ranks.
fn lora_projection_cases(device: &candle_core::Device, repeats: usize) -> Result<Vec<LoraMicroResult>> {
    use candle_core::{Tensor, Var};
    let rows = MICRO_ROWS;
    let mut out = Vec::new();
    let mut cases: Vec<(usize, usize)> = [512, 1024, 2048].iter().map(|&h| (h, 8)).collect();
    cases.extend([4, 16, 32, 64].iter().map(|&r| (1024, r)));
    for (hidden, rank) in cases {
        let x = Tensor::randn(0f32, 1.0, (rows, hidden), device)?;
        let w = (Tensor::randn(0f32, 1.0, (hidden, hidden), device)? * 0.02)?;
        let a = Var::from_tensor(&(Tensor::randn(0f32, 1.0, (hidden, rank), device)? * 0.02)?)?;
        let b = Var::from_tensor(&(Tensor::randn(0f32, 1.0, (rank, hidden), device)? * 0.02)?)?;
        let mut projection = crate::engine::model::linear::Linear::new(w, None);
        projection.adapter = Some(crate::engine::lora::LoraAdapter {
            a: a.clone(),
            b: b.clone(),
            scale: 2.0,
            dropout: 0.0,
            dropout_seed: Default::default(),
            compute: Default::default(),
            dora: None,
        });
        let forward_ms = time_ms(repeats, || sync(&projection.forward(&x)?))?;
        // The training step's hand-written pass: output, input gradient and both adapter gradients.
        let backward_ms = time_ms(repeats, || {
            let (_, dx, grads) = crate::engine::train::backprop::linear_forward_backward(&projection, &x)?;
            sync(&dx)?;
            if let Some(g) = grads.get(a.as_tensor()) {
                sync(g)?;
            }
            Ok(())
        })?;
        out.push(LoraMicroResult { op: "lora".into(), hidden, rank, forward_ms, backward_ms: Some(backward_ms) });
    }
    Ok(out)
}

/// Softmax, layer norm and RMS norm, forward and forward + input gradient.
fn norm_and_softmax_cases(device: &candle_core::Device, repeats: usize) -> Result<Vec<LoraMicroResult>> {
    use candle_core::{DType, Tensor, Var};
    let rows = MICRO_ROWS;
    let mut out = Vec::new();
    let hidden = 1024;
    let x = Tensor::randn(0f32, 1.0, (rows, hidden), device)?;
    let upstream = Tensor::randn(0f32, 1.0, (rows, hidden), device)?;
    let gamma = Tensor::ones(hidden, DType::F32, device)?;
    let beta = Tensor::zeros(hidden, DType::F32, device)?;
    use crate::engine::ops;
    type OpFn<'a> = Box<dyn Fn() -> candle_core::Result<Tensor> + 'a>;
    // (name, forward, forward + input gradient as the training pass computes it)
    let ops: Vec<(&str, OpFn, OpFn)> = vec![
        (
            "softmax",
            Box::new(|| candle_nn::ops::softmax_last_dim(&x)),
            Box::new(|| ops::softmax_backward(&candle_nn::ops::softmax_last_dim(&x)?, &upstream, 1.0)),
        ),
        (
            "layer_norm",
            Box::new(|| candle_nn::ops::layer_norm(&x, &gamma, &beta, 1e-5)),
            // Not used by any supported model: composed through Candle's autograd for reference.
            Box::new(|| {
                let v = Var::from_tensor(&x)?;
                let mean = v.mean_keepdim(1)?;
                let centered = v.broadcast_sub(&mean)?;
                let var = centered.sqr()?.mean_keepdim(1)?;
                let y = centered.broadcast_div(&(var + 1e-5)?.sqrt()?)?.broadcast_mul(&gamma)?.broadcast_add(&beta)?;
                let grads = (y * &upstream)?.sum_all()?.backward()?;
                grads.get(v.as_tensor()).cloned().ok_or_else(|| candle_core::Error::Msg("no gradient".into()))
            }),
        ),
        (
            "rms_norm",
            Box::new(|| ops::rms_norm(&x, &gamma, 1e-5)),
            Box::new(|| {
                let _y = ops::rms_norm(&x, &gamma, 1e-5)?;
                ops::rms_norm_backward(&x, &gamma, 1e-5, &upstream)
            }),
        ),
    ];
    for (name, forward, forward_backward) in ops {
        let forward_ms = time_ms(repeats, || sync(&forward()?))?;
        let backward_ms = time_ms(repeats, || sync(&forward_backward()?))?;
        out.push(LoraMicroResult { op: name.into(), hidden, rank: 0, forward_ms, backward_ms: Some(backward_ms) });
    }
    Ok(out)
}

/// Time of one sampled draw ([`crate::engine::sampler::Sampler::sample`]) over `vocab` random logits.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SampleBench {
    pub vocab: usize,
    /// Standard deviation of the normal logits: small is a flat distribution (a random-weight model's; the
    /// top-p head is most of the vocabulary), large a peaked one.
    pub spread: f32,
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: usize,
    pub draws: usize,
    pub ms_per_draw: f64,
}

/// Draws `draws` tokens from copies of one row of `vocab` normal logits of standard deviation `spread`.
pub fn bench_sample(vocab: usize, spread: f32, sampling: SamplingParams, draws: usize) -> SampleBench {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let normal = |rng: &mut rand::rngs::StdRng| {
        let (u, v): (f32, f32) = (rng.random::<f32>().max(1e-9), rng.random());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    };
    let logits: Vec<f32> = (0..vocab.max(1)).map(|_| spread * normal(&mut rng)).collect();
    let (temperature, top_p, top_k) = (sampling.temperature, sampling.top_p, sampling.top_k);
    let mut sampler = crate::engine::sampler::Sampler::new(sampling);
    let previous: Vec<u32> = (0..64).collect();
    let draws = draws.max(1);
    let started = std::time::Instant::now();
    for _ in 0..draws {
        let mut row = logits.clone();
        std::hint::black_box(sampler.sample(&mut row, &previous));
    }
    let ms_per_draw = started.elapsed().as_secs_f64() * 1e3 / draws as f64;
    SampleBench { vocab: logits.len(), spread, temperature, top_p, top_k, draws, ms_per_draw }
}
