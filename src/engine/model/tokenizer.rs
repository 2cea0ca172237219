//! The tokenizer: a thin wrapper over `tokenizers::Tokenizer` that keeps the special-token strings the chat
//! template needs, plus [`StreamDecoder`] for incremental detokenization that never splits a character.

use crate::engine::{Error, Result};
use std::path::Path;

/// A loaded tokenizer with the special tokens a chat template refers to.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
}

impl TextTokenizer {
    pub fn new(inner: tokenizers::Tokenizer, bos_token: Option<String>, eos_token: Option<String>) -> Self {
        Self { inner, bos_token, eos_token }
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
