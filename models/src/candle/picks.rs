//! Tokens picked on the model's device, for rows whose sequence asked for nothing else
//! ([`Logits::Pick`](crate::Logits::Pick)): on a GPU a few kilobytes a row cross to the host
//! instead of the row (196 kB for the default model, 513 kB for Llama-3), and the host neither
//! scans nor samples it.
//!
//! A row's bias and penalties ([`Adjust`]) are made first, on the device ([`adjusted`]): the
//! changed ids' logits gathered, changed as the engine's sampler changes them, and scattered
//! into a copy of the rows (the ids cross up, a few kB; nothing crosses back).
//!
//! - **Greedy** ([`Pick::Argmax`]): candle's `argmax`. It keeps the first maximum it meets,
//!   which on a GPU is not always the lowest id among exact ties (threads take strided
//!   columns); any of them is a greedy choice. The CPU's and the sampler's pick the lowest.
//! - **A draw** ([`Pick::Draw`]): the weights `e^((logit − max) / T)` (min-p's floor applied)
//!   are summed per block of [`DRAW_BLOCK`] ids on the device; the sums cross to the host,
//!   where [`logits::block_of`] finds the block holding the draw; that block's weights cross
//!   too, and [`logits::pick`] finds the token. That is the engine's sampler's own walk over a
//!   whole row ([`logits::pick_in_row`]), so a seeded request draws the same tokens either
//!   way, up to rounding: the device's `exp` and sums differ from the host's in the last bits,
//!   which moves a draw only when its uniform number falls within ~1e-6 of a boundary
//!   between two tokens' shares. Two small copies (at batch 64 on the default model 49 kB of
//!   sums and 65 kB of blocks) take the place of the rows (12.6 MB) and of the host's
//!   sampling of them (~4.5 ms on one core).
//!
//! - **A top list** ([`Pick::Top`], for a draw from the top `k`, top-p within them
//!   included): the `k` most likely ids with their logits and the row's log normaliser
//!   ([`tops`]); the engine's sampler draws among them as it would from the whole row, since
//!   its top-k path reads nothing else.
//! - **A nucleus** (a [`Pick::Top`] with a [`Nucleus`]: top-p over the whole row): the top 64
//!   as a top list, with the row's total weight at the nucleus's temperature summed beside
//!   the normaliser (same copy). Where the list's weights reach top-p of it
//!   ([`logits::holds_nucleus`]) the nucleus lies in the list and the sampler draws from it;
//!   elsewhere the row comes back whole, copied with the step's other whole rows
//!   ([`top_lists`]). On the default model the top 64 hold the nucleus at 91–96 % of a
//!   chat's positions at temperature 0.7 and top-p 0.9–0.95, at 50–66 % at temperature 1.
//!
//! Either way the token comes with its log-probability under the raw logits' softmax (what a
//! request's `logprobs` report): `−ln Σ e^(logit − max)` for the most likely id, and for a
//! drawn one `T ln w − ln Σ e^(logit − max)` from its weight `w`; the normaliser rides along
//! in the first copy. A pick that asks for the top log-probabilities too (at most 20, OpenAI's
//! `top_logprobs`) gets them from the blocks with the highest maxima ([`with_tops`]): two more
//! small copies, for those rows only.

use candle_core::{DType, Tensor, D};

use crate::adjust::Adjust;
use crate::batch::{Nucleus, Pick};
use crate::error::Result;
use crate::host_logits::{Answer, Picked, Top};
use crate::logits::{self, DRAW_BLOCK};

/// Whether `SLUICE_DEVICE_ARGMAX` leaves greedy ids to the device (anything but `0`, `off` or
/// `false`; on by default): a switch for every binary, for measuring one way against the
/// other.
pub fn argmax_from_env() -> bool {
    super::env_switch("SLUICE_DEVICE_ARGMAX", true)
}

/// Whether `SLUICE_DEVICE_DRAWS` leaves draws at a temperature to the device (as
/// [`argmax_from_env`]; on by default).
pub fn draws_from_env() -> bool {
    super::env_switch("SLUICE_DEVICE_DRAWS", true)
}

/// The answer to each row of `logits` (`[rows, vocab]`, on the model's device) that `picks`
/// names (`Some`), after the row's changes in `adjust` (per row, or empty for none): its
/// token with its log-probability and the top ones asked for (those of the changed row), or
/// its top list; `None` for the rows the caller copies whole (no pick, or a nucleus that
/// reaches past its top list).
pub(crate) fn answers(
    logits: &Tensor,
    picks: &[Option<Pick>],
    adjust: &[Option<&Adjust>],
) -> Result<Vec<Option<Answer>>> {
    let (rows, vocab) = logits.dims2()?;
    assert_eq!(rows, picks.len(), "a pick or none per row");
    // One pass per kind of pick and bound: every row of a model has the same bound.
    let group = |p: &Pick| (kind(p), p.below());
    let mut groups: Vec<(u8, u32)> = picks.iter().flatten().map(group).collect();
    groups.sort_unstable();
    groups.dedup();
    let mut answers: Vec<Option<Answer>> = vec![None; rows];
    for (kind, below) in groups {
        let (at, members): (Vec<u32>, Vec<Pick>) = (0..rows as u32)
            .filter_map(|i| picks[i as usize].map(|p| (i, p)))
            .filter(|(_, p)| group(p) == (kind, below))
            .unzip();
        let width = (below as usize).clamp(1, vocab);
        // Every row alike (the common step) needs no gathered copy of them.
        let selected = if at.len() == rows {
            logits.clone()
        } else {
            logits.index_select(&Tensor::new(at.as_slice(), logits.device())?, 0)?
        }
        .narrow(1, 0, width)?
        // A bound below the vocabulary (a padded one) leaves a strided view: the reductions
        // get rows laid out as they expect.
        .contiguous()?;
        let changes: Vec<Option<&Adjust>> = at
            .iter()
            .map(|&i| adjust.get(i as usize).copied().flatten())
            .collect();
        let selected = adjusted(&selected, &changes)?;
        let answered: Vec<Option<Answer>> = if kind == TOP {
            top_lists(&selected, &members)?
        } else {
            let picked = picked(&selected, &members)?;
            picked
                .into_iter()
                .map(|p| Some(Answer::Picked(p)))
                .collect()
        };
        for (&i, answer) in at.iter().zip(answered) {
            answers[i as usize] = answer;
        }
    }
    Ok(answers)
}

const ARGMAX: u8 = 0;
const DRAW: u8 = 1;
const TOP: u8 = 2;

fn kind(p: &Pick) -> u8 {
    match p {
        Pick::Argmax { .. } => ARGMAX,
        Pick::Draw { .. } => DRAW,
        Pick::Top { .. } => TOP,
    }
}

/// How many of the most likely ids the answer to `p` lists: a top list's `k`, or the top
/// log-probabilities a token asks for.
fn listed(p: &Pick) -> usize {
    match *p {
        Pick::Top { k, .. } => k,
        Pick::Argmax { .. } | Pick::Draw { .. } => p.top_logprobs(),
    }
}

/// The tokens of `rows`, whose `picks` are all argmaxes or all draws, with the
/// log-probabilities they ask for. The normaliser (an `exp` and a sum over every row) is
/// summed only when one of them asks: most requests do not.
fn picked(rows: &Tensor, picks: &[Pick]) -> Result<Vec<Picked>> {
    let draws: Vec<Draw> = picks.iter().filter_map(Draw::of).collect();
    let scored = picks.iter().any(|p| p.logprobs().is_some());
    if draws.is_empty() && !scored {
        return greedy(rows, None);
    }
    let (max, shifted) = shifted(rows)?;
    let z = scored.then(|| normalisers(&shifted)).transpose()?;
    let mut picked = if draws.is_empty() {
        greedy(rows, z.as_ref())?
    } else {
        drawn(rows, &shifted, z.as_ref(), &draws)?
    };
    if let Some(z) = z.filter(|_| picks.iter().any(|p| listed(p) > 0)) {
        with_tops(rows, &log_normalisers(&max, &z)?, picks, &mut picked)?;
    }
    // A row that asked for none gets none, whatever its neighbours asked.
    for (p, pick) in picked.iter_mut().zip(picks) {
        if pick.logprobs().is_none() {
            p.logprob = None;
        }
    }
    Ok(picked)
}

/// The answers to top-list picks: each row's top list, or `None` for a [`Nucleus`] the list
/// does not hold (its row goes whole).
fn top_lists(rows: &Tensor, picks: &[Pick]) -> Result<Vec<Option<Answer>>> {
    let ks: Vec<usize> = picks.iter().map(listed).collect();
    let nuclei: Vec<Option<Nucleus>> = picks
        .iter()
        .map(|p| match *p {
            Pick::Top { nucleus, .. } => nucleus,
            Pick::Argmax { .. } | Pick::Draw { .. } => None,
        })
        .collect();
    let (max, shifted) = shifted(rows)?;
    let mut stats = vec![log_normalisers(&max, &normalisers(&shifted)?)?];
    if nuclei.iter().any(Option::is_some) {
        // Each row's total weight at its nucleus's temperature (1 for the others, unread).
        let scale = nuclei
            .iter()
            .map(|n| n.map_or(1.0, |n| 1.0 / n.temperature))
            .collect();
        let scale = Tensor::from_vec(scale, (picks.len(), 1), rows.device())?;
        stats.push(normalisers(&shifted.broadcast_mul(&scale)?)?);
    }
    let tops = tops(rows, &Tensor::cat(&stats, D::Minus1)?, &ks)?;
    Ok(tops
        .into_iter()
        .zip(nuclei)
        .map(|(top, nucleus)| match nucleus {
            Some(n) => top
                .mass
                .is_some_and(|mass| {
                    logits::holds_nucleus(&top.logits, 1.0 / n.temperature, mass, n.top_p)
                })
                .then_some(Answer::Top(top)),
            // Summed at temperature 1 beside the nuclei: no mass of its own.
            None => Some(Answer::Top(Top { mass: None, ..top })),
        })
        .collect())
}

/// Fills in the top log-probabilities of the `picked` rows of `rows` whose pick asks for
/// some ([`Pick::top_logprobs`]), from their [`tops`] (`log_z`: each row's log normaliser).
fn with_tops(rows: &Tensor, log_z: &Tensor, picks: &[Pick], picked: &mut [Picked]) -> Result<()> {
    let ks: Vec<usize> = picks.iter().map(listed).collect();
    for (p, top) in picked.iter_mut().zip(tops(rows, log_z, &ks)?) {
        p.top = top
            .logits
            .iter()
            .map(|&(id, l)| (id, l - top.log_z))
            .collect();
    }
    Ok(())
}

/// Each row's `ks[r]` most likely ids with their logits, most likely first, its log
/// normaliser and, where `stats` has a second column, its mass (`stats`, `[rows, 1 or 2]`:
/// each row's log normaliser, then any mass; nothing for a row whose `k` is 0).
///
/// The `k` most likely ids of a row lie in the `k` blocks of [`DRAW_BLOCK`] ids with the
/// highest maxima (a block holding one of them has a maximum at least the `k`th logit, and
/// at most `k` blocks do), so two small copies find them: each block's maximum, then the
/// chosen blocks' logits (`k` × 1 kB a row), whose `k` best the host keeps as the sampler
/// does ([`logits::top_k`]: the lower id first on ties; the blocks are chosen by maximum,
/// then the lower block, and read in id order, which keeps that under ties).
fn tops(rows: &Tensor, stats: &Tensor, ks: &[usize]) -> Result<Vec<Top>> {
    let mut out = vec![
        Top {
            logits: Vec::new(),
            log_z: 0.0,
            mass: None,
        };
        ks.len()
    ];
    let asking: Vec<u32> = (0..ks.len() as u32)
        .filter(|&r| ks[r as usize] > 0)
        .collect();
    if asking.is_empty() {
        return Ok(out);
    }
    let (rows, stats) = if asking.len() == ks.len() {
        (rows.clone(), stats.clone())
    } else {
        let asking = Tensor::new(asking.as_slice(), rows.device())?;
        (
            rows.index_select(&asking, 0)?,
            stats.index_select(&asking, 0)?,
        )
    };
    let columns = stats.dim(1)?;
    let (n, width) = rows.dims2()?;
    let blocks = width.div_ceil(DRAW_BLOCK);
    let pad = blocks * DRAW_BLOCK - width;
    let padded = if pad > 0 {
        let none = Tensor::full(f32::NEG_INFINITY, (n, pad), rows.device())?;
        Tensor::cat(&[&rows, &none], D::Minus1)?
    } else {
        rows
    }
    .reshape((n * blocks, DRAW_BLOCK))?;
    let block_max = padded.max(D::Minus1)?.reshape((n, blocks))?;
    // Each row's stats, then its blocks' maxima: one copy.
    let head = Tensor::cat(&[&stats, &block_max], D::Minus1)?.to_vec2::<f32>()?;
    let chosen: Vec<Vec<usize>> = asking
        .iter()
        .zip(&head)
        .map(|(&r, h)| {
            let maxima = &h[columns..];
            let k = ks[r as usize].min(blocks);
            let mut best: Vec<usize> = logits::top_k(maxima, k)
                .into_iter()
                .map(|b| b as usize)
                .collect();
            // In id order, so ties among the candidates keep the lower id first.
            best.sort_unstable();
            best
        })
        .collect();
    let at: Vec<u32> = chosen
        .iter()
        .enumerate()
        .flat_map(|(j, bs)| bs.iter().map(move |&b| (j * blocks + b) as u32))
        .collect();
    let held = padded
        .index_select(&Tensor::new(at.as_slice(), padded.device())?, 0)?
        .to_vec2::<f32>()?;
    let mut held = held.into_iter();
    for ((&r, h), bs) in asking.iter().zip(&head).zip(&chosen) {
        let mut ids = Vec::with_capacity(bs.len() * DRAW_BLOCK);
        let mut values = Vec::with_capacity(bs.len() * DRAW_BLOCK);
        for &b in bs {
            let block = held.next().expect("a block per chosen block");
            // The padding past the bound is no id.
            let end = ((b + 1) * DRAW_BLOCK).min(width);
            ids.extend((b * DRAW_BLOCK) as u32..end as u32);
            values.extend(&block[..end - b * DRAW_BLOCK]);
        }
        out[r as usize] = Top {
            logits: logits::top_k(&values, ks[r as usize])
                .into_iter()
                .map(|c| (ids[c as usize], values[c as usize]))
                .collect(),
            log_z: h[0],
            mass: (columns > 1).then(|| h[1]),
        };
    }
    Ok(out)
}

/// `rows` with each row's changes (`changes[r]`) made as the engine's sampler makes them
/// ([`crate::adjust::Entry::value`]): the changed logits gathered, changed, and scattered into
/// a copy (the rows themselves may be a replayed step's fixed logits). Ids at or past the
/// rows' width are no ids of theirs.
fn adjusted(rows: &Tensor, changes: &[Option<&Adjust>]) -> Result<Tensor> {
    let (n, width) = rows.dims2()?;
    let mut at = Vec::new();
    let (mut bias, mut repeat, mut minus) = (Vec::new(), Vec::new(), Vec::new());
    for (r, change) in changes.iter().enumerate() {
        for e in change.map(Adjust::entries).unwrap_or_default() {
            if (e.id as usize) < width {
                at.push((r * width + e.id as usize) as u32);
                bias.push(e.bias);
                repeat.push(e.repeat);
                minus.push(e.minus);
            }
        }
    }
    if at.is_empty() {
        return Ok(rows.clone());
    }
    let device = rows.device();
    let on_device = |v: &[f32]| Tensor::new(v, device);
    let flat = rows.flatten_all()?;
    let at = Tensor::new(at.as_slice(), device)?;
    let v = flat.index_select(&at, 0)?.add(&on_device(&bias)?)?;
    let repeat = on_device(&repeat)?;
    let positive = v.gt(&v.zeros_like()?)?;
    let v = positive.where_cond(&v.div(&repeat)?, &v.mul(&repeat)?)?;
    let v = v.sub(&on_device(&minus)?)?;
    Ok(flat.scatter(&at, &v, 0)?.reshape((n, width))?)
}

/// A draw's numbers, as the sampler uses them.
#[derive(Debug, Clone, Copy)]
struct Draw {
    /// The inverse temperature.
    scale: f32,
    /// min-p's floor on a weight relative to the most likely id's (0: none).
    floor: f32,
    uniform: f64,
}

impl Draw {
    fn of(p: &Pick) -> Option<Self> {
        match *p {
            Pick::Draw {
                temperature,
                min_p,
                uniform,
                ..
            } => Some(Self {
                scale: 1.0 / temperature,
                floor: min_p.max(0.0),
                uniform,
            }),
            Pick::Argmax { .. } | Pick::Top { .. } => None,
        }
    }
}

/// Each row's maximum (`[rows, 1]`) and its logits less it.
fn shifted(rows: &Tensor) -> Result<(Tensor, Tensor)> {
    let max = rows.max_keepdim(D::Minus1)?;
    let shifted = rows.broadcast_sub(&max)?;
    Ok((max, shifted))
}

/// `Σ e^(logit − max)` of each row (`[rows, 1]`), given its `shifted` logits (`logit − max`):
/// the most likely id's log-probability is `−ln` of it, any other's its shifted logit less
/// that.
fn normalisers(shifted: &Tensor) -> Result<Tensor> {
    Ok(shifted.exp()?.sum_keepdim(D::Minus1)?)
}

/// Each row's `ln Σ e^logit`, from its maximum and [`normalisers`]: a logit less it is that
/// id's log-probability.
fn log_normalisers(max: &Tensor, z: &Tensor) -> Result<Tensor> {
    Ok(z.log()?.add(max)?)
}

/// Each row's most likely id and, given the rows' [`normalisers`] `z`, its log-probability:
/// one copy.
fn greedy(rows: &Tensor, z: Option<&Tensor>) -> Result<Vec<Picked>> {
    // Ids below 2^24 are exact in f32 (vocabularies are below 2^18).
    let id = rows.argmax_keepdim(D::Minus1)?.to_dtype(DType::F32)?;
    let both = match z {
        Some(z) => Tensor::cat(&[&id, z], D::Minus1)?,
        None => id,
    }
    .to_vec2::<f32>()?;
    Ok(both
        .iter()
        .map(|r| Picked {
            id: r[0] as u32,
            logprob: r.get(1).map(|z| -z.ln()),
            top: Vec::new(),
        })
        .collect())
}

/// Each row's draw (one of `draws` per row) from its `shifted` logits, with its
/// log-probability given the rows' [`normalisers`] `z`: block sums on the device, the block
/// holding the draw found on the host, then that block's weights walked on the host. A row
/// with no weight to draw by (a logit of +∞, or not a number) takes its argmax, as the
/// sampler does.
fn drawn(
    rows: &Tensor,
    shifted: &Tensor,
    z: Option<&Tensor>,
    draws: &[Draw],
) -> Result<Vec<Picked>> {
    let (n, width) = rows.dims2()?;
    let device = rows.device();
    let per_row = |f: fn(&Draw) -> f32| -> Result<Tensor> {
        Ok(Tensor::from_vec(
            draws.iter().map(f).collect(),
            (n, 1),
            device,
        )?)
    };
    let mut w = shifted.broadcast_mul(&per_row(|d| d.scale)?)?.exp()?;
    if draws.iter().any(|d| d.floor > 0.0) {
        // As the sampler: a weight below the floor is dropped.
        let kept = w.broadcast_ge(&per_row(|d| d.floor)?)?;
        w = kept.to_dtype(DType::F32)?.mul(&w)?;
    }
    let blocks = width.div_ceil(DRAW_BLOCK);
    if blocks * DRAW_BLOCK > width {
        w = w.pad_with_zeros(D::Minus1, 0, blocks * DRAW_BLOCK - width)?;
    }
    let w = w.reshape((n * blocks, DRAW_BLOCK))?;
    // Each row's block sums and, last, its normaliser: one copy.
    let block_sums = w.sum(D::Minus1)?.reshape((n, blocks))?;
    let sums = match z {
        Some(z) => Tensor::cat(&[&block_sums, z], D::Minus1)?,
        None => block_sums,
    }
    .to_vec2::<f32>()?;
    let found: Vec<Option<(usize, f64)>> = sums
        .iter()
        .zip(draws)
        .map(|(s, d)| {
            let s: Vec<f64> = s[..blocks].iter().map(|&x| f64::from(x)).collect();
            logits::block_of(&s, d.uniform)
        })
        .collect();
    let held: Vec<u32> = (0..n)
        .map(|r| (r * blocks + found[r].map_or(0, |(b, _)| b)) as u32)
        .collect();
    let held = w
        .index_select(&Tensor::new(held.as_slice(), device)?, 0)?
        .to_vec2::<f32>()?;
    let picked: Vec<Option<Picked>> = (0..n)
        .map(|r| {
            let (b, within) = found[r]?;
            let first = (b * DRAW_BLOCK) as u32;
            let weighted = (first..).zip(held[r].iter().copied());
            let id = logits::pick(weighted, f64::from(sums[r][b]), within)?;
            // The drawn weight is e^((logit − max) / T): T ln of it is the shifted logit.
            let w = held[r][(id - first) as usize];
            let logprob = sums[r]
                .get(blocks)
                .map(|z| w.ln() / draws[r].scale - z.ln());
            Some(Picked {
                id,
                logprob,
                top: Vec::new(),
            })
        })
        .collect();
    let unweighted: Vec<u32> = (0..n as u32)
        .filter(|&r| picked[r as usize].is_none())
        .collect();
    let mut fallback = if unweighted.is_empty() {
        Vec::new()
    } else {
        let unweighted = Tensor::new(unweighted.as_slice(), device)?;
        let z = z.map(|z| z.index_select(&unweighted, 0)).transpose()?;
        greedy(&rows.index_select(&unweighted, 0)?, z.as_ref())?
    }
    .into_iter();
    Ok(picked
        .into_iter()
        .map(|p| p.unwrap_or_else(|| fallback.next().expect("an argmax per unweighted row")))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Rows of `vocab` logits with a peaked head, each its own.
    fn rows(n: usize, vocab: usize) -> Vec<Vec<f32>> {
        (0..n)
            .map(|r| {
                (0..vocab)
                    .map(|i| ((i * 7919 + r * 104_729) % 997) as f32 * 0.01 - (r as f32))
                    .collect()
            })
            .collect()
    }

    fn tensor(rows: &[Vec<f32>]) -> Tensor {
        Tensor::new(rows.concat(), &Device::Cpu)
            .unwrap()
            .reshape((rows.len(), rows[0].len()))
            .unwrap()
    }

    /// The picked rows' tokens, as the host makes them from whole rows.
    fn on_host(rows: &[Vec<f32>], picks: &[Option<Pick>]) -> Vec<u32> {
        picks
            .iter()
            .zip(rows)
            .filter_map(|(p, r)| p.map(|p| p.on_host(r)))
            .collect()
    }

    /// `picks`' tokens from the device (a top list's first id, a whole row's argmax), after
    /// checking each one's log-probability against the host's log-softmax over the pick's ids,
    /// and its top ones (or its top list, with a nucleus's mass, or the whole row where that
    /// list does not hold the nucleus) against the host's (ids exactly, ties included).
    fn checked(rows: &[Vec<f32>], picks: &[Option<Pick>]) -> Vec<u32> {
        let got = answers(&tensor(rows), picks, &[]).unwrap();
        assert_eq!(got.len(), rows.len(), "an answer or none per row");
        let picked = picks
            .iter()
            .zip(rows)
            .zip(&got)
            .filter_map(|((p, r), g)| p.map(|p| (p, r, g)));
        // Equal infinities, both not numbers (a row with +∞ has no normaliser), or close.
        let same = |a: f32, b: f32| a == b || (a - b).abs() <= 1e-4 || a.is_nan() && b.is_nan();
        let ids = |t: &[(u32, f32)]| t.iter().map(|x| x.0).collect::<Vec<_>>();
        let mut out = Vec::new();
        for (p, r, g) in picked {
            let r = &r[..p.below().min(r.len() as u32) as usize];
            let g = match (g, p) {
                (Some(Answer::Top(t)), Pick::Top { k, nucleus, .. }) => {
                    let want: Vec<(u32, f32)> = logits::top_k(r, k)
                        .into_iter()
                        .map(|i| (i, r[i as usize]))
                        .collect();
                    assert_eq!(t.logits, want, "{p:?}");
                    assert!(same(t.log_z, logits::log_normaliser(r)), "{p:?}");
                    let mass = nucleus.map(|n| host_mass(r, n));
                    assert_eq!(t.mass.is_some(), mass.is_some(), "{p:?}");
                    if let (Some(got), Some(want), Some(n)) = (t.mass, mass, nucleus) {
                        assert!((got - want).abs() <= 1e-5 * want, "{p:?}: {got} vs {want}");
                        let scale = 1.0 / n.temperature;
                        assert!(logits::holds_nucleus(&want_top(r), scale, want, n.top_p));
                    }
                    out.push(t.logits[0].0);
                    continue;
                }
                (
                    None,
                    Pick::Top {
                        nucleus: Some(n), ..
                    },
                ) => {
                    // Left whole for the caller's copy.
                    let (scale, mass) = (1.0 / n.temperature, host_mass(r, n));
                    assert!(!logits::holds_nucleus(&want_top(r), scale, mass, n.top_p));
                    out.push(logits::argmax(r));
                    continue;
                }
                (Some(Answer::Picked(g)), _) => g,
                (g, p) => panic!("{p:?} answered {g:?}"),
            };
            let top = logits::top_logprobs(r, p.top_logprobs());
            assert_eq!(ids(&g.top), ids(&top), "{p:?}");
            for (a, b) in g.top.iter().zip(&top) {
                assert!(same(a.1, b.1), "{p:?}: {a:?} against {b:?}");
            }
            let want = logits::log_softmax(r)[g.id as usize];
            match g.logprob {
                Some(got) => assert!(same(got, want), "{p:?}: {got} against {want}"),
                None => assert_eq!(p.logprobs(), None, "{p:?} asked for its log-probability"),
            }
            assert_eq!(g.logprob.is_some(), p.logprobs().is_some(), "{p:?}");
            out.push(g.id);
        }
        out
    }

    /// A row's weight at `n`'s temperature, as the host sums it.
    fn host_mass(r: &[f32], n: Nucleus) -> f32 {
        let mut w = Vec::new();
        logits::softmax_weights(r, logits::max(r), 1.0 / n.temperature, &mut w);
        logits::sum_of(&w, |x| x) as f32
    }

    /// A row's top 64, as a nucleus asks for them.
    fn want_top(r: &[f32]) -> Vec<(u32, f32)> {
        logits::top_k(r, 64)
            .into_iter()
            .map(|i| (i, r[i as usize]))
            .collect()
    }

    /// Each row's changes are made on the device exactly as the host makes them (ids past a
    /// bound ignored), and the picks are then the host's from the changed rows.
    #[test]
    fn changes_are_made_before_the_pick() {
        use crate::adjust::Entry;
        let rows = rows(6, 1000);
        let change = |r: &Vec<f32>| {
            let top = logits::top_k(r, 4);
            Adjust::merged(vec![
                Entry {
                    bias: 4.0,
                    ..Entry::of(top[3] + 1)
                },
                Entry {
                    bias: -30.0,
                    ..Entry::of(top[0])
                },
                Entry {
                    repeat: 1.7,
                    minus: 0.9,
                    ..Entry::of(top[1])
                },
                Entry {
                    repeat: 2.0,
                    ..Entry::of(3)
                },
                // Past the bound of the rows picked below 700.
                Entry {
                    bias: 99.0,
                    ..Entry::of(800)
                },
            ])
        };
        let changes: Vec<Option<Adjust>> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| (i != 4).then(|| change(r)))
            .collect();
        let mut changed = rows.clone();
        for (r, c) in changed.iter_mut().zip(&changes) {
            if let Some(c) = c {
                c.apply(r);
            }
        }
        let refs: Vec<Option<&Adjust>> = changes.iter().map(Option::as_ref).collect();
        let on_device = adjusted(&tensor(&rows), &refs)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        assert_eq!(on_device, changed);
        let draw = |below, uniform| Pick::Draw {
            below,
            temperature: 0.5,
            min_p: 0.0,
            uniform,
            logprobs: None,
        };
        let picks = [
            Some(Pick::Argmax {
                below: 1000,
                logprobs: None,
            }),
            Some(Pick::Argmax {
                below: 700,
                logprobs: None,
            }),
            Some(draw(1000, 0.4)),
            Some(draw(700, 0.9)),
            Some(Pick::Argmax {
                below: 1000,
                logprobs: None,
            }),
            Some(Pick::Top {
                below: 1000,
                k: 5,
                nucleus: None,
            }),
        ];
        let got: Vec<u32> = answers(&tensor(&rows), &picks, &refs)
            .unwrap()
            .into_iter()
            .map(|a| match a {
                Some(Answer::Picked(p)) => p.id,
                Some(Answer::Top(t)) => t.logits[0].0,
                None => panic!("every pick answered"),
            })
            .collect();
        assert_eq!(got, on_host(&changed, &picks));
        assert_ne!(got, on_host(&rows, &picks), "the changes move the picks");
    }

    /// Top-p over whole rows at temperatures and shares whose nucleus the top 64 ids hold
    /// and at ones whose nucleus reaches past them, beside plain top lists, bounded and not:
    /// the top list with the row's mass where it holds the nucleus, else the whole row.
    #[test]
    fn a_nucleus_comes_with_its_top_list_or_its_whole_row() {
        let rows = rows(10, 1000);
        let nucleus = |below, temperature, top_p| {
            Some(Pick::Top {
                below,
                k: 64,
                nucleus: Some(Nucleus { temperature, top_p }),
            })
        };
        let picks: Vec<Option<Pick>> = (0..rows.len())
            .map(|r| match r % 5 {
                0 => nucleus(1000, 0.05, 0.9),
                1 => nucleus(1000, 1.0, 0.9),
                2 => nucleus(300, 0.1, 0.5),
                3 => Some(Pick::Top {
                    below: 1000,
                    k: 5,
                    nucleus: None,
                }),
                _ => nucleus(700, 2.0, 0.95),
            })
            .collect();
        let got = checked(&rows, &picks);
        assert_eq!(got, on_host(&rows, &picks));
        let answers = answers(&tensor(&rows), &picks, &[]).unwrap();
        let whole = answers.iter().filter(|a| a.is_none()).count();
        assert_eq!(
            whole, 4,
            "the two flat nuclei of each five rows reach past the top 64"
        );
    }

    /// Top lists of 1, 7 and 64 ids over rows full of exact ties, bounded at the row and
    /// below it, beside draws: the host's `top_k` exactly.
    #[test]
    fn top_lists_are_the_host_s_top_k() {
        let rows = rows(12, 1000);
        let picks: Vec<Option<Pick>> = (0..rows.len())
            .map(|r| match r % 4 {
                0 => Some(Pick::Top {
                    below: 1000,
                    k: [1, 7, 64][r % 3],
                    nucleus: None,
                }),
                1 => Some(Pick::Top {
                    below: 300,
                    k: 64,
                    nucleus: None,
                }),
                2 => None,
                _ => Some(Pick::Draw {
                    below: 1000,
                    temperature: 1.0,
                    min_p: 0.0,
                    uniform: 0.3,
                    logprobs: Some(2),
                }),
            })
            .collect();
        let got = checked(&rows, &picks);
        assert_eq!(got, on_host(&rows, &picks));
    }

    #[test]
    fn each_bounded_row_gets_the_sampler_s_greedy_id_below_its_bound() {
        let rows = rows(6, 1000);
        let argmax = |below, logprobs| Some(Pick::Argmax { below, logprobs });
        let picks = [
            argmax(1000, None),
            None,
            argmax(300, Some(20)),
            argmax(1000, Some(3)),
            None,
            argmax(5000, Some(0)),
        ];
        let got = checked(&rows, &picks);
        assert_eq!(got, on_host(&rows, &picks));
        assert_eq!(got.len(), 4);
    }

    /// Draws at several temperatures, floors, bounds (a width that is not whole blocks among
    /// them) and uniform numbers from 0 to just below 1, beside greedy rows and whole ones:
    /// the host's tokens from whole rows.
    #[test]
    fn draws_are_the_host_s_draws_from_whole_rows() {
        let vocab = 1000;
        let rows = rows(40, vocab);
        let picks: Vec<Option<Pick>> = (0..rows.len())
            .map(|r| match r % 5 {
                0 => None,
                1 => Some(Pick::Argmax {
                    below: 700,
                    logprobs: (r % 3 > 0).then_some(r % 7),
                }),
                k => Some(Pick::Draw {
                    below: [1000, 700, 1000][k - 2],
                    temperature: [0.3, 1.0, 2.5][k - 2],
                    min_p: [0.0, 0.0, 0.05][k - 2],
                    uniform: (r as f64 * 0.618_034).fract().min(0.999_999),
                    logprobs: [None, Some(5), Some(20)][k - 2],
                }),
            })
            .collect();
        let got = checked(&rows, &picks);
        assert_eq!(got, on_host(&rows, &picks));
        let drawn: std::collections::HashSet<u32> = got.iter().copied().collect();
        assert!(
            drawn.len() > 10,
            "the draws spread over the rows: {drawn:?}"
        );
    }

    /// A row with a logit of +∞ has no weights to draw by: its argmax, as the sampler. A row
    /// with one finite logit draws it whatever the uniform number.
    #[test]
    fn rows_without_weights_to_draw_by_take_their_argmax() {
        let mut rows = rows(3, 600);
        rows[0][321] = f32::INFINITY;
        rows[1].iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
        rows[1][512] = 0.5;
        let draw = |uniform| {
            Some(Pick::Draw {
                below: 600,
                temperature: 1.0,
                min_p: 0.0,
                uniform,
                logprobs: Some(2),
            })
        };
        let picks = [draw(0.5), draw(0.999), draw(0.0)];
        let got = checked(&rows, &picks);
        assert_eq!(&got[..2], &[321, 512]);
        assert_eq!(got, on_host(&rows, &picks));
    }
}
