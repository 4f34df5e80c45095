//! llama.cpp's k-quant weight formats (Q4_K, Q6_K), repacked at load into the per-column arrays
//! the kernels stream.
//!
//! Both formats group 256 weights into a super-block with one f16 scale (and, for Q4_K, one f16
//! minimum) and smaller sub-blocks with their own integer scales. At load every sub-block scale is
//! multiplied out into f32 (`d·sc`, `dmin·m`), exactly as ggml's dequantization computes it, so the
//! kernels never decode the 6-bit scale packing and the dequantized values equal ggml's bit for bit.
//!
//! - **Q4_K** (`{f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}`): eight sub-blocks of 32 with a 6-bit
//!   scale and a 6-bit minimum, `w = d·sc·q − dmin·m` with `q ∈ 0..16`. The nibbles keep ggml's
//!   order (two sub-blocks per 32 bytes), one f32 scale and one f32 minimum per sub-block.
//! - **Q6_K** (`{u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}`): sixteen sub-blocks of 16 with an
//!   i8 scale, `w = d·sc·(q − 32)` with `q ∈ 0..64` split into a low nibble and two high bits.
//!   Stored as one byte per weight (`q`, unsigned) and one f32 scale per sub-block; the product is
//!   in [`super::kqmatmul`], as is Q4_K's.

use half::f16;

use super::quant::QK;
use crate::error::{ModelError, Result};

/// Elements per k-quant super-block.
pub const QK_K: usize = 256;
/// Bytes of one ggml `block_q4_K`.
const Q4K_BYTES: usize = 144;
/// Bytes of one ggml `block_q6_K`.
const Q6K_BYTES: usize = 210;
/// Elements per Q6_K sub-block (one i8 scale each).
pub const Q6K_SUB: usize = 16;

fn f16_at(raw: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([raw[at], raw[at + 1]]).to_f32()
}

/// Checks that `raw` holds an `n × k` matrix of `block_bytes`-byte super-blocks.
fn check_len(raw: &[u8], n: usize, k: usize, block_bytes: usize, what: &str) -> Result<()> {
    if !k.is_multiple_of(QK_K) {
        return Err(ModelError::Unsupported(format!(
            "{what}: row length {k} is not a multiple of {QK_K} (the k-quant super-block)"
        )));
    }
    let expected = n * (k / QK_K) * block_bytes;
    if raw.len() != expected {
        return Err(ModelError::Unsupported(format!(
            "{what}: {} bytes for {n} × {k}, expected {expected}",
            raw.len()
        )));
    }
    Ok(())
}

/// The 6-bit scale and minimum of Q4_K sub-block `j < 8` from the 12 packed bytes: sub-blocks
/// 0–3 keep theirs in the low six bits of bytes `j` and `j + 4`; sub-blocks 4–7 take four bits
/// from byte `j + 4` (low nibble scale, high nibble minimum) and their top two bits from the
/// spare high bits of bytes `j − 4` (scale) and `j` (minimum).
fn q4k_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 0x3F, s[j + 4] & 0x3F)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q4_K weights: `w = d[b]·q − m[b]` for sub-block `b` of 32, `q ∈ 0..16`.
#[derive(Debug, Clone)]
pub struct Q4KMatrix {
    pub n: usize,
    pub k: usize,
    /// `n × k/2` bytes in ggml's order: 32 bytes per pair of sub-blocks `2g, 2g+1`, element `e`
    /// of sub-block `2g` in the low nibble of byte `e` and of `2g+1` in the high nibble, so one
    /// 32-byte load, a mask and a shift give 64 weights in element order.
    pub qs: Vec<u8>,
    /// `n × k/32` f32 scales `d·sc`.
    pub d: Vec<f32>,
    /// `n × k/32` f32 minimums `dmin·m` (subtracted).
    pub m: Vec<f32>,
}

impl Q4KMatrix {
    /// Repacks ggml `block_q4_K` data of an `n × k` matrix (`k` a multiple of 256).
    pub fn from_q4_k(raw: &[u8], n: usize, k: usize) -> Result<Self> {
        check_len(raw, n, k, Q4K_BYTES, "Q4_K")?;
        let subs = n * k / QK;
        let mut out = Self {
            n,
            k,
            qs: Vec::with_capacity(n * k / 2),
            d: Vec::with_capacity(subs),
            m: Vec::with_capacity(subs),
        };
        for sb in raw.chunks_exact(Q4K_BYTES) {
            let (d, dmin) = (f16_at(sb, 0), f16_at(sb, 2));
            for j in 0..QK_K / QK {
                let (sc, mn) = q4k_scale_min(j, &sb[4..16]);
                out.d.push(d * f32::from(sc));
                out.m.push(dmin * f32::from(mn));
            }
            out.qs.extend_from_slice(&sb[16..Q4K_BYTES]);
        }
        Ok(out)
    }

    /// Sub-blocks (of 32) per row.
    pub fn blocks_per_row(&self) -> usize {
        self.k / QK
    }

    /// Quant `e < 32` of sub-block `b` of row `c`.
    #[inline(always)]
    pub fn quant(&self, c: usize, b: usize, e: usize) -> u8 {
        let byte = self.qs[c * self.k / 2 + (b / 2) * QK + e];
        if b.is_multiple_of(2) {
            byte & 0x0F
        } else {
            byte >> 4
        }
    }

    /// Row `c` dequantized; equal bit for bit to ggml's `dequantize_row_q4_K`.
    pub fn dequantize_row(&self, c: usize, out: &mut [f32]) {
        let nb = self.blocks_per_row();
        for b in 0..nb {
            let (d, m) = (self.d[c * nb + b], self.m[c * nb + b]);
            for e in 0..QK {
                out[b * QK + e] = d * f32::from(self.quant(c, b, e)) - m;
            }
        }
    }

    /// Bytes the kernel streams per use of the whole matrix.
    pub fn bytes(&self) -> usize {
        self.qs.len() + 4 * (self.d.len() + self.m.len())
    }

    /// Stacks matrices with the same row length (fused projections).
    pub fn stack(parts: &[Q4KMatrix]) -> Self {
        let k = parts[0].k;
        let mut out = Self {
            n: 0,
            k,
            qs: Vec::new(),
            d: Vec::new(),
            m: Vec::new(),
        };
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

/// Q6_K weights: `w = scale[s]·(q − 32)` for sub-block `s` of 16.
#[derive(Debug, Clone)]
pub struct Q6KMatrix {
    pub n: usize,
    pub k: usize,
    /// `n × k` quants in `0..64`, row-major, in element order.
    pub q: Vec<u8>,
    /// `n × k/16` f32 scales `d·sc`.
    pub scale: Vec<f32>,
}

impl Q6KMatrix {
    /// Repacks ggml `block_q6_K` data of an `n × k` matrix (`k` a multiple of 256).
    pub fn from_q6_k(raw: &[u8], n: usize, k: usize) -> Result<Self> {
        check_len(raw, n, k, Q6K_BYTES, "Q6_K")?;
        let mut q = Vec::with_capacity(n * k);
        let mut scale = Vec::with_capacity(n * k / Q6K_SUB);
        for sb in raw.chunks_exact(Q6K_BYTES) {
            let (ql, qh, sc) = (&sb[..128], &sb[128..192], &sb[192..208]);
            let d = f16_at(sb, 208);
            scale.extend(sc.iter().map(|s| d * f32::from(*s as i8)));
            // Each half of 128 elements uses 64 bytes of `ql` and 32 of `qh`. Element
            // `32·t + l` (quarter t, l < 32) takes the low (t even) or high (t odd) nibble of
            // `ql[l + 32·(t mod 2)]` and bits 2t, 2t+1 of `qh[l]` as its top two bits.
            for h in 0..2 {
                let (ql, qh) = (&ql[64 * h..64 * h + 64], &qh[32 * h..32 * h + 32]);
                for t in 0..4 {
                    q.extend((0..32).map(|l| {
                        let lo = (ql[l + 32 * (t % 2)] >> (4 * (t / 2))) & 0x0F;
                        let hi = (qh[l] >> (2 * t)) & 0x03;
                        lo | (hi << 4)
                    }));
                }
            }
        }
        Ok(Self { n, k, q, scale })
    }

    /// Sub-blocks (scales) per row.
    pub fn subs_per_row(&self) -> usize {
        self.k / Q6K_SUB
    }

    /// Row `c` dequantized; equal bit for bit to ggml's `dequantize_row_q6_K`.
    pub fn dequantize_row(&self, c: usize, out: &mut [f32]) {
        let q = &self.q[c * self.k..(c + 1) * self.k];
        let scale = &self.scale[c * self.subs_per_row()..(c + 1) * self.subs_per_row()];
        for (i, o) in out[..self.k].iter_mut().enumerate() {
            *o = scale[i / Q6K_SUB] * f32::from(q[i] as i8 - 32);
        }
    }

    /// Bytes the kernel streams per use of the whole matrix.
    pub fn bytes(&self) -> usize {
        self.q.len() + 4 * self.scale.len()
    }

    /// Stacks matrices with the same row length (fused projections).
    pub fn stack(parts: &[Q6KMatrix]) -> Self {
        let k = parts[0].k;
        let mut out = Self {
            n: 0,
            k,
            q: Vec::new(),
            scale: Vec::new(),
        };
        for p in parts {
            assert_eq!(p.k, k, "stacked matrices differ in row length");
            out.n += p.n;
            out.q.extend_from_slice(&p.q);
            out.scale.extend_from_slice(&p.scale);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType};
    use candle_core::Device;

    use super::*;
    use crate::kernels::testdata::*;

    /// candle-core's own k-quant dequantization, an implementation independent of this one.
    fn candle_rows(dtype: GgmlDType, raw: &[u8], n: usize, k: usize) -> Vec<f32> {
        qtensor_from_ggml(dtype, raw, vec![n, k], &Device::Cpu)
            .and_then(|q| q.dequantize(&Device::Cpu))
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .expect("candle dequantizes the blocks")
    }

    fn assert_bits_eq(ours: &[f32], theirs: &[f32], what: &str) {
        assert_eq!(ours.len(), theirs.len());
        for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{what}: element {i}: {a} vs {b}");
        }
    }

    #[test]
    fn q4_k_dequantizes_like_candle() {
        let mut rng = Rng(1);
        for (n, k) in [(1, 256), (3, 512), (5, 1536), (2, 2304)] {
            let raw = q4_k_raw(n, k, &mut rng);
            let m = Q4KMatrix::from_q4_k(&raw, n, k).unwrap();
            let mut ours = vec![0.0; n * k];
            for (c, row) in ours.chunks_exact_mut(k).enumerate() {
                m.dequantize_row(c, row);
            }
            assert_bits_eq(&ours, &candle_rows(GgmlDType::Q4K, &raw, n, k), "Q4_K");
        }
    }

    #[test]
    fn q6_k_dequantizes_like_candle() {
        let mut rng = Rng(2);
        for (n, k) in [(1, 256), (3, 512), (5, 1536), (2, 2304)] {
            for extreme in [false, true] {
                let raw = q6_k_raw(n, k, &mut rng, extreme);
                let m = Q6KMatrix::from_q6_k(&raw, n, k).unwrap();
                assert!(m.q.iter().all(|q| *q < 64));
                let mut ours = vec![0.0; n * k];
                for (c, row) in ours.chunks_exact_mut(k).enumerate() {
                    m.dequantize_row(c, row);
                }
                assert_bits_eq(&ours, &candle_rows(GgmlDType::Q6K, &raw, n, k), "Q6_K");
            }
        }
    }

    #[test]
    fn rows_not_a_multiple_of_256_are_refused() {
        for k in [32, 576, 320] {
            let q4 = Q4KMatrix::from_q4_k(&vec![0; 144 * 2], 2, k).unwrap_err();
            let q6 = Q6KMatrix::from_q6_k(&vec![0; 210 * 2], 2, k).unwrap_err();
            for (e, what) in [(q4, "Q4_K"), (q6, "Q6_K")] {
                let msg = e.to_string();
                assert!(matches!(e, ModelError::Unsupported(_)), "{msg}");
                assert!(
                    msg.contains(what) && msg.contains(&format!("{k} is not a multiple of 256")),
                    "{msg}"
                );
            }
        }
        // A wrong byte count is refused too.
        assert!(Q6KMatrix::from_q6_k(&[0; 209], 1, 256).is_err());
        assert!(Q4KMatrix::from_q4_k(&[0; 145], 1, 256).is_err());
    }

    #[test]
    fn stacking_concatenates_rows() {
        let mut rng = Rng(3);
        let (a, b) = (
            q6_k_raw(2, 512, &mut rng, false),
            q6_k_raw(3, 512, &mut rng, false),
        );
        let (ma, mb) = (
            Q6KMatrix::from_q6_k(&a, 2, 512).unwrap(),
            Q6KMatrix::from_q6_k(&b, 3, 512).unwrap(),
        );
        let both = [a, b].concat();
        let s = Q6KMatrix::stack(&[ma, mb]);
        let whole = Q6KMatrix::from_q6_k(&both, 5, 512).unwrap();
        assert_eq!(
            (s.n, s.q.clone(), s.scale.clone()),
            (5, whole.q, whole.scale)
        );

        let (a, b) = (q4_k_raw(1, 256, &mut rng), q4_k_raw(2, 256, &mut rng));
        let s = Q4KMatrix::stack(&[
            Q4KMatrix::from_q4_k(&a, 1, 256).unwrap(),
            Q4KMatrix::from_q4_k(&b, 2, 256).unwrap(),
        ]);
        let whole = Q4KMatrix::from_q4_k(&[a, b].concat(), 3, 256).unwrap();
        assert_eq!((s.n, s.qs, s.d, s.m), (3, whole.qs, whole.d, whole.m));
    }
}
