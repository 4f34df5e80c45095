//! Time to read a real replica's `/metrics` (the busy capture in `tests/testdata`, 27 kB,
//! 336 lines) the three ways readers do: the gateway's load poll (`ReplicaLoad::from_text`),
//! every sample borrowed (`samples`), and every sample owned (`parse`, the autoscaler's).
//!
//! `cargo run --release -p sluice-metrics --example bench_parse`

use std::hint::black_box;
use std::time::Instant;

use sluice_metrics::exposition::{parse, samples};
use sluice_metrics::ReplicaLoad;

const BUSY: &str = include_str!("../tests/testdata/replica-busy.metrics");

/// The best of five rounds of `n` calls, in microseconds per call.
fn best_us<T>(n: u32, mut f: impl FnMut() -> T) -> f64 {
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                black_box(f());
            }
            t.elapsed().as_secs_f64() / f64::from(n) * 1e6
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let text = black_box(BUSY);
    println!("{} bytes, {} lines", text.len(), text.lines().count());
    let n = 2000;
    let rows = [
        (
            "ReplicaLoad::from_text",
            best_us(n, || ReplicaLoad::from_text(text)),
        ),
        ("samples().count()", best_us(n, || samples(text).count())),
        ("parse()", best_us(n, || parse(text).map(|s| s.len()))),
    ];
    for (what, us) in rows {
        println!("{what:<24} {us:>7.1} µs");
    }
}
