//! Causal attention of query heads against a sequence's KV blocks, read in place.
//!
//! Within a block, one KV head's keys are stored transposed (`[head_dim][slot]`) and its values
//! as rows (`[slot][head_dim]`). Scores for a whole block are then `Σ_d q[d]·K[d][·]`, a
//! multiply-add of one broadcast query element into a vector of slots per dimension, with no
//! horizontal sums; values accumulate as `out += p·V[slot]`, vectorised over the head dimension.
//! Nothing is gathered or copied per step: the block table is walked directly.
//!
//! Keys and values are stored as IEEE half floats (as llama.cpp's default cache): half the
//! memory per token, so a KV budget holds twice the tokens (measured on a Zen 3, attention was
//! not faster for reading half the bytes: it is not bound by DRAM there; widening them is what
//! costs, which is why the AVX2 kernel in `grouped` widens each once for all the query heads
//! that share it). They are widened to f32 exactly on load (F16C's `vcvtph2ps` where the CPU
//! has it, the same conversion in software otherwise) and every product and sum stays f32, so
//! every path gives the same bits.

use super::dot::{reduce8, DotPath};
use super::exp::exp;

#[cfg(target_arch = "x86_64")]
mod grouped;

/// Slots (or output dimensions) in one group: a 512-bit vector of f32, or two 256-bit ones.
const LANES: usize = 16;
/// Groups of sixteen slots whose score chains run side by side. Each score is one chain of
/// multiply-adds over the head dimension; a single chain waits on the FMA latency at every
/// step, so four groups (eight 256-bit chains under AVX2) keep the FMA units busy.
const GROUPS: usize = 4;
/// Output dimensions whose value chains run side by side, for the same reason (64 covers the
/// common head dimension in one pass over the positions).
const DIMS: usize = 64;

/// One layer's K and V pools, as the attention kernel reads them.
#[derive(Debug, Clone, Copy)]
pub struct KvView<'a> {
    /// Half floats, as bits.
    pub k: &'a [u16],
    pub v: &'a [u16],
    pub block_size: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl KvView<'_> {
    /// Start of `(block, head)`'s `block_size × head_dim` floats in either pool.
    #[inline]
    pub fn base(&self, block: usize, head: usize) -> usize {
        (block * self.kv_heads + head) * self.block_size * self.head_dim
    }

    /// Offset of element `d` of `slot`'s key (transposed layout).
    #[inline]
    pub fn k_offset(&self, block: usize, head: usize, slot: usize, d: usize) -> usize {
        self.base(block, head) + d * self.block_size + slot
    }

    /// Offset of `slot`'s value vector.
    #[inline]
    pub fn v_offset(&self, block: usize, head: usize, slot: usize) -> usize {
        self.base(block, head) + slot * self.head_dim
    }
}

/// How a kernel turns stored half floats into f32 (exactly, whichever it is).
trait Widen {
    fn widen<const N: usize>(src: &[u16]) -> [f32; N];
    fn one(x: u16) -> f32 {
        half::f16::from_bits(x).to_f32_const()
    }
}

/// Software conversion: the reference, and CPUs without F16C.
struct SoftHalf;

impl Widen for SoftHalf {
    #[inline(always)]
    fn widen<const N: usize>(src: &[u16]) -> [f32; N] {
        std::array::from_fn(|i| Self::one(src[i]))
    }
}

/// F16C's `vcvtph2ps`, eight at a time. Only used from functions compiled with F16C enabled,
/// on CPUs that have it.
#[cfg(target_arch = "x86_64")]
struct F16c;

#[cfg(target_arch = "x86_64")]
impl Widen for F16c {
    #[inline(always)]
    fn widen<const N: usize>(src: &[u16]) -> [f32; N] {
        use half::slice::HalfBitsSliceExt;
        // SAFETY: the caller runs with F16C and AVX enabled (see the type's doc); `N` values.
        unsafe { super::f16c::widen::<N>(src[..N].reinterpret_cast()) }
    }
}

/// Computes `softmax(q·Kᵀ·scale) · V` over positions `0..ctx_len` of the sequence whose blocks
/// are `block_table`, for the query heads in `q` (one or more, `head_dim` each, one after
/// another), which all share KV head `kv_head`; `out` receives each head's result in the same
/// layout. `scores` is scratch space. A head's result is the same whichever heads it is
/// computed with.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    path: DotPath,
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
    assert!(
        hd > 0 && !q.is_empty() && q.len().is_multiple_of(hd),
        "query is not a whole number of heads"
    );
    assert_eq!(out.len(), q.len(), "output and query differ in size");
    assert!(kv_head < kv.kv_heads, "no KV head {kv_head}");
    assert!(
        block_table.len() * kv.block_size >= ctx_len,
        "block table too short"
    );
    match path {
        #[cfg(target_arch = "x86_64")]
        DotPath::Avx2Fma => {
            // The grouped kernel on every CPU with F16C, AVX-512 ones included: a 512-bit build
            // of the per-head body measured half its speed on a Zen 4 (3 heads sharing a KV
            // head at context 512: 3.4–3.5 against 1.7–2.2 µs per head, `make bench-kernels`).
            if f16c() {
                // SAFETY: `best_path` only reports AVX2+FMA when the CPU has them; F16C was
                // detected.
                unsafe {
                    grouped::attend_avx2(q, kv, kv_head, block_table, ctx_len, scale, scores, out)
                }
            } else {
                each_head(q, out, hd, scores, |q, scores, out| {
                    // SAFETY: as above, without F16C (software widening).
                    unsafe {
                        attend_avx2_soft(q, kv, kv_head, block_table, ctx_len, scale, scores, out)
                    }
                });
            }
        }
        DotPath::Scalar => each_head(q, out, hd, scores, |q, scores, out| {
            attend_body::<SoftHalf>(q, kv, kv_head, block_table, ctx_len, scale, scores, out)
        }),
    }
}

/// Runs `body(q, scores, out)` for each head in turn: for the kernels that do not share work
/// between the heads of a group.
fn each_head(
    q: &[f32],
    out: &mut [f32],
    hd: usize,
    scores: &mut Vec<f32>,
    mut body: impl FnMut(&[f32], &mut Vec<f32>, &mut [f32]),
) {
    for (q, out) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
        body(q, scores, out);
    }
}

#[cfg(target_arch = "x86_64")]
fn f16c() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| std::is_x86_feature_detected!("f16c"))
}

/// The kernel compiled for AVX2 + FMA on CPUs without F16C (software widening, one head at a
/// time): the multiply-adds become instructions, not library calls, and the fixed-width loops
/// vectorise. Same operations in the same order as the scalar build, so the same bits.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_avx2_soft(
    q: &[f32],
    kv: &KvView<'_>,
    kv_head: usize,
    block_table: &[u32],
    ctx_len: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_body::<SoftHalf>(q, kv, kv_head, block_table, ctx_len, scale, scores, out)
}

/// The kernel. Each score is a multiply-add chain over the head dimension in order, each output
/// element a chain over the positions in order; how many chains run side by side (full groups
/// of sixteen, four groups at once, or a partial group alone) never changes a value.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_body<H: Widen>(
    q: &[f32],
    kv: &KvView<'_>,
    kv_head: usize,
    block_table: &[u32],
    ctx_len: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let (hd, bs) = (kv.head_dim, kv.block_size);
    scores.clear();
    scores.resize(ctx_len, 0.0);

    // Scores: full groups of sixteen slots are gathered (key offset, score offset) and run
    // GROUPS at a time; a partial group (a block's tail) runs alone.
    let mut pending = [(0usize, 0usize); GROUPS];
    let mut count = 0;
    for bi in 0..ctx_len.div_ceil(bs) {
        let base = kv.base(block_table[bi] as usize, kv_head);
        let slots = (ctx_len - bi * bs).min(bs);
        for s0 in (0..slots).step_by(LANES) {
            let n = (slots - s0).min(LANES);
            if n < LANES {
                let chunk = &mut scores[bi * bs + s0..bi * bs + s0 + n];
                partial_scores::<H>(q, &kv.k[base..base + hd * bs], bs, chunk, s0);
                continue;
            }
            pending[count] = (base + s0, bi * bs + s0);
            count += 1;
            if count == GROUPS {
                score_groups::<H, GROUPS>(q, kv.k, bs, &pending, scores);
                count = 0;
            }
        }
    }
    match count {
        1 => score_groups::<H, 1>(q, kv.k, bs, &pending[..1], scores),
        2 => score_groups::<H, 2>(q, kv.k, bs, &pending[..2], scores),
        3 => score_groups::<H, 3>(q, kv.k, bs, &pending[..3], scores),
        _ => {}
    }

    let sum = softmax_numerators(scores, scale);

    // Values: DIMS output dimensions at a time, then sixteen, then a partial group.
    let mut d0 = 0;
    while d0 < hd {
        let width = hd - d0;
        if width >= DIMS {
            values::<H, DIMS>(
                scores,
                kv,
                kv_head,
                block_table,
                d0,
                &mut out[d0..d0 + DIMS],
            );
            d0 += DIMS;
        } else if width >= LANES {
            values::<H, LANES>(
                scores,
                kv,
                kv_head,
                block_table,
                d0,
                &mut out[d0..d0 + LANES],
            );
            d0 += LANES;
        } else {
            partial_values::<H>(scores, kv, kv_head, block_table, d0, &mut out[d0..]);
            d0 = hd;
        }
    }
    normalise(out, sum);
}

/// Scores of `G` full groups of sixteen slots: `groups[g] = (offset of the group's first key
/// element in `k`, index of its first score)`.
#[inline(always)]
fn score_groups<H: Widen, const G: usize>(
    q: &[f32],
    k: &[u16],
    bs: usize,
    groups: &[(usize, usize)],
    scores: &mut [f32],
) {
    let keys: [&[u16]; G] = std::array::from_fn(|g| {
        let at = groups[g].0;
        &k[at..at + (q.len() - 1) * bs + LANES]
    });
    let mut acc = [[0f32; LANES]; G];
    for (d, qd) in q.iter().enumerate() {
        for g in 0..G {
            let row: [f32; LANES] = H::widen(&keys[g][d * bs..d * bs + LANES]);
            for l in 0..LANES {
                acc[g][l] = qd.mul_add(row[l], acc[g][l]);
            }
        }
    }
    for g in 0..G {
        let at = groups[g].1;
        scores[at..at + LANES].copy_from_slice(&acc[g]);
    }
}

/// Scores of fewer than sixteen slots starting at `s0` of one block (`kt` its transposed keys),
/// as the same chains the full groups compute.
#[inline(always)]
fn partial_scores<H: Widen>(q: &[f32], kt: &[u16], bs: usize, out: &mut [f32], s0: usize) {
    let n = out.len();
    let mut acc = [0f32; LANES];
    for (d, qd) in q.iter().enumerate() {
        for (a, k) in acc[..n].iter_mut().zip(&kt[d * bs + s0..d * bs + s0 + n]) {
            *a = qd.mul_add(H::one(*k), *a);
        }
    }
    out.copy_from_slice(&acc[..n]);
}

/// Output dimensions `d0..d0 + W` of `Σ_t p[t]·V[t]`, each a chain over positions in order.
#[inline(always)]
fn values<H: Widen, const W: usize>(
    scores: &[f32],
    kv: &KvView<'_>,
    kv_head: usize,
    block_table: &[u32],
    d0: usize,
    out: &mut [f32],
) {
    let hd = kv.head_dim;
    let mut acc = [0f32; W];
    for (bi, chunk) in scores.chunks(kv.block_size).enumerate() {
        let base = kv.base(block_table[bi] as usize, kv_head) + d0;
        for (slot, p) in chunk.iter().enumerate() {
            let at = base + slot * hd;
            let v: [f32; W] = H::widen(&kv.v[at..at + W]);
            for l in 0..W {
                acc[l] = p.mul_add(v[l], acc[l]);
            }
        }
    }
    out.copy_from_slice(&acc);
}

/// Output dimensions `d0..d0 + out.len()` (fewer than sixteen) of `Σ_t p[t]·V[t]`.
#[inline(always)]
fn partial_values<H: Widen>(
    scores: &[f32],
    kv: &KvView<'_>,
    kv_head: usize,
    block_table: &[u32],
    d0: usize,
    out: &mut [f32],
) {
    let (n, hd) = (out.len(), kv.head_dim);
    let mut acc = [0f32; LANES];
    for (bi, chunk) in scores.chunks(kv.block_size).enumerate() {
        let base = kv.base(block_table[bi] as usize, kv_head);
        for (slot, p) in chunk.iter().enumerate() {
            let at = base + slot * hd + d0;
            for (a, v) in acc[..n].iter_mut().zip(&kv.v[at..at + n]) {
                *a = p.mul_add(H::one(*v), *a);
            }
        }
    }
    out.copy_from_slice(&acc[..n]);
}

/// Scales the raw scores and replaces each with `exp(s − max)`; returns their sum, taken in
/// eight lanes (`reduce8`) and then the tail in order.
#[inline(always)]
fn softmax_numerators(scores: &mut [f32], scale: f32) -> f32 {
    // The maximum in eight lanes, so the loop vectorises (a maximum does not depend on the
    // order it is taken in).
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = scores.chunks_exact_mut(8);
    for chunk in &mut chunks {
        for (s, lane) in chunk.iter_mut().zip(lanes.iter_mut()) {
            *s *= scale;
            *lane = lane.max(*s);
        }
    }
    let mut max = lanes.iter().fold(f32::NEG_INFINITY, |m, l| m.max(*l));
    for s in chunks.into_remainder() {
        *s *= scale;
        max = max.max(*s);
    }
    let mut lanes = [0f32; 8];
    let mut chunks = scores.chunks_exact_mut(8);
    for chunk in &mut chunks {
        for (s, lane) in chunk.iter_mut().zip(lanes.iter_mut()) {
            *s = exp(*s - max);
            *lane += *s;
        }
    }
    let mut sum = reduce8(lanes);
    for s in chunks.into_remainder() {
        *s = exp(*s - max);
        sum += *s;
    }
    sum
}

#[inline(always)]
fn normalise(out: &mut [f32], sum: f32) {
    let inv = 1.0 / sum;
    for o in out.iter_mut() {
        *o *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dot::best_path;

    /// Scattered blocks give the same result as the textbook formula on contiguous K and V,
    /// for shapes with only partial groups of sixteen, only full ones, and both; and every path
    /// gives the scalar code's bits.
    #[test]
    fn reads_scattered_blocks_like_contiguous_attention() {
        for (bs, hd, ctx) in [
            (4, 8, 11),
            (16, 64, 48),
            (16, 72, 37),
            (16, 64, 150),
            (32, 80, 133),
            (16, 144, 97),
            (16, 20, 45),
        ] {
            check_shape(bs, hd, ctx);
        }
    }

    fn check_shape(bs: usize, hd: usize, ctx: usize) {
        let heads = 2;
        let blocks = ctx.div_ceil(bs) + 3;
        // Blocks in reverse order, so the table is not the identity.
        let table: Vec<u32> = (0..ctx.div_ceil(bs))
            .map(|i| (blocks - 1 - i) as u32)
            .collect();
        let mut k = vec![0u16; blocks * heads * bs * hd];
        let mut v = vec![0u16; blocks * heads * bs * hd];
        // Values as the cache holds them: rounded to half floats.
        let val = |t: usize, d: usize, salt: usize| {
            half::f16::from_f32(((t * 31 + d * 7 + salt) % 13) as f32 / 13.0 - 0.5).to_f32()
        };
        let bits = |x: f32| half::f16::from_f32(x).to_bits();
        let view_dims = KvView {
            k: &[],
            v: &[],
            block_size: bs,
            kv_heads: heads,
            head_dim: hd,
        };
        for t in 0..ctx {
            let (block, slot) = (table[t / bs] as usize, t % bs);
            let vo = view_dims.v_offset(block, 1, slot);
            for d in 0..hd {
                k[view_dims.k_offset(block, 1, slot, d)] = bits(val(t, d, 1));
                v[vo + d] = bits(val(t, d, 2));
            }
        }
        let view = KvView {
            k: &k,
            v: &v,
            ..view_dims
        };
        let run = |path, q: &[f32]| {
            let mut out = vec![0.0; q.len()];
            attend(
                path,
                q,
                &view,
                1,
                &table,
                ctx,
                0.3,
                &mut Vec::new(),
                &mut out,
            );
            out
        };
        // Up to six query heads sharing the KV head (a group larger than one pass takes, and
        // partial groups): each head's result equals the scalar path's for that head alone.
        let q_heads = 6;
        let qs: Vec<f32> = (0..q_heads * hd)
            .map(|i| ((i * 37 % 101) as f32 / 50.0 - 1.0) * if i < hd { 1.0 } else { 0.7 })
            .collect();
        for heads in 1..=q_heads {
            let together = run(best_path(), &qs[..heads * hd]);
            for h in 0..heads {
                let alone = run(DotPath::Scalar, &qs[h * hd..(h + 1) * hd]);
                let got = &together[h * hd..(h + 1) * hd];
                assert!(
                    got.iter()
                        .zip(&alone)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "bs {bs} hd {hd} head {h} of {heads}: SIMD {got:?} vs scalar {alone:?}"
                );
            }
        }

        let q: Vec<f32> = (0..hd)
            .map(|d| d as f32 / (hd as f32 / 2.0) - 1.0)
            .collect();
        let out = run(best_path(), &q);
        let scalar = run(DotPath::Scalar, &q);
        assert!(
            out.iter()
                .zip(&scalar)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "bs {bs} hd {hd}: SIMD {out:?} vs scalar {scalar:?}"
        );

        let s: Vec<f64> = (0..ctx)
            .map(|t| {
                (0..hd)
                    .map(|d| f64::from(q[d]) * f64::from(val(t, d, 1)))
                    .sum::<f64>()
                    * 0.3
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
        for (d, got) in out.iter().enumerate() {
            let e: f64 = (0..ctx)
                .map(|t| (s[t] - m).exp() / z * f64::from(val(t, d, 2)))
                .sum();
            assert!(
                (f64::from(*got) - e).abs() < 1e-5,
                "bs {bs} hd {hd} d {d}: {got} vs {e}"
            );
        }
    }
}
