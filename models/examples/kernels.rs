//! `make bench-kernels`: each quantized matrix kernel alone, on cache-resident random operands,
//! in billions of multiply-adds per second per thread. Separates a kernel's own throughput from
//! everything around it in a forward step (threads, attention, memory), which `make bench` mixes.

use std::time::Instant;

use clap::Parser;
use half::f16;
use sluice_models::kernels::attention::{attend, KvView};
use sluice_models::kernels::dot::best_path;
use sluice_models::kernels::qmatmul::{qmatmul, QPath, QWeights};
use sluice_models::kernels::quant::{Q4_1Matrix, Q8_0Matrix, QuantActs, QK};
use sluice_models::kernels::testdata::{q4_1_raw, q8_0_raw, Rng};

#[derive(Parser, Debug)]
struct Args {
    /// Activation rows per call (a decode batch, or prefill tokens).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,16,64")]
    rows: Vec<usize>,
    /// Threads in the pool the kernels run on.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Context lengths for the attention kernel (one query head, this model's head shape).
    #[arg(long, value_delimiter = ',', default_value = "512")]
    contexts: Vec<usize>,
    /// Rotate through enough copies of each weight matrix (64 MiB), and sequences of a 64 MiB
    /// KV pool, that every call reads its weights or cache from DRAM, as a forward step does,
    /// instead of from cache.
    #[arg(long)]
    cold: bool,
    /// Seconds to spend on each measurement (best of its repetitions is printed).
    #[arg(long, default_value_t = 0.3)]
    seconds: f64,
}

fn q4_1(n: usize, k: usize, rng: &mut Rng) -> Q4_1Matrix {
    Q4_1Matrix::from_q4_1(&q4_1_raw(n, k, rng), n, k).expect("valid Q4_1 blocks")
}

fn q8_0(n: usize, k: usize, rng: &mut Rng) -> Q8_0Matrix {
    Q8_0Matrix::from_q8_0(&q8_0_raw(n, k, rng, false), n, k).expect("valid Q8_0 blocks")
}

/// `best` of repeated runs of `f` over `seconds`.
fn best_of(seconds: f64, mut f: impl FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < seconds {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

/// Query heads of this model (head_dim 64, 3 KV heads, blocks of 16) against `ctx`
/// positions whose blocks are scattered, as a decode step reads them.
fn attention(args: &Args, rng: &mut Rng) {
    let (hd, kv_heads, bs) = (64, 3, 16);
    for &ctx in &args.contexts {
        let blocks = ctx.div_ceil(bs);
        // With --cold, a pool of 64 MiB per K and V whose sequences' blocks are scattered
        // through it, one sequence per call in turn, so that every call reads from DRAM as a
        // batched decode step does; otherwise one sequence, cache resident.
        let block_bytes = kv_heads * bs * hd * 2;
        let pool_blocks = if args.cold {
            ((64 << 20) / block_bytes).max(blocks)
        } else {
            blocks
        };
        let len = pool_blocks * kv_heads * bs * hd;
        let k: Vec<u16> = (0..len).map(|_| f16::from_f32(rng.f()).to_bits()).collect();
        let v: Vec<u16> = (0..len).map(|_| f16::from_f32(rng.f()).to_bits()).collect();
        let view = KvView {
            k: &k,
            v: &v,
            block_size: bs,
            kv_heads,
            head_dim: hd,
        };
        let mut order: Vec<u32> = (0..pool_blocks as u32).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.next_u32() as usize % (i + 1));
        }
        let tables: Vec<&[u32]> = order.chunks_exact(blocks).collect();
        // One query head alone, and this model's three sharing a KV head.
        for heads in [1, 3] {
            let q: Vec<f32> = (0..heads * hd).map(|_| rng.f()).collect();
            let (mut scores, mut out) = (Vec::new(), vec![0f32; heads * hd]);
            let path = best_path();
            let mut next = 0;
            let best = best_of(args.seconds, || {
                next = (next + 1) % tables.len();
                attend(
                    path,
                    &q,
                    &view,
                    1,
                    tables[next],
                    ctx,
                    0.125,
                    &mut scores,
                    &mut out,
                )
            }) / heads as f64;
            let flop = 4.0 * (ctx * hd) as f64;
            println!(
                "  attention {path:?} head_dim={hd} ctx={ctx:<5} heads={heads} {:>8.2} µs per head  {:>6.2} GFLOP/s",
                best * 1e6,
                flop / best / 1e9
            );
        }
    }
}

fn main() {
    let args = Args::parse();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build()
        .expect("a compute pool");
    let mut rng = Rng(7);
    attention(&args, &mut rng);
    // This model's projections: gate/up (1536 × 576) and down (576 × 1536).
    let shapes = [(1536, 576), (576, 1536)];
    println!(
        "kernel GMAC/s per thread ({} threads), paths {:?}",
        args.threads,
        QPath::available()
    );
    for (n, k) in shapes {
        let copies = if args.cold {
            (64 << 20) / (n * k / QK * 24) + 1
        } else {
            1
        };
        let w4: Vec<Q4_1Matrix> = (0..copies).map(|_| q4_1(n, k, &mut rng)).collect();
        let w8: Vec<Q8_0Matrix> = (0..copies).map(|_| q8_0(n, k, &mut rng)).collect();
        for &rows in &args.rows {
            let x: Vec<f32> = (0..rows * k).map(|_| rng.f() * 4.0).collect();
            let mut acts = QuantActs::default();
            QuantActs::quantize(&x, rows, k, &mut acts);
            let mut out = vec![0f32; rows * n];
            let q4: Vec<QWeights<'_>> = w4.iter().map(QWeights::Q4_1).collect();
            let q8: Vec<QWeights<'_>> = w8.iter().map(QWeights::Q8_0).collect();
            for (name, ws) in [("q4_1", &q4), ("q8_0", &q8)] {
                for path in QPath::available().into_iter().skip(1) {
                    let mut next = 0;
                    let best = best_of(args.seconds, || {
                        next = (next + 1) % ws.len();
                        qmatmul(&pool, path, &acts, ws[next], &mut out)
                    });
                    let gmac = (rows * n * k) as f64 / best / 1e9 / args.threads as f64;
                    println!(
                        "  {name} {path:?} n={n:<5} k={k:<5} rows={rows:<3} {gmac:>7.2} GMAC/s  {:>8.1} µs",
                        best * 1e6
                    );
                }
            }
        }
    }
}
