//! `out = x · wᵀ` on quantized blocks: 8-bit activations ([`QuantActs`]) against Q4_1 (and
//! Q4_0) or Q8_0 weights, integer dot products inside each block, f32 across blocks.
//!
//! # The fixed order (what makes results batch invariant and every path equal the reference)
//! For one output element and block `b`, eight integer lanes `I[j] = Σ_{i<4} w[4j+i]·x[4j+i]`
//! are exact in any order. They are scaled and accumulated in f32 as
//! `acc_{b mod 2}[j] = fma(I[j], d_w[b]·d_x[b], acc_{b mod 2}[j])` over blocks in order (even
//! blocks in one set of eight lanes, odd in another: AVX-512 holds both in one register). The
//! result is `reduce8(acc_0 + acc_1)`; for Q4_1 the offset term `Σ_b m[b]·s_x[b]` follows in
//! sixteen lanes (`b mod 16`), reduced the same way, its tail blocks added one by one.
//! [`reference`] spells this out in scalar code, and the SIMD paths are tested equal to it bit
//! for bit.

// Tiles index several parallel arrays by the same row and column; index loops say that best.
#![allow(clippy::needless_range_loop)]

use std::sync::OnceLock;

use half::f16;

use super::dot::reduce8;
use super::matmul::{split_columns_with, walk_tiles, OutPtr};
use super::quant::{Q4_1Matrix, Q8_0Matrix, QuantActs, QK};

/// Quantized weights a product can run on.
#[derive(Debug, Clone, Copy)]
pub enum QWeights<'a> {
    Q4_1(&'a Q4_1Matrix),
    Q8_0(&'a Q8_0Matrix),
}

impl QWeights<'_> {
    pub fn n(&self) -> usize {
        match self {
            Self::Q4_1(w) => w.n,
            Self::Q8_0(w) => w.n,
        }
    }

    pub fn k(&self) -> usize {
        match self {
            Self::Q4_1(w) => w.k,
            Self::Q8_0(w) => w.k,
        }
    }
}

/// The implementation the running CPU gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QPath {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
}

impl QPath {
    /// The largest tile (rows, columns) this path's kernels are instantiated for.
    pub(crate) fn max_tile(self) -> (usize, usize) {
        match self {
            QPath::Scalar => (1, 1),
            #[cfg(target_arch = "x86_64")]
            QPath::Avx2 => (2, 2),
            #[cfg(target_arch = "x86_64")]
            QPath::Avx512Vnni => (4, 4),
        }
    }

    /// Every path this CPU can run, the scalar reference first.
    pub fn available() -> Vec<QPath> {
        let mut paths = vec![QPath::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            // F16C widens the weights' f16 scales; every AVX2 CPU has it, but it is its own flag.
            let avx2 = std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c");
            if avx2 {
                paths.push(QPath::Avx2);
            }
            if avx2
                && ["avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512vnni"]
                    .iter()
                    .all(|f| avx512_feature(f))
            {
                paths.push(QPath::Avx512Vnni);
            }
        }
        paths
    }

    /// The fastest available path, detected once per process.
    pub fn best() -> QPath {
        static BEST: OnceLock<QPath> = OnceLock::new();
        *BEST.get_or_init(|| {
            *QPath::available()
                .last()
                .expect("scalar is always available")
        })
    }
}

#[cfg(target_arch = "x86_64")]
fn avx512_feature(name: &str) -> bool {
    match name {
        "avx512f" => std::is_x86_feature_detected!("avx512f"),
        "avx512bw" => std::is_x86_feature_detected!("avx512bw"),
        "avx512dq" => std::is_x86_feature_detected!("avx512dq"),
        "avx512vl" => std::is_x86_feature_detected!("avx512vl"),
        "avx512vnni" => std::is_x86_feature_detected!("avx512vnni"),
        _ => false,
    }
}

const ROW_BLOCK: usize = 32;
const COLS_PER_TASK: usize = 32;
/// From this many activation rows on, AVX2 runs the batched kernels (`qbatch`), which expand
/// each weight column once for many rows; below it, the tiles here expand as they go.
#[cfg(target_arch = "x86_64")]
const BATCH_ROWS_AVX2: usize = 3;
/// How far ahead of the block being read the single-row kernels (AVX2 and AVX-512) prefetch
/// weights: tasks cover a few KiB of columns each, too short for the hardware prefetcher to
/// ramp up (without it the AVX-512 kernel read from memory at about half the AVX2 one's speed).
#[cfg(target_arch = "x86_64")]
const PREFETCH: usize = 1024;
/// The same for AVX-512 VNNI, whose own 4 × 4 tiles (two blocks per 512-bit register) hold
/// their own longer: Q4_1 gains from `qbatch` from about eight rows (one expansion of a column
/// for all rows instead of one per four), Q8_0, which needs no expansion, never did
/// (`make bench-kernels`: the tiles ran Q8_0 at 50–62 GMAC/s per thread against 40–52 at 6 to
/// 64 rows).
#[cfg(target_arch = "x86_64")]
const BATCH_ROWS_AVX512_Q4_1: usize = 8;

/// Working memory a thread keeps across the column ranges it runs (the batched kernels').
#[cfg(target_arch = "x86_64")]
type Scratch = super::qbatch::Scratch;
#[cfg(not(target_arch = "x86_64"))]
type Scratch = ();

/// Computes `out[r][c] = Σ x[r]·w[c]` for every activation row and weight row.
pub fn qmatmul(
    pool: &rayon::ThreadPool,
    path: QPath,
    acts: &QuantActs,
    w: QWeights<'_>,
    out: &mut [f32],
) {
    let (rows, n, k) = (acts.rows, w.n(), w.k());
    assert_eq!(acts.k, k, "activations and weights differ in k");
    assert_eq!(out.len(), rows * n, "output is not rows × n");
    assert_eq!(acts.q.len(), rows * k, "activations are not rows × k");
    if rows == 0 || n == 0 {
        return;
    }
    split_columns_with(
        pool,
        n,
        COLS_PER_TASK,
        out,
        Scratch::default,
        |sc, c0, c1, out_ptr| {
            // SAFETY: shapes checked above; this task writes only columns c0..c1.
            unsafe { columns(path, acts, w, sc, c0, c1, out_ptr) };
        },
    );
}

/// # Safety
/// Shapes as checked by `qmatmul`; only columns `c0..c1` of `out` are written.
unsafe fn columns(
    path: QPath,
    a: &QuantActs,
    w: QWeights<'_>,
    #[allow(unused_variables)] sc: &mut Scratch,
    c0: usize,
    c1: usize,
    out: OutPtr,
) {
    let n = w.n();
    let store = |r: usize, c: usize, v: f32| {
        // SAFETY: r < rows, c < n: inside the output, in this task's columns.
        unsafe { *out.0.add(r * n + c) = v };
    };
    #[cfg(target_arch = "x86_64")]
    {
        use super::qbatch;
        let rows = a.rows;
        // SAFETY: each kernel runs on its own path, whose features were detected; the shapes
        // and columns are the caller's.
        unsafe {
            match (path, w) {
                (QPath::Avx2, QWeights::Q4_1(m)) if rows >= BATCH_ROWS_AVX2 => {
                    return qbatch::q4_1_columns(a, m, sc, c0, c1, out)
                }
                (QPath::Avx2, QWeights::Q8_0(m)) if rows >= BATCH_ROWS_AVX2 => {
                    return qbatch::q8_0_columns(a, m, sc, c0, c1, out)
                }
                (QPath::Avx512Vnni, QWeights::Q4_1(m)) if rows >= BATCH_ROWS_AVX512_Q4_1 => {
                    return qbatch::q4_1_columns_vnni(a, m, sc, c0, c1, out)
                }
                _ => {}
            }
        }
    }
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
    w: QWeights<'_>,
    c: usize,
    wd: usize,
    store: &impl Fn(usize, usize, f32),
) {
    macro_rules! put {
        ($t:expr) => {{
            for (i, row) in $t.iter().enumerate() {
                for (j, v) in row.iter().enumerate() {
                    store(r + i, c + j, *v);
                }
            }
        }};
    }
    macro_rules! shapes {
        ($md:ident :: $f:ident, $wm:expr, [$(($R:literal, $C:literal)),*]) => {
            match (h, wd) {
                // SAFETY: the caller guarantees the rows, columns and CPU features.
                $(($R, $C) => put!(unsafe { $md::$f::<$R, $C>(a, r, $wm, c) }),)*
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
        (QPath::Scalar, QWeights::Q4_1(m)) => store(r, c, reference::q4_1(a, r, m, c)),
        (QPath::Scalar, QWeights::Q8_0(m)) => store(r, c, reference::q8_0(a, r, m, c)),
        #[cfg(target_arch = "x86_64")]
        (QPath::Avx2, QWeights::Q4_1(m)) => {
            shapes!(avx2::q4_1, m, [(1, 1), (1, 2), (2, 1), (2, 2)])
        }
        #[cfg(target_arch = "x86_64")]
        (QPath::Avx2, QWeights::Q8_0(m)) => {
            shapes!(avx2::q8_0, m, [(1, 1), (1, 2), (2, 1), (2, 2)])
        }
        #[cfg(target_arch = "x86_64")]
        (QPath::Avx512Vnni, QWeights::Q4_1(m)) => up_to_4x4!(avx512::q4_1, m),
        #[cfg(target_arch = "x86_64")]
        (QPath::Avx512Vnni, QWeights::Q8_0(m)) => up_to_4x4!(avx512::q8_0, m),
    }
}

/// The scalar reference: the definition of each product's value.
pub mod reference {
    use super::*;

    /// Combines the even- and odd-block lanes.
    fn finish(acc: [[f32; 8]; 2]) -> f32 {
        reduce8(std::array::from_fn(|j| acc[0][j] + acc[1][j]))
    }

    /// `Σ_b m[b]·s[b]` in sixteen lanes, then the tail in order. Inlined so that callers
    /// compiled with FMA get the instruction, not a library call.
    #[inline(always)]
    pub(super) fn offset_term(m: &[f16], s: &[f32]) -> f32 {
        let full = m.len() / 16 * 16;
        let mut lanes = [0f32; 16];
        for ch in (0..full).step_by(16) {
            for (l, lane) in lanes.iter_mut().enumerate() {
                *lane = m[ch + l].to_f32().mul_add(s[ch + l], *lane);
            }
        }
        let mut t = reduce8(std::array::from_fn(|j| lanes[j] + lanes[j + 8]));
        for b in full..m.len() {
            t = m[b].to_f32().mul_add(s[b], t);
        }
        t
    }

    /// Row `r` of `a` times Q4_1 column `c`.
    pub fn q4_1(a: &QuantActs, r: usize, w: &Q4_1Matrix, c: usize) -> f32 {
        let nb = w.blocks_per_row();
        let mut acc = [[0f32; 8]; 2];
        for b in 0..nb {
            let qs = &w.qs[(c * nb + b) * 16..(c * nb + b + 1) * 16];
            let x = &a.q[r * w.k + b * QK..r * w.k + (b + 1) * QK];
            let wq = |e: usize| {
                i32::from(if e < 16 {
                    qs[e] & 0x0F
                } else {
                    qs[e - 16] >> 4
                })
            };
            let scale = w.d[c * nb + b].to_f32() * a.d[r * nb + b];
            for (j, lane) in acc[b % 2].iter_mut().enumerate() {
                let isum: i32 = (4 * j..4 * j + 4).map(|e| wq(e) * i32::from(x[e])).sum();
                *lane = (isum as f32).mul_add(scale, *lane);
            }
        }
        finish(acc) + offset_term(&w.m[c * nb..(c + 1) * nb], &a.s[r * nb..(r + 1) * nb])
    }

    /// Row `r` of `a` times Q8_0 column `c`.
    pub fn q8_0(a: &QuantActs, r: usize, w: &Q8_0Matrix, c: usize) -> f32 {
        let nb = w.blocks_per_row();
        let mut acc = [[0f32; 8]; 2];
        for b in 0..nb {
            let wq = &w.qs[c * w.k + b * QK..c * w.k + (b + 1) * QK];
            let x = &a.q[r * w.k + b * QK..r * w.k + (b + 1) * QK];
            let scale = w.d[c * nb + b].to_f32() * a.d[r * nb + b];
            for (j, lane) in acc[b % 2].iter_mut().enumerate() {
                let isum: i32 = (4 * j..4 * j + 4)
                    .map(|e| i32::from(wq[e]) * i32::from(x[e]))
                    .sum();
                *lane = (isum as f32).mul_add(scale, *lane);
            }
        }
        finish(acc)
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use std::arch::x86_64::*;

    use super::*;
    use crate::kernels::dot::avx2::reduce;
    use crate::kernels::f16c;

    /// The offset term as `reference::offset_term` defines it, its sixteen lanes in two
    /// registers (the compiler leaves the reference's lane array scalar, which cost as much as
    /// a short row's whole integer product).
    #[inline(always)]
    pub(in crate::kernels) unsafe fn offset_term(m: &[f16], s: &[f32]) -> f32 {
        let nb = m.len().min(s.len());
        let full = nb / 16 * 16;
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for ch in (0..full).step_by(16) {
            // SAFETY: ch + 16 <= nb, within both slices; F16C is enabled in every caller.
            unsafe {
                let (m, s) = (m.as_ptr().add(ch), s.as_ptr().add(ch));
                lo = _mm256_fmadd_ps(f16c::eight(m), _mm256_loadu_ps(s), lo);
                hi = _mm256_fmadd_ps(f16c::eight(m.add(8)), _mm256_loadu_ps(s.add(8)), hi);
            }
        }
        // SAFETY: AVX is enabled in every caller.
        let mut t = unsafe { reduce(_mm256_add_ps(lo, hi)) };
        for b in full..nb {
            // SAFETY: as above.
            t = unsafe { f16c::one(m[b]) }.mul_add(s[b], t);
        }
        t
    }

    /// Blocks whose scales are multiplied out together before their integer products run
    /// (even, so every chunk starts at an even block).
    const SCALE_CHUNK: usize = 16;
    const _: () = assert!(SCALE_CHUNK.is_multiple_of(2));
    /// Calls `step(t, t % 2)` for `t` in `0..len` with the parity a literal at each call, so
    /// the accumulator set a kernel's step indexes with it stays in registers.
    #[inline(always)]
    fn by_parity(len: usize, mut step: impl FnMut(usize, usize)) {
        let mut t = 0;
        while t + 1 < len {
            step(t, 0);
            step(t + 1, 1);
            t += 2;
        }
        if t < len {
            step(t, 0);
        }
    }

    /// Sixteen Q4_1 weights' nibbles expanded to 32 bytes in element order: the 16 bytes are
    /// broadcast to both halves by the load itself, then the upper half is shifted by four, so
    /// the expansion costs two vector operations.
    #[inline(always)]
    pub(in crate::kernels) unsafe fn nibbles(
        p: *const u8,
        shift: __m256i,
        mask: __m256i,
    ) -> __m256i {
        // SAFETY: the caller points at 16 readable bytes.
        let q = unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i)) };
        _mm256_and_si256(_mm256_srlv_epi32(q, shift), mask)
    }

    /// `scales[i][j][t] = d_w[c+j][b0+t] · d_x[r+i][b0+t]` for the blocks `b0..b0+len`, the
    /// products the reference rounds to f32 before its multiply-add, eight at a time.
    ///
    /// # Safety
    /// F16C and AVX (every caller's); `len <= SCALE_CHUNK`.
    #[inline(always)]
    unsafe fn scale_table<const R: usize, const C: usize>(
        dx: &[f32],
        dw: &[f16],
        nb: usize,
        r: usize,
        c: usize,
        b0: usize,
        len: usize,
    ) -> [[[f32; SCALE_CHUNK]; C]; R] {
        let mut t = [[[0f32; SCALE_CHUNK]; C]; R];
        for j in 0..C {
            // SAFETY: F16C and AVX (the caller's); `len <= SCALE_CHUNK`.
            let w: [f32; SCALE_CHUNK] =
                unsafe { f16c::widen(&dw[(c + j) * nb + b0..(c + j) * nb + b0 + len]) };
            for i in 0..R {
                let x = &dx[(r + i) * nb + b0..(r + i) * nb + b0 + len];
                for (o, (a, b)) in t[i][j].iter_mut().zip(w.iter().zip(x)) {
                    *o = a * b;
                }
            }
        }
        t
    }

    /// # Safety
    /// AVX2, FMA and F16C; rows `r..r+R` and columns `c..c+C` exist.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q4_1<const R: usize, const C: usize>(
        a: &QuantActs,
        r: usize,
        w: &Q4_1Matrix,
        c: usize,
    ) -> [[f32; C]; R] {
        let nb = w.blocks_per_row();
        let ones = _mm256_set1_epi16(1);
        let shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
        let mask = _mm256_set1_epi8(0x0F);
        let mut acc = [[[_mm256_setzero_ps(); 2]; C]; R];
        // Chunks start at even blocks, so a block's parity (its accumulator) is kept.
        for b0 in (0..nb).step_by(SCALE_CHUNK) {
            let len = (nb - b0).min(SCALE_CHUNK);
            // SAFETY: F16C and AVX are enabled here; len <= SCALE_CHUNK.
            let scales = unsafe { scale_table::<R, C>(&a.d, &w.d, nb, r, c, b0, len) };
            // Block `b0 + t` into accumulator set `P` (its parity): a constant index, so the
            // accumulators stay in registers (an index computed at run time, `b % 2`, puts
            // them on the stack and every multiply-add waits on a store and a load).
            let step = |t: usize, acc: &mut [[[__m256; 2]; C]; R], parity: usize| {
                let b = b0 + t;
                let mut wv = [_mm256_setzero_si256(); C];
                for j in 0..C {
                    let at = ((c + j) * nb + b) * 16;
                    // SAFETY: block b of column c+j exists.
                    wv[j] = unsafe { nibbles(w.qs.as_ptr().add(at), shift, mask) };
                    if b.is_multiple_of(4) {
                        // One cache line in four blocks: ask for the line PREFETCH bytes on
                        // (a later tile's columns; a prefetch never faults, even past the end).
                        _mm_prefetch::<_MM_HINT_T0>(
                            w.qs.as_ptr().wrapping_add(at + PREFETCH) as *const i8
                        );
                    }
                }
                for i in 0..R {
                    // SAFETY: block b of row r+i exists.
                    let x = unsafe {
                        _mm256_loadu_si256(
                            a.q.as_ptr().add((r + i) * w.k + b * QK) as *const __m256i
                        )
                    };
                    for j in 0..C {
                        let isum = _mm256_madd_epi16(_mm256_maddubs_epi16(wv[j], x), ones);
                        // A broadcast from memory is a load, not an arithmetic operation.
                        let scale = _mm256_broadcast_ss(&scales[i][j][t]);
                        acc[i][j][parity] =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[i][j][parity]);
                    }
                }
            };
            // Chunks start at even blocks (SCALE_CHUNK is even), so t's parity is b's.
            by_parity(len, |t, parity| step(t, &mut acc, parity));
        }
        let mut out = [[0f32; C]; R];
        for i in 0..R {
            for j in 0..C {
                let main = unsafe { reduce(_mm256_add_ps(acc[i][j][0], acc[i][j][1])) };
                let m = &w.m[(c + j) * nb..(c + j + 1) * nb];
                let s = &a.s[(r + i) * nb..(r + i + 1) * nb];
                out[i][j] = main + unsafe { offset_term(m, s) };
            }
        }
        out
    }

    /// # Safety
    /// AVX2, FMA and F16C; rows `r..r+R` and columns `c..c+C` exist.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q8_0<const R: usize, const C: usize>(
        a: &QuantActs,
        r: usize,
        w: &Q8_0Matrix,
        c: usize,
    ) -> [[f32; C]; R] {
        let nb = w.blocks_per_row();
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[[_mm256_setzero_ps(); 2]; C]; R];
        for b0 in (0..nb).step_by(SCALE_CHUNK) {
            let len = (nb - b0).min(SCALE_CHUNK);
            // SAFETY: F16C and AVX are enabled here; len <= SCALE_CHUNK.
            let scales = unsafe { scale_table::<R, C>(&a.d, &w.d, nb, r, c, b0, len) };
            // As in `q4_1`: the accumulator set is a constant per call, kept in registers.
            let step = |t: usize, acc: &mut [[[__m256; 2]; C]; R], parity: usize| {
                let b = b0 + t;
                let mut wv = [_mm256_setzero_si256(); C];
                let mut wabs = [_mm256_setzero_si256(); C];
                for j in 0..C {
                    let at = (c + j) * w.k + b * QK;
                    // SAFETY: block b of column c+j exists.
                    wv[j] = unsafe { _mm256_loadu_si256(w.qs.as_ptr().add(at) as *const __m256i) };
                    if b.is_multiple_of(2) {
                        // One cache line in two blocks, as in `q4_1`.
                        _mm_prefetch::<_MM_HINT_T0>(w.qs.as_ptr().wrapping_add(at + PREFETCH));
                    }
                    wabs[j] = _mm256_sign_epi8(wv[j], wv[j]);
                }
                for i in 0..R {
                    // SAFETY: block b of row r+i exists.
                    let x = unsafe {
                        _mm256_loadu_si256(
                            a.q.as_ptr().add((r + i) * w.k + b * QK) as *const __m256i
                        )
                    };
                    for j in 0..C {
                        // |w| · (x with w's sign) = w · x, in maddubs' unsigned × signed form.
                        let p = _mm256_maddubs_epi16(wabs[j], _mm256_sign_epi8(x, wv[j]));
                        let isum = _mm256_madd_epi16(p, ones);
                        let scale = _mm256_broadcast_ss(&scales[i][j][t]);
                        acc[i][j][parity] =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[i][j][parity]);
                    }
                }
            };
            by_parity(len, |t, parity| step(t, &mut acc, parity));
        }
        let mut out = [[0f32; C]; R];
        for i in 0..R {
            for j in 0..C {
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
    use crate::kernels::f16c;

    /// Asks for the cache line at `p` (a prefetch never faults, even past the end).
    #[inline(always)]
    fn prefetch(p: *const u8) {
        // SAFETY: a prefetch hint reads nothing architecturally.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) };
    }

    /// `[d0 × 8, d1 × 8]`.
    #[inline(always)]
    unsafe fn pair(d0: f32, d1: f32) -> __m512 {
        _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1)
    }

    /// [`pair`] of the two f16 scales at `p`, widened.
    ///
    /// # Safety
    /// F16C and AVX-512 F; two readable scales at `p`.
    #[inline(always)]
    unsafe fn pair_f16(p: *const f16) -> __m512 {
        // SAFETY: the caller's guarantee.
        let two = unsafe { f16c::two(p) };
        let spread = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(two))
    }

    /// Two consecutive Q4_1 blocks' nibbles (32 bytes) expanded to 64 bytes in element order.
    #[inline(always)]
    unsafe fn nibbles2(p: *const u8) -> __m512i {
        // SAFETY: the caller points at 32 readable bytes.
        let q = unsafe { _mm256_loadu_si256(p as *const __m256i) };
        let mask = _mm256_set1_epi8(0x0F);
        let lo = _mm256_and_si256(q, mask);
        let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
        let t = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); // lo0 lo1 hi0 hi1
        _mm512_shuffle_i64x2(t, t, 0b11_01_10_00) // lo0 hi0 lo1 hi1
    }

    /// One Q4_1 block's nibbles (16 bytes) expanded to 32 bytes.
    #[inline(always)]
    unsafe fn nibbles1(p: *const u8) -> __m256i {
        // SAFETY: the caller points at 16 readable bytes.
        let q = unsafe { _mm_loadu_si128(p as *const __m128i) };
        let mask = _mm_set1_epi8(0x0F);
        _mm256_set_m128i(
            _mm_and_si128(_mm_srli_epi16(q, 4), mask),
            _mm_and_si128(q, mask),
        )
    }

    /// The offset term in sixteen lanes, as `reference::offset_term` defines it.
    #[inline(always)]
    unsafe fn offset_term(m: &[f16], s: &[f32]) -> f32 {
        let full = m.len() / 16 * 16;
        let mut lanes = _mm512_setzero_ps();
        for ch in (0..full).step_by(16) {
            // SAFETY: ch + 16 <= len of both.
            let (mv, sv) = unsafe {
                (
                    _mm512_cvtph_ps(_mm256_loadu_si256(m.as_ptr().add(ch) as *const __m256i)),
                    _mm512_loadu_ps(s.as_ptr().add(ch)),
                )
            };
            lanes = _mm512_fmadd_ps(mv, sv, lanes);
        }
        let halves = _mm256_add_ps(
            _mm512_castps512_ps256(lanes),
            _mm512_extractf32x8_ps(lanes, 1),
        );
        let mut t = unsafe { reduce(halves) };
        for b in full..m.len() {
            // SAFETY: F16C is enabled in every caller.
            t = unsafe { f16c::one(m[b]) }.mul_add(s[b], t);
        }
        t
    }

    /// Even-block lanes + odd-block lanes, reduced.
    #[inline(always)]
    unsafe fn finish(acc: __m512, tail: Option<__m256>) -> f32 {
        let even = tail.unwrap_or(_mm512_castps512_ps256(acc));
        unsafe { reduce(_mm256_add_ps(even, _mm512_extractf32x8_ps(acc, 1))) }
    }

    /// # Safety
    /// AVX-512 F/BW/DQ/VL/VNNI, FMA and F16C; rows `r..r+R` and columns `c..c+C` exist.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,fma,f16c")]
    pub unsafe fn q4_1<const R: usize, const C: usize>(
        a: &QuantActs,
        r: usize,
        w: &Q4_1Matrix,
        c: usize,
    ) -> [[f32; C]; R] {
        let nb = w.blocks_per_row();
        let k = w.k;
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        for b in (0..nb - nb % 2).step_by(2) {
            let mut wv = [_mm512_setzero_si512(); C];
            let mut dw = [_mm512_setzero_ps(); C];
            for j in 0..C {
                let at = (c + j) * nb + b;
                // SAFETY: blocks b and b+1 of column c+j exist.
                wv[j] = unsafe { nibbles2(w.qs.as_ptr().add(at * 16)) };
                dw[j] = unsafe { pair_f16(w.d.as_ptr().add(at)) };
                if b.is_multiple_of(4) {
                    // One cache line in four blocks, as the AVX2 kernel asks for it.
                    prefetch(w.qs.as_ptr().wrapping_add(at * 16 + PREFETCH));
                }
            }
            for i in 0..R {
                let at = (r + i) * nb + b;
                // SAFETY: blocks b and b+1 of row r+i exist.
                let x = unsafe {
                    _mm512_loadu_si512(a.q.as_ptr().add((r + i) * k + b * QK) as *const _)
                };
                let dx = unsafe { pair(a.d[at], a.d[at + 1]) };
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
                let tail = (nb % 2 == 1).then(|| {
                    let b = nb - 1;
                    // SAFETY: block b of column c+j and row r+i exist.
                    let wv = unsafe { nibbles1(w.qs.as_ptr().add(((c + j) * nb + b) * 16)) };
                    let x = unsafe {
                        _mm256_loadu_si256(a.q.as_ptr().add((r + i) * k + b * QK) as *const __m256i)
                    };
                    let isum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wv, x);
                    // SAFETY: F16C is enabled here.
                    let dw = unsafe { f16c::one(w.d[(c + j) * nb + b]) };
                    let scale = _mm256_set1_ps(dw * a.d[(r + i) * nb + b]);
                    _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(isum),
                        scale,
                        _mm512_castps512_ps256(acc[i][j]),
                    )
                });
                let m = &w.m[(c + j) * nb..(c + j + 1) * nb];
                let s = &a.s[(r + i) * nb..(r + i + 1) * nb];
                out[i][j] = unsafe { finish(acc[i][j], tail) + offset_term(m, s) };
            }
        }
        out
    }

    /// # Safety
    /// AVX-512 F/BW/DQ/VL/VNNI, FMA and F16C; rows `r..r+R` and columns `c..c+C` exist.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,fma,f16c")]
    pub unsafe fn q8_0<const R: usize, const C: usize>(
        a: &QuantActs,
        r: usize,
        w: &Q8_0Matrix,
        c: usize,
    ) -> [[f32; C]; R] {
        let nb = w.blocks_per_row();
        let k = w.k;
        let bias = _mm512_set1_epi8(-128);
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        for b in (0..nb - nb % 2).step_by(2) {
            let mut wv = [_mm512_setzero_si512(); C];
            let mut dw = [_mm512_setzero_ps(); C];
            for j in 0..C {
                let at = (c + j) * nb + b;
                let q = w.qs.as_ptr().wrapping_add((c + j) * k + b * QK);
                // SAFETY: blocks b and b+1 of column c+j exist. `w + 128` as unsigned bytes.
                wv[j] = unsafe { _mm512_xor_si512(_mm512_loadu_si512(q as *const _), bias) };
                dw[j] = unsafe { pair_f16(w.d.as_ptr().add(at)) };
                // Each block pair is a cache line.
                prefetch(q.wrapping_add(PREFETCH) as *const u8);
            }
            for i in 0..R {
                let at = (r + i) * nb + b;
                // SAFETY: blocks b and b+1 of row r+i exist.
                let x = unsafe {
                    _mm512_loadu_si512(a.q.as_ptr().add((r + i) * k + b * QK) as *const _)
                };
                let dx = unsafe { pair(a.d[at], a.d[at + 1]) };
                // Σ(w + 128)·x − 128·Σx = Σ w·x, with the correction as the starting value.
                let start = _mm512_sub_epi32(
                    _mm512_setzero_si512(),
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, x),
                );
                for j in 0..C {
                    let isum = _mm512_dpbusd_epi32(start, wv[j], x);
                    let scale = _mm512_mul_ps(dw[j], dx);
                    acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[i][j]);
                }
            }
        }
        let mut out = [[0f32; C]; R];
        for i in 0..R {
            for j in 0..C {
                let tail = (nb % 2 == 1).then(|| {
                    let b = nb - 1;
                    let bias = _mm256_set1_epi8(-128);
                    // SAFETY: block b of column c+j and row r+i exist.
                    let wv = unsafe {
                        _mm256_xor_si256(
                            _mm256_loadu_si256(
                                w.qs.as_ptr().add((c + j) * k + b * QK) as *const __m256i
                            ),
                            bias,
                        )
                    };
                    let x = unsafe {
                        _mm256_loadu_si256(a.q.as_ptr().add((r + i) * k + b * QK) as *const __m256i)
                    };
                    let start = _mm256_sub_epi32(
                        _mm256_setzero_si256(),
                        _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, x),
                    );
                    let isum = _mm256_dpbusd_epi32(start, wv, x);
                    // SAFETY: F16C is enabled here.
                    let dw = unsafe { f16c::one(w.d[(c + j) * nb + b]) };
                    let scale = _mm256_set1_ps(dw * a.d[(r + i) * nb + b]);
                    _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(isum),
                        scale,
                        _mm512_castps512_ps256(acc[i][j]),
                    )
                });
                out[i][j] = unsafe { finish(acc[i][j], tail) };
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testdata::{q4_1_raw, q8_0_raw, Rng};

    fn acts(rows: usize, k: usize, rng: &mut Rng, extreme: bool) -> QuantActs {
        let x: Vec<f32> = (0..rows * k)
            .map(|i| {
                if extreme {
                    [1e30, -1e30, 0.0, 1e-30][i % 4]
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

    /// Every path equals the scalar reference bit for bit, on random and extreme inputs, for
    /// sizes with odd block counts and tiles that do not divide the shape.
    #[test]
    fn every_path_equals_the_reference() {
        eprintln!("quantized paths on this CPU: {:?}", QPath::available());
        let mut rng = Rng(11);
        for &(rows, k, n) in &[
            (1, 32, 1),
            (3, 64, 5),
            (5, 96, 7),
            (7, 576, 13),
            (9, 1536, 6),
            (2, 544, 9),
            (33, 512, 3),
            (1, 1056, 70),
        ] {
            for extreme in [false, true] {
                let a = acts(rows, k, &mut rng, extreme);
                let w4 = Q4_1Matrix::from_q4_1(&q4_1_raw(n, k, &mut rng), n, k).unwrap();
                let w8 = Q8_0Matrix::from_q8_0(&q8_0_raw(n, k, &mut rng, extreme), n, k).unwrap();
                for w in [QWeights::Q4_1(&w4), QWeights::Q8_0(&w8)] {
                    let mut want = vec![0.0; rows * n];
                    qmatmul(&pool(1), QPath::Scalar, &a, w, &mut want);
                    for path in QPath::available() {
                        for threads in [1, 2] {
                            let mut got = vec![0.0; rows * n];
                            qmatmul(&pool(threads), path, &a, w, &mut got);
                            let same = want
                                .iter()
                                .zip(&got)
                                .all(|(x, y)| x.to_bits() == y.to_bits());
                            assert!(
                                same,
                                "{path:?} {rows}×{k}×{n} extreme={extreme}: {want:?} vs {got:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The reference is the product of the dequantized operands, up to f32 rounding.
    #[test]
    fn the_reference_is_the_dequantized_product() {
        let mut rng = Rng(5);
        let (rows, k, n) = (3, 576, 4);
        let a = acts(rows, k, &mut rng, false);
        let w4 = Q4_1Matrix::from_q4_1(&q4_1_raw(n, k, &mut rng), n, k).unwrap();
        let w8 = Q8_0Matrix::from_q8_0(&q8_0_raw(n, k, &mut rng, false), n, k).unwrap();
        let mut wrow = vec![0.0; k];
        for r in 0..rows {
            let x: Vec<f64> = (0..k)
                .map(|i| f64::from(a.d[r * (k / QK) + i / QK]) * f64::from(a.q[r * k + i]))
                .collect();
            for c in 0..n {
                w4.dequantize_row(c, &mut wrow);
                let exact: f64 = x.iter().zip(&wrow).map(|(x, w)| x * f64::from(*w)).sum();
                assert!(
                    (f64::from(reference::q4_1(&a, r, &w4, c)) - exact).abs()
                        < 1e-3 * (1.0 + exact.abs())
                );
                w8.dequantize_row(c, &mut wrow);
                let exact: f64 = x.iter().zip(&wrow).map(|(x, w)| x * f64::from(*w)).sum();
                assert!(
                    (f64::from(reference::q8_0(&a, r, &w8, c)) - exact).abs()
                        < 1e-4 * (1.0 + exact.abs())
                );
            }
        }
    }
}
