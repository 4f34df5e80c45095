//! `--plot FILE.svg`: replicas per variant and demand over time, one panel per policy.
//!
//! Text needs a font: the loadtest's embedded DejaVu Sans (Bitstream Vera license, see
//! `loadtest/assets/fonts`), registered with plotters' `ab_glyph` renderer, so drawing works
//! where no font is installed.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Error, Result};
use crate::sim::Run;

const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
];

static FONT: &[u8] = include_bytes!("../../../loadtest/assets/fonts/DejaVuSans.ttf");

/// Binds the family every chart uses to the embedded font, once.
fn register_font() -> bool {
    static DONE: OnceLock<bool> = OnceLock::new();
    *DONE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok()
    })
}

/// Draws the runs: per panel, ready replicas of each variant (solid) and the arrival rate
/// (grey, right-hand scale drawn as a share of the panel's height, labelled with its peak).
pub fn write_svg(path: &Path, runs: &[Run]) -> Result<()> {
    let err = |e: String| Error::Plot {
        path: path.to_path_buf(),
        message: e,
    };
    if !register_font() {
        return Err(err("the embedded font does not load".into()));
    }
    let height = 260 * runs.len().max(1) as u32;
    let root = SVGBackend::new(path, (1000, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let panels = root.split_evenly((runs.len().max(1), 1));
    for (run, area) in runs.iter().zip(panels.iter()) {
        draw_panel(area, run).map_err(err)?;
    }
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

/// One policy's panel: its ready replicas per variant over time, and the arrival rate scaled
/// to the panel's height.
fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    run: &Run,
) -> std::result::Result<(), String> {
    let end_min = run.samples.last().map_or(1.0, |s| s.time_s / 60.0).max(1.0);
    let max_rep = run
        .samples
        .iter()
        .flat_map(|s| s.ready.iter().zip(&s.starting).map(|(a, b)| a + b))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let max_rate = run
        .samples
        .iter()
        .map(|s| s.arrival_rate)
        .fold(0.0, f64::max)
        .max(1e-9);
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "{}: ready replicas per variant; grey: arrivals (peak {:.1} req/s = top)",
                run.policy, max_rate
            ),
            ("sans-serif", 15),
        )
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(40)
        .build_cartesian_2d(0.0..end_min, 0.0..max_rep * 1.1)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("minutes")
        .y_desc("replicas")
        .light_line_style(WHITE)
        .draw()
        .map_err(|e| e.to_string())?;
    let scale = max_rep / max_rate;
    chart
        .draw_series(LineSeries::new(
            run.samples
                .iter()
                .map(|s| (s.time_s / 60.0, s.arrival_rate * scale)),
            RGBColor(170, 170, 170).stroke_width(1),
        ))
        .map_err(|e| e.to_string())?;
    for (i, name) in run.variants.iter().enumerate() {
        if run
            .samples
            .iter()
            .all(|s| s.ready[i] == 0 && s.starting[i] == 0)
        {
            continue;
        }
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(
                run.samples
                    .iter()
                    .map(|s| (s.time_s / 60.0, f64::from(s.ready[i]))),
                colour.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], colour.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(())
}
