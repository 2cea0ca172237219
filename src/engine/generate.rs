//! Generation: a streaming loop over the model's KV cache ([`KvCache`], model/kv_cache.rs) with eos ids, stop
//! strings and cancellation.

use crate::engine::model::decode_graph::DecodeSteps;
pub use crate::engine::model::kv_cache::{KvCache, LayerCache};
use crate::engine::model::tokenizer::{StreamDecoder, TextTokenizer};
use crate::engine::model::transformer::Transformer;
use crate::engine::sampler::{Sampler, SamplingParams};
use crate::engine::{Error, Result};
use candle_core::Tensor;
use std::time::Instant;

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt_ids: Vec<u32>,
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    pub eos_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub stop_strings: Vec<String>,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Eos,
    MaxTokens,
    StopString,
    ContextFull,
    Cancelled,
}

impl StopReason {
    /// The one name of each reason, as JSON writes it: "eos", "max_tokens", "stop_string", "context_full",
    /// "cancelled".
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Eos => "eos",
            Self::MaxTokens => "max_tokens",
            Self::StopString => "stop_string",
            Self::ContextFull => "context_full",
            Self::Cancelled => "cancelled",
        }
    }
}

/// The result of a generation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GenerationOutput {
    pub prompt_ids: Vec<u32>,
    pub generated_ids: Vec<u32>,
    pub text: String,
    pub stop_reason: StopReason,
    pub prefill_secs: f64,
    pub decode_secs: f64,
    /// Tokens decoded by replaying a captured CUDA graph (model/decode_graph.rs); 0 elsewhere.
    pub graph_replays: usize,
    /// Why decoding stopped using a CUDA graph, when its capture failed (it went on without one).
    pub graph_fallback: Option<String>,
}

impl GenerationOutput {
    pub fn prefill_tokens_per_sec(&self) -> f64 {
        self.prompt_ids.len() as f64 / self.prefill_secs.max(1e-9)
    }

    /// Tokens after the first, over the time after the first (the first comes from the prefill).
    pub fn decode_tokens_per_sec(&self) -> f64 {
        self.generated_ids.len().saturating_sub(1) as f64 / self.decode_secs.max(1e-9)
    }
}

/// Generate from `req.prompt_ids`, calling `on_text` with each completed piece of text. `on_text` returns
/// false to cancel.
pub fn generate(
    model: &Transformer,
    tokenizer: &TextTokenizer,
    req: &GenerateRequest,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<GenerationOutput> {
    let context = model.config.max_position_embeddings;
    check_request(req, context)?;
    let mut cache = KvCache::new(model.config.num_layers);
    let mut steps = DecodeSteps::for_generation(model, (req.prompt_ids.len() + req.max_new_tokens).min(context));
    let mut sampler = Sampler::new(req.sampling.clone());
    let mut decoder = StreamDecoder::new(tokenizer);
    let mut stops = StopStringFilter::new(&req.stop_strings);
    let mut all_ids = req.prompt_ids.clone();
    let mut generated = Vec::new();
    let mut stop_reason = StopReason::MaxTokens;

    let started = Instant::now();
    let mut logits = steps.next_logits(model, &req.prompt_ids, &mut cache)?;
    let mut prefill_secs = 0.0;
    let mut decode_started = Instant::now();

    while generated.len() < req.max_new_tokens {
        let next = sampler.sample_tensor(&logits, &all_ids)?;
        if generated.is_empty() {
            prefill_secs = started.elapsed().as_secs_f64();
            decode_started = Instant::now();
        }
        if !req.ignore_eos && req.eos_token_ids.contains(&next) {
            generated.push(next);
            stop_reason = StopReason::Eos;
            break;
        }
        generated.push(next);
        all_ids.push(next);
        if let Some(piece) = decoder.push(next)? {
            let (emit, hit) = stops.push(&piece);
            if !emit.is_empty() && !on_text(&emit) {
                stop_reason = StopReason::Cancelled;
                break;
            }
            if hit {
                stop_reason = StopReason::StopString;
                break;
            }
        }
        if generated.len() >= req.max_new_tokens {
            break;
        }
        if all_ids.len() >= context {
            stop_reason = StopReason::ContextFull;
            break;
        }
        logits = steps.next_logits(model, &all_ids, &mut cache)?;
    }
    if stop_reason != StopReason::StopString && stop_reason != StopReason::Cancelled {
        let mut tail = decoder.finish()?.map(|p| stops.push(&p).0).unwrap_or_default();
        tail.push_str(&stops.flush());
        if !tail.is_empty() {
            on_text(&tail);
        }
    }
    let decode_secs = decode_started.elapsed().as_secs_f64();
    Ok(GenerationOutput {
        prompt_ids: req.prompt_ids.clone(),
        generated_ids: generated,
        text: stops.text,
        stop_reason,
        prefill_secs,
        decode_secs,
        graph_replays: steps.replays(),
        graph_fallback: steps.fallback().map(str::to_string),
    })
}

/// Refuse sampling settings out of range, an empty prompt and one that leaves no room in a `context`-token
/// window, before any work.
fn check_request(req: &GenerateRequest, context: usize) -> Result<()> {
    req.sampling.validate(req.max_new_tokens)?;
    if req.prompt_ids.is_empty() {
        return Err(Error::InvalidSetting("the prompt is empty".into()));
    }
    if req.prompt_ids.len() >= context {
        return Err(Error::PromptTooLong { prompt_tokens: req.prompt_ids.len(), context_len: context });
    }
    Ok(())
}

/// Log-probabilities of each next token: `out[i] = log p(ids[i+1] | ids[..=i])`.
pub fn score(model: &Transformer, ids: &[u32]) -> Result<Vec<f32>> {
    if ids.len() < 2 {
        return Err(Error::InvalidSetting("scoring needs at least two tokens".into()));
    }
    let context = model.config.max_position_embeddings;
    if ids.len() > context {
        return Err(Error::PromptTooLong { prompt_tokens: ids.len(), context_len: context });
    }
    let input = Tensor::new(ids, model.device())?.unsqueeze(0)?;
    // The head runs over chunks of positions: no (tokens x vocab) logits tensor.
    let hidden = model.forward_hidden(&input, 0, None)?.squeeze(0)?.narrow(0, 0, ids.len() - 1)?;
    let nll = model.head_token_nll(&hidden, &ids[1..])?;
    Ok(nll.into_iter().map(|v| -v as f32).collect())
}

/// Holds back text that might be the start of a stop string, and cuts the output at the first stop string.
struct StopStringFilter<'a> {
    stops: &'a [String],
    text: String,
    emitted: usize,
}

impl<'a> StopStringFilter<'a> {
    fn new(stops: &'a [String]) -> Self {
        Self { stops, text: String::new(), emitted: 0 }
    }

    /// Add a piece; returns (text safe to emit now, whether a stop string was hit).
    fn push(&mut self, piece: &str) -> (String, bool) {
        let search_from = self.emitted;
        self.text.push_str(piece);
        let hit = self
            .stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| self.text[search_from..].find(s.as_str()).map(|i| search_from + i))
            .min();
        if let Some(at) = hit {
            self.text.truncate(at);
            let out = self.text[self.emitted..].to_string();
            self.emitted = self.text.len();
            return (out, true);
        }
        let held = self.longest_partial_stop();
        let safe = self.text.len() - held;
        let out = self.text[self.emitted..safe.max(self.emitted)].to_string();
        self.emitted = safe.max(self.emitted);
        (out, false)
    }

    /// Length of the longest suffix of the text that is a proper prefix of a stop string.
    fn longest_partial_stop(&self) -> usize {
        let mut best = 0;
        for stop in self.stops {
            for (len, _) in stop.char_indices().skip(1) {
                if len > best && self.text.ends_with(&stop[..len]) {
                    best = len;
                }
            }
        }
        best
    }

    fn flush(&mut self) -> String {
        let out = self.text[self.emitted..].to_string();
        self.emitted = self.text.len();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_cut_output_and_hold_back_partial_matches() {
        let stops = vec!["</s>".to_string()];
        let mut f = StopStringFilter::new(&stops);
        assert_eq!(f.push("hello <"), ("hello ".to_string(), false));
        assert_eq!(f.push("/"), (String::new(), false));
        assert_eq!(f.push("s> more"), (String::new(), true));
        assert_eq!(f.text, "hello ");
    }

    #[test]
    fn kv_cache_appends_in_place() {
        let dev = candle_core::Device::Cpu;
        let mut c = LayerCache::default();
        let a = Tensor::ones((1, 2, 3, 4), candle_core::DType::F32, &dev).unwrap();
        let b = (Tensor::ones((1, 2, 70, 4), candle_core::DType::F32, &dev).unwrap() * 2.0).unwrap();
        c.append(&a, &a).unwrap();
        let (k, _) = c.append(&b, &b).unwrap();
        assert_eq!(k.dims(), &[1, 2, 73, 4]);
        let sum: f32 = k.sum_all().unwrap().to_scalar().unwrap();
        assert_eq!(sum, (2 * 3 * 4) as f32 + (2 * 70 * 4 * 2) as f32);
    }
}
