//! Values of no sample: tensors computed from the padded extents alone (no sample's data
//! flows into them), sized by the padded extent along some axes, and what a sample alone
//! computes in their place.
//!
//! A token encoder numbers its positions from its own input's shape: `Range(0, L)` into a
//! position table, or a constant buffer of position ids cut to `L`
//! (`position_ids[:, :L]`); it builds causal and padding masks, relative-position
//! differences and their log buckets from such positions. In a batch `L` is the padded
//! length; each sample alone has its own, `w`. Such a value is a function `C(L)`, and it
//! is exact per sample when its first `w` positions along every axis sized by `L` are
//! `C(w)`, and its rows along an axis sized by the batch are all the value of a batch of
//! one: what the transform calls a **prefix** tensor ([`Rewriter::prefixes`]).
//!
//! Two ways to know it. By op, for what is a prefix by construction: a `Range` of the
//! padded extent, a constant cut from 0 to it, and carried ops over those (a gather of
//! their values from a constant table). For any other value of no sample, by evaluating
//! it ([`crate::evaluate`]): such values are wired as the model computes them
//! and marked pending; where one meets the samples' tensors, it is computed at a padded
//! extent and at smaller ones and the prefixes compared ([`settle`]). Positions, causal
//! masks and `i - j` buckets pass; `L - i`, or a division by `L`, fail, and the node
//! meeting them is refused, naming the value. A settled value broadcasts over the batch
//! where it meets the samples' tensors, its axes then their ragged axes
//! ([`super::carry`]).

use tract_core::internal::*;
use tract_core::ops::array::{Gather, Range, Slice};
use tract_core::ops::binary::TypedBinOp;
use tract_core::ops::cast::Cast;
use tract_core::ops::element_wise::ElementWiseOp;

use super::wire_as;
use crate::error::Mixing;
use crate::ops::RaggedAxis;
use crate::transform::Class;
use crate::transform::rewrite::Rewriter;

/// Whether `node`, reading no tensor of the samples, makes a prefix tensor by op: a
/// `Range` of the padded extent, a constant sliced from 0 to it, or a carried op over
/// prefix tensors. Wired then, returning true; false leaves the node to the other rules
/// (which wire any other value of no sample as pending).
pub fn rewrite(rw: &mut Rewriter, node: &TypedNode, inputs: &[OutletId]) -> TractResult<bool> {
    let op: &dyn TypedOp = node.op.as_ref();
    if inputs.iter().any(|i| rw.pending.contains_key(i)) {
        return Ok(false);
    }
    if let Some(range) = op.downcast_ref::<Range>() {
        return self::range(rw, node, range, inputs);
    }
    if let Some(slice) = op.downcast_ref::<Slice>()
        && !rw.prefixes.contains_key(&inputs[0])
    {
        let Some(row) = rw.row_of_extent(&slice.end) else {
            return Ok(false);
        };
        if slice.start != TDim::from(0) {
            return Ok(false);
        }
        let wire = wire_as(rw, node, slice.clone(), inputs)?[0];
        rw.prefixes.insert(
            wire,
            tvec!(RaggedAxis {
                axis: slice.axis,
                row
            }),
        );
        rw.record(node, Class::Carried);
        return Ok(true);
    }
    if !inputs.iter().any(|i| rw.prefixes.contains_key(i)) {
        return Ok(false);
    }
    let carried = op.is::<AxisOp>()
        || op.is::<Cast>()
        || op.is::<ElementWiseOp>()
        || op.is::<TypedBinOp>()
        || op
            .downcast_ref::<Gather>()
            .is_some_and(|_| !rw.prefixes.contains_key(&inputs[0]));
    Ok(carried && carry(rw, node, inputs)?)
}

/// `Range(start, end, step)` of the padded extent's length: its positions.
fn range(
    rw: &mut Rewriter,
    node: &TypedNode,
    range: &Range,
    inputs: &[OutletId],
) -> TractResult<bool> {
    let wire = wire_as(rw, node, range.clone(), inputs)?[0];
    let len = rw.fact(wire)?.shape[0].clone();
    if !rw.depends_on_ragged(&len) {
        // Sized by constants: nothing of the batch.
        rw.record(node, Class::Untouched);
        return Ok(true);
    }
    match rw.row_of_extent(&len) {
        Some(row) => {
            rw.prefixes.insert(wire, tvec!(RaggedAxis { axis: 0, row }));
        }
        // A length computed from the padded extent (`2*L - 1` relative positions): what
        // it holds is known only by evaluating it.
        None => {
            rw.pending.insert(wire, OutletId::new(node.id, 0));
        }
    }
    rw.record(node, Class::Carried);
    Ok(true)
}

/// A carried op over prefix tensors and constants: each prefix axis followed through the
/// op's axes mapping; a constant must not span one. False, wiring nothing, where the op
/// does not keep each position its own that way.
fn carry(rw: &mut Rewriter, node: &TypedNode, inputs: &[OutletId]) -> TractResult<bool> {
    let in_facts: TVec<TypedFact> = inputs
        .iter()
        .map(|i| rw.fact(*i).cloned())
        .collect::<TractResult<_>>()?;
    let in_refs: TVec<&TypedFact> = in_facts.iter().collect();
    let out_facts = node.op.output_facts(&in_refs)?;
    let out_refs: TVec<&TypedFact> = out_facts.iter().collect();
    let mapping = node.op.axes_mapping(&in_refs, &out_refs)?;
    let mut axes: TVec<RaggedAxis> = tvec!();
    for (slot, input) in inputs.iter().enumerate() {
        let Some(prefix) = rw.prefixes.get(input).cloned() else {
            continue;
        };
        for r in prefix {
            let Some(axis) = mapping.track_axis((InOut::In(slot), r.axis), InOut::Out(0))? else {
                return Ok(false);
            };
            match axes.iter().find(|a| a.axis == axis) {
                Some(a) => rw.meet(a.row, r.row, &node.name)?,
                None => axes.push(RaggedAxis { axis, row: r.row }),
            }
        }
    }
    for r in &axes {
        let linked = mapping.axis((InOut::Out(0), r.axis))?;
        for (slot, positions) in linked.inputs.iter().enumerate() {
            let prefix = rw.prefixes.get(&inputs[slot]);
            for &p in positions {
                let carries = prefix.is_some_and(|axes| axes.iter().any(|a| a.axis == p));
                if !carries && !in_facts[slot].shape[p].is_one() {
                    return Ok(false);
                }
            }
        }
    }
    let wires = wire_as(rw, node, node.op.clone(), inputs)?;
    rw.prefixes.insert(wires[0], axes);
    rw.record(node, Class::Carried);
    Ok(true)
}

/// The extents a pending value is computed at: a padded one, and smaller ones whose
/// results must be its prefixes. Small widths are where position arithmetic differs most
/// (a bucket saturating, a mask's first row); the padded extent is large enough for every
/// small one to be a proper prefix, and small enough to be cheap to compute. A value that
/// cannot be computed at 64 (positions read from a table of 40) is checked at the
/// largest of the others it can be.
const PADDED: [i64; 7] = [64, 48, 32, 24, 16, 12, 8];
const ALONE: [i64; 12] = [1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 33, 63];
/// The batch a pending value is computed at to compare its rows with a batch of one.
const BATCH: i64 = 3;

/// Where a pending value (`wire`, the model's `source`) meets the samples' tensors:
/// settled as a prefix tensor (or, with an axis sized by the batch, as a tensor of the
/// samples' layout) when computing it at smaller extents gives its prefixes, refused
/// otherwise.
///
/// `known` are the extents of the ragged axes of the tensors it meets, and their rows: a
/// value sized by a feature map's length (`(T+3)/4` after a subsampling conv) is a prefix
/// along the rows of that length.
pub fn settle(
    rw: &mut Rewriter,
    source: OutletId,
    wire: OutletId,
    known: &[(TDim, usize)],
) -> TractResult<()> {
    let node = &rw.source.node(source.node).name;
    let why = |e: anyhow::Error| {
        e.context(Mixing(format!(
            "its input computed from the padded extents by node {node:?} is not \
             what a sample alone computes there"
        )))
    };
    let axes = prefix_axes(rw, source, known).map_err(why)?;
    let (batch, ragged) = axes;
    rw.pending.remove(&wire);
    rw.shape_values.remove(&wire);
    match batch {
        Some(batch) => rw.set_layout(
            wire,
            crate::transform::rewrite::Layout::new(crate::ops::SampleAxes { batch, ragged }),
        ),
        None => {
            rw.prefixes.insert(wire, ragged);
        }
    }
    Ok(())
}

/// The axes of a pending value that are sized by the batch and by the ragged axes'
/// padded extents, once its value is checked to be a prefix function of them.
fn prefix_axes(
    rw: &Rewriter,
    source: OutletId,
    known: &[(TDim, usize)],
) -> TractResult<(Option<usize>, TVec<RaggedAxis>)> {
    let fact = rw.source.outlet_fact(source)?;
    let batch_extent = &rw.batch_extent;
    let mut batch = None;
    let mut ragged: TVec<RaggedAxis> = tvec!();
    for (axis, dim) in fact.shape.iter().enumerate() {
        let row = rw
            .row_of_extent(dim)
            .or_else(|| known.iter().find(|(e, _)| e == dim).map(|(_, row)| *row));
        if let Some(row) = row {
            ragged.push(RaggedAxis { axis, row });
        } else if !rw.batch_symbols.is_empty() && dim == batch_extent {
            ensure!(
                batch.is_none(),
                "its axes {:?} and {axis} are both sized as the batch",
                batch
            );
            batch = Some(axis);
        } else {
            ensure!(
                !rw.depends_on_ragged(dim)
                    && dim.symbols().iter().all(|s| !rw.batch_symbols.contains(s)),
                "its axis {axis} is sized {dim}, computed from the padded extents but none of \
                 them"
            );
        }
    }
    let ragged_symbols: Vec<Symbol> = {
        let mut symbols: Vec<Symbol> = vec![];
        for s in rw.extents.iter().filter_map(|e| e.symbol()) {
            if !symbols.contains(s) {
                symbols.push(s.clone());
            }
        }
        symbols
    };
    // Extents are those of the value's ragged axes: a symbol is given the smallest value
    // that sizes them so (a waveform's length for a count of frames, `(T+75)/80 - 1`).
    let ragged_dims: Vec<TDim> = ragged.iter().map(|r| fact.shape[r.axis].clone()).collect();
    let value_for = |symbol: &Symbol, extent: i64| -> i64 {
        let Some(dim) = ragged_dims.iter().find(|d| d.symbols().contains(symbol)) else {
            return extent;
        };
        let sized = |v: i64| {
            let mut values = SymbolValues::default();
            for s in dim.symbols() {
                values.set(&s, v);
            }
            dim.eval(&values).to_i64().unwrap_or(i64::MIN)
        };
        if sized(extent) == extent {
            return extent;
        }
        let mut high = 1i64;
        while sized(high) < extent && high < 1 << 24 {
            high *= 2;
        }
        let mut low = 1i64;
        while low < high {
            let mid = (low + high) / 2;
            if sized(mid) >= extent {
                high = mid;
            } else {
                low = mid + 1;
            }
        }
        low
    };
    let at = |padded: i64, sizes: &[(Symbol, i64)], n: i64| -> SymbolValues {
        let mut values = SymbolValues::default();
        for s in &ragged_symbols {
            values.set(s, value_for(s, padded));
        }
        for s in &rw.batch_symbols {
            values.set(s, n);
        }
        for (s, v) in sizes {
            values.set(s, value_for(s, *v));
        }
        values
    };
    let evaluate = |values: &SymbolValues| -> TractResult<Tensor> {
        let t = crate::evaluate::evaluate(rw.source, source, values)?.into_tensor();
        Ok(if t.datum_type() == TDim::datum_type() {
            t.cast_to::<i64>()?.into_owned()
        } else {
            t
        })
    };
    let mut computed = Err(anyhow!("no extent to compute it at"));
    let mut extent = PADDED[0];
    for e in PADDED {
        computed = evaluate(&at(e, &[], 1));
        extent = e;
        if computed.is_ok() {
            break;
        }
    }
    let padded = computed.with_context(|| format!("computing it at {extent}"))?;
    for symbol in &ragged_symbols {
        for w in ALONE.into_iter().filter(|w| *w < extent) {
            let values = at(extent, &[(symbol.clone(), w)], 1);
            let alone = evaluate(&values)?;
            let mut prefix = padded.clone();
            for r in &ragged {
                // What a sample of that size alone has along the axis.
                let extent = fact.shape[r.axis].eval(&values).to_usize()?;
                if extent < prefix.shape()[r.axis] {
                    prefix = prefix.slice(r.axis, 0, extent)?;
                }
            }
            ensure!(
                same(&prefix, &alone),
                "computed at {symbol}={w}, it is not its value at {symbol}={extent} cut to \
                 {symbol}={w}"
            );
        }
    }
    if !rw.batch_symbols.is_empty() {
        let batched = evaluate(&at(extent, &[], BATCH))?;
        let rows_alike = match batch {
            Some(axis) => (0..batched.shape()[axis]).all(|b| {
                batched
                    .slice(axis, b, b + 1)
                    .is_ok_and(|row| same(&row, &padded))
            }),
            None => same(&batched, &padded),
        };
        ensure!(
            rows_alike,
            "in a batch of {BATCH} its rows are not each the value of a batch of one"
        );
    }
    Ok((batch, ragged))
}

/// Bit for bit: the same type, shape and bytes (NaN and -0 included, as a sample
/// alone would have them).
fn same(a: &Tensor, b: &Tensor) -> bool {
    a.datum_type() == b.datum_type()
        && a.shape() == b.shape()
        && (a.datum_type().is_copy() && a.as_bytes() == b.as_bytes()
            || !a.datum_type().is_copy() && a == b)
}
