//! Dot products with one fixed reduction order, and tiles of them that share loads.
//!
//! The order: eight running lanes, each a fused multiply-add over elements `8c + lane` for
//! chunks `c` in order; then `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`; then the tail elements
//! (`k % 8`) added one by one with fused multiply-adds. The scalar code spells this out with
//! `f32::mul_add` (one rounding, like the FMA instruction), so the AVX2 path equals it exactly.

// Tiles index several parallel arrays by the same row and column; index loops say that best.
#![allow(clippy::needless_range_loop)]

use std::sync::OnceLock;

/// Which implementation the running CPU gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DotPath {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
}

/// Detects the best available path once per process.
pub fn best_path() -> DotPath {
    static PATH: OnceLock<DotPath> = OnceLock::new();
    *PATH.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                return DotPath::Avx2Fma;
            }
        }
        DotPath::Scalar
    })
}

/// `R × C` dot products of `R` activation rows with `C` weight rows, each of length `k`.
///
/// # Safety
/// Every pointer must be valid for reads of `k` floats.
#[inline]
pub unsafe fn tile<const R: usize, const C: usize>(
    path: DotPath,
    x: [*const f32; R],
    w: [*const f32; C],
    k: usize,
) -> [[f32; C]; R] {
    match path {
        // SAFETY: the caller guarantees the pointers; the feature check happened in `best_path`.
        #[cfg(target_arch = "x86_64")]
        DotPath::Avx2Fma => unsafe { avx2::tile::<R, C>(x, w, k) },
        // SAFETY: as above.
        DotPath::Scalar => unsafe { scalar_tile::<R, C>(x, w, k) },
    }
}

/// One dot product of two equally long slices, in the fixed order.
#[inline]
pub fn dot(path: DotPath, a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot of slices of different lengths");
    // SAFETY: both slices hold `a.len()` floats.
    unsafe { tile::<1, 1>(path, [a.as_ptr()], [b.as_ptr()], a.len())[0][0] }
}

/// The horizontal sum of eight lanes, in the order the SIMD paths use.
#[inline(always)]
pub(crate) fn reduce8(l: [f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// The scalar reference: the definition every other path must equal bit for bit.
///
/// # Safety
/// Every pointer must be valid for reads of `k` floats.
pub unsafe fn scalar_tile<const R: usize, const C: usize>(
    x: [*const f32; R],
    w: [*const f32; C],
    k: usize,
) -> [[f32; C]; R] {
    let mut out = [[0f32; C]; R];
    let chunks = k / 8;
    for i in 0..R {
        // SAFETY: the caller guarantees `k` readable floats behind each pointer.
        let xs = unsafe { std::slice::from_raw_parts(x[i], k) };
        for j in 0..C {
            // SAFETY: as above.
            let ws = unsafe { std::slice::from_raw_parts(w[j], k) };
            let mut lanes = [0f32; 8];
            for c in 0..chunks {
                for (l, lane) in lanes.iter_mut().enumerate() {
                    *lane = xs[c * 8 + l].mul_add(ws[c * 8 + l], *lane);
                }
            }
            let mut s = reduce8(lanes);
            for t in chunks * 8..k {
                s = xs[t].mul_add(ws[t], s);
            }
            out[i][j] = s;
        }
    }
    out
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    /// The eight lanes of `v` summed as `reduce8` orders them:
    /// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
    ///
    /// # Safety
    /// The CPU must support AVX.
    #[inline(always)]
    pub(crate) unsafe fn reduce(v: __m256) -> f32 {
        let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 0b01)))
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA; every pointer must be valid for `k` floats.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile<const R: usize, const C: usize>(
        x: [*const f32; R],
        w: [*const f32; C],
        k: usize,
    ) -> [[f32; C]; R] {
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let chunks = k / 8;
        for c in 0..chunks {
            let off = c * 8;
            let mut wv = [_mm256_setzero_ps(); C];
            for j in 0..C {
                // SAFETY: off + 8 <= k.
                wv[j] = unsafe { _mm256_loadu_ps(w[j].add(off)) };
            }
            for i in 0..R {
                // SAFETY: off + 8 <= k.
                let xv = unsafe { _mm256_loadu_ps(x[i].add(off)) };
                for j in 0..C {
                    acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
                }
            }
        }
        let mut out = [[0f32; C]; R];
        for i in 0..R {
            for j in 0..C {
                // SAFETY: AVX2 is enabled for this function.
                let mut s = unsafe { reduce(acc[i][j]) };
                for t in chunks * 8..k {
                    // SAFETY: t < k.
                    let (a, b) = unsafe { (*x[i].add(t), *w[j].add(t)) };
                    s = a.mul_add(b, s);
                }
                out[i][j] = s;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn random(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n).map(|_| lcg(seed)).collect()
    }

    #[test]
    fn every_path_equals_the_scalar_reference_bit_for_bit() {
        let mut seed = 7;
        for k in [0usize, 1, 3, 7, 8, 9, 15, 16, 63, 64, 65, 576, 1000, 1536] {
            let x = random(3 * k, &mut seed);
            let w = random(4 * k, &mut seed);
            let xp = [x.as_ptr(), x[k..].as_ptr(), x[2 * k..].as_ptr()];
            let wp = [
                w.as_ptr(),
                w[k..].as_ptr(),
                w[2 * k..].as_ptr(),
                w[3 * k..].as_ptr(),
            ];
            // SAFETY: each pointer has k floats after it.
            let reference = unsafe { scalar_tile::<3, 4>(xp, wp, k) };
            let best = unsafe { tile::<3, 4>(best_path(), xp, wp, k) };
            assert_eq!(reference, best, "k = {k}");
            // A 1×1 tile gives the same value as the same element of a larger tile.
            for i in 0..3 {
                for j in 0..4 {
                    let single = dot(best_path(), &x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
                    assert_eq!(single.to_bits(), best[i][j].to_bits(), "k = {k}");
                }
            }
        }
    }

    #[test]
    fn edge_values_agree() {
        let k = 77;
        for special in [
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
            1e30,
        ] {
            let mut x = vec![1.0f32; k];
            let w = vec![0.5f32; k];
            x[k / 2] = special;
            let r = unsafe { scalar_tile::<1, 1>([x.as_ptr()], [w.as_ptr()], k) }[0][0];
            let b = dot(best_path(), &x, &w);
            assert!(
                r.to_bits() == b.to_bits() || (r.is_nan() && b.is_nan()),
                "{special}: {r} vs {b}"
            );
        }
    }

    #[test]
    fn dot_is_close_to_the_exact_value() {
        let mut seed = 3;
        let a = random(1536, &mut seed);
        let b = random(1536, &mut seed);
        let exact: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum();
        assert!((f64::from(dot(best_path(), &a, &b)) - exact).abs() < 1e-3);
    }
}
