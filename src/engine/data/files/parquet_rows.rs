//! Parquet files through the `parquet` crate's record API, one row group at a time, each row turned into a
//! JSON value (nested columns too: a list of structs is a list of objects) and fed to the row collector at
//! once, so memory holds the validated rows and one row group's pages, never the whole file. Positions are
//! 1-based row indices over the whole file. The crate is built without its `json` feature, so the value
//! conversion ([`field_value`]) is ours: byte columns that are UTF-8 become strings.

use super::{open_bounded, RowSink, MAX_DATASET_BYTES};
use crate::engine::data::columns::ReadOptions;
use crate::engine::data::detect::{ParsedFile, RowCollector};
use crate::engine::data::formats::RowUnit;
use crate::engine::{Error, Result};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use serde_json::{Map, Number, Value};
use std::path::Path;

/// Read and validate a parquet file (see [`super::read_file`] for what fails here). A file the parquet reader
/// panics on (corrupt in a way it does not check) is refused with an error, not a crash.
pub fn read_parquet(path: &Path, read: &ReadOptions) -> Result<ParsedFile> {
    parquet_values(path, RowCollector::new(path, RowUnit::Row, read))?.finish()
}

/// Feed a parquet file's rows to `collector` (see [`read_parquet`]).
pub(crate) fn parquet_values<S: RowSink>(path: &Path, collector: S) -> Result<S> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read_rows(path, collector))) {
        Ok(result) => result,
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(unreadable(path, &format!("the parquet reader failed ({what})")))
        }
    }
}

fn read_rows<S: RowSink>(path: &Path, mut collector: S) -> Result<S> {
    let file = open_bounded(path, MAX_DATASET_BYTES)?;
    let reader = SerializedFileReader::new(file).map_err(|e| unreadable(path, &e.to_string()))?;
    let schema = reader.metadata().file_metadata().schema_descr();
    collector.set_columns(schema.root_schema().get_fields().iter().map(|f| f.name().to_string()).collect())?;
    let mut position = 0usize;
    for g in 0..reader.num_row_groups() {
        let group = reader.get_row_group(g).map_err(|e| unreadable(path, &format!("row group {g}: {e}")))?;
        let rows = group.get_row_iter(None).map_err(|e| unreadable(path, &format!("row group {g}: {e}")))?;
        for row in rows {
            position += 1;
            let row =
                row.map_err(|e| Error::Data(format!("{}: row {position}: cannot read the row: {e}", path.display())))?;
            let value: Map<String, Value> =
                row.get_column_iter().map(|(name, field)| (name.clone(), field_value(field))).collect();
            collector.push(position, Ok(Value::Object(value)));
        }
    }
    Ok(collector)
}

fn unreadable(path: &Path, why: &str) -> Error {
    Error::Data(format!(
        "{}: not a readable parquet file: {why}; check the download (or re-export it with snappy, zstd, gzip or \
         lz4 compression)",
        path.display()
    ))
}

/// One parquet value as JSON: groups become objects, lists arrays, maps objects (keys as text), numbers
/// numbers (NaN and infinities null), UTF-8 bytes strings; dates, times and decimals their text.
pub fn field_value(field: &Field) -> Value {
    match field {
        Field::Null => Value::Null,
        Field::Bool(b) => Value::Bool(*b),
        Field::Byte(n) => Value::from(*n),
        Field::Short(n) => Value::from(*n),
        Field::Int(n) => Value::from(*n),
        Field::Long(n) => Value::from(*n),
        Field::UByte(n) => Value::from(*n),
        Field::UShort(n) => Value::from(*n),
        Field::UInt(n) => Value::from(*n),
        Field::ULong(n) => Value::from(*n),
        Field::Float16(n) => number(n.to_f64()),
        Field::Float(n) => number(f64::from(*n)),
        Field::Double(n) => number(*n),
        Field::Str(s) => Value::String(s.clone()),
        Field::Bytes(b) => match std::str::from_utf8(b.data()) {
            Ok(s) => Value::String(s.to_string()),
            Err(_) => Value::String(format!("<{} bytes of binary data>", b.len())),
        },
        Field::Group(row) => {
            Value::Object(row.get_column_iter().map(|(name, f)| (name.clone(), field_value(f))).collect())
        }
        Field::ListInternal(list) => Value::Array(list.elements().iter().map(field_value).collect()),
        Field::MapInternal(map) => Value::Object(
            map.entries()
                .iter()
                .map(|(k, v)| {
                    let key = match field_value(k) {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    (key, field_value(v))
                })
                .collect(),
        ),
        other => Value::String(other.to_string()),
    }
}

fn number(n: f64) -> Value {
    Number::from_f64(n).map(Value::Number).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_parquet_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.parquet");
        std::fs::write(&path, b"{\"text\": \"not parquet\"}\n").unwrap();
        let err = read_parquet(&path, &ReadOptions::default()).unwrap_err().to_string();
        assert!(err.contains("train.parquet: not a readable parquet file"), "{err}");
    }

    #[test]
    fn nested_values_become_json() {
        use parquet::record::Row;
        let turn = Field::Group(Row::new(vec![
            ("role".into(), Field::Str("user".into())),
            ("content".into(), Field::Str("hi".into())),
        ]));
        assert_eq!(field_value(&turn), serde_json::json!({"role": "user", "content": "hi"}));
        assert_eq!(field_value(&Field::Double(f64::NAN)), Value::Null);
        assert_eq!(field_value(&Field::Bytes(b"caf\xc3\xa9".to_vec().into())), Value::String("café".into()));
    }
}
