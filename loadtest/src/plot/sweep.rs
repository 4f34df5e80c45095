//! A sweep's curve: TTFT and ITL percentiles (p50, p99) against the request rate each point
//! achieved, so the knee where latency leaves its floor is visible. Points are joined in the
//! order of offered load (synchronous, the rates, max throughput), not sorted by achieved rate:
//! a server that collapses under a higher offered rate then shows as the curve turning back.

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{axis_max, legend, perr, tick_format, time_unit, FAMILY, TICKS};
use crate::error::Result;
use crate::metrics::Summary;
use crate::report::Report;

type Figure = fn(&Summary) -> f64;

pub(super) fn draw<DB: DrawingBackend>(report: &Report, root: &DrawingArea<DB, Shift>) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let pts: Vec<&Summary> = report.points.iter().map(|p| &p.summary).collect();
    let panels = root.split_evenly((1, 2));
    let ttft: [(&str, Figure, RGBColor); 2] = [
        ("TTFT p50", |s| s.ttft.median, BLUE),
        ("TTFT p99", |s| s.ttft.p99, CYAN),
    ];
    let itl: [(&str, Figure, RGBColor); 3] = [
        ("ITL p50", |s| s.itl.median, RED),
        ("ITL p99", |s| s.itl.p99, MAGENTA),
        ("TPOT p50", |s| s.tpot.median, GREEN),
    ];
    panel(&panels[0], "TTFT against achieved rate", &pts, &ttft)?;
    panel(&panels[1], "ITL and TPOT against achieved rate", &pts, &itl)
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    pts: &[&Summary],
    lines: &[(&str, Figure, RGBColor)],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let xmax = axis_max(pts.iter().map(|s| s.request_throughput));
    let (unit, size) = time_unit(axis_max(
        pts.iter().flat_map(|s| lines.iter().map(move |l| (l.1)(s))),
    ));
    let ymax = axis_max(
        pts.iter()
            .flat_map(|s| lines.iter().map(move |l| (l.1)(s) / size)),
    );
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FAMILY, 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..xmax, 0.0..ymax)
        .map_err(perr)?;
    chart
        .configure_mesh()
        .x_desc("achieved requests/s")
        .y_desc(format!("latency ({unit})"))
        .x_labels(TICKS)
        .y_labels(TICKS)
        .x_label_formatter(&tick_format(xmax))
        .y_label_formatter(&tick_format(ymax))
        .label_style((FAMILY, 13))
        .draw()
        .map_err(perr)?;
    for &(name, f, color) in lines {
        let data: Vec<(f64, f64)> = pts
            .iter()
            .map(|s| (s.request_throughput, f(s) / size))
            .collect();
        chart
            .draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))
            .map_err(perr)?
            .label(name)
            .legend(legend(color));
        chart
            .draw_series(data.into_iter().map(|p| Circle::new(p, 3, color.filled())))
            .map_err(perr)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FAMILY, 13))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(perr)
}
