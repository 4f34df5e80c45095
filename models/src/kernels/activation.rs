//! The SiLU-gated linear unit of the Llama MLP.

/// For each row of `gate_up` (`[gate | up]`, each `ff` wide): `out = silu(gate) * up`.
pub fn silu_mul(gate_up: &[f32], ff: usize, out: &mut [f32]) {
    assert_eq!(gate_up.len(), out.len() * 2, "silu_mul: shapes differ");
    for (gu, o) in gate_up.chunks_exact(2 * ff).zip(out.chunks_exact_mut(ff)) {
        let (gate, up) = gu.split_at(ff);
        for ((o, g), u) in o.iter_mut().zip(gate).zip(up) {
            *o = g / (1.0 + (-g).exp()) * u;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn silu_of_zero_is_zero_and_large_gates_pass_up_through() {
        let mut out = [0.0; 2];
        super::silu_mul(&[0.0, 40.0, 3.0, 0.5], 2, &mut out);
        assert_eq!(out[0], 0.0);
        assert!((out[1] - 20.0).abs() < 1e-4);
    }
}
