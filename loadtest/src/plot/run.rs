//! One run on four panels: CDFs of TTFT and E2E, CDFs of TPOT and ITL (their scales differ by
//! orders of magnitude from the first pair), output tokens/s and requests/s over time, and
//! requests in flight over time (see [`crate::timeline`]).

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{axis_max, legend, perr, tick_format, time_unit, FAMILY, TICKS};
use crate::error::Result;
use crate::metrics::Record;
use crate::report::Report;
use crate::timeline::Timeline;

pub(super) fn draw<DB: DrawingBackend>(report: &Report, root: &DrawingArea<DB, Shift>) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let point = &report.points[0];
    let ok: Vec<&Record> = point.records.iter().filter(|r| r.ok).collect();
    let panels = root.split_evenly((2, 2));
    cdf(
        &panels[0],
        "TTFT and E2E, CDF",
        vec![
            ("TTFT", ok.iter().filter_map(|r| r.ttft_ms).collect(), BLUE),
            ("E2E", ok.iter().map(|r| r.e2el_ms).collect(), RED),
        ],
    )?;
    cdf(
        &panels[1],
        "TPOT and ITL, CDF",
        vec![
            ("TPOT", ok.iter().filter_map(|r| r.tpot_ms).collect(), GREEN),
            (
                "ITL",
                ok.iter().flat_map(|r| r.itl_ms.iter().copied()).collect(),
                MAGENTA,
            ),
        ],
    )?;
    let tl = Timeline::of(&point.records, point.summary.duration);
    throughput(&panels[2], &tl)?;
    in_flight(&panels[3], &tl)
}

fn cdf<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    series: Vec<(&str, Vec<f64>, RGBColor)>,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let (unit, size) = time_unit(axis_max(series.iter().flat_map(|s| s.1.iter().copied())));
    let xmax = axis_max(series.iter().flat_map(|s| s.1.iter().map(|v| v / size)));
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FAMILY, 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..xmax, 0.0..1.0)
        .map_err(perr)?;
    chart
        .configure_mesh()
        .x_desc(format!("latency ({unit})"))
        .y_desc("fraction")
        .x_labels(TICKS)
        .y_labels(TICKS)
        .x_label_formatter(&tick_format(xmax))
        .y_label_formatter(&tick_format(1.0))
        .label_style((FAMILY, 13))
        .draw()
        .map_err(perr)?;
    for (name, v, color) in series {
        if v.is_empty() {
            continue;
        }
        let mut v: Vec<f64> = v.iter().map(|x| x / size).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len() as f64;
        // A step per sample: the fraction at or below each value.
        let pts = v
            .iter()
            .enumerate()
            .flat_map(|(i, &x)| [(x, i as f64 / n), (x, (i + 1) as f64 / n)]);
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(perr)?
            .label(name)
            .legend(legend(color));
    }
    labels(&mut chart)
}

fn throughput<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, tl: &Timeline) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let n = tl.tokens_per_s.len();
    let xmax = tl.bucket_s * n as f64;
    let steps = |v: &[f64]| buckets(v, tl.bucket_s);
    let (ymax, y2max) = (
        axis_max(tl.tokens_per_s.iter().copied()),
        axis_max(tl.requests_per_s.iter().copied()),
    );
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "throughput over time ({} buckets)",
                bucket_name(tl.bucket_s)
            ),
            (FAMILY, 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .right_y_label_area_size(60)
        .build_cartesian_2d(0.0..xmax, 0.0..ymax)
        .map_err(perr)?
        .set_secondary_coord(0.0..xmax, 0.0..y2max);
    chart
        .configure_mesh()
        .x_desc("s since start")
        .y_desc("output tokens/s")
        .x_labels(TICKS)
        .y_labels(TICKS)
        .x_label_formatter(&tick_format(xmax))
        .y_label_formatter(&tick_format(ymax))
        .label_style((FAMILY, 13))
        .draw()
        .map_err(perr)?;
    chart
        .configure_secondary_axes()
        .y_desc("requests/s")
        .y_labels(TICKS)
        .y_label_formatter(&tick_format(y2max))
        .label_style((FAMILY, 13))
        .draw()
        .map_err(perr)?;
    chart
        .draw_series(LineSeries::new(
            steps(&tl.tokens_per_s),
            BLUE.stroke_width(2),
        ))
        .map_err(perr)?
        .label("output tokens/s (left)")
        .legend(legend(BLUE));
    chart
        .draw_secondary_series(LineSeries::new(
            steps(&tl.requests_per_s),
            RED.stroke_width(2),
        ))
        .map_err(perr)?
        .label("requests/s (right)")
        .legend(legend(RED));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FAMILY, 13))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(perr)
}

/// Per-bucket values as a step line: each value held across its bucket.
fn buckets(v: &[f64], width: f64) -> Vec<(f64, f64)> {
    v.iter()
        .enumerate()
        .flat_map(|(i, &y)| [(i as f64 * width, y), ((i + 1) as f64 * width, y)])
        .collect()
}

/// A bucket width as a person says it: `2.5 s`, `280 ms`, `4.2 ms`.
fn bucket_name(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.1} s")
    } else if s >= 0.01 {
        format!("{:.0} ms", s * 1e3)
    } else {
        format!("{:.1} ms", s * 1e3)
    }
}

fn in_flight<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, tl: &Timeline) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let xmax = axis_max(tl.in_flight.iter().map(|s| s.0));
    let ymax = axis_max(tl.in_flight.iter().map(|s| s.1 as f64));
    let mut chart = ChartBuilder::on(area)
        .caption("requests in flight", (FAMILY, 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..xmax, 0.0..ymax)
        .map_err(perr)?;
    chart
        .configure_mesh()
        .x_desc("s since start")
        .y_desc("in flight")
        .x_labels(TICKS)
        // Whole requests: at most one tick per request, so no tick falls between two.
        .y_labels((ymax.floor() as usize + 1).clamp(2, TICKS))
        .x_label_formatter(&tick_format(xmax))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FAMILY, 13))
        .draw()
        .map_err(perr)?;
    let mut pts = Vec::with_capacity(tl.in_flight.len() * 2);
    let mut prev = 0.0;
    for &(t, level) in &tl.in_flight {
        pts.push((t, prev));
        pts.push((t, level as f64));
        prev = level as f64;
    }
    chart
        .draw_series(LineSeries::new(pts, GREEN.stroke_width(2)))
        .map_err(perr)?;
    Ok(())
}

fn labels<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font((FAMILY, 13))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(perr)
}
