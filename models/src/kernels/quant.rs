//! Quantized weight formats as the kernels read them, and activations rounded to 8 bits.
//!
//! Weights stay in their GGUF block formats but are repacked at load into separate arrays per
//! output column (quants contiguous, scales beside them), so a kernel streams one column's
//! quants without parsing 20- or 34-byte structs. Scales stay f16, as GGUF stores them: a
//! single-stream decode step reads every weight once from memory, and f32 scales made Q4_1 a
//! fifth larger (24 bytes per block instead of 20); the kernels widen them as they read
//! (`kernels::f16c`), which gives the same f32 values the reference multiplies. Activations
//! are rounded per block of 32 to i8 with one f32 scale, as llama.cpp does (`Q8_1`: the scale
//! times the sum of quants is kept too, for the offset term of Q4_1).

use half::f16;

use crate::error::{ModelError, Result};

/// Elements per quantization block (all formats used here).
pub const QK: usize = 32;

/// Q4_1 weights: `w = d·q + m` with `q ∈ 0..16`, per block of 32. Q4_0 (`w = d·(q − 8)`) is
/// stored in this form too, with `m = −8d`.
#[derive(Debug, Clone)]
pub struct Q4_1Matrix {
    pub n: usize,
    pub k: usize,
    /// `n × nb × 16` bytes: element `e < 16` of a block is the low nibble of byte `e`, element
    /// `e ≥ 16` the high nibble of byte `e − 16` (ggml's layout).
    pub qs: Vec<u8>,
    /// `n × nb` block scales.
    pub d: Vec<f16>,
    /// `n × nb` block minimums.
    pub m: Vec<f16>,
}

/// Q8_0 weights: `w = d·q` with `q ∈ −127..=127`, per block of 32.
#[derive(Debug, Clone)]
pub struct Q8_0Matrix {
    pub n: usize,
    pub k: usize,
    /// `n × k` quants, row-major.
    pub qs: Vec<i8>,
    /// `n × nb` block scales.
    pub d: Vec<f16>,
}

fn check_len(raw: &[u8], n: usize, k: usize, block_bytes: usize, what: &str) -> Result<usize> {
    if !k.is_multiple_of(QK) {
        return Err(ModelError::Unsupported(format!(
            "{what}: row length {k} is not a multiple of {QK}"
        )));
    }
    let nb = k / QK;
    if raw.len() != n * nb * block_bytes {
        return Err(ModelError::Unsupported(format!(
            "{what}: {} bytes for {n} × {k}, expected {}",
            raw.len(),
            n * nb * block_bytes
        )));
    }
    Ok(nb)
}

fn f16_at(raw: &[u8], at: usize) -> f16 {
    f16::from_le_bytes([raw[at], raw[at + 1]])
}

impl Q4_1Matrix {
    /// Repacks ggml `block_q4_1` data (`{f16 d; f16 m; u8 qs[16]}` per block) of an `n × k` matrix.
    pub fn from_q4_1(raw: &[u8], n: usize, k: usize) -> Result<Self> {
        let nb = check_len(raw, n, k, 20, "Q4_1")?;
        let mut out = Self::with_capacity(n, k, nb);
        for block in raw.chunks_exact(20) {
            out.d.push(f16_at(block, 0));
            out.m.push(f16_at(block, 2));
            out.qs.extend_from_slice(&block[4..20]);
        }
        Ok(out)
    }

    /// Repacks ggml `block_q4_0` data (`{f16 d; u8 qs[16]}`, `w = d·(q − 8)`). The minimum
    /// `−8d` is exact in f16 (a power of two times an f16) unless it overflows, which only a
    /// scale beyond 8188 would do: such a file is refused rather than read wrong.
    pub fn from_q4_0(raw: &[u8], n: usize, k: usize) -> Result<Self> {
        let nb = check_len(raw, n, k, 18, "Q4_0")?;
        let mut out = Self::with_capacity(n, k, nb);
        for block in raw.chunks_exact(18) {
            let d = f16_at(block, 0);
            let m = f16::from_f32(-8.0 * d.to_f32());
            if d.is_finite() && !m.is_finite() {
                return Err(ModelError::Unsupported(format!(
                    "Q4_0: block scale {d} is too large to store its offset −8·d in f16"
                )));
            }
            out.d.push(d);
            out.m.push(m);
            out.qs.extend_from_slice(&block[2..18]);
        }
        Ok(out)
    }

    fn with_capacity(n: usize, k: usize, nb: usize) -> Self {
        Self {
            n,
            k,
            qs: Vec::with_capacity(n * nb * 16),
            d: Vec::with_capacity(n * nb),
            m: Vec::with_capacity(n * nb),
        }
    }

    pub fn blocks_per_row(&self) -> usize {
        self.k / QK
    }

    /// Row `c` dequantized (embedding look-ups, tests).
    pub fn dequantize_row(&self, c: usize, out: &mut [f32]) {
        let nb = self.blocks_per_row();
        for b in 0..nb {
            let (d, m) = (self.d[c * nb + b].to_f32(), self.m[c * nb + b].to_f32());
            let qs = &self.qs[(c * nb + b) * 16..(c * nb + b + 1) * 16];
            for e in 0..16 {
                out[b * QK + e] = d * f32::from(qs[e] & 0x0F) + m;
                out[b * QK + e + 16] = d * f32::from(qs[e] >> 4) + m;
            }
        }
    }

    /// Bytes the kernels stream per use of the whole matrix.
    pub fn bytes(&self) -> usize {
        self.qs.len() + 2 * (self.d.len() + self.m.len())
    }

    /// Stacks matrices with the same row length (fused projections).
    pub fn stack(parts: &[Q4_1Matrix]) -> Self {
        let k = parts[0].k;
        let mut out = Self::with_capacity(0, k, 0);
        for p in parts {
            assert_eq!(p.k, k, "stacked matrices differ in row length");
            out.n += p.n;
            out.qs.extend_from_slice(&p.qs);
            out.d.extend_from_slice(&p.d);
            out.m.extend_from_slice(&p.m);
        }
        out
    }
}

impl Q8_0Matrix {
    /// Repacks ggml `block_q8_0` data (`{f16 d; i8 qs[32]}` per block).
    pub fn from_q8_0(raw: &[u8], n: usize, k: usize) -> Result<Self> {
        let nb = check_len(raw, n, k, 34, "Q8_0")?;
        let mut qs = Vec::with_capacity(n * k);
        let mut d = Vec::with_capacity(n * nb);
        for block in raw.chunks_exact(34) {
            d.push(f16_at(block, 0));
            qs.extend(block[2..34].iter().map(|b| *b as i8));
        }
        Ok(Self { n, k, qs, d })
    }

    pub fn blocks_per_row(&self) -> usize {
        self.k / QK
    }

    pub fn dequantize_row(&self, c: usize, out: &mut [f32]) {
        let nb = self.blocks_per_row();
        for (i, o) in out[..self.k].iter_mut().enumerate() {
            *o = self.d[c * nb + i / QK].to_f32() * f32::from(self.qs[c * self.k + i]);
        }
    }

    pub fn bytes(&self) -> usize {
        self.qs.len() + 2 * self.d.len()
    }

    pub fn stack(parts: &[Q8_0Matrix]) -> Self {
        let k = parts[0].k;
        let mut out = Self {
            n: 0,
            k,
            qs: Vec::new(),
            d: Vec::new(),
        };
        for p in parts {
            assert_eq!(p.k, k, "stacked matrices differ in row length");
            out.n += p.n;
            out.qs.extend_from_slice(&p.qs);
            out.d.extend_from_slice(&p.d);
        }
        out
    }
}

/// A batch of activation rows rounded per block of 32 to i8.
#[derive(Debug, Clone, Default)]
pub struct QuantActs {
    pub rows: usize,
    pub k: usize,
    /// `rows × k` quants.
    pub q: Vec<i8>,
    /// `rows × nb` scales.
    pub d: Vec<f32>,
    /// `rows × nb`: `d · Σq` of each block.
    pub s: Vec<f32>,
}

impl QuantActs {
    /// Rounds `rows × k` activations (`k` a multiple of 32). Each row is rounded on its own, so
    /// a row's quants never depend on the rest of the batch.
    pub fn quantize(x: &[f32], rows: usize, k: usize, out: &mut QuantActs) {
        assert_eq!(x.len(), rows * k, "activations are not rows × k");
        assert_eq!(k % QK, 0, "k must be a multiple of {QK}");
        let nb = k / QK;
        out.rows = rows;
        out.k = k;
        out.q.resize(rows * k, 0);
        out.d.resize(rows * nb, 0.0);
        out.s.resize(rows * nb, 0.0);
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present.
            return unsafe { quantize_avx2(x, out) };
        }
        quantize_blocks(x, out);
    }

    pub fn blocks_per_row(&self) -> usize {
        self.k / QK
    }
}

/// [`quantize_blocks`] in AVX2, a block of 32 in four vectors, with the same values: the
/// maximum is exact in any order, `d` and `1/d` are the same scalar operations, and rounding
/// half away from zero is built from exact steps (`t = trunc(x)`, `x − t` is exact, add ±1
/// where `|x − t| ≥ ½`). NaN products become 0 and infinities clamp to ±127, as the scalar
/// `as i8` casts them. The compiler left the scalar code's float-to-i8 conversions one element
/// at a time: about 4 % of a batch-16 decode step, on one thread while the other waited.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_avx2(x: &[f32], out: &mut QuantActs) {
    use std::arch::x86_64::*;
    let sign = _mm256_set1_ps(-0.0);
    let (half, one) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
    let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let blocks = x.chunks_exact(QK).zip(out.q.chunks_exact_mut(QK));
    for (bi, (xb, qb)) in blocks.enumerate() {
        // SAFETY: 32 floats in xb.
        let v: [__m256; 4] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(xb.as_ptr().add(8 * i)) });
        // max(|v|, acc) keeps acc where |v| is NaN, as f32::max does.
        let mut m = _mm256_setzero_ps();
        for vi in v {
            m = _mm256_max_ps(_mm256_andnot_ps(sign, vi), m);
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let q: [__m256i; 4] = std::array::from_fn(|i| {
            let p = _mm256_mul_ps(v[i], id);
            let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(p);
            let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(p, t));
            let away = _mm256_and_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(frac, half), one);
            let r = _mm256_add_ps(t, _mm256_or_ps(away, _mm256_and_ps(p, sign)));
            // NaN to 0 first: min/max would turn it into a bound.
            let r = _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(r, r));
            _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi))
        });
        let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let s4 = _mm_add_epi32(
            _mm256_castsi256_si128(sum),
            _mm256_extracti128_si256(sum, 1),
        );
        let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        let total = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<0b01>(s2)));
        let bytes = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        // SAFETY: 32 bytes in qb.
        unsafe {
            _mm256_storeu_si256(
                qb.as_mut_ptr() as *mut __m256i,
                _mm256_permutevar8x32_epi32(bytes, order),
            )
        };
        out.d[bi] = d;
        out.s[bi] = d * total as f32;
    }
}

#[inline(always)]
fn quantize_blocks(x: &[f32], out: &mut QuantActs) {
    for (bi, (xb, qb)) in x
        .chunks_exact(QK)
        .zip(out.q.chunks_exact_mut(QK))
        .enumerate()
    {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, v) in qb.iter_mut().zip(xb) {
            // NaN rounds to 0 here; the clamp keeps ±inf-scaled values in range.
            let r = (v * id).round().clamp(-127.0, 127.0) as i8;
            *q = r;
            sum += i32::from(r);
        }
        out.d[bi] = d;
        out.s[bi] = d * sum as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations_round_per_block_and_rows_are_independent() {
        let x: Vec<f32> = (0..128).map(|i| (i as f32 - 50.0) / 7.0).collect();
        let mut both = QuantActs::default();
        QuantActs::quantize(&x, 2, 64, &mut both);
        let mut second = QuantActs::default();
        QuantActs::quantize(&x[64..], 1, 64, &mut second);
        assert_eq!(&both.q[64..], &second.q[..]);
        assert_eq!(&both.d[2..], &second.d[..]);
        for (i, v) in x.iter().enumerate() {
            let back = both.d[i / 32] * f32::from(both.q[i]);
            assert!((back - v).abs() <= both.d[i / 32] * 0.5 + 1e-6);
        }
        let zeros = vec![0.0; 32];
        QuantActs::quantize(&zeros, 1, 32, &mut second);
        assert!(second.q.iter().all(|q| *q == 0) && second.d[0] == 0.0);
    }

    /// The AVX2 rounding equals the scalar code on random rows and on the edges: exact
    /// halves (both signs), NaN, infinities, zeros and subnormals.
    #[test]
    fn every_quantize_path_equals_the_scalar_code() {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            let mut rng = crate::kernels::testdata::Rng(3);
            let mut rows: Vec<Vec<f32>> = (0..64)
                .map(|_| (0..96).map(|_| rng.f() * 10.0).collect())
                .collect();
            // A block whose maximum is 127, so that x·(1/d) lands on (or next to) halves.
            rows.push((0..96).map(|i| (i as f32 - 48.0) * 0.5 + 0.25).collect());
            rows.push((0..96).map(|i| (i % 9) as f32 * 31.75 - 127.0).collect());
            // Without infinities (which zero the whole block) the others reach the rounding.
            rows.push(
                (0..96)
                    .map(|i| [f32::NAN, 0.0, -0.0, 1e-40, -2.5, 2.5, -0.5, 0.5, 1.5][i % 9])
                    .collect(),
            );
            let edges = [
                f32::NAN,
                f32::INFINITY,
                f32::NEG_INFINITY,
                0.0,
                -0.0,
                1e-40,
                -2.5,
                2.5,
                -0.5,
                0.5,
                1.5,
                3.4e38,
            ];
            rows.push((0..96).map(|i| edges[i % edges.len()]).collect());
            rows.push((0..96).map(|i| edges[(i * 5) % edges.len()]).collect());
            for x in &rows {
                let (mut scalar, mut simd) = (QuantActs::default(), QuantActs::default());
                for out in [&mut scalar, &mut simd] {
                    out.rows = 1;
                    out.k = x.len();
                    out.q = vec![0; x.len()];
                    out.d = vec![0.0; x.len() / QK];
                    out.s = vec![0.0; x.len() / QK];
                }
                quantize_blocks(x, &mut scalar);
                // SAFETY: AVX2 was detected.
                unsafe { quantize_avx2(x, &mut simd) };
                assert_eq!(scalar.q, simd.q, "{x:?}");
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&scalar.d), bits(&simd.d), "{x:?}");
                assert_eq!(bits(&scalar.s), bits(&simd.s), "{x:?}");
            }
        }
    }

    #[test]
    fn q4_0_is_stored_as_q4_1_with_an_offset() {
        let mut raw = vec![0u8; 18];
        raw[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        raw[2] = 0x3F; // element 0 = 15, element 16 = 3
        let m = Q4_1Matrix::from_q4_0(&raw, 1, 32).unwrap();
        let mut row = vec![0.0; 32];
        m.dequantize_row(0, &mut row);
        assert_eq!(row[0], 0.5 * (15.0 - 8.0));
        assert_eq!(row[16], 0.5 * (3.0 - 8.0));
        assert_eq!(row[1], -4.0);
        assert!(Q4_1Matrix::from_q4_0(&raw, 1, 64).is_err());
        // A scale whose −8·d overflows f16 is refused, not stored as an infinite offset.
        raw[..2].copy_from_slice(&f16::from_f32(9000.0).to_le_bytes());
        assert!(Q4_1Matrix::from_q4_0(&raw, 1, 32).is_err());
    }
}
