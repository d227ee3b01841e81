//! The rules: one per kind of op, each wiring the op (and its masks) into the target and
//! saying where the sample axes of its outputs are.
//!
//! Ops are recognised by type. An op is never assumed carried because its
//! `axes_mapping` links an input axis to an output axis: tract links the normalised axis
//! of a softmax or an RMS norm that way too, since the mapping serves axis bookkeeping,
//! not data dependencies. What is not listed here is refused, by name.

use tract_core::internal::*;
use tract_core::ops::array::{MultiBroadcastTo, Pad, Slice, TypedConcat};
use tract_core::ops::binary::TypedBinOp;
use tract_core::ops::cast::Cast;
use tract_core::ops::cnn::{Conv, Deconv, MaxPool, SumPool};
use tract_core::ops::downsample::Downsample;
use tract_core::ops::einsum::EinSum;
use tract_core::ops::element_wise::ElementWiseOp;
use tract_core::ops::konst::Const;
use tract_core::ops::logic::Iff;
use tract_core::ops::nn::{Reduce, RmsNorm, Softmax};
use tract_core::ops::scan::Scan;

use super::Class;
use super::rewrite::{Layout, Rewriter};
use crate::ops::{PerSampleDim, RaggedAxis, Recurrence, SampleAxes, SampleCount};

mod axes;

use crate::error::Mixing;
use axes::input_layout;
mod contracting;
mod cumulative;
mod prefix;
mod recurrent;
mod reducing;
mod resize;
mod windowed;

pub fn rewrite_node(rw: &mut Rewriter, node: &TypedNode) -> TractResult<()> {
    let inputs: TVec<OutletId> = node
        .inputs
        .iter()
        .map(|i| rw.mapped(*i))
        .collect::<TractResult<_>>()?;
    if inputs.iter().all(|i| rw.layout(*i).is_none()) {
        if prefix::rewrite(rw, node, &inputs)? {
            return Ok(());
        }
        if let Some(konst) = node.op_as::<Const>()
            && depends_on(rw, konst.val())
        {
            if konst.val().len() == 1 && !ends_ranges_only(rw.source, node) {
                return per_sample(rw, node, konst.val());
            }
            // Extents computed from the padded shape (a resize's sizes): fine where an op
            // reads them as sizes, nowhere else.
            untouched(rw, node, &inputs)?;
            rw.shape_values
                .insert(rw.mapped(OutletId::new(node.id, 0))?);
            return Ok(());
        }
        untouched(rw, node, &inputs)?;
        if inputs.iter().any(|i| rw.shape_values.contains(i)) {
            for slot in 0..node.outputs.len() {
                let wire = rw.mapped(OutletId::new(node.id, slot))?;
                rw.shape_values.insert(wire);
            }
        }
        return Ok(());
    }
    let op: &dyn TypedOp = node.op.as_ref();
    let reads_sizes = |slot: usize| {
        op.downcast_ref::<tract_onnx_opl::resize::Resize>()
            .is_some_and(|r| slot > 0 && Some(slot) != r.optional_scales_input)
            || op
                .downcast_ref::<tract_core::ops::nn::resize::Resize>()
                .is_some_and(|r| Some(slot) == r.optional_sizes_input)
    };
    let mut known: Vec<(TDim, usize)> = vec![];
    for input in &inputs {
        if let Some(layout) = rw.layout(*input) {
            let shape = &rw.fact(*input)?.shape;
            known.extend(
                layout
                    .axes
                    .ragged
                    .iter()
                    .map(|r| (shape[r.axis].clone(), r.row)),
            );
        }
    }
    for (slot, input) in inputs.iter().enumerate() {
        if let Some(source) = rw.pending.get(input).copied()
            && !(rw.shape_values.contains(input) && reads_sizes(slot))
        {
            prefix::settle(rw, source, *input, &known).with_context(|| format!("input {slot}"))?;
        }
    }
    for (slot, input) in inputs.iter().enumerate() {
        ensure!(
            !rw.shape_values.contains(input) || reads_sizes(slot),
            Mixing(format!(
                "its input {slot} holds values computed from the padded extents, which \
             differ alone and in the batch"
            ))
        );
    }
    if let Some(op) = op.downcast_ref::<Conv>() {
        return windowed::conv(rw, node, op, &inputs);
    }
    if let Some(op) = op.downcast_ref::<MaxPool>() {
        return windowed::max_pool(rw, node, op, &inputs);
    }
    if let Some(op) = op.downcast_ref::<SumPool>() {
        return windowed::sum_pool(rw, node, op, &inputs);
    }
    if let Some(op) = op.downcast_ref::<Deconv>() {
        return windowed::deconv(rw, node, op, &inputs);
    }
    if let Some(op) = op.downcast_ref::<Reduce>() {
        return reducing::reduce(rw, node, op, &inputs);
    }
    if let Some(op) = op.downcast_ref::<Softmax>() {
        return reducing::softmax(rw, node, op, &inputs);
    }
    if let Some(op) = op.downcast_ref::<RmsNorm>() {
        return reducing::normalized_axis(rw, node, op.axis, &inputs);
    }
    if let Some(op) = op.downcast_ref::<EinSum>() {
        return contracting::einsum(rw, node, op, &inputs);
    }
    if let Some(op) = op.downcast_ref::<AxisOp>() {
        return axes::axis_op(rw, node, op, &inputs);
    }
    if let Some(op) = op.downcast_ref::<Slice>() {
        return axes::slice(rw, node, op, &inputs);
    }
    if let Some(op) = op.downcast_ref::<Pad>() {
        return axes::pad(rw, node, op, &inputs);
    }
    if let Some(op) = op.downcast_ref::<TypedConcat>() {
        return axes::concat(rw, node, op, &inputs);
    }
    if let Some(op) = op.downcast_ref::<Downsample>() {
        return axes::downsample(rw, node, op, &inputs);
    }
    if let Some(op) = op.downcast_ref::<tract_core::ops::array::Gather>() {
        return axes::gather(rw, node, op, &inputs);
    }
    if let Some(op) = op.downcast_ref::<tract_core::ops::array::GatherElements>() {
        return axes::gather_elements(rw, node, op, &inputs);
    }
    if let Some(op) = op.downcast_ref::<Recurrence>() {
        return recurrent::recurrence(rw, node, op, &inputs);
    }
    if let Some(op) = op.downcast_ref::<tract_core::ops::array::CumSum>() {
        return cumulative::cumsum(rw, node, op, &inputs);
    }
    if let Some(op) = op.downcast_ref::<tract_core::ops::nn::NearestUpsample>() {
        return resize::nearest_upsample(rw, node, op, &inputs);
    }
    if let Some(op) = op.downcast_ref::<tract_core::ops::nn::resize::Resize>() {
        return resize::core_resize(rw, node, op, &inputs);
    }
    if let Some(op) = op.downcast_ref::<tract_onnx_opl::resize::Resize>() {
        return resize::onnx_resize(rw, node, op, &inputs);
    }
    if let Some(bin) = op.downcast_ref::<TypedBinOp>() {
        let inputs = per_sample_divisor(rw, node, bin, &inputs)?;
        carry(rw, node, node.op.clone(), &inputs)?;
        rw.record(node, Class::Carried);
        return Ok(());
    }
    if op.is::<MultiBroadcastTo>() {
        return broadcast(rw, node, &inputs);
    }
    if op.is::<ElementWiseOp>()
        || op.is::<Cast>()
        || op.is::<Iff>()
        || op.is::<tract_core::ops::quant::DequantizeLinearF32>()
    {
        carry(rw, node, node.op.clone(), &inputs)?;
        rw.record(node, Class::Carried);
        return Ok(());
    }
    if op.is::<Scan>() {
        bail!(Mixing(
            "a Scan over tensors carrying the ragged axis (its state would run over \
             the padded region). ONNX LSTM, GRU and RNN nodes load as tract-ragged's \
             recurrence, which runs each sample to its own width, when the model is read with \
             tract_ragged::load (load_onnx, or load::onnx() for tract's API) rather than \
             tract_onnx::onnx()"
                .into()
        ));
    }
    bail!(
        "op {} is not known to tract-ragged, which cannot tell whether it mixes positions \
         along the ragged axis or samples along the batch axis",
        node.op.name()
    )
}

/// Whether every consumer of `node`'s output is a `Range` reading it as its end: the
/// padded extent read as a length ([`prefix`]), not a value per sample.
fn ends_ranges_only(model: &TypedModel, node: &TypedNode) -> bool {
    let successors = &node.outputs[0].successors;
    !successors.is_empty()
        && successors
            .iter()
            .all(|s| s.slot == 1 && model.node(s.node).op_is::<tract_core::ops::array::Range>())
}

/// Whether a constant's value is an expression of the symbols sizing the ragged axes or
/// the batch (a count over the batch axis: a sample alone is a batch of one).
fn depends_on(rw: &Rewriter, tensor: &Tensor) -> bool {
    let on_batch = |d: &TDim| d.symbols().iter().any(|s| rw.batch_symbols.contains(s));
    tensor.datum_type() == TDim::datum_type()
        && tensor
            .try_as_plain_ram()
            .ok()
            .and_then(|t| {
                t.as_slice::<TDim>()
                    .ok()
                    .map(|s| s.iter().any(|d| rw.depends_on_ragged(d) || on_batch(d)))
            })
            .unwrap_or(false)
}

/// A node reading nothing derived from the ragged input: copied. What it computes from
/// the padded extents (its inputs are such values, or its output is sized by them) is
/// pending ([`prefix::settle`]): a value of no sample, checked where it meets the
/// samples. Reading a shared input, it cannot be computed at other extents, and sized by
/// the padded width it is refused: it would hold values for positions no sample has,
/// with no way to tell its valid region.
fn untouched(rw: &mut Rewriter, node: &TypedNode, inputs: &[OutletId]) -> TractResult<()> {
    let wires = rw.target.wire_node(&node.name, node.op.clone(), inputs)?;
    let reads_extents = inputs
        .iter()
        .any(|i| rw.pending.contains_key(i) || rw.prefixes.contains_key(i));
    for (slot, w) in wires.iter().enumerate() {
        let source = OutletId::new(node.id, slot);
        let sized = rw.fact(*w)?.shape.iter().any(|d| {
            rw.depends_on_ragged(d) || d.symbols().iter().any(|s| rw.batch_symbols.contains(s))
        });
        if reads_extents || sized {
            if crate::evaluate::reads_no_input(rw.source, source) {
                rw.pending.insert(*w, source);
            } else {
                ensure!(
                    !rw.fact(*w)?.shape.iter().any(|d| rw.depends_on_ragged(d)),
                    Mixing(format!(
                        "it builds a tensor sized by the padded width ({:?}) without \
                     reading the ragged input",
                        rw.fact(*w)?.shape
                    ))
                );
            }
        }
        rw.map(source, *w);
    }
    rw.record(node, Class::Untouched);
    Ok(())
}

/// A constant computed from the padded widths, such as a global average pool's divisor:
/// replaced by its value at each sample's own widths.
fn per_sample(rw: &mut Rewriter, node: &TypedNode, value: &Tensor) -> TractResult<()> {
    ensure!(
        value.len() == 1 && value.rank() >= 1,
        Mixing(format!(
            "a constant computed from the padded width ({:?}) that is not a single \
         value broadcast over the batch: tract-ragged cannot compute it per sample",
            value
        ))
    );
    let expr = value.try_as_plain_ram()?.as_slice::<TDim>()?[0].clone();
    let op = PerSampleDim {
        expr,
        extents: rw.extents.clone(),
        rank: value.rank(),
        batch: rw.batch_symbols.clone(),
    };
    let widths = rw.widths.clone();
    let wire = rw.target.wire_node(&node.name, op, &widths)?[0];
    rw.map(OutletId::new(node.id, 0), wire);
    rw.set_layout(
        wire,
        Layout::new(SampleAxes {
            batch: 0,
            ragged: tvec!(),
        }),
    );
    rw.record(node, Class::PerSample);
    Ok(())
}

/// A mean in a model typed per shape: a sum over ragged axes divided by (or multiplied by
/// the reciprocal of) a number equal to the padded count of the cells summed, as the
/// model computes it from its shape. Alone, a sample divides by its own count: the number
/// is replaced by [`SampleCount`]. Any other number divides the sum as it is.
fn per_sample_divisor(
    rw: &mut Rewriter,
    node: &TypedNode,
    bin: &TypedBinOp,
    inputs: &[OutletId],
) -> TractResult<TVec<OutletId>> {
    use tract_core::ops::math::{Div, Mul};
    let (div, mul) = (bin.0.is::<Div>(), bin.0.is::<Mul>());
    let mut inputs: TVec<OutletId> = inputs.into();
    if !(div || mul) || inputs.len() != 2 {
        return Ok(inputs);
    }
    for (sum, other) in [(0, 1), (1, 0)] {
        if div && sum == 1 {
            continue;
        }
        let Some(summed) = rw.sums.get(&inputs[sum]).cloned() else {
            continue;
        };
        let fact = rw.source.outlet_fact(node.inputs[other])?;
        let Some(value) = source_scalar(rw.source, node.inputs[other]) else {
            continue;
        };
        let padded = summed.padded as f64;
        let matches = if div {
            value == padded
        } else {
            (value - 1.0 / padded).abs() <= 1e-6 / padded
        };
        if !matches {
            continue;
        }
        let batch = rw.layout(inputs[sum]).context("a sum's layout")?.axes.batch;
        let op = SampleCount {
            rows: summed.rows.clone(),
            fixed: summed.fixed,
            reciprocal: mul,
            datum_type: fact.datum_type,
            rank: fact.rank(),
            batch,
        };
        let name = rw.unique_name(&format!("{}.sample_count", node.name));
        let wire = rw.target.wire_node(name, op, &[rw.table])?[0];
        rw.set_layout(
            wire,
            Layout::new(SampleAxes {
                batch,
                ragged: tvec!(),
            }),
        );
        inputs[other] = wire;
    }
    Ok(inputs)
}

/// The value of a one-element tensor of the source model that is a constant, through the
/// casts and axis changes between it and its constant.
fn source_scalar(model: &TypedModel, outlet: OutletId) -> Option<f64> {
    let fact = model.outlet_fact(outlet).ok()?;
    if let Some(k) = fact.konst.as_ref().filter(|k| k.len() == 1) {
        let k = if k.datum_type() == TDim::datum_type() {
            k.cast_to::<i64>().ok()?.into_owned()
        } else {
            k.as_ref().clone()
        };
        return k.cast_to_scalar::<f64>().ok();
    }
    let node = model.node(outlet.node);
    if (node.op_is::<AxisOp>() || node.op_is::<Cast>()) && node.inputs.len() == 1 {
        return source_scalar(model, node.inputs[0]);
    }
    None
}

/// Wires `op` for `node`, mapping its outputs.
fn wire_as(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: impl Into<Box<dyn TypedOp>>,
    inputs: &[OutletId],
) -> TractResult<TVec<OutletId>> {
    let wires = rw.target.wire_node(&node.name, op, inputs)?;
    for (slot, w) in wires.iter().enumerate() {
        rw.map(OutletId::new(node.id, slot), *w);
    }
    Ok(wires)
}

/// Wires an op that maps positions one to one along every sample axis of its inputs,
/// following them through its axes mapping to its outputs.
///
/// The inputs that do not carry a sample axis must broadcast along it (extent one): a
/// constant spanning the padded width would line its values up with the batch's
/// positions, and differently with each sample's alone.
fn carry(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: Box<dyn TypedOp>,
    inputs: &[OutletId],
) -> TractResult<TVec<OutletId>> {
    let inputs = &align_per_sample_values(rw, node, inputs)?;
    let inputs = &indices_in_i64(rw, node, inputs)?;
    let in_facts: TVec<TypedFact> = inputs
        .iter()
        .map(|i| rw.fact(*i).cloned())
        .collect::<TractResult<_>>()?;
    let in_refs: TVec<&TypedFact> = in_facts.iter().collect();
    let out_facts = op.output_facts(&in_refs)?;
    let out_refs: TVec<&TypedFact> = out_facts.iter().collect();
    let mapping = op.axes_mapping(&in_refs, &out_refs)?;
    let mut layouts: TVec<Option<SampleAxes>> = tvec![None; out_facts.len()];
    for (slot, input) in inputs.iter().enumerate() {
        let Some(layout) = rw.layout(*input).cloned() else {
            continue;
        };
        for (out, entry) in layouts.iter_mut().enumerate() {
            let track = |axis: usize| mapping.track_axis((InOut::In(slot), axis), InOut::Out(out));
            let batch = track(layout.axes.batch)?
                .context("the op does not carry the batch axis through")?;
            let entry = entry.get_or_insert(SampleAxes {
                batch,
                ragged: tvec!(),
            });
            ensure!(
                entry.batch == batch,
                "its inputs disagree on where the batch axis is"
            );
            for r in &layout.axes.ragged {
                let axis = track(r.axis)?.with_context(|| {
                    format!(
                        "the op does not carry ragged axis {} of input {slot} through",
                        r.axis
                    )
                })?;
                match entry.ragged_at(axis) {
                    Some(existing) => rw
                        .meet(existing.row, r.row, &node.name)
                        .with_context(|| format!("along axis {axis}"))?,
                    None => entry.ragged.push(RaggedAxis { axis, row: r.row }),
                }
            }
        }
    }
    // Positions computed from the padded extent broadcast over the batch: their axis is
    // one of the samples' ragged axes, of the same widths, or, where the samples' tensors
    // have extent one (a padding mask `[N, 1, 1, L]` meeting a causal mask `[L, L]`), the
    // output's, of the positions' widths: a sample alone stretches to its own.
    for (slot, input) in inputs.iter().enumerate() {
        let Some(prefix) = rw.prefixes.get(input).cloned() else {
            continue;
        };
        for (out, entry) in layouts.iter_mut().enumerate() {
            let Some(entry) = entry.as_mut() else {
                continue;
            };
            for r in &prefix {
                let axis = mapping
                    .track_axis((InOut::In(slot), r.axis), InOut::Out(out))?
                    .context("the op does not carry the positions' axis through")?;
                match entry.ragged_at(axis) {
                    Some(existing) => rw
                        .meet(existing.row, r.row, &node.name)
                        .with_context(|| format!("along axis {axis}"))?,
                    None => {
                        let samples_span_it = inputs.iter().enumerate().any(|(ix, i)| {
                            rw.layout(*i).is_some()
                                && mapping
                                    .axis((InOut::Out(out), axis))
                                    .ok()
                                    .and_then(|a| a.inputs.get(ix).cloned())
                                    .is_some_and(|at| {
                                        at.iter().any(|p| !in_facts[ix].shape[*p].is_one())
                                    })
                        });
                        ensure!(
                            !samples_span_it && entry.batch != axis,
                            Mixing(format!(
                                "input {slot} holds positions 0..L along axis {axis}, \
                             where the samples have no ragged axis"
                            ))
                        );
                        entry.ragged.push(RaggedAxis { axis, row: r.row });
                    }
                }
            }
        }
    }
    for (out, axes) in layouts.iter().enumerate() {
        let Some(axes) = axes else { continue };
        let sample_axes = std::iter::once((axes.batch, "batch"))
            .chain(axes.ragged.iter().map(|r| (r.axis, "ragged")));
        for (axis, what) in sample_axes {
            let linked = mapping.axis((InOut::Out(out), axis))?;
            for (slot, positions) in linked.inputs.iter().enumerate() {
                let layout = rw.layout(inputs[slot]);
                let prefix = rw.prefixes.get(&inputs[slot]);
                for &p in positions {
                    let carries = layout.is_some_and(|l| {
                        if what == "batch" {
                            l.axes.batch == p
                        } else {
                            l.axes.ragged_at(p).is_some()
                        }
                    }) || (what == "ragged"
                        && prefix.is_some_and(|axes| axes.iter().any(|a| a.axis == p)));
                    ensure!(
                        carries || in_facts[slot].shape[p].is_one(),
                        Mixing(format!(
                            "input {slot} spans the {what} axis with extent {} but does not \
                         derive from the ragged input, so its values would line up with the padded \
                         batch rather than with each sample",
                            in_facts[slot].shape[p]
                        ))
                    );
                }
            }
        }
    }
    let wires = wire_as(rw, node, op, inputs)?;
    for (w, axes) in wires.iter().zip(layouts) {
        if let Some(axes) = axes {
            rw.set_layout(*w, Layout::new(axes));
        }
    }
    Ok(wires)
}

/// A broadcast (ONNX Expand): carried, and an axis it stretches from one to a ragged
/// axis' padded extent becomes that ragged axis. Its values are copies, the same at every
/// position, so what a sample alone holds along it is the prefix of its own width, as for
/// any ragged axis (an attention mask `[N, 1, 1, L]` expanded to `[N, 1, L, L]` as
/// transformers' SDPA exports write it, then added to the scores; DeepLabV3's pooled
/// branch `[N, C, 1, 1]` broadcast back to its feature map, of a length no input has).
fn broadcast(rw: &mut Rewriter, node: &TypedNode, inputs: &[OutletId]) -> TractResult<()> {
    let wires = carry(rw, node, node.op.clone(), inputs)?;
    let input = rw.fact(inputs[0])?.shape.to_tvec();
    let output = rw
        .source
        .outlet_fact(OutletId::new(node.id, 0))?
        .shape
        .to_tvec();
    if let Some(mut layout) = rw.layout(wires[0]).cloned() {
        let offset = output.len() - input.len();
        for (axis, dim) in output.iter().enumerate() {
            let stretched = axis < offset || input[axis - offset].is_one();
            let row = rw
                .row_of_extent(dim)
                .or_else(|| rw.row_of_laid_out_extent(dim));
            if let (true, None, Some(row)) = (stretched, layout.axes.ragged_at(axis), row) {
                layout.axes.ragged.push(RaggedAxis { axis, row });
            }
        }
        rw.set_layout(wires[0], layout);
    }
    rw.record(node, Class::Carried);
    Ok(())
}

/// `inputs`, with a value made per sample by the transform (a constant of the model,
/// such as a mean's divisor, now one value per sample: extent one along every axis in the
/// model, the batch along axis 0 here) moved so that its batch axis is where the other
/// inputs have theirs (axis 1 in a sequence-first `[T, N, C]`). Moving a batch axis among
/// unit axes moves no data.
fn align_per_sample_values(
    rw: &mut Rewriter,
    node: &TypedNode,
    inputs: &[OutletId],
) -> TractResult<TVec<OutletId>> {
    let made_per_sample = |rw: &Rewriter, ix: usize| -> TractResult<Option<usize>> {
        let Some(layout) = rw.layout(inputs[ix]) else {
            return Ok(None);
        };
        let shape = &rw.fact(inputs[ix])?.shape;
        let in_model = &rw.source.outlet_fact(node.inputs[ix])?.shape;
        let units = shape
            .iter()
            .enumerate()
            .all(|(axis, d)| axis == layout.axes.batch || d.is_one());
        let was_shared = in_model.len() == shape.len() && in_model[layout.axes.batch].is_one();
        Ok((layout.axes.ragged.is_empty() && units && was_shared).then_some(layout.axes.batch))
    };
    let mut batch = None;
    for (ix, input) in inputs.iter().enumerate() {
        if made_per_sample(rw, ix)?.is_none()
            && let Some(layout) = rw.layout(*input)
        {
            batch = Some((layout.axes.batch, rw.fact(*input)?.rank()));
        }
    }
    let Some((batch, rank)) = batch else {
        return Ok(inputs.into());
    };
    let mut aligned: TVec<OutletId> = tvec!();
    for (ix, i) in inputs.iter().enumerate() {
        match made_per_sample(rw, ix)? {
            Some(from) if from != batch && rw.fact(*i)?.rank() == rank => {
                let name = rw.unique_name(&format!("{}.batch_axis_{ix}", node.name));
                let wire = rw
                    .target
                    .wire_node(name, AxisOp::Move(from, batch), &[*i])?[0];
                let mut layout = rw.layout(*i).cloned().context("a per-sample value")?;
                layout.axes.batch = batch;
                rw.set_layout(wire, layout);
                aligned.push(wire);
            }
            _ => aligned.push(*i),
        }
    }
    Ok(aligned)
}

/// `inputs`, with those of tract's `TDim` cast to `i64` where another input is `i64`.
/// Index arithmetic an exporter computes from the input's shape is typed `TDim` by tract
/// (`relative_pos + att_span`); a constant of it that the transform made per sample
/// ([`per_sample`]) is an `i64` per sample, and the op then meets both. At run time such
/// `TDim`s hold plain numbers: the cast is exact.
fn indices_in_i64(
    rw: &mut Rewriter,
    node: &TypedNode,
    inputs: &[OutletId],
) -> TractResult<TVec<OutletId>> {
    let types: TVec<DatumType> = inputs
        .iter()
        .map(|i| Ok(rw.fact(*i)?.datum_type))
        .collect::<TractResult<_>>()?;
    if !(types.contains(&TDim::datum_type()) && types.contains(&i64::datum_type())) {
        return Ok(inputs.into());
    }
    let mut cast: TVec<OutletId> = tvec!();
    for (ix, i) in inputs.iter().enumerate() {
        if types[ix] != TDim::datum_type() {
            cast.push(*i);
            continue;
        }
        let name = rw.unique_name(&format!("{}.i64_{ix}", node.name));
        let wire =
            rw.target
                .wire_node(name, tract_core::ops::cast::cast(i64::datum_type()), &[*i])?[0];
        if let Some(layout) = rw.layout(*i).cloned() {
            rw.set_layout(wire, layout);
        }
        if let Some(prefix) = rw.prefixes.get(i).cloned() {
            rw.prefixes.insert(wire, prefix);
        }
        cast.push(wire);
    }
    Ok(cast)
}
