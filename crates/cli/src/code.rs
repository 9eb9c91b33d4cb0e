//! Packs function code for registration.

use serde_json::{json, Value};
use std::path::Path;

/// The `code` field for a directory or a single `.py` file, and the handler module a single file
/// implies (its stem).
pub fn pack(path: &Path) -> Result<(Value, Option<String>), String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("--code {}: {e}", path.display()))?;
    if meta.is_file() {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| format!("--code {}: not a file name", path.display()))?;
        let stem = name.strip_suffix(".py").ok_or_else(|| {
            format!(
                "--code {}: a single file must be a .py file",
                path.display()
            )
        })?;
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("--code {}: {e}", path.display()))?;
        return Ok((json!({"files": {name: text}}), Some(stem.to_string())));
    }
    let b64 = hearth_service::archive::pack_dir_base64(path)
        .map_err(|e| format!("--code {}: {e}", path.display()))?;
    Ok((json!({ "archive": b64 }), None))
}
