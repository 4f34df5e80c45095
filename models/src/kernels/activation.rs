//! The SiLU-gated linear unit of the Llama MLP.

use super::exp::exp;

/// For each row of `gate_up` (`[gate | up]`, each `ff` wide): `out = silu(gate) * up`.
pub fn silu_mul(gate_up: &[f32], ff: usize, out: &mut [f32]) {
    assert_eq!(gate_up.len(), out.len() * 2, "silu_mul: shapes differ");
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA were detected just now.
        return unsafe { silu_mul_avx2(gate_up, ff, out) };
    }
    silu_mul_body(gate_up, ff, out)
}

/// The same code compiled with AVX2 + FMA, so the exponential's multiply-adds are instructions
/// and the loop vectorises; the values equal the baseline build's.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_avx2(gate_up: &[f32], ff: usize, out: &mut [f32]) {
    silu_mul_body(gate_up, ff, out)
}

#[inline(always)]
fn silu_mul_body(gate_up: &[f32], ff: usize, out: &mut [f32]) {
    for (gu, o) in gate_up.chunks_exact(2 * ff).zip(out.chunks_exact_mut(ff)) {
        let (gate, up) = gu.split_at(ff);
        for ((o, g), u) in o.iter_mut().zip(gate).zip(up) {
            *o = g / (1.0 + exp(-g)) * u;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_of_zero_is_zero_and_large_gates_pass_up_through() {
        let mut out = [0.0; 2];
        silu_mul(&[0.0, 40.0, 3.0, 0.5], 2, &mut out);
        assert_eq!(out[0], 0.0);
        assert!((out[1] - 20.0).abs() < 1e-4);
    }

    #[test]
    fn every_build_gives_the_same_bits_and_the_exact_value() {
        let ff = 37;
        let gate_up: Vec<f32> = (0..4 * ff)
            .map(|i| (i as f32 * 0.731).sin() * 12.0)
            .collect();
        let mut fast = vec![0.0; 2 * ff];
        silu_mul(&gate_up, ff, &mut fast);
        let mut plain = vec![0.0; 2 * ff];
        silu_mul_body(&gate_up, ff, &mut plain);
        for (i, (a, b)) in fast.iter().zip(&plain).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "element {i}");
            let (row, col) = (i / ff, i % ff);
            let g = f64::from(gate_up[row * 2 * ff + col]);
            let u = f64::from(gate_up[row * 2 * ff + ff + col]);
            let exact = g / (1.0 + (-g).exp()) * u;
            assert!((f64::from(*a) - exact).abs() < 1e-5 * (1.0 + exact.abs()));
        }
    }
}
