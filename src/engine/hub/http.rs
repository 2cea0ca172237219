//! Requests to the Hub: the token in the `Authorization` header (and nowhere else), retries with backoff for
//! what is transient (connection failures, 429 and 5xx), and the Hub's answers mapped to [`HubError`] the way
//! `huggingface_hub` reads them (`X-Error-Code: GatedRepo | RepoNotFound | RevisionNotFound | EntryNotFound`).

use super::{HubError, HubSettings, RepoId, RepoKind};
use crate::engine::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use ureq::http::{HeaderMap, Response};
use ureq::Body;

/// What a request was for, so an error can name the repo, revision or file.
#[derive(Debug, Clone)]
pub struct Target<'a> {
    pub kind: RepoKind,
    pub repo: &'a RepoId,
    pub revision: &'a str,
    /// The file, for downloads.
    pub file: Option<&'a str>,
}

/// A blocking Hub client. Cheap to clone (ureq agents share their connection pool).
#[derive(Debug, Clone)]
pub struct HubClient {
    pub settings: HubSettings,
    /// Follows no redirects: HEAD reads the Hub's own headers (X-Linked-Etag), not a CDN's.
    api: ureq::Agent,
    /// Follows redirects (LFS files live on a CDN); ureq drops `Authorization` on a redirect.
    files: ureq::Agent,
}

fn agent(max_redirects: u32) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(max_redirects)
        .timeout_connect(Some(Duration::from_secs(15)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        .timeout_per_read(Some(Duration::from_secs(60)))
        .user_agent(concat!("metal-candle/", env!("CARGO_PKG_VERSION"), "; hf_hub-compatible"))
        .build()
        .new_agent()
}

/// The header as text, if present and readable.
pub fn header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

impl HubClient {
    pub fn new(settings: HubSettings) -> Self {
        Self { settings, api: agent(0), files: agent(10) }
    }

    fn authorize<B>(&self, request: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.settings.token {
            Some(token) => request.header("Authorization", format!("Bearer {}", token.secret())),
            None => request,
        }
    }

    /// GET `url` (API or file), retried while transient. `range_from`: ask for the bytes from there on.
    /// The answer's status is already checked: 2xx, or 416 for a range past the end.
    pub fn get(
        &self,
        url: &str,
        target: &Target,
        range_from: Option<u64>,
        cancel: &AtomicBool,
    ) -> Result<Response<Body>> {
        self.with_retries(url, target, cancel, || {
            let mut request = self.authorize(self.files.get(url));
            if let Some(start) = range_from.filter(|s| *s > 0) {
                request = request.header("Range", format!("bytes={start}-"));
            }
            request.call()
        })
    }

    /// HEAD a file URL, following only relative redirects (a renamed repo) as `huggingface_hub` does.
    pub fn head(&self, url: &str, target: &Target, cancel: &AtomicBool) -> Result<Response<Body>> {
        let mut url = url.to_string();
        for _ in 0..5 {
            let response = self.with_retries(&url, target, cancel, || {
                self.authorize(self.api.head(&url)).header("Accept-Encoding", "identity").call()
            })?;
            if response.status().is_redirection() {
                if let Some(location) = header(response.headers(), "location").filter(|l| l.starts_with('/')) {
                    url = format!("{}{}", self.settings.endpoint, location);
                    continue;
                }
            }
            return Ok(response);
        }
        Err(HubError::Protocol { url, message: "too many redirects".into() }.into())
    }

    /// GET an API URL and parse its JSON.
    pub fn get_json(&self, url: &str, target: &Target, cancel: &AtomicBool) -> Result<serde_json::Value> {
        let mut response = self.with_retries(url, target, cancel, || self.authorize(self.api.get(url)).call())?;
        let text = response
            .body_mut()
            .with_config()
            .limit(256 << 20)
            .read_to_string()
            .map_err(|e| HubError::Network { url: url.into(), message: e.to_string(), attempts: String::new() })?;
        serde_json::from_str(&text).map_err(|e| HubError::Protocol { url: url.into(), message: e.to_string() }.into())
    }

    fn with_retries(
        &self,
        url: &str,
        target: &Target,
        cancel: &AtomicBool,
        call: impl Fn() -> std::result::Result<Response<Body>, ureq::Error>,
    ) -> Result<Response<Body>> {
        let attempts = self.settings.attempts.max(1);
        let mut wait = self.settings.first_backoff;
        for attempt in 1..=attempts {
            if cancel.load(Ordering::Relaxed) {
                return Err(Error::Cancelled);
            }
            let tried = if attempt == 1 { String::new() } else { format!("after {attempt} attempts") };
            let (retry_after, failure) = match call() {
                Ok(response) => {
                    let status = response.status().as_u16();
                    if status < 400 || status == 416 {
                        return Ok(response);
                    }
                    if status != 429 && status < 500 {
                        return Err(self.status_error(status, response.headers(), target).into());
                    }
                    let retry_after = header(response.headers(), "retry-after").and_then(|s| s.trim().parse().ok());
                    (retry_after, HubError::Server { url: url.into(), status, attempts: tried })
                }
                Err(e) => (None, HubError::Network { url: url.into(), message: e.to_string(), attempts: tried }),
            };
            if attempt == attempts {
                return Err(failure.into());
            }
            let pause = retry_after.map(|s: u64| Duration::from_secs(s.min(30))).unwrap_or(wait);
            sleep_unless_cancelled(pause, cancel)?;
            wait = (wait * 2).min(Duration::from_secs(8));
        }
        unreachable!("the last attempt returns")
    }

    /// The error for a 4xx answer, read as `huggingface_hub` reads it.
    pub fn status_error(&self, status: u16, headers: &HeaderMap, target: &Target) -> HubError {
        let code = header(headers, "x-error-code").unwrap_or("");
        let repo = target.repo.to_string();
        let endpoint = self.settings.endpoint.clone();
        let has_token = self.settings.token.is_some();
        match code {
            "GatedRepo" => HubError::Gated {
                repo,
                url: self.settings.repo_url(target.kind, target.repo),
                access: if has_token { "the token given has not been granted access" } else { "no token was given" }
                    .into(),
            },
            "RevisionNotFound" => HubError::RevisionNotFound { repo, revision: target.revision.into() },
            "EntryNotFound" => HubError::EntryNotFound {
                repo,
                revision: target.revision.into(),
                file: target.file.unwrap_or("?").into(),
            },
            "" if status == 401 && has_token => HubError::BadToken { endpoint },
            _ if matches!(status, 401 | 403 | 404) => HubError::RepoNotFound {
                kind: target.kind.noun().into(),
                repo,
                endpoint,
                token_note: if has_token { ", and the token given cannot" } else { "" }.into(),
            },
            _ => HubError::Server {
                url: format!("{}/{}{}", self.settings.endpoint, target.kind.url_prefix(), target.repo),
                status,
                attempts: String::new(),
            },
        }
    }
}

/// Sleep for `pause`, waking every 50 ms to honour a cancel.
pub fn sleep_unless_cancelled(pause: Duration, cancel: &AtomicBool) -> Result<()> {
    let end = std::time::Instant::now() + pause;
    while std::time::Instant::now() < end {
        if cancel.load(Ordering::Relaxed) {
            return Err(Error::Cancelled);
        }
        std::thread::sleep(Duration::from_millis(50).min(end.saturating_duration_since(std::time::Instant::now())));
    }
    Ok(())
}

/// Percent-encode a revision or path segment for a URL (`/` kept between path segments when `keep_slash`).
pub fn encode(text: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        let plain = b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') || (keep_slash && b == b'/');
        if plain {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
