//! The AVX2 kernel: the query heads that share a KV head, run together.
//!
//! On AVX2 the kernel's cost is not the multiply-adds but widening the half-float cache:
//! `vcvtph2ps` runs at one per cycle, the multiply-adds at two, and a head needs one conversion
//! per multiply-add. In grouped-query attention several query heads read the same keys and
//! values, so here each stored element is widened once and used by every head of the group
//! (up to [`MAX_HEADS`] at a time; larger groups are taken in parts). Each head's scores,
//! softmax and value sums are the same operations in the same order as
//! [`super::attend_body`]'s, so every value equals the scalar reference's bit for bit; only how
//! many chains run side by side differs.

// Heads, slot groups and lanes index parallel arrays; index loops say that best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::super::dot::avx2::reduce;
use super::super::exp::exp;
use super::super::f16c;
use super::{normalise, partial_scores, partial_values, F16c, KvView};

/// Query heads handled in one pass over a KV head's blocks.
const MAX_HEADS: usize = 4;
/// Slots (scores) or dimensions (values) in one 256-bit vector.
const UNIT: usize = 8;
/// How many blocks ahead of the one being read the kernel asks for keys and values. A batched
/// decode step reads every sequence's whole cache (16 sequences at context 512: 190 MB, twice
/// the weights) from memory, and a sequence's blocks lie anywhere in the pool, so the hardware
/// prefetcher starts over at every 2 KiB block; two blocks of work (~1 µs) cover a DRAM access.
const AHEAD: usize = 2;

/// Asks for the keys or values (`pool`: the K or V pool) of `kv_head` in the sequence's block
/// `bi + AHEAD`, if `table` (the blocks the context covers) has it.
#[inline(always)]
fn prefetch_block(pool: &[u16], kv: &KvView<'_>, kv_head: usize, table: &[u32], bi: usize) {
    let next = bi + AHEAD;
    if next >= table.len() {
        return;
    }
    let start = pool
        .as_ptr()
        .wrapping_add(kv.base(table[next] as usize, kv_head));
    // 32 half floats per 64-byte line; a prefetch never faults, even out of range.
    for off in (0..kv.head_dim * kv.block_size).step_by(32) {
        // SAFETY: a prefetch hint reads nothing architecturally.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(off) as *const i8) };
    }
}

/// Attention for `q.len() / head_dim` query heads sharing `kv_head`; `q` and `out` hold the
/// heads one after another.
///
/// # Safety
/// AVX2, FMA and F16C; shapes as [`super::attend`] checks them.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn attend_avx2(
    q: &[f32],
    kv: &KvView<'_>,
    kv_head: usize,
    block_table: &[u32],
    ctx_len: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let hd = kv.head_dim;
    let heads = q.len() / hd;
    let mut h0 = 0;
    while h0 < heads {
        let g = (heads - h0).min(MAX_HEADS);
        let (q, out) = (&q[h0 * hd..(h0 + g) * hd], &mut out[h0 * hd..(h0 + g) * hd]);
        let args = (kv, kv_head, block_table, ctx_len, scale);
        // Each score and each output element is a multiply-add chain; a chain waits four
        // cycles per step, so eight or more side by side (G heads × U vectors) keep both FMA
        // units busy, within the sixteen vector registers.
        match g {
            1 => group::<1, 8>(q, args, scores, out),
            2 => group::<2, 4>(q, args, scores, out),
            3 => group::<3, 3>(q, args, scores, out),
            _ => group::<4, 2>(q, args, scores, out),
        }
        h0 += g;
    }
}

type Args<'a, 'b> = (&'a KvView<'b>, usize, &'a [u32], usize, f32);

/// `G` heads; `U` vectors of eight slots (scores) or dimensions (values) per head per pass.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn group<const G: usize, const U: usize>(
    q: &[f32],
    (kv, kv_head, block_table, ctx_len, scale): Args<'_, '_>,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let (hd, bs) = (kv.head_dim, kv.block_size);
    let qs: [&[f32]; G] = std::array::from_fn(|h| &q[h * hd..(h + 1) * hd]);
    scores.clear();
    scores.resize(G * ctx_len, 0.0);

    // Scores: full vectors of eight slots, U at a time; a block's last few slots per head.
    let mut pending = [(0usize, 0usize); U];
    let mut count = 0;
    let blocks = ctx_len.div_ceil(bs);
    for bi in 0..blocks {
        let base = kv.base(block_table[bi] as usize, kv_head);
        let slots = (ctx_len - bi * bs).min(bs);
        prefetch_block(kv.k, kv, kv_head, &block_table[..blocks], bi);
        for s0 in (0..slots).step_by(UNIT) {
            let n = (slots - s0).min(UNIT);
            if n < UNIT {
                for (h, q) in qs.iter().enumerate() {
                    let at = h * ctx_len + bi * bs + s0;
                    let keys = &kv.k[base..base + hd * bs];
                    partial_scores::<F16c>(q, keys, bs, &mut scores[at..at + n], s0);
                }
                continue;
            }
            pending[count] = (base + s0, bi * bs + s0);
            count += 1;
            if count == U {
                score_units::<G, U>(&qs, kv.k, bs, &pending, ctx_len, scores);
                count = 0;
            }
        }
    }
    // Fewer than U vectors left: one at a time.
    for &p in &pending[..count] {
        score_units::<G, 1>(&qs, kv.k, bs, &[p], ctx_len, scores);
    }

    let mut sums = [0f32; G];
    for (h, sum) in sums.iter_mut().enumerate() {
        // SAFETY: AVX2 and FMA are enabled here.
        *sum = unsafe { softmax_numerators(&mut scores[h * ctx_len..(h + 1) * ctx_len], scale) };
    }

    // Values: 8·U output dimensions at a time, then sixteen, then eight, then the last few
    // per head. Each pass reads every position's values and broadcasts every weight, so a
    // head dimension of 64 with U = 3 goes 24 + 24 + 16, not 24 + 24 + 8 + 8.
    let mut d0 = 0;
    while d0 < hd {
        let width = hd - d0;
        if width >= UNIT * U {
            values::<G, U>(scores, ctx_len, kv, kv_head, block_table, d0, out);
            d0 += UNIT * U;
        } else if U > 2 && width >= 2 * UNIT {
            values::<G, 2>(scores, ctx_len, kv, kv_head, block_table, d0, out);
            d0 += 2 * UNIT;
        } else if width >= UNIT {
            values::<G, 1>(scores, ctx_len, kv, kv_head, block_table, d0, out);
            d0 += UNIT;
        } else {
            for h in 0..G {
                let p = &scores[h * ctx_len..(h + 1) * ctx_len];
                let o = &mut out[h * hd + d0..(h + 1) * hd];
                partial_values::<F16c>(p, kv, kv_head, block_table, d0, o);
            }
            d0 = hd;
        }
    }
    for (h, sum) in sums.iter().enumerate() {
        normalise(&mut out[h * hd..(h + 1) * hd], *sum);
    }
}

/// Eight widened half floats at `p`.
///
/// # Safety
/// F16C; eight u16 readable at `p`.
#[inline(always)]
unsafe fn widen8(p: *const u16) -> __m256 {
    // SAFETY: the caller's guarantee; f16 is u16 bits.
    unsafe { f16c::eight(p.cast()) }
}

/// Scores of `U` vectors of eight slots for `G` heads: `units[u] = (offset of the unit's
/// first key element in `k`, index of its first score)`; head `h`'s scores start at
/// `h · ctx_len`. Each score is `Σ_d q[d]·k[d]` as one multiply-add chain over `d` in order.
#[target_feature(enable = "avx2,fma,f16c")]
// Not inlined: alone, its accumulators get the vector registers (inlined, constants
// hoisted from the rest of the kernel pushed two of them onto the stack).
#[inline(never)]
fn score_units<const G: usize, const U: usize>(
    qs: &[&[f32]; G],
    k: &[u16],
    bs: usize,
    units: &[(usize, usize)],
    ctx_len: usize,
    scores: &mut [f32],
) {
    let hd = qs[0].len();
    assert!(qs.iter().all(|q| q.len() == hd));
    for &(key, at) in &units[..U] {
        assert!(
            key + (hd - 1) * bs + UNIT <= k.len(),
            "key unit out of range"
        );
        assert!((G - 1) * ctx_len + at + UNIT <= scores.len());
    }
    let mut acc = [[_mm256_setzero_ps(); U]; G];
    for d in 0..hd {
        let mut qd = [_mm256_setzero_ps(); G];
        for h in 0..G {
            // SAFETY: d < hd, every query's length (asserted above).
            qd[h] = _mm256_set1_ps(unsafe { *qs[h].get_unchecked(d) });
        }
        for u in 0..U {
            // SAFETY: the unit's keys at row d are in range (asserted above).
            let kd = unsafe { widen8(k.as_ptr().add(units[u].0 + d * bs)) };
            for h in 0..G {
                acc[h][u] = _mm256_fmadd_ps(qd[h], kd, acc[h][u]);
            }
        }
    }
    for h in 0..G {
        for u in 0..U {
            // SAFETY: eight scores from here are in range (asserted above).
            unsafe {
                let at = scores.as_mut_ptr().add(h * ctx_len + units[u].1);
                _mm256_storeu_ps(at, acc[h][u]);
            }
        }
    }
}

/// Output dimensions `d0..d0 + 8·U` of `Σ_t p[t]·V[t]` for `G` heads (head `h`'s weights at
/// `scores[h · ctx_len..]`, its output at `out[h · head_dim..]`), each a chain over the
/// positions in order.
#[target_feature(enable = "avx2,fma,f16c")]
// Not inlined: alone, its accumulators get the vector registers (inlined, constants
// hoisted from the rest of the kernel pushed two of them onto the stack).
#[inline(never)]
fn values<const G: usize, const U: usize>(
    scores: &[f32],
    ctx_len: usize,
    kv: &KvView<'_>,
    kv_head: usize,
    block_table: &[u32],
    d0: usize,
    out: &mut [f32],
) {
    let (hd, bs) = (kv.head_dim, kv.block_size);
    assert!(d0 + UNIT * U <= hd && scores.len() >= G * ctx_len && out.len() >= G * hd);
    let mut acc = [[_mm256_setzero_ps(); U]; G];
    let blocks = ctx_len.div_ceil(bs);
    for bi in 0..blocks {
        let base = kv.base(block_table[bi] as usize, kv_head) + d0;
        let slots = (ctx_len - bi * bs).min(bs);
        if d0 == 0 {
            // The first pass brings the values in; the later ones find them in L2.
            prefetch_block(kv.v, kv, kv_head, &block_table[..blocks], bi);
        }
        assert!(
            base + (slots - 1) * hd + UNIT * U <= kv.v.len(),
            "value block out of range"
        );
        for slot in 0..slots {
            let t = bi * bs + slot;
            let mut v = [_mm256_setzero_ps(); U];
            for u in 0..U {
                // SAFETY: 8·U values from the slot's d0 are in range (asserted above).
                v[u] = unsafe { widen8(kv.v.as_ptr().add(base + slot * hd + u * UNIT)) };
            }
            for h in 0..G {
                // SAFETY: t < ctx_len, so the weight is inside `scores` (asserted above).
                let p = _mm256_set1_ps(unsafe { *scores.get_unchecked(h * ctx_len + t) });
                for u in 0..U {
                    acc[h][u] = _mm256_fmadd_ps(p, v[u], acc[h][u]);
                }
            }
        }
    }
    for h in 0..G {
        for u in 0..U {
            // SAFETY: inside this head's output (asserted above).
            unsafe {
                let at = out.as_mut_ptr().add(h * hd + d0 + u * UNIT);
                _mm256_storeu_ps(at, acc[h][u]);
            }
        }
    }
}

/// [`super::softmax_numerators`] in AVX2 registers: the same operations (the maximum in eight
/// lanes, [`super::exp`]'s steps eight at a time, the sum in eight lanes reduced as `reduce8`,
/// then the tail in order), which the compiler left two floats wide.
///
/// # Safety
/// AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
// Not inlined: inlined, its constants (`exp`'s coefficients and clamps) were hoisted into the
// caller, where they took the registers the score and value loops need.
#[inline(never)]
unsafe fn softmax_numerators(scores: &mut [f32], scale: f32) -> f32 {
    let full = scores.len() / UNIT * UNIT;
    let p = scores.as_mut_ptr();
    let sc = _mm256_set1_ps(scale);
    let mut lanes = _mm256_set1_ps(f32::NEG_INFINITY);
    for i in (0..full).step_by(UNIT) {
        // SAFETY: i + 8 <= len.
        unsafe {
            let s = _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), sc);
            _mm256_storeu_ps(p.add(i), s);
            // `max_ps(s, lanes)` is `lanes` when `s` is NaN, as `f32::max` ignores NaN.
            lanes = _mm256_max_ps(s, lanes);
        }
    }
    let mut l = [0f32; UNIT];
    // SAFETY: eight floats.
    unsafe { _mm256_storeu_ps(l.as_mut_ptr(), lanes) };
    let mut max = l.iter().fold(f32::NEG_INFINITY, |m, x| m.max(*x));
    for s in &mut scores[full..] {
        *s *= scale;
        max = max.max(*s);
    }
    let p = scores.as_mut_ptr();
    let mx = _mm256_set1_ps(max);
    let mut sum = _mm256_setzero_ps();
    for i in (0..full).step_by(UNIT) {
        // SAFETY: i + 8 <= len.
        unsafe {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), mx));
            _mm256_storeu_ps(p.add(i), e);
            sum = _mm256_add_ps(sum, e);
        }
    }
    // SAFETY: AVX is enabled.
    let mut total = unsafe { reduce(sum) };
    for s in &mut scores[full..] {
        *s = exp(*s - max);
        total += *s;
    }
    total
}

/// [`super::exp`] on eight lanes: the same constants and the same operations in the same order.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn exp8(x: __m256) -> __m256 {
    use super::super::exp::consts::*;
    // `clamp`: max/min return their second operand when either is NaN, so `x` goes second and
    // NaN stays NaN, as `f32::clamp` keeps it.
    let x = _mm256_min_ps(
        _mm256_set1_ps(88.0),
        _mm256_max_ps(_mm256_set1_ps(-87.0), x),
    );
    let round = _mm256_set1_ps(ROUND);
    let t = _mm256_fmadd_ps(x, _mm256_set1_ps(LOG2_E), round);
    let n = _mm256_sub_ps(t, round);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
    let mut p = _mm256_set1_ps(POLY[0]);
    for c in &POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
    }
    let ni = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(round));
    let scale = _mm256_slli_epi32::<23>(_mm256_add_epi32(ni, _mm256_set1_epi32(127)));
    _mm256_mul_ps(p, _mm256_castsi256_ps(scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `exp8` gives `exp`'s bits lane by lane, across the range, at the clamps, for infinities
    /// and NaN.
    #[test]
    fn exp8_is_exp_lane_by_lane() {
        if !std::is_x86_feature_detected!("avx2") || !std::is_x86_feature_detected!("fma") {
            return;
        }
        let mut xs: Vec<f32> = (0..200_000).map(|i| -100.0 + i as f32 * 0.001).collect();
        xs.extend([
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            0.0,
            88.5,
            -87.5,
            1e30,
        ]);
        while !xs.len().is_multiple_of(UNIT) {
            xs.push(0.5);
        }
        for chunk in xs.chunks_exact(UNIT) {
            let mut got = [0f32; UNIT];
            // SAFETY: AVX2 and FMA were detected; eight floats each way.
            unsafe { _mm256_storeu_ps(got.as_mut_ptr(), exp8(_mm256_loadu_ps(chunk.as_ptr()))) };
            for (x, g) in chunk.iter().zip(got) {
                let want = exp(*x);
                assert!(
                    want.to_bits() == g.to_bits() || (want.is_nan() && g.is_nan()),
                    "exp({x}) = {want}, exp8 gave {g}"
                );
            }
        }
    }
}
