//! Small, exact operations on one row of logits that tests, examples and the engine's sampler
//! share: argmax, log-softmax and the top-k most likely tokens; and how far apart two sets of
//! rows are.

/// Index of the largest logit (the first one on ties, as llama.cpp's greedy sampler does).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Natural-log softmax over the whole row, computed in f64 for a stable normaliser.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let z: f64 = logits.iter().map(|v| f64::from(v - max).exp()).sum();
    let log_z = z.ln() as f32 + max;
    logits.iter().map(|v| v - log_z).collect()
}

/// The `k` most likely tokens with their log-probabilities, most likely first.
pub fn top_logprobs(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let lp = log_softmax(logits);
    let mut idx: Vec<u32> = (0..lp.len() as u32).collect();
    let k = k.min(idx.len());
    if k == 0 {
        return Vec::new();
    }
    let by_value = |a: &u32, b: &u32| lp[*b as usize].total_cmp(&lp[*a as usize]).then(a.cmp(b));
    idx.select_nth_unstable_by(k - 1, by_value);
    idx.truncate(k);
    idx.sort_by(by_value);
    idx.into_iter().map(|i| (i, lp[i as usize])).collect()
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
    fn top_k_is_sorted_and_normalised() {
        let logits = [1.0, 3.0, 2.0, 3.0];
        assert_eq!(argmax(&logits), 1);
        let top = top_logprobs(&logits, 3);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 2]);
        let total: f32 = log_softmax(&logits).iter().map(|v| v.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!(top_logprobs(&logits, 0).is_empty());
        assert_eq!(top_logprobs(&logits, 10).len(), 4);
    }
}
