//! The plots' font: DejaVu Sans from the system (Debian's `fonts-dejavu-core`), registered with
//! plotters' pure-Rust glyph renderer so no font service is needed.

use crate::error::{LoadgenError, Result};
use plotters::style::{register_font, FontStyle};
use std::path::PathBuf;
use std::sync::OnceLock;

/// Where Debian and other distributions put DejaVu Sans.
const CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
];

static LOADED: OnceLock<std::result::Result<(), String>> = OnceLock::new();

/// Registers the font once per process; `HEARTH_FONT` may name another TTF file.
pub fn ensure() -> Result<()> {
    LOADED
        .get_or_init(load)
        .clone()
        .map_err(LoadgenError::Config)
}

fn load() -> std::result::Result<(), String> {
    let path = std::env::var_os("HEARTH_FONT")
        .map(PathBuf::from)
        .or_else(|| {
            CANDIDATES
                .iter()
                .map(PathBuf::from)
                .find(|p| p.is_file())
        })
        .ok_or_else(|| {
            "no font for the plots: install DejaVu Sans (apt-get install fonts-dejavu-core) or set HEARTH_FONT to a .ttf file".to_string()
        })?;
    let bytes = std::fs::read(&path).map_err(|e| format!("font {}: {e}", path.display()))?;
    // plotters keeps fonts for the life of the process; this happens once.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| format!("font {}: not a usable TrueType font", path.display()))
}
