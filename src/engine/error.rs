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

    /// A path that is there but cannot be read as the file it should be: a folder, a FIFO, a device, a link
    /// that loops, or a file larger than its kind may be.
    #[error("cannot read {path}: {message}")]
    Unreadable { path: PathBuf, message: String },

    /// Writing a file or folder failed (full disk, read-only folder, ...): never worded as a read.
    #[error("cannot write {path}: {message}")]
    Write { path: PathBuf, message: String },

    /// Another process holds the run folder (its lock on `.lock`).
    #[error("{path} is in use by another training process{holder}; wait for it to end or pick another run name")]
    RunInUse { path: PathBuf, holder: String },

    /// The run folder disappeared or was replaced while this process trained in it.
    #[error("the run folder {path} was moved or deleted during the run; stopped without recreating it")]
    RunFolderLost { path: PathBuf },

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

    /// A prompt whose text alone is longer than the context could hold, refused before tokenizing.
    #[error(
        "the prompt is {bytes} bytes of text, more than the model's context of {context_len} tokens can hold; \
         shorten the prompt"
    )]
    PromptTooLongText { bytes: usize, context_len: usize },

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

    /// A GRPO reward could not score a completion (a reward program failed, timed out or printed no number).
    #[error("{0}")]
    Reward(String),

    #[error("cancelled")]
    Cancelled,

    /// Data-parallel training across processes: a rendezvous that failed, a rank that died or disagreed.
    #[error("data-parallel training: {0}")]
    Distributed(String),

    #[error(transparent)]
    Hub(#[from] super::hub_error::HubError),

    /// Candle's error, without the backtrace Candle appends when `RUST_BACKTRACE` is set (see the `From` below).
    #[error(transparent)]
    Candle(candle_core::Error),
}

impl From<candle_core::Error> for Error {
    /// A message a user reads wants no backtrace: Candle captures one into its errors when `RUST_BACKTRACE` is set
    /// (a rank's lost-peer error printed twenty lines of frames), so it is dropped here, where every Candle error
    /// becomes ours.
    fn from(error: candle_core::Error) -> Self {
        Error::Candle(without_backtrace(error))
    }
}

/// `error` without the backtraces Candle wraps around it.
pub fn without_backtrace(error: candle_core::Error) -> candle_core::Error {
    match error {
        candle_core::Error::WithBacktrace { inner, .. } => without_backtrace(*inner),
        other => other,
    }
}

/// Shorthand used throughout the engine.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// What sort of failure this is, for front ends that file, colour or route errors.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::MissingFile { .. } => ErrorKind::MissingFile,
            Error::Io { .. } | Error::Unreadable { .. } => ErrorKind::Read,
            Error::Write { .. } | Error::RunFolderLost { .. } => ErrorKind::Write,
            Error::RunInUse { .. } => ErrorKind::Setting,
            Error::Json { .. } => ErrorKind::Format,
            Error::UnsupportedArchitecture { .. }
            | Error::BadConfig { .. }
            | Error::CorruptWeights { .. }
            | Error::MissingTensor { .. }
            | Error::Tokenizer(_)
            | Error::ChatTemplate(_) => ErrorKind::Model,
            Error::PromptTooLong { .. } | Error::PromptTooLongText { .. } => ErrorKind::Prompt,
            Error::Device(_) => ErrorKind::Device,
            Error::InvalidSetting(_) => ErrorKind::Setting,
            Error::Dataset { .. } | Error::Data(_) => ErrorKind::Dataset,
            Error::Adapter { .. } => ErrorKind::Adapter,
            Error::Training(_) => ErrorKind::Training,
            Error::Reward(_) => ErrorKind::Reward,
            Error::Cancelled => ErrorKind::Cancelled,
            Error::Distributed(_) => ErrorKind::Device,
            Error::Candle(_) => ErrorKind::Compute,
            Error::Hub(_) => ErrorKind::Hub,
        }
    }

    /// A write failure on `path`.
    pub fn write(path: impl Into<PathBuf>, message: impl std::fmt::Display) -> Self {
        Error::Write { path: path.into(), message: message.to_string() }
    }

    /// A numeric setting outside its range: names the setting (and its flag), the value, and what is allowed.
    pub fn out_of_range(name: &str, value: impl std::fmt::Display, allowed: &str) -> Self {
        Error::InvalidSetting(format!("{name} is {value}; allowed: {allowed}"))
    }

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

/// The sort of an [`Error`], kept when the error crosses a thread or process boundary as plain data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    MissingFile,
    Read,
    Write,
    /// A file that is not in the format it should be (bad JSON, bad manifest).
    Format,
    /// The model's files: config, weights, tokenizer, chat template.
    Model,
    Prompt,
    Device,
    /// Settings that cannot work, refused before any work starts.
    Setting,
    Dataset,
    Adapter,
    /// Failures inside the training loop itself (a diverging loss, ...).
    #[default]
    Training,
    Cancelled,
    /// A tensor operation failed.
    Compute,
    /// The Hugging Face Hub or its cache: not found, gated, offline, network, corrupt download.
    Hub,
    /// A GRPO reward (a user's reward program) failed on a completion.
    Reward,
    /// A bug: a panic or a thread that could not start.
    Internal,
}

impl ErrorKind {
    /// A short label for a front end ("write error", "invalid setting", ...).
    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::MissingFile => "file not found",
            ErrorKind::Read => "read error",
            ErrorKind::Write => "write error",
            ErrorKind::Format => "bad file format",
            ErrorKind::Model => "model error",
            ErrorKind::Prompt => "prompt error",
            ErrorKind::Device => "device error",
            ErrorKind::Setting => "invalid setting",
            ErrorKind::Dataset => "dataset error",
            ErrorKind::Adapter => "adapter error",
            ErrorKind::Training => "training error",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Compute => "compute error",
            ErrorKind::Hub => "Hugging Face Hub",
            ErrorKind::Reward => "reward error",
            ErrorKind::Internal => "internal error",
        }
    }
}

/// An [`Error`] as plain data (its kind and its full message), for events that cross threads.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ErrorInfo {
    pub kind: ErrorKind,
    /// The error's complete message, shown as is.
    pub message: String,
}

impl ErrorInfo {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }
}

impl From<&Error> for ErrorInfo {
    fn from(e: &Error) -> Self {
        Self { kind: e.kind(), message: e.to_string() }
    }
}

impl From<Error> for ErrorInfo {
    fn from(e: Error) -> Self {
        Self::from(&e)
    }
}

impl std::fmt::Display for ErrorInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Read a whole small file (a config, a settings file, a template) as a string, with the path in the
/// error; only a regular file of at most [`MAX_SMALL_FILE_BYTES`](super::input_file::MAX_SMALL_FILE_BYTES).
pub fn read_to_string(path: &std::path::Path) -> Result<String> {
    super::input_file::read_regular_text(path, super::input_file::MAX_SMALL_FILE_BYTES)
}

/// Read and parse a JSON file, with the path in the error.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> Result<T> {
    let text = read_to_string(path)?;
    serde_json::from_str(&text).map_err(|e| Error::Json { path: path.to_path_buf(), message: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::Error;

    #[test]
    fn a_candle_error_reads_without_its_backtrace() {
        let inner = candle_core::Error::Msg("the NCCL communicator was aborted".into());
        let traced = candle_core::Error::WithBacktrace {
            inner: Box::new(inner),
            backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
        };
        assert!(traced.to_string().lines().count() > 1, "Candle prints the frames: {traced}");
        assert_eq!(Error::from(traced).to_string(), "the NCCL communicator was aborted");
    }
}
