//! Widening half floats to f32 inside the SIMD kernels (F16C): the weights' f16 block scales
//! and the attention's half-float KV cache.
//!
//! The scales stay f16 in memory ([`super::quant`]), so every kernel that multiplies by them
//! widens them first. `half::f16::to_f32` does the same but checks the CPU's features on every
//! call; these take the instruction straight, in kernels that enable F16C. Widening is exact,
//! so every path still multiplies the values the reference does.

use std::arch::x86_64::*;

use half::f16;

/// One scale.
///
/// # Safety
/// F16C (every caller's target features include it).
#[target_feature(enable = "f16c")]
#[inline]
pub(super) unsafe fn one(x: f16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(x.to_bits()))))
}

/// Eight scales from `p`.
///
/// # Safety
/// F16C and AVX; eight readable values at `p`.
#[target_feature(enable = "avx,f16c")]
#[inline]
pub(super) unsafe fn eight(p: *const f16) -> __m256 {
    // SAFETY: 16 readable bytes at p (the caller's guarantee).
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p as *const __m128i) })
}

/// Two consecutive scales from `p`, as lanes 0 and 1 (lanes 2 and 3 zero).
///
/// # Safety
/// F16C; two readable values at `p`.
#[target_feature(enable = "f16c")]
#[inline]
pub(super) unsafe fn two(p: *const f16) -> __m128 {
    // SAFETY: 4 readable bytes at p (the caller's guarantee).
    let bits = unsafe { std::ptr::read_unaligned(p as *const i32) };
    _mm_cvtph_ps(_mm_cvtsi32_si128(bits))
}

/// `src` widened into the front of a block of `N`, the rest zero.
///
/// # Safety
/// F16C and AVX; `src.len() <= N`.
#[target_feature(enable = "avx,f16c")]
#[inline]
pub(super) unsafe fn widen<const N: usize>(src: &[f16]) -> [f32; N] {
    assert!(src.len() <= N);
    let mut out = [0f32; N];
    let full = src.len() / 8 * 8;
    for at in (0..full).step_by(8) {
        // SAFETY: at + 8 <= src.len() <= N.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(at), eight(src.as_ptr().add(at))) };
    }
    for at in full..src.len() {
        // SAFETY: F16C is enabled here.
        out[at] = unsafe { one(src[at]) };
    }
    out
}
