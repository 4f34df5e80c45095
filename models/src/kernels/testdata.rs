//! Deterministic random ggml blocks: the kernels' tests compare every path on them, and
//! `make bench-kernels` times the kernels on them. Not model data: values are only kept
//! finite and in the ranges real files use.

use half::f16;

/// A small deterministic PRNG (64-bit LCG, high bits out).
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }

    /// Uniform in `[-1, 1)`.
    pub fn f(&mut self) -> f32 {
        self.next_u32() as f32 / (1u64 << 31) as f32 * 2.0 - 1.0
    }

    pub fn bytes(&mut self, n: usize) -> impl Iterator<Item = u8> + '_ {
        (0..n).map(|_| self.next_u32() as u8)
    }
}

/// `n × k` random Q4_K blocks: finite f16 scales, every other byte random.
pub fn q4_k_raw(n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let mut raw = Vec::new();
    for _ in 0..n * k / 256 {
        raw.extend_from_slice(&f16::from_f32(rng.f() * 0.01).to_le_bytes());
        raw.extend_from_slice(&f16::from_f32(rng.f() * 0.02).to_le_bytes());
        let rest: Vec<u8> = rng.bytes(12 + 128).collect();
        raw.extend(rest);
    }
    raw
}

/// `n × k` random Q6_K blocks. `extreme` uses only the largest quants and scales.
pub fn q6_k_raw(n: usize, k: usize, rng: &mut Rng, extreme: bool) -> Vec<u8> {
    let mut raw = Vec::new();
    for _ in 0..n * k / 256 {
        let rest: Vec<u8> = if extreme {
            let mut v: Vec<u8> = (0..192)
                .map(|_| [0x00, 0xFF][rng.next_u32() as usize % 2])
                .collect();
            v.extend((0..16).map(|_| [0x80u8, 0x7F][rng.next_u32() as usize % 2]));
            v
        } else {
            rng.bytes(128 + 64 + 16).collect()
        };
        raw.extend(rest);
        raw.extend_from_slice(&f16::from_f32(rng.f() * 0.001).to_le_bytes());
    }
    raw
}

/// `n × k` random Q4_1 blocks: small finite f16 scale and minimum, random nibbles.
pub fn q4_1_raw(n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let mut raw = Vec::new();
    for _ in 0..n * k / 32 {
        raw.extend_from_slice(&f16::from_f32(rng.f() * 0.1).to_le_bytes());
        raw.extend_from_slice(&f16::from_f32(rng.f() * 0.5).to_le_bytes());
        raw.extend(rng.bytes(16));
    }
    raw
}

/// `n × k` random Q8_0 blocks. `extreme` uses only the quants 127, −127 and 0.
pub fn q8_0_raw(n: usize, k: usize, rng: &mut Rng, extreme: bool) -> Vec<u8> {
    let mut raw = Vec::new();
    for _ in 0..n * k / 32 {
        raw.extend_from_slice(&f16::from_f32(rng.f() * 0.01).to_le_bytes());
        raw.extend((0..32).map(|_| {
            if extreme {
                [127u8, 129, 0][rng.next_u32() as usize % 3]
            } else {
                (rng.next_u32() % 255) as u8 ^ 0x80
            }
        }));
    }
    raw
}
