//! Small operations on one row of logits that tests, examples and the engine's sampler share:
//! argmax, the softmax's normaliser and weights, log-softmax, the top-k most likely tokens and
//! the walk that turns a uniform number into a token; and how far apart two sets of rows are.
//!
//! A row is 49,152 logits for the default model and 128,256 for Llama-3, and a batch-64 step
//! samples 64 of them, so the exponentials here run vectorised ([`exp_le_zero`]): with the C
//! library's `exp` one row took ~0.45 ms on the default model's vocabulary, 29 ms a step.

use std::cmp::Ordering;

/// Index of the largest logit (the first one on ties, as llama.cpp's greedy sampler does; 0
/// when every logit is NaN). The maximum first, then the first 64-token block holding it,
/// then its place there: the first two passes vectorise where one pass tracking the index
/// does not (16 µs against 21 µs on a 49k row).
pub fn argmax(logits: &[f32]) -> u32 {
    const BLOCK: usize = 64;
    let max = max(logits);
    for (b, block) in logits.chunks(BLOCK).enumerate() {
        if block.iter().fold(false, |found, &v| found | (v == max)) {
            let at = block.iter().position(|&v| v == max).unwrap_or(0);
            return (b * BLOCK + at) as u32;
        }
    }
    0
}

/// The largest logit (negative infinity for an empty row or one with every token masked).
pub fn max(logits: &[f32]) -> f32 {
    logits.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// `out[i] = e^((logits[i] - max) × scale)`: the softmax's weights relative to the most likely
/// token's (`max` is the row's largest logit, `scale` > 0 the inverse temperature), 0 for a
/// masked (negative infinity) logit.
pub fn softmax_weights(logits: &[f32], max: f32, scale: f32, out: &mut Vec<f32>) {
    out.clear();
    out.extend(logits.iter().map(|&v| exp_le_zero((v - max) * scale)));
}

/// `Σ f(x)` over `xs`, for `f(x)` in [0, 1]: sixteen f32 partial sums that the loop
/// vectorises (one running f64 sum is a chain of dependent additions the compiler may not
/// reorder, 3× slower on a 49k row), each summing 16 terms before it is added into an f64,
/// so the rounding stays below 1e-6 of the total.
pub fn sum_of(xs: &[f32], f: impl Fn(f32) -> f32) -> f64 {
    const LANES: usize = 16;
    let mut total = 0f64;
    let blocks = xs.chunks_exact(LANES * LANES);
    let rest = blocks.remainder();
    for block in blocks {
        let mut acc = [0f32; LANES];
        for c in block.chunks_exact(LANES) {
            for (a, &x) in acc.iter_mut().zip(c) {
                *a += f(x);
            }
        }
        total += acc.iter().map(|&a| f64::from(a)).sum::<f64>();
    }
    total + rest.iter().map(|&x| f64::from(f(x))).sum::<f64>()
}

/// `ln Σ e^logit` over the row: log-probabilities are logits minus it.
pub fn log_normaliser(logits: &[f32]) -> f32 {
    let max = max(logits);
    if max == f32::NEG_INFINITY {
        return max;
    }
    sum_of(logits, |v| exp_le_zero(v - max)).ln() as f32 + max
}

/// Natural-log softmax over the whole row.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let log_z = log_normaliser(logits);
    logits.iter().map(|v| v - log_z).collect()
}

/// The `k` most likely tokens, most likely first (the lower token id first on ties): one
/// pass that keeps the best `k` seen so far, for the small `k` that logprobs (at most 20) and
/// usual top-k sampling ask for (each insertion moves up to `k` entries).
pub fn top_k(logits: &[f32], k: usize) -> Vec<u32> {
    let k = k.min(logits.len());
    if k == 0 {
        return Vec::new();
    }
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    for (i, &v) in logits.iter().enumerate() {
        // A plain comparison: total_cmp costs 1.5× the scan. NaN is never kept.
        let full = best.len() == k;
        if v.is_nan() || full && v.partial_cmp(&best[k - 1].0) != Some(Ordering::Greater) {
            continue;
        }
        // After every kept value at least as large: ties keep the lower id first.
        let at = best.partition_point(|b| b.0.total_cmp(&v).is_ge());
        best.insert(at, (v, i as u32));
        best.truncate(k);
    }
    best.into_iter().map(|(_, i)| i).collect()
}

/// `token`'s rank in the row: 1 for the most likely, 1 + the ids strictly more likely
/// otherwise (ties share the better rank; NaN counts as less likely), as vLLM reports ranks.
pub fn rank_of(logits: &[f32], token: u32) -> u32 {
    let v = logits[token as usize];
    1 + logits.iter().filter(|&&x| x > v).count() as u32
}

/// The `k` most likely tokens with their log-probabilities, most likely first.
pub fn top_logprobs(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let top = top_k(logits, k);
    if top.is_empty() {
        return Vec::new();
    }
    let log_z = log_normaliser(logits);
    top.into_iter()
        .map(|i| (i, logits[i as usize] - log_z))
        .collect()
}

/// `e^x` for `x` ≤ 0 (what the softmax's shifted logits are), within 1e-7 of the exact value
/// relative to it, and exactly 0 below -87 (negative infinity included), where f32 has only
/// subnormals left.
///
/// Written as plain arithmetic so the compiler vectorises a loop over a row: `2^n · 2^f` with
/// `n` the nearest integer to `x / ln 2` (rounded by adding and subtracting 1.5 · 2^23, which
/// needs no rounding instruction) and `2^f = e^y` for |y| ≤ ln 2 / 2 by its Taylor series to
/// the 7th power (the remainder is below 3e-9). The C library's `exp` is a call the loop
/// cannot vectorise; the `wide` crate's `f32x8::exp` would do, but one function is less to
/// carry than a SIMD dependency the workspace uses nowhere else.
#[inline]
pub fn exp_le_zero(x: f32) -> f32 {
    // 1.5 × 2^23: adding it leaves n in the low bits.
    const ROUND: f32 = 12_582_912.0;
    // ln 2 in two parts (Cody and Waite): n × LN2_HI is exact, so y keeps its precision at
    // large |n|, where x - n × ln 2 in one step would lose ~5e-6 of it.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Comparisons and bit operations only, which vectorise (`f32::max` and `as i32` carry
    // NaN and saturation rules that do not).
    let x = if x < -88.0 { -88.0 } else { x };
    let k = x * std::f32::consts::LOG2_E + ROUND;
    let n = k - ROUND;
    let y = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + y * (1.0
            + y * (1.0 / 2.0
                + y * (1.0 / 6.0
                    + y * (1.0 / 24.0 + y * (1.0 / 120.0 + y * (1.0 / 720.0 + y / 5040.0))))));
    // k's bits are ROUND's plus n; n + 127 ≥ 0 is 2^n's biased exponent.
    let biased = k.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127);
    let scale = f32::from_bits(biased << 23);
    if x > -87.0 {
        p * scale
    } else {
        0.0
    }
}

/// Tokens per block of a row's weights that a draw skips whole by its sum ([`pick_in_row`]);
/// a model that draws on its device sums the same blocks there.
pub const DRAW_BLOCK: usize = 256;

/// The token whose share of `total` holds `uniform × total`, walking `weighted` in order;
/// `None` when rounding leaves the walk short of it.
pub fn pick(weighted: impl Iterator<Item = (u32, f32)>, total: f64, uniform: f64) -> Option<u32> {
    let mut r = uniform * total;
    let mut last = None;
    for (i, w) in weighted {
        let w = f64::from(w);
        if w > 0.0 {
            if r < w {
                return Some(i);
            }
            last = Some(i);
        }
        r -= w;
    }
    last
}

/// The block of [`DRAW_BLOCK`] tokens whose share of the row holds `uniform` of its weight,
/// given each block's sum, and where in that block the draw falls (a uniform number for
/// [`pick`] over the block); `None` when no block has weight.
pub fn block_of(sums: &[f64], uniform: f64) -> Option<(usize, f64)> {
    let mut r = uniform * sums.iter().sum::<f64>();
    let mut last = None;
    for (b, &sum) in sums.iter().enumerate() {
        if sum <= 0.0 {
            continue;
        }
        if r < sum {
            // Within the block's own total, so rounding cannot carry the walk past it.
            return Some((b, r / sum));
        }
        r -= sum;
        last = Some(b);
    }
    // Rounding left the draw past the last block: its last token of any weight.
    last.map(|b| (b, 1.0))
}

/// [`pick`] over a whole row of weights in token order: it skips whole blocks by their
/// (vectorised) sums and walks token by token only inside the block that holds the draw.
pub fn pick_in_row(w: &[f32], uniform: f64) -> Option<u32> {
    let sums: Vec<f64> = w.chunks(DRAW_BLOCK).map(|b| sum_of(b, |x| x)).collect();
    let (b, within) = block_of(&sums, uniform)?;
    let start = b * DRAW_BLOCK;
    let block = &w[start..(start + DRAW_BLOCK).min(w.len())];
    pick((start as u32..).zip(block.iter().copied()), sums[b], within)
}

/// A draw over the whole row `l` from its softmax at inverse temperature `scale`, weights
/// below `floor` relative to the most likely id's left out ([`pick_in_row`]): the engine's
/// sampler's draw without top-k or top-p, and what a model that draws on its device
/// reproduces. The argmax when the row has no weights to draw by (a logit of +∞, every one
/// −∞, or not a number) or rounding leaves the walk short.
pub fn draw_in_row(l: &[f32], scale: f32, floor: f32, uniform: f64) -> u32 {
    let max = max(l);
    if !max.is_finite() {
        return argmax(l);
    }
    let mut w = Vec::new();
    softmax_weights(l, max, scale, &mut w);
    if floor > 0.0 {
        w.iter_mut().filter(|x| **x < floor).for_each(|x| *x = 0.0);
    }
    pick_in_row(&w, uniform).unwrap_or_else(|| argmax(l))
}

/// Whether a row's most likely ids `top` (`(id, logit)`, most likely first) hold the nucleus
/// that `top_p` keeps at inverse temperature `scale`: their weights (`e^((logit − max) ·
/// scale)`, the first's 1) reach `top_p` of `mass`, the whole row's. Then the nucleus, the
/// fewest most likely ids that reach it, is among them. Not when the row has no weights to
/// draw by (a logit of +∞, or none finite).
pub fn holds_nucleus(top: &[(u32, f32)], scale: f32, mass: f32, top_p: f32) -> bool {
    let Some(&(_, max)) = top.first().filter(|t| t.1.is_finite()) else {
        return false;
    };
    let held: f64 = top
        .iter()
        .map(|&(_, l)| f64::from(exp_le_zero((l - max) * scale)))
        .sum();
    held >= f64::from(top_p) * f64::from(mass)
}

/// The largest absolute difference between two equally shaped sets of rows (the
/// log-probabilities or attention outputs of two backends or attention paths).
pub fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len(), "as many rows");
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0f32, f32::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_counts_the_ids_strictly_more_likely() {
        let logits = [1.0, 3.0, 2.0, 3.0, f32::NAN];
        let ranks: Vec<u32> = (0..4).map(|t| rank_of(&logits, t)).collect();
        assert_eq!(ranks, [4, 1, 3, 1]);
    }

    #[test]
    fn top_k_is_sorted_and_normalised() {
        let logits = [1.0, 3.0, 2.0, 3.0];
        assert_eq!(argmax(&logits), 1);
        let mut long = vec![0.5f32; 1000];
        long[700] = 2.0;
        long[900] = 2.0;
        assert_eq!(argmax(&long), 700);
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
        let top = top_logprobs(&logits, 3);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 2]);
        let total: f32 = log_softmax(&logits).iter().map(|v| v.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!(top_logprobs(&logits, 0).is_empty());
        assert_eq!(top_logprobs(&logits, 10).len(), 4);
        let row: Vec<f32> = (0..1000).map(|i| ((i * 7919) % 97) as f32).collect();
        let mut sorted: Vec<u32> = (0..1000).collect();
        sorted.sort_by(|a, b| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b)));
        assert_eq!(top_k(&row, 20), sorted[..20]);
        assert_eq!(sum_of(&row[..13], |_| 1.0), 13.0);
        assert_eq!(sum_of(&row, |_| 1.0), 1000.0);
        let exact: f64 = logits.iter().map(|&v| f64::from(v).exp()).sum();
        assert!((f64::from(log_normaliser(&logits)) - exact.ln()).abs() < 1e-6);
    }

    #[test]
    fn exp_le_zero_is_close_to_exp_and_zero_when_masked() {
        let mut worst = 0f64;
        for i in 0..=869_990 {
            let x = -(i as f32) * 1e-4;
            let exact = f64::from(x).exp();
            let rel = (f64::from(exp_le_zero(x)) - exact).abs() / exact;
            worst = worst.max(rel);
        }
        assert!(worst < 3e-7, "relative error {worst}");
        assert_eq!(exp_le_zero(0.0), 1.0);
        assert_eq!(exp_le_zero(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_le_zero(-100.0), 0.0);
        let mut w = Vec::new();
        softmax_weights(&[2.0, f32::NEG_INFINITY, 1.0], 2.0, 0.5, &mut w);
        assert_eq!(w[..2], [1.0, 0.0]);
        assert!((w[2] - (-0.5f32).exp()).abs() < 1e-7);
    }
}
