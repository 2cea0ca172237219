//! The engine's error type: structured variants whose messages say what went wrong, where, and what to do.

use std::path::PathBuf;

/// Everything the engine can fail with. Messages name the file, line or field at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("file not found: {path} ({what})")]
    MissingFile { path: PathBuf, what: String },

    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{path}: invalid JSON: {message}")]
    Json { path: PathBuf, message: String },

    #[error("unsupported model architecture `{found}` in {path}; supported: {supported}")]
    UnsupportedArchitecture { found: String, path: PathBuf, supported: String },

    #[error("{path}: bad model config field `{field}`: {message}")]
    BadConfig { path: PathBuf, field: String, message: String },

    #[error("{path}: corrupt or truncated weights: {message}")]
    CorruptWeights { path: PathBuf, message: String },

    #[error("missing tensor `{name}` in {path}")]
    MissingTensor { name: String, path: PathBuf },

    #[error("tokenizer error: {0}")]
    Tokenizer(String),

    #[error("chat template error: {0}")]
    ChatTemplate(String),

    #[error(
        "the prompt is {prompt_tokens} tokens but the model's context is {context_len} tokens; shorten the prompt"
    )]
    PromptTooLong { prompt_tokens: usize, context_len: usize },

    #[error("device error: {0}")]
    Device(String),

    #[error("invalid setting: {0}")]
    InvalidSetting(String),

    #[error("{path}:{line}: {message}")]
    Dataset { path: PathBuf, line: usize, message: String },

    #[error("{0}")]
    Data(String),

    #[error("adapter error in {path}: {message}")]
    Adapter { path: PathBuf, message: String },

    #[error("training stopped: {0}")]
    Training(String),

    #[error("cancelled")]
    Cancelled,

    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// Shorthand used throughout the engine.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Wrap an I/O error with the path it happened on; a missing file gets its own clearer variant.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        if source.kind() == std::io::ErrorKind::NotFound {
            Error::MissingFile { path, what: "no such file or directory".into() }
        } else {
            Error::Io { path, source }
        }
    }
}

/// Read a whole file as a string, with the path in the error.
pub fn read_to_string(path: &std::path::Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io(path, e))
}

/// Read and parse a JSON file, with the path in the error.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> Result<T> {
    let text = read_to_string(path)?;
    serde_json::from_str(&text).map_err(|e| Error::Json { path: path.to_path_buf(), message: e.to_string() })
}
