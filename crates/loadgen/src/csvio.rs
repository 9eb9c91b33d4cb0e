//! Shared CSV plumbing: every workload file is read with the same header checks and line-numbered
//! errors, so a malformed file says where and what.

use crate::error::{LoadgenError, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

/// Opens `path` and checks that every column of `required` is present (each entry lists the
/// accepted spellings of one column, the first being the documented one).
pub(crate) fn open(path: &Path, kind: &str, required: &[&[&str]]) -> Result<csv::Reader<File>> {
    let file = File::open(path).map_err(|e| LoadgenError::io(path, e))?;
    let mut rdr = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .comment(Some(b'#'))
        .from_reader(file);
    let headers = rdr
        .headers()
        .map_err(|e| LoadgenError::csv(path, e))?
        .clone();
    for names in required {
        if !names.iter().any(|n| headers.iter().any(|h| h == *n)) {
            let found: Vec<&str> = headers.iter().collect();
            return Err(LoadgenError::file(
                path,
                format!(
                    "not a {kind} file: missing column `{}` (found columns: {})",
                    names[0],
                    found.join(",")
                ),
            ));
        }
    }
    Ok(rdr)
}

/// Reads every row as `T`, handing each with its line number to `accept`.
pub(crate) fn read_rows<T: DeserializeOwned>(
    path: &Path,
    kind: &str,
    required: &[&[&str]],
    mut accept: impl FnMut(u64, T) -> Result<()>,
) -> Result<()> {
    let mut rdr = open(path, kind, required)?;
    let mut record = csv::StringRecord::new();
    let headers = rdr
        .headers()
        .map_err(|e| LoadgenError::csv(path, e))?
        .clone();
    loop {
        match rdr.read_record(&mut record) {
            Ok(false) => return Ok(()),
            Ok(true) => {}
            Err(e) => return Err(row_error(path, e)),
        }
        let line = record.position().map_or(0, |p| p.line());
        let row: T = record
            .deserialize(Some(&headers))
            .map_err(|e| LoadgenError::invalid(path, line, deserialize_message(&e)))?;
        accept(line, row)?;
    }
}

fn row_error(path: &Path, e: csv::Error) -> LoadgenError {
    match e.position() {
        Some(p) => LoadgenError::invalid(path, p.line(), e.to_string()),
        None => LoadgenError::csv(path, e),
    }
}

/// A csv deserialize error without its position prefix (the caller names the line).
fn deserialize_message(e: &csv::Error) -> String {
    match e.kind() {
        csv::ErrorKind::Deserialize { err, .. } => match err.field() {
            Some(i) => format!("column {}: {}", i + 1, err.kind()),
            None => err.kind().to_string(),
        },
        _ => e.to_string(),
    }
}

/// A CSV writer on a buffered file; `finish` flushes and reports errors with the path.
pub struct CsvOut {
    path: std::path::PathBuf,
    w: csv::Writer<BufWriter<File>>,
}

impl CsvOut {
    pub fn create(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| LoadgenError::io(dir, e))?;
        }
        let f = File::create(path).map_err(|e| LoadgenError::io(path, e))?;
        Ok(CsvOut {
            path: path.to_path_buf(),
            w: csv::Writer::from_writer(BufWriter::new(f)),
        })
    }

    pub fn row<T: Serialize>(&mut self, row: &T) -> Result<()> {
        self.w
            .serialize(row)
            .map_err(|e| LoadgenError::csv(&self.path, e))
    }

    pub fn finish(mut self) -> Result<()> {
        self.w
            .flush()
            .map_err(|e| LoadgenError::io(&self.path, e))?;
        let inner = self
            .w
            .into_inner()
            .map_err(|e| LoadgenError::io(&self.path, e.into_error()))?;
        let mut f = inner
            .into_inner()
            .map_err(|e| LoadgenError::io(&self.path, e.into_error()))?;
        f.flush().map_err(|e| LoadgenError::io(&self.path, e))
    }
}
