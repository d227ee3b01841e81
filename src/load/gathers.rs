//! Gathers of a tensor at its own coordinates, as broadcasts of it.
//!
//! transformers builds its attention masks with index arithmetic: the padding mask at
//! `(batch_idx, kv_idx)`, which torch's TorchScript exporter writes as a `Gather` from the
//! mask flattened to `[N*L]` at `batch_idx * L + kv_idx` (BERT, ALBERT, ELECTRA,
//! DistilBERT, BART, MPNet), and its dynamo exporter as a `GatherND` of the pairs
//! `(batch_idx, kv_idx)` stacked along a last axis. Either reads, at each position of the
//! indices, the mask at that position's own coordinates: what a broadcast of the mask
//! computes, with none of the index arithmetic. Such gathers are rewritten as that
//! broadcast (an axis change and a `MultiBroadcastTo`), which tract and the ragged
//! transform follow axis by axis; the flattened index, which merges the batch with the
//! sequence, is gone.
//!
//! The indices are values of the model's shape (they read no input): they are computed
//! at several extents ([`crate::evaluate`]) and must be, at each, exactly the coordinates
//! the rewrite assumes. Any other gather is left as it is.

use tract_core::internal::*;
use tract_core::ops::array::{Gather, GatherNd, MultiBroadcastTo};

use crate::evaluate::{evaluate, reads_no_input};

/// Rewrites every gather of a tensor at its own coordinates as a broadcast of it; how
/// many were.
pub fn gathers_at_own_coordinates(model: &mut TypedModel) -> TractResult<usize> {
    let mut done = 0;
    loop {
        let mut found = None;
        for id in model.eval_order()? {
            if let Some(gather) = own_coordinates(model, id)? {
                found = Some((id, gather));
                break;
            }
        }
        let Some((id, gather)) = found else {
            return Ok(done);
        };
        let node = model.node(id);
        let patch = as_broadcast(model, node, &gather)
            .with_context(|| format!("rewriting the gather {:?} as a broadcast", node.name))?;
        patch.apply(model)?;
        done += 1;
    }
}

/// A gather reading the tensor `source` at its own coordinates: `source`'s axes
/// `first..first + axes.len()` are read at the coordinates of the gather's index axes
/// `axes` (increasing), every other index axis broadcasts.
#[derive(Debug)]
struct OwnCoordinates {
    source: OutletId,
    first: usize,
    /// For each gathered axis of `source`, the index axis whose coordinate it is read at.
    axes: TVec<usize>,
    /// The index tensor's shape (without GatherND's last axis).
    index_shape: TVec<TDim>,
}

fn own_coordinates(model: &TypedModel, id: usize) -> TractResult<Option<OwnCoordinates>> {
    let node = model.node(id);
    let (data, indices) = match node.inputs.as_slice() {
        [data, indices] => (*data, *indices),
        _ => return Ok(None),
    };
    if !(node.op_is::<Gather>() || node.op_as::<GatherNd>().is_some_and(|g| g.batch_dims == 0)) {
        return Ok(None);
    }
    let index_fact = model.outlet_fact(indices)?;
    if index_fact.konst.is_some() || !reads_no_input(model, indices) {
        return Ok(None);
    }
    // What the gathered axes are, in the tensor before any flattening.
    let (source, first, dims): (OutletId, usize, TVec<TDim>) =
        if let Some(gather) = node.op_as::<Gather>() {
            match flattened(model, data, gather.axis)? {
                Some(found) => found,
                None => (
                    data,
                    gather.axis,
                    tvec!(model.outlet_fact(data)?.shape[gather.axis].clone()),
                ),
            }
        } else {
            let Some(k) = index_fact.shape.last().and_then(|d| d.to_usize().ok()) else {
                return Ok(None);
            };
            let shape = &model.outlet_fact(data)?.shape;
            if k == 0 || k > shape.len() {
                return Ok(None);
            }
            (data, 0, shape[..k].into())
        };
    let index_shape: TVec<TDim> = if node.op_is::<GatherNd>() {
        index_fact.shape[..index_fact.rank() - 1].into()
    } else {
        index_fact.shape.to_tvec()
    };
    // Each gathered axis is read at the coordinate of the index axis of its extent.
    let mut axes: TVec<usize> = tvec!();
    for d in &dims {
        let along: Vec<usize> = (0..index_shape.len())
            .filter(|a| index_shape[*a] == *d && !d.is_one())
            .collect();
        match along.as_slice() {
            [a] if axes.last().is_none_or(|last| a > last) => axes.push(*a),
            _ => return Ok(None),
        }
    }
    let found = OwnCoordinates {
        source,
        first,
        axes,
        index_shape,
    };
    Ok(
        reads_own_coordinates(model, indices, &dims, &found, node.op_is::<GatherNd>())?
            .then_some(found),
    )
}

/// `data`'s axis `axis` as a flattening of axes of the tensor before it: that tensor, the
/// first flattened axis and their extents. Unit axes added or removed after the
/// flattened one (a `Flatten` to 2-D; dynamo's `as_strided` of a pooled `[N, C, 1, 1]`
/// viewed as `[N*C]`) are looked through.
fn flattened(
    model: &TypedModel,
    data: OutletId,
    axis: usize,
) -> TractResult<Option<(OutletId, usize, TVec<TDim>)>> {
    let mut outlet = data;
    loop {
        let node = model.node(outlet.node);
        match node.op_as::<AxisOp>() {
            Some(AxisOp::Add(added)) if *added > axis => outlet = node.inputs[0],
            Some(AxisOp::Rm(removed)) if *removed > axis => outlet = node.inputs[0],
            Some(AxisOp::Reshape(at, from, to))
                if *at == axis && to.len() == 1 && from.len() > 1 =>
            {
                let fact = model.outlet_fact(node.inputs[0])?;
                // Only a reshape of the whole tail after `at` into one axis, or of axes
                // followed by nothing else unknown: the axes after it stay.
                if fact.rank() != model.outlet_fact(outlet)?.rank() + from.len() - 1 {
                    return Ok(None);
                }
                return Ok(Some((node.inputs[0], *at, from.clone())));
            }
            _ => return Ok(None),
        }
    }
}

/// The symbol values the indices are checked at: distinct, so that strides of different
/// extents differ, and small, so that the check is cheap.
const CHECKED_AT: [[i64; 3]; 3] = [[3, 5, 7], [2, 9, 4], [1, 1, 2]];

/// Whether `indices` hold, at every position, the coordinates of `found.axes` (flattened
/// along `dims` for a `Gather`, stacked along the last axis for a `GatherND`), at each of
/// the checked extents.
fn reads_own_coordinates(
    model: &TypedModel,
    indices: OutletId,
    dims: &[TDim],
    found: &OwnCoordinates,
    nd: bool,
) -> TractResult<bool> {
    let mut symbols: Vec<Symbol> = vec![];
    for d in dims.iter().chain(found.index_shape.iter()) {
        for s in d.symbols() {
            if !symbols.contains(&s) {
                symbols.push(s);
            }
        }
    }
    if symbols.len() > CHECKED_AT[0].len() {
        return Ok(false);
    }
    for values in CHECKED_AT {
        let mut bound = SymbolValues::default();
        for (s, v) in symbols.iter().zip(values) {
            bound.set(s, v);
        }
        let Ok(value) = evaluate(model, indices, &bound) else {
            return Ok(false);
        };
        let value = value.cast_to::<i64>()?.into_owned();
        let extents: TVec<i64> = dims
            .iter()
            .map(|d| Ok(d.eval(&bound).to_i64()?))
            .collect::<TractResult<_>>()?;
        let shape: TVec<usize> = found
            .index_shape
            .iter()
            .map(|d| Ok(d.eval(&bound).to_usize()?))
            .collect::<TractResult<_>>()?;
        let expected_shape: TVec<usize> = if nd {
            shape.iter().copied().chain([dims.len()]).collect()
        } else {
            shape.clone()
        };
        if value.shape() != expected_shape.as_slice() {
            return Ok(false);
        }
        let value = value.to_plain_array_view::<i64>()?;
        for (position, v) in value.indexed_iter() {
            let coords = tract_core::ndarray::Dimension::slice(&position);
            let ok = if nd {
                let (at, t) = coords.split_at(coords.len() - 1);
                *v == at[found.axes[t[0]]] as i64
            } else {
                let flat = found
                    .axes
                    .iter()
                    .zip(&extents)
                    .fold(0i64, |flat, (a, extent)| flat * extent + coords[*a] as i64);
                *v == flat
            };
            if !ok {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// The patch replacing `node` by the broadcast of `found.source` it computes.
fn as_broadcast(
    model: &TypedModel,
    node: &TypedNode,
    found: &OwnCoordinates,
) -> TractResult<TypedModelPatch> {
    let mut patch = TypedModelPatch::default();
    let mut wire = patch.tap_model(model, found.source)?;
    // The gathered axes, at `first..first + k`, go to the index axes they are read at;
    // the other index axes come in as unit axes, then broadcast.
    for axis in 0..found.index_shape.len() {
        if !found.axes.contains(&axis) {
            wire = patch.wire_node(
                format!("{}.axis_{axis}", node.name),
                AxisOp::Add(found.first + axis),
                &[wire],
            )?[0];
        }
    }
    let output = model.outlet_fact(OutletId::new(node.id, 0))?.clone();
    let have = patch.outlet_fact(wire)?.shape.to_tvec();
    let tail = found.first + found.index_shape.len();
    if have.len() != output.rank() && tail <= have.len() && tail <= output.rank() {
        // The axes after the gathered ones differ by unit axes (a flatten to 2-D added
        // one): the tail made the gather's.
        if have.len() == tail {
            for axis in tail..output.rank() {
                wire = patch.wire_node(
                    format!("{}.tail_{axis}", node.name),
                    AxisOp::Add(axis),
                    &[wire],
                )?[0];
            }
        } else {
            wire = patch.wire_node(
                format!("{}.tail", node.name),
                AxisOp::Reshape(tail, have[tail..].into(), output.shape[tail..].into()),
                &[wire],
            )?[0];
        }
    }
    if patch.outlet_fact(wire)?.shape != output.shape {
        wire = patch.wire_node(
            format!("{}.broadcast", node.name),
            MultiBroadcastTo::new(output.shape.clone()),
            &[wire],
        )?[0];
    }
    patch.shunt_outside(model, OutletId::new(node.id, 0), wire)?;
    Ok(patch)
}
