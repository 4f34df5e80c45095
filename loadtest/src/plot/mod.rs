//! `--plot FILE.svg|png`: for one run, latency CDFs and throughput and in-flight requests over
//! time ([`run`]); for a sweep, latency percentiles against the achieved rate ([`sweep`]).
//!
//! Text needs a font. Rather than find one on the user's machine at run time (and fail where
//! there is none, as in a slim container), DejaVu Sans is compiled in (`assets/fonts`, Bitstream
//! Vera license, see `LICENSE-DejaVu.txt`) and drawn with plotters' `ab_glyph` renderer, so SVG
//! layout and PNG rasterising behave the same everywhere.

mod run;
mod sweep;

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Error, Result};
use crate::report::Report;

/// Output formats, chosen by the file's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
}

impl Format {
    /// The format a path asks for, if it is one we draw.
    pub fn of(path: &Path) -> Option<Self> {
        match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
            "svg" => Some(Self::Svg),
            "png" => Some(Self::Png),
            _ => None,
        }
    }
}

/// The family name every chart uses; [`register_font`] binds it to the embedded font.
const FAMILY: &str = "sans-serif";
static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

fn register_font() -> Result<()> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE
        .get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    ok.then_some(())
        .ok_or_else(|| Error::Plot("the embedded font does not load".into()))
}

fn perr(e: impl std::fmt::Display) -> Error {
    Error::Plot(e.to_string())
}

/// Draws the report's plot into `path`, as SVG or PNG by its extension.
pub fn draw(report: &Report, path: &Path) -> Result<()> {
    register_font()?;
    let format = Format::of(path)
        .ok_or_else(|| Error::Plot(format!("{}: want .svg or .png", path.display())))?;
    let size = if report.points.len() > 1 {
        (1200, 520)
    } else {
        (1200, 900)
    };
    match format {
        Format::Svg => render(report, SVGBackend::new(path, size).into_drawing_area()),
        Format::Png => render(report, BitMapBackend::new(path, size).into_drawing_area()),
    }
}

fn render<DB: DrawingBackend>(report: &Report, root: DrawingArea<DB, Shift>) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(perr)?;
    if report.points.len() > 1 {
        sweep::draw(report, &root)?;
    } else {
        run::draw(report, &root)?;
    }
    root.present().map_err(perr)
}

/// A line's legend mark.
fn legend(color: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
}

/// Ticks per axis: few enough that labels never run into each other on a half-width panel.
const TICKS: usize = 6;

/// The unit for a time axis whose values run up to `max_ms`: ms while they stay within 10 s,
/// else seconds. Returns the unit's name and its size in ms.
fn time_unit(max_ms: f64) -> (&'static str, f64) {
    if max_ms > 10_000.0 {
        ("s", 1e3)
    } else {
        ("ms", 1.0)
    }
}

/// Tick labels for an axis from 0 to `max`: as many decimals as the tick spacing needs, so
/// whole numbers wherever the ticks are whole.
fn tick_format(max: f64) -> impl Fn(&f64) -> String {
    let decimals = (-tick_step(max).log10() - 1e-9).ceil().max(0.0) as usize;
    move |v| format!("{v:.decimals$}")
}

/// The spacing plotters gives at most [`TICKS`] ticks over 0..`max`: the smallest 1, 2 or 5
/// times a power of ten that leaves no more than that many.
fn tick_step(max: f64) -> f64 {
    if !(max > 0.0 && max.is_finite()) {
        return 1.0;
    }
    let mut power = (max / TICKS as f64).log10().floor() - 1.0;
    loop {
        for m in [1.0, 2.0, 5.0] {
            let step = m * 10f64.powf(power);
            if ((max / step).floor() as usize) < TICKS {
                return step;
            }
        }
        power += 1.0;
    }
}

/// Upper end of an axis holding `values` (never empty or zero-width).
fn axis_max(values: impl IntoIterator<Item = f64>) -> f64 {
    let m = values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    if m > 0.0 {
        m * 1.08
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_labels_carry_only_the_decimals_their_spacing_needs() {
        assert_eq!(tick_step(15_120.0), 5_000.0);
        assert_eq!(tick_format(15_120.0)(&10_000.0), "10000");
        assert_eq!(tick_step(15.12), 5.0);
        assert_eq!(tick_format(15.12)(&5.0), "5");
        assert_eq!(tick_step(2.16), 0.5);
        assert_eq!(tick_format(2.16)(&1.5), "1.5");
        assert_eq!(tick_format(1.0)(&0.2), "0.2");
        assert_eq!(tick_format(0.054)(&0.01), "0.01");
        assert_eq!(time_unit(9_000.0), ("ms", 1.0));
        assert_eq!(time_unit(14_000.0), ("s", 1e3));
    }
}
