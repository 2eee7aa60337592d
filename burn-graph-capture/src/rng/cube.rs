//! The generator's kernels on CubeCL: a draw (one thread per Philox block of four
//! values) and the offset's advance. Both read the state `[key_lo, key_hi, offset_lo,
//! offset_hi]` from device memory when they run, so a replayed graph draws from the
//! state as it is at that replay.
//!
//! The arithmetic is `rng::philox`'s and `rng::draw`'s, in the same f32 steps.

use burn::tensor::Distribution;
use burn_backend::{DType, Shape, TensorMetadata};
use burn_cubecl::CubeRuntime;
use burn_cubecl::cubecl;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::draw::uniform_params;

/// Threads per cube of a draw.
const CUBE_THREADS: u32 = 256;
/// The most values one draw makes: its block index and element count stay in `u32`.
pub(crate) const MAX_VALUES: usize = u32::MAX as usize - 3;

/// Which distribution a draw makes (a comptime switch of the kernel).
const UNIFORM: u32 = 0;
const BERNOULLI: u32 = 1;
const NORMAL: u32 = 2;

/// A uniform value in `[0, 1)` from the word's top 24 bits.
#[cube]
fn unit(word: u32) -> f32 {
    f32::cast_from(word >> 8) * f32::new(1.0 / 16_777_216.0)
}

/// A uniform value in `(0, 1]`, for the logarithm.
#[cube]
fn unit_open_low(word: u32) -> f32 {
    f32::cast_from((word >> 8) + 1) * f32::new(1.0 / 16_777_216.0)
}

/// One value of a uniform (`a` low end, `b` width) or Bernoulli (`a` rate) draw.
#[cube]
fn flat(word: u32, a: f32, b: f32, #[comptime] kind: u32) -> f32 {
    if kind == BERNOULLI {
        select(unit(word) < a, f32::new(1.0), f32::new(0.0))
    } else {
        a + b * unit(word)
    }
}

/// One Box–Muller value of the word pair (`radius`, `angle`), its cosine or sine
/// branch, scaled to mean `a` and deviation `b`.
#[cube]
fn normal(radius: u32, angle: u32, a: f32, b: f32, #[comptime] sine: bool) -> f32 {
    let r = f32::sqrt(f32::new(-2.0) * f32::ln(unit_open_low(radius)));
    let theta = f32::new(2.0 * std::f32::consts::PI) * unit(angle);
    let z = if sine {
        r * f32::sin(theta)
    } else {
        r * f32::cos(theta)
    };
    a + b * z
}

/// Writes `value` at `index` of `out` if the draw has that many values.
#[cube]
fn put<F: Float>(out: &mut Tensor<F>, index: u32, len: u32, value: f32) {
    if index < len {
        out[index as usize] = F::cast_from(value);
    }
}

/// Draw `draw` of the step: block `b` (this thread) holds values `4b .. 4b + 4` of the
/// draw at offset `offset + draw`, as `rng::philox::block` defines them.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn fill<F: Float>(
    state: &Tensor<u32>,
    out: &mut Tensor<F>,
    len: u32,
    draw: u32,
    a: f32,
    b: f32,
    #[comptime] kind: u32,
    #[define(F)] _dtype: StorageType,
) {
    let block = u32::cast_from(ABSOLUTE_POS);
    let first = block * 4;
    if first >= len {
        terminate!();
    }
    let offset_lo = state[2] + draw;
    let mut c0 = block;
    let mut c1 = u32::new(0);
    let mut c2 = offset_lo;
    let mut c3 = state[3] + select(offset_lo < draw, u32::new(1), u32::new(0));
    let mut k0 = state[0];
    let mut k1 = state[1];
    let m0 = 0xD251_1F53u32;
    let m1 = 0xCD9E_8D57u32;
    #[unroll]
    for _ in 0..10 {
        let hi0 = u32::mul_hi(m0, c0);
        let lo0 = m0 * c0;
        let hi1 = u32::mul_hi(m1, c2);
        let lo1 = m1 * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E37_79B9u32;
        k1 += 0xBB67_AE85u32;
    }
    if kind == NORMAL {
        put::<F>(out, first, len, normal(c0, c1, a, b, false));
        put::<F>(out, first + 1, len, normal(c0, c1, a, b, true));
        put::<F>(out, first + 2, len, normal(c2, c3, a, b, false));
        put::<F>(out, first + 3, len, normal(c2, c3, a, b, true));
    } else {
        put::<F>(out, first, len, flat(c0, a, b, kind));
        put::<F>(out, first + 1, len, flat(c1, a, b, kind));
        put::<F>(out, first + 2, len, flat(c2, a, b, kind));
        put::<F>(out, first + 3, len, flat(c3, a, b, kind));
    }
}

/// The state with its offset advanced by `draws`.
#[cube(launch)]
fn advance_offset(state: &Tensor<u32>, out: &mut Tensor<u32>, draws: u32) {
    if ABSOLUTE_POS == 0 {
        let lo = state[2] + draws;
        out[0] = state[0];
        out[1] = state[1];
        out[2] = lo;
        out[3] = state[3] + select(lo < draws, u32::new(1), u32::new(0));
    }
}

/// Whether the kernels draw `shape` in `dtype`.
pub(crate) fn draws(shape: &Shape, dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
        && shape.num_elements() <= MAX_VALUES
}

/// A packed tensor of `shape` holding draw `draw` of the step from `state`.
pub(crate) fn random<R: CubeRuntime>(
    state: &CubeTensor<R>,
    draw: u32,
    shape: Shape,
    distribution: Distribution,
    dtype: DType,
) -> CubeTensor<R> {
    assert_eq!(
        state.dtype.size(),
        4,
        "a generator state holds 32-bit words"
    );
    let out =
        empty_device_contiguous_dtype(state.client.clone(), state.device.clone(), shape, dtype);
    let len = out.shape().num_elements() as u32;
    if len == 0 {
        return out;
    }
    let (kind, a, b) = match distribution {
        Distribution::Default => (UNIFORM, 0.0, 1.0),
        Distribution::Uniform(low, high) => {
            let (low, span) = uniform_params(low, high);
            (UNIFORM, low, span)
        }
        Distribution::Bernoulli(p) => (BERNOULLI, p as f32, 0.0),
        Distribution::Normal(mean, std) => (NORMAL, mean as f32, std as f32),
    };
    let cubes = len.div_ceil(4).div_ceil(CUBE_THREADS);
    fill::launch::<R>(
        &state.client,
        CubeCount::Static(cubes, 1, 1),
        CubeDim::new_1d(CUBE_THREADS),
        state.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        len,
        draw,
        a,
        b,
        kind,
        dtype.into(),
    );
    out
}

/// `state` with its offset advanced by `draws`, in a new tensor.
pub(crate) fn advance<R: CubeRuntime>(state: CubeTensor<R>, draws: u32) -> CubeTensor<R> {
    assert_eq!(
        state.dtype.size(),
        4,
        "a generator state holds 32-bit words"
    );
    let out = empty_device_contiguous_dtype(
        state.client.clone(),
        state.device.clone(),
        state.shape(),
        state.dtype,
    );
    advance_offset::launch::<R>(
        &state.client,
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(1),
        state.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        draws,
    );
    out
}
