//! Drawing into memory and saving as PNG.

use crate::error::{LoadgenError, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

pub type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;
pub type DrawResult = std::result::Result<(), Box<dyn std::error::Error>>;

/// Tableau 10: distinct, colour-blind-friendly series colours.
pub const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

pub fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Draws a `w`×`h` picture with `draw` and writes it to `path` as PNG.
pub fn png(path: &Path, (w, h): (u32, u32), draw: impl FnOnce(&Area) -> DrawResult) -> Result<()> {
    super::font::ensure()?;
    let plot_err = |m: String| LoadgenError::Plot {
        path: path.to_path_buf(),
        message: m,
    };
    let mut buf = vec![255u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| plot_err(e.to_string()))?;
        draw(&root).map_err(|e| plot_err(e.to_string()))?;
        root.present().map_err(|e| plot_err(e.to_string()))?;
    }
    let file = std::fs::File::create(path).map_err(|e| LoadgenError::io(path, e))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    // Flat-coloured plots compress ~4× better unfiltered at the best level than with the
    // defaults, which keeps committed figures small.
    enc.set_filter(png::FilterType::NoFilter);
    enc.set_compression(png::Compression::Best);
    enc.write_header()
        .and_then(|mut wr| wr.write_image_data(&buf))
        .map_err(|e| plot_err(format!("writing PNG: {e}")))
}
