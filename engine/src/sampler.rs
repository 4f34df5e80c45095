//! Choosing the next token from one row of logits: bias, penalties, a grammar's mask,
//! temperature, top-k, top-p, min-p, then a draw from the choice's own random stream.
//!
//! A choice's randomness depends only on (seed, choice index, output position): the draw for
//! output token `k` is the first word of ChaCha8 stream `k` under a key made from the seed
//! and the choice's index. So the same seeded request draws the same tokens whatever else
//! shares the batch, a preempted and recomputed choice continues where it left off, and a
//! choice resumed at position `p` on another replica (its output so far replayed) draws
//! exactly what the uninterrupted run drew from `p` on.

use std::collections::{HashMap, HashSet};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sluice_models::logits::{argmax, top_logprobs};

use crate::constraint::{self, Mask};
use crate::event::TokenLogprob;
use crate::request::SamplingParams;

/// Above this many candidates, top-p first sorts only the most likely ones and falls back to a
/// full sort only when they do not reach `top_p` (the answer is the same either way).
const TOP_P_PARTIAL: usize = 1024;

/// Per-choice sampling state.
#[derive(Debug)]
pub(crate) struct SamplerState {
    /// The ChaCha8 key of this choice: from the seed and the choice index, or from the OS.
    key: u64,
    /// The output position of the next draw (tokens sampled or replayed so far).
    position: u64,
    /// Occurrences of each generated token (frequency and presence penalties).
    output_counts: HashMap<u32, u32>,
    /// Tokens of the prompt and output (repetition penalty).
    seen: HashSet<u32>,
}

impl SamplerState {
    /// State for choice `index` of a request. Unseeded requests draw a seed from the OS.
    pub fn new(seed: Option<u64>, index: usize, prompt: &[u32]) -> Self {
        let key = match seed {
            Some(s) => s ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            None => rand::rng().random(),
        };
        Self {
            key,
            position: 0,
            output_counts: HashMap::new(),
            seen: prompt.iter().copied().collect(),
        }
    }

    /// Records a token the choice generated.
    pub fn push(&mut self, token: u32) {
        *self.output_counts.entry(token).or_default() += 1;
        self.seen.insert(token);
    }

    /// Records a token generated before (a resumed choice's output so far): as if it had
    /// been sampled here, so penalties and the next draw's position are those of the
    /// uninterrupted run.
    #[cfg(test)]
    pub fn replay(&mut self, token: u32) {
        self.push(token);
        self.skip();
    }

    /// Moves past one output position without drawing (a replayed token already pushed).
    pub fn skip(&mut self) {
        self.position += 1;
    }

    /// The uniform number in [0, 1) of the draw at the current position.
    fn uniform(&self) -> f64 {
        let mut rng = ChaCha8Rng::seed_from_u64(self.key);
        rng.set_stream(self.position);
        rng.random::<f64>()
    }
}

/// The chosen token and, when asked for, its log-probability.
#[derive(Debug)]
pub(crate) struct Sampled {
    pub token: u32,
    pub logprob: Option<TokenLogprob>,
}

/// Picks the next token. `suppress` lists tokens that must not be chosen now (end-of-sequence
/// and stop tokens before `min_tokens`); `mask`, the tokens a grammar allows (applied after
/// bias and penalties, before temperature and the truncations; the grammar wins over
/// `suppress` when the two leave nothing).
pub(crate) fn sample(
    raw: &[f32],
    p: &SamplingParams,
    state: &mut SamplerState,
    suppress: &[u32],
    mask: Option<&Mask>,
) -> Sampled {
    let mut l = raw.to_vec();
    for (&t, &b) in &p.logit_bias {
        l[t as usize] += b;
    }
    if p.repetition_penalty != 1.0 {
        for &t in &state.seen {
            let v = &mut l[t as usize];
            *v = if *v > 0.0 {
                *v / p.repetition_penalty
            } else {
                *v * p.repetition_penalty
            };
        }
    }
    if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
        for (&t, &c) in &state.output_counts {
            l[t as usize] -= p.frequency_penalty * c as f32 + p.presence_penalty;
        }
    }
    if let Some(mask) = mask {
        constraint::apply(mask, &mut l);
    }
    let before_suppress = mask.filter(|_| !suppress.is_empty()).map(|_| l.clone());
    for &t in suppress {
        l[t as usize] = f32::NEG_INFINITY;
    }
    if let Some(masked) = before_suppress {
        if l.iter().all(|&v| v == f32::NEG_INFINITY) {
            l = masked;
        }
    }
    let token = if p.is_greedy() {
        argmax(&l)
    } else {
        draw(&l, p, state.uniform())
    };
    state.position += 1;
    let logprob = p.logprobs.map(|k| logprob_of(raw, token, k));
    Sampled { token, logprob }
}

/// The chosen token's log-probability under the raw distribution, with the top `k`.
fn logprob_of(raw: &[f32], token: u32, k: usize) -> TokenLogprob {
    let max = raw.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let z: f64 = raw.iter().map(|v| f64::from(v - max).exp()).sum();
    let log_z = z.ln() as f32 + max;
    TokenLogprob {
        token,
        logprob: raw[token as usize] - log_z,
        top: if k > 0 {
            top_logprobs(raw, k)
        } else {
            Vec::new()
        },
    }
}

/// A random draw after temperature, top-k, top-p and min-p.
fn draw(l: &[f32], p: &SamplingParams, uniform: f64) -> u32 {
    let mut cand: Vec<u32> = (0..l.len() as u32)
        .filter(|&i| l[i as usize] > f32::NEG_INFINITY)
        .collect();
    if cand.is_empty() {
        return argmax(l);
    }
    let desc = |a: &u32, b: &u32| l[*b as usize].total_cmp(&l[*a as usize]).then(a.cmp(b));
    if p.top_k > 0 && p.top_k < cand.len() {
        cand.select_nth_unstable_by(p.top_k - 1, desc);
        cand.truncate(p.top_k);
    }
    let max = cand
        .iter()
        .map(|&i| l[i as usize])
        .fold(f32::NEG_INFINITY, f32::max);
    let inv_t = 1.0 / f64::from(p.temperature);
    // Weights relative to the most likely candidate (whose weight is 1).
    let weight = |i: u32| (f64::from(l[i as usize] - max) * inv_t).exp();
    if p.top_p < 1.0 {
        let total: f64 = cand.iter().map(|&i| weight(i)).sum();
        let target = f64::from(p.top_p) * total;
        let keep = |cand: &mut Vec<u32>| -> bool {
            cand.sort_unstable_by(desc);
            let mut cum = 0.0;
            for (n, &i) in cand.iter().enumerate() {
                cum += weight(i);
                if cum >= target {
                    cand.truncate(n + 1);
                    return true;
                }
            }
            false
        };
        if cand.len() > TOP_P_PARTIAL {
            let mut head = cand.clone();
            head.select_nth_unstable_by(TOP_P_PARTIAL - 1, desc);
            head.truncate(TOP_P_PARTIAL);
            if keep(&mut head) {
                cand = head;
            } else {
                keep(&mut cand);
            }
        } else {
            keep(&mut cand);
        }
    }
    if p.min_p > 0.0 {
        let floor = f64::from(p.min_p);
        cand.retain(|&i| weight(i) >= floor);
    }
    let weights: Vec<f64> = cand.iter().map(|&i| weight(i)).collect();
    let total: f64 = weights.iter().sum();
    let mut r = uniform * total;
    for (&i, w) in cand.iter().zip(&weights) {
        if r < *w {
            return i;
        }
        r -= w;
    }
    *cand
        .last()
        .expect("at least the most likely candidate remains")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams::default();
        f(&mut p);
        p
    }

    fn draws(logits: &[f32], p: &SamplingParams, n: usize, seed: u64) -> Vec<u32> {
        let mut st = SamplerState::new(Some(seed), 0, &[]);
        (0..n)
            .map(|_| sample(logits, p, &mut st, &[], None).token)
            .collect()
    }

    #[test]
    fn greedy_takes_the_largest_after_bias_and_suppression() {
        let logits = [1.0, 5.0, 3.0, 4.0];
        let p = params(|p| p.temperature = 0.0);
        let mut st = SamplerState::new(None, 0, &[]);
        assert_eq!(sample(&logits, &p, &mut st, &[], None).token, 1);
        assert_eq!(sample(&logits, &p, &mut st, &[1], None).token, 3);
        let biased = params(|p| {
            p.temperature = 0.0;
            p.logit_bias.insert(0, 10.0);
        });
        assert_eq!(sample(&logits, &biased, &mut st, &[], None).token, 0);
    }

    #[test]
    fn same_seed_same_draws_other_seed_or_choice_differs() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let p = SamplingParams::default();
        assert_eq!(draws(&logits, &p, 40, 7), draws(&logits, &p, 40, 7));
        assert_ne!(draws(&logits, &p, 40, 7), draws(&logits, &p, 40, 8));
        let mut a = SamplerState::new(Some(7), 0, &[]);
        let mut b = SamplerState::new(Some(7), 1, &[]);
        let sa: Vec<u32> = (0..40)
            .map(|_| sample(&logits, &p, &mut a, &[], None).token)
            .collect();
        let sb: Vec<u32> = (0..40)
            .map(|_| sample(&logits, &p, &mut b, &[], None).token)
            .collect();
        assert_ne!(sa, sb);
    }

    #[test]
    fn a_draw_depends_only_on_seed_choice_and_position() {
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let p = params(|p| p.presence_penalty = 0.4);
        let run = |st: &mut SamplerState, n: usize| -> Vec<u32> {
            (0..n)
                .map(|_| {
                    let t = sample(&logits, &p, st, &[], None).token;
                    st.push(t);
                    t
                })
                .collect()
        };
        for index in [0, 3] {
            let whole = run(&mut SamplerState::new(Some(11), index, &[1, 2]), 40);
            // A choice resumed at position 17: its output so far replayed, then sampled on.
            let mut resumed = SamplerState::new(Some(11), index, &[1, 2]);
            for &t in &whole[..17] {
                resumed.replay(t);
            }
            assert_eq!(run(&mut resumed, 23), whole[17..], "choice {index}");
        }
        // Greedy draws take a position too, so a mixed history stays aligned.
        let mut a = SamplerState::new(Some(5), 0, &[]);
        let mut b = SamplerState::new(Some(5), 0, &[]);
        sample(&logits, &SamplingParams::greedy(1), &mut a, &[], None);
        b.replay(0);
        assert_eq!(a.position, b.position);
        assert_eq!(a.uniform(), b.uniform());
    }

    #[test]
    fn top_k_top_p_and_min_p_restrict_the_support() {
        let logits = [4.0, 3.0, 2.0, 1.0, 0.0];
        let k2 = params(|p| p.top_k = 2);
        assert!(draws(&logits, &k2, 300, 1).iter().all(|&t| t < 2));
        // Probabilities ≈ .64 .24 .09 .03 .01: top_p 0.8 keeps the first two.
        let p8 = params(|p| p.top_p = 0.8);
        let got = draws(&logits, &p8, 300, 2);
        assert!(got.iter().all(|&t| t < 2) && got.contains(&1));
        // min_p 0.3 keeps tokens with at least 0.3 × the best probability: e^-1 ≈ .37 passes.
        let m = params(|p| p.min_p = 0.3);
        assert!(draws(&logits, &m, 300, 3).iter().all(|&t| t < 2));
        // A tiny temperature is nearly greedy.
        let cold = params(|p| p.temperature = 0.01);
        assert!(draws(&logits, &cold, 100, 4).iter().all(|&t| t == 0));
    }

    #[test]
    fn top_p_partial_sort_agrees_with_a_full_sort() {
        // Many near-equal candidates: the partial head must not change the kept set.
        let logits: Vec<f32> = (0..5000).map(|i| ((i * 37) % 101) as f32 * 0.01).collect();
        for top_p in [0.05, 0.5, 0.99] {
            let p = params(|p| p.top_p = top_p);
            let full = {
                let mut c: Vec<u32> = (0..5000).collect();
                let l = &logits;
                c.sort_by(|a, b| l[*b as usize].total_cmp(&l[*a as usize]).then(a.cmp(b)));
                let max = l[c[0] as usize];
                let w: Vec<f64> = c
                    .iter()
                    .map(|&i| f64::from(l[i as usize] - max).exp())
                    .collect();
                let total: f64 = w.iter().sum();
                let mut cum = 0.0;
                let n = w
                    .iter()
                    .position(|x| {
                        cum += x;
                        cum >= f64::from(top_p) * total
                    })
                    .unwrap();
                c.truncate(n + 1);
                c.into_iter().collect::<HashSet<u32>>()
            };
            for t in draws(&logits, &p, 200, 5) {
                assert!(full.contains(&t), "top_p {top_p}: {t} outside the nucleus");
            }
        }
    }

    #[test]
    fn penalties_push_away_from_seen_tokens() {
        let logits = [2.0, 1.9, -1.0];
        let greedy = |f: fn(&mut SamplingParams)| {
            let mut p = SamplingParams::greedy(1);
            f(&mut p);
            p
        };
        let mut st = SamplerState::new(None, 0, &[]);
        st.push(0);
        let freq = greedy(|p| p.frequency_penalty = 0.5);
        assert_eq!(sample(&logits, &freq, &mut st, &[], None).token, 1);
        let pres = greedy(|p| p.presence_penalty = 0.5);
        assert_eq!(sample(&logits, &pres, &mut st, &[], None).token, 1);
        // Repetition: 2.0 / 1.1 < 1.9; applies to prompt tokens too.
        let rep = greedy(|p| p.repetition_penalty = 1.1);
        let mut from_prompt = SamplerState::new(None, 0, &[0]);
        assert_eq!(sample(&logits, &rep, &mut from_prompt, &[], None).token, 1);
        // A negative logit is made more negative, not less.
        let mut neg = SamplerState::new(None, 0, &[2]);
        let l2 = [-0.5, -0.6, -0.52];
        let rep2 = greedy(|p| p.repetition_penalty = 2.0);
        assert_eq!(sample(&l2, &rep2, &mut neg, &[], None).token, 0);
        assert_eq!(sample(&l2, &greedy(|_| {}), &mut neg, &[0], None).token, 2);
    }

    #[test]
    fn logprobs_are_of_the_raw_distribution() {
        let logits = [0.0f32, (3.0f32).ln()];
        let p = params(|p| {
            p.temperature = 0.0;
            p.logprobs = Some(2);
            p.logit_bias.insert(0, 50.0);
        });
        let mut st = SamplerState::new(None, 0, &[]);
        let s = sample(&logits, &p, &mut st, &[], None);
        assert_eq!(s.token, 0);
        let lp = s.logprob.unwrap();
        assert!((lp.logprob - 0.25f32.ln()).abs() < 1e-6);
        assert_eq!(lp.top[0].0, 1);
        assert!((lp.top[0].1 - 0.75f32.ln()).abs() < 1e-6);
    }
}
