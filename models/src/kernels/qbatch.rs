//! AVX2 kernels for `x · wᵀ` when a call has several activation rows (batched decode, prefill).
//!
//! Same values as [`super::qmatmul::reference`], bit for bit; only the work is arranged for
//! reuse. The single-row kernels in `qmatmul` expand each weight block and use it once or
//! twice; here
//! - a pair of weight columns is expanded once to one byte per element (Q4_1's nibbles) and
//!   kept in L1 while every row of a row block passes over it;
//! - the even- and odd-block accumulators the fixed order asks for are run as two passes over
//!   the blocks instead of side by side, which halves the live accumulators, so a 4 × 2 tile
//!   (eight accumulators) fits in the sixteen vector registers with no spills;
//! - the per-block scale products `d_w · d_x` are multiplied out once per tile into a table
//!   that the inner loop broadcasts from (a load, not an arithmetic operation).
//!
//! What is left per 32-element block product is the floor for AVX2 without VNNI: `maddubs`,
//! `madd`, a conversion and a multiply-add (Q8_0 adds a sign transfer, see `q8_0_columns`).

// Tiles index several parallel arrays by the same row and column; index loops say that best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::dot::avx2::reduce;
use super::matmul::OutPtr;
use super::qmatmul::avx2::{nibbles, offset_term};
use super::quant::{Q4_1Matrix, Q8_0Matrix, QuantActs, QK};

/// Activation rows per tile.
const TILE_R: usize = 4;
/// Weight columns per tile (expanded together).
const TILE_C: usize = 2;
/// Rows that pass over one expanded column pair before the next pair: their activations
/// (32 × k bytes) stay in L1/L2 beside the pair.
const ROW_BLOCK: usize = 32;

/// What a tile needs to know about the weights besides the expanded bytes.
trait Source {
    /// Weight rows (output columns) and elements per row.
    fn k(&self) -> usize;
    /// The per-block weight scales, `n × nb`.
    fn d(&self) -> &[f32];
    /// Writes column `c`'s blocks as 32 unsigned bytes each into `to` (`nb × 32` bytes): the
    /// first operand of `maddubs`.
    ///
    /// # Safety
    /// AVX2; column `c` exists and `to` holds `nb × 32` bytes.
    unsafe fn expand(&self, c: usize, to: &mut [u8]);
    /// The signed operand for block `b` of column `c` against activations `x`.
    ///
    /// # Safety
    /// AVX2; block `b` of column `c` exists.
    unsafe fn signed(&self, c: usize, b: usize, x: __m256i) -> __m256i;
    /// The term added after the integer products' reduction (Q4_1's `Σ m·s`; none for Q8_0).
    ///
    /// # Safety
    /// AVX2 and FMA; row `r` and column `c` exist.
    unsafe fn offset(&self, a: &QuantActs, r: usize, c: usize) -> f32;
}

impl Source for Q4_1Matrix {
    fn k(&self) -> usize {
        self.k
    }

    fn d(&self) -> &[f32] {
        &self.d
    }

    #[inline(always)]
    unsafe fn expand(&self, c: usize, to: &mut [u8]) {
        let nb = self.blocks_per_row();
        assert!(to.len() >= nb * QK && (c + 1) * nb * 16 <= self.qs.len());
        let shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
        let mask = _mm256_set1_epi8(0x0F);
        for b in 0..nb {
            // SAFETY: bounds asserted above.
            unsafe {
                let v = nibbles(self.qs.as_ptr().add((c * nb + b) * 16), shift, mask);
                _mm256_storeu_si256(to.as_mut_ptr().add(b * QK) as *mut __m256i, v);
            }
        }
    }

    #[inline(always)]
    unsafe fn signed(&self, _c: usize, _b: usize, x: __m256i) -> __m256i {
        x
    }

    #[inline(always)]
    unsafe fn offset(&self, a: &QuantActs, r: usize, c: usize) -> f32 {
        let nb = self.blocks_per_row();
        let m = &self.m[c * nb..(c + 1) * nb];
        let s = &a.s[r * nb..(r + 1) * nb];
        // SAFETY: AVX2 and FMA, as the caller guarantees.
        unsafe { offset_term(m, s) }
    }
}

impl Source for Q8_0Matrix {
    fn k(&self) -> usize {
        self.k
    }

    fn d(&self) -> &[f32] {
        &self.d
    }

    /// `|w|`: `maddubs` multiplies unsigned by signed bytes, so the weights' signs move to the
    /// activations (`signed`), which keeps every pair sum within i16 (`|w| ≤ 128`, `|x| ≤ 127`).
    #[inline(always)]
    unsafe fn expand(&self, c: usize, to: &mut [u8]) {
        let nb = self.blocks_per_row();
        assert!(to.len() >= nb * QK && (c + 1) * self.k <= self.qs.len());
        for b in 0..nb {
            // SAFETY: bounds asserted above.
            unsafe {
                let w = _mm256_loadu_si256(self.qs.as_ptr().add(c * self.k + b * QK) as *const _);
                _mm256_storeu_si256(
                    to.as_mut_ptr().add(b * QK) as *mut __m256i,
                    _mm256_sign_epi8(w, w),
                );
            }
        }
    }

    #[inline(always)]
    unsafe fn signed(&self, c: usize, b: usize, x: __m256i) -> __m256i {
        // SAFETY: block b of column c exists (the caller's guarantee).
        let w = unsafe {
            _mm256_loadu_si256(self.qs.as_ptr().add(c * self.k + b * QK) as *const __m256i)
        };
        _mm256_sign_epi8(x, w)
    }

    #[inline(always)]
    unsafe fn offset(&self, _a: &QuantActs, _r: usize, _c: usize) -> f32 {
        0.0
    }
}

/// Columns `c0..c1` of `out = a · wᵀ` for Q4_1 weights.
///
/// # Safety
/// AVX2 and FMA; shapes as `qmatmul` checks them; only columns `c0..c1` of `out` are written.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn q4_1_columns(
    a: &QuantActs,
    w: &Q4_1Matrix,
    c0: usize,
    c1: usize,
    out: OutPtr,
) {
    // SAFETY: forwarded from the caller.
    unsafe { columns(a, w, w.n, c0, c1, out) }
}

/// Columns `c0..c1` of `out = a · wᵀ` for Q8_0 weights. One operation more per block product
/// than Q4_1: the weights' signs are applied to the activations for each pair.
///
/// # Safety
/// As [`q4_1_columns`].
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn q8_0_columns(
    a: &QuantActs,
    w: &Q8_0Matrix,
    c0: usize,
    c1: usize,
    out: OutPtr,
) {
    // SAFETY: forwarded from the caller.
    unsafe { columns(a, w, w.n, c0, c1, out) }
}

/// # Safety
/// As [`q4_1_columns`].
#[inline(always)]
unsafe fn columns<W: Source>(a: &QuantActs, w: &W, n: usize, c0: usize, c1: usize, out: OutPtr) {
    let nb = w.k() / QK;
    let mut wide = vec![0u8; TILE_C * nb * QK];
    let mut scales = vec![0f32; TILE_R * TILE_C * nb];
    // The loops of `matmul::walk_tiles`, written out: a closure here would not be compiled
    // with this function's target features, and every tile would become a call.
    for rb in (0..a.rows).step_by(ROW_BLOCK) {
        let re = (rb + ROW_BLOCK).min(a.rows);
        let mut c = c0;
        while c < c1 {
            let width = (c1 - c).min(TILE_C);
            for j in 0..width {
                // SAFETY: column c+j exists; `wide` holds TILE_C columns.
                unsafe { w.expand(c + j, &mut wide[j * nb * QK..(j + 1) * nb * QK]) };
            }
            let mut r = rb;
            while r < re {
                let height = (re - r).min(TILE_R);
                macro_rules! shapes {
                    ($(($R:literal, $C:literal)),*) => {
                        match (height, width) {
                            // SAFETY: rows r..r+R and columns c..c+C exist and are expanded.
                            $(($R, $C) => unsafe {
                                tile::<W, $R, $C>(a, r, w, c, &wide, &mut scales, n, out)
                            },)*
                            _ => unreachable!("tile shape {height}×{width}"),
                        }
                    };
                }
                shapes!(
                    (1, 1),
                    (1, 2),
                    (2, 1),
                    (2, 2),
                    (3, 1),
                    (3, 2),
                    (4, 1),
                    (4, 2)
                );
                r += height;
            }
            c += width;
        }
    }
}

/// One `R × C` tile: the scale table, the even-block pass, the odd-block pass, then per
/// element `reduce(even + odd) + offset`, as the reference orders it.
///
/// # Safety
/// AVX2 and FMA; rows `r..r+R` and columns `c..c+C` exist; `wide` holds the columns expanded.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tile<W: Source, const R: usize, const C: usize>(
    a: &QuantActs,
    r: usize,
    w: &W,
    c: usize,
    wide: &[u8],
    scales: &mut [f32],
    n: usize,
    out: OutPtr,
) {
    let nb = w.k() / QK;
    let dw = w.d();
    for i in 0..R {
        let dx = &a.d[(r + i) * nb..(r + i + 1) * nb];
        for j in 0..C {
            let dwc = &dw[(c + j) * nb..(c + j + 1) * nb];
            let to = &mut scales[(i * C + j) * nb..(i * C + j + 1) * nb];
            for ((o, x), w) in to.iter_mut().zip(dx).zip(dwc) {
                *o = w * x;
            }
        }
    }
    // SAFETY: forwarded from the caller.
    let (even, odd) = unsafe {
        (
            pass::<W, R, C>(a, r, w, c, wide, scales, 0),
            pass::<W, R, C>(a, r, w, c, wide, scales, 1),
        )
    };
    for i in 0..R {
        for j in 0..C {
            // SAFETY: AVX2 and FMA; (r+i, c+j) is inside the output and this task's columns.
            unsafe {
                let v = reduce(_mm256_add_ps(even[i][j], odd[i][j])) + w.offset(a, r + i, c + j);
                *out.0.add((r + i) * n + c + j) = v;
            }
        }
    }
}

/// The blocks `first, first + 2, …` of an `R × C` tile into one set of accumulators.
///
/// # Safety
/// As [`tile`]; `scales` holds the tile's table.
#[inline(always)]
unsafe fn pass<W: Source, const R: usize, const C: usize>(
    a: &QuantActs,
    r: usize,
    w: &W,
    c: usize,
    wide: &[u8],
    scales: &[f32],
    first: usize,
) -> [[__m256; C]; R] {
    let k = w.k();
    let nb = k / QK;
    assert!(wide.len() >= C * nb * QK && scales.len() >= R * C * nb);
    assert!((r + R) * k <= a.q.len());
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let mut b = first;
    while b < nb {
        // SAFETY: b < nb and j < C: inside `wide` (asserted above).
        let wv: [__m256i; C] = std::array::from_fn(|j| unsafe {
            _mm256_loadu_si256(wide.as_ptr().add((j * nb + b) * QK) as *const __m256i)
        });
        for i in 0..R {
            // SAFETY: block b of row r+i exists (asserted above).
            let x = unsafe {
                _mm256_loadu_si256(a.q.as_ptr().add((r + i) * k + b * QK) as *const __m256i)
            };
            for j in 0..C {
                // SAFETY: block b of column c+j exists; the table entry is inside `scales`.
                unsafe {
                    let p = _mm256_maddubs_epi16(wv[j], w.signed(c + j, b, x));
                    let isum = _mm256_madd_epi16(p, ones);
                    let scale = _mm256_broadcast_ss(scales.get_unchecked((i * C + j) * nb + b));
                    acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[i][j]);
                }
            }
        }
        b += 2;
    }
    acc
}
