//! JSON Lines: one row per line, blank lines skipped, positions are line numbers. Read line by line, so a
//! large file is never held whole.

use super::{json_error_message, open_bounded, RowSink, MAX_DATASET_BYTES};
use crate::engine::data::columns::ReadOptions;
use crate::engine::data::detect::{ParsedFile, RowCollector};
use crate::engine::data::formats::RowUnit;
use crate::engine::{Error, Result};
use std::io::BufRead;
use std::path::Path;

/// Read and validate a JSONL file (see [`super::read_file`] for what fails here).
pub fn read_jsonl(path: &Path, read: &ReadOptions) -> Result<ParsedFile> {
    stream_jsonl(path, RowCollector::new(path, RowUnit::Line, read))?.finish()
}

/// Feed a JSONL file's lines to `collector`, line by line.
pub(crate) fn stream_jsonl<S: RowSink>(path: &Path, mut collector: S) -> Result<S> {
    let file = open_bounded(path, MAX_DATASET_BYTES)?;
    let mut reader = std::io::BufReader::new(std::io::Read::take(file, MAX_DATASET_BYTES));
    let mut buf = Vec::new();
    let mut line = 0;
    let mut offset = 0usize;
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        line += 1;
        let text = std::str::from_utf8(&buf).map_err(|e| Error::Dataset {
            path: path.to_path_buf(),
            line,
            message: format!("invalid UTF-8 at byte {}; save the file as UTF-8", offset + e.valid_up_to()),
        })?;
        offset += n;
        feed(&mut collector, line, text);
    }
    Ok(collector)
}

/// Validate JSONL `text` as if read from `path`.
pub fn parse_jsonl(path: &Path, text: &str, read: &ReadOptions) -> Result<ParsedFile> {
    jsonl_values(text, RowCollector::new(path, RowUnit::Line, read)).finish()
}

/// Feed JSONL `text` (already in memory) to `collector`.
pub(crate) fn jsonl_values<S: RowSink>(text: &str, mut collector: S) -> S {
    for (i, raw) in text.lines().enumerate() {
        feed(&mut collector, i + 1, raw);
    }
    collector
}

fn feed(collector: &mut impl RowSink, line: usize, raw: &str) {
    let raw = if line == 1 { raw.strip_prefix('\u{feff}').unwrap_or(raw) } else { raw };
    let raw = raw.strip_suffix('\n').unwrap_or(raw);
    let raw = raw.strip_suffix('\r').unwrap_or(raw);
    if raw.trim().is_empty() {
        collector.blank_line();
    } else {
        collector.push(line, serde_json::from_str(raw).map_err(|e| json_error_message(&e)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::data::detect::Detection;
    use crate::engine::data::formats::{DatasetFormat, Row};

    fn parse(text: &str) -> ParsedFile {
        parse_jsonl(Path::new("data.jsonl"), text, &ReadOptions::default()).unwrap()
    }

    fn only_problem(text: &str) -> String {
        let p = parse(text);
        assert_eq!(p.problems.len(), 1, "{:?}", p.problems);
        p.problems[0].message.clone()
    }

    #[test]
    fn detects_each_format_with_line_numbers() {
        let chat = parse(r#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}]}"#);
        assert_eq!(chat.format, Some(DatasetFormat::Chat));
        assert_eq!(chat.rows.len(), 1);
        let comp = parse("{\"prompt\":\"a\",\"completion\":\"b\"}\n\n{\"prompt\":\"\",\"completion\":\"c\"}\n");
        assert_eq!(comp.format, Some(DatasetFormat::Completions));
        assert_eq!((comp.rows.len(), comp.blank_lines), (2, 1));
        assert_eq!(comp.rows[1].line, 3);
        let text = parse("\u{feff}{\"text\":\"hello world\",\"id\":7}\r\n");
        assert_eq!(text.format, Some(DatasetFormat::Text));
        assert_eq!(text.rows[0].row, Row::Text("hello world".into()));
        assert_eq!(text.detection, Detection::Detected { format: DatasetFormat::Text, row: 1 });
    }

    #[test]
    fn problems_say_what_is_wrong() {
        let good = r#"{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}"#;
        let cases = [
            ("{\"messages\": [", "invalid JSON at column"),
            ("[1, 2]", "expected a JSON object, found a list"),
            ("{\"other\": 1}", "missing field `messages`"),
            ("{\"messages\": \"hi\"}", "found a string"),
            ("{\"messages\": []}", "empty conversation"),
            ("{\"messages\": [{\"content\": \"x\"}]}", "messages[0] has no `role`"),
            ("{\"messages\": [{\"role\": \"user\"}]}", "messages[0] (user) has no `content`"),
            (
                "{\"messages\": [{\"role\": \"user\", \"content\": 3}]}",
                "messages[0].content must be a string, found a number",
            ),
            ("{\"messages\": [{\"role\": \"bot\", \"content\": \"x\"}]}", "unknown role `bot`"),
            ("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", "no assistant message"),
            ("{\"text\": \"x\"}", "mixed formats"),
        ];
        for (bad, expected) in cases {
            let message = only_problem(&format!("{good}\n{bad}\n"));
            assert!(message.contains(expected), "{bad}: {message}");
        }
        let p = parse(&format!("{good}\n{{\"messages\": [}}\n"));
        assert_eq!(p.problems[0].line, 2);
        assert!(p.problems[0].to_string().starts_with("data.jsonl:2: invalid JSON at column 15"), "{}", p.problems[0]);
    }

    #[test]
    fn a_file_without_any_valid_row_reports_every_line() {
        let p = parse("{\"a\":1}\nnot json\n");
        assert_eq!((p.format, p.detection), (None, Detection::Unknown));
        assert_eq!(p.problems.len(), 2);
        assert!(p.problems[0].message.contains("no known format"), "{}", p.problems[0].message);
    }

    #[test]
    fn files_stream_and_name_the_line_of_invalid_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.jsonl");
        std::fs::write(&path, b"{\"text\": \"a\"}\n\n{\"text\": \"caf\xe9\"}\n").unwrap();
        let err = read_jsonl(&path, &ReadOptions::default()).unwrap_err().to_string();
        assert!(err.contains("d.jsonl:3: invalid UTF-8 at byte 28"), "{err}");
        std::fs::write(&path, "{\"text\": \"a\"}\n\n{\"text\": \"b\"}").unwrap();
        let p = read_jsonl(&path, &ReadOptions::default()).unwrap();
        assert_eq!((p.rows.len(), p.blank_lines, p.rows[1].line), (2, 1, 3));
    }
}
