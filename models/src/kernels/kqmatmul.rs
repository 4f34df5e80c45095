//! `out = x · wᵀ` for k-quant weights ([`Q4KMatrix`], [`Q6KMatrix`]) against 8-bit activations
//! ([`QuantActs`]): integer dot products inside each block of 32, f32 across blocks.
//!
//! # The fixed order
//! For one output element and activation block `b` (32 elements, scale `d_x[b]`), eight integer
//! lanes `I[j] = Σ_{i<4} w[4j+i]·x[4j+i]` are exact in any order, and are accumulated in f32 as
//! `acc_{b mod 2}[j] = fma(I[j], scale_j, acc_{b mod 2}[j])` over blocks in order (even blocks in
//! one set of eight lanes, odd in another: AVX-512 holds both in one register); the result is
//! `reduce8(acc_0 + acc_1)`.
//! - **Q4_K**: sub-block `b` is the activation block; `w = q ∈ 0..16`, `scale_j = d[b]·d_x[b]`.
//!   The minimums follow as `Σ_b m[b]·s_x[b]` in eight lanes (`b mod 8`, rows are whole
//!   super-blocks so there is no tail), reduced the same way and subtracted.
//! - **Q6_K**: a block of 32 spans two sub-blocks of 16 (`2b`, `2b + 1`): lanes 0–3 lie in the
//!   first, 4–7 in the second, so `w = q − 32` and `scale_j = S[2b + j/4]·d_x[b]`.
//!
//! Nothing depends on the tile shape, the batch or the thread, so results are batch invariant;
//! [`reference`] spells it out and every SIMD path is tested equal to it bit for bit.

// Tiles index several parallel arrays by the same row and column; index loops say that best.
#![allow(clippy::needless_range_loop)]

use super::dot::reduce8;
use super::kquant::{Q4KMatrix, Q6KMatrix, Q6K_SUB, QK_K};
use super::matmul::{split_columns, walk_tiles, OutPtr};
use super::qmatmul::QPath;
use super::quant::{QuantActs, QK};

const ROW_BLOCK: usize = 32;
const COLS_PER_TASK: usize = 32;

/// k-quant weights a product can run on.
#[derive(Debug, Clone, Copy)]
pub enum KWeights<'a> {
    Q4K(&'a Q4KMatrix),
    Q6K(&'a Q6KMatrix),
}

impl KWeights<'_> {
    pub fn n(&self) -> usize {
        match self {
            Self::Q4K(w) => w.n,
            Self::Q6K(w) => w.n,
        }
    }

    pub fn k(&self) -> usize {
        match self {
            Self::Q4K(w) => w.k,
            Self::Q6K(w) => w.k,
        }
    }

    /// Panics unless the arrays hold `n × k` weights in whole super-blocks.
    fn check(&self) {
        let (n, k) = (self.n(), self.k());
        assert_eq!(k % QK_K, 0, "k-quant rows are whole super-blocks");
        match self {
            Self::Q4K(w) => {
                assert_eq!(w.qs.len(), n * k / 2, "Q4_K quants are not n × k");
                assert_eq!(w.d.len(), n * k / QK, "Q4_K scales are not n × k/32");
                assert_eq!(w.m.len(), n * k / QK, "Q4_K minimums are not n × k/32");
            }
            Self::Q6K(w) => {
                assert_eq!(w.q.len(), n * k, "Q6_K quants are not n × k");
                assert_eq!(
                    w.scale.len(),
                    n * k / Q6K_SUB,
                    "Q6_K scales are not n × k/16"
                );
            }
        }
    }
}

/// Computes `out[r][c] = Σ x[r]·w[c]` for every activation row and weight row.
pub fn kqmatmul(
    pool: &rayon::ThreadPool,
    path: QPath,
    acts: &QuantActs,
    w: KWeights<'_>,
    out: &mut [f32],
) {
    let (rows, n, k) = (acts.rows, w.n(), w.k());
    assert_eq!(acts.k, k, "activations and weights differ in k");
    assert_eq!(out.len(), rows * n, "output is not rows × n");
    assert_eq!(acts.q.len(), rows * k, "activations are not rows × k");
    w.check();
    if rows == 0 || n == 0 {
        return;
    }
    split_columns(pool, n, COLS_PER_TASK, out, |c0, c1, out_ptr| {
        // SAFETY: shapes checked above; this task writes only columns c0..c1.
        unsafe { columns(path, acts, w, c0, c1, out_ptr) };
    });
}

/// # Safety
/// Shapes as checked by `kqmatmul`; only columns `c0..c1` of `out` are written.
unsafe fn columns(path: QPath, a: &QuantActs, w: KWeights<'_>, c0: usize, c1: usize, out: OutPtr) {
    let n = w.n();
    let store = |r: usize, c: usize, v: f32| {
        // SAFETY: r < rows, c < n: inside the output, in this task's columns.
        unsafe { *out.0.add(r * n + c) = v };
    };
    let (max_r, max_c) = path.max_tile();
    walk_tiles(
        a.rows,
        c0,
        c1,
        ROW_BLOCK,
        max_r,
        max_c,
        |r, height, c, width| {
            // SAFETY: rows r..r+height and columns c..c+width exist.
            unsafe { tile(path, a, r, height, w, c, width, &store) };
        },
    );
}

/// Dispatches one tile to the kernel instantiated for its shape.
///
/// # Safety
/// Rows `r..r+h` of `a` and columns `c..c+wd` of `w` must exist; the CPU must support `path`.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    path: QPath,
    a: &QuantActs,
    r: usize,
    h: usize,
    w: KWeights<'_>,
    c: usize,
    wd: usize,
    store: &impl Fn(usize, usize, f32),
) {
    macro_rules! shapes {
        ($md:ident :: $f:ident, $wm:expr, [$(($R:literal, $C:literal)),*]) => {
            match (h, wd) {
                $(($R, $C) => {
                    // SAFETY: the caller guarantees the rows, columns and CPU features.
                    let t = unsafe { $md::$f::<$R, $C>(a, r, $wm, c) };
                    for (i, row) in t.iter().enumerate() {
                        for (j, v) in row.iter().enumerate() {
                            store(r + i, c + j, *v);
                        }
                    }
                })*
                _ => unreachable!("tile shape {h}×{wd}"),
            }
        };
    }
    /// Every tile shape from 1×1 to 4×4 (the AVX-512 kernels).
    #[cfg(target_arch = "x86_64")]
    macro_rules! up_to_4x4 {
        ($md:ident :: $f:ident, $wm:expr) => {
            shapes!(
                $md::$f,
                $wm,
                [
                    (1, 1),
                    (1, 2),
                    (1, 3),
                    (1, 4),
                    (2, 1),
                    (2, 2),
                    (2, 3),
                    (2, 4),
                    (3, 1),
                    (3, 2),
                    (3, 3),
                    (3, 4),
                    (4, 1),
                    (4, 2),
                    (4, 3),
                    (4, 4)
                ]
            )
        };
    }
    match (path, w) {
        (QPath::Scalar, KWeights::Q4K(m)) => store(r, c, reference::q4k(a, r, m, c)),
        (QPath::Scalar, KWeights::Q6K(m)) => store(r, c, reference::q6k(a, r, m, c)),
        #[cfg(target_arch = "x86_64")]
        (QPath::Avx2, KWeights::Q4K(m)) => shapes!(avx2::q4k, m, [(1, 1), (1, 2), (2, 1), (2, 2)]),
        #[cfg(target_arch = "x86_64")]
        (QPath::Avx2, KWeights::Q6K(m)) => shapes!(avx2::q6k, m, [(1, 1), (1, 2), (2, 1), (2, 2)]),
        #[cfg(target_arch = "x86_64")]
        (QPath::Avx512Vnni, KWeights::Q4K(m)) => up_to_4x4!(avx512::q4k, m),
        #[cfg(target_arch = "x86_64")]
        (QPath::Avx512Vnni, KWeights::Q6K(m)) => up_to_4x4!(avx512::q6k, m),
    }
}

/// The scalar reference: the definition of each product's value.
pub mod reference {
    use super::*;

    /// `Σ_b m[b]·s[b]` in eight lanes (`b mod 8`; the length is a multiple of 8), reduced.
    pub(super) fn min_term(m: &[f32], s: &[f32]) -> f32 {
        let mut lanes = [0f32; 8];
        for (mc, sc) in m.chunks_exact(8).zip(s.chunks_exact(8)) {
            for l in 0..8 {
                lanes[l] = mc[l].mul_add(sc[l], lanes[l]);
            }
        }
        reduce8(lanes)
    }

    /// Row `r` of `a` times Q4_K column `c`.
    pub fn q4k(a: &QuantActs, r: usize, w: &Q4KMatrix, c: usize) -> f32 {
        let (k, nb) = (w.k, w.blocks_per_row());
        let mut acc = [[0f32; 8]; 2];
        for b in 0..nb {
            let x = &a.q[r * k + b * QK..r * k + (b + 1) * QK];
            let scale = w.d[c * nb + b] * a.d[r * nb + b];
            for (j, lane) in acc[b % 2].iter_mut().enumerate() {
                let isum: i32 = (4 * j..4 * j + 4)
                    .map(|e| i32::from(w.quant(c, b, e)) * i32::from(x[e]))
                    .sum();
                *lane = (isum as f32).mul_add(scale, *lane);
            }
        }
        let main = reduce8(std::array::from_fn(|j| acc[0][j] + acc[1][j]));
        main - min_term(&w.m[c * nb..(c + 1) * nb], &a.s[r * nb..(r + 1) * nb])
    }

    /// Row `r` of `a` times Q6_K column `c`.
    pub fn q6k(a: &QuantActs, r: usize, w: &Q6KMatrix, c: usize) -> f32 {
        let (k, nb, ns) = (w.k, w.k / QK, w.subs_per_row());
        let mut acc = [[0f32; 8]; 2];
        for b in 0..nb {
            let wq = &w.q[c * k + b * QK..c * k + (b + 1) * QK];
            let x = &a.q[r * k + b * QK..r * k + (b + 1) * QK];
            let dx = a.d[r * nb + b];
            for (j, lane) in acc[b % 2].iter_mut().enumerate() {
                let isum: i32 = (4 * j..4 * j + 4)
                    .map(|e| (i32::from(wq[e]) - 32) * i32::from(x[e]))
                    .sum();
                let scale = w.scale[c * ns + 2 * b + j / 4] * dx;
                *lane = (isum as f32).mul_add(scale, *lane);
            }
        }
        reduce8(std::array::from_fn(|j| acc[0][j] + acc[1][j]))
    }
}

/// The minimum term of Q4_K in AVX, as `reference::min_term` defines it.
///
/// # Safety
/// AVX and FMA; `m` and `s` point at `nb` floats, `nb` a multiple of 8.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn min_term_avx(m: *const f32, s: *const f32, nb: usize) -> f32 {
    use std::arch::x86_64::*;
    let mut lanes = _mm256_setzero_ps();
    for ch in (0..nb).step_by(8) {
        // SAFETY: ch + 8 <= nb.
        lanes = unsafe {
            _mm256_fmadd_ps(
                _mm256_loadu_ps(m.add(ch)),
                _mm256_loadu_ps(s.add(ch)),
                lanes,
            )
        };
    }
    // SAFETY: AVX is present.
    unsafe { crate::kernels::dot::avx2::reduce(lanes) }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::*;
    use crate::kernels::dot::avx2::reduce;

    /// # Safety
    /// AVX2 and FMA; rows `r..r+R` and columns `c..c+C` exist; `k` is a multiple of 64.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn q4k<const R: usize, const C: usize>(
        a: &QuantActs,
        r: usize,
        w: &Q4KMatrix,
        c: usize,
    ) -> [[f32; C]; R] {
        let (k, nb) = (w.k, w.blocks_per_row());
        let ones = _mm256_set1_epi16(1);
        let mask = _mm256_set1_epi8(0x0F);
        let mut acc = [[[_mm256_setzero_ps(); 2]; C]; R];
        // Sub-blocks in pairs (they share 32 bytes of nibbles), each accumulator named statically.
        for b0 in (0..nb).step_by(2) {
            for half in 0..2 {
                let b = b0 + half;
                let mut wv = [_mm256_setzero_si256(); C];
                for j in 0..C {
                    // SAFETY: sub-blocks b0, b0+1 of column c+j exist.
                    let q = unsafe {
                        _mm256_loadu_si256(w.qs.as_ptr().add((c + j) * k / 2 + b0 * 16) as *const _)
                    };
                    wv[j] = _mm256_and_si256(
                        if half == 0 {
                            q
                        } else {
                            _mm256_srli_epi16(q, 4)
                        },
                        mask,
                    );
                }
                for i in 0..R {
                    // SAFETY: block b of row r+i exists.
                    let x = unsafe {
                        _mm256_loadu_si256(a.q.as_ptr().add((r + i) * k + b * QK) as *const __m256i)
                    };
                    let dx = a.d[(r + i) * nb + b];
                    for j in 0..C {
                        let isum = _mm256_madd_epi16(_mm256_maddubs_epi16(wv[j], x), ones);
                        let scale = _mm256_set1_ps(w.d[(c + j) * nb + b] * dx);
                        acc[i][j][half] =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[i][j][half]);
                    }
                }
            }
        }
        let mut out = [[0f32; C]; R];
        for i in 0..R {
            for j in 0..C {
                // SAFETY: AVX2 and FMA are enabled; both minimum arrays hold nb floats here.
                unsafe {
                    let main = reduce(_mm256_add_ps(acc[i][j][0], acc[i][j][1]));
                    let m = w.m.as_ptr().add((c + j) * nb);
                    let s = a.s.as_ptr().add((r + i) * nb);
                    out[i][j] = main - min_term_avx(m, s, nb);
                }
            }
        }
        out
    }

    /// # Safety
    /// AVX2 and FMA; rows `r..r+R` and columns `c..c+C` exist; `k` is a multiple of 64.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn q6k<const R: usize, const C: usize>(
        a: &QuantActs,
        r: usize,
        w: &Q6KMatrix,
        c: usize,
    ) -> [[f32; C]; R] {
        let (k, nb, ns) = (w.k, w.k / QK, w.subs_per_row());
        let ones = _mm256_set1_epi16(1);
        let bias = _mm256_set1_epi8(32);
        // Lanes 0–3 take sub-block scale 0, lanes 4–7 scale 1.
        let spread = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
        let mut acc = [[[_mm256_setzero_ps(); 2]; C]; R];
        // Blocks in pairs, so each accumulator is named statically (nb is even).
        for b0 in (0..nb).step_by(2) {
            for half in 0..2 {
                let b = b0 + half;
                let mut wv = [_mm256_setzero_si256(); C];
                let mut sv = [_mm256_setzero_ps(); C];
                for j in 0..C {
                    // SAFETY: block b of column c+j and its two sub-block scales exist.
                    unsafe {
                        wv[j] = _mm256_loadu_si256(
                            w.q.as_ptr().add((c + j) * k + b * QK) as *const __m256i
                        );
                        let two =
                            _mm_load_sd(w.scale.as_ptr().add((c + j) * ns + 2 * b) as *const f64);
                        sv[j] = _mm256_permutevar8x32_ps(
                            _mm256_castps128_ps256(_mm_castpd_ps(two)),
                            spread,
                        );
                    }
                }
                for i in 0..R {
                    // SAFETY: block b of row r+i exists.
                    let x = unsafe {
                        _mm256_loadu_si256(a.q.as_ptr().add((r + i) * k + b * QK) as *const __m256i)
                    };
                    // 32·(x[2p] + x[2p+1]): subtracted, it turns Σ q·x into Σ (q − 32)·x.
                    let corr = _mm256_maddubs_epi16(bias, x);
                    let dx = _mm256_set1_ps(a.d[(r + i) * nb + b]);
                    for j in 0..C {
                        // q ≤ 63, so the pair sums (≤ 2·63·127) do not saturate.
                        let p = _mm256_sub_epi16(_mm256_maddubs_epi16(wv[j], x), corr);
                        let isum = _mm256_madd_epi16(p, ones);
                        let scale = _mm256_mul_ps(sv[j], dx);
                        acc[i][j][half] =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[i][j][half]);
                    }
                }
            }
        }
        let mut out = [[0f32; C]; R];
        for i in 0..R {
            for j in 0..C {
                // SAFETY: AVX2 is enabled for this function.
                out[i][j] = unsafe { reduce(_mm256_add_ps(acc[i][j][0], acc[i][j][1])) };
            }
        }
        out
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::*;
    use crate::kernels::dot::avx2::reduce;

    /// `[d0 × 8, d1 × 8]` from two consecutive floats.
    #[inline(always)]
    unsafe fn pair_at(p: *const f32) -> __m512 {
        let spread = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        // SAFETY: the caller points at two readable floats.
        let two = unsafe { _mm_castpd_ps(_mm_load_sd(p as *const f64)) };
        _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(two))
    }

    /// # Safety
    /// AVX-512 F/BW/DQ/VL/VNNI and FMA; rows `r..r+R` and columns `c..c+C` exist; `k` is a
    /// multiple of 64.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,fma")]
    pub unsafe fn q4k<const R: usize, const C: usize>(
        a: &QuantActs,
        r: usize,
        w: &Q4KMatrix,
        c: usize,
    ) -> [[f32; C]; R] {
        let (k, nb) = (w.k, w.blocks_per_row());
        let mask = _mm512_set1_epi8(0x0F);
        // The same 32 bytes in both halves; the upper half shifted to its high nibbles.
        let shifts = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        for b in (0..nb).step_by(2) {
            let mut wv = [_mm512_setzero_si512(); C];
            let mut dw = [_mm512_setzero_ps(); C];
            for j in 0..C {
                // SAFETY: sub-blocks b, b+1 of column c+j (32 bytes, two scales) exist.
                unsafe {
                    let q = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                        w.qs.as_ptr().add((c + j) * k / 2 + b * 16) as *const __m256i,
                    ));
                    wv[j] = _mm512_and_si512(_mm512_srlv_epi64(q, shifts), mask);
                    dw[j] = pair_at(w.d.as_ptr().add((c + j) * nb + b));
                }
            }
            for i in 0..R {
                // SAFETY: blocks b and b+1 of row r+i exist.
                let (x, dx) = unsafe {
                    (
                        _mm512_loadu_si512(a.q.as_ptr().add((r + i) * k + b * QK) as *const _),
                        pair_at(a.d.as_ptr().add((r + i) * nb + b)),
                    )
                };
                for j in 0..C {
                    let isum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[j], x);
                    let scale = _mm512_mul_ps(dw[j], dx);
                    acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[i][j]);
                }
            }
        }
        let mut out = [[0f32; C]; R];
        for i in 0..R {
            for j in 0..C {
                let even = _mm512_castps512_ps256(acc[i][j]);
                let odd = _mm512_extractf32x8_ps(acc[i][j], 1);
                // SAFETY: AVX and FMA are enabled; both minimum arrays hold nb floats here.
                unsafe {
                    let main = reduce(_mm256_add_ps(even, odd));
                    let m = w.m.as_ptr().add((c + j) * nb);
                    let s = a.s.as_ptr().add((r + i) * nb);
                    out[i][j] = main - min_term_avx(m, s, nb);
                }
            }
        }
        out
    }

    /// # Safety
    /// AVX-512 F/BW/DQ/VL/VNNI and FMA; rows `r..r+R` and columns `c..c+C` exist; `k` is a
    /// multiple of 64.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,fma")]
    pub unsafe fn q6k<const R: usize, const C: usize>(
        a: &QuantActs,
        r: usize,
        w: &Q6KMatrix,
        c: usize,
    ) -> [[f32; C]; R] {
        let (k, nb, ns) = (w.k, w.k / QK, w.subs_per_row());
        let bias = _mm512_set1_epi8(32);
        // Two blocks of 32 per step: lanes 4s..4s+3 take sub-block scale s (of four).
        let spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        for b in (0..nb).step_by(2) {
            let mut wv = [_mm512_setzero_si512(); C];
            let mut sv = [_mm512_setzero_ps(); C];
            for j in 0..C {
                // SAFETY: blocks b, b+1 of column c+j and their four sub-block scales exist.
                unsafe {
                    wv[j] = _mm512_loadu_si512(w.q.as_ptr().add((c + j) * k + b * QK) as *const _);
                    let four = _mm_loadu_ps(w.scale.as_ptr().add((c + j) * ns + 2 * b));
                    sv[j] = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(four));
                }
            }
            for i in 0..R {
                let at = (r + i) * nb + b;
                // SAFETY: blocks b and b+1 of row r+i exist.
                let x = unsafe {
                    _mm512_loadu_si512(a.q.as_ptr().add((r + i) * k + b * QK) as *const _)
                };
                // Σ q·x − 32·Σ x = Σ (q − 32)·x, with the correction as the starting value.
                let start = _mm512_sub_epi32(
                    _mm512_setzero_si512(),
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, x),
                );
                let dx =
                    _mm512_insertf32x8(_mm512_set1_ps(a.d[at]), _mm256_set1_ps(a.d[at + 1]), 1);
                for j in 0..C {
                    let isum = _mm512_dpbusd_epi32(start, wv[j], x);
                    let scale = _mm512_mul_ps(sv[j], dx);
                    acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[i][j]);
                }
            }
        }
        let mut out = [[0f32; C]; R];
        for i in 0..R {
            for j in 0..C {
                // Even-block lanes + odd-block lanes, reduced as `reduce8` orders them.
                let even = _mm512_castps512_ps256(acc[i][j]);
                let odd = _mm512_extractf32x8_ps(acc[i][j], 1);
                // SAFETY: AVX is enabled for this function.
                out[i][j] = unsafe { reduce(_mm256_add_ps(even, odd)) };
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::qmatmul::{qmatmul, QWeights};
    use crate::kernels::quant::Q4_1Matrix;
    use crate::kernels::testdata::*;

    fn acts(rows: usize, k: usize, rng: &mut Rng, extreme: bool) -> QuantActs {
        let x: Vec<f32> = (0..rows * k)
            .map(|i| {
                if extreme {
                    [1e30, -1e30, 0.0, 1e-30, 3.0, -3.0][(i + rng.next_u32() as usize) % 6]
                } else {
                    rng.f() * 4.0
                }
            })
            .collect();
        let mut a = QuantActs::default();
        QuantActs::quantize(&x, rows, k, &mut a);
        a
    }

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    }

    fn product(path: QPath, threads: usize, a: &QuantActs, w: &Weights, out: &mut [f32]) {
        kqmatmul(&pool(threads), path, a, w.kw(), out)
    }

    enum Weights {
        Q4K(Q4KMatrix),
        Q6K(Q6KMatrix),
    }

    impl Weights {
        fn kw(&self) -> KWeights<'_> {
            match self {
                Weights::Q4K(m) => KWeights::Q4K(m),
                Weights::Q6K(m) => KWeights::Q6K(m),
            }
        }

        fn dequantize_row(&self, c: usize, out: &mut [f32]) {
            match self {
                Weights::Q4K(m) => m.dequantize_row(c, out),
                Weights::Q6K(m) => m.dequantize_row(c, out),
            }
        }
    }

    fn both(n: usize, k: usize, rng: &mut Rng, extreme: bool) -> [Weights; 2] {
        [
            Weights::Q4K(Q4KMatrix::from_q4_k(&q4_k_raw(n, k, rng), n, k).unwrap()),
            Weights::Q6K(Q6KMatrix::from_q6_k(&q6_k_raw(n, k, rng, extreme), n, k).unwrap()),
        ]
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Every path equals the scalar reference bit for bit, on random and extreme inputs, for
    /// shapes whose tiles do not divide them.
    #[test]
    fn every_path_equals_the_reference() {
        eprintln!("quantized paths on this CPU: {:?}", QPath::available());
        let mut rng = Rng(21);
        for k in [256, 512, 1536, 2304] {
            for (rows, n) in [(1, 1), (2, 3), (5, 17), (33, 3), (1, 70)] {
                for extreme in [false, true] {
                    let a = acts(rows, k, &mut rng, extreme);
                    for w in both(n, k, &mut rng, extreme) {
                        let mut want = vec![0.0; rows * n];
                        product(QPath::Scalar, 1, &a, &w, &mut want);
                        for path in QPath::available() {
                            for threads in [1, 2] {
                                let mut got = vec![0.0; rows * n];
                                product(path, threads, &a, &w, &mut got);
                                assert_eq!(
                                    bits(&want),
                                    bits(&got),
                                    "{path:?} {rows}×{k}×{n} extreme={extreme}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// The reference is the product of the dequantized operands, up to f32 rounding.
    #[test]
    fn the_reference_is_the_dequantized_product() {
        let mut rng = Rng(8);
        let (rows, k, n) = (3, 1536, 5);
        let a = acts(rows, k, &mut rng, false);
        let nb = k / QK;
        for w in both(n, k, &mut rng, false) {
            let mut got = vec![0.0; rows * n];
            product(QPath::Scalar, 1, &a, &w, &mut got);
            let mut wrow = vec![0.0; k];
            for c in 0..n {
                w.dequantize_row(c, &mut wrow);
                for r in 0..rows {
                    let exact: f64 = (0..k)
                        .map(|i| {
                            f64::from(a.d[r * nb + i / QK])
                                * f64::from(a.q[r * k + i])
                                * f64::from(wrow[i])
                        })
                        .sum();
                    let scale: f64 = (0..k)
                        .map(|i| {
                            (f64::from(a.d[r * nb + i / QK]) * f64::from(a.q[r * k + i])).abs()
                                * f64::from(wrow[i]).abs()
                        })
                        .sum();
                    let v = f64::from(got[r * n + c]);
                    assert!(
                        (v - exact).abs() <= 1e-5 * scale,
                        "{r},{c}: {v} vs {exact} (scale {scale})"
                    );
                }
            }
        }
    }

    /// Row `i` of a batch of seven has the bits it has alone, on every path and thread count.
    #[test]
    fn rows_are_batch_invariant() {
        let mut rng = Rng(13);
        let (rows, k, n) = (7, 512, 37);
        let a = acts(rows, k, &mut rng, false);
        for w in both(n, k, &mut rng, false) {
            for path in QPath::available() {
                for threads in [1, 2] {
                    let mut batch = vec![0.0; rows * n];
                    product(path, threads, &a, &w, &mut batch);
                    for r in 0..rows {
                        let nb = k / QK;
                        let alone = QuantActs {
                            rows: 1,
                            k,
                            q: a.q[r * k..(r + 1) * k].to_vec(),
                            d: a.d[r * nb..(r + 1) * nb].to_vec(),
                            s: a.s[r * nb..(r + 1) * nb].to_vec(),
                        };
                        let mut one = vec![0.0; n];
                        product(path, threads, &alone, &w, &mut one);
                        assert_eq!(bits(&batch[r * n..(r + 1) * n]), bits(&one), "{path:?}");
                    }
                }
            }
        }
    }

    /// Timings against the f32 fallback on a 576 × 1536 matrix (down projection shape):
    /// `cargo test --release -p sluice-models kqmatmul::tests::timings -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing, not a check"]
    fn timings() {
        use crate::kernels::matmul::matmul_t;
        use std::time::Instant;

        let (n, k) = (576, 1536);
        let mut rng = Rng(99);
        let [q4k, q6k] = both(n, k, &mut rng, false);
        let q4_1 = Q4_1Matrix {
            n,
            k,
            qs: (0..n * k / 2).map(|_| rng.next_u32() as u8).collect(),
            d: (0..n * k / QK)
                .map(|_| half::f16::from_f32(rng.f() * 0.01))
                .collect(),
            m: (0..n * k / QK)
                .map(|_| half::f16::from_f32(rng.f() * 0.01))
                .collect(),
        };
        let mut wf = vec![0.0; n * k];
        for (c, row) in wf.chunks_exact_mut(k).enumerate() {
            q6k.dequantize_row(c, row);
        }
        let threads = std::env::var("KQ_THREADS")
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or(1);
        let pool = pool(threads);
        let median = |f: &mut dyn FnMut()| {
            let mut ts: Vec<f64> = (0..41)
                .map(|_| {
                    let t = Instant::now();
                    for _ in 0..10 {
                        f();
                    }
                    t.elapsed().as_secs_f64() * 1e6 / 10.0
                })
                .collect();
            ts.sort_by(f64::total_cmp);
            ts[ts.len() / 2]
        };
        for rows in [1, 16] {
            let x: Vec<f32> = (0..rows * k).map(|_| rng.f()).collect();
            let mut out = vec![0.0; rows * n];
            let mut a = QuantActs::default();
            let f32_us = median(&mut || matmul_t(&pool, &x, rows, &wf, n, &mut out));
            eprintln!("rows={rows:2} threads={threads} f32 fallback: {f32_us:8.1} µs");
            for (name, w) in [("Q4_K", &q4k), ("Q6_K", &q6k)] {
                for path in QPath::available() {
                    let us = median(&mut || {
                        QuantActs::quantize(&x, rows, k, &mut a);
                        kqmatmul(&pool, path, &a, w.kw(), &mut out);
                    });
                    eprintln!(
                        "rows={rows:2} threads={threads} {name} {path:?}: {us:8.1} µs ({:.2}× f32)",
                        f32_us / us
                    );
                }
            }
            // For comparison: the Q4_1 kernel on the same shape (Q4_K's cost as Q4_1 blocks).
            let path = QPath::best();
            let us = median(&mut || {
                QuantActs::quantize(&x, rows, k, &mut a);
                qmatmul(&pool, path, &a, QWeights::Q4_1(&q4_1), &mut out);
            });
            eprintln!(
                "rows={rows:2} threads={threads} Q4_1 {path:?}: {us:8.1} µs ({:.2}× f32)",
                f32_us / us
            );
        }
    }
}
