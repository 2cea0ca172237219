//! What can go wrong talking to the Hugging Face Hub or its cache (`engine::hub`), worded for the user: which repo,
//! which file, what to do. The token never appears in any message. Its own file beside `error.rs`, which wraps it,
//! so `error` does not depend on `hub` (and through it on `model`).

use std::path::PathBuf;

/// Hub and cache failures. `engine::Error::Hub` carries them.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HubError {
    #[error(
        "`{repo}` is a gated repository: {access}. Accept its terms at {url} while signed in, then give \
         metal-candle a token with read access (HF_TOKEN, `metal-candle hub login`, or the studio's token field)"
    )]
    Gated { repo: String, url: String, access: String },

    #[error(
        "{kind} repository `{repo}` was not found on {endpoint} (check the name; a private repository needs a token \
         that can read it{token_note}); there is no local file or folder of that name either"
    )]
    RepoNotFound { kind: String, repo: String, endpoint: String, token_note: String },

    #[error("`{repo}` has no revision `{revision}` (a branch, tag or commit)")]
    RevisionNotFound { repo: String, revision: String },

    #[error("`{repo}` at `{revision}` has no file `{file}`")]
    EntryNotFound { repo: String, revision: String, file: String },

    #[error("the token was refused by {endpoint} (401): it is invalid or expired; create a new one at {endpoint}/settings/tokens")]
    BadToken { endpoint: String },

    #[error("`{repo}` is not in the Hugging Face cache at {cache} and HF_HUB_OFFLINE is set (and no local file or folder of that name exists); unset HF_HUB_OFFLINE to download it")]
    Offline { repo: String, cache: PathBuf },

    #[error("{url}: the server answered {status} {attempts}; try again later")]
    Server { url: String, status: u16, attempts: String },

    #[error("cannot reach {url}: {message} {attempts}; check the connection (or HF_ENDPOINT)")]
    Network { url: String, message: String, attempts: String },

    #[error("{url}: unexpected answer from the server: {message}")]
    Protocol { url: String, message: String },

    #[error("downloaded {file} is corrupt ({message}); the partial file was removed, download again")]
    Corrupt { file: String, message: String },

    #[error(
        "not enough free disk space in {path}: the download needs {needed_mib:.1} MiB more and {available_mib:.1} MiB \
         are free; free some space or point HF_HUB_CACHE at a larger disk"
    )]
    DiskFull { path: PathBuf, needed_mib: f64, available_mib: f64 },

    #[error("`{spec}` is not a Hugging Face repo id ({message}); ids look like `ORG/NAME`, optionally `@REVISION` or `:QUANT` for a GGUF file")]
    BadRepoId { spec: String, message: String },

    #[error("`{repo}`: {message}")]
    NothingToLoad { repo: String, message: String },
}
