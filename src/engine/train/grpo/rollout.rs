//! Sampling a prompt's group of completions with the policy (the model with its adapter on): the group's
//! sequences decode together as one batch through the KV cache (the prompt prefilled once and its cache copied to
//! every sequence, then
//! one token for every unfinished sequence per forward; on CUDA through the fused decode kernels), each with its
//! own seeded sampler, so a resumed run samples exactly what an uninterrupted one did. The caches live only
//! while the group decodes.

use super::batch::Completion;
use super::settings::GrpoSettings;
use crate::engine::generate::KvCache;
use crate::engine::model::tokenizer::TextTokenizer;
use crate::engine::model::transformer::Transformer;
use crate::engine::sampler::{Sampler, SamplingParams};
use crate::engine::{Error, Result};
use candle_core::Tensor;

/// What sampling needs besides the settings.
pub struct SamplingContext<'a> {
    pub model: &'a Transformer,
    pub tokenizer: &'a TextTokenizer,
    pub eos_token_ids: &'a [u32],
    pub settings: &'a GrpoSettings,
}

/// The seed of completion `index` of the batch sampled for round `round` of a run seeded `seed` (splitmix64 of
/// the three, so neighbouring completions draw unrelated streams).
pub fn completion_seed(seed: u64, round: usize, index: usize) -> u64 {
    let mut z =
        seed ^ (round as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (index as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One prompt to sample: its index in the split, its ids, and one seed per completion.
pub struct PromptDraw<'a> {
    pub prompt: usize,
    pub ids: &'a [u32],
    pub seeds: Vec<u64>,
}

/// Sample `seeds.len()` completions of prompt `prompt` (its ids `prompt_ids`), one per seed. `cancelled` is
/// polled between tokens.
pub fn sample_group(
    ctx: &SamplingContext<'_>,
    prompt: usize,
    prompt_ids: &[u32],
    seeds: &[u64],
    cancelled: &dyn Fn() -> bool,
) -> Result<Vec<Completion>> {
    sample_prompts(ctx, &[PromptDraw { prompt, ids: prompt_ids, seeds: seeds.to_vec() }], cancelled)
}

/// Sample the completions of `draws` (their order, each prompt's in seed order), decoding every prompt of the
/// same length together as one batch; prompts of different lengths decode one length after another.
pub fn sample_prompts(
    ctx: &SamplingContext<'_>,
    draws: &[PromptDraw<'_>],
    cancelled: &dyn Fn() -> bool,
) -> Result<Vec<Completion>> {
    let mut by_length: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for (i, d) in draws.iter().enumerate() {
        by_length.entry(d.ids.len()).or_default().push(i);
    }
    let mut out: Vec<Vec<Completion>> = (0..draws.len()).map(|_| Vec::new()).collect();
    for members in by_length.values() {
        let bucket: Vec<&PromptDraw<'_>> = members.iter().map(|&i| &draws[i]).collect();
        let mut sampled = sample_bucket(ctx, &bucket, cancelled)?.into_iter();
        for (&i, d) in members.iter().zip(&bucket) {
            out[i] = sampled.by_ref().take(d.seeds.len()).collect();
        }
    }
    Ok(out.into_iter().flatten().collect())
}

/// Prompts of one length: each prefilled once, its cache copied to its completions, then all decoded as one batch.
fn sample_bucket(
    ctx: &SamplingContext<'_>,
    bucket: &[&PromptDraw<'_>],
    cancelled: &dyn Fn() -> bool,
) -> Result<Vec<Completion>> {
    let s = ctx.settings;
    let model = ctx.model;
    let context = model.config.max_position_embeddings;
    let prompt_len = bucket.first().map_or(0, |d| d.ids.len());
    if prompt_len == 0 {
        return Err(Error::Data(format!("prompt {} has no tokens", bucket.first().map_or(0, |d| d.prompt))));
    }
    if prompt_len + s.max_new_tokens > context {
        return Err(Error::PromptTooLong { prompt_tokens: prompt_len + s.max_new_tokens, context_len: context });
    }
    let params = |seed| SamplingParams {
        temperature: s.temperature,
        top_p: s.top_p,
        top_k: s.top_k,
        repetition_penalty: 1.0,
        seed,
    };
    let device = model.device();
    let mut caches = Vec::with_capacity(bucket.len());
    let mut first_logits = Vec::with_capacity(bucket.len());
    for d in bucket {
        let mut cache = KvCache::new(model.config.num_layers);
        let input = Tensor::from_vec(d.ids.to_vec(), (1, prompt_len), device)?;
        first_logits.push(model.forward_last(&input, 0, Some(&mut cache))?.repeat((d.seeds.len(), 1))?);
        cache.repeat_batch(d.seeds.len())?;
        caches.push(cache);
    }
    let mut cache = KvCache::concat_batch(caches)?;
    let mut logits = Tensor::cat(&first_logits, 0)?;
    let seeds: Vec<u64> = bucket.iter().flat_map(|d| d.seeds.iter().copied()).collect();
    let n = seeds.len();
    let mut rows: Vec<Row> = seeds
        .iter()
        .map(|&seed| Row { sampler: Sampler::new(params(seed)), ids: Vec::new(), finished: false })
        .collect();
    let filler = ctx.eos_token_ids.first().copied().unwrap_or(0);
    for step in 0..s.max_new_tokens {
        if cancelled() {
            return Err(Error::Cancelled);
        }
        let values = logits.to_vec2::<f32>()?;
        draw_rows(&mut rows, values, ctx.eos_token_ids);
        if rows.iter().all(|r| r.finished) || step + 1 == s.max_new_tokens {
            break;
        }
        let next: Vec<u32> =
            rows.iter().map(|r| if r.finished && r.ids.len() <= step { filler } else { r.ids[step] }).collect();
        let input = Tensor::from_vec(next, (n, 1), device)?;
        logits = model.forward_last(&input, prompt_len + step, Some(&mut cache))?;
    }
    drop(cache);
    let prompts = bucket.iter().flat_map(|d| std::iter::repeat_n((d.prompt, d.ids), d.seeds.len()));
    rows.into_iter()
        .zip(prompts)
        .map(|(row, (prompt, ids))| {
            let body = if row.finished { &row.ids[..row.ids.len() - 1] } else { &row.ids[..] };
            let text = ctx.tokenizer.decode(body, true)?;
            Ok(Completion { prompt, prompt_ids: ids.to_vec(), ids: row.ids, finished: row.finished, text })
        })
        .collect()
}

/// One sequence being decoded.
struct Row {
    sampler: Sampler,
    ids: Vec<u32>,
    finished: bool,
}

/// Draw the next token of every unfinished row from its logits, rows spread over the CPU's cores: a draw walks
/// the whole vocabulary (a 128k row is a fraction of a millisecond), and a batch has tens of rows.
fn draw_rows(rows: &mut [Row], mut values: Vec<Vec<f32>>, eos: &[u32]) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(rows.len()).max(1);
    let per = rows.len().div_ceil(threads);
    std::thread::scope(|scope| {
        for (rows, values) in rows.chunks_mut(per).zip(values.chunks_mut(per)) {
            scope.spawn(move || {
                for (row, logits) in rows.iter_mut().zip(values.iter_mut()) {
                    if row.finished {
                        continue;
                    }
                    let id = row.sampler.sample(logits, &row.ids);
                    row.ids.push(id);
                    row.finished = eos.contains(&id);
                }
            });
        }
    });
}
