//! The experiments' figures: panels of lines or grouped bars, side by side in one PNG. Log axes
//! are drawn by plotting `log10(v)` on a linear axis and labelling ticks with `v`, which keeps
//! one chart type for every combination of axes.

use crate::error::Result;
use hearth_loadgen::report::canvas::{color, png, Area, DrawResult};
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::prelude::*;
use std::path::Path;

const FONT: &str = "sans-serif";

/// One line.
#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// An axis: its label and whether it is logarithmic.
#[derive(Debug, Clone)]
pub struct Axis {
    pub label: String,
    pub log: bool,
}

impl Axis {
    pub fn linear(label: &str) -> Self {
        Axis {
            label: label.into(),
            log: false,
        }
    }

    pub fn log(label: &str) -> Self {
        Axis {
            label: label.into(),
            log: true,
        }
    }

    fn map(&self, v: f64) -> Option<f64> {
        if self.log {
            (v > 0.0 && v.is_finite()).then(|| v.log10())
        } else {
            v.is_finite().then_some(v)
        }
    }

    /// The label of a tick at (mapped) position `v`.
    fn label_of(&self, v: f64) -> String {
        if self.log {
            // Undo the float noise of log10/powf (50.00000001 → 50).
            let x = 10f64.powf(v);
            let digits = 10f64.powi(5 - x.log10().floor() as i32);
            short((x * digits).round() / digits)
        } else {
            short(v)
        }
    }

    /// Tick positions (mapped) over `[lo, hi]`: 1, 2 and 5 × 10^k on a log axis, round steps
    /// on a linear one.
    fn ticks(&self, lo: f64, hi: f64) -> Vec<f64> {
        if self.log {
            let mut t = Vec::new();
            for k in (lo.floor() as i32 - 1)..=(hi.ceil() as i32) {
                for m in [1.0f64, 2.0, 5.0] {
                    let v = m.log10() + f64::from(k);
                    if v >= lo && v <= hi {
                        t.push(v);
                    }
                }
            }
            return t;
        }
        let raw = (hi - lo) / 6.0;
        if !(raw.is_finite() && raw > 0.0) {
            return vec![lo];
        }
        let mag = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0]
            .iter()
            .map(|m| m * mag)
            .find(|s| *s >= raw)
            .unwrap_or(10.0 * mag);
        let first = (lo / step).ceil() as i64;
        let last = (hi / step).floor() as i64;
        (first..=last).map(|i| i as f64 * step).collect()
    }
}

/// A linear axis whose ticks are given (plotters' own pick positions that are not round on
/// a log scale drawn linearly).
struct Ticked {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl Ticked {
    fn new(lo: f64, hi: f64, ticks: Vec<f64>) -> Self {
        Ticked { lo, hi, ticks }
    }
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let span = self.hi - self.lo;
        if span <= 0.0 {
            return (limit.0 + limit.1) / 2;
        }
        let frac = ((v - self.lo) / span).clamp(-1.0, 2.0);
        limit.0 + ((limit.1 - limit.0) as f64 * frac).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

/// A number in few characters.
pub fn short(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e6 {
        format!("{:.0}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else if a >= 0.01 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// A panel of lines.
#[derive(Debug, Clone)]
pub struct LinePanel {
    pub title: String,
    pub x: Axis,
    pub y: Axis,
    pub series: Vec<Series>,
    /// Draw a marker at each point (sweeps with few points).
    pub markers: bool,
    /// Where the legend goes.
    pub legend: SeriesLabelPosition,
}

/// A panel of grouped bars: one group per category, one bar per series.
#[derive(Debug, Clone)]
pub struct BarPanel {
    pub title: String,
    pub categories: Vec<String>,
    pub y: Axis,
    pub series: Vec<(String, Vec<f64>)>,
}

fn range(values: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return (0.0, 1.0);
    }
    // A flat series still gets a readable axis: half a decade, or ±10 % (0 to 1 for zeros).
    let span = (hi - lo).max(if log { 0.5 } else { (hi.abs() * 0.1).max(1e-9) });
    if !log && hi == lo && hi == 0.0 {
        return (0.0, 1.0);
    }
    let pad = span * 0.06;
    let lo = if !log && lo >= 0.0 { 0.0 } else { lo - pad };
    (lo, hi + pad)
}

/// A titled figure of `panels` side by side, `w`×`h` pixels in all, each drawn by `draw`.
fn figure<P>(
    path: &Path,
    title: &str,
    panels: &[P],
    (w, h): (u32, u32),
    draw: impl Fn(&Area, &P) -> DrawResult,
) -> Result<()> {
    Ok(png(path, (w, h), |root: &Area| -> DrawResult {
        let root = root.titled(title, (FONT, 24))?;
        let areas = root.split_evenly((1, panels.len().max(1)));
        for (panel, area) in panels.iter().zip(areas.iter()) {
            draw(area, panel)?;
        }
        Ok(())
    })?)
}

/// The chart of one panel: caption, margins and the given axes.
type Chart<'a, 'b> = ChartContext<'a, BitMapBackend<'b>, Cartesian2d<Ticked, Ticked>>;

fn chart<'a, 'b: 'a>(
    area: &'a Area<'b>,
    title: &str,
    x: Ticked,
    y: Ticked,
) -> Result<Chart<'a, 'b>, Box<dyn std::error::Error>> {
    Ok(ChartBuilder::on(area)
        .caption(title, (FONT, 19))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x, y)?)
}

/// The series' legend, framed, at `pos`.
fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>, pos: SeriesLabelPosition) -> DrawResult {
    chart
        .configure_series_labels()
        .position(pos)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 13))
        .draw()?;
    Ok(())
}

/// Panels of lines side by side.
pub fn lines(path: &Path, title: &str, panels: &[LinePanel], size: (u32, u32)) -> Result<()> {
    figure(path, title, panels, size, line_panel)
}

fn line_panel(area: &Area, p: &LinePanel) -> DrawResult {
    let mapped: Vec<(String, Vec<(f64, f64)>)> = p
        .series
        .iter()
        .map(|s| {
            let pts = s
                .points
                .iter()
                .filter_map(|(x, y)| Some((p.x.map(*x)?, p.y.map(*y)?)))
                .collect();
            (s.label.clone(), pts)
        })
        .collect();
    let all = || mapped.iter().flat_map(|(_, v)| v.iter());
    let (x0, x1) = range(all().map(|p| p.0), p.x.log);
    let (y0, y1) = range(all().map(|p| p.1), p.y.log);
    let mut chart = chart(
        area,
        &p.title,
        Ticked::new(x0, x1, p.x.ticks(x0, x1)),
        Ticked::new(y0, y1, p.y.ticks(y0, y1)),
    )?;
    chart
        .configure_mesh()
        .x_desc(p.x.label.as_str())
        .y_desc(p.y.label.as_str())
        .x_label_formatter(&|v| p.x.label_of(*v))
        .y_label_formatter(&|v| p.y.label_of(*v))
        .bold_line_style(BLACK.mix(0.12))
        .light_line_style(TRANSPARENT)
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .draw()?;
    for (i, (label, pts)) in mapped.iter().enumerate() {
        let c = color(i);
        let style = c.stroke_width(2);
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), style))?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        if p.markers {
            chart.draw_series(pts.iter().map(|q| Circle::new(*q, 3, c.filled())))?;
        }
    }
    legend(&mut chart, p.legend.clone())
}

/// Panels of grouped bars side by side.
pub fn bars(path: &Path, title: &str, panels: &[BarPanel], size: (u32, u32)) -> Result<()> {
    figure(path, title, panels, size, bar_panel)
}

fn bar_panel(area: &Area, p: &BarPanel) -> DrawResult {
    let n = p.categories.len().max(1);
    let k = p.series.len().max(1);
    let vals = || {
        p.series
            .iter()
            .flat_map(|(_, v)| v.iter().filter_map(|x| p.y.map(*x)))
    };
    let (mut y0, y1) = range(vals(), p.y.log);
    if p.y.log {
        // Bars grow from the bottom of the axis.
        y0 = y0.min(vals().fold(f64::MAX, f64::min) - 0.3);
    }
    let y1 = y1 + (y1 - y0) * 0.12;
    let cats = p.categories.clone();
    let mut chart = chart(
        area,
        &p.title,
        Ticked::new(-0.5, n as f64 - 0.5, (0..n).map(|i| i as f64).collect()),
        Ticked::new(y0, y1, p.y.ticks(y0, y1)),
    )?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(p.y.label.as_str())
        .x_label_formatter(&|v| {
            let i = v.round();
            if (v - i).abs() < 1e-6 && i >= 0.0 {
                cats.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|v| p.y.label_of(*v))
        .bold_line_style(BLACK.mix(0.12))
        .light_line_style(TRANSPARENT)
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .draw()?;
    let width = 0.8 / k as f64;
    for (j, (label, values)) in p.series.iter().enumerate() {
        let c = color(j);
        let rects: Vec<Rectangle<(f64, f64)>> = values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| {
                let top = p.y.map(*v)?;
                let x = i as f64 - 0.4 + j as f64 * width;
                Some(Rectangle::new(
                    [(x, y0), (x + width * 0.92, top)],
                    c.filled(),
                ))
            })
            .collect();
        chart
            .draw_series(rects)?
            .label(label.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled()));
        // The value above each bar, so small differences still read.
        chart.draw_series(values.iter().enumerate().filter_map(|(i, v)| {
            let top = p.y.map(*v)?;
            let x = i as f64 - 0.4 + (j as f64 + 0.46) * width;
            Some(Text::new(
                short(*v),
                (x, top),
                TextStyle::from((FONT, 12).into_font()).pos(
                    plotters::style::text_anchor::Pos::new(
                        plotters::style::text_anchor::HPos::Center,
                        plotters::style::text_anchor::VPos::Bottom,
                    ),
                ),
            ))
        }))?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}

/// The empirical CDF of `values` as points (sorted value, fraction at or below).
pub fn cdf(values: &[f64]) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len().max(1) as f64;
    v.iter()
        .enumerate()
        .map(|(i, x)| (*x, (i + 1) as f64 / n))
        .collect()
}

/// The value at fraction `q` (nearest rank) of sorted-or-not `values`.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v: Vec<f64> = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_at_one_two_five_and_round_steps() {
        let a = Axis::log("x");
        assert_eq!(a.label_of(50f64.log10()), "50");
        assert_eq!(a.label_of(3.0), "1000");
        assert_eq!(a.label_of(0.2f64.log10()), "0.20");
        assert_eq!(a.map(0.0), None, "no log of zero");
        let t: Vec<String> = a.ticks(0.0, 2.0).iter().map(|v| a.label_of(*v)).collect();
        assert_eq!(t, ["1", "2", "5", "10", "20", "50", "100"]);
        let lin = Axis::linear("y");
        assert_eq!(lin.ticks(0.0, 13.0), [0.0, 5.0, 10.0]);
        let t: Vec<String> = lin
            .ticks(0.0, 1.0)
            .iter()
            .map(|v| lin.label_of(*v))
            .collect();
        assert_eq!(t, ["0", "0.20", "0.40", "0.60", "0.80", "1"]);
    }

    #[test]
    fn cdf_and_quantiles() {
        let v = [3.0, 1.0, 2.0, 4.0];
        assert_eq!(cdf(&v), [(1.0, 0.25), (2.0, 0.5), (3.0, 0.75), (4.0, 1.0)]);
        assert_eq!(quantile(&v, 0.5), 2.0);
        assert_eq!(quantile(&v, 1.0), 4.0);
        assert!(quantile(&[], 0.5).is_nan());
    }
}
