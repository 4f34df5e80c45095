//! Kernels for `x · wᵀ` when a call has several activation rows (batched decode, prefill):
//! AVX2, and AVX-512 VNNI on the same tiles.
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
//! What is left per 32-element block product is the integer product, a conversion and a
//! multiply-add. The integer product is where the instruction sets differ ([`BlockDot`]):
//! AVX2 needs `maddubs` then `madd` (two operations), VNNI's `vpdpbusd` does both in one, on
//! 256-bit registers (AVX-512 VL), which keeps the tile and its fixed order unchanged. Q8_0
//! adds a sign transfer (see `Q8_0Matrix::expand`); with VNNI it runs on `qmatmul`'s 512-bit
//! tiles instead, which need no expansion for it and measured faster.

// Tiles index several parallel arrays by the same row and column; index loops say that best.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use half::f16;

use super::f16c;
use super::matmul::OutPtr;
use super::qmatmul::avx2::nibbles;
use super::quant::{Q4_1Matrix, Q8_0Matrix, QuantActs, QK};

/// Activation rows per tile.
const TILE_R: usize = 4;
/// Weight columns per tile (expanded together).
const TILE_C: usize = 2;
/// Rows that pass over one expanded column pair before the next pair: their activations
/// (32 × k bytes) stay in L1/L2 beside the pair.
const ROW_BLOCK: usize = 32;

/// The integer part of a block product: eight lanes, each the exact sum of four
/// `unsigned weight byte × signed activation byte` products (the lanes the fixed order
/// scales), whatever instructions compute them.
trait BlockDot {
    /// # Safety
    /// The CPU has the implementation's features (every caller enables them).
    unsafe fn isum(w: __m256i, x: __m256i) -> __m256i;
}

/// AVX2: pairs to i16 (`maddubs`; weights ≤ 128 and activations ≤ 127 in magnitude keep
/// every pair sum within i16, so nothing saturates), then pairs of those to i32.
struct Maddubs;

impl BlockDot for Maddubs {
    #[inline(always)]
    unsafe fn isum(w: __m256i, x: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))
    }
}

/// AVX-512 VNNI (with VL): the four products and their sum in one instruction, with no
/// intermediate i16 and so no saturation at all.
struct Vnni;

impl BlockDot for Vnni {
    #[inline(always)]
    unsafe fn isum(w: __m256i, x: __m256i) -> __m256i {
        // SAFETY: AVX-512 VNNI and VL are enabled in every caller (`*_columns_vnni`).
        unsafe { vnni_isum(w, x) }
    }
}

/// `vpdpbusd` from zero. Its own function so that the intrinsic's features are named where
/// it is called; inlined into the VNNI entry points, which enable the same features.
#[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
#[inline]
unsafe fn vnni_isum(w: __m256i, x: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x)
}

/// What a tile needs to know about the weights besides the expanded bytes.
trait Source {
    /// Elements per weight row.
    fn k(&self) -> usize;
    /// The per-block weight scales, `n × nb`.
    fn d(&self) -> &[f16];
    /// The per-block weight minimums whose `Σ m·s` term follows the integer products (Q4_1);
    /// `None` where nothing is added (Q8_0: not even zero, which would turn a −0 into +0).
    fn mins(&self) -> Option<&[f16]>;
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
    /// The stored bytes of column `c` (which may be past the last: prefetches never fault).
    fn column_bytes(&self, c: usize) -> (*const u8, usize);
}

/// Asks for column `c`'s quants, scales and minimums to be brought into cache: a task's
/// columns are a few KiB, too short for the hardware prefetcher to ramp up, and a column pair
/// takes longer to compute than a DRAM access, so one pair ahead hides it.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn prefetch_column<W: Source>(w: &W, c: usize, nb: usize) {
    let (q, len) = w.column_bytes(c);
    for line in (0..len).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(line) as *const i8);
    }
    _mm_prefetch::<_MM_HINT_T0>(w.d().as_ptr().wrapping_add(c * nb) as *const i8);
    if let Some(m) = w.mins() {
        _mm_prefetch::<_MM_HINT_T0>(m.as_ptr().wrapping_add(c * nb) as *const i8);
    }
}

impl Source for Q4_1Matrix {
    fn k(&self) -> usize {
        self.k
    }

    fn d(&self) -> &[f16] {
        &self.d
    }

    fn mins(&self) -> Option<&[f16]> {
        Some(&self.m)
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

    fn column_bytes(&self, c: usize) -> (*const u8, usize) {
        let len = self.blocks_per_row() * 16;
        (self.qs.as_ptr().wrapping_add(c * len), len)
    }
}

impl Source for Q8_0Matrix {
    fn k(&self) -> usize {
        self.k
    }

    fn d(&self) -> &[f16] {
        &self.d
    }

    fn mins(&self) -> Option<&[f16]> {
        None
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

    fn column_bytes(&self, c: usize) -> (*const u8, usize) {
        (
            self.qs.as_ptr().wrapping_add(c * self.k) as *const u8,
            self.k,
        )
    }
}

/// Columns `c0..c1` of `out = a · wᵀ` for Q4_1 weights.
///
/// # Safety
/// AVX2, FMA and F16C; shapes as `qmatmul` checks them; only columns `c0..c1` of `out` are
/// written.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_1_columns(
    a: &QuantActs,
    w: &Q4_1Matrix,
    sc: &mut Scratch,
    c0: usize,
    c1: usize,
    out: OutPtr,
) {
    // SAFETY: forwarded from the caller.
    unsafe { columns::<Maddubs, _>(a, w, w.n, sc, c0, c1, out) }
}

/// Columns `c0..c1` of `out = a · wᵀ` for Q8_0 weights. One operation more per block product
/// than Q4_1: the weights' signs are applied to the activations for each pair.
///
/// # Safety
/// As [`q4_1_columns`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0_columns(
    a: &QuantActs,
    w: &Q8_0Matrix,
    sc: &mut Scratch,
    c0: usize,
    c1: usize,
    out: OutPtr,
) {
    // SAFETY: forwarded from the caller.
    unsafe { columns::<Maddubs, _>(a, w, w.n, sc, c0, c1, out) }
}

/// [`q4_1_columns`] with VNNI's integer products.
///
/// # Safety
/// As [`q4_1_columns`], and AVX-512 F, VL and VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) unsafe fn q4_1_columns_vnni(
    a: &QuantActs,
    w: &Q4_1Matrix,
    sc: &mut Scratch,
    c0: usize,
    c1: usize,
    out: OutPtr,
) {
    // SAFETY: forwarded from the caller.
    unsafe { columns::<Vnni, _>(a, w, w.n, sc, c0, c1, out) }
}

/// A task's working set, laid out so that a tile's per-block figures are a few contiguous
/// floats: block-major copies of the row block's activation scales and sums (`[b][row]`) and
/// of the column pair's weight scales and minimums (`[b][column]`), the column pair expanded,
/// and the tile's scale table. Kept by the caller across the column ranges a thread runs
/// (`matmul::split_columns_with`): allocating and clearing it per range of 32 columns cost
/// about 3 % of a batched decode step.
#[derive(Default)]
pub(super) struct Scratch {
    wide: Vec<u8>,
    /// `[b][j]`, two per block.
    dw: Vec<f32>,
    mw: Vec<f32>,
    /// `[b][row in block]`, ROW_BLOCK per block (rows past the block's end are unused).
    dx: Vec<f32>,
    sx: Vec<f32>,
    /// `[b][j·4 + i]`: `d_w[c+j][b] · d_x[r+i][b]`, the products the reference rounds to f32.
    scales: Vec<f32>,
}

impl Scratch {
    /// Sizes every part for `nb` blocks per row. What a previous product left is never
    /// read: each part is written before it is read (the row-block copies for rows past the
    /// block's end feed only lanes that are not stored).
    fn fit(&mut self, nb: usize) {
        self.wide.resize(TILE_C * nb * QK, 0);
        self.dw.resize(nb * TILE_C, 0.0);
        self.mw.resize(nb * TILE_C, 0.0);
        self.dx.resize(nb * ROW_BLOCK, 0.0);
        self.sx.resize(nb * ROW_BLOCK, 0.0);
        self.scales.resize(nb * TILE_R * TILE_C, 0.0);
    }
}

/// # Safety
/// As [`q4_1_columns`].
#[inline(always)]
unsafe fn columns<D: BlockDot, W: Source>(
    a: &QuantActs,
    w: &W,
    n: usize,
    sc: &mut Scratch,
    c0: usize,
    c1: usize,
    out: OutPtr,
) {
    let nb = w.k() / QK;
    sc.fit(nb);
    // The loops of `matmul::walk_tiles`, written out: a closure here would not be compiled
    // with this function's target features, and every tile would become a call.
    for rb in (0..a.rows).step_by(ROW_BLOCK) {
        let re = (rb + ROW_BLOCK).min(a.rows);
        for r in rb..re {
            let (d, s) = (&a.d[r * nb..(r + 1) * nb], &a.s[r * nb..(r + 1) * nb]);
            let blocks = sc
                .dx
                .chunks_exact_mut(ROW_BLOCK)
                .zip(sc.sx.chunks_exact_mut(ROW_BLOCK));
            for ((dx, sx), (&dv, &sv)) in blocks.zip(d.iter().zip(s)) {
                dx[r - rb] = dv;
                sx[r - rb] = sv;
            }
        }
        let mut c = c0;
        while c < c1 {
            let width = (c1 - c).min(TILE_C);
            for j in 0..TILE_C {
                // SAFETY: AVX2 and FMA are enabled in every caller.
                unsafe { prefetch_column(w, c + TILE_C + j, nb) };
            }
            for j in 0..width {
                // SAFETY: column c+j exists; `wide` holds TILE_C columns.
                unsafe { w.expand(c + j, &mut sc.wide[j * nb * QK..(j + 1) * nb * QK]) };
                let column = (c + j) * nb..(c + j + 1) * nb;
                // SAFETY (both widenings): F16C is enabled in every caller.
                for (pair, &d) in sc.dw.chunks_exact_mut(TILE_C).zip(&w.d()[column.clone()]) {
                    pair[j] = unsafe { f16c::one(d) };
                }
                if let Some(m) = w.mins() {
                    for (pair, &m) in sc.mw.chunks_exact_mut(TILE_C).zip(&m[column]) {
                        pair[j] = unsafe { f16c::one(m) };
                    }
                }
            }
            let mut r = rb;
            while r < re {
                let height = (re - r).min(TILE_R);
                macro_rules! shapes {
                    ($(($R:literal, $C:literal)),*) => {
                        match (height, width) {
                            // SAFETY: rows r..r+R and columns c..c+C exist and are expanded.
                            $(($R, $C) => unsafe {
                                tile::<D, W, $R, $C>(a, r, r - rb, w, c, sc, n, out)
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

/// The per-block pair `[v[b][0] × 4, v[b][1] × 4]` and row quadruple `[u[b][0..4] × 2]` of a
/// 4 × 2 tile, in the lane order `j·4 + i` of [`reduce_4x2`]'s result.
#[inline(always)]
unsafe fn pair_and_rows(pairs: *const f32, rows: *const f32) -> (__m256, __m256) {
    // SAFETY: two floats at `pairs` and four at `rows` (the caller's guarantee).
    unsafe {
        let two = _mm256_castpd_ps(_mm256_broadcast_sd(&*(pairs as *const f64)));
        let spread = _mm256_permutevar8x32_ps(two, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
        let four = _mm256_broadcast_ps(&*(rows as *const __m128));
        (spread, four)
    }
}

/// One `R × C` tile (at most 4 × 2): the scale table, the even-block pass, the odd-block
/// pass, then for all elements at once `reduce(even + odd) + offset`, as the reference orders
/// each element's steps.
///
/// # Safety
/// AVX2 and FMA; rows `r..r+R` and columns `c..c+C` exist; `sc` holds the columns expanded
/// and the row block's figures, row `r` being the block's row `rr`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tile<D: BlockDot, W: Source, const R: usize, const C: usize>(
    a: &QuantActs,
    r: usize,
    rr: usize,
    w: &W,
    c: usize,
    sc: &mut Scratch,
    n: usize,
    out: OutPtr,
) {
    let nb = w.k() / QK;
    assert!(rr + TILE_R <= ROW_BLOCK && sc.dx.len() >= nb * ROW_BLOCK);
    assert!(sc.dw.len() >= nb * TILE_C && sc.scales.len() >= nb * TILE_R * TILE_C);
    for b in 0..nb {
        // SAFETY: inside the block-major copies and the table (asserted above).
        unsafe {
            let (dw, dx) = pair_and_rows(
                sc.dw.as_ptr().add(b * TILE_C),
                sc.dx.as_ptr().add(b * ROW_BLOCK + rr),
            );
            _mm256_storeu_ps(sc.scales.as_mut_ptr().add(b * 8), _mm256_mul_ps(dw, dx));
        }
    }
    // SAFETY: forwarded from the caller.
    let (even, odd) = unsafe {
        (
            pass::<D, W, R, C>(a, r, w, c, &sc.wide, &sc.scales, 0),
            pass::<D, W, R, C>(a, r, w, c, &sc.wide, &sc.scales, 1),
        )
    };
    let mut sums = [_mm256_setzero_ps(); 8];
    for i in 0..R {
        for j in 0..C {
            sums[i * 2 + j] = _mm256_add_ps(even[i][j], odd[i][j]);
        }
    }
    // SAFETY: AVX2 and FMA (the caller's); the block-major copies are in range.
    let mut t = unsafe { reduce_4x2(sums) };
    if w.mins().is_some() {
        // SAFETY: as above.
        t = _mm256_add_ps(t, unsafe { offsets(sc, rr, nb) });
    }
    // Lanes: column c for rows r..r+4, then column c+1.
    if R == 4 && C == 2 {
        // SAFETY: rows r..r+4 and columns c..c+2 are inside the output and this task's.
        unsafe {
            let (c0, c1) = (_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
            let rows01 = _mm_unpacklo_ps(c0, c1);
            let rows23 = _mm_unpackhi_ps(c0, c1);
            let at = |i: usize| out.0.add((r + i) * n + c) as *mut __m128i;
            _mm_storel_epi64(at(0), _mm_castps_si128(rows01));
            _mm_storel_epi64(at(1), _mm_castps_si128(_mm_movehl_ps(rows01, rows01)));
            _mm_storel_epi64(at(2), _mm_castps_si128(rows23));
            _mm_storel_epi64(at(3), _mm_castps_si128(_mm_movehl_ps(rows23, rows23)));
        }
    } else {
        let mut lanes = [0f32; 8];
        // SAFETY: eight floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), t) };
        for i in 0..R {
            for j in 0..C {
                // SAFETY: (r+i, c+j) is inside the output and this task's columns.
                unsafe { *out.0.add((r + i) * n + c + j) = lanes[j * 4 + i] };
            }
        }
    }
}

/// `Σ_b m[c+j][b]·s[r+i][b]` for a 4 × 2 tile in `reduce_4x2`'s lane order, each element as
/// `reference::offset_term` orders it: sixteen lanes over the full chunks of sixteen blocks,
/// `reduce8(lane[l] + lane[l+8])`, then the remaining blocks one by one.
///
/// # Safety
/// AVX2 and FMA; `sc` holds the column pair's minimums and the row block's sums, the tile's
/// first row being the block's row `rr` (at most `ROW_BLOCK - 4`).
#[inline(always)]
unsafe fn offsets(sc: &Scratch, rr: usize, nb: usize) -> __m256 {
    assert!(
        rr + TILE_R <= ROW_BLOCK && sc.mw.len() >= nb * TILE_C && sc.sx.len() >= nb * ROW_BLOCK
    );
    let full = nb / 16 * 16;
    // SAFETY: every block index below is < nb: inside the copies (asserted above).
    let at = |b: usize| unsafe {
        pair_and_rows(
            sc.mw.as_ptr().add(b * TILE_C),
            sc.sx.as_ptr().add(b * ROW_BLOCK + rr),
        )
    };
    // lane[l] + lane[l + 8] for l < 8, each lane a chain over the chunks.
    let mut q = [_mm256_setzero_ps(); 8];
    for (l, ql) in q.iter_mut().enumerate() {
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for ch in (0..full).step_by(16) {
            let (m, s) = at(ch + l);
            lo = _mm256_fmadd_ps(m, s, lo);
            let (m, s) = at(ch + l + 8);
            hi = _mm256_fmadd_ps(m, s, hi);
        }
        *ql = _mm256_add_ps(lo, hi);
    }
    // reduce8, element by element.
    let even = _mm256_add_ps(_mm256_add_ps(q[0], q[4]), _mm256_add_ps(q[2], q[6]));
    let odd = _mm256_add_ps(_mm256_add_ps(q[1], q[5]), _mm256_add_ps(q[3], q[7]));
    let mut t = _mm256_add_ps(even, odd);
    for b in full..nb {
        let (m, s) = at(b);
        t = _mm256_fmadd_ps(m, s, t);
    }
    t
}

/// Eight vectors reduced at once, each as `reduce8` (and `dot::avx2::reduce`) orders its
/// lanes: `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`. With the vectors numbered `2i + j` for row
/// `i` and column `j` of a 4 × 2 tile, lane `j·4 + i` of the result holds element `(i, j)`.
///
/// # Safety
/// AVX.
#[inline(always)]
unsafe fn reduce_4x2(v: [__m256; 8]) -> __m256 {
    // l_k + l_{k+4} for two vectors per register (one per 128-bit half).
    let halves = |x: __m256, y: __m256| {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(x, y),
            _mm256_permute2f128_ps::<0x31>(x, y),
        )
    };
    let h = [
        halves(v[0], v[1]),
        halves(v[2], v[3]),
        halves(v[4], v[5]),
        halves(v[6], v[7]),
    ];
    // (l0+l4)+(l2+l6) and (l1+l5)+(l3+l7): per half, vector 2i's pair then 2i+2's.
    let pairs = |x: __m256, y: __m256| {
        _mm256_add_ps(
            _mm256_shuffle_ps::<0b01_00_01_00>(x, y),
            _mm256_shuffle_ps::<0b11_10_11_10>(x, y),
        )
    };
    let (p01, p23) = (pairs(h[0], h[1]), pairs(h[2], h[3]));
    _mm256_add_ps(
        _mm256_shuffle_ps::<0b10_00_10_00>(p01, p23),
        _mm256_shuffle_ps::<0b11_01_11_01>(p01, p23),
    )
}

/// The blocks `first, first + 2, …` of an `R × C` tile into one set of accumulators.
///
/// # Safety
/// As [`tile`]; `scales` holds the tile's table.
#[inline(always)]
unsafe fn pass<D: BlockDot, W: Source, const R: usize, const C: usize>(
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
    assert!(wide.len() >= C * nb * QK && scales.len() >= nb * 8);
    assert!((r + R) * k <= a.q.len());
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
                    let isum = D::isum(wv[j], w.signed(c + j, b, x));
                    let scale = _mm256_broadcast_ss(scales.get_unchecked(b * 8 + j * 4 + i));
                    acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[i][j]);
                }
            }
        }
        b += 2;
    }
    acc
}
