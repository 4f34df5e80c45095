//! RMS normalisation, one row at a time (so a row's result never depends on its batch).

/// `out = x / sqrt(mean(x²) + eps) * weight` for each row of `x` (`rows × weight.len()`).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    assert_eq!(
        x.len(),
        out.len(),
        "rms_norm: input and output differ in length"
    );
    assert_eq!(x.len() % d, 0, "rms_norm: input is not whole rows");
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        // Accumulate in f64: cheap at this width and removes the order question entirely.
        let ss: f64 = xr.iter().map(|v| f64::from(*v) * f64::from(*v)).sum();
        let scale = (1.0 / (ss / d as f64 + f64::from(eps)).sqrt()) as f32;
        for ((o, v), g) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * scale * g;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_rows_stay_unit_and_rows_are_independent() {
        let w = vec![1.0; 4];
        let x = [1.0, 1.0, 1.0, 1.0, 2.0, 0.0, 0.0, 0.0];
        let mut out = [0.0; 8];
        rms_norm(&x, &w, 0.0, &mut out);
        assert_eq!(&out[..4], &[1.0; 4]);
        assert_eq!(&out[4..], &[2.0, 0.0, 0.0, 0.0]);
        let mut one = [0.0; 4];
        rms_norm(&x[4..], &w, 0.0, &mut one);
        assert_eq!(one, out[4..]);
    }
}
