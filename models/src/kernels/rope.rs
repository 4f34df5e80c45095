//! Rotary position embeddings with a table of cos/sin for every position the model allows.
//!
//! GGUF Llama files store Q and K so that rotation applies to adjacent pairs `(x[2i], x[2i+1])`
//! (llama.cpp's "normal" RoPE). The table covers the model's whole context length, not a fixed
//! 4096 as candle-transformers' quantized Llama does.

/// Precomputed `cos(p·θᵢ)` and `sin(p·θᵢ)` for positions `0..max_positions`.
#[derive(Debug, Clone)]
pub struct RopeTable {
    half: usize,
    max_positions: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    pub fn new(head_dim: usize, base: f32, max_positions: usize) -> Self {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for i in 0..half {
                // θᵢ = base^(-2i/d), in f64 so long positions keep their precision.
                let theta = f64::from(base).powf(-2.0 * i as f64 / head_dim as f64);
                let angle = p as f64 * theta;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        Self {
            half,
            max_positions,
            cos,
            sin,
        }
    }

    /// The tables, `[max_positions][head_dim / 2]` each: `(cos, sin)`.
    pub fn tables(&self) -> (&[f32], &[f32]) {
        (&self.cos, &self.sin)
    }

    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// Rotates every head of one token (`heads × head_dim`, contiguous) to position `pos`.
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        assert!(
            pos < self.max_positions,
            "position {pos} beyond the RoPE table"
        );
        let cos = &self.cos[pos * self.half..(pos + 1) * self.half];
        let sin = &self.sin[pos * self.half..(pos + 1) * self.half];
        for head in x.chunks_exact_mut(2 * self.half) {
            for (pair, (c, s)) in head.chunks_exact_mut(2).zip(cos.iter().zip(sin)) {
                let (a, b) = (pair[0], pair[1]);
                pair[0] = a * c - b * s;
                pair[1] = a * s + b * c;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_rotation_keeps_length() {
        let t = RopeTable::new(4, 10_000.0, 8192);
        let mut x = [1.0, 2.0, 3.0, 4.0];
        t.apply(&mut x, 0);
        assert_eq!(x, [1.0, 2.0, 3.0, 4.0]);
        t.apply(&mut x, 8191);
        let norm: f32 = x.iter().map(|v| v * v).sum();
        assert!((norm - 30.0).abs() < 1e-3);
    }

    #[test]
    fn first_pair_rotates_by_the_position() {
        let t = RopeTable::new(2, 10_000.0, 16);
        let mut x = [1.0, 0.0];
        t.apply(&mut x, 3);
        assert!((x[0] - 3f32.cos()).abs() < 1e-6 && (x[1] - 3f32.sin()).abs() < 1e-6);
    }
}
