//! Reductions and normalisations over an axis.
//!
//! Over a ragged axis, a reduction runs dense on an input masked with its neutral value
//! (0 for a sum, -inf for a max...), so the padded cells change nothing. A mean is a sum
//! times the reciprocal of a count the model derives from the padded width: that count
//! is computed per sample where the model builds it (see `per_sample` in the rules).
//! A softmax over the ragged axis becomes a [`MaskedSoftmax`].
//!
//! Over the batch axis alone, a reduction folds samples together: refused. Over the batch
//! axis and others (a whole tensor's maximum), it is what each sample alone computes
//! over its other axes: each keeps its own along the batch axis.

use tract_core::internal::*;
use tract_core::ops::nn::{Reduce, Reducer, Softmax};

use super::{carry, wire_as};
use crate::error::Mixing;
use crate::ops::{Fill, MaskedSoftmax};
use crate::transform::Class;
use crate::transform::rewrite::{Layout, Rewriter, Summed};

/// The layout of an op working over `axes`, when a ragged axis is among them; `None`
/// once an op over other axes only is wired, carried. Over the batch axis: refused, `why`.
fn over_axes(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: Box<dyn TypedOp>,
    inputs: &[OutletId],
    axes: &[usize],
    why: &str,
) -> TractResult<Option<Layout>> {
    let layout = rw
        .layout(inputs[0])
        .cloned()
        .context("the op's input is not batched")?;
    ensure!(!axes.contains(&layout.axes.batch), Mixing(why.to_string()));
    if layout.axes.ragged.iter().any(|r| axes.contains(&r.axis)) {
        return Ok(Some(layout));
    }
    carry(rw, node, op, inputs)?;
    rw.record(node, Class::Carried);
    Ok(None)
}

pub fn reduce(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: &Reduce,
    inputs: &[OutletId],
) -> TractResult<()> {
    let batch = rw.layout(inputs[0]).map(|l| l.axes.batch);
    if let Some(batch) = batch.filter(|b| op.axes.contains(b) && op.axes.len() > 1) {
        // Over the batch axis and others (a whole clip's maximum, say): alone, a sample's
        // batch is itself, so what it computes is the reduction over the other axes; each
        // sample keeps its own along the batch axis.
        let per_sample = Reduce::new(
            op.axes.iter().copied().filter(|a| *a != batch).collect(),
            op.reducer,
        );
        rw.batch_reductions.push(node.name.clone());
        return reduce(rw, node, &per_sample, inputs);
    }
    let Some(layout) = over_axes(
        rw,
        node,
        Box::new(op.clone()),
        inputs,
        &op.axes,
        "reduces over the batch axis, folding samples into one another",
    )?
    else {
        return Ok(());
    };
    let symbolic = layout
        .axes
        .ragged
        .iter()
        .filter(|r| op.axes.contains(&r.axis))
        .all(|r| rw.extents[rw.rows[r.row].source].symbol().is_some());
    ensure!(
        symbolic || op.reducer != Reducer::Prod,
        "the model's width is a number, not a symbol: a product over the ragged axis may be \
         normalised by the padded width, which cannot be told apart here (type the model with \
         a symbolic width, e.g. N,3,48,W,f32)"
    );
    let fill = match op.reducer {
        Reducer::Sum | Reducer::Any => Fill::Zero,
        Reducer::Prod | Reducer::All => Fill::One,
        Reducer::Max | Reducer::ArgMax(_) => Fill::Lowest,
        Reducer::Min | Reducer::ArgMin(_) => Fill::Highest,
        Reducer::MeanOfSquares => bail!(
            "a mean of squares over the ragged axis divides by the padded width: not supported"
        ),
    };
    let masked = rw.masked(inputs[0], fill)?;
    let mut axes = layout.axes.clone();
    axes.ragged.retain(|r| !op.axes.contains(&r.axis));
    let wire = wire_as(rw, node, op.clone(), &[masked])?[0];
    if !symbolic && op.reducer == Reducer::Sum {
        // A mean's divisor is then a number, the padded count: the division that follows
        // takes each sample's own ([`crate::transform::rules`]'s `per_sample_divisor`).
        let shape = &rw.fact(masked)?.shape;
        let (mut fixed, mut padded, mut rows) = (1u64, 1u64, tvec!());
        for axis in &op.axes {
            let extent = shape[*axis].to_usize()? as u64;
            padded *= extent;
            match layout.axes.ragged_at(*axis) {
                Some(r) => rows.push(r.row),
                None => fixed *= extent,
            }
        }
        rw.sums.insert(
            wire,
            Summed {
                rows,
                fixed,
                padded,
            },
        );
    }
    rw.set_layout(wire, Layout::new(axes));
    rw.record(node, Class::Reducing);
    Ok(())
}

pub fn softmax(
    rw: &mut Rewriter,
    node: &TypedNode,
    op: &Softmax,
    inputs: &[OutletId],
) -> TractResult<()> {
    let Some(layout) = over_axes(
        rw,
        node,
        node.op.clone(),
        inputs,
        &op.axes,
        "a softmax over the batch axis normalises samples together",
    )?
    else {
        return Ok(());
    };
    ensure!(
        op.axes.len() == 1 && op.quant_output_dt.is_none(),
        "a softmax over the ragged axis and other axes at once, or quantized, is not supported"
    );
    let masked = MaskedSoftmax {
        axes: layout.axes.clone(),
        axis: op.axes[0],
        kind: op.kind,
    };
    let table = rw.table;
    let wire = wire_as(rw, node, masked, &[inputs[0], table])?[0];
    let dt = rw.fact(wire)?.datum_type;
    // Zero over the whole padded region, along every ragged axis: the contraction that
    // usually follows (attention's P·V) needs exactly that.
    rw.set_layout(
        wire,
        Layout {
            axes: layout.axes,
            fill: Some(Fill::Zero.scalar(dt)?),
        },
    );
    rw.record(node, Class::Reducing);
    Ok(())
}

/// An op normalising over `axis` (RMS norm): carried when the axis is neither a sample
/// axis; over the ragged axis it would count padded cells.
pub fn normalized_axis(
    rw: &mut Rewriter,
    node: &TypedNode,
    axis: usize,
    inputs: &[OutletId],
) -> TractResult<()> {
    let layout = rw
        .layout(inputs[0])
        .cloned()
        .context("input is not batched")?;
    ensure!(
        axis != layout.axes.batch,
        Mixing("it normalises over the batch axis".into())
    );
    ensure!(
        layout.axes.ragged_at(axis).is_none(),
        "it normalises over the ragged axis, dividing by the padded width: not supported"
    );
    carry(rw, node, node.op.clone(), inputs)?;
    rw.record(node, Class::Carried);
    Ok(())
}
