//! The report's pictures: latency CDFs, per-function breakdown of latency, latency and throughput
//! over time. Runs given together share axes, so they compare at a glance.

use super::canvas::{color, png, Area, DrawResult};
use crate::error::Result;
use crate::results::{Outcome, ResultRow};
use crate::summary::{percentile, FunctionSummary};
use plotters::coord::CoordTranslate;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

const SIZE: (u32, u32) = (1400, 820);
const FONT: &str = "sans-serif";

fn fmt_ms(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v >= 100.0 || (v >= 1.0 && v.fract() == 0.0) {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else if v >= 0.01 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// Labels of a log axis only at 1, 2 and 5 × 10^k, so they never crowd.
fn log_label(v: f64) -> String {
    let mantissa = v / 10f64.powf(v.log10().floor());
    if [1.0, 2.0, 5.0, 10.0]
        .iter()
        .any(|m| (mantissa - m).abs() < 1e-6)
    {
        fmt_ms(v)
    } else {
        String::new()
    }
}

/// A line (dashed when `dash` gives dash and gap lengths) with its legend entry.
fn line<'a, CT: CoordTranslate<From = (f64, f64)>>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, CT>,
    points: impl IntoIterator<Item = (f64, f64), IntoIter: Clone>,
    style: ShapeStyle,
    dash: Option<(u32, u32)>,
    label: String,
) -> DrawResult {
    let series = match dash {
        None => chart.draw_series(LineSeries::new(points, style))?,
        Some((size, gap)) => chart.draw_series(DashedLineSeries::new(points, size, gap, style))?,
    };
    let len = if dash.is_some() { 10 } else { 24 };
    series
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + len, y)], style));
    Ok(())
}

/// The series' legend in a framed box at `pos`.
fn legend<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, CT>,
    pos: SeriesLabelPosition,
    font_size: u32,
) -> DrawResult {
    chart
        .configure_series_labels()
        .position(pos)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font((FONT, font_size))
        .draw()?;
    Ok(())
}

/// At most ~2,000 points of a CDF, keeping every point of the top 1 % so the tail is exact.
fn cdf_points(sorted_ms: &[f64]) -> Vec<(f64, f64)> {
    let n = sorted_ms.len();
    let step = (n / 2000).max(1);
    let tail = n - n / 100;
    (0..n)
        .filter(|&i| i % step == 0 || i >= tail)
        .map(|i| (sorted_ms[i], (i + 1) as f64 / n as f64))
        .collect()
}

/// One line per series of e2e latencies (µs).
pub fn latency_cdf(path: &Path, title: &str, series: &[(String, Vec<u64>)]) -> Result<()> {
    let series: Vec<(&String, Vec<f64>)> = series
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(l, v)| {
            let mut ms: Vec<f64> = v.iter().map(|&u| (u.max(1)) as f64 / 1000.0).collect();
            ms.sort_by(f64::total_cmp);
            (l, ms)
        })
        .collect();
    let lo = series.iter().map(|(_, v)| v[0]).fold(f64::MAX, f64::min);
    let hi = series
        .iter()
        .map(|(_, v)| v[v.len() - 1])
        .fold(0.0, f64::max);
    png(path, SIZE, |root: &Area| -> DrawResult {
        let (lo, hi) = if series.is_empty() {
            (0.1, 10.0)
        } else {
            (lo * 0.8, hi * 1.25)
        };
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 30))
            .margin(24)
            .x_label_area_size(70)
            .y_label_area_size(90)
            .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)?;
        chart
            .configure_mesh()
            .x_desc("end-to-end latency (ms, log scale): from the scheduled send to the answer")
            .y_desc("fraction of invocations")
            .x_label_formatter(&|v| log_label(*v))
            .y_label_formatter(&|v| format!("{v:.1}"))
            .light_line_style(TRANSPARENT)
            .label_style((FONT, 18))
            .axis_desc_style((FONT, 20))
            .draw()?;
        for (i, (label, ms)) in series.iter().enumerate() {
            let c = color(i);
            let p = |q| {
                let us: Vec<u64> = ms.iter().map(|m| (m * 1000.0) as u64).collect();
                fmt_ms(percentile(&us, q) as f64 / 1000.0)
            };
            let label = format!(
                "{label}: n={}, p50 {} ms, p99 {} ms",
                ms.len(),
                p(50.0),
                p(99.0)
            );
            line(&mut chart, cdf_points(ms), c.stroke_width(3), None, label)?;
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight, 18)?;
        Ok(())
    })
}

/// The parts of e2e in a breakdown, with their colours.
const PARTS: [(&str, RGBColor); 5] = [
    ("queue (in the worker)", RGBColor(255, 127, 14)),
    ("init (cold start)", RGBColor(214, 39, 40)),
    ("exec (the handler)", RGBColor(31, 119, 180)),
    ("overhead (the worker)", RGBColor(148, 103, 189)),
    ("client, network, send lag", RGBColor(127, 127, 127)),
];

fn parts(f: &FunctionSummary) -> [f64; 5] {
    [
        f.mean_queue_ms,
        f.mean_init_ms,
        f.mean_exec_ms,
        f.mean_overhead_ms,
        f.mean_client_ms,
    ]
}

/// Stacked bars of each function's mean latency parts: in ms (left) and as a share of e2e (right).
pub fn breakdown(path: &Path, title: &str, functions: &[&FunctionSummary]) -> Result<()> {
    // The first function (the most invoked) is drawn at the top.
    let fns: Vec<&FunctionSummary> = functions.iter().rev().copied().collect();
    let names: Vec<String> = fns
        .iter()
        .map(|f| format!("{} (n={})", f.function, f.ok))
        .collect();
    let n = fns.len().max(1);
    let max_total = fns
        .iter()
        .map(|f| parts(f).iter().sum::<f64>())
        .fold(0.0, f64::max)
        .max(1e-3);
    let height = (200 + 44 * n as u32).max(500);
    png(path, (SIZE.0, height), |root: &Area| -> DrawResult {
        let root = root.titled(title, (FONT, 28))?;
        let (legend, root) = root.split_vertically(44);
        let mut x = 280;
        for (part, c) in PARTS {
            legend.draw(&Rectangle::new([(x, 14), (x + 18, 32)], c.filled()))?;
            legend.draw(&Text::new(part, (x + 26, 15), (FONT, 18)))?;
            x += 26
                + legend
                    .estimate_text_size(part, &TextStyle::from((FONT, 18).into_font()))?
                    .0 as i32
                + 30;
        }
        let (left, right) = root.split_horizontally(SIZE.0 * 62 / 100);
        let label = |v: &SegmentValue<usize>| match v {
            SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        };
        for (area, percent) in [(&left, false), (&right, true)] {
            // Room on the right of the longest bar for its value.
            let x_max = if percent { 100.0 } else { max_total * 1.18 };
            let mut chart = ChartBuilder::on(area)
                .margin(16)
                .x_label_area_size(60)
                .y_label_area_size(if percent { 10 } else { 260 })
                .build_cartesian_2d(0.0..x_max, (0..n - 1).into_segmented())?;
            let mut mesh = chart.configure_mesh();
            mesh.disable_y_mesh()
                .light_line_style(TRANSPARENT)
                .y_labels(n + 1)
                .x_desc(if percent {
                    "share of the mean end-to-end latency (%)"
                } else {
                    "mean latency per invocation (ms)"
                })
                .x_label_formatter(&|v| fmt_ms(*v))
                .label_style((FONT, 17))
                .axis_desc_style((FONT, 19));
            if percent {
                mesh.y_label_formatter(&|_| String::new());
            } else {
                mesh.y_label_formatter(&label);
            }
            mesh.draw()?;
            for (k, (_, c)) in PARTS.iter().enumerate() {
                let bars = fns.iter().enumerate().map(|(i, f)| {
                    let p = parts(f);
                    let total = p.iter().sum::<f64>().max(1e-12);
                    let scale = if percent { 100.0 / total } else { 1.0 };
                    let x0 = p[..k].iter().sum::<f64>() * scale;
                    let x1 = x0 + p[k] * scale;
                    let mut r = Rectangle::new(
                        [
                            (x0, SegmentValue::Exact(i)),
                            (x1, SegmentValue::Exact(i + 1)),
                        ],
                        c.filled(),
                    );
                    r.set_margin(6, 6, 0, 0);
                    r
                });
                chart.draw_series(bars)?;
            }
            if !percent {
                // The total as text, so bars too short to see on a shared axis still read.
                chart.draw_series(fns.iter().enumerate().map(|(i, f)| {
                    let total = parts(f).iter().sum::<f64>();
                    Text::new(
                        format!(" {} ms", fmt_ms(total)),
                        (total, SegmentValue::CenterOf(i)),
                        TextStyle::from((FONT, 15).into_font())
                            .pos(Pos::new(HPos::Left, VPos::Center)),
                    )
                }))?;
            }
        }
        Ok(())
    })
}

/// One run's latency and throughput per time bin.
pub struct Timeline {
    pub label: String,
    /// (bin start s, p50 ms, p99 ms) for bins with answers.
    pub latency: Vec<(f64, f64, f64)>,
    /// (bin start s, answered/s, refused or failed/s).
    pub rate: Vec<(f64, f64, f64)>,
}

impl Timeline {
    pub fn of(label: &str, rows: &[ResultRow], bin_s: f64) -> Timeline {
        let bin_us = (bin_s * 1e6).max(1.0) as u64;
        let t0 = rows.iter().map(|r| r.scheduled_us).min().unwrap_or(0);
        let bins = rows
            .iter()
            .map(|r| (r.scheduled_us - t0) / bin_us)
            .max()
            .map_or(0, |b| b as usize + 1);
        let mut e2e: Vec<Vec<u64>> = vec![Vec::new(); bins];
        let mut failed = vec![0usize; bins];
        for r in rows {
            let b = ((r.scheduled_us - t0) / bin_us) as usize;
            if r.outcome == Outcome::Ok {
                e2e[b].push(r.e2e_us);
            } else {
                failed[b] += 1;
            }
        }
        let mut latency = Vec::new();
        let mut rate = Vec::new();
        for (b, mut v) in e2e.into_iter().enumerate() {
            let t = b as f64 * bin_s;
            rate.push((t, v.len() as f64 / bin_s, failed[b] as f64 / bin_s));
            if !v.is_empty() {
                v.sort_unstable();
                latency.push((
                    t,
                    percentile(&v, 50.0).max(1) as f64 / 1000.0,
                    percentile(&v, 99.0).max(1) as f64 / 1000.0,
                ));
            }
        }
        Timeline {
            label: label.into(),
            latency,
            rate,
        }
    }
}

/// p50/p99 latency (top, log scale) and answered/refused rates (bottom) over time.
pub fn over_time(path: &Path, title: &str, bin_s: f64, runs: &[Timeline]) -> Result<()> {
    let t_max = runs
        .iter()
        .flat_map(|r| r.rate.last().map(|p| p.0 + bin_s))
        .fold(bin_s, f64::max);
    let lat = runs.iter().flat_map(|r| r.latency.iter());
    let (lo, hi) = lat.fold((f64::MAX, 0.0f64), |(lo, hi), p| (lo.min(p.1), hi.max(p.2)));
    let (lo, hi) = if hi > 0.0 {
        (lo * 0.7, hi * 1.5)
    } else {
        (0.1, 10.0)
    };
    let r_max = runs
        .iter()
        .flat_map(|r| r.rate.iter().map(|p| p.1.max(p.2)))
        .fold(1.0, f64::max)
        * 1.1;
    let any_failed = runs.iter().any(|r| r.rate.iter().any(|p| p.2 > 0.0));
    png(path, (SIZE.0, 1000), |root: &Area| -> DrawResult {
        let root = root.titled(title, (FONT, 28))?;
        let (top, bottom) = root.split_vertically(560);
        let mut chart = ChartBuilder::on(&top)
            .margin(16)
            .x_label_area_size(50)
            .y_label_area_size(90)
            .build_cartesian_2d(0.0..t_max, (lo..hi).log_scale())?;
        chart
            .configure_mesh()
            .x_desc(format!("time since the start (s), {} bins", fmt_bin(bin_s)))
            .y_desc("end-to-end latency (ms, log)")
            .y_label_formatter(&|v| log_label(*v))
            .light_line_style(TRANSPARENT)
            .label_style((FONT, 17))
            .axis_desc_style((FONT, 19))
            .draw()?;
        for (i, r) in runs.iter().enumerate() {
            let c = color(i);
            let p99 = r.latency.iter().map(|p| (p.0, p.2));
            line(
                &mut chart,
                p99,
                c.stroke_width(3),
                None,
                format!("{}: p99", r.label),
            )?;
            let p50 = r.latency.iter().map(|p| (p.0, p.1));
            let label = format!("{}: p50 (dashed)", r.label);
            line(&mut chart, p50, c.stroke_width(2), Some((8, 5)), label)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight, 16)?;
        let mut chart = ChartBuilder::on(&bottom)
            .margin(16)
            .x_label_area_size(50)
            .y_label_area_size(90)
            .build_cartesian_2d(0.0..t_max, 0.0..r_max)?;
        chart
            .configure_mesh()
            .x_desc("time since the start (s), by scheduled send time")
            .y_desc("invocations / s")
            .label_style((FONT, 17))
            .axis_desc_style((FONT, 19))
            .draw()?;
        for (i, r) in runs.iter().enumerate() {
            let c = color(i);
            let answered = r.rate.iter().map(|p| (p.0, p.1));
            let label = format!("{}: answered", r.label);
            line(&mut chart, answered, c.stroke_width(2), None, label)?;
            if any_failed {
                let failed = r.rate.iter().map(|p| (p.0, p.2));
                let label = format!("{}: refused or failed (dotted)", r.label);
                line(&mut chart, failed, c.stroke_width(2), Some((4, 4)), label)?;
            }
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight, 16)?;
        Ok(())
    })
}

fn fmt_bin(bin_s: f64) -> String {
    if bin_s >= 1.0 {
        format!("{bin_s:.0} s")
    } else {
        format!("{:.0} ms", bin_s * 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdf_points_are_bounded_and_keep_the_tail() {
        let v: Vec<f64> = (0..100_000).map(|i| i as f64).collect();
        let p = cdf_points(&v);
        assert!(p.len() < 3200, "{}", p.len());
        assert_eq!(p.last(), Some(&(99_999.0, 1.0)));
        assert!(p.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
    }
}
