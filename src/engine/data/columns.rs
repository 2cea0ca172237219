//! How a user tells us to read a dataset whose columns are not the ones we look for: a format named instead of
//! detected, and columns renamed to the names the formats use ([`ColumnMap`], `prompt=question`). One
//! [`ReadOptions`] travels from the CLI flags (`--format`, `--columns`), the studio's dataset page and run.json
//! to every file read, so all of them read the rows the same way.

use super::formats::{DatasetFormat, FormatChoice};
use crate::engine::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// Format fields mapped to the file's columns: `{"prompt": "question", "completion": "answer"}` reads the
/// file's `question` column as `prompt`. Keys are the names the formats use ([`known_fields`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ColumnMap(pub BTreeMap<String, String>);

impl ColumnMap {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// (format field, file column) pairs, by field name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Map `field` to the file's `column`; an empty column removes the mapping.
    pub fn set(&mut self, field: &str, column: &str) {
        if column.is_empty() {
            self.0.remove(field);
        } else {
            self.0.insert(field.to_string(), column.to_string());
        }
    }

    pub fn get(&self, field: &str) -> Option<&str> {
        self.0.get(field).map(String::as_str)
    }

    /// Rename the mapped columns of one row to their field names (a mapped field replaces a column of the
    /// same name). Columns not mapped are left as they are.
    pub fn apply(&self, obj: &mut Map<String, Value>) {
        // Take every mapped column out first, so `a=b,b=a` swaps instead of losing one.
        let taken: Vec<(&str, Option<Value>)> =
            self.iter().map(|(field, column)| (field, obj.remove(column))).collect();
        for (field, value) in taken {
            if let Some(value) = value {
                obj.insert(field.to_string(), value);
            }
        }
    }
}

impl std::fmt::Display for ColumnMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pairs: Vec<String> = self.iter().map(|(k, v)| format!("{k}={v}")).collect();
        f.write_str(&pairs.join(","))
    }
}

impl std::str::FromStr for ColumnMap {
    type Err = String;
    /// `prompt=question,completion=answer`; whitespace around names is ignored.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let mut map = BTreeMap::new();
        for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, column) = pair
                .split_once('=')
                .map(|(a, b)| (a.trim(), b.trim()))
                .filter(|(a, b)| !a.is_empty() && !b.is_empty())
                .ok_or_else(|| format!("`{pair}` is not FIELD=COLUMN (for example prompt=question)"))?;
            if !known_fields().any(|k| k == field) {
                return Err(unknown_field(field, None));
            }
            if map.insert(field.to_string(), column.to_string()).is_some() {
                return Err(format!("`{field}` is mapped twice"));
            }
        }
        Ok(Self(map))
    }
}

/// Every field name a mapping may use, each once, in format order.
pub fn known_fields() -> impl Iterator<Item = &'static str> {
    let mut seen = Vec::new();
    DatasetFormat::ALL.into_iter().flat_map(DatasetFormat::columns).filter(move |c| {
        let new = !seen.contains(c);
        seen.push(c);
        new
    })
}

fn unknown_field(field: &str, format: Option<DatasetFormat>) -> String {
    match format {
        Some(f) => format!(
            "`{field}` is not a field of the {f} format; map one of: {}",
            f.columns().collect::<Vec<_>>().join(", ")
        ),
        None => format!("unknown field `{field}`; map one of: {}", known_fields().collect::<Vec<_>>().join(", ")),
    }
}

/// How rows are read: the format (detected per file, or named) and the column mapping. Recorded in run.json
/// (as `data_format` / `data_columns`), so a resumed run reads its data the same way.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct ReadOptions {
    pub format: FormatChoice,
    pub columns: ColumnMap,
}

impl ReadOptions {
    /// Whether this is the default (detect, no mapping).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Refuse a mapping whose fields do not belong to the named format (before any file is read).
    pub fn validate(&self) -> Result<()> {
        for (field, _) in self.columns.iter() {
            let known = match self.format.format() {
                Some(f) => f.columns().any(|c| c == field),
                None => known_fields().any(|c| c == field),
            };
            if !known {
                return Err(Error::InvalidSetting(format!(
                    "column mapping `data_columns` (--columns) {field}=...: {}",
                    unknown_field(field, self.format.format())
                )));
            }
        }
        Ok(())
    }

    /// Refuse a mapping that names a column `path` does not have, listing the columns it has. `columns` empty
    /// means the file has no rows to take columns from, and nothing is refused.
    pub fn check_columns(&self, path: &Path, columns: &[String]) -> Result<()> {
        if columns.is_empty() {
            return Ok(());
        }
        match self.missing_column(columns) {
            None => Ok(()),
            Some((field, column)) => Err(Error::Data(format!(
                "{}: the column mapping {field}={column} names no column of this file; its columns: {}; fix \
                 --columns (or the dataset page's mapping)",
                path.display(),
                columns.join(", ")
            ))),
        }
    }

    /// The first mapping (field, column) whose column is not among `columns`.
    pub fn missing_column<'a>(&'a self, columns: &[String]) -> Option<(&'a str, &'a str)> {
        self.columns.iter().find(|(_, column)| !columns.iter().any(|c| c == column))
    }

    /// With a named format: its required fields that are neither mapped nor a column of the file (`columns`
    /// as written). Empty under `auto`, or when `columns` is empty (nothing to check against).
    pub fn unmapped_fields(&self, columns: &[String]) -> Vec<&'static str> {
        let Some(format) = self.format.format() else { return Vec::new() };
        if columns.is_empty() {
            return Vec::new();
        }
        format
            .required_columns()
            .iter()
            .copied()
            .filter(|field| self.columns.get(field).is_none() && !columns.iter().any(|c| c == field))
            .collect()
    }

    /// "auto" or "alpaca", then the mapping: what reports print.
    pub fn describe(&self) -> String {
        if self.columns.is_empty() {
            self.format.name().to_string()
        } else {
            format!("{} with columns {}", self.format.name(), self.columns)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_parse_validate_and_print() {
        let map: ColumnMap = " prompt = question,completion=answer ,".parse().unwrap();
        assert_eq!(map.to_string(), "completion=answer,prompt=question");
        assert!("prompt".parse::<ColumnMap>().unwrap_err().contains("FIELD=COLUMN"));
        let err = "promt=q".parse::<ColumnMap>().unwrap_err();
        assert!(err.contains("unknown field `promt`") && err.contains("prompt, answer, completion"), "{err}");
        assert!("text=a,text=b".parse::<ColumnMap>().unwrap_err().contains("twice"));

        let alpaca = ReadOptions { format: FormatChoice::Alpaca, columns: "prompt=q".parse().unwrap() };
        let err = alpaca.validate().unwrap_err().to_string();
        assert!(err.contains("not a field of the alpaca format") && err.contains("instruction, output"), "{err}");
        assert!(ReadOptions { format: FormatChoice::Auto, ..alpaca }.validate().is_ok());
    }

    #[test]
    fn apply_renames_and_swaps() {
        let mut row = serde_json::json!({"question": "q", "answer": "a", "prompt": "old"});
        let map: ColumnMap = "prompt=question,completion=answer".parse().unwrap();
        map.apply(row.as_object_mut().unwrap());
        assert_eq!(row, serde_json::json!({"prompt": "q", "completion": "a"}));
        let mut row = serde_json::json!({"prompt": "1", "text": "2"});
        "prompt=text,text=prompt".parse::<ColumnMap>().unwrap().apply(row.as_object_mut().unwrap());
        assert_eq!(row, serde_json::json!({"prompt": "2", "text": "1"}));
    }

    #[test]
    fn a_missing_column_is_named_with_the_files_columns() {
        let read = ReadOptions { columns: "prompt=questoin".parse().unwrap(), ..Default::default() };
        let columns = vec!["question".to_string(), "answer".to_string()];
        let err = read.check_columns(Path::new("d/train.parquet"), &columns).unwrap_err().to_string();
        assert!(err.contains("d/train.parquet") && err.contains("prompt=questoin"), "{err}");
        assert!(err.contains("its columns: question, answer"), "{err}");
        assert!(read.check_columns(Path::new("x"), &[]).is_ok());
    }

    #[test]
    fn a_named_format_needs_its_fields_mapped_or_present() {
        let columns = vec!["question".to_string(), "answer".to_string()];
        let mut read = ReadOptions { format: FormatChoice::Completions, ..Default::default() };
        assert_eq!(read.unmapped_fields(&columns), ["prompt", "completion"]);
        read.columns.set("prompt", "question");
        assert_eq!(read.unmapped_fields(&columns), ["completion"]);
        read.columns.set("completion", "answer");
        assert!(read.unmapped_fields(&columns).is_empty());
        assert!(ReadOptions::default().unmapped_fields(&columns).is_empty());
    }
}
