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

/// Sample `seeds.len()` completions of prompt `prompt` (its ids `prompt_ids`), one per seed. `cancelled` is
/// polled between tokens.
pub fn sample_group(
    ctx: &SamplingContext<'_>,
    prompt: usize,
    prompt_ids: &[u32],
    seeds: &[u64],
    cancelled: &dyn Fn() -> bool,
) -> Result<Vec<Completion>> {
    let s = ctx.settings;
    let model = ctx.model;
    let g = seeds.len();
    let context = model.config.max_position_embeddings;
    if prompt_ids.is_empty() {
        return Err(Error::Data(format!("prompt {prompt} has no tokens")));
    }
    if prompt_ids.len() + s.max_new_tokens > context {
        return Err(Error::PromptTooLong { prompt_tokens: prompt_ids.len() + s.max_new_tokens, context_len: context });
    }
    let params = |seed| SamplingParams {
        temperature: s.temperature,
        top_p: s.top_p,
        top_k: s.top_k,
        repetition_penalty: 1.0,
        seed,
    };
    let mut samplers: Vec<Sampler> = seeds.iter().map(|&seed| Sampler::new(params(seed))).collect();
    let mut ids: Vec<Vec<u32>> = vec![Vec::new(); g];
    let mut finished = vec![false; g];
    let filler = ctx.eos_token_ids.first().copied().unwrap_or(0);
    let device = model.device();
    let mut cache = KvCache::new(model.config.num_layers);
    // The prompt runs once; its cache and last logits are copied to every sequence of the group.
    let input = Tensor::from_vec(prompt_ids.to_vec(), (1, prompt_ids.len()), device)?;
    let mut logits = model.forward_last(&input, 0, Some(&mut cache))?.repeat((g, 1))?;
    cache.repeat_batch(g)?;
    for step in 0..s.max_new_tokens {
        if cancelled() {
            return Err(Error::Cancelled);
        }
        let mut rows = logits.to_vec2::<f32>()?;
        let mut next = Vec::with_capacity(g);
        for (i, row) in rows.iter_mut().enumerate() {
            if finished[i] {
                next.push(filler);
                continue;
            }
            let id = samplers[i].sample(row, &ids[i]);
            ids[i].push(id);
            finished[i] = ctx.eos_token_ids.contains(&id);
            next.push(id);
        }
        if finished.iter().all(|&f| f) || step + 1 == s.max_new_tokens {
            break;
        }
        let input = Tensor::from_vec(next, (g, 1), device)?;
        logits = model.forward_last(&input, prompt_ids.len() + step, Some(&mut cache))?;
    }
    drop(cache);
    ids.into_iter()
        .zip(finished)
        .map(|(ids, finished)| {
            let body = if finished { &ids[..ids.len() - 1] } else { &ids[..] };
            let text = ctx.tokenizer.decode(body, true)?;
            Ok(Completion { prompt, prompt_ids: prompt_ids.to_vec(), ids, finished, text })
        })
        .collect()
}
