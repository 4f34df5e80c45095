//! Choosing the next token from one row of logits: bias, penalties, a grammar's mask,
//! temperature, top-k, top-p, min-p, then a draw from the choice's own random stream.
//!
//! A choice's randomness depends only on (seed, choice index, output position): the draw for
//! output token `k` is the first word of ChaCha8 stream `k` under a key made from the seed
//! and the choice's index. So the same seeded request draws the same tokens whatever else
//! shares the batch, a preempted and recomputed choice continues where it left off, and a
//! choice resumed at position `p` on another replica (its output so far replayed) draws
//! exactly what the uninterrupted run drew from `p` on.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use sluice_models::adjust::Entry;
use sluice_models::host_logits::{Picked, Top};
use sluice_models::logits::{self, argmax, log_normaliser, pick};
use sluice_models::{Adjust, Nucleus, Pick};

use crate::constraint::{self, Mask};
use crate::event::TokenLogprob;
use crate::request::SamplingParams;

/// Up to this `top_k`, its candidates come from one pass that keeps the best seen so far
/// ([`logits::top_k`]) rather than a selection over the whole vocabulary.
const TOP_K_STREAMED: usize = 256;

/// Per-choice sampling state.
#[derive(Debug)]
pub struct SamplerState {
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
pub struct Sampled {
    pub token: u32,
    pub logprob: Option<TokenLogprob>,
}

/// One row to sample: its logits and its sequence's parameters, state, suppressed tokens
/// and grammar mask (as [`sample`] takes them).
#[derive(Debug)]
pub struct Draw<'a> {
    pub raw: &'a [f32],
    pub params: &'a SamplingParams,
    pub state: &'a mut SamplerState,
    pub suppress: &'a [u32],
    pub mask: Option<&'a Mask>,
}

/// From this many rows a step's draws run in parallel: a row costs 15–250 µs (argmax to a
/// temperature draw with logprobs over 49k–128k tokens), a parallel section ~10 µs.
const PARALLEL_FROM: usize = 4;

/// Samples every row, in parallel on `pool` when there are enough of them. Each row's draw
/// depends only on its own inputs, so the tokens are those of drawing one by one.
///
/// Why: a step samples every sequence of the batch, one 49k–128k-token row each; at batch
/// 64 that was 29 ms a step on one core before the vectorised weights (4.5 ms after), beside
/// a GPU step of a few milliseconds.
///
/// A draw that panics (a bug, never an input the gateway lets through) is that row's `Err`
/// with the panic's message, so it fails its own sequence and not the engine thread.
pub fn sample_all(pool: &rayon::ThreadPool, draws: Vec<Draw<'_>>) -> Vec<Result<Sampled, String>> {
    if draws.len() < PARALLEL_FROM {
        return draws.into_iter().map(Draw::sample).collect();
    }
    pool.install(|| draws.into_par_iter().map(Draw::sample).collect())
}

impl Draw<'_> {
    /// [`sample`] on this row, a panic caught as its message.
    pub fn sample(self) -> Result<Sampled, String> {
        let Draw {
            raw,
            params,
            state,
            suppress,
            mask,
        } = self;
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            sample(raw, params, state, suppress, mask)
        }))
        .map_err(|panic| {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned());
            format!("sampling panicked: {}", message.unwrap_or_default())
        })
    }
}

/// Picks the next token. `suppress` lists tokens that must not be chosen now (end-of-sequence
/// and stop tokens before `min_tokens`); `mask`, the tokens a grammar allows (applied after
/// bias and penalties, before temperature and the truncations; the grammar wins over
/// `suppress` when the two leave nothing).
pub fn sample(
    raw: &[f32],
    p: &SamplingParams,
    state: &mut SamplerState,
    suppress: &[u32],
    mask: Option<&Mask>,
) -> Sampled {
    let l = adjusted(raw, p, state, suppress, mask);
    let token = if p.is_greedy() {
        argmax(&l)
    } else {
        draw(&l, p, state.uniform())
    };
    state.position += 1;
    let logprob = p.logprobs.map(|k| logprob_of(raw, token, k));
    Sampled { token, logprob }
}

/// Up to this many alternatives' log-probabilities a device reports with its pick (OpenAI's
/// largest `top_logprobs`); more are read from the whole row.
pub const DEVICE_TOP_LOGPROBS: usize = 20;

/// Up to this `top_k` a draw takes its candidates from the device ([`Pick::Top`]: at most 64
/// blocks of 256 logits, 64 kB a row); a larger one reads the whole row. Top-p over the whole
/// row asks for this many too, and gets the row whole when they do not hold its nucleus.
pub const DEVICE_TOP_K: usize = 64;

/// The token the model may choose on its device for a draw under `p` at `state`'s position,
/// given no grammar mask, over the ids below `below` of its row after `p`'s bias and
/// penalties and with `suppress` held back ([`adjustment`], which the caller hands the model
/// beside it), with the log-probabilities `p` asks for; `None` when the draw reads more of its row than that
/// (log-probabilities beside bias or penalties, changes to more than
/// [`DEVICE_ADJUSTED_IDS`] ids, top-k past [`DEVICE_TOP_K`], or more than
/// [`DEVICE_TOP_LOGPROBS`] alternatives). Greedy draws are the most likely id
/// ([`Pick::Argmax`]); draws at a temperature (min-p allowed) are [`sample`]'s whole-row
/// draw, with the uniform number of this position ([`Pick::Draw`]); draws from the top `k`
/// (top-p and min-p within them allowed) ask for the row's top list ([`Pick::Top`]) and draw
/// from it here ([`sample_top`]), and so does top-p over the whole row ([`Nucleus`]: the top
/// [`DEVICE_TOP_K`] with the row's mass, or the row itself where they do not hold the
/// nucleus: at temperature 0.7 and top-p 0.9–0.95 they hold it at 91–96 % of the default
/// model's positions, at temperature 1 at 50–66 %). [`made`] takes the token the model
/// answers with.
pub fn device_pick(
    p: &SamplingParams,
    state: &SamplerState,
    suppress: &[u32],
    below: u32,
) -> Option<Pick> {
    let top_logprobs = p.logprobs.unwrap_or(0);
    if top_logprobs > DEVICE_TOP_LOGPROBS || p.allowed_token_ids.is_some() {
        return None;
    }
    // The device makes the row's changes ([`adjustment`]) before it picks; log-probabilities
    // are the raw row's, which it then no longer has.
    let ids = adjusted_ids(p, state) + suppress.len();
    if changes_row(p, suppress) && (p.logprobs.is_some() || ids > DEVICE_ADJUSTED_IDS) {
        return None;
    }
    if p.is_greedy() {
        return Some(Pick::Argmax {
            below,
            logprobs: p.logprobs,
        });
    }
    if (1..=DEVICE_TOP_K).contains(&p.top_k) {
        return Some(Pick::Top {
            below,
            k: p.top_k.max(top_logprobs),
            nucleus: None,
        });
    }
    if p.top_k == 0 && p.top_p < 1.0 {
        return Some(Pick::Top {
            below,
            k: DEVICE_TOP_K,
            nucleus: Some(Nucleus {
                temperature: p.temperature,
                top_p: p.top_p,
            }),
        });
    }
    (p.top_k == 0 && p.top_p >= 1.0).then(|| Pick::Draw {
        below,
        temperature: p.temperature,
        min_p: p.min_p.max(0.0),
        uniform: state.uniform(),
        logprobs: p.logprobs,
    })
}

/// The draw the model made on its device for [`device_pick`]'s pick: the token [`sample`]
/// would choose from the whole row (up to exact ties and rounding at a boundary between two
/// tokens' shares) and, when the request asks for them, the log-probabilities; its position
/// passed.
pub fn made(state: &mut SamplerState, picked: &Picked) -> Sampled {
    state.skip();
    Sampled {
        token: picked.id,
        // `device_pick` asks for the log-probabilities exactly when the request does.
        logprob: picked.logprob.map(|logprob| TokenLogprob {
            token: picked.id,
            logprob,
            top: picked.top.clone(),
        }),
    }
}

/// [`sample`] for a draw from the top `k` or from a whole row's nucleus ([`device_pick`]'s
/// [`Pick::Top`]), from the row's top list the model answered with instead of the row: the
/// same candidates, weights, nucleus (of the row's mass the list carries, for top-p over the
/// whole row) and walk (the top-k path reads nothing else of the row, and a whole row's
/// nucleus lies in the list), so the same token and log-probabilities.
pub fn sample_top(top: &Top, p: &SamplingParams, state: &mut SamplerState) -> Sampled {
    let (first, max) = top
        .logits
        .first()
        .copied()
        .unwrap_or((0, f32::NEG_INFINITY));
    let token = if max.is_finite() {
        let k = match p.top_k {
            0 => top.logits.len(),
            k => k.min(top.logits.len()),
        };
        let mass = top.mass.filter(|_| p.top_k == 0).map(f64::from);
        let cand = top_candidates(top.logits[..k].iter().copied(), max, p, mass);
        drawn_among(&cand, p.min_p.max(0.0), state.uniform()).unwrap_or(first)
    } else {
        // One logit at +∞ (which takes the draw): no weights to draw by.
        first
    };
    state.position += 1;
    let logprob = |id: u32| {
        let logit = top.logits.iter().find(|c| c.0 == id).map(|c| c.1);
        logit.unwrap_or(f32::NEG_INFINITY) - top.log_z
    };
    Sampled {
        token,
        logprob: p.logprobs.map(|n| TokenLogprob {
            token,
            logprob: logprob(token),
            top: top
                .logits
                .iter()
                .take(n)
                .map(|&(id, l)| (id, l - top.log_z))
                .collect(),
        }),
    }
}

/// Whether `p` leaves the raw logits as they are: no bias, no penalties.
fn untouched(p: &SamplingParams) -> bool {
    p.logit_bias.is_empty()
        && !repeats_penalised(p)
        && !occurrences_penalised(p)
        && p.allowed_token_ids.is_none()
}

/// `p`'s bias and penalties at `state`'s position as single changes, each setting one part
/// of an [`Entry`], in the order the rule makes them: the bias, then the repetition penalty
/// on every id of the prompt and output so far, then the frequency and presence penalties
/// on every id of the output.
fn changes<'a>(p: &'a SamplingParams, state: &'a SamplerState) -> impl Iterator<Item = Entry> + 'a {
    let bias = p.logit_bias.iter().map(|(&t, &bias)| Entry {
        bias,
        ..Entry::of(t)
    });
    let repeated = state.seen.iter().filter(|_| repeats_penalised(p));
    let repeat = repeated.map(|&t| Entry {
        repeat: p.repetition_penalty,
        ..Entry::of(t)
    });
    let counted = state
        .output_counts
        .iter()
        .filter(|_| occurrences_penalised(p));
    let minus = counted.map(|(&t, &c)| Entry {
        minus: p.frequency_penalty * c as f32 + p.presence_penalty,
        ..Entry::of(t)
    });
    bias.chain(repeat).chain(minus)
}

/// What `p`'s bias and penalties change in a row at `state`'s position, and the ids
/// `suppress` holds back (a −∞ bias, made last: what [`sample`] sets them to), one entry per
/// id ([`changes`] merged), for a model that makes them on its device; `None` when nothing
/// changes.
pub fn adjustment(p: &SamplingParams, state: &SamplerState, suppress: &[u32]) -> Option<Adjust> {
    if !changes_row(p, suppress) {
        return None;
    }
    let held_back = suppress.iter().map(|&t| Entry {
        bias: f32::NEG_INFINITY,
        ..Entry::of(t)
    });
    Some(Adjust::merged(changes(p, state).chain(held_back)))
}

/// Whether `p`'s bias and penalties or the ids `suppress` holds back change a row.
fn changes_row(p: &SamplingParams, suppress: &[u32]) -> bool {
    !untouched(p) || !suppress.is_empty()
}

/// At most this many ids a row's changes name for the device to make them
/// ([`device_pick`]); a row with more (a long prompt under a repetition penalty) is changed
/// on the host, where the upload costs nothing.
pub const DEVICE_ADJUSTED_IDS: usize = 4096;

/// How many ids `p`'s changes name at `state`'s position, at most (an id both biased and
/// seen counts twice).
fn adjusted_ids(p: &SamplingParams, state: &SamplerState) -> usize {
    p.logit_bias.len()
        + if repeats_penalised(p) {
            state.seen.len()
        } else {
            0
        }
        + if occurrences_penalised(p) {
            state.output_counts.len()
        } else {
            0
        }
}

fn repeats_penalised(p: &SamplingParams) -> bool {
    p.repetition_penalty != 1.0
}

fn occurrences_penalised(p: &SamplingParams) -> bool {
    p.frequency_penalty != 0.0 || p.presence_penalty != 0.0
}

/// Every id of `l` but the `allowed` ones (sorted) set to −∞.
fn keep_only(allowed: &[u32], l: &mut [f32]) {
    let mut next = allowed.iter().peekable();
    for (id, v) in l.iter_mut().enumerate() {
        if next.peek() == Some(&&(id as u32)) {
            next.next();
        } else {
            *v = f32::NEG_INFINITY;
        }
    }
}

/// The logits after bias, penalties, the grammar's mask and `suppress`: the raw row itself
/// (no copy) when none of them applies, as for most requests.
fn adjusted<'a>(
    raw: &'a [f32],
    p: &SamplingParams,
    state: &SamplerState,
    suppress: &[u32],
    mask: Option<&Mask>,
) -> Cow<'a, [f32]> {
    if untouched(p) && mask.is_none() && suppress.is_empty() {
        return Cow::Borrowed(raw);
    }
    let mut l = raw.to_vec();
    for c in changes(p, state) {
        let v = &mut l[c.id as usize];
        *v = c.value(*v);
    }
    if let Some(mask) = mask {
        constraint::apply(mask, &mut l);
    }
    if let Some(allowed) = &p.allowed_token_ids {
        keep_only(allowed, &mut l);
    }
    // Held back last; what a grammar or an allow-list leaves is kept should that leave nothing.
    let narrowed = mask.is_some() || p.allowed_token_ids.is_some();
    let before_suppress = (narrowed && !suppress.is_empty()).then(|| l.clone());
    for &t in suppress {
        l[t as usize] = f32::NEG_INFINITY;
    }
    if let Some(masked) = before_suppress {
        if l.iter().all(|&v| v == f32::NEG_INFINITY) {
            l = masked;
        }
    }
    Cow::Owned(l)
}

/// The chosen token's log-probability under the raw distribution, with the top `k`.
pub(crate) fn logprob_of(raw: &[f32], token: u32, k: usize) -> TokenLogprob {
    let log_z = log_normaliser(raw);
    TokenLogprob {
        token,
        logprob: raw[token as usize] - log_z,
        top: logits::top_k(raw, k)
            .into_iter()
            .map(|t| (t, raw[t as usize] - log_z))
            .collect(),
    }
}

/// A random draw after temperature, top-k, top-p and min-p.
///
/// Each weight (`e^((l - max) / T)`, relative to the most likely token's) is computed once,
/// vectorised. Without top-k and top-p the draw walks the whole row in token order and builds
/// no candidate list; with them it walks the candidates they keep, most likely first.
fn draw(l: &[f32], p: &SamplingParams, uniform: f64) -> u32 {
    let floor = p.min_p.max(0.0);
    if p.top_k == 0 && p.top_p >= 1.0 {
        return logits::draw_in_row(l, 1.0 / p.temperature, floor, uniform);
    }
    let max = logits::max(l);
    if !max.is_finite() {
        // Every token masked, or one at +∞ (which takes the draw): no weights to draw by.
        return argmax(l);
    }
    drawn_among(&candidates(l, max, p), floor, uniform).unwrap_or_else(|| argmax(l))
}

/// The draw among `cand` (most likely first) of those whose weight reaches `floor`; the most
/// likely candidate when rounding leaves the walk short; `None` without candidates.
fn drawn_among(cand: &[Ranked], floor: f32, uniform: f64) -> Option<u32> {
    let kept = || cand.iter().filter(|c| c.weight >= floor);
    let total: f64 = kept().map(|c| f64::from(c.weight)).sum();
    pick(kept().map(|c| (c.id, c.weight)), total, uniform).or(cand.first().map(|c| c.id))
}

/// The candidates top-k and top-p keep, most likely first, with their weights: the `top_k`
/// most likely tokens, then of those the fewest whose weights reach `top_p` of their sum.
/// The most likely token (weight 1) is always kept when `max` is finite.
fn candidates(l: &[f32], max: f32, p: &SamplingParams) -> Vec<Ranked> {
    let scale = 1.0 / p.temperature;
    let ranked = |i: u32, weight: f32| Ranked {
        logit: l[i as usize],
        weight,
        id: i,
    };
    if p.top_k > 0 && p.top_k <= TOP_K_STREAMED {
        // A few candidates: only their weights are needed.
        let top = logits::top_k(l, p.top_k).into_iter();
        return top_candidates(top.map(|i| (i, l[i as usize])), max, p, None);
    }
    let mut w = Vec::new();
    logits::softmax_weights(l, max, scale, &mut w);
    let positive = (0..w.len() as u32).filter(|&i| w[i as usize] > 0.0);
    if p.top_k == 0 {
        // Top-p over the whole row. Only tokens of weight at least
        // τ = (1 - top_p) × total / n can be in the nucleus: those below it sum to less than
        // n × τ, the mass top-p leaves out, so the tokens above it already reach `top_p`.
        // They are a few thousand of a 49k row for the default model at temperature 1.
        let total = logits::sum_of(&w, |x| x);
        let tau = ((1.0 - f64::from(p.top_p)) * total / w.len() as f64) as f32;
        let cand = positive
            .filter(|&i| w[i as usize] >= tau)
            .map(|i| ranked(i, w[i as usize]))
            .collect();
        return nucleus_sorted(cand, total, p.top_p);
    }
    let mut cand: Vec<Ranked> = positive.map(|i| ranked(i, w[i as usize])).collect();
    if p.top_k < cand.len() {
        cand.select_nth_unstable_by(p.top_k - 1, Ranked::order);
        cand.truncate(p.top_k);
    }
    let total = mass(&cand);
    nucleus_sorted(cand, total, p.top_p)
}

/// The candidates of the `top_k` most likely tokens (`top`, `(id, logit)`, the row's maximum
/// `max`) that top-p keeps, most likely first, with their weights: top-p's share is of their
/// own mass, or of the whole row's `mass` where given (top-p over the whole row, whose nucleus
/// `top` holds).
fn top_candidates(
    top: impl Iterator<Item = (u32, f32)>,
    max: f32,
    p: &SamplingParams,
    mass: Option<f64>,
) -> Vec<Ranked> {
    let scale = 1.0 / p.temperature;
    let top: Vec<Ranked> = top
        .map(|(id, logit)| Ranked {
            logit,
            weight: logits::exp_le_zero((logit - max) * scale),
            id,
        })
        .filter(|c| c.weight > 0.0)
        .collect();
    let total = mass.unwrap_or_else(|| self::mass(&top));
    nucleus_sorted(top, total, p.top_p)
}

/// `cand` cut to its top-p nucleus (`total` is the mass `top_p` is a share of), most likely
/// first.
fn nucleus_sorted(mut cand: Vec<Ranked>, total: f64, top_p: f32) -> Vec<Ranked> {
    if top_p < 1.0 {
        let kept = nucleus(&mut cand, f64::from(top_p) * total);
        cand.truncate(kept);
    }
    cand.sort_unstable_by(Ranked::order);
    cand
}

/// A candidate token with what orders it (logit, then the lower id first) and its weight.
#[derive(Clone, Copy)]
struct Ranked {
    logit: f32,
    weight: f32,
    id: u32,
}

impl Ranked {
    /// Most likely first.
    fn order(a: &Ranked, b: &Ranked) -> std::cmp::Ordering {
        b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
    }
}

/// The candidates' summed weight.
fn mass(cand: &[Ranked]) -> f64 {
    cand.iter().map(|c| f64::from(c.weight)).sum()
}

/// Moves the fewest most likely candidates whose weights reach `target` to the front of
/// `cand` (in no particular order) and returns how many they are: all of them if rounding
/// leaves the sum short.
///
/// A selection, not a sort: the middle of the range still in doubt is found in linear time
/// and the half holding the cut is kept, so the whole search is linear. With the default
/// model at temperature 1, top-p 0.95 keeps a median 320 tokens, but a third of rows need
/// more than 1,024 and a few over 7,000, which a sorted head of fixed size misses.
fn nucleus(cand: &mut [Ranked], target: f64) -> usize {
    // cand[..lo] are kept; the cut lies in cand[lo..hi]; `need` is what cand[lo..] must add.
    let (mut lo, mut hi, mut need) = (0, cand.len(), target);
    while hi - lo > 32 {
        let mid = lo + (hi - lo) / 2;
        cand[lo..hi].select_nth_unstable_by(mid - lo, Ranked::order);
        let upper = mass(&cand[lo..=mid]);
        if upper >= need {
            hi = mid + 1;
        } else {
            need -= upper;
            lo = mid + 1;
        }
    }
    cand[lo..hi].sort_unstable_by(Ranked::order);
    let mut cum = 0.0;
    for (n, c) in cand[lo..hi].iter().enumerate() {
        cum += f64::from(c.weight);
        if cum >= need {
            return lo + n + 1;
        }
    }
    hi
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

    /// A long row with a peaked head, like a language model's.
    fn row(seed: usize, vocab: usize) -> Vec<f32> {
        (0..vocab)
            .map(|i| {
                let noise = ((i * 2_654_435_761 + seed * 97) % 10_007) as f32 / 10_007.0;
                noise * 8.0 - if i % 97 == seed % 97 { 0.0 } else { 6.0 }
            })
            .collect()
    }

    #[test]
    fn only_draws_that_read_nothing_else_are_picked_on_the_device() {
        let state = SamplerState::new(Some(3), 0, &[]);
        let pick = |f: fn(&mut SamplingParams)| device_pick(&params(f), &state, &[], 100);
        assert_eq!(
            pick(|p| p.temperature = 0.0),
            Some(Pick::Argmax {
                below: 100,
                logprobs: None
            })
        );
        assert_eq!(
            pick(|p| {
                p.temperature = 0.7;
                p.min_p = 0.05;
                p.logprobs = Some(DEVICE_TOP_LOGPROBS);
            }),
            Some(Pick::Draw {
                below: 100,
                temperature: 0.7,
                min_p: 0.05,
                uniform: state.uniform(),
                logprobs: Some(DEVICE_TOP_LOGPROBS),
            })
        );
        assert_eq!(pick(|p| p.logprobs = Some(0)).unwrap().logprobs(), Some(0));
        assert_eq!(
            pick(|p| {
                p.top_k = 10;
                p.top_p = 0.9;
                p.logprobs = Some(20);
            }),
            Some(Pick::Top {
                below: 100,
                k: 20,
                nucleus: None
            })
        );
        assert_eq!(
            pick(|p| p.top_k = DEVICE_TOP_K),
            Some(Pick::Top {
                below: 100,
                k: DEVICE_TOP_K,
                nucleus: None
            })
        );
        assert_eq!(
            pick(|p| (p.temperature, p.top_p) = (0.7, 0.9)),
            Some(Pick::Top {
                below: 100,
                k: DEVICE_TOP_K,
                nucleus: Some(Nucleus {
                    temperature: 0.7,
                    top_p: 0.9
                }),
            })
        );
        // Bias and penalties are made on the device too, unless log-probabilities are read
        // (those are the raw row's) or they name too many ids.
        let changed: [fn(&mut SamplingParams); 4] = [
            |p| {
                p.logit_bias.insert(5, 1.0);
            },
            |p| p.repetition_penalty = 1.1,
            |p| p.presence_penalty = 0.5,
            |p| p.frequency_penalty = -0.5,
        ];
        let long_prompt: Vec<u32> = (0..DEVICE_ADJUSTED_IDS as u32 + 1).collect();
        let long = SamplerState::new(Some(3), 0, &long_prompt);
        for f in changed {
            let mut p = params(f);
            assert!(device_pick(&p, &state, &[], 100).is_some(), "{p:?}");
            assert!(adjustment(&p, &state, &[]).is_some(), "{p:?}");
            let repeats = p.repetition_penalty != 1.0;
            assert_eq!(
                device_pick(&p, &long, &[], 100).is_some(),
                !repeats,
                "{p:?}"
            );
            p.logprobs = Some(0);
            assert_eq!(device_pick(&p, &state, &[], 100), None, "{p:?}");
        }
        assert_eq!(adjustment(&params(|_| {}), &state, &[]), None);
        // Tokens held back (until `min_tokens`) are changes too: −∞ on the device.
        let plain = params(|_| {});
        assert!(device_pick(&plain, &state, &[2, 7], 100).is_some());
        let held = adjustment(&plain, &state, &[2, 7]).expect("changes");
        assert!(held.entries().iter().all(|e| e.bias == f32::NEG_INFINITY));
        let with_logprobs = params(|p| p.logprobs = Some(1));
        assert_eq!(device_pick(&with_logprobs, &state, &[2], 100), None);
        for temperature in [0.0, 1.0] {
            let spoilt: [fn(&mut SamplingParams); 3] = [
                |p| p.logprobs = Some(DEVICE_TOP_LOGPROBS + 1),
                |p| {
                    p.logit_bias.insert(5, 1.0);
                    p.logprobs = Some(2);
                },
                |p| p.top_k = DEVICE_TOP_K + 1,
            ];
            for (i, f) in spoilt.into_iter().enumerate() {
                let mut p = params(f);
                p.temperature = temperature;
                let greedy_ignores = temperature == 0.0 && i == 2;
                assert_eq!(
                    device_pick(&p, &state, &[], 100).is_some(),
                    greedy_ignores,
                    "case {i} at temperature {temperature}"
                );
            }
        }
    }

    /// The token [`device_pick`]'s pick chooses from a whole row is the one `sample` draws,
    /// with the log-probabilities where asked, and `made` moves the state as far, at every
    /// position.
    #[test]
    fn a_token_the_model_picked_is_the_sampled_one() {
        let r = row(3, 5_000);
        let log_softmax = logits::log_softmax(&r);
        let cases: [fn(&mut SamplingParams); 6] = [
            |p| p.temperature = 0.0,
            |_| {},
            |p| p.temperature = 0.6,
            |p| {
                p.temperature = 1.4;
                p.min_p = 0.02;
            },
            |p| p.logprobs = Some(0),
            |p| p.logprobs = Some(5),
        ];
        for f in cases {
            let p = params(f);
            let (mut drawn, mut made_here) = (
                SamplerState::new(Some(1), 0, &[]),
                SamplerState::new(Some(1), 0, &[]),
            );
            for _ in 0..50 {
                let a = sample(&r, &p, &mut drawn, &[], None);
                let pick = device_pick(&p, &made_here, &[], 5_000).unwrap();
                let id = pick.on_host(&r);
                let top = logits::top_logprobs(&r, pick.top_logprobs());
                let logprob = pick.logprobs().map(|_| log_softmax[id as usize]);
                let b = made(&mut made_here, &Picked { id, logprob, top });
                assert_eq!((a.token, a.logprob), (b.token, b.logprob));
                assert_eq!(drawn.position, made_here.position);
            }
        }
    }

    /// With bias and penalties, the device picks from the row after [`adjustment`]'s changes:
    /// the token `sample` draws from the raw row, at every position, as the output grows
    /// (greedy, a draw, a top list, a nucleus; repeated and biased ids among the likely ones).
    #[test]
    fn a_pick_from_the_changed_row_is_the_sampled_one() {
        let r = row(7, 5_000);
        let likely = logits::top_k(&r, 8);
        let cases: [fn(&mut SamplingParams); 4] = [
            |p| {
                p.temperature = 0.0;
                p.repetition_penalty = 1.8;
            },
            |p| {
                p.frequency_penalty = 0.7;
                p.presence_penalty = 0.4;
            },
            |p| {
                p.top_k = 20;
                p.repetition_penalty = 1.3;
                p.frequency_penalty = -0.2;
            },
            |p| {
                p.top_p = 0.8;
                p.temperature = 0.6;
                p.presence_penalty = 1.5;
            },
        ];
        for (i, f) in cases.into_iter().enumerate() {
            let mut p = params(f);
            // A bias that lifts a middling id to the top, and one that buries the likeliest.
            p.logit_bias.insert(likely[5], 3.0);
            p.logit_bias.insert(likely[0], -50.0);
            let prompt = &likely[1..3];
            // Held back (as until `min_tokens`) in every other case: one of the likeliest.
            let suppress: Vec<u32> = if i % 2 == 0 {
                vec![likely[3]]
            } else {
                Vec::new()
            };
            let (mut drawn, mut picked) = (
                SamplerState::new(Some(2), 0, prompt),
                SamplerState::new(Some(2), 0, prompt),
            );
            let mut tokens = Vec::new();
            for _ in 0..40 {
                let a = sample(&r, &p, &mut drawn, &suppress, None);
                let pick = device_pick(&p, &picked, &suppress, 5_000).expect("a device pick");
                let mut changed = r.clone();
                adjustment(&p, &picked, &suppress)
                    .expect("changes")
                    .apply(&mut changed);
                let b = match pick {
                    Pick::Top { k, nucleus, .. } => {
                        let top: Vec<(u32, f32)> = logits::top_k(&changed, k)
                            .into_iter()
                            .map(|t| (t, changed[t as usize]))
                            .collect();
                        let mass = nucleus.map(|n| {
                            let mut w = Vec::new();
                            let max = logits::max(&changed);
                            logits::softmax_weights(&changed, max, 1.0 / n.temperature, &mut w);
                            logits::sum_of(&w, |x| x) as f32
                        });
                        let log_z = log_normaliser(&changed);
                        sample_top(
                            &Top {
                                logits: top,
                                log_z,
                                mass,
                            },
                            &p,
                            &mut picked,
                        )
                        .token
                    }
                    pick => {
                        let id = pick.on_host(&changed);
                        made(
                            &mut picked,
                            &Picked {
                                id,
                                logprob: None,
                                top: Vec::new(),
                            },
                        )
                        .token
                    }
                };
                assert_eq!(a.token, b, "case {i}");
                drawn.push(a.token);
                picked.push(b);
                tokens.push(a.token);
            }
            let distinct: HashSet<u32> = tokens.iter().copied().collect();
            assert!(
                distinct.len() > 1,
                "case {i}: the penalties move the draw: {tokens:?}"
            );
        }
    }

    /// A draw from the top `k` made from the row's top list (what a device answers for
    /// [`Pick::Top`]) is `sample`'s from the whole row: token, log-probabilities, position.
    #[test]
    fn a_draw_from_a_top_list_is_the_sampled_one() {
        let r = row(5, 5_000);
        let log_z = log_normaliser(&r);
        let cases: [fn(&mut SamplingParams); 9] = [
            |p| p.top_k = 5,
            |p| p.top_k = DEVICE_TOP_K,
            |p| {
                p.top_k = 40;
                p.top_p = 0.9;
                p.temperature = 0.7;
            },
            |p| {
                p.top_k = 40;
                p.min_p = 0.05;
                p.temperature = 1.3;
            },
            |p| {
                p.top_k = 10;
                p.logprobs = Some(0);
            },
            |p| {
                p.top_k = 3;
                p.top_p = 0.5;
                p.logprobs = Some(20);
            },
            // Top-p over the whole row, whose nucleus the top 64 hold.
            |p| p.top_p = 0.8,
            |p| {
                p.top_p = 0.95;
                p.temperature = 0.7;
                p.min_p = 0.05;
            },
            |p| {
                p.top_p = 0.9;
                p.temperature = 0.5;
                p.logprobs = Some(5);
            },
        ];
        for f in cases {
            let p = params(f);
            let (mut drawn, mut from_top) = (
                SamplerState::new(Some(4), 1, &[]),
                SamplerState::new(Some(4), 1, &[]),
            );
            let Some(Pick::Top { k, nucleus, .. }) = device_pick(&p, &from_top, &[], 5_000) else {
                panic!("{p:?} is a top pick");
            };
            // The row's mass at the nucleus's temperature, as the device sums it.
            let mass = nucleus.map(|n| {
                let mut w = Vec::new();
                logits::softmax_weights(&r, logits::max(&r), 1.0 / n.temperature, &mut w);
                logits::sum_of(&w, |x| x) as f32
            });
            let top = Top {
                logits: logits::top_k(&r, k)
                    .into_iter()
                    .map(|i| (i, r[i as usize]))
                    .collect(),
                log_z,
                mass,
            };
            if let (Some(n), Some(mass)) = (nucleus, mass) {
                let scale = 1.0 / n.temperature;
                assert!(logits::holds_nucleus(&top.logits, scale, mass, n.top_p));
            }
            for _ in 0..50 {
                let a = sample(&r, &p, &mut drawn, &[], None);
                let b = sample_top(&top, &p, &mut from_top);
                assert_eq!((a.token, a.logprob), (b.token, b.logprob), "{p:?}");
                assert_eq!(drawn.position, from_top.position);
            }
        }
    }

    #[test]
    fn rows_drawn_in_parallel_are_those_drawn_one_by_one() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        let rows: Vec<Vec<f32>> = (0..24).map(|r| row(r, 5000)).collect();
        let kinds = [
            params(|p| p.temperature = 0.0),
            params(|p| p.temperature = 0.8),
            params(|p| (p.temperature, p.top_p) = (0.7, 0.9)),
            params(|p| (p.top_k, p.min_p) = (40, 0.05)),
            params(|p| p.logprobs = Some(3)),
        ];
        let mut one_by_one: Vec<SamplerState> = (0..24)
            .map(|i| SamplerState::new(Some(7), i, &[]))
            .collect();
        let mut parallel: Vec<SamplerState> = (0..24)
            .map(|i| SamplerState::new(Some(7), i, &[]))
            .collect();
        for _ in 0..3 {
            let want: Vec<(u32, Option<f32>)> = one_by_one
                .iter_mut()
                .enumerate()
                .map(|(r, st)| sample(&rows[r], &kinds[r % 5], st, &[], None))
                .map(|s| (s.token, s.logprob.map(|l| l.logprob)))
                .collect();
            let draws = parallel
                .iter_mut()
                .enumerate()
                .map(|(r, st)| Draw {
                    raw: &rows[r],
                    params: &kinds[r % 5],
                    state: st,
                    suppress: &[],
                    mask: None,
                })
                .collect();
            let got: Vec<(u32, Option<f32>)> = sample_all(&pool, draws)
                .into_iter()
                .map(|s| s.unwrap())
                .map(|s| (s.token, s.logprob.map(|l| l.logprob)))
                .collect();
            assert_eq!(got, want);
            assert!(want.iter().any(|w| w.1.is_some()));
        }
    }

    #[test]
    fn draws_follow_the_softmax_across_a_long_row() {
        // Weights 1..=10 by token % 10 over 1,000 tokens (four of the walk's blocks), at
        // temperature 1 and at 0.5 (which squares them); then min-p 0.5 keeps classes 4..=9
        // at temperature 1 (weights below half the largest are dropped).
        let l: Vec<f32> = (0..1000).map(|i| ((i % 10) as f32 + 1.0).ln()).collect();
        let cases = [
            (1.0, 0.0, (1..=10).map(|c| c as f64).collect::<Vec<_>>()),
            (0.5, 0.0, (1..=10).map(|c| (c * c) as f64).collect()),
            (
                1.0,
                0.5,
                (1..=10)
                    .map(|c| if c >= 5 { c as f64 } else { 0.0 })
                    .collect(),
            ),
        ];
        for (temperature, min_p, weights) in cases {
            let p = params(|p| (p.temperature, p.min_p) = (temperature, min_p));
            let n = 40_000;
            let mut counts = [0usize; 10];
            for t in draws(&l, &p, n, 11) {
                counts[t as usize % 10] += 1;
            }
            let total: f64 = weights.iter().sum();
            for (c, w) in weights.iter().enumerate() {
                let seen = counts[c] as f64 / n as f64;
                assert!(
                    (seen - w / total).abs() < 0.01,
                    "T {temperature} class {c}: {seen}"
                );
            }
        }
    }

    #[test]
    fn top_k_and_top_p_keep_the_prefix_a_full_sort_keeps() {
        for seed in 0..6 {
            let l = row(seed, 20_000);
            for (top_k, top_p, temperature) in [
                (0, 0.95, 1.0),
                (0, 0.5, 0.7),
                (0, 0.999, 1.0),
                (300, 0.9, 1.0),
                (5000, 0.8, 1.3),
                (50, 1.0, 1.0),
            ] {
                let p = params(|p| (p.top_k, p.top_p, p.temperature) = (top_k, top_p, temperature));
                let mut w = Vec::new();
                logits::softmax_weights(&l, logits::max(&l), 1.0 / temperature, &mut w);
                let mut sorted: Vec<u32> = (0..l.len() as u32).collect();
                sorted.sort_by(|a, b| l[*b as usize].total_cmp(&l[*a as usize]).then(a.cmp(b)));
                if top_k > 0 {
                    sorted.truncate(top_k);
                }
                let total: f64 = sorted.iter().map(|&i| f64::from(w[i as usize])).sum();
                let mut cum = 0.0;
                let n = sorted
                    .iter()
                    .position(|&i| {
                        cum += f64::from(w[i as usize]);
                        cum >= f64::from(top_p) * total
                    })
                    .map_or(sorted.len(), |n| n + 1);
                sorted.truncate(n);
                let got = candidates(&l, logits::max(&l), &p);
                let ids: Vec<u32> = got.iter().map(|c| c.id).collect();
                assert_eq!(ids, sorted, "seed {seed} k {top_k} p {top_p}");
            }
        }
    }

    #[test]
    fn a_draw_that_panics_is_its_own_rows_error() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let l = row(1, 100);
        // A bias on a token past the row: the gateway refuses it; here it indexes out of range.
        let bad = params(|p| {
            p.logit_bias.insert(5000, 1.0);
        });
        let good = params(|p| p.temperature = 0.0);
        let mut states: Vec<SamplerState> =
            (0..6).map(|i| SamplerState::new(Some(1), i, &[])).collect();
        let draws = states
            .iter_mut()
            .enumerate()
            .map(|(i, state)| Draw {
                raw: &l,
                params: if i == 3 { &bad } else { &good },
                state,
                suppress: &[],
                mask: None,
            })
            .collect();
        let out = sample_all(&pool, draws);
        for (i, r) in out.iter().enumerate() {
            match r {
                Err(e) => assert!(i == 3 && e.contains("index out of bounds"), "{i}: {e}"),
                Ok(s) => assert_eq!(s.token, argmax(&l), "row {i}"),
            }
        }
        assert!(out[3].is_err());
    }

    #[test]
    fn rows_with_nan_or_infinite_logits_still_draw_a_token() {
        let mut nan_first = row(3, 3000);
        nan_first[0] = f32::NAN;
        nan_first[10] = f32::NAN;
        let mut infinite = row(4, 3000);
        infinite[7] = f32::INFINITY;
        let masked = vec![f32::NEG_INFINITY; 3000];
        for (l, want) in [(&nan_first, None), (&infinite, Some(7)), (&masked, None)] {
            for p in [
                params(|p| p.temperature = 0.0),
                params(|p| p.temperature = 0.8),
                params(|p| p.top_k = 1),
                params(|p| (p.top_k, p.top_p) = (40, 0.9)),
                params(|p| p.top_p = 0.9),
                params(|p| (p.top_k, p.min_p) = (400, 0.2)),
                params(|p| p.logprobs = Some(2)),
            ] {
                for t in draws(l, &p, 3, 1) {
                    assert!((t as usize) < l.len());
                    assert!(want.is_none_or(|w| t == w), "{t}");
                    assert!(!l[t as usize].is_nan() || l.iter().all(|v| v.is_nan()));
                }
            }
        }
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
    fn top_p_keeps_the_nucleus_a_full_sort_finds() {
        // Many near-equal candidates: the selection must keep the sorted prefix's set.
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
