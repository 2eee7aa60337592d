//! Values of one draw on the host: element `i` of the draw at `offset` under `seed`, for
//! each of Burn's distributions. The device kernel (`rng::cube`) computes the same
//! function in the same f32 arithmetic, so uniform and Bernoulli draws agree with it to
//! the bit (up to a fused multiply-add) and normal ones to the GPU's `ln`/`cos` rounding.

use burn::tensor::Distribution;

use super::philox::{block, standard_normal, unit};

/// Element `index` of a draw of `distribution` at `offset` under `seed`.
pub fn element(seed: u64, offset: u64, distribution: Distribution, index: u64) -> f32 {
    let words = block(seed, offset, index);
    let word = words[(index % 4) as usize];
    match distribution {
        Distribution::Default => unit(word),
        Distribution::Uniform(low, high) => {
            let (low, span) = uniform_params(low, high);
            low + span * unit(word)
        }
        Distribution::Bernoulli(p) => f32::from(u8::from(unit(word) < p as f32)),
        Distribution::Normal(mean, std) => mean as f32 + std as f32 * standard_normal(words, index),
    }
}

/// A uniform draw's low end and width in f32, as the kernel takes them.
pub fn uniform_params(low: f64, high: f64) -> (f32, f32) {
    (low as f32, (high - low) as f32)
}

/// The first `len` elements of a draw.
pub fn values(seed: u64, offset: u64, distribution: Distribution, len: usize) -> Vec<f32> {
    (0..len as u64)
        .map(|index| element(seed, offset, distribution, index))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: usize = 100_000;

    fn moments(values: &[f32]) -> (f64, f64) {
        let n = values.len() as f64;
        let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = values
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n;
        (mean, var)
    }

    /// Kolmogorov–Smirnov statistic of `values` against the distribution function `cdf`.
    fn ks(values: &[f32], cdf: impl Fn(f64) -> f64) -> f64 {
        let mut sorted: Vec<f64> = values.iter().map(|&v| f64::from(v)).collect();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len() as f64;
        sorted
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let f = cdf(x);
                (f - i as f64 / n).abs().max(((i + 1) as f64 / n - f).abs())
            })
            .fold(0.0, f64::max)
    }

    /// The KS critical value at the 0.1 % level: 1.95 / sqrt(n).
    fn critical(n: usize) -> f64 {
        1.95 / (n as f64).sqrt()
    }

    /// The standard normal distribution function (Abramowitz–Stegun 7.1.26 for erf).
    fn normal_cdf(x: f64) -> f64 {
        let z = x.abs() / std::f64::consts::SQRT_2;
        let t = 1.0 / (1.0 + 0.327_591_1 * z);
        let poly = t
            * (0.254_829_592
                + t * (-0.284_496_736
                    + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
        let erf = 1.0 - poly * (-z * z).exp();
        0.5 * (1.0 + erf.copysign(x))
    }

    #[test]
    fn uniform_draws_are_uniform() {
        for seed in [0, 42, u64::MAX] {
            let v = values(seed, 7, Distribution::Uniform(-2.0, 3.0), N);
            let (mean, var) = moments(&v);
            assert!((mean - 0.5).abs() < 0.03, "seed {seed}: mean {mean}");
            assert!(
                (var - 25.0 / 12.0).abs() < 0.05,
                "seed {seed}: variance {var}"
            );
            let d = ks(&v, |x| ((x + 2.0) / 5.0).clamp(0.0, 1.0));
            assert!(d < critical(N), "seed {seed}: KS {d}");
        }
    }

    #[test]
    fn normal_draws_are_normal() {
        for seed in [0, 42, u64::MAX] {
            let v = values(seed, 3, Distribution::Normal(1.5, 2.0), N);
            let (mean, var) = moments(&v);
            assert!((mean - 1.5).abs() < 0.03, "seed {seed}: mean {mean}");
            assert!((var - 4.0).abs() < 0.08, "seed {seed}: variance {var}");
            let d = ks(&v, |x| normal_cdf((x - 1.5) / 2.0));
            assert!(d < critical(N), "seed {seed}: KS {d}");
        }
    }

    #[test]
    fn bernoulli_draws_keep_their_rate() {
        for (seed, p) in [(0, 0.3), (42, 0.7), (u64::MAX, 0.5)] {
            let v = values(seed, 11, Distribution::Bernoulli(p), N);
            assert!(v.iter().all(|&x| x == 0.0 || x == 1.0));
            let (mean, var) = moments(&v);
            assert!((mean - p).abs() < 0.01, "p {p}: rate {mean}");
            assert!((var - p * (1.0 - p)).abs() < 0.01, "p {p}: variance {var}");
        }
    }

    #[test]
    fn a_draw_is_its_seed_and_offset_and_nothing_else() {
        let d = Distribution::Default;
        assert_eq!(values(5, 9, d, 1000), values(5, 9, d, 1000));
        assert_ne!(values(5, 9, d, 1000), values(5, 10, d, 1000));
        assert_ne!(values(5, 9, d, 1000), values(6, 9, d, 1000));
        // A longer draw starts with the shorter one.
        assert_eq!(values(5, 9, d, 1000)[..10], values(5, 9, d, 10)[..]);
        // Consecutive offsets are not shifted copies of each other.
        let (a, b) = (values(5, 9, d, 64), values(5, 10, d, 64));
        assert!((1..60).all(|shift| a[shift..] != b[..64 - shift]));
    }
}
