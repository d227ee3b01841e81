//! Resizes resampled per sample: each sample of a batch with the plan it gets alone.
//!
//! A resize maps output position `i` to input coordinate `x(i)` by a formula of the scale
//! and, for some coordinate transforms, of the extents (`align_corners`:
//! `x(i) = i * (len_in - 1) / (len_out - 1)`); it reads the positions around `x(i)` within
//! the input (clamped, or dropped and renormalised with `exclude_outside`) with weights of
//! the fractional part (and of the scale, for an antialiased downscale). Wherever the
//! formula or the reads depend on the extents, a sample batched at the padded extents
//! would be resampled differently from alone. Here, per resized axis:
//!
//! - [`ResamplePlan`] (width arithmetic, on the host) makes each sample's plan from its own
//!   widths, the one tract makes for it alone (`tract_core::ops::nn::resize::plan_axis`):
//!   per output position, the input positions and weights, rows past the sample's output
//!   width all zero;
//! - [`SampleResample`] sums each sample's taps in that order, skipping zero weights, each
//!   product rounded before the sum, as tract's CPU resize does: the same bits as alone.
//!
//! Axes are resampled one after the other in increasing order, as tract does.

use tract_core::internal::*;
use tract_core::ops::nn::resize::{
    AxisPlan, CoordTransformer, Interpolator, cubic_weights, linear_weights, plan_axis, window_size,
};

mod plan;
mod sample;

pub use plan::{AxisWidth, ResamplePlan};
pub use sample::SampleResample;

/// ONNX's nearest rounding modes (tract core's two among them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rounding {
    Floor,
    Ceil,
    RoundPreferFloor,
    RoundPreferCeil,
}

impl Rounding {
    fn prefers_right(&self, r: f32) -> bool {
        match self {
            Rounding::Floor => false,
            Rounding::Ceil => true,
            Rounding::RoundPreferFloor => r > 0.5,
            Rounding::RoundPreferCeil => r >= 0.5,
        }
    }

    pub fn of_core(n: &tract_core::ops::nn::resize::Nearest) -> Rounding {
        match n {
            tract_core::ops::nn::resize::Nearest::Floor => Rounding::Floor,
            tract_core::ops::nn::resize::Nearest::RoundPreferCeil => Rounding::RoundPreferCeil,
        }
    }

    pub fn of_onnx(n: &tract_onnx_opl::resize::Nearest) -> Rounding {
        match n {
            tract_onnx_opl::resize::Nearest::Floor => Rounding::Floor,
            tract_onnx_opl::resize::Nearest::Ceil => Rounding::Ceil,
            tract_onnx_opl::resize::Nearest::RoundPreferFloor => Rounding::RoundPreferFloor,
            tract_onnx_opl::resize::Nearest::RoundPreferCeil => Rounding::RoundPreferCeil,
        }
    }
}

/// How a resize reads its input: what tract's resizes (core's and ONNX's) plan an axis by.
#[derive(Clone, Debug, PartialEq)]
pub struct Resampling {
    pub interpolator: Interpolator,
    pub coord: CoordTransformer,
    pub rounding: Rounding,
    pub antialias: bool,
    pub exclude_outside: bool,
    pub cubic_a: f32,
}

// The coefficient is an attribute, finite: equality is an equivalence.
impl Eq for Resampling {}

impl std::hash::Hash for Resampling {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.interpolator.as_str().hash(state);
        self.coord.as_str().hash(state);
        self.rounding.hash(state);
        (self.antialias, self.exclude_outside, self.cubic_a.to_bits()).hash(state);
    }
}

impl Resampling {
    /// The taps of one output position at `scale`.
    pub fn window(&self, scale: f32) -> usize {
        window_size(&self.interpolator, self.antialias, scale)
    }

    /// The plan tract makes for an axis of `len_in` positions resized to `len_out` at
    /// `scale`.
    pub fn plan(&self, scale: f32, len_in: usize, len_out: usize) -> AxisPlan {
        let window = self.window(scale);
        let coord = |x| Some(self.coord.transform(x, scale, len_in, len_out));
        let (antialias, a, exclude) = (self.antialias, self.cubic_a, self.exclude_outside);
        match self.interpolator {
            Interpolator::Linear => plan_axis(len_in, len_out, window, exclude, coord, |r, w| {
                linear_weights(r, scale, antialias, w)
            }),
            Interpolator::Cubic => plan_axis(len_in, len_out, window, exclude, coord, |r, w| {
                cubic_weights(r, scale, a, antialias, w)
            }),
            Interpolator::Nearest => plan_axis(len_in, len_out, window, exclude, coord, |r, w| {
                let right = r == 1.0 || self.rounding.prefers_right(r);
                w[0] = !right as u8 as f32;
                w[1] = right as u8 as f32;
            }),
        }
    }
}
