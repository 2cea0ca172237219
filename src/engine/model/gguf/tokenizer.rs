//! Rebuilding a `tokenizers::Tokenizer` from GGUF metadata (`tokenizer.ggml.*`): byte-level BPE (`gpt2`) with
//! the pre-tokenizer split named by `tokenizer.ggml.pre`, or SentencePiece-style BPE (`llama`), plus the special
//! tokens and the BOS/EOS post-processor the file declares.

use super::Metadata;
use crate::engine::{Error, Result};
use std::collections::{HashMap, HashSet};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::prepend::Prepend;
use tokenizers::normalizers::replace::Replace;
use tokenizers::normalizers::utils::Sequence as NormalizerSequence;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer,
};

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
pub(crate) const TOKEN_TYPE_NORMAL: i64 = 1;
pub(crate) const TOKEN_TYPE_CONTROL: i64 = 3;
pub(crate) const TOKEN_TYPE_USER_DEFINED: i64 = 4;
pub(crate) const TOKEN_TYPE_UNUSED: i64 = 5;

/// The tokenizer as the `tokenizer.ggml.*` metadata describes it.
pub(super) struct GgufVocab {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` (SentencePiece BPE).
    pub(super) model: String,
    /// `tokenizer.ggml.pre`: which pre-tokenizer split the merges were learned with.
    pub(super) pre: Option<String>,
    pub(super) tokens: Vec<String>,
    pub(super) token_types: Vec<i64>,
    pub(super) scores: Vec<f32>,
    pub(super) merges: Option<Vec<String>>,
    pub(super) bos_id: Option<u32>,
    pub(super) eos_id: Option<u32>,
    pub(super) unk_id: Option<u32>,
    pub(super) add_bos: bool,
    pub(super) add_eos: bool,
    pub(super) add_space_prefix: bool,
}

impl GgufVocab {
    pub(super) fn from_metadata(meta: &Metadata) -> Result<Self> {
        let model = meta.string("tokenizer.ggml.model")?.unwrap_or("(none)").to_string();
        let tokens = meta.strings("tokenizer.ggml.tokens")?.unwrap_or_default();
        if tokens.is_empty() {
            return Err(meta.bad("tokenizer.ggml.tokens", "missing or empty: this GGUF carries no tokenizer"));
        }
        let check_id = |key: &str| -> Result<Option<u32>> {
            match meta.token_id(key)? {
                Some(id) if id as usize >= tokens.len() => {
                    Err(meta.bad(key, format!("id {id} is outside the {}-token vocabulary", tokens.len())))
                }
                id => Ok(id),
            }
        };
        Ok(Self {
            // llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise; transformers agrees.
            add_bos: meta.bool("tokenizer.ggml.add_bos_token")?.unwrap_or(model == "llama"),
            add_eos: meta.bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false),
            add_space_prefix: meta.bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(true),
            pre: meta.string("tokenizer.ggml.pre")?.map(str::to_owned),
            token_types: meta.ints("tokenizer.ggml.token_type")?.unwrap_or_default(),
            scores: meta.floats("tokenizer.ggml.scores")?.unwrap_or_default(),
            merges: meta.strings("tokenizer.ggml.merges")?,
            bos_id: check_id("tokenizer.ggml.bos_token_id")?,
            eos_id: check_id("tokenizer.ggml.eos_token_id")?,
            unk_id: check_id("tokenizer.ggml.unknown_token_id")?,
            model,
            tokens,
        })
    }

    fn token(&self, id: Option<u32>) -> Option<&str> {
        id.and_then(|i| self.tokens.get(i as usize)).map(String::as_str)
    }

    /// Tokens of one llama.cpp type, in id order.
    fn tokens_of_type(&self, token_type: i64) -> impl Iterator<Item = &str> {
        self.tokens.iter().zip(&self.token_types).filter(move |(_, t)| **t == token_type).map(|(s, _)| s.as_str())
    }

    /// The merges from the file, split into pairs.
    fn merge_pairs(&self) -> Result<Option<Vec<(String, String)>>> {
        let Some(merges) = &self.merges else { return Ok(None) };
        let pairs = merges.iter().map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| Error::Tokenizer(format!("GGUF merge `{m}` is not two tokens separated by a space")))
        });
        pairs.collect::<Result<Vec<_>>>().map(Some)
    }
}

pub(super) fn tok_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(format!("cannot rebuild the tokenizer from GGUF metadata: {e}"))
}

/// Rebuild the tokenizer as transformers' GGUF loader does: model and pre-tokenizer from
/// `tokenizer.ggml.model`/`pre`, control tokens as special added tokens, user-defined ones as plain added
/// tokens, and BOS/EOS added only where the file asks for it.
pub(super) fn build_tokenizer(vocab: &GgufVocab) -> Result<Tokenizer> {
    let mut tokenizer = match vocab.model.as_str() {
        "gpt2" => byte_level_tokenizer(vocab)?,
        "llama" => sentencepiece_tokenizer(vocab)?,
        other => {
            return Err(Error::Tokenizer(format!(
                "GGUF tokenizer model `{other}` is not supported; supported: gpt2 (byte-level BPE), llama (SentencePiece BPE)"
            )))
        }
    };
    add_gguf_special_tokens(&mut tokenizer, vocab)?;
    tokenizer.with_post_processor(post_processor(vocab)?);
    Ok(tokenizer)
}

/// Byte-level BPE (GPT-2 style). Tokens are stored in the byte-to-unicode alphabet; any that are not
/// (a mislabelled raw string) are respelled into it, as transformers does.
pub(super) fn byte_level_tokenizer(vocab: &GgufVocab) -> Result<Tokenizer> {
    let alphabet = ByteLevel::alphabet();
    let spelling = bytes_to_unicode();
    let respell = |t: &str| -> String {
        if t.chars().all(|c| alphabet.contains(&c)) {
            t.to_string()
        } else {
            t.bytes().map(|b| spelling[b as usize]).collect()
        }
    };
    let bpe_vocab: Vocab = vocab.tokens.iter().enumerate().map(|(i, t)| (respell(t), i as u32)).collect();
    let merges = vocab
        .merge_pairs()?
        .ok_or_else(|| tok_err("a gpt2 (byte-level BPE) vocabulary needs tokenizer.ggml.merges"))?;
    let bpe = BPE::builder().vocab_and_merges(bpe_vocab, merges).build().map_err(tok_err)?;
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(byte_level_pre_tokenizer(vocab.pre.as_deref())?));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    Ok(tokenizer)
}

pub(super) const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub(super) const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub(super) const TEKKEN_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub(super) const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The split regex for a `tokenizer.ggml.pre` value (the table of transformers' GGUF loader).
pub(super) fn split_regex(pre: &str) -> Option<&'static str> {
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" | "dbrx"
        | "smaug-bpe" | "jina-v5-nano" => LLAMA3_SPLIT,
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" => QWEN2_SPLIT,
        "tekken" => TEKKEN_SPLIT,
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => GPT4O_SPLIT,
        _ => return None,
    })
}

/// The `tokenizer.ggml.pre` name for a `tokenizer.json` pre-tokenizer (its JSON), the inverse of
/// [`byte_level_pre_tokenizer`]: GPT-2's split alone is `gpt-2`, digits then GPT-2 is `smollm`, and a regex
/// split followed by bytes is the first name of the table above whose regex it is. `None`: llama.cpp has no
/// equivalent we know of.
pub(crate) fn pre_tokenizer_name(pre: &serde_json::Value) -> Option<&'static str> {
    let kind = |v: &serde_json::Value| v.get("type").and_then(|t| t.as_str()).map(str::to_owned);
    let is_gpt2_byte_level = |v: &serde_json::Value| {
        kind(v).as_deref() == Some("ByteLevel")
            && v.get("use_regex").and_then(|b| b.as_bool()).unwrap_or(true)
            && !v.get("add_prefix_space").and_then(|b| b.as_bool()).unwrap_or(false)
    };
    if is_gpt2_byte_level(pre) {
        return Some("gpt-2");
    }
    let steps = pre.get("pretokenizers").and_then(|p| p.as_array())?;
    match steps.as_slice() {
        [digits, bytes] if kind(digits).as_deref() == Some("Digits") && is_gpt2_byte_level(bytes) => {
            digits.get("individual_digits").and_then(|b| b.as_bool()).filter(|b| *b).map(|_| "smollm")
        }
        [split, bytes] if kind(split).as_deref() == Some("Split") && kind(bytes).as_deref() == Some("ByteLevel") => {
            let regex = split.get("pattern").and_then(|p| p.get("Regex")).and_then(|r| r.as_str())?;
            ["llama-bpe", "qwen2", "tekken", "gpt-4o"].into_iter().find(|name| split_regex(name) == Some(regex))
        }
        _ => None,
    }
}

/// The byte-level pre-tokenizer for `tokenizer.ggml.pre`. Known model-specific splits come first; `smollm`
/// isolates every digit (llama.cpp's rule and the original tokenizer.json's `Digits`); anything else gets
/// GPT-2's split, which is also transformers' fallback.
pub(super) fn byte_level_pre_tokenizer(pre: Option<&str>) -> Result<PreTokenizerWrapper> {
    let gpt2 = ByteLevel::new(false, true, true);
    if pre == Some("smollm") {
        return Ok(PreTokenizerSequence::new(vec![Digits::new(true).into(), gpt2.into()]).into());
    }
    let Some(regex) = pre.and_then(split_regex) else {
        return Ok(gpt2.into());
    };
    let split =
        Split::new(SplitPattern::Regex(regex.into()), SplitDelimiterBehavior::Isolated, false).map_err(tok_err)?;
    let bytes_only = ByteLevel::new(false, true, false);
    Ok(PreTokenizerSequence::new(vec![split.into(), bytes_only.into()]).into())
}

/// SentencePiece-style BPE (`tokenizer.ggml.model == "llama"`), as llama.cpp's SPM tokenizer: byte fallback
/// (`<0xXX>` tokens), every space written `▁`, and, when `tokenizer.ggml.add_space_prefix` (default true), one
/// `▁` put before every stretch of text between special tokens, even one that starts with a space (llama.cpp
/// prefixes the text and each piece after a special token; sentencepiece's `add_dummy_prefix` the same).
/// A normalizer does exactly that, as it runs on each piece between added tokens; a `Metaspace` pre-tokenizer
/// would not (it skips a piece that already starts with `▁`). Merges come from the file or are recovered from
/// the scores: llama.cpp merges the adjacent pair whose merged token scores best, and ranking the merges by
/// that score gives the same order.
pub(super) fn sentencepiece_tokenizer(vocab: &GgufVocab) -> Result<Tokenizer> {
    let bpe_vocab: Vocab = vocab.tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let merges = match vocab.merge_pairs()? {
        Some(merges) => merges,
        None if vocab.scores.len() == vocab.tokens.len() => generate_merges(&vocab.tokens, &vocab.scores),
        None => {
            return Err(tok_err(
                "a llama (SentencePiece) vocabulary needs tokenizer.ggml.merges or tokenizer.ggml.scores",
            ))
        }
    };
    let mut builder = BPE::builder().vocab_and_merges(bpe_vocab, merges).fuse_unk(true).byte_fallback(true);
    if let Some(unk) = vocab.token(vocab.unk_id) {
        builder = builder.unk_token(unk.to_string());
    }
    let mut tokenizer = Tokenizer::new(builder.build().map_err(tok_err)?);
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if vocab.add_space_prefix {
        normalizers.push(Prepend::new("▁".into()).into());
    }
    normalizers.push(Replace::new(" ", "▁").map_err(tok_err)?.into());
    tokenizer.with_normalizer(Some(NormalizerSequence::new(normalizers))).map_err(tok_err)?;
    let mut decoders: Vec<DecoderWrapper> =
        vec![Replace::new("▁", " ").map_err(tok_err)?.into(), ByteFallback::new().into(), Fuse::new().into()];
    if vocab.add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

/// Merges implied by a vocabulary with scores (transformers' `generate_merges`): every split of a token into
/// two tokens of the vocabulary, best token score first, ties broken by piece lengths, then by id order.
pub(super) fn generate_merges(tokens: &[String], scores: &[f32]) -> Vec<(String, String)> {
    let ids: HashMap<&str, usize> = tokens.iter().enumerate().map(|(i, t)| (t.as_str(), i)).collect();
    let mut seen = HashSet::new();
    let mut merges: Vec<(&str, &str, f32)> = Vec::new();
    for (token, &score) in tokens.iter().zip(scores) {
        if !seen.insert(token.as_str()) {
            continue;
        }
        let mut local: Vec<(&str, &str, f32)> = token
            .char_indices()
            .skip(1)
            .map(|(at, _)| token.split_at(at))
            .filter(|(l, r)| ids.contains_key(l) && ids.contains_key(r))
            .map(|(l, r)| (l, r, score))
            .collect();
        local.sort_by_key(|(l, r, _)| (ids[l], ids[r]));
        merges.extend(local);
    }
    // A stable sort on the reversed comparison keeps equal keys in their original order, like Python's
    // `sorted(..., reverse=True)`.
    let key = |m: &(&str, &str, f32)| (m.2, m.0.chars().count(), m.1.chars().count());
    merges.sort_by(|a, b| key(b).partial_cmp(&key(a)).unwrap_or(std::cmp::Ordering::Equal));
    merges.into_iter().map(|(l, r, _)| (l.to_string(), r.to_string())).collect()
}

/// Control tokens become special added tokens and user-defined ones plain added tokens, so both stay whole.
/// In a byte-level vocabulary a control token spelled outside the byte alphabet is a llama.cpp mislabel and is
/// skipped, as transformers does.
pub(super) fn add_gguf_special_tokens(tokenizer: &mut Tokenizer, vocab: &GgufVocab) -> Result<()> {
    let alphabet = ByteLevel::alphabet();
    let byte_level = vocab.model == "gpt2";
    let control: Vec<AddedToken> = vocab
        .tokens_of_type(TOKEN_TYPE_CONTROL)
        .filter(|t| !byte_level || t.chars().all(|c| alphabet.contains(&c)))
        .map(|t| AddedToken::from(t, true).normalized(false))
        .collect();
    tokenizer.add_special_tokens(control).map_err(tok_err)?;
    let model_vocab = tokenizer.get_vocab(false);
    let user_defined: Vec<AddedToken> = vocab
        .tokens_of_type(TOKEN_TYPE_USER_DEFINED)
        .filter(|t| model_vocab.contains_key(*t))
        .map(|t| AddedToken::from(t, false).normalized(false))
        .collect();
    tokenizer.add_tokens(user_defined).map_err(tok_err)?;
    Ok(())
}

/// BOS/EOS around each sequence where `tokenizer.ggml.add_bos_token`/`add_eos_token` ask for them.
pub(super) fn post_processor(vocab: &GgufVocab) -> Result<Option<TemplateProcessing>> {
    let bos = vocab.token(vocab.bos_id).zip(vocab.bos_id).filter(|_| vocab.add_bos);
    let eos = vocab.token(vocab.eos_id).zip(vocab.eos_id).filter(|_| vocab.add_eos);
    if bos.is_none() && eos.is_none() {
        return Ok(None);
    }
    let wrap = |body: &str, type_id: u32| {
        let mut pieces = Vec::new();
        pieces.extend(bos.map(|(t, _)| format!("{t}:{type_id}")));
        pieces.push(format!("{body}:{type_id}"));
        pieces.extend(eos.map(|(t, _)| format!("{t}:{type_id}")));
        pieces.join(" ")
    };
    let special: Vec<(String, u32)> = bos.into_iter().chain(eos).map(|(t, id)| (t.to_string(), id)).collect();
    TemplateProcessing::builder()
        .try_single(wrap("$A", 0))
        .and_then(|b| b.try_pair(format!("{} {}", wrap("$A", 0), wrap("$B", 1))))
        .map_err(tok_err)?
        .special_tokens(special)
        .build()
        .map(Some)
        .map_err(tok_err)
}

/// GPT-2's reversible map from bytes to printable characters.
pub(super) fn bytes_to_unicode() -> [char; 256] {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    let mut map = ['\0'; 256];
    let mut next_unprintable = 256u32;
    for b in 0..256u32 {
        let code = if printable(b) {
            b
        } else {
            next_unprintable += 1;
            next_unprintable - 1
        };
        map[b as usize] = char::from_u32(code).unwrap_or('\u{fffd}');
    }
    map
}
