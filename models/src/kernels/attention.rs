//! Causal attention of one query head against a sequence's KV blocks, read in place.
//!
//! The cache layout is `[block][kv_head][slot][head_dim]`, so one KV head's keys within a block
//! are contiguous. Nothing is gathered or copied per step: the block table is walked directly.

use super::dot::{dot, DotPath};

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
    /// Offset of `(block, head, slot)`'s vector in the pool.
    #[inline]
    pub fn offset(&self, block: usize, head: usize, slot: usize) -> usize {
        ((block * self.kv_heads + head) * self.block_size + slot) * self.head_dim
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
        DotPath::Avx2Fma => unsafe {
            attend_avx2(q, kv, kv_head, block_table, ctx_len, scale, scores, out)
        },
        DotPath::Scalar => attend_body(
            path,
            q,
            kv,
            kv_head,
            block_table,
            ctx_len,
            scale,
            scores,
            out,
        ),
    }
}

/// The same code compiled with AVX2 and FMA enabled, so the fused multiply-adds are
/// instructions (not library calls) and the loops over the head dimension vectorise.
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
    attend_body(
        DotPath::Avx2Fma,
        q,
        kv,
        kv_head,
        block_table,
        ctx_len,
        scale,
        scores,
        out,
    )
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_body(
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
    debug_assert_eq!(q.len(), hd);
    debug_assert_eq!(out.len(), hd);
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for t in 0..ctx_len {
        let base = kv.offset(
            block_table[t / kv.block_size] as usize,
            kv_head,
            t % kv.block_size,
        );
        let s = dot(path, q, &kv.k[base..base + hd]) * scale;
        max = max.max(s);
        scores.push(s);
    }
    let mut sum = 0.0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    out.fill(0.0);
    for (t, p) in scores.iter().enumerate() {
        let base = kv.offset(
            block_table[t / kv.block_size] as usize,
            kv_head,
            t % kv.block_size,
        );
        for (o, v) in out.iter_mut().zip(&kv.v[base..base + hd]) {
            *o = p.mul_add(*v, *o);
        }
    }
    let inv = 1.0 / sum;
    for o in out.iter_mut() {
        *o *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dot::best_path;

    /// Scattered blocks give the same result as the textbook formula on contiguous K and V.
    #[test]
    fn reads_scattered_blocks_like_contiguous_attention() {
        let (bs, heads, hd, ctx) = (4, 2, 8, 11);
        let table = [5u32, 0, 3];
        let blocks = 6;
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
            let o = view_dims.offset(table[t / bs] as usize, 1, t % bs);
            for d in 0..hd {
                k[o + d] = val(t, d, 1);
                v[o + d] = val(t, d, 2);
            }
        }
        let q: Vec<f32> = (0..hd).map(|d| d as f32 / 4.0 - 1.0).collect();
        let view = KvView {
            k: &k,
            v: &v,
            ..view_dims
        };
        let mut out = vec![0.0; hd];
        attend(
            best_path(),
            &q,
            &view,
            1,
            &table,
            ctx,
            0.3,
            &mut Vec::new(),
            &mut out,
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
            assert!((f64::from(*got) - e).abs() < 1e-5, "{d}: {got} vs {e}");
        }
    }
}
