//! Causal attention of one query head against a sequence's KV blocks, read in place.
//!
//! Within a block, one KV head's keys are stored transposed (`[head_dim][slot]`) and its values
//! as rows (`[slot][head_dim]`). Scores for a whole block are then `Σ_d q[d]·K[d][·]`, a
//! multiply-add of one broadcast query element into a vector of slots per dimension, with no
//! horizontal sums; values accumulate as `out += p·V[slot]`, vectorised over the head dimension.
//! Nothing is gathered or copied per step: the block table is walked directly.

use super::dot::DotPath;

/// Slots (or output dimensions) processed together: one 512-bit vector of f32.
const LANES: usize = 16;

/// One layer's K and V pools, as the attention kernel reads them.
#[derive(Debug, Clone, Copy)]
pub struct KvView<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
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

/// Computes `softmax(q·Kᵀ·scale) · V` over positions `0..ctx_len` of the sequence whose blocks
/// are `block_table`, for one query head sharing KV head `kv_head`. `scores` is scratch space.
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
    match path {
        // SAFETY: `best_path` only reports AVX2+FMA when the CPU has them.
        #[cfg(target_arch = "x86_64")]
        DotPath::Avx2Fma => {
            if avx512() {
                // SAFETY: checked just above.
                unsafe { attend_avx512(q, kv, kv_head, block_table, ctx_len, scale, scores, out) }
            } else {
                // SAFETY: AVX2 and FMA are present.
                unsafe { attend_avx2(q, kv, kv_head, block_table, ctx_len, scale, scores, out) }
            }
        }
        DotPath::Scalar => attend_body(q, kv, kv_head, block_table, ctx_len, scale, scores, out),
    }
}

#[cfg(target_arch = "x86_64")]
fn avx512() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| std::is_x86_feature_detected!("avx512f"))
}

/// The same code compiled for AVX2 + FMA: the multiply-adds become instructions, not library
/// calls, and the loops vectorise. Every path computes the same operations in the same order.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_avx2(
    q: &[f32],
    kv: &KvView<'_>,
    kv_head: usize,
    block_table: &[u32],
    ctx_len: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_body(q, kv, kv_head, block_table, ctx_len, scale, scores, out)
}

/// The kernel with explicit 512-bit vectors for full groups of sixteen slots or dimensions,
/// computing exactly the chains `attend_body` defines (so results equal the other paths).
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_avx512(
    q: &[f32],
    kv: &KvView<'_>,
    kv_head: usize,
    block_table: &[u32],
    ctx_len: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    use std::arch::x86_64::*;
    let (hd, bs) = (kv.head_dim, kv.block_size);
    assert_eq!(q.len(), hd);
    assert_eq!(out.len(), hd);
    assert!(block_table.len() * bs >= ctx_len, "block table too short");
    scores.clear();
    scores.resize(ctx_len, 0.0);
    for (bi, chunk) in scores.chunks_mut(bs).enumerate() {
        let base = kv.base(block_table[bi] as usize, kv_head);
        let kt = &kv.k[base..base + hd * bs];
        for s0 in (0..chunk.len()).step_by(LANES) {
            let n = (chunk.len() - s0).min(LANES);
            if n == LANES {
                let mut acc = _mm512_setzero_ps();
                for (d, qd) in q.iter().enumerate() {
                    // SAFETY: d·bs + s0 + 16 <= hd·bs: the group lies inside this block's keys.
                    let k = unsafe { _mm512_loadu_ps(kt.as_ptr().add(d * bs + s0)) };
                    acc = _mm512_fmadd_ps(_mm512_set1_ps(*qd), k, acc);
                }
                // SAFETY: s0 + 16 <= chunk.len().
                unsafe { _mm512_storeu_ps(chunk.as_mut_ptr().add(s0), acc) };
            } else {
                partial_scores(q, kt, bs, &mut chunk[s0..s0 + n], s0);
            }
        }
    }
    let sum = softmax_numerators(scores, scale);
    for d0 in (0..hd).step_by(LANES) {
        let n = (hd - d0).min(LANES);
        if n == LANES {
            let mut acc = _mm512_setzero_ps();
            for (bi, chunk) in scores.chunks(bs).enumerate() {
                let base = kv.base(block_table[bi] as usize, kv_head) + d0;
                let vb = &kv.v[base..base + (chunk.len() - 1) * hd + LANES];
                for (slot, p) in chunk.iter().enumerate() {
                    // SAFETY: slot·hd + 16 <= vb.len() by the slice bound above.
                    let v = unsafe { _mm512_loadu_ps(vb.as_ptr().add(slot * hd)) };
                    acc = _mm512_fmadd_ps(_mm512_set1_ps(*p), v, acc);
                }
            }
            // SAFETY: d0 + 16 <= hd = out.len().
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(d0), acc) };
        } else {
            partial_values(scores, kv, kv_head, block_table, d0, &mut out[d0..d0 + n]);
        }
    }
    normalise(out, sum);
}

/// The kernel. Element-wise vectorisation does not change any result: each score is a
/// multiply-add chain over `d` in order, each output element a chain over positions in order.
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
fn attend_body(
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
    debug_assert_eq!(q.len(), hd);
    debug_assert_eq!(out.len(), hd);
    scores.clear();
    scores.resize(ctx_len, 0.0);
    // Scores, sixteen slots at a time held in registers (one 512-bit vector), the query's
    // dimensions in order. A partial group computes the same chains on fewer lanes.
    for (bi, chunk) in scores.chunks_mut(bs).enumerate() {
        let base = kv.base(block_table[bi] as usize, kv_head);
        let kt = &kv.k[base..base + hd * bs];
        for s0 in (0..chunk.len()).step_by(LANES) {
            let n = (chunk.len() - s0).min(LANES);
            if n < LANES {
                partial_scores(q, kt, bs, &mut chunk[s0..s0 + n], s0);
                continue;
            }
            let mut acc = [0f32; LANES];
            for (d, qd) in q.iter().enumerate() {
                let row: &[f32; LANES] = kt[d * bs + s0..d * bs + s0 + LANES]
                    .try_into()
                    .expect("16 slots");
                for l in 0..LANES {
                    acc[l] = qd.mul_add(row[l], acc[l]);
                }
            }
            chunk[s0..s0 + LANES].copy_from_slice(&acc);
        }
    }
    let sum = softmax_numerators(scores, scale);
    // Values, sixteen output dimensions at a time in registers, positions in order.
    for d0 in (0..hd).step_by(LANES) {
        let n = (hd - d0).min(LANES);
        if n < LANES {
            partial_values(scores, kv, kv_head, block_table, d0, &mut out[d0..d0 + n]);
            continue;
        }
        let mut acc = [0f32; LANES];
        for (bi, chunk) in scores.chunks(bs).enumerate() {
            let base = kv.base(block_table[bi] as usize, kv_head);
            for (slot, p) in chunk.iter().enumerate() {
                let at = base + slot * hd + d0;
                let v: &[f32; LANES] = kv.v[at..at + LANES].try_into().expect("16 dims");
                for l in 0..LANES {
                    acc[l] = p.mul_add(v[l], acc[l]);
                }
            }
        }
        out[d0..d0 + LANES].copy_from_slice(&acc);
    }
    normalise(out, sum);
}

/// Scores of fewer than sixteen slots starting at `s0` of one block (`kt` its transposed keys),
/// as the same chains the full groups compute.
#[inline(always)]
fn partial_scores(q: &[f32], kt: &[f32], bs: usize, out: &mut [f32], s0: usize) {
    let n = out.len();
    let mut acc = [0f32; LANES];
    for (d, qd) in q.iter().enumerate() {
        for (a, k) in acc[..n].iter_mut().zip(&kt[d * bs + s0..d * bs + s0 + n]) {
            *a = qd.mul_add(*k, *a);
        }
    }
    out.copy_from_slice(&acc[..n]);
}

/// Output dimensions `d0..d0 + out.len()` (fewer than sixteen) of `Σ_t p[t]·V[t]`.
#[inline(always)]
fn partial_values(
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
                *a = p.mul_add(*v, *a);
            }
        }
    }
    out.copy_from_slice(&acc[..n]);
}

/// Scales the raw scores and replaces each with `exp(s − max)`; returns their sum.
#[inline(always)]
fn softmax_numerators(scores: &mut [f32], scale: f32) -> f32 {
    let mut max = f32::NEG_INFINITY;
    for s in scores.iter_mut() {
        *s *= scale;
        max = max.max(*s);
    }
    let mut sum = 0.0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
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
        for (bs, hd, ctx) in [(4, 8, 11), (16, 64, 48), (16, 72, 37)] {
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
        let mut k = vec![0.0; blocks * heads * bs * hd];
        let mut v = vec![0.0; blocks * heads * bs * hd];
        let val =
            |t: usize, d: usize, salt: usize| ((t * 31 + d * 7 + salt) % 13) as f32 / 13.0 - 0.5;
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
                k[view_dims.k_offset(block, 1, slot, d)] = val(t, d, 1);
                v[vo + d] = val(t, d, 2);
            }
        }
        let q: Vec<f32> = (0..hd)
            .map(|d| d as f32 / (hd as f32 / 2.0) - 1.0)
            .collect();
        let view = KvView {
            k: &k,
            v: &v,
            ..view_dims
        };
        let run = |path| {
            let mut out = vec![0.0; hd];
            attend(
                path,
                &q,
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
        let out = run(best_path());
        let scalar = run(DotPath::Scalar);
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
