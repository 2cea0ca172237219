//! `info`, `generate` and `score`: the inference subcommands.

use super::ModelArgs;
use crate::engine::data::chat_prompt;
use crate::engine::device::device_name;
use crate::engine::generate::{self, GenerateRequest};
use crate::engine::model::chat_template::ChatMessage;
use crate::engine::sampler::SamplingParams;
use clap::Args;
use std::io::Write;

#[derive(Debug, Args)]
pub struct InfoArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn info(args: &InfoArgs) -> anyhow::Result<()> {
    let m = args.model.load()?;
    let c = &m.config;
    let report = serde_json::json!({
        "path": m.source.path(),
        "format": m.source.format_name(),
        "architecture": c.architecture.as_str(),
        "parameters": c.parameter_count(),
        "layers": c.num_layers,
        "hidden_size": c.hidden_size,
        "attention_heads": c.num_attention_heads,
        "kv_heads": c.num_kv_heads,
        "vocab_size": c.vocab_size,
        "context_length": c.max_position_embeddings,
        "tied_embeddings": c.tie_word_embeddings,
        "dtype": format!("{:?}", m.model.dtype()).to_lowercase(),
        "weights_dtype": c.weights_dtype,
        "base_weights": m.model.base_storage(),
        "base_weights_bytes": m.model.base_weights_bytes(),
        "device": device_name(m.model.device()),
        "chat_template": m.chat_template.is_some(),
        "eos_token_ids": m.eos_token_ids,
        "notes": m.notes,
        "lora_targets": c.linear_modules(),
    });
    if args.json {
        println!("{report}");
        return Ok(());
    }
    println!("model          {}", m.source.path().display());
    println!("format         {}", m.source.format_name());
    println!("architecture   {}", c.architecture.as_str());
    println!("parameters     {} ({:.1} M)", c.parameter_count(), c.parameter_count() as f64 / 1e6);
    println!("layers         {}", c.num_layers);
    println!("hidden size    {} ({} heads, {} kv heads)", c.hidden_size, c.num_attention_heads, c.num_kv_heads);
    println!("vocabulary     {}", c.vocab_size);
    println!("context        {} tokens", c.max_position_embeddings);
    println!("dtype          {}", report["dtype"].as_str().unwrap_or("?"));
    println!(
        "base weights   {} ({:.1} MiB)",
        m.model.base_storage(),
        m.model.base_weights_bytes() as f64 / (1u64 << 20) as f64
    );
    println!("device         {}", device_name(m.model.device()));
    println!("chat template  {}", if m.chat_template.is_some() { "found" } else { "none" });
    println!("eos ids        {:?}", m.eos_token_ids);
    println!("lora targets   {} (all-linear)", c.linear_modules().join(", "));
    for note in &m.notes {
        println!("note           {note}");
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long)]
    pub prompt: String,
    /// Wrap the prompt in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// System prompt (needs --chat).
    #[arg(long)]
    pub system: Option<String>,
    #[arg(long, default_value_t = 256, allow_negative_numbers = true)]
    pub max_tokens: usize,
    /// 0 means greedy (0 to 100).
    #[arg(long, default_value_t = 0.7, allow_negative_numbers = true)]
    pub temperature: f64,
    #[command(flatten)]
    pub cut: super::SamplingCutArgs,
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub repetition_penalty: f32,
    #[arg(long, default_value_t = 42, allow_negative_numbers = true)]
    pub seed: u64,
    /// Keep going past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Stop when this text appears (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Print one JSON object with prompt_ids, generated_ids and text.
    #[arg(long)]
    pub json: bool,
}

pub fn generate(args: &GenerateArgs) -> anyhow::Result<()> {
    let rest = SamplingParams { repetition_penalty: args.repetition_penalty, seed: args.seed, ..Default::default() };
    let sampling = args.cut.params(args.temperature, rest);
    // The engine's one sampling check, before the model loads (the chat pane runs the same).
    sampling.validate(args.max_tokens)?;
    if args.system.is_some() && !args.chat {
        anyhow::bail!(
            "--system is the system prompt of a chat, and without --chat the prompt is plain text with no system turn; \
             add --chat (the prompt is then written in the model's chat template), or drop --system"
        );
    }
    let m = args.model.load()?;
    let prompt_ids = if args.chat {
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::new("system", system.clone()));
        }
        messages.push(ChatMessage::new("user", args.prompt.clone()));
        let prompt = chat_prompt(&m, &messages)?;
        if let Some(warning) = &prompt.warning {
            eprintln!("warning: {warning}");
        }
        prompt.ids
    } else {
        m.encode_prompt(&args.prompt, true)?
    };
    let req = GenerateRequest {
        prompt_ids,
        max_new_tokens: args.max_tokens,
        sampling,
        eos_token_ids: m.eos_token_ids.clone(),
        ignore_eos: args.ignore_eos,
        stop_strings: args.stop.clone(),
    };
    let json = args.json;
    let mut stdout = std::io::stdout();
    let out = generate::generate(&m.model, &m.tokenizer, &req, &mut |piece| {
        if !json {
            print!("{piece}");
            let _ = stdout.flush();
        }
        true
    })?;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "prompt_ids": out.prompt_ids,
                "generated_ids": out.generated_ids,
                "text": out.text,
                "stop_reason": out.stop_reason,
                "prefill_tokens_per_sec": out.prefill_tokens_per_sec(),
                "decode_tokens_per_sec": out.decode_tokens_per_sec(),
                "graph_replays": out.graph_replays,
            })
        );
    } else {
        println!();
        eprintln!(
            "[{} prompt tokens, {} generated, {:.1} tok/s decode, stop: {}]",
            out.prompt_ids.len(),
            out.generated_ids.len(),
            out.decode_tokens_per_sec(),
            out.stop_reason.as_str()
        );
    }
    if let Some(why) = &out.graph_fallback {
        eprintln!("note: decoding went on without a CUDA graph: {why}");
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct ScoreArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long)]
    pub text: String,
    #[arg(long)]
    pub json: bool,
}

pub fn score(args: &ScoreArgs) -> anyhow::Result<()> {
    let m = args.model.load()?;
    let ids = m.encode_prompt(&args.text, true)?;
    let logprobs = generate::score(&m.model, &ids)?;
    let nll_mean = -logprobs.iter().map(|&x| x as f64).sum::<f64>() / logprobs.len() as f64;
    if args.json {
        println!("{}", serde_json::json!({ "ids": ids, "token_logprobs": logprobs, "nll_mean": nll_mean }));
        return Ok(());
    }
    println!("{} tokens, mean NLL {:.4} nats, perplexity {:.2}", ids.len(), nll_mean, nll_mean.exp());
    for (i, lp) in logprobs.iter().enumerate() {
        let token = m.tokenizer.decode(&ids[i + 1..i + 2], false)?;
        println!("{:>5}  {:>9.4}  {:?}", i + 1, lp, token);
    }
    Ok(())
}
