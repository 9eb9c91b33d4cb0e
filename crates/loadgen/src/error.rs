//! Errors of reading, writing and generating workload files.

use std::path::{Path, PathBuf};

/// A workload file or generation error, always naming the file (and line) at fault.
#[derive(Debug, thiserror::Error)]
pub enum LoadgenError {
    // The cause is part of the message (not a `source`), so it is printed once in any format.
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{path}: {err}")]
    Csv { path: PathBuf, err: csv::Error },
    #[error("{path}, line {line}: {message}")]
    Invalid {
        path: PathBuf,
        line: u64,
        message: String,
    },
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("{0}")]
    Config(String),
    #[error("plot {path}: {message}")]
    Plot { path: PathBuf, message: String },
    #[error("load generator: {0}")]
    Replay(String),
}

impl LoadgenError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        LoadgenError::Io {
            path: path.to_path_buf(),
            err: source,
        }
    }

    pub(crate) fn csv(path: &Path, source: csv::Error) -> Self {
        LoadgenError::Csv {
            path: path.to_path_buf(),
            err: source,
        }
    }

    pub(crate) fn invalid(path: &Path, line: u64, message: impl Into<String>) -> Self {
        LoadgenError::Invalid {
            path: path.to_path_buf(),
            line,
            message: message.into(),
        }
    }

    pub(crate) fn file(path: &Path, message: impl Into<String>) -> Self {
        LoadgenError::File {
            path: path.to_path_buf(),
            message: message.into(),
        }
    }
}

pub type Result<T, E = LoadgenError> = std::result::Result<T, E>;
