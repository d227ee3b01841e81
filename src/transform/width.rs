//! Width arithmetic: how a sample's width along the ragged axis changes from tensor to
//! tensor.
//!
//! The **width** of a sample at a tensor is the extent of its valid prefix along that
//! tensor's ragged axis. At the ragged input it is the sample's own; every later width
//! follows from it by the same arithmetic the ops apply to extents: a stride-2 conv halves
//! it, a pad grows it, a slice from a fixed start shrinks it. The padded batch obeys the
//! same arithmetic, which is why a sample's valid positions land on the same indices in
//! the batch as they would alone.
//!
//! A [`WidthFn`] is the chain of [`WidthStep`]s from the input width to one tensor's
//! width, each step remembering the node that applies it so that a sample too narrow for
//! the model is reported at the node where its width falls below one. Steps are evaluated
//! on integers exactly as tract sizes a tensor of concrete shape (the one-by-one
//! reference), not through the symbolic formula: the two differ in ONNX ceil-mode
//! pooling, where a last window starting in the padding is dropped.
//!
//! Two chains may describe the same function (a 3x3 conv with padding 1 and a 1x1 conv
//! both keep the width): [`WidthFn::canonical`] folds shifts and divisions into a normal
//! form so that the branches of a residual block are recognised as equal widths.

use std::fmt;

use tract_core::internal::*;
use tract_core::ops::cnn::PaddingSpec;

/// One step of width arithmetic, applied to the previous width `w`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum WidthStep {
    /// `w + delta`: stride-1 windows, pads, slices from a fixed start.
    Shift(i64),
    /// `floor((w + offset) / div)`: strided windows and downsampling.
    Div { offset: i64, div: i64 },
    /// `min(w, end)`: a slice ending at a fixed position.
    Clamp(i64),
    /// `w * mul + add`: upsampling (an integer resize scale, a transposed convolution).
    Affine { mul: i64, add: i64 },
    /// `floor(w * scale)` in f32, as tract sizes a resize by a fractional scale (the
    /// scale's bits).
    Scale(u32),
    /// ONNX ceil-mode pooling: `ceil((w + before + after - field) / stride) + 1`, less one
    /// when the last window would start past the input and its left padding.
    CeilPool {
        before: i64,
        after: i64,
        field: i64,
        stride: i64,
    },
}

impl WidthStep {
    pub fn apply(&self, w: i64) -> i64 {
        match *self {
            WidthStep::Shift(delta) => w + delta,
            WidthStep::Div { offset, div } => (w + offset).div_euclid(div),
            WidthStep::Clamp(end) => w.min(end),
            WidthStep::Affine { mul, add } => w * mul + add,
            WidthStep::Scale(bits) => (w as f32 * f32::from_bits(bits)) as i64,
            WidthStep::CeilPool {
                before,
                after,
                field,
                stride,
            } => {
                let dividend = w + before + after - field;
                if dividend < 0 {
                    return 0;
                }
                let mut out = (dividend + stride - 1).div_euclid(stride) + 1;
                if (out - 1) * stride >= w + before {
                    out -= 1;
                }
                out
            }
        }
    }
}

impl fmt::Display for WidthStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WidthStep::Shift(d) => write!(f, "w{d:+}"),
            WidthStep::Div { offset, div } => write!(f, "(w{offset:+})/{div}"),
            WidthStep::Clamp(end) => write!(f, "min(w,{end})"),
            WidthStep::Affine { mul, add } => write!(f, "w*{mul}{add:+}"),
            WidthStep::Scale(bits) => write!(f, "floor(w*{})", f32::from_bits(*bits)),
            WidthStep::CeilPool {
                before,
                after,
                field,
                stride,
            } => {
                write!(
                    f,
                    "ceilpool(w,pad={before}+{after},field={field},stride={stride})"
                )
            }
        }
    }
}

/// The widths of one tensor along one of its ragged axes, as a function of the input
/// widths along one of the input's ragged axes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct WidthFn {
    /// The input's ragged axis the widths derive from (an index into the spec's axes).
    pub source: usize,
    /// Each step with the name of the node applying it.
    pub steps: Vec<(WidthStep, String)>,
}

/// A sample whose width falls below one somewhere in the model: it cannot be run, alone
/// or batched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TooNarrow {
    pub node: String,
    pub width: i64,
}

impl WidthFn {
    /// The input's own widths along its first ragged axis.
    pub fn identity() -> WidthFn {
        WidthFn::default()
    }

    /// The input's own widths along its ragged axis `source` (an index into the spec's
    /// axes).
    pub fn of_source(source: usize) -> WidthFn {
        WidthFn {
            source,
            steps: vec![],
        }
    }

    pub fn then(&self, step: WidthStep, node: &str) -> WidthFn {
        let mut next = self.clone();
        next.steps.push((step, node.to_string()));
        next
    }

    pub fn then_all(&self, steps: impl IntoIterator<Item = WidthStep>, node: &str) -> WidthFn {
        steps.into_iter().fold(self.clone(), |f, s| f.then(s, node))
    }

    /// The width of a sample of input width `w`, or the node where it drops below one.
    pub fn eval(&self, w: i64) -> Result<i64, TooNarrow> {
        let mut w = w;
        for (step, node) in &self.steps {
            w = step.apply(w);
            if w < 1 {
                return Err(TooNarrow {
                    node: node.clone(),
                    width: w,
                });
            }
        }
        Ok(w)
    }

    /// The normal form of the function: consecutive shifts summed, a shift folded into
    /// the division after it, divisions by one turned into shifts, null shifts dropped.
    pub fn canonical(&self) -> Vec<WidthStep> {
        let mut out: Vec<WidthStep> = vec![];
        for (step, _) in &self.steps {
            let mut step = step.clone();
            loop {
                step = match (out.last(), step) {
                    (_, WidthStep::Div { offset, div: 1 }) => WidthStep::Shift(offset),
                    (Some(WidthStep::Shift(a)), WidthStep::Shift(b)) => {
                        let s = WidthStep::Shift(a + b);
                        out.pop();
                        s
                    }
                    (Some(WidthStep::Shift(a)), WidthStep::Div { offset, div }) => {
                        let s = WidthStep::Div {
                            offset: offset + a,
                            div,
                        };
                        out.pop();
                        s
                    }
                    (_, WidthStep::Affine { mul: 1, add }) => WidthStep::Shift(add),
                    (Some(WidthStep::Shift(a)), WidthStep::Affine { mul, add }) => {
                        let s = WidthStep::Affine {
                            mul,
                            add: add + a * mul,
                        };
                        out.pop();
                        s
                    }
                    (Some(WidthStep::Affine { mul, add }), WidthStep::Shift(b)) => {
                        let s = WidthStep::Affine {
                            mul: *mul,
                            add: add + b,
                        };
                        out.pop();
                        s
                    }
                    (_, step) => {
                        if step != WidthStep::Shift(0) {
                            out.push(step);
                        }
                        break;
                    }
                };
            }
        }
        out
    }

    /// Whether two functions compute the same widths.
    pub fn same_as(&self, other: &WidthFn) -> bool {
        self.source == other.source && self.canonical() == other.canonical()
    }

    /// The smallest alignment (a power of two up to 64) on whose multiples the two
    /// functions agree, if any: the feature maps of a pyramid (a detector's FPN) meet with
    /// the same extent only for inputs sized in multiples of the coarsest stride.
    /// Checked on the first 128 multiples, which covers every period the strides and
    /// scales of such models have.
    pub fn agreement(&self, other: &WidthFn) -> Option<u64> {
        if self.source != other.source {
            return None;
        }
        if self.same_as(other) {
            return Some(1);
        }
        (0..=6).map(|p| 1u64 << p).find(|m| {
            (1..=128).all(|k| {
                let w = (*m * k) as i64;
                match (self.eval(w), other.eval(w)) {
                    (Ok(a), Ok(b)) => a == b,
                    (Err(_), Err(_)) => true,
                    _ => false,
                }
            })
        })
    }
}

impl fmt::Display for WidthFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let canonical = self.canonical();
        let input = if self.source == 0 {
            "w".to_string()
        } else {
            format!("w{}", self.source)
        };
        if canonical.is_empty() {
            return write!(f, "{input}");
        }
        let steps: Vec<String> = canonical.iter().map(|s| s.to_string()).collect();
        write!(f, "{input} -> {}", steps.join(" -> "))
    }
}

/// The geometry of a window (conv or pool kernel) along the ragged axis.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    pub padding: PaddingSpec,
    /// The ragged axis among the op's spatial axes.
    pub geo_axis: usize,
    pub kernel: usize,
    pub dilation: usize,
    pub stride: usize,
}

impl Window {
    fn field(&self) -> usize {
        (self.kernel - 1) * self.dilation + 1
    }

    /// Padding before and after, and the output extent, for an input of extent `w`, as
    /// tract computes them for a tensor of that concrete extent.
    pub fn padded(&self, w: usize) -> (usize, usize, usize) {
        let c =
            self.padding
                .compute_one(self.geo_axis, &w, self.kernel, self.dilation, self.stride);
        (c.pad_before, c.pad_after, c.convoluted)
    }

    /// Whether the window keeps every position where it is (1-wide, stride 1, no
    /// padding): the op is then carried along the axis, not windowed.
    pub fn is_pointwise(&self) -> bool {
        self.field() == 1 && self.stride == 1 && (1..8).all(|w| self.padded(w) == (0, 0, w))
    }

    /// The padding before a sample must not depend on its width: the valid positions
    /// would then shift by a different amount alone and in the batch. SAME padding with a
    /// stride above one is the usual case. Checked over a few periods of the stride,
    /// which is what the padding can depend on.
    pub fn check_fixed_left_padding(&self) -> TractResult<()> {
        let start = self.field() + 1;
        let befores: Vec<usize> = (start..start + 4 * self.stride.max(1))
            .map(|w| self.padded(w).0)
            .collect();
        ensure!(
            befores.iter().all(|b| *b == befores[0]),
            "its padding before the ragged axis depends on the width ({:?} with kernel {}, \
             stride {}): a sample would be shifted differently alone and in the batch",
            self.padding,
            self.kernel,
            self.stride
        );
        Ok(())
    }

    /// Whether the windows of valid outputs can read past the input width: only then does
    /// the padded region need masking before the op.
    pub fn reads_past_width(&self) -> bool {
        match &self.padding {
            PaddingSpec::Valid => false,
            PaddingSpec::Explicit(_, after) => after[self.geo_axis] > 0,
            PaddingSpec::ExplicitOnnxPool(_, after, ceil) => *ceil || after[self.geo_axis] > 0,
            PaddingSpec::SameUpper | PaddingSpec::SameLower => {
                let start = self.field() + 1;
                (start..start + 4 * self.stride.max(1)).any(|w| self.padded(w).1 > 0)
            }
        }
    }

    /// The output width as a step.
    pub fn step(&self) -> WidthStep {
        let (k, s) = (self.field() as i64, self.stride as i64);
        let div = |pads: i64| WidthStep::Div {
            offset: pads - k + s,
            div: s,
        };
        match &self.padding {
            PaddingSpec::Valid => div(0),
            PaddingSpec::Explicit(b, a) | PaddingSpec::ExplicitOnnxPool(b, a, false) => {
                div((b[self.geo_axis] + a[self.geo_axis]) as i64)
            }
            PaddingSpec::ExplicitOnnxPool(b, a, true) => WidthStep::CeilPool {
                before: b[self.geo_axis] as i64,
                after: a[self.geo_axis] as i64,
                field: k,
                stride: s,
            },
            PaddingSpec::SameUpper | PaddingSpec::SameLower => WidthStep::Div {
                offset: s - 1,
                div: s,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(padding: PaddingSpec, kernel: usize, dilation: usize, stride: usize) -> Window {
        Window {
            padding,
            geo_axis: 0,
            kernel,
            dilation,
            stride,
        }
    }

    /// The step must agree with tract's own extent arithmetic on concrete extents.
    #[test]
    fn window_step_matches_tract_geometry() {
        let paddings = [
            PaddingSpec::Valid,
            PaddingSpec::Explicit(tvec!(1), tvec!(2)),
            PaddingSpec::ExplicitOnnxPool(tvec!(2), tvec!(1), false),
            PaddingSpec::ExplicitOnnxPool(tvec!(1), tvec!(1), true),
            PaddingSpec::ExplicitOnnxPool(tvec!(0), tvec!(0), true),
            PaddingSpec::SameUpper,
            PaddingSpec::SameLower,
        ];
        for padding in paddings {
            for kernel in 1..5 {
                for dilation in 1..3 {
                    for stride in 1..4 {
                        let win = window(padding.clone(), kernel, dilation, stride);
                        for w in win.field()..40 {
                            let expected = win.padded(w).2 as i64;
                            assert_eq!(
                                win.step().apply(w as i64),
                                expected,
                                "{win:?} at width {w}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn residual_branches_have_the_same_width() {
        let same3 = window(PaddingSpec::Explicit(tvec!(1), tvec!(1)), 3, 1, 2);
        let point = window(PaddingSpec::Valid, 1, 1, 2);
        let a = WidthFn::identity().then(same3.step(), "a");
        let b = WidthFn::identity().then(point.step(), "b");
        assert!(a.same_as(&b));
        let c = WidthFn::identity()
            .then(WidthStep::Shift(2), "pad")
            .then(WidthStep::Shift(-2), "crop");
        assert!(c.same_as(&WidthFn::identity()));
        assert!(!a.same_as(&WidthFn::identity()));
    }

    #[test]
    fn too_narrow_names_the_node() {
        let f = WidthFn::identity()
            .then(window(PaddingSpec::Valid, 5, 1, 1).step(), "conv5")
            .then(WidthStep::Shift(4), "pad");
        assert_eq!(
            f.eval(3),
            Err(TooNarrow {
                node: "conv5".into(),
                width: -1
            })
        );
        assert_eq!(f.eval(5), Ok(5));
    }

    #[test]
    fn same_padding_with_stride_depends_on_width() {
        assert!(
            window(PaddingSpec::SameUpper, 3, 1, 2)
                .check_fixed_left_padding()
                .is_err()
        );
        assert!(
            window(PaddingSpec::SameUpper, 3, 1, 1)
                .check_fixed_left_padding()
                .is_ok()
        );
        assert!(
            window(PaddingSpec::SameUpper, 1, 1, 2)
                .check_fixed_left_padding()
                .is_ok()
        );
    }
}
