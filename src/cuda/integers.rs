//! Integers tract computes as `TDim`, computed as `i64` on the device.
//!
//! tract types some integer values of an exported model as `TDim` (symbolic dimensions)
//! rather than `i64`: a `Cast` to int64 of a value it tracks as a dimension, and what is
//! computed from it. Transformers' position arithmetic is full of them: RoBERTa's and
//! MPNet's position ids (a cumulative sum of the attention mask, plus the padding index),
//! MPNet's and DeBERTa's relative positions (clamped differences and their buckets).
//! tract-cuda holds no `TDim` tensor, so each such node stayed on the host between two
//! syncs (`benches/gpu.sh`'s `zoohost` step named them).
//!
//! In a plan's model every dimension is known: a `TDim` computed there is an integer, and
//! the ops that compute them (adds, products, minima and maxima, negations, casts, moves
//! of axes, broadcasts, selections) give on `i64` what they give on `TDim`. So, before
//! tract-cuda's transform, every `Cast` to `TDim` becomes a cast to `i64`, every `TDim`
//! constant such a value meets becomes its `i64` value, and the rest follows from the
//! facts. A division or a remainder (`TDim`'s floor where `i64`'s truncates towards zero),
//! an op not known to compute alike, or a constant that is still symbolic leaves the model
//! as it was: its nodes then stay on the host, as before, never computed otherwise.

use tract_core::internal::*;
use tract_core::ops::array::{Gather, GatherElements, MultiBroadcastTo, Slice, Tile, TypedConcat};
use tract_core::ops::binary::TypedBinOp;
use tract_core::ops::cast::Cast;
use tract_core::ops::element_wise::ElementWiseOp;
use tract_core::ops::konst::Const;
use tract_core::ops::logic::Iff;

/// Rewrites the `TDim` values a plan's model computes as `i64` (module doc); how many
/// nodes compute `i64` now. Leaves the model as it was, answering 0, where that would not
/// compute the same.
pub fn dims_as_i64(model: &mut TypedModel) -> TractResult<usize> {
    let mut rewritten = model.clone();
    match rewrite(&mut rewritten) {
        Ok(0) => Ok(0),
        Ok(done) => {
            *model = rewritten;
            Ok(done)
        }
        Err(e) => {
            log::debug!("ragged-cuda: TDim values stay on the host: {e:#}");
            Ok(0)
        }
    }
}

/// Whether `node`, reading and making integers, computes on `i64` what it computes on
/// `TDim` (module doc).
fn computes_alike(node: &TypedNode) -> bool {
    if let Some(bin) = node.op_as::<TypedBinOp>() {
        return matches!(bin.0.name(), "Add" | "Sub" | "Mul" | "Max" | "Min");
    }
    if let Some(ew) = node.op_as::<ElementWiseOp>() {
        return matches!(&*ew.0.name(), "Neg" | "Abs" | "Sign");
    }
    node.op_is::<Cast>()
        || node.op_is::<AxisOp>()
        || node.op_is::<MultiBroadcastTo>()
        || node.op_is::<Iff>()
        || node.op_is::<Slice>()
        || node.op_is::<TypedConcat>()
        || node.op_is::<Tile>()
        || node.op_is::<Gather>()
        || node.op_is::<GatherElements>()
}

fn rewrite(model: &mut TypedModel) -> TractResult<usize> {
    let dim = TDim::datum_type();
    let order = model.eval_order()?;
    // The nodes computing TDim values: each becomes one computing i64.
    let mut computed = std::collections::HashSet::new();
    for &id in &order {
        let node = model.node(id);
        if node.op_is::<Const>() || !node.outputs.iter().any(|o| o.fact.datum_type == dim) {
            continue;
        }
        ensure!(
            computes_alike(node),
            "{} ({}) computes TDim values",
            node.name,
            node.op.name()
        );
        computed.insert(id);
    }
    if computed.is_empty() {
        return Ok(0);
    }
    for &id in &order {
        let node = model.node(id);
        let reads_computed = node.inputs.iter().any(|i| computed.contains(&i.node));
        if !computed.contains(&id) && !reads_computed {
            continue;
        }
        // The TDim constants it reads, as i64 (each reader its own: a constant may have
        // readers left on TDim).
        for (slot, input) in node.inputs.clone().into_iter().enumerate() {
            let Some(k) = model.node(input.node).op_as::<Const>() else {
                continue;
            };
            if k.val().datum_type() != dim {
                continue;
            }
            let value = k
                .val()
                .cast_to::<i64>()
                .with_context(|| format!("{}: a symbolic constant", model.node(input.node).name))?
                .into_owned();
            let name = model.unique_name(format!("{}.i64", model.node(input.node).name));
            let konst = model.add_const(name, value)?;
            model.add_edge(konst, InletId::new(id, slot))?;
        }
        if model
            .node(id)
            .op_as::<Cast>()
            .is_some_and(|cast| cast.to == dim)
        {
            model.node_mut(id).op = Box::new(Cast {
                to: i64::datum_type(),
            });
        }
    }
    model.refresh_output_facts()?;
    // The TDim constants no node reads any more.
    model.compact()?;
    for node in model.nodes() {
        ensure!(
            node.op_is::<Const>() || node.outputs.iter().all(|o| o.fact.datum_type != dim),
            "{} ({}) still computes TDim values",
            node.name,
            node.op.name()
        );
    }
    Ok(computed.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tract_core::ops::math;

    /// `x` (i32 `[2, 6]`) cast to TDim, as tract reads an int64 cast, through `body`,
    /// cast to i64.
    fn through_tdim(
        body: impl Fn(&mut TypedModel, OutletId) -> TractResult<OutletId>,
    ) -> TractResult<TypedModel> {
        let mut model = TypedModel::default();
        let x = model.add_source("x", i32::fact([2, 6]))?;
        let dims = model.wire_node(
            "ids",
            Cast {
                to: TDim::datum_type(),
            },
            &[x],
        )?[0];
        let y = body(&mut model, dims)?;
        let out = model.wire_node(
            "out",
            Cast {
                to: i64::datum_type(),
            },
            &[y],
        )?[0];
        model.select_output_outlets(&[out])?;
        Ok(model)
    }

    /// Position ids as RoBERTa's export computes them: a mask cast to int, summed along the
    /// sequence, cast to int64 (a TDim for tract), the padding index added, then relative
    /// positions negated and clamped.
    fn positions() -> TractResult<TypedModel> {
        through_tdim(|model, ids| {
            let one = model.add_const("one", tensor2(&[[TDim::from(1)]]))?;
            let ids = model.wire_node("plus_one", math::add(), &[ids, one])?[0];
            let neg = model.wire_node("neg", math::neg(), &[ids])?[0];
            let low = model.add_const("low", tensor2(&[[TDim::from(-4)]]))?;
            Ok(model.wire_node("clamp", math::max(), &[neg, low])?[0])
        })
    }

    fn run(model: TypedModel) -> TractResult<Tensor> {
        let x = tensor2(&[[0i32, 1, 2, 3, 4, 5], [7, -3, 2, 0, 9, 1]]);
        Ok(model
            .into_runnable()?
            .run(tvec!(x.into_tvalue()))?
            .remove(0)
            .into_tensor())
    }

    #[test]
    fn positions_computed_as_tdim_give_the_same_as_i64() -> TractResult<()> {
        let model = positions()?;
        let before = run(model.clone())?;
        let mut after = model;
        assert_eq!(dims_as_i64(&mut after)?, 4);
        for node in after.nodes() {
            for o in &node.outputs {
                assert_ne!(o.fact.datum_type, TDim::datum_type(), "{}", node.name);
            }
        }
        assert_eq!(run(after)?, before);
        Ok(())
    }

    #[test]
    fn a_division_of_tdim_values_is_left_alone() -> TractResult<()> {
        let mut model = through_tdim(|model, ids| {
            let two = model.add_const("two", tensor2(&[[TDim::from(2)]]))?;
            Ok(model.wire_node("half", math::div(), &[ids, two])?[0])
        })?;
        let before = format!("{model}");
        assert_eq!(dims_as_i64(&mut model)?, 0);
        assert_eq!(format!("{model}"), before);
        Ok(())
    }
}
