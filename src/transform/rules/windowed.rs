//! Convolutions and pools: windowed along the ragged axis unless their window there is a
//! single position.
//!
//! The dense op runs unchanged (tract's conv, tract's pools) on an input whose padded
//! region holds what a sample alone reads past its edge: zeros for a conv or a sum, -inf
//! for a max. A sample alone has its explicit padding on both sides; in the batch, the
//! left padding is the same, and the right one is the mask. This holds as long as the
//! padding before the axis does not depend on the width (refused otherwise, as SAME
//! padding with a stride above one does) and needs no mask at all when no valid output's
//! window reaches past the width.

use tract_core::internal::*;
use tract_core::ops::cnn::{Deconv, MaxPool, PoolSpec, SumPool};
use tract_core::ops::nn::DataFormat;

use super::wire_as;
use crate::error::Mixing;
use crate::ops::{Fill, MaskedAvgPool, RaggedAxis};
use crate::transform::Class;
use crate::transform::rewrite::{Layout, Rewriter};
use crate::transform::width::Window;

/// The data input's layout, checked against the op's data format: its batch axis must be
/// the format's N, and a ragged axis may only be spatial.
struct Windowing {
    layout: Layout,
    /// The ragged spatial axes with their window.
    windows: TVec<(RaggedAxis, Window)>,
}

fn windowing(rw: &Rewriter, inputs: &[OutletId], pool_spec: &PoolSpec) -> TractResult<Windowing> {
    let layout = rw
        .layout(inputs[0])
        .cloned()
        .context("the op's data input is not batched")?;
    for (slot, input) in inputs.iter().enumerate().skip(1) {
        ensure!(
            rw.layout(*input).is_none(),
            Mixing(format!(
                "its input {slot} (weights or bias) derives from the ragged input"
            ))
        );
    }
    let shape = rw.fact(inputs[0])?.shape.to_tvec();
    let data = pool_spec.data_format.shape(shape)?;
    ensure!(
        matches!(pool_spec.data_format, DataFormat::NCHW | DataFormat::NHWC)
            && data.n_axis() == Some(layout.axes.batch),
        Mixing(format!(
            "its batch axis ({:?} in {:?}) is not the samples' batch axis {}",
            data.n_axis(),
            pool_spec.data_format,
            layout.axes.batch
        ))
    );
    let hw: TVec<usize> = data.hw_axes().collect();
    let mut windows = tvec!();
    for r in &layout.axes.ragged {
        let geo_axis = hw
            .iter()
            .position(|a| *a == r.axis)
            .with_context(|| Mixing(format!("the ragged axis {} is its channel axis", r.axis)))?;
        let window = Window {
            padding: pool_spec.padding.clone(),
            geo_axis,
            kernel: pool_spec.kernel_shape[geo_axis],
            dilation: pool_spec.dilation(geo_axis),
            stride: pool_spec.stride(geo_axis),
        };
        if !window.is_pointwise() {
            window
                .check_fixed_left_padding()
                .map_err(|e| Mixing(format!("{e:#}")))?;
            windows.push((*r, window));
        }
    }
    Ok(Windowing { layout, windows })
}

impl Windowing {
    fn reads_past_width(&self) -> bool {
        self.windows.iter().any(|(_, w)| w.reads_past_width())
    }

    /// The output layout: same positions (the data format is kept), new widths.
    fn output(&self, rw: &mut Rewriter, node: &TypedNode) -> Layout {
        let mut axes = self.layout.axes.clone();
        for (r, window) in &self.windows {
            let f = rw.rows[r.row].then(window.step(), &node.name);
            let row = rw.row_for(f);
            axes.ragged
                .iter_mut()
                .filter(|x| x.axis == r.axis)
                .for_each(|x| x.row = row);
        }
        Layout::new(axes)
    }

    fn class(&self) -> Class {
        if self.windows.is_empty() {
            Class::Carried
        } else {
            Class::Windowed
        }
    }

    /// Wires `op` on the data input masked with `fill` where the windows need it.
    fn wire(
        &self,
        rw: &mut Rewriter,
        node: &TypedNode,
        op: Box<dyn TypedOp>,
        inputs: &[OutletId],
        fill: Fill,
    ) -> TractResult<()> {
        let mut inputs = inputs.to_vec();
        if self.reads_past_width() {
            inputs[0] = rw.masked(inputs[0], fill)?;
        }
        let layout = self.output(rw, node);
        let wire = wire_as(rw, node, op, &inputs)?[0];
        rw.set_layout(wire, layout);
        rw.record(node, self.class());
        Ok(())
    }
}

pub fn conv(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: &tract_core::ops::cnn::Conv,
    inputs: &[OutletId],
) -> TractResult<()> {
    windowing(rw, inputs, &op.pool_spec)?.wire(rw, node, Box::new(op.clone()), inputs, Fill::Zero)
}

pub fn max_pool(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: &MaxPool,
    inputs: &[OutletId],
) -> TractResult<()> {
    ensure!(
        op.with_index_outputs.is_none(),
        Mixing(
            "the indices a max pool outputs are offsets in the padded batch, not in \
         each sample"
                .into()
        )
    );
    let w = windowing(rw, inputs, &op.pool_spec)?;
    w.wire(rw, node, Box::new(op.clone()), inputs, Fill::Lowest)
}

/// Sum and average pools. An average's divisor only needs to be per sample when a valid
/// window can overhang the width and the divisor does not count the whole kernel: then
/// the pool becomes a sum pool and a [`MaskedAvgPool`] dividing by each sample's count.
pub fn sum_pool(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: &SumPool,
    inputs: &[OutletId],
) -> TractResult<()> {
    use tract_core::ops::cnn::PaddingSpec;
    let w = windowing(rw, inputs, &op.pool_spec)?;
    let ceil = matches!(
        op.pool_spec.padding,
        PaddingSpec::ExplicitOnnxPool(_, _, true)
    );
    let per_sample_divisor =
        op.normalize && w.reads_past_width() && (!op.count_include_pad || ceil);
    if !per_sample_divisor {
        return w.wire(rw, node, Box::new(op.clone()), inputs, Fill::Zero);
    }
    let masked = rw.masked(inputs[0], Fill::Zero)?;
    let pool = MaskedAvgPool {
        pool_spec: op.pool_spec.clone(),
        count_include_pad: op.count_include_pad,
        axes: w.layout.axes.clone(),
        windows: w
            .windows
            .iter()
            .map(|(r, window)| (r.axis, window.clone()))
            .collect(),
    };
    let layout = w.output(rw, node);
    let table = rw.table;
    let wire = wire_as(rw, node, pool, &[masked, table])?[0];
    rw.set_layout(wire, layout);
    rw.record(node, Class::Windowed);
    Ok(())
}

/// A transposed convolution along ragged axes: its input masked to 0 (a padded position
/// would spread into valid outputs), each width becoming `(w - 1) * stride + field -
/// pads + adjustment` as tract sizes it, which must be affine in the width with a left
/// padding that does not depend on it.
pub fn deconv(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: &Deconv,
    inputs: &[OutletId],
) -> TractResult<()> {
    let layout = rw
        .layout(inputs[0])
        .cloned()
        .context("the op's data input is not batched")?;
    for (slot, input) in inputs.iter().enumerate().skip(1) {
        ensure!(
            rw.layout(*input).is_none(),
            Mixing(format!(
                "its input {slot} (weights or bias) derives from the ragged input"
            ))
        );
    }
    let spec = &op.pool_spec;
    let shape = rw.fact(inputs[0])?.shape.to_tvec();
    let data = spec.data_format.shape(shape)?;
    ensure!(
        data.n_axis() == Some(layout.axes.batch),
        Mixing(format!(
            "its batch axis is not the samples' batch axis {}",
            layout.axes.batch
        ))
    );
    let hw: TVec<usize> = data.hw_axes().collect();
    let mut axes = layout.axes.clone();
    for r in axes.ragged.iter_mut() {
        let geo = hw
            .iter()
            .position(|a| *a == r.axis)
            .with_context(|| Mixing(format!("the ragged axis {} is its channel axis", r.axis)))?;
        let at = |w: usize| -> TractResult<(i64, i64)> {
            let dims: TVec<usize> = tvec![w; hw.len()];
            let c = spec.padding.compute_for_deconv(
                &dims,
                &spec.kernel_shape,
                &spec.dilations(),
                &spec.strides(),
                &op.adjustments,
            )?;
            Ok((c[geo].deconvoluted as i64, c[geo].pad_before as i64))
        };
        // From a width the padding cannot exceed (tract sizes in unsigned integers).
        let base = 1 + spec.kernel_shape[geo] * spec.dilation(geo) + 8;
        let ((o1, b1), (o2, _)) = (at(base)?, at(base + 1)?);
        let (mul, add) = (o2 - o1, o1 - (o2 - o1) * base as i64);
        for w in base..base + 16 {
            let (o, b) = at(w)?;
            ensure!(
                o == mul * w as i64 + add && b == b1,
                Mixing(format!(
                    "its output extent or left padding along the ragged axis is not an \
                 affine function of the width ({:?})",
                    spec.padding
                ))
            );
        }
        let step = crate::transform::width::WidthStep::Affine { mul, add };
        r.row = rw.row_for(rw.rows[r.row].then(step, &node.name));
    }
    let mut inputs: TVec<OutletId> = inputs.into();
    if !layout.axes.ragged.is_empty() {
        inputs[0] = rw.masked(inputs[0], Fill::Zero)?;
    }
    let wire = wire_as(rw, node, op.clone(), &inputs)?[0];
    rw.set_layout(wire, Layout::new(axes));
    rw.record(
        node,
        if layout.axes.ragged.is_empty() {
            Class::Carried
        } else {
            Class::Windowed
        },
    );
    Ok(())
}
