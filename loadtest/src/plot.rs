//! `--plot FILE.svg`: latency CDFs for one run; latency against achieved throughput for a sweep.
//! SVG only (plotters without default features) to keep the build small.

use std::path::Path;

use plotters::prelude::*;

use crate::error::{Error, Result};
use crate::report::Report;

/// Picks one figure of a sweep point.
type Figure = fn(&crate::metrics::Summary) -> f64;

fn perr(e: impl std::fmt::Display) -> Error {
    Error::Plot(e.to_string())
}

/// Draws the report's plot into `path`.
pub fn draw(report: &Report, path: &Path) -> Result<()> {
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(perr)?;
    if report.points.len() > 1 {
        sweep(report, &root)?;
    } else {
        cdfs(report, &root)?;
    }
    root.present().map_err(perr)
}

fn cdfs(report: &Report, root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>) -> Result<()> {
    let recs: Vec<_> = report
        .points
        .iter()
        .flat_map(|p| p.records.iter())
        .filter(|r| r.ok)
        .collect();
    let series: Vec<(&str, Vec<f64>, RGBColor)> = vec![
        (
            "TTFT",
            recs.iter().filter_map(|r| r.ttft_ms).collect(),
            BLUE,
        ),
        ("E2E", recs.iter().map(|r| r.e2el_ms).collect(), RED),
        (
            "TPOT",
            recs.iter().filter_map(|r| r.tpot_ms).collect(),
            GREEN,
        ),
    ];
    let xmax = series
        .iter()
        .flat_map(|(_, v, _)| v.iter().copied())
        .fold(1.0f64, f64::max);
    let mut chart = ChartBuilder::on(root)
        .caption("latency CDF", ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..xmax * 1.05, 0.0..1.0)
        .map_err(perr)?;
    chart
        .configure_mesh()
        .x_desc("ms")
        .y_desc("fraction of requests")
        .draw()
        .map_err(perr)?;
    for (name, mut v, color) in series {
        if v.is_empty() {
            continue;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len() as f64;
        let pts: Vec<(f64, f64)> = v
            .iter()
            .enumerate()
            .map(|(i, &x)| (x, (i + 1) as f64 / n))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, &color))
            .map_err(perr)?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .draw()
        .map_err(perr)?;
    Ok(())
}

fn sweep(
    report: &Report,
    root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
) -> Result<()> {
    let mut pts: Vec<_> = report.points.iter().map(|p| &p.summary).collect();
    pts.sort_by(|a, b| a.request_throughput.total_cmp(&b.request_throughput));
    let xmax = pts
        .iter()
        .map(|s| s.request_throughput)
        .fold(1e-3, f64::max);
    let ymax = pts
        .iter()
        .map(|s| s.ttft.p99.max(s.e2el.median))
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(root)
        .caption("latency against throughput (sweep)", ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..xmax * 1.05, 0.0..ymax * 1.1)
        .map_err(perr)?;
    chart
        .configure_mesh()
        .x_desc("achieved requests/s")
        .y_desc("ms")
        .draw()
        .map_err(perr)?;
    let lines: [(&str, Figure, RGBColor); 4] = [
        ("TTFT p50", |s| s.ttft.median, BLUE),
        ("TTFT p99", |s| s.ttft.p99, CYAN),
        ("E2E p50", |s| s.e2el.median, RED),
        ("TPOT p50", |s| s.tpot.median, GREEN),
    ];
    for (name, f, color) in lines {
        let data: Vec<(f64, f64)> = pts.iter().map(|s| (s.request_throughput, f(s))).collect();
        chart
            .draw_series(LineSeries::new(data.clone(), &color))
            .map_err(perr)?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(data.into_iter().map(|p| Circle::new(p, 3, color.filled())))
            .map_err(perr)?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .draw()
        .map_err(perr)?;
    Ok(())
}
