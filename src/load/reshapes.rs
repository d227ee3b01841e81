//! Axes merged and split back: no reshape at all.
//!
//! torch's dynamo exporter writes a transpose of attention's keys through 3-D views:
//! `[N, H, L, D]` reshaped to `[N*H, L, D]`, transposed to `[N*H, D, L]`, reshaped back to
//! `[N, H, D, L]`. The merged `N*H` axis holds the batch: the ragged transform cannot follow
//! samples through it, though nothing between the two reshapes touches it. Such a pair,
//! with only axis moves, additions and removals of other axes between them, is rewritten
//! as those axis ops on the unmerged tensor, which every later pass follows axis by axis.

use tract_core::internal::*;

/// Rewrites every merge of axes split back the same way as the axis ops between them;
/// how many were.
pub fn merges_split_back(model: &mut TypedModel) -> TractResult<usize> {
    let mut done = 0;
    loop {
        let mut found = None;
        for id in model.eval_order()? {
            if let Some(chain) = merged_then_split(model, id)? {
                found = Some(chain);
                break;
            }
        }
        let Some(chain) = found else {
            return Ok(done);
        };
        unmerged(model, &chain)?.apply(model)?;
        done += 1;
    }
}

/// A merge (`first`, a reshape of `dims` at `at` into one axis), the axis ops after it
/// (`between`, each the only consumer of the one before) and the reshape splitting the
/// merged axis back into `dims` (`last`).
struct Chain {
    first: usize,
    at: usize,
    dims: TVec<TDim>,
    between: Vec<usize>,
    last: usize,
}

fn merged_then_split(model: &TypedModel, id: usize) -> TractResult<Option<Chain>> {
    let node = model.node(id);
    let Some(AxisOp::Reshape(at, from, to)) = node.op_as::<AxisOp>() else {
        return Ok(None);
    };
    if to.len() != 1 || from.len() < 2 {
        return Ok(None);
    }
    let mut position = *at;
    let mut rank = model.outlet_fact(OutletId::new(id, 0))?.rank();
    let mut between = vec![];
    let mut current = id;
    loop {
        let Some(next) = model.single_succ(current)? else {
            return Ok(None);
        };
        if model.node(current).outputs[0].successors.len() != 1
            || model.output_outlets()?.contains(&OutletId::new(current, 0))
        {
            return Ok(None);
        }
        match next.op_as::<AxisOp>() {
            Some(AxisOp::Reshape(at, f, t)) if *at == position && f.len() == 1 && t == from => {
                return Ok(Some(Chain {
                    first: id,
                    at: *at,
                    dims: from.clone(),
                    between,
                    last: next.id,
                }));
            }
            Some(op @ (AxisOp::Move(..) | AxisOp::Add(..) | AxisOp::Rm(..))) => {
                let Some(moved) = follow(op, position, rank) else {
                    return Ok(None);
                };
                position = moved;
                rank = model.outlet_fact(OutletId::new(next.id, 0))?.rank();
                between.push(next.id);
                current = next.id;
            }
            _ => return Ok(None),
        }
    }
}

/// Where `op` takes the axis at `position` (of a tensor of `rank`), `None` when it moves
/// or removes that axis itself.
fn follow(op: &AxisOp, position: usize, rank: usize) -> Option<usize> {
    let mut axes: Vec<bool> = (0..rank).map(|a| a == position).collect();
    match op {
        AxisOp::Add(a) => axes.insert(*a, false),
        AxisOp::Rm(a) => {
            if *a == position {
                return None;
            }
            axes.remove(*a);
        }
        AxisOp::Move(from, to) => {
            if *from == position {
                return None;
            }
            let moved = axes.remove(*from);
            axes.insert(*to, moved);
        }
        AxisOp::Reshape(..) => return None,
    }
    axes.iter().position(|is| *is)
}

/// The chain's axis ops on the unmerged tensor, its last output taken over.
fn unmerged(model: &TypedModel, chain: &Chain) -> TractResult<TypedModelPatch> {
    let mut patch = TypedModelPatch::default();
    let first = model.node(chain.first);
    let mut wire = patch.tap_model(model, first.inputs[0])?;
    // The axes of the merged-space tensor, each as its extent in unmerged axes.
    let k = chain.dims.len();
    let mut widths: Vec<usize> = (0..model.outlet_fact(OutletId::new(chain.first, 0))?.rank())
        .map(|a| if a == chain.at { k } else { 1 })
        .collect();
    let start = |widths: &[usize], axis: usize| widths[..axis].iter().sum::<usize>();
    for &id in &chain.between {
        let node = model.node(id);
        let op = node.op_as::<AxisOp>().context("an axis op")?;
        let op = match op {
            AxisOp::Add(a) => {
                let at = start(&widths, *a);
                widths.insert(*a, 1);
                AxisOp::Add(at)
            }
            AxisOp::Rm(a) => {
                let at = start(&widths, *a);
                widths.remove(*a);
                AxisOp::Rm(at)
            }
            AxisOp::Move(from, to) => {
                let at = start(&widths, *from);
                let w = widths.remove(*from);
                widths.insert(*to, w);
                AxisOp::Move(at, start(&widths, *to))
            }
            AxisOp::Reshape(..) => bail!("a reshape between the merge and the split"),
        };
        wire = patch.wire_node(&node.name, op, &[wire])?[0];
    }
    let expected = &model.outlet_fact(OutletId::new(chain.last, 0))?.shape;
    ensure!(
        patch.outlet_fact(wire)?.shape == *expected,
        "the unmerged chain gives {:?}, not {:?}",
        patch.outlet_fact(wire)?.shape,
        expected
    );
    patch.shunt_outside(model, OutletId::new(chain.last, 0), wire)?;
    Ok(patch)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// dynamo's keys transpose: `[N, 4, L, 3]` to `[4N, L, 3]`, axes 1 and 2 swapped, back
    /// to `[N, 4, 3, L]`: one move of axes 2 and 3, the same values.
    #[test]
    fn a_transpose_through_merged_batch_and_heads_is_a_move() -> TractResult<()> {
        let mut model = TypedModel::default();
        let n = model.symbols.sym("N");
        let l = model.symbols.sym("L");
        let fact = f32::fact([n.to_dim(), 4.to_dim(), l.to_dim(), 3.to_dim()]);
        let x = model.add_source("x", fact)?;
        let nh = n.to_dim() * 4;
        let merged = model.wire_node(
            "merge",
            AxisOp::Reshape(0, tvec!(n.to_dim(), 4.to_dim()), tvec!(nh.clone())),
            &[x],
        )?[0];
        let moved = model.wire_node("move", AxisOp::Move(1, 2), &[merged])?[0];
        let split = model.wire_node(
            "split",
            AxisOp::Reshape(0, tvec!(nh), tvec!(n.to_dim(), 4.to_dim())),
            &[moved],
        )?[0];
        model.select_output_outlets(&[split])?;
        let before = model.clone();
        assert_eq!(merges_split_back(&mut model)?, 1);
        let model = model.into_decluttered()?;
        assert!(
            model
                .nodes
                .iter()
                .all(|n| !matches!(n.op_as::<AxisOp>(), Some(AxisOp::Reshape(..)))),
            "{model}"
        );
        let input = Tensor::from_shape(
            &[2, 4, 5, 3],
            &(0..120).map(|v| v as f32).collect::<Vec<_>>(),
        )?;
        let expected = before
            .into_runnable()?
            .run(tvec!(input.clone().into_tvalue()))?;
        let found = model.into_runnable()?.run(tvec!(input.into_tvalue()))?;
        assert_eq!(found[0], expected[0]);
        Ok(())
    }
}
