//! Paging through and searching a dataset's rows (the studio's dataset page): every valid row of each split,
//! read once the way training reads it ([`super::read_split`]), a case-insensitive text search over all rows
//! of a split, and a page of rows rendered through the model's chat template with trained and masked tokens
//! marked (as the report's preview does), or as plain turns when no model is loaded. A preference pair shows its
//! prompt once and both completions; a GRPO prompt shows its prompt (with the generation prompt) and answer.
//!
//! A [`RowBrowser`] is built once per dataset and reading choice and kept by the worker; it notices when a
//! file changes on disk ([`RowBrowser::is_current`]), and remembers the last search so paging through its
//! matches does not search again.

use super::columns::ReadOptions;
use super::formats::{PreferenceRow, PreferenceTurns, PromptRow, Row, RowUnit, SourcedRow};
use super::splits::RawSplit;
use super::{dataset_layout, read_split, Example, SplitName, TokenizeSpec};
use crate::engine::model::chat_template::ChatMessage;
use crate::engine::model::LoadedModel;
use crate::engine::Result;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// Rows a page may hold at most (a bigger request is cut to this).
pub const MAX_PAGE_ROWS: usize = 200;

/// Which rows to show: a page of `count` rows from the `first`-th (0-based) of the rows of `split` whose text
/// contains `search` (ignoring case; every row when it is empty).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct RowQuery {
    pub split: Option<SplitName>,
    pub search: String,
    pub first: usize,
    pub count: usize,
}

/// How a page renders rows: through `model`'s tokenizer and chat template, cut at `max_seq_len` as training
/// cuts them.
#[derive(Clone, Copy)]
pub struct RowRendering<'a> {
    pub model: &'a LoadedModel,
    pub max_seq_len: usize,
    pub train_on_prompt: bool,
}

/// One row as shown.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BrowsedRow {
    /// The row's position among the split's valid rows (0-based).
    pub index: usize,
    /// The file it came from and its position there (a line for JSONL, see `unit`).
    pub file: PathBuf,
    pub line: usize,
    pub unit: RowUnit,
    pub view: RowView,
}

/// A row's content: templated tokens with a model, its turns without one (or when the template fails).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum RowView {
    /// Through the chat template: text pieces, each flagged trained (true) or masked (false).
    Templated { tokens: usize, truncated: bool, pieces: Vec<(String, bool)> },
    /// (role, text) per turn; a text row is one turn with the role `text`. `error` says why the model's
    /// template could not render it, when that is why it is shown plain.
    Turns { turns: Vec<(String, String)>, error: Option<String> },
    /// A preference pair, each part a `Templated` or a `Turns` view: the prompt (shown once; templated, it is the
    /// masked start both sequences share), then the chosen and the rejected completions (shown side by side).
    Pair { prompt: Box<RowView>, chosen: Box<RowView>, rejected: Box<RowView> },
    /// A GRPO prompt: the prompt as a `Templated` view (every token masked, ending in the generation prompt) or as
    /// `Turns`, and the reference answer the exact-answer reward compares with, when the row has one.
    Prompt { prompt: Box<RowView>, answer: Option<String> },
}

/// A page of a split's rows.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RowPage {
    pub path: PathBuf,
    /// The query answered; `first` moved back onto the last page when it was past the end.
    pub query: RowQuery,
    /// The split shown (the query's, or the first split when it named none or one the dataset lacks).
    pub split: Option<SplitName>,
    /// Valid rows of each split that can be browsed, in the dataset's order.
    pub splits: Vec<(SplitName, usize)>,
    /// Rows of the split shown.
    pub split_rows: usize,
    /// Rows of the split that match the search (all of them without one).
    pub matches: usize,
    pub rows: Vec<BrowsedRow>,
    /// Whether rows were rendered through a model's template.
    pub templated: bool,
}

/// The last search: (split, lowercased text) and the indices of its matches.
type LastSearch = (SplitName, String, Arc<Vec<usize>>);

/// The rows of a dataset held for paging and search.
pub struct RowBrowser {
    pub path: PathBuf,
    pub read: ReadOptions,
    splits: Vec<RawSplit>,
    /// Each file read with its modification time and size when it was read.
    stamps: Vec<(PathBuf, Option<SystemTime>, u64)>,
    last_search: Mutex<Option<LastSearch>>,
}

impl RowBrowser {
    /// Read every split of the dataset at `path` as `read` says. A split training would refuse (an ambiguous
    /// format, files in different formats) has nothing to browse and is left out; the dataset report says why.
    pub fn open(path: &Path, read: &ReadOptions) -> Result<Self> {
        read.validate()?;
        let layout = dataset_layout(path)?;
        let mut splits = Vec::new();
        let mut stamps = Vec::new();
        for files in &layout.splits {
            stamps.extend(files.files.iter().map(|f| stamp(f)));
            let split = read_split(files.split, &files.files, read)?;
            if split.refusal().is_none() {
                splits.push(split.into_raw());
            }
        }
        Ok(Self { path: path.to_path_buf(), read: read.clone(), splits, stamps, last_search: Mutex::new(None) })
    }

    /// Whether the files read are unchanged on disk (same modification time and size).
    pub fn is_current(&self) -> bool {
        self.stamps.iter().all(|recorded| stamp(&recorded.0) == *recorded)
    }

    /// (split, valid rows) of each split.
    pub fn splits(&self) -> Vec<(SplitName, usize)> {
        self.splits.iter().map(|s| (s.name, s.rows.len())).collect()
    }

    /// The indices of `split`'s rows whose text contains `search`, ignoring case (all rows when it is empty).
    pub fn matches(&self, split: SplitName, search: &str) -> Arc<Vec<usize>> {
        let Some(raw) = self.splits.iter().find(|s| s.name == split) else { return Arc::new(Vec::new()) };
        let needle = Needle::new(search);
        if needle.is_empty() {
            return Arc::new((0..raw.rows.len()).collect());
        }
        let mut last = self.last_search.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((s, text, found)) = last.as_ref() {
            if *s == split && *text == needle.lower {
                return found.clone();
            }
        }
        let found: Arc<Vec<usize>> = Arc::new(
            raw.rows.iter().enumerate().filter(|(_, r)| row_matches(&r.row, &needle)).map(|(i, _)| i).collect(),
        );
        *last = Some((split, needle.lower.clone(), found.clone()));
        found
    }

    /// The page `query` asks for, rendered with `rendering` (plain turns without it).
    pub fn page(&self, query: &RowQuery, rendering: Option<RowRendering<'_>>) -> RowPage {
        let splits = self.splits();
        let split = query
            .split
            .filter(|s| splits.iter().any(|(name, _)| name == s))
            .or_else(|| splits.first().map(|(name, _)| *name));
        let mut page = RowPage {
            path: self.path.clone(),
            query: query.clone(),
            split,
            splits,
            templated: rendering.is_some(),
            ..Default::default()
        };
        let Some(raw) = split.and_then(|name| self.splits.iter().find(|s| s.name == name)) else { return page };
        let found = self.matches(raw.name, &query.search);
        let count = query.count.clamp(1, MAX_PAGE_ROWS);
        let first = if query.first < found.len() { query.first } else { found.len().saturating_sub(1) / count * count };
        page.query.first = first;
        page.split_rows = raw.rows.len();
        page.matches = found.len();
        let spec = rendering.map(|r| {
            let full = TokenizeSpec::for_model(r.model, r.max_seq_len.max(2), r.train_on_prompt);
            (full, r.model)
        });
        page.rows = found
            .iter()
            .skip(first)
            .take(count)
            .filter_map(|&index| raw.rows.get(index).map(|sourced| (index, sourced)))
            .map(|(index, sourced)| browsed_row(raw, index, sourced, spec.as_ref()))
            .collect();
        page
    }
}

fn stamp(path: &Path) -> (PathBuf, Option<SystemTime>, u64) {
    let meta = std::fs::metadata(path).ok();
    (path.to_path_buf(), meta.as_ref().and_then(|m| m.modified().ok()), meta.map_or(0, |m| m.len()))
}

fn browsed_row(
    raw: &RawSplit,
    index: usize,
    sourced: &SourcedRow,
    spec: Option<&(TokenizeSpec<'_>, &LoadedModel)>,
) -> BrowsedRow {
    let file = raw.file_of(sourced);
    let plain = |error: Option<String>| match &sourced.row {
        Row::Preference(pair) => pair_turns(pair, error),
        Row::Prompt(row) => RowView::Prompt {
            prompt: Box::new(RowView::Turns { turns: part_turns("prompt", &row.prompt), error }),
            answer: row.answer.clone(),
        },
        row => RowView::Turns { turns: turns_of(row), error },
    };
    let view = match spec {
        Some((spec, model)) => {
            let view = match &sourced.row {
                Row::Preference(pair) => templated_pair(pair, spec, model),
                Row::Prompt(row) => templated_prompt(row, spec, model),
                row => templated(row, spec, model),
            };
            view.unwrap_or_else(|e| plain(Some(e.to_string())))
        }
        None => plain(None),
    };
    BrowsedRow { index, file: file.path, line: sourced.line, unit: file.unit, view }
}

fn templated(row: &Row, spec: &TokenizeSpec<'_>, model: &LoadedModel) -> Result<RowView> {
    let (tokens, truncated, pieces) = super::report::preview(row, spec, model)?;
    Ok(RowView::Templated { tokens, truncated, pieces })
}

/// A pair through the template: the chosen sequence's masked start as the prompt, then each completion.
fn templated_pair(pair: &PreferenceRow, spec: &TokenizeSpec<'_>, model: &LoadedModel) -> Result<RowView> {
    let (chosen, rejected) = super::tokenize_pair(pair, spec)?;
    let side = |example: &Example| -> Result<(Vec<(String, bool)>, RowView)> {
        let mut pieces = super::tokenize::preview_example(example, &model.tokenizer)?;
        let completion = pieces.split_off(super::prompt_tokens(example));
        let view = RowView::Templated { tokens: example.len(), truncated: example.truncated, pieces: completion };
        Ok((pieces, view))
    };
    let (prompt, chosen_view) = side(&chosen)?;
    let (_, rejected_view) = side(&rejected)?;
    let prompt = RowView::Templated { tokens: prompt.len(), truncated: false, pieces: prompt };
    Ok(RowView::Pair { prompt: Box::new(prompt), chosen: Box::new(chosen_view), rejected: Box::new(rejected_view) })
}

/// A GRPO prompt as the model sees it: the templated prompt (all masked; the model writes what follows).
fn templated_prompt(row: &PromptRow, spec: &TokenizeSpec<'_>, model: &LoadedModel) -> Result<RowView> {
    let example = super::tokenize_prompt(row, spec)?;
    let pieces = super::tokenize::preview_example(&example, &model.tokenizer)?;
    let prompt = RowView::Templated { tokens: example.len(), truncated: example.truncated, pieces };
    Ok(RowView::Prompt { prompt: Box::new(prompt), answer: row.answer.clone() })
}

/// (role, text) of a pair's part or a prompt: text under `name`, messages under their roles.
fn part_turns(name: &str, turns: &PreferenceTurns) -> Vec<(String, String)> {
    match turns {
        PreferenceTurns::Text(text) => vec![(name.to_string(), text.clone())],
        PreferenceTurns::Messages(messages) => message_turns(messages.clone()),
    }
}

/// A pair as plain turns: text parts under the names `prompt`, `chosen` and `rejected`, messages under their roles.
fn pair_turns(pair: &PreferenceRow, error: Option<String>) -> RowView {
    let part = |name: &str, turns: &PreferenceTurns, error: Option<String>| {
        Box::new(RowView::Turns { turns: part_turns(name, turns), error })
    };
    RowView::Pair {
        prompt: part("prompt", &pair.prompt, error),
        chosen: part("chosen", &pair.chosen, None),
        rejected: part("rejected", &pair.rejected, None),
    }
}

/// (role, text) of each turn: a chat row's messages (a tool call as its JSON), a completion as user and
/// assistant, a text row as one `text` turn.
fn turns_of(row: &Row) -> Vec<(String, String)> {
    match row {
        Row::Text(text) => vec![("text".into(), text.clone())],
        _ => row.to_conversation().map(|c| message_turns(c.messages)).unwrap_or_default(),
    }
}

/// (role, text) of each message, a tool call as its JSON.
fn message_turns(messages: Vec<ChatMessage>) -> Vec<(String, String)> {
    messages
        .into_iter()
        .map(|m| {
            let mut text = m.content;
            if let Some(calls) = m.tool_calls.filter(|c| !c.is_empty()) {
                let calls = serde_json::to_string(&calls).unwrap_or_default();
                text = if text.is_empty() { calls } else { format!("{text}\n{calls}") };
            }
            (m.role, text)
        })
        .collect()
}

/// What a search looks for: the text lowercased; ASCII text is matched without allocating.
struct Needle {
    lower: String,
}

impl Needle {
    fn new(search: &str) -> Self {
        Self { lower: search.trim().to_lowercase() }
    }

    fn is_empty(&self) -> bool {
        self.lower.is_empty()
    }

    /// Whether `hay` contains the needle, ignoring case.
    fn found_in(&self, hay: &str) -> bool {
        let needle = self.lower.as_bytes();
        if !self.lower.is_ascii() {
            return hay.to_lowercase().contains(&self.lower);
        }
        let hay = hay.as_bytes();
        if needle.len() > hay.len() {
            return false;
        }
        let first = needle[0];
        (0..=hay.len() - needle.len())
            .any(|i| hay[i].to_ascii_lowercase() == first && hay[i..i + needle.len()].eq_ignore_ascii_case(needle))
    }
}

/// The byte ranges of `text` where `search` occurs, ignoring case as the search does (for highlighting the
/// matches of a page's rows); none for an empty search.
pub fn match_ranges(text: &str, search: &str) -> Vec<std::ops::Range<usize>> {
    let needle: Vec<char> = search.trim().to_lowercase().chars().collect();
    let mut ranges = Vec::new();
    if needle.is_empty() {
        return ranges;
    }
    let mut start = 0;
    while start < text.len() {
        match match_end(&text[start..], &needle) {
            Some(len) => {
                ranges.push(start..start + len);
                start += len;
            }
            None => start += text[start..].chars().next().map_or(1, char::len_utf8),
        }
    }
    ranges
}

/// The byte length of the prefix of `text` that lowercases to `needle`, if one does.
fn match_end(text: &str, needle: &[char]) -> Option<usize> {
    let mut wanted = needle.iter();
    for (at, c) in text.char_indices() {
        for lower in c.to_lowercase() {
            if wanted.next() != Some(&lower) {
                return None;
            }
        }
        if wanted.len() == 0 {
            return Some(at + c.len_utf8());
        }
    }
    None
}

/// Whether any text of the row (a turn's content, a tool call, a tool's name) contains the needle.
fn row_matches(row: &Row, needle: &Needle) -> bool {
    match row {
        Row::Text(text) => needle.found_in(text),
        Row::Completion { prompt, completion } => needle.found_in(prompt) || needle.found_in(completion),
        Row::Chat(conversation) => messages_match(&conversation.messages, needle),
        Row::Preference(pair) => {
            [&pair.prompt, &pair.chosen, &pair.rejected].into_iter().any(|t| turns_match(t, needle))
        }
        Row::Prompt(row) => {
            turns_match(&row.prompt, needle) || row.answer.as_deref().is_some_and(|a| needle.found_in(a))
        }
    }
}

fn turns_match(turns: &PreferenceTurns, needle: &Needle) -> bool {
    match turns {
        PreferenceTurns::Text(text) => needle.found_in(text),
        PreferenceTurns::Messages(messages) => messages_match(messages, needle),
    }
}

fn messages_match(messages: &[ChatMessage], needle: &Needle) -> bool {
    messages.iter().any(|m| {
        needle.found_in(&m.content)
            || m.name.as_deref().is_some_and(|n| needle.found_in(n))
            || m.tool_calls.as_ref().is_some_and(|calls| {
                calls.iter().any(|c| needle.found_in(&serde_json::to_string(c).unwrap_or_default()))
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(q: &str, a: &str) -> String {
        serde_json::json!({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
            .to_string()
    }

    fn dataset(train_rows: usize) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let train: Vec<String> = (0..train_rows)
            .map(|i| chat(&format!("Question {i}"), if i % 10 == 3 { "The ÉCLAIR answer" } else { "plain" }))
            .collect();
        std::fs::write(dir.path().join("train.jsonl"), train.join("\n") + "\n").unwrap();
        std::fs::write(dir.path().join("valid.jsonl"), chat("Valid one", "yes") + "\n").unwrap();
        dir
    }

    fn query(split: Option<SplitName>, search: &str, first: usize, count: usize) -> RowQuery {
        RowQuery { split, search: search.into(), first, count }
    }

    #[test]
    fn pages_cover_every_row_and_the_last_page_is_short() {
        let dir = dataset(45);
        let browser = RowBrowser::open(dir.path(), &ReadOptions::default()).unwrap();
        assert_eq!(browser.splits(), vec![(SplitName::Train, 45), (SplitName::Valid, 1)]);
        let page = browser.page(&query(None, "", 40, 20), None);
        assert_eq!(page.split, Some(SplitName::Train));
        assert_eq!((page.split_rows, page.matches, page.query.first), (45, 45, 40));
        let indices: Vec<usize> = page.rows.iter().map(|r| r.index).collect();
        assert_eq!(indices, (40..45).collect::<Vec<_>>());
        assert_eq!(page.rows[0].line, 41);
        match &page.rows[0].view {
            RowView::Turns { turns, error: None } => assert_eq!(turns[0], ("user".into(), "Question 40".into())),
            other => panic!("unexpected {other:?}"),
        }
        // Past the end: the last page.
        let page = browser.page(&query(None, "", 900, 20), None);
        assert_eq!(page.query.first, 40);
    }

    #[test]
    fn search_ignores_case_in_ascii_and_beyond() {
        let dir = dataset(45);
        let browser = RowBrowser::open(dir.path(), &ReadOptions::default()).unwrap();
        let page = browser.page(&query(Some(SplitName::Train), "éclair", 0, 2), None);
        assert_eq!((page.matches, page.rows.len()), (5, 2));
        assert_eq!(page.rows[1].index, 13);
        assert_eq!(browser.matches(SplitName::Train, "  QUESTION 4 ").len(), 6, "4 and 40..45");
        assert_eq!(browser.matches(SplitName::Train, "nowhere").len(), 0);
        let valid = browser.page(&query(Some(SplitName::Valid), "VALID", 0, 10), None);
        assert_eq!((valid.split, valid.matches), (Some(SplitName::Valid), 1));
        let missing = browser.page(&query(Some(SplitName::Test), "", 0, 10), None);
        assert_eq!(missing.split, Some(SplitName::Train), "a split the dataset lacks shows the first");
    }

    #[test]
    fn preference_rows_page_as_pairs_and_search_every_side() {
        let dir = tempfile::tempdir().unwrap();
        let row = serde_json::json!({"prompt": [{"role": "user", "content": "17 + 25?"}],
            "chosen": [{"role": "assistant", "content": "42"}], "rejected": [{"role": "assistant", "content": "41"}]});
        std::fs::write(dir.path().join("train.jsonl"), format!("{row}\n")).unwrap();
        let browser = RowBrowser::open(dir.path(), &ReadOptions::default()).unwrap();
        assert_eq!(browser.matches(SplitName::Train, "41").len(), 1, "the rejected side is searched");
        let page = browser.page(&query(None, "", 0, 10), None);
        let turns = |v: &RowView| match v {
            RowView::Turns { turns, .. } => turns.clone(),
            other => panic!("unexpected {other:?}"),
        };
        match &page.rows[0].view {
            RowView::Pair { prompt, chosen, rejected } => {
                assert_eq!(turns(prompt), [("user".to_string(), "17 + 25?".to_string())]);
                assert_eq!(turns(chosen), [("assistant".to_string(), "42".to_string())]);
                assert_eq!(turns(rejected), [("assistant".to_string(), "41".to_string())]);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn prompt_rows_page_with_their_answer_and_search_it() {
        let dir = tempfile::tempdir().unwrap();
        let rows = [
            serde_json::json!({"messages": [{"role": "user", "content": "17 + 25?"}], "answer": "42"}),
            serde_json::json!({"messages": [{"role": "user", "content": "1 + 2?"}]}),
        ];
        let text: Vec<String> = rows.iter().map(|r| r.to_string()).collect();
        std::fs::write(dir.path().join("train.jsonl"), text.join("\n") + "\n").unwrap();
        let browser = RowBrowser::open(dir.path(), &ReadOptions::default()).unwrap();
        assert_eq!(browser.splits(), vec![(SplitName::Train, 2)], "the row without an answer is a prompt too");
        assert_eq!(browser.matches(SplitName::Train, "42").len(), 1, "the answer is searched");
        let page = browser.page(&query(None, "", 0, 10), None);
        match &page.rows[0].view {
            RowView::Prompt { prompt, answer } => {
                assert_eq!(answer.as_deref(), Some("42"));
                assert!(
                    matches!(&**prompt, RowView::Turns { turns, .. } if turns == &[("user".to_string(), "17 + 25?".to_string())])
                );
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(&page.rows[1].view, RowView::Prompt { answer: None, .. }));
    }

    #[test]
    fn match_ranges_mark_every_match_in_any_case() {
        assert_eq!(match_ranges("Paris, PARIS, parís", "paris"), vec![0..5, 7..12]);
        assert_eq!(match_ranges("Un ÉCLAIR, un éclair", "éclair"), vec![3..10, 15..22]);
        assert!(match_ranges("anything", "  ").is_empty());
    }

    #[test]
    fn a_changed_file_makes_the_browser_stale() {
        let dir = dataset(3);
        let browser = RowBrowser::open(dir.path(), &ReadOptions::default()).unwrap();
        assert!(browser.is_current());
        std::fs::write(dir.path().join("valid.jsonl"), chat("Valid one", "yes, changed") + "\n").unwrap();
        assert!(!browser.is_current());
    }

    #[test]
    fn a_hundred_thousand_rows_search_quickly() {
        let dir = dataset(100_000);
        let browser = RowBrowser::open(dir.path(), &ReadOptions::default()).unwrap();
        let started = std::time::Instant::now();
        assert_eq!(browser.matches(SplitName::Train, "Éclair").len(), 10_000);
        assert_eq!(browser.matches(SplitName::Train, "question 99999").len(), 1);
        assert!(started.elapsed().as_secs_f64() < 5.0, "took {:?}", started.elapsed());
    }
}
