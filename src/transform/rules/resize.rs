//! Resizes along ragged axes: the widths follow the scale, and each sample reads what it
//! reads alone.
//!
//! A sample alone is resized with the same scale as the batch when the scale is fixed: a
//! `scales` input, or `sizes` a fixed multiple of the input's extents (as expressions, or
//! at every multiple of some alignment, which samples must then be). Its width becomes
//! `w * scale` (floored, as tract sizes it). Sizes that are the extents of another ragged
//! tensor (PyTorch's `F.interpolate(x, size=y.shape[2:])`, a segmenter's map resized to
//! another map or to the image) give each sample that tensor's width, its scale its own:
//! resampled per sample (below), any width. Then, two ways:
//!
//! - **Dense**, when output position `i` reads input coordinate `x(i)` by a formula of
//!   the scale alone (asymmetric, half pixel, PyTorch's half pixel, TensorFlow's half
//!   pixel for nearest) and the reads do not depend on where the input ends: tract's
//!   resize runs on the batch. What a valid output reads past the sample's width (a
//!   linear or cubic interpolation's right neighbour, a nearest neighbour rounded up),
//!   the sample alone reads clamped to its last position: the input's padded region is
//!   made to hold that last value first ([`crate::ops::EdgeFill`]). Integer nearest
//!   upsampling (`NearestUpsample`, what tract declutters a pixel-replicating resize
//!   into) reads only valid positions: carried.
//! - **Per sample**, otherwise (`align_corners` and `half_pixel_symmetric`, whose `x(i)`
//!   depends on the extents; `exclude_outside`, which drops the taps past the input's
//!   end; antialiased downscales, whose filter reaches past it): each sample is resampled
//!   by the plan tract makes for it alone ([`crate::ops::resample`]).
//!
//! Refused: `tf_crop_and_resize` (coordinates relative to the padded extents), keeping
//! the aspect ratio (a scale from the padded extents), scales that are not fixed, the
//! batch axis resized.

use tract_core::internal::*;
use tract_core::ops::nn::NearestUpsample;
use tract_core::ops::nn::resize::{CoordTransformer, Interpolator, Resize as CoreResize};
use tract_onnx_opl::resize::{AspectRatio, CoordTransform, Resize as OnnxResize};

use super::{input_layout, wire_as};
use crate::error::Mixing;
use crate::ops::resample::{AxisWidth, ResamplePlan, Rounding, SampleResample};
use crate::spec::Extent;
use crate::transform::Class;
use crate::transform::rewrite::{Layout, Rewriter};
use crate::transform::width::WidthStep;

/// The step of widths for a scale: exact for an integer one, as tract sizes it otherwise.
fn scale_step(scale: f32) -> TractResult<WidthStep> {
    ensure!(
        scale.is_finite() && scale > 0.0,
        Mixing(format!("a resize by {scale} along the ragged axis"))
    );
    Ok(if scale.round() == scale {
        WidthStep::Affine {
            mul: scale as i64,
            add: 0,
        }
    } else {
        WidthStep::Scale(scale.to_bits())
    })
}

pub fn nearest_upsample(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: &NearestUpsample,
    inputs: &[OutletId],
) -> TractResult<()> {
    let mut layout = input_layout(rw, inputs[0])?;
    ensure!(
        op.scales.get(layout.axes.batch) == Some(&1),
        Mixing("it upsamples the batch axis".into())
    );
    for r in layout.axes.ragged.iter_mut() {
        let scale = *op.scales.get(r.axis).context("a scale per axis")?;
        if scale != 1 {
            let step = WidthStep::Affine {
                mul: scale as i64,
                add: 0,
            };
            r.row = rw.row_for(rw.rows[r.row].then(step, &node.name));
        }
    }
    // Each position repeats an input position: what the padded region held, it holds.
    let wire = wire_as(rw, node, op.clone(), inputs)?[0];
    rw.set_layout(wire, layout);
    rw.record(node, Class::Carried);
    Ok(())
}

/// What the transform needs of a resize, whichever op holds it.
struct Resampling {
    coord: Option<CoordTransformer>,
    interpolator: Interpolator,
    rounding: Rounding,
    cubic_a: f32,
    /// The input slots of the scales and sizes, if any.
    scales: Option<usize>,
    sizes: Option<usize>,
    /// The resized axes, when not all of them.
    axes: Option<Vec<i64>>,
    extrapolates: bool,
    /// Taps past the input dropped and the others renormalised (cubic's
    /// `exclude_outside`), or an antialiasing filter: what a sample reads at its edge
    /// then depends on where the input ends, not on what lies past it.
    edge_dependent: bool,
    antialias: bool,
}

/// How a resize scales each axis of its input.
struct Scales {
    /// The scale of each axis (1 for the axes resized per sample, below).
    per_axis: TVec<f32>,
    /// The ragged axes sized per sample: the row of the widths table giving each sample's
    /// output extent, that of the tensor whose shape the sizes are (a feature map of
    /// another stride).
    sized: TVec<Option<usize>>,
}

/// The scale of each axis of the input, from the constant scales, or from sizes that are
/// a fixed multiple of the input's extents along the sample axes (`layout`'s; the other
/// axes may be resized to any size: 1 stands for their scale). Sizes along a ragged axis
/// that are another ragged tensor's extent (PyTorch's `F.interpolate(x,
/// size=y.shape[2:])`) size each sample as alone, by that tensor's widths, unless they
/// are the input's own extents times a fixed factor at every width.
fn scales(
    rw: &mut Rewriter,
    node: &TypedNode,
    r: &Resampling,
    layout: &Layout,
) -> TractResult<Scales> {
    let input = rw.source.outlet_fact(node.inputs[0])?;
    let rank = input.rank();
    let axes: Vec<usize> = match &r.axes {
        Some(axes) => axes
            .iter()
            .map(|a| {
                if *a < 0 {
                    (*a + rank as i64) as usize
                } else {
                    *a as usize
                }
            })
            .collect(),
        None => (0..rank).collect(),
    };
    let konst = |slot: Option<usize>| -> TractResult<Option<Arc<Tensor>>> {
        let Some(slot) = slot else { return Ok(None) };
        let Some(input) = node.inputs.get(slot) else {
            return Ok(None);
        };
        Ok(rw
            .source
            .outlet_fact(*input)?
            .konst
            .clone()
            .filter(|k| k.len() == axes.len()))
    };
    let mut per_axis: TVec<f32> = tvec![1.0; rank];
    let mut sized: TVec<Option<usize>> = tvec![None; rank];
    if let Some(scales) = konst(r.scales)? {
        let scales = scales.cast_to::<f32>()?;
        for (axis, s) in axes
            .iter()
            .zip(scales.try_as_plain_ram()?.as_slice::<f32>()?)
        {
            per_axis[*axis] = *s;
        }
        return Ok(Scales { per_axis, sized });
    }
    let sizes = konst(r.sizes)?.with_context(|| {
        Mixing(
            "a resize whose scales and sizes are not constants: its scale along the \
         ragged axis could differ alone and in the batch"
                .into(),
        )
    })?;
    let sizes = sizes.cast_to::<TDim>()?;
    for (axis, out) in axes
        .iter()
        .zip(sizes.try_as_plain_ram()?.as_slice::<TDim>()?)
    {
        let input = &input.shape[*axis];
        if *axis == layout.axes.batch {
            ensure!(out == input, Mixing("it resizes the batch axis".into()));
        } else if let Some(ragged) = layout.axes.ragged_at(*axis) {
            let source = rw.rows[ragged.row].source;
            let fixed = fixed_scale(&rw.extents[source], out, input);
            // Only over symbols: typed per shape, an extent is a number, and another
            // map's extent the same number at the probe's size need not be there.
            let row = rw
                .depends_on_ragged(out)
                .then(|| {
                    rw.row_of_extent(out)
                        .or_else(|| rw.row_of_laid_out_extent(out))
                })
                .flatten();
            match (fixed, row) {
                (Some((scale, 1)), _) => per_axis[*axis] = scale,
                (_, Some(row)) => sized[*axis] = Some(row),
                (Some((scale, multiple)), None) => {
                    per_axis[*axis] = scale;
                    rw.align(
                        source,
                        multiple,
                        &format!(
                            "the resize at node {} scales by {scale} only there",
                            node.name
                        ),
                    );
                }
                (None, None) => bail!(Mixing(format!(
                    "the resize makes {out} of {input} along the ragged axis \
                     {axis}: not a fixed scale, nor the extent of a tensor whose widths are \
                     known, so a sample alone would be scaled differently"
                ))),
            }
        }
    }
    Ok(Scales { per_axis, sized })
}

/// The scale from `input` to `out` (expressions of the input's extent along one ragged
/// axis, sized by `extent`) when it is the same for every sample: as expressions
/// (`out == k * input`: any width), or at every extent that is a multiple of some
/// m <= 64, with m (sizes computed from a map of another stride, as PyTorch exports
/// `F.interpolate(x, size=y.shape[2:])`: `(H+1)/2` of `(H+3)/4` is twice it for H a
/// multiple of 4). Checked at the first 32 multiples: the expressions are sums of
/// divisions by powers of two up to m, periodic in m.
fn fixed_scale(extent: &Extent, out: &TDim, input: &TDim) -> Option<(f32, u64)> {
    let ratio = |o: i64, i: i64| -> Option<f32> {
        if i > 0 && o % i == 0 && (1..=16).contains(&(o / i)) {
            Some((o / i) as f32)
        } else if o > 0 && i % o == 0 && (1..=16).contains(&(i / o)) {
            Some(1.0 / (i / o) as f32)
        } else {
            None
        }
    };
    if let Some(k) = (1..=16).find(|k: &i64| *out == input.clone() * *k) {
        return Some((k as f32, 1));
    }
    if let Some(k) = (2..=16).find(|k: &i64| *input == out.clone() * *k) {
        return Some((1.0 / k as f32, 1));
    }
    let symbol = extent.symbol()?;
    [2u64, 4, 8, 16, 32, 64].into_iter().find_map(|m| {
        if !m.is_multiple_of(extent.multiple()) {
            return None;
        }
        let mut found: Option<f32> = None;
        for j in 1..=32i64 {
            let value = extent.symbol_value(m as i64 * j).ok()?;
            let values = SymbolValues::default().with(symbol, value);
            let (o, i) = (
                out.eval_to_i64(&values).ok()?,
                input.eval_to_i64(&values).ok()?,
            );
            let r = ratio(o, i)?;
            if found.is_some_and(|f| f != r) {
                return None;
            }
            found = Some(r);
        }
        found.map(|r| (r, m))
    })
}

pub fn core_resize(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: &CoreResize,
    inputs: &[OutletId],
) -> TractResult<()> {
    let r = Resampling {
        coord: Some(op.coord_transformer.clone()),
        interpolator: op.interpolator.clone(),
        rounding: Rounding::of_core(&op.nearest),
        cubic_a: -0.75,
        scales: op.optional_scales_input,
        sizes: op.optional_sizes_input,
        axes: None,
        extrapolates: false,
        edge_dependent: false,
        antialias: false,
    };
    resize(rw, node, &r, inputs)
}

pub fn onnx_resize(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: &OnnxResize,
    inputs: &[OutletId],
) -> TractResult<()> {
    ensure!(
        op.keep_aspect_ratio_policy == AspectRatio::Stretch || op.optional_sizes_input.is_none(),
        Mixing("a resize keeping the aspect ratio scales by the padded extents".into())
    );
    let r = Resampling {
        coord: match &op.coord_transformer {
            CoordTransform::Plain(c) => Some(c.clone()),
            CoordTransform::TfCropAndResize => None,
        },
        interpolator: op.interpolator.clone(),
        rounding: Rounding::of_onnx(&op.nearest),
        cubic_a: op.cubic_coeff_a(),
        scales: op.optional_scales_input,
        sizes: op.optional_sizes_input,
        axes: op.axes.clone(),
        extrapolates: matches!(op.coord_transformer, CoordTransform::TfCropAndResize),
        edge_dependent: op.exclude_outside,
        antialias: op.antialias,
    };
    resize(rw, node, &r, inputs)
}

fn resize(
    rw: &mut Rewriter,
    node: &TypedNode,
    r: &Resampling,
    inputs: &[OutletId],
) -> TractResult<()> {
    let mut layout = input_layout(rw, inputs[0])?;
    for (slot, input) in inputs.iter().enumerate().skip(1) {
        ensure!(
            rw.layout(*input).is_none(),
            Mixing(format!(
                "its input {slot} (roi, scales or sizes) derives from the ragged input"
            ))
        );
    }
    let Scales {
        per_axis: scales,
        sized,
    } = scales(rw, node, r, &layout)?;
    ensure!(
        scales[layout.axes.batch] == 1.0,
        Mixing("it resizes the batch axis".into())
    );
    let resized: TVec<usize> = layout
        .axes
        .ragged
        .iter()
        .filter(|x| scales[x.axis] != 1.0 || sized[x.axis].is_some())
        .map(|x| x.axis)
        .collect();
    if resized.is_empty() {
        // Along other axes only: carried.
        let wire = wire_as(rw, node, node.op.clone(), inputs)?[0];
        rw.set_layout(wire, Layout::new(layout.axes));
        rw.record(node, Class::Carried);
        return Ok(());
    }
    ensure!(
        !r.extrapolates,
        Mixing("tf_crop_and_resize crops by coordinates relative to the padded extents".into())
    );
    let coord = r.coord.clone().context("no coordinate transform")?;
    // Where the reads do not depend on the extents, tract's dense resize runs on the batch
    // (the edge replicated first); elsewhere each sample is resampled by its own plan.
    let extent_free = matches!(
        coord,
        CoordTransformer::HalfPixel
            | CoordTransformer::Asymmetric
            | CoordTransformer::PytorchHalfPixel
            | CoordTransformer::TfHalfPixelForNn
    );
    let antialiased_down = r.antialias && resized.iter().any(|a| scales[*a] < 1.0);
    let sized_per_sample = sized.iter().any(Option::is_some);
    if !extent_free || r.edge_dependent || antialiased_down || sized_per_sample {
        return per_sample(rw, node, r, coord, &scales, &sized, inputs[0], layout);
    }
    // Pixel replication reads valid positions only; any other resize may read past the
    // edge, where a sample alone reads its last position.
    let replicates = r.interpolator == Interpolator::Nearest
        && r.rounding == Rounding::Floor
        && coord == CoordTransformer::Asymmetric
        && resized.iter().all(|a| scales[*a].round() == scales[*a]);
    let mut inputs: TVec<OutletId> = inputs.into();
    if !replicates {
        inputs[0] = rw.edge_filled(inputs[0], &resized, false)?;
    }
    for x in layout.axes.ragged.iter_mut() {
        if resized.contains(&x.axis) {
            let step = scale_step(scales[x.axis])?;
            x.row = rw.row_for(rw.rows[x.row].then(step, &node.name));
        }
    }
    let wire = wire_as(rw, node, node.op.clone(), &inputs)?[0];
    rw.set_layout(wire, Layout::new(layout.axes));
    rw.record(node, Class::Windowed);
    Ok(())
}

/// A resize whose reads depend on the extents, or whose output extents are each
/// sample's own (`sized`), along ragged axes: per resized axis (in increasing order, as
/// tract resamples), each sample's plan from its widths ([`ResamplePlan`]) and the axis
/// resampled by it ([`SampleResample`]). Every read stays within the sample: no mask or
/// edge fill before.
#[allow(clippy::too_many_arguments)]
fn per_sample(
    rw: &mut Rewriter,
    node: &TypedNode,
    r: &Resampling,
    coord: CoordTransformer,
    scales: &[f32],
    sized: &[Option<usize>],
    input: OutletId,
    mut layout: Layout,
) -> TractResult<()> {
    let resampling = crate::ops::resample::Resampling {
        interpolator: r.interpolator.clone(),
        coord,
        rounding: r.rounding,
        antialias: r.antialias,
        exclude_outside: r.edge_dependent,
        cubic_a: r.cubic_a,
    };
    // Alone, tract takes the scales given, or each axis' output over input extent.
    let given = r
        .scales
        .and_then(|slot| node.inputs.get(slot))
        .and_then(|i| rw.source.outlet_fact(*i).ok())
        .is_some_and(|f| f.konst.as_ref().is_some_and(|k| k.len() > 0));
    let in_shape = rw.fact(input)?.shape.to_tvec();
    let out_shape = rw
        .source
        .outlet_fact(OutletId::new(node.id, 0))?
        .shape
        .to_tvec();
    let mut wire = input;
    let table = rw.table;
    for (axis, &scale) in scales.iter().enumerate() {
        if sized[axis].is_none() && scale == 1.0 && in_shape[axis] == out_shape[axis] {
            continue;
        }
        let (from, to) = match layout.axes.ragged_at(axis) {
            Some(ragged) if sized[axis].is_some() => {
                // Each sample's scale is its own: an antialiased filter's taps would
                // follow it, beyond the plan's one window.
                ensure!(
                    !r.antialias,
                    Mixing(format!(
                        "an antialiased resize to the extent of another tensor along \
                     ragged axis {axis}"
                    ))
                );
                let row = sized[axis].context("a sized axis")?;
                if let Some(x) = layout.axes.ragged.iter_mut().find(|x| x.axis == axis) {
                    x.row = row;
                }
                (AxisWidth::Row(ragged.row), AxisWidth::Row(row))
            }
            Some(ragged) => {
                let row = rw.row_for(rw.rows[ragged.row].then(scale_step(scale)?, &node.name));
                if let Some(x) = layout.axes.ragged.iter_mut().find(|x| x.axis == axis) {
                    x.row = row;
                }
                (AxisWidth::Row(ragged.row), AxisWidth::Row(row))
            }
            None => {
                let fixed = |d: &TDim| {
                    d.to_usize().with_context(|| {
                        Mixing(format!(
                            "it resizes axis {axis} of extent {d}, not ragged, per \
                             sample"
                        ))
                    })
                };
                (
                    AxisWidth::Fixed(fixed(&in_shape[axis])?),
                    AxisWidth::Fixed(fixed(&out_shape[axis])?),
                )
            }
        };
        let plan = ResamplePlan {
            resampling: resampling.clone(),
            input: from,
            output: to,
            scale: (given && sized[axis].is_none()).then_some(scale.to_bits()),
            window: resampling.window(scale),
            len_out: out_shape[axis].clone(),
        };
        let name = rw.unique_name(&format!("{}.plan.{axis}", node.name));
        let plans = rw.target.wire_node(name, plan, &[table])?;
        let op = SampleResample {
            axis,
            batch: layout.axes.batch,
        };
        let name = rw.unique_name(&format!("{}.resample.{axis}", node.name));
        wire = rw.target.wire_node(name, op, &[wire, plans[0], plans[1]])?[0];
    }
    rw.map(OutletId::new(node.id, 0), wire);
    rw.set_layout(wire, Layout::new(layout.axes));
    rw.record(node, Class::Windowed);
    Ok(())
}
