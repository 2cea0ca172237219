//! JSON files as the Hugging Face `json` loader takes them: an array of rows (positions are 1-based indices in
//! the array), an object holding one list of rows (`{"data": [...]}`, other fields such as a version ignored),
//! or JSON Lines saved under a `.json` name (read as JSONL, positions are lines). A lone object that is itself
//! a row (it has a format's keys) is a file of one row, however it is laid out.

use super::{jsonl, read_bounded, utf8_text, RowSink, MAX_DATASET_BYTES};
use crate::engine::data::columns::ReadOptions;
use crate::engine::data::detect::{ParsedFile, RowCollector};
use crate::engine::data::formats::RowUnit;
use crate::engine::data::rows::{key_list, kind};
use crate::engine::{Error, Result};
use serde_json::Value;
use std::path::Path;

/// Read and validate a `.json` file (see [`super::read_file`] for what fails here).
pub fn read_json(path: &Path, read: &ReadOptions) -> Result<ParsedFile> {
    let text = utf8_text(path, read_bounded(path, MAX_DATASET_BYTES)?)?;
    parse_json(path, &text, read)
}

/// Validate JSON `text` as if read from `path`.
pub fn parse_json(path: &Path, text: &str, read: &ReadOptions) -> Result<ParsedFile> {
    json_values(path, text, |unit| RowCollector::new(path, unit, read))?.finish()
}

/// Feed the rows of JSON `text` (read from `path`) to the sink `make` builds for their positions.
pub(crate) fn json_values<S: RowSink>(path: &Path, text: &str, make: impl FnOnce(RowUnit) -> S) -> Result<S> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let rows = match text.trim_start().as_bytes().first() {
        None => Vec::new(),
        Some(b'[') => match serde_json::from_str::<Value>(text) {
            Ok(Value::Array(rows)) => rows,
            Ok(other) => return Err(not_rows(path, &format!("found {}", kind(&other)))),
            Err(e) => return Err(invalid(path, &e)),
        },
        Some(b'{') => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(obj)) => {
                let mut collector = make(RowUnit::Row);
                if collector.is_row(&obj) {
                    // One row (pretty-printed, perhaps): a file of one row.
                    collector.push(1, Ok(Value::Object(obj)));
                    return Ok(collector);
                }
                let lists: Vec<String> = obj.iter().filter(|(_, v)| v.is_array()).map(|(k, _)| k.clone()).collect();
                let rows = match lists.as_slice() {
                    [one] => match obj.into_iter().find(|(k, _)| k == one).map(|(_, v)| v) {
                        Some(Value::Array(rows)) => rows,
                        _ => Vec::new(),
                    },
                    [] => return Err(not_rows(path, &format!("found an object with {} and no list", key_list(&obj)))),
                    several => {
                        return Err(not_rows(
                            path,
                            &format!("found an object with several lists (`{}`); keep one", several.join("`, `")),
                        ))
                    }
                };
                for (i, row) in rows.into_iter().enumerate() {
                    collector.push(i + 1, Ok(row));
                }
                return Ok(collector);
            }
            // Several values one after another: JSON Lines under a .json name.
            Err(e) if e.to_string().starts_with("trailing characters") => {
                return Ok(jsonl::jsonl_values(text, make(RowUnit::Line)))
            }
            Ok(_) => Vec::new(),
            Err(e) => return Err(invalid(path, &e)),
        },
        Some(_) => return Err(not_rows(path, "it does not start with `[` or `{`")),
    };
    let mut collector = make(RowUnit::Row);
    for (i, row) in rows.into_iter().enumerate() {
        collector.push(i + 1, Ok(row));
    }
    Ok(collector)
}

fn not_rows(path: &Path, found: &str) -> Error {
    Error::Data(format!(
        "{}: expected a JSON array of rows, an object with one list of rows (such as {{\"data\": [...]}}) or JSON \
         Lines; {found}",
        path.display()
    ))
}

fn invalid(path: &Path, e: &serde_json::Error) -> Error {
    Error::Dataset { path: path.to_path_buf(), line: e.line(), message: super::json_error_message(e) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::data::formats::DatasetFormat;

    fn parse(text: &str) -> Result<ParsedFile> {
        parse_json(Path::new("d.json"), text, &ReadOptions::default())
    }

    #[test]
    fn arrays_objects_with_one_list_and_json_lines() {
        let array = parse(r#"[{"text": "a"}, {"text": ""}, {"text": "c"}]"#).unwrap();
        assert_eq!((array.format, array.unit, array.rows.len()), (Some(DatasetFormat::Text), RowUnit::Row, 2));
        assert_eq!(array.problems[0].to_string(), "d.json: row 2: `text` is empty");
        let wrapped = parse(r#"{"version": 2, "data": [{"prompt": "p", "completion": "c"}]}"#).unwrap();
        assert_eq!((wrapped.format, wrapped.rows.len()), (Some(DatasetFormat::Completions), 1));
        let lines = parse("{\"text\": \"a\"}\n{\"text\": \"b\"}\n").unwrap();
        assert_eq!((lines.unit, lines.rows.len()), (RowUnit::Line, 2));
        let one = parse(
            "{\n  \"messages\": [\n    {\"role\": \"user\", \"content\": \"hi\"},\n    {\"role\": \"assistant\", \"content\": \"hi\"}\n  ]\n}\n",
        )
        .unwrap();
        assert_eq!((one.format, one.rows.len()), (Some(DatasetFormat::Chat), 1));
        assert_eq!(parse("  ").unwrap().rows.len(), 0);
    }

    #[test]
    fn json_that_holds_no_rows_is_refused_clearly() {
        let err = parse(r#"{"a": 1, "b": [1], "c": []}"#).unwrap_err().to_string();
        assert!(err.contains("several lists (`b`, `c`)"), "{err}");
        let err = parse(r#"{"a": 1}"#).unwrap_err().to_string();
        assert!(err.contains("an object with keys `a` and no list"), "{err}");
        let err = parse("[{\"text\": \"a\"},\n {\"text\": }]").unwrap_err().to_string();
        assert!(err.starts_with("d.json:2: invalid JSON at column"), "{err}");
        assert!(parse("42").unwrap_err().to_string().contains("does not start with"));
    }
}
