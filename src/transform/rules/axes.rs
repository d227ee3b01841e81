//! Ops that move, cut or grow axes: the sample axes follow them, and a slice or a pad
//! along the ragged axis shifts the widths.

use tract_core::internal::*;
use tract_core::ops::array::{Gather, Pad, PadMode, Slice, TypedConcat};
use tract_core::ops::downsample::Downsample;

use super::{carry, wire_as};
use crate::error::Mixing;
use crate::transform::Class;
use crate::transform::rewrite::{Layout, Rewriter};
use crate::transform::width::WidthStep;

pub(super) fn input_layout(rw: &Rewriter, input: OutletId) -> TractResult<Layout> {
    rw.layout(input)
        .cloned()
        .context("the op's data input does not derive from the ragged input")
}

/// Transposes, added and removed unit axes, reshapes: the sample axes move with them. A
/// reshape may move a sample axis as a whole (between unit axes) but not merge it with,
/// or split it into, other axes: a flatten of W with C would interleave the positions of
/// every sample with the padding.
pub fn axis_op(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: &AxisOp,
    inputs: &[OutletId],
) -> TractResult<()> {
    let layout = input_layout(rw, inputs[0])?;
    let map = |axis: usize, what: &str| -> TractResult<usize> {
        if let Some(moved) = op.transform_axis(axis) {
            return Ok(moved);
        }
        match op.canonical().as_ref() {
            AxisOp::Reshape(at, from, to) => {
                let inside = axis - at;
                let others_are_units = from
                    .iter()
                    .enumerate()
                    .all(|(i, d)| i == inside || d.is_one());
                let non_units: TVec<usize> = to
                    .iter()
                    .enumerate()
                    .filter(|(_, d)| !d.is_one())
                    .map(|(i, _)| i)
                    .collect();
                let dims = |d: &[TDim]| {
                    d.iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                };
                // The batch merged with a ragged axis: samples' positions run into one
                // another, which is how an export that fixed the batch at 1 in a reshape
                // (`[1, -1, H, D]`) reads a batch of several.
                let merged =
                    |a: usize| (*at..at + from.len()).contains(&a) && !from[a - at].is_one();
                let batch_with_ragged =
                    merged(layout.axes.batch) && layout.axes.ragged.iter().any(|r| merged(r.axis));
                let hint = if batch_with_ragged {
                    ": it merges the samples with their positions, as a model exported with its \
                     batch fixed at 1 in a reshape (`[1, -1, ...]`) does, which then runs one \
                     sample at a time only"
                } else {
                    ""
                };
                ensure!(
                    others_are_units && non_units.len() == 1 && to[non_units[0]] == from[inside],
                    Mixing(format!(
                        "the reshape [{}] -> [{}] merges or splits the {what} axis with \
                     other axes{hint}",
                        dims(from),
                        dims(to)
                    ))
                );
                Ok(at + non_units[0])
            }
            _ => bail!(Mixing(format!("it removes the {what} axis"))),
        }
    };
    let mut axes = layout.axes.clone();
    axes.batch = map(layout.axes.batch, "batch")?;
    // A ragged axis of extent 1 in the batch is one position in every sample (widths grow
    // with the width, and a sample narrower than one position was refused by the widths
    // table): removing it is the sample's own squeeze (silero's `x.squeeze(-1)` after
    // its encoder, where a chunk is one frame).
    let extent_one = |axis: usize| -> TractResult<bool> {
        Ok(matches!(op, AxisOp::Rm(a) if *a == axis) && rw.fact(inputs[0])?.shape[axis].is_one())
    };
    let mut kept = tvec![];
    for r in &layout.axes.ragged {
        if extent_one(r.axis)? {
            continue;
        }
        kept.push(crate::ops::RaggedAxis {
            axis: map(r.axis, "ragged")?,
            ..*r
        });
    }
    axes.ragged = kept;
    let wire = wire_as(rw, node, op.clone(), inputs)?[0];
    rw.set_layout(
        wire,
        Layout {
            axes,
            fill: layout.fill,
        },
    );
    // A sum keeps what a mean of it divides by through a reshape.
    if let Some(summed) = rw.sums.get(&inputs[0]).cloned() {
        rw.sums.insert(wire, summed);
    }
    rw.record(node, Class::Carried);
    Ok(())
}

/// A slice along the ragged axis keeps each sample's positions aligned if its start is
/// fixed: the width then loses the start, and is cut at the end if the end is fixed, or
/// shortened by as much as the end lies before the axis' end.
pub fn slice(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: &Slice,
    inputs: &[OutletId],
) -> TractResult<()> {
    let mut layout = input_layout(rw, inputs[0])?;
    // The whole axis (an ONNX `x[0:]` along the batch, typed at a concrete batch size):
    // nothing is cut.
    if op.start == 0.to_dim() && op.end == rw.fact(inputs[0])?.shape[op.axis] {
        rw.map(OutletId::new(node.id, 0), inputs[0]);
        rw.record(node, Class::Carried);
        return Ok(());
    }
    ensure!(
        op.axis != layout.axes.batch,
        Mixing("it slices the batch axis, dropping samples".into())
    );
    let mut class = Class::Carried;
    if let Some(r) = layout.axes.ragged_at(op.axis) {
        let start = op.start.to_i64().map_err(|_| {
            anyhow!(Mixing(format!(
                "the slice along the ragged axis starts at {}, which depends on the \
                 padded width: each sample would be cut at a different place alone",
                op.start
            )))
        })?;
        let extent = rw.fact(inputs[0])?.shape[op.axis].clone();
        let mut steps = vec![];
        if op.end != extent {
            if let Ok(end) = op.end.to_i64() {
                steps.push(WidthStep::Clamp(end));
            } else if let Ok(cut) = (extent.clone() - &op.end).to_i64() {
                steps.push(WidthStep::Shift(-cut));
            } else {
                bail!(Mixing(format!(
                    "the slice along the ragged axis ends at {}, neither a fixed \
                     position nor a fixed distance from the end of the axis ({extent})",
                    op.end
                )));
            }
        }
        steps.push(WidthStep::Shift(-start));
        let f = rw.rows[r.row].then_all(steps, &node.name);
        let row = rw.row_for(f);
        layout
            .axes
            .ragged
            .iter_mut()
            .filter(|x| x.axis == op.axis)
            .for_each(|x| x.row = row);
        class = Class::Windowed;
    }
    let wire = wire_as(rw, node, op.clone(), inputs)?[0];
    rw.set_layout(wire, layout);
    rw.record(node, class);
    Ok(())
}

/// A pad along the ragged axis: padding before shifts every position alike, padding
/// after must land right after each sample's width. With a constant, masking the input
/// with that constant first puts it there. An edge or reflect pad after reads the end of
/// the padded batch instead of each sample's: the padded region is then written again,
/// each sample's last value repeated or its values mirrored from its own end
/// ([`crate::ops::EdgeFill`]). Padding before, in any mode, reads the start, which every
/// sample has.
pub fn pad(rw: &mut Rewriter, node: &TypedNode, op: &Pad, inputs: &[OutletId]) -> TractResult<()> {
    let layout = input_layout(rw, inputs[0])?;
    ensure!(
        op.pads[layout.axes.batch] == (0, 0),
        Mixing("it pads the batch axis, adding samples".into())
    );
    let mut input = inputs[0];
    let mut axes = layout.axes.clone();
    let mut fill = layout.fill.clone();
    let mut class = Class::Carried;
    // Axes whose padding after is written again, with the width row of each sample's
    // end in the padded output (its width plus the padding before).
    let mut refilled: Vec<(usize, usize)> = vec![];
    for r in &mut axes.ragged {
        let (before, after) = op.pads[r.axis];
        if before == 0 && after == 0 {
            continue;
        }
        class = Class::Windowed;
        if after > 0 {
            match &op.mode {
                PadMode::Constant(value) => {
                    let dt = rw.fact(input)?.datum_type;
                    let value = value.cast_to_dt(dt)?.into_owned().into_arc_tensor();
                    input = rw.masked_with(input, value.clone())?;
                    fill = Some(value);
                }
                PadMode::Edge | PadMode::Reflect => {
                    let end = rw.rows[r.row].then(WidthStep::Shift(before as i64), &node.name);
                    refilled.push((r.axis, rw.row_for(end)));
                    fill = None;
                }
            }
        }
        let f = rw.rows[r.row].then(WidthStep::Shift((before + after) as i64), &node.name);
        r.row = rw.row_for(f);
    }
    let mut wired = inputs.to_vec();
    wired[0] = input;
    let mut wire = wire_as(rw, node, op.clone(), &wired)?[0];
    for (axis, end) in refilled {
        let mut at_end = axes.clone();
        at_end
            .ragged
            .iter_mut()
            .filter(|x| x.axis == axis)
            .for_each(|x| x.row = end);
        rw.set_layout(wire, Layout::new(at_end));
        wire = rw.edge_filled(wire, &[axis], matches!(op.mode, PadMode::Reflect))?;
        rw.map(OutletId::new(node.id, 0), wire);
    }
    rw.set_layout(wire, Layout { axes, fill });
    rw.record(node, class);
    Ok(())
}

/// Concatenation along another axis than the sample axes is carried; along the ragged
/// axis, the second input would start after the first one's padded width.
pub fn concat(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: &TypedConcat,
    inputs: &[OutletId],
) -> TractResult<()> {
    for input in inputs {
        if let Some(layout) = rw.layout(*input) {
            ensure!(
                op.axis != layout.axes.batch,
                Mixing("it concatenates along the batch axis".into())
            );
            ensure!(
                layout.axes.ragged_at(op.axis).is_none(),
                Mixing(
                    "it concatenates along the ragged axis, so the second input would \
                 start after the padded width of the first, not after each sample's width"
                        .into()
                )
            );
        }
    }
    carry(rw, node, node.op.clone(), inputs)?;
    rw.record(node, Class::Carried);
    Ok(())
}

/// Keeping every stride-th position along the ragged axis: the widths are divided alike.
pub fn downsample(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: &Downsample,
    inputs: &[OutletId],
) -> TractResult<()> {
    let mut layout = input_layout(rw, inputs[0])?;
    ensure!(
        op.axis != layout.axes.batch,
        Mixing("it downsamples the batch axis".into())
    );
    let mut class = Class::Carried;
    if let Some(r) = layout.axes.ragged_at(op.axis) {
        ensure!(
            op.stride > 0,
            Mixing("a negative stride reverses the ragged axis".into())
        );
        let stride = op.stride as i64;
        let step = WidthStep::Div {
            offset: stride - 1 - op.modulo as i64,
            div: stride,
        };
        let row = rw.row_for(rw.rows[r.row].then(step, &node.name));
        layout
            .axes
            .ragged
            .iter_mut()
            .filter(|x| x.axis == op.axis)
            .for_each(|x| x.row = row);
        layout.fill = None;
        class = Class::Windowed;
    }
    let wire = wire_as(rw, node, op.clone(), inputs)?[0];
    rw.set_layout(wire, layout);
    rw.record(node, class);
    Ok(())
}

/// A gather. Its indices may derive from the ragged input (token ids into a constant
/// embedding table): each position reads the table row its id names, carried like an
/// element-wise op; the padded positions' ids are masked to 0 first, so that they name
/// a row that exists whatever the padded region held. Its data may derive from the
/// ragged input with constant indices: along another axis than the sample axes
/// (channels picked) it is carried; along the ragged axis only position 0 (a first
/// token), which every sample has, is read the same alone and in the batch; other
/// positions, counted from either end, lie past some samples' widths or at a place that
/// depends on the padded extent, and are refused.
pub fn gather(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: &Gather,
    inputs: &[OutletId],
) -> TractResult<()> {
    let (data, indices) = (rw.layout(inputs[0]).cloned(), rw.layout(inputs[1]).cloned());
    match (data, indices) {
        (None, Some(_)) => {
            let ids = rw.masked_with(inputs[1], tensor0(0i64).into_arc_tensor())?;
            carry(rw, node, Box::new(op.clone()), &[inputs[0], ids])?;
            rw.record(node, Class::Carried);
            Ok(())
        }
        (Some(layout), None) => {
            ensure!(
                op.axis != layout.axes.batch,
                Mixing("it gathers along the batch axis, picking samples".into())
            );
            if layout.axes.ragged_at(op.axis).is_none() {
                carry(rw, node, Box::new(op.clone()), inputs)?;
                rw.record(node, Class::Carried);
                return Ok(());
            }
            let positions = rw.fact(inputs[1])?.konst.clone().with_context(|| {
                Mixing("it gathers along the ragged axis at positions that are not constant".into())
            })?;
            let positions = positions.cast_to::<i64>()?;
            ensure!(
                positions
                    .try_as_plain_ram()?
                    .as_slice::<i64>()?
                    .iter()
                    .all(|p| *p == 0),
                Mixing(format!(
                    "it gathers positions {:?} along the ragged axis: only position 0 (the \
                 first, which every sample has) reads alone what it reads in the batch",
                    positions
                ))
            );
            // The ragged axis is replaced by the indices' axes (none for a scalar index).
            let rank = positions.rank();
            let shift = |axis: usize| {
                if axis > op.axis {
                    axis + rank - 1
                } else {
                    axis
                }
            };
            let axes = crate::ops::SampleAxes {
                batch: shift(layout.axes.batch),
                ragged: layout
                    .axes
                    .ragged
                    .iter()
                    .filter(|r| r.axis != op.axis)
                    .map(|r| crate::ops::RaggedAxis {
                        axis: shift(r.axis),
                        row: r.row,
                    })
                    .collect(),
            };
            let wire = wire_as(rw, node, op.clone(), inputs)?[0];
            rw.set_layout(wire, Layout::new(axes));
            rw.record(node, Class::Reducing);
            Ok(())
        }
        _ => bail!(Mixing(
            "it gathers from a tensor of the samples at indices that also derive \
             from them"
                .into()
        )),
    }
}

/// ONNX GatherElements (`torch.gather`) at indices of the samples: each output position
/// reads the data at its own coordinates but along `axis`, where it reads at its index.
/// Carried, like an embedding: the data along `axis` must be a table, no sample axis of
/// it (RoBERTa's token types, a buffer expanded over the batch and gathered at each
/// token's position id); along the other axes, the data's sample axes are the indices'
/// (each sample reads its own row), or the data has none there. Indices past a width are
/// masked to 0, a valid one.
pub fn gather_elements(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: &tract_core::ops::array::GatherElements,
    inputs: &[OutletId],
) -> TractResult<()> {
    let indices = rw.layout(inputs[1]).cloned().with_context(|| {
        Mixing("it gathers from a tensor of the samples at indices of no sample".into())
    })?;
    let data = rw.layout(inputs[0]).cloned();
    let data_fact = rw.fact(inputs[0])?.clone();
    for axis in 0..data_fact.rank() {
        let in_data = data
            .as_ref()
            .map(|l| (l.axes.batch == axis, l.axes.ragged_at(axis).map(|r| r.row)));
        let in_indices = (
            indices.axes.batch == axis,
            indices.axes.ragged_at(axis).map(|r| r.row),
        );
        if axis == op.axis {
            ensure!(
                in_data.is_none_or(|(batch, ragged)| !batch && ragged.is_none()),
                Mixing(format!(
                    "it gathers along axis {axis}, a sample axis of its data"
                ))
            );
            continue;
        }
        match in_data {
            Some(d) if d != (false, None) => ensure!(
                d == in_indices,
                Mixing(format!(
                    "along axis {axis} its data and its indices hold the samples \
                 differently"
                ))
            ),
            _ => ensure!(
                !in_indices.0,
                Mixing(format!(
                    "it reads the data's row of each sample's place in the batch \
                 (axis {axis}), which alone is row 0"
                ))
            ),
        }
    }
    // Position ids tract types as TDim (an int64 cast of a cumulative sum): made i64,
    // which a mask can write and the gather reads alike.
    let mut ids = inputs[1];
    if rw.fact(ids)?.datum_type == TDim::datum_type() {
        let name = rw.unique_name(&format!("{}.indices_i64", node.name));
        ids = rw
            .target
            .wire_node(name, tract_core::ops::cast::cast(i64::datum_type()), &[ids])?[0];
        rw.set_layout(ids, indices.clone());
    }
    let zero = tensor0(0i64)
        .cast_to_dt(rw.fact(ids)?.datum_type)?
        .into_owned();
    let ids = rw.masked_with(ids, zero.into_arc_tensor())?;
    let wire = wire_as(rw, node, op.clone(), &[inputs[0], ids])?[0];
    rw.set_layout(wire, Layout::new(indices.axes.clone()));
    rw.record(node, Class::Carried);
    Ok(())
}
