//! An exponential made of element-wise operations, so loops over it vectorise.
//!
//! libm's `expf` is a call per element: in softmax over long contexts and in the SiLU of every
//! MLP it cost more than the arithmetic around it. This one is a handful of multiply-adds and
//! integer operations that LLVM turns into AVX2 / AVX-512 code inside the kernels' target
//! features, and that give the same bits compiled either way (each step is exact or correctly
//! rounded), so the scalar and SIMD builds of a kernel still agree.

/// `eˣ` to within about 2·10⁻⁷ relative error for `x ∈ [−87, 88]`; inputs outside are clamped
/// to that range (`e⁻⁸⁷ ≈ 1.6·10⁻³⁸`, `e⁸⁸ ≈ 1.7·10³⁸`); NaN stays NaN.
///
/// `x = n·ln 2 + r` with `n` rounded to nearest and `|r| ≤ ln 2 / 2`; `eʳ` is its Taylor
/// polynomial to degree 6 (the next term is below 1.2·10⁻⁷ there), times `2ⁿ` written into the
/// exponent bits.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    use consts::*;
    let x = x.clamp(-87.0, 88.0);
    let t = x.mul_add(LOG2_E, ROUND);
    let n = t - ROUND;
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = POLY[0];
    for c in &POLY[1..] {
        p = p.mul_add(r, *c);
    }
    // n ∈ −126..=127, so n + 127 is a normal exponent.
    let ni = t.to_bits() as i32 - ROUND.to_bits() as i32;
    p * f32::from_bits(((ni + 127) as u32) << 23)
}

/// The constants of [`exp`], shared with vector versions that must give its bits.
pub mod consts {
    pub const LOG2_E: f32 = std::f32::consts::LOG2_E;
    /// ln 2 split so that n·LN2_HI is exact for |n| < 2⁹ (LN2_HI has 15 significant bits).
    pub const LN2_HI: f32 = 0.693_145_75;
    pub const LN2_LO: f32 = 1.428_606_8e-6;
    /// 1.5·2²³: adding it rounds to an integer held in the low mantissa bits.
    pub const ROUND: f32 = 12_582_912.0;
    /// Taylor coefficients of `eʳ`, highest degree first (Horner's order).
    pub const POLY: [f32; 7] = [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_to_the_exact_exponential_over_its_range() {
        assert_eq!(exp(0.0), 1.0);
        let mut worst = 0f64;
        for i in 0..=400_000 {
            let x = (-87.0 + 175.0 * f64::from(i) / 400_000.0) as f32;
            let want = f64::from(x).exp();
            let got = f64::from(exp(x));
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 4e-7, "worst relative error {worst}");
    }

    #[test]
    fn out_of_range_inputs_clamp() {
        assert!(exp(-1e4) < 1e-37 && exp(-1e4) > 0.0);
        assert!(exp(f32::NEG_INFINITY) < 1e-37);
        assert!(exp(1e4) > 1e38 && exp(1e4).is_finite());
        assert!(exp(f32::INFINITY).is_finite());
        assert!(exp(f32::NAN).is_nan());
    }
}
