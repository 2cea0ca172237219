//! The tokenizer: a thin wrapper over `tokenizers::Tokenizer` that keeps the special-token strings the chat
//! template needs, plus [`StreamDecoder`] for incremental detokenization that never splits a character.

use crate::engine::{Error, Result};
use std::path::{Path, PathBuf};

/// A loaded tokenizer with the special tokens a chat template refers to.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    /// The model's embedding rows and the file the tokenizer came from, once paired with a model
    /// ([`Self::with_vocab_limit`]): ids at or past the limit are refused naming the file.
    limit: Option<(usize, PathBuf)>,
    /// [`Self::longest_token_bytes`], computed on first use.
    longest_token: std::sync::OnceLock<usize>,
}

impl TextTokenizer {
    pub fn new(inner: tokenizers::Tokenizer, bos_token: Option<String>, eos_token: Option<String>) -> Self {
        Self { inner, bos_token, eos_token, limit: None, longest_token: Default::default() }
    }

    /// This tokenizer, read from `file`, for a model of `vocab_size` embedding rows: every id [`Self::encode`]
    /// returns (and [`Self::check_ids`] is asked about) must be below it, or the embedding lookup fails deep in
    /// the model with no file named.
    pub fn with_vocab_limit(self, file: &Path, vocab_size: usize) -> Self {
        Self { limit: Some((vocab_size, file.to_path_buf())), ..self }
    }

    /// A note for the model's notes when the tokenizer knows ids the model has no embedding for: text that
    /// produces one is refused ([`Self::check_ids`]), other text works.
    pub fn vocab_note(&self) -> Option<String> {
        let (rows, file) = self.limit.as_ref()?;
        let max = self.inner.get_vocab(true).into_values().max()?;
        (max as usize >= *rows).then(|| {
            format!(
                "{} has token ids up to {max} but the model has {rows} embedding rows (vocab_size); text that \
                 produces one of the ids past them is refused",
                file.display()
            )
        })
    }

    /// Refuse an id past the model's embedding rows, naming the tokenizer file, the id and its token.
    pub fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let Some((rows, file)) = &self.limit else { return Ok(()) };
        let Some(&id) = ids.iter().find(|&&id| id as usize >= *rows) else { return Ok(()) };
        let token = self.inner.id_to_token(id).map(|t| format!(" (`{t}`)")).unwrap_or_default();
        Err(Error::Tokenizer(format!(
            "{}: the text encodes to token id {id}{token}, past the model's {rows} embedding rows (vocab_size): this \
             tokenizer does not belong to these weights; use the model's own tokenizer file (or, if the weights do \
             have more rows, correct vocab_size in its config)",
            file.display()
        )))
    }

    /// Load `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<tokenizers::Tokenizer> {
        use crate::engine::input_file::{optional_file, read_regular, MAX_TOKENIZER_BYTES};
        if optional_file(path)?.is_none() {
            return Err(Error::MissingFile {
                path: path.to_path_buf(),
                what: "the model folder needs a tokenizer.json".into(),
            });
        }
        let bytes = read_regular(path, MAX_TOKENIZER_BYTES)?;
        tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))
    }

    /// Token ids for `text`; `add_special_tokens` applies the post-processor (BOS and the like).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, add_special_tokens).map_err(|e| Error::Tokenizer(e.to_string()))?;
        self.check_ids(enc.get_ids())?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text for `ids`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| Error::Tokenizer(e.to_string()))
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Bytes of the longest token's text in the vocabulary (a bound on what one token can cover; byte-level
    /// and byte-fallback spellings only make it larger, which keeps it a bound).
    pub fn longest_token_bytes(&self) -> usize {
        *self.longest_token.get_or_init(|| self.inner.get_vocab(true).keys().map(String::len).max().unwrap_or(1))
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Ids of all special (added, special) tokens.
    pub fn special_token_ids(&self) -> Vec<u32> {
        self.inner.get_added_tokens_decoder().iter().filter(|(_, t)| t.special).map(|(id, _)| *id).collect()
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Turns a growing list of token ids into text pieces as they become complete.
///
/// Decoding token by token breaks multi-byte characters and byte-level merges, so we decode a small
/// window and emit only the new suffix once it no longer ends in a replacement character.
pub struct StreamDecoder<'a> {
    tokenizer: &'a TextTokenizer,
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tokenizer: &'a TextTokenizer) -> Self {
        Self { tokenizer, ids: Vec::new(), prefix_offset: 0, read_offset: 0 }
    }

    /// Add one token; returns the text it completes, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let prefix = self.tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset], true)?;
        let text = self.tokenizer.decode(&self.ids[self.prefix_offset..], true)?;
        if text.len() > prefix.len() && !text.ends_with('\u{FFFD}') && text.is_char_boundary(prefix.len()) {
            let piece = text[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            Ok(Some(piece))
        } else {
            Ok(None)
        }
    }

    /// Whatever is still held back (an incomplete character at the very end).
    pub fn finish(&mut self) -> Result<Option<String>> {
        let prefix = self.tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset], true)?;
        let text = self.tokenizer.decode(&self.ids[self.prefix_offset..], true)?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        if text.len() > prefix.len() && text.is_char_boundary(prefix.len()) {
            Ok(Some(text[prefix.len()..].to_string()))
        } else {
            Ok(None)
        }
    }
}
