//! `--plot` output, decoded rather than only found: a PNG with the right signature and size,
//! axes and text in black and the series in colour; an SVG with text laid out by the embedded
//! font; for a sweep, the latency-against-rate panels; tick labels whole and in a unit a person
//! reads at a glance.

mod common;

use std::path::Path;
use std::time::Duration;

use clap::Parser;
use common::fake::{self, Scenario};
use sluice_loadtest::config::{Args, Config};
use sluice_loadtest::report::Report;
use sluice_loadtest::{plot, session};

async fn run(base: &str, args: &[&str]) -> Report {
    let mut v = vec![
        "sluice-loadtest",
        "--url",
        base,
        "--quiet",
        "--output-len",
        "6",
    ];
    v.extend_from_slice(args);
    session::execute(Config::from_args(Args::try_parse_from(v).unwrap()).unwrap())
        .await
        .unwrap()
}

/// Width, height and RGB(A) pixels of a PNG file.
fn decode(path: &Path) -> (u32, u32, Vec<[u8; 3]>) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let step = match info.color_type {
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        other => panic!("unexpected colour type {other:?}"),
    };
    let px = buf[..info.buffer_size()]
        .chunks(step)
        .map(|c| [c[0], c[1], c[2]])
        .collect();
    (info.width, info.height, px)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn png_and_svg_plots_of_a_run_and_a_sweep() {
    let sc = Scenario {
        ttft: Duration::from_millis(5),
        per_token: Duration::from_millis(2),
        ..Scenario::default()
    };
    let (base, _) = fake::start(sc).await;
    let dir = std::env::temp_dir().join(format!("lt-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let single = run(&base, &["--concurrency", "3", "--requests", "12"]).await;
    let png = dir.join("run.png");
    plot::draw(&single, &png).unwrap();
    let (w, h, px) = decode(&png);
    assert_eq!((w, h), (1200, 900));
    let dark = px.iter().filter(|p| p.iter().all(|&c| c < 80)).count();
    let blue = px
        .iter()
        .filter(|p| p[2] > 200 && p[0] < 60 && p[1] < 60)
        .count();
    let white = px.iter().filter(|p| p.iter().all(|&c| c == 255)).count();
    assert!(dark > 2_000, "axes and text drawn in black: {dark} px");
    assert!(
        blue > 200,
        "the TTFT and tokens/s series drawn in blue: {blue} px"
    );
    assert!(
        white > px.len() / 2,
        "mostly background: {white} of {} px",
        px.len()
    );

    let svg = dir.join("run.svg");
    plot::draw(&single, &svg).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"));
    for title in [
        "TTFT and E2E, CDF",
        "TPOT and ITL, CDF",
        "throughput over time",
        "requests in flight",
    ] {
        assert!(text.contains(title), "missing panel {title}");
    }

    let sweep = run(&base, &["--sweep", "--sweep-steps", "1", "--requests", "6"]).await;
    let png = dir.join("sweep.png");
    plot::draw(&sweep, &png).unwrap();
    let (w, h, px) = decode(&png);
    assert_eq!((w, h), (1200, 520));
    assert!(px.iter().filter(|p| p.iter().all(|&c| c < 80)).count() > 1_000);
    let svg = dir.join("sweep.svg");
    plot::draw(&sweep, &svg).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("TTFT against achieved rate") && text.contains("ITL p99"));
    std::fs::remove_dir_all(&dir).ok();
}

/// The text of every `<text>` element of an SVG.
fn texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let t = &t[t.find('>')? + 1..];
            Some(t[..t.find("</text>")?].trim().to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_ticks_are_whole_and_switch_to_seconds() {
    let sc = Scenario {
        ttft: Duration::from_millis(2),
        per_token: Duration::from_millis(1),
        ..Scenario::default()
    };
    let (base, _) = fake::start(sc).await;
    let mut r = run(&base, &["--concurrency", "4", "--requests", "16"]).await;
    // A slow server's figures: TTFT 1.2-1.4 s, E2E 12-14 s, as llama.cpp's on a CPU.
    for (i, rec) in r.points[0].records.iter_mut().enumerate() {
        rec.ttft_ms = Some(1_200.0 + 12.5 * i as f64);
        rec.e2el_ms = 12_000.0 + 125.0 * i as f64;
    }
    let dir = std::env::temp_dir().join(format!("lt-ticks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("slow.svg");
    plot::draw(&r, &svg).unwrap();
    plot::draw(&r, &dir.join("slow.png")).unwrap();
    let t = texts(&std::fs::read_to_string(&svg).unwrap());
    assert!(
        t.iter().any(|s| s == "latency (s)"),
        "the E2E axis in seconds: {t:?}"
    );
    for tick in ["0", "5", "10", "15"] {
        assert!(t.iter().any(|s| s == tick), "tick {tick} missing: {t:?}");
    }
    assert!(
        !t.iter().any(|s| s.contains("000.0") || s == "12000"),
        "no ms-scale or .0 labels: {t:?}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
