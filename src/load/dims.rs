//! Ops on shape values that tract types but cannot evaluate.
//!
//! tract carries values computed from shapes as `TDim` tensors, so that they stay
//! symbolic through typing. Most ops evaluate on them; `CumSum` does not ("TDim is not a
//! number": it sums numbers only). torch's dynamo exporter writes one in RoBERTa's, XLM-R's
//! and MPNet's position ids (a cumulative sum of ones the size of the input), so those
//! models typed, then failed on their first run. [`cumsums_of_dims_in_i64`] runs such sums
//! in i64 between two casts: by the time a plan runs, every dim is a number.
//!
//! Typed over symbols, a value of one dim everywhere (the sequence length `L`, gathered
//! from a shape) is a "uniform" fact, and tract's declutter of a `Mul` casts a uniform
//! input to a float to test it for 0 or a power of two: on a symbol that fails
//! ("Undetermined symbol in expression: L") and stops the whole declutter. The attention
//! masks transformers 5 builds multiply positions by `L` so, in every encoder that the
//! TorchScript exporter writes. [`forget_symbolic_uniforms`] drops those facts' uniform
//! values (not the values themselves), which tract's rules only use to simplify.

use tract_core::internal::*;
use tract_core::ops::array::CumSum;
use tract_core::ops::cast::cast;

/// Rewrites every `CumSum` of a `TDim` tensor as a cast to i64, the sum, and a cast back.
/// Returns how many it rewrote.
pub fn cumsums_of_dims_in_i64(model: &mut TypedModel) -> TractResult<usize> {
    let nodes: Vec<usize> = model
        .nodes()
        .iter()
        .filter(|n| n.op_is::<CumSum>())
        .filter(|n| {
            n.inputs.first().is_some_and(|i| {
                model
                    .outlet_fact(*i)
                    .is_ok_and(|f| f.datum_type == TDim::datum_type())
            })
        })
        .map(|n| n.id)
        .collect();
    for &id in &nodes {
        let node = model.node(id).clone();
        let mut patch = TypedModelPatch::new(format!("CumSum {} in i64", node.name));
        let x = patch.tap_model(model, node.inputs[0])?;
        let x = patch.wire_node(format!("{}.i64", node.name), cast(i64::datum_type()), &[x])?;
        let y = patch.wire_node(&node.name, node.op.clone(), &x)?;
        let y = patch.wire_node(format!("{}.dims", node.name), cast(TDim::datum_type()), &y)?;
        patch.shunt_outside(model, id.into(), y[0])?;
        patch
            .apply(model)
            .with_context(|| format!("Rewriting CumSum {:?} in i64", node.name))?;
    }
    Ok(nodes.len())
}

/// Drops the uniform value of every fact whose value is one symbolic dim (see the module).
pub fn forget_symbolic_uniforms(model: &mut TypedModel) {
    for node in model.nodes.iter_mut() {
        for output in node.outputs.iter_mut() {
            if let Some(u) = &output.fact.uniform
                && u.datum_type() == TDim::datum_type()
                && u.cast_to_scalar::<i64>().is_err()
            {
                output.fact.uniform = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_product_by_a_symbolic_dim_declutters() -> TractResult<()> {
        let model = || -> TractResult<TypedModel> {
            let mut model = TypedModel::default();
            let l = model.symbols.sym("L");
            let x = model.add_source("x", TDim::datum_type().fact([l.to_dim()]))?;
            let k = model.add_const("l", tensor1(&[l.to_dim()]))?;
            let y = model.wire_node("mul", tract_core::ops::math::mul(), &[x, k])?;
            model.select_output_outlets(&y)?;
            Ok(model)
        };
        let e = model()?.into_decluttered().unwrap_err();
        assert!(format!("{e:#}").contains("Undetermined symbol"), "{e:#}");
        let mut model = model()?;
        forget_symbolic_uniforms(&mut model);
        model.into_decluttered()?;
        Ok(())
    }

    #[test]
    fn a_cumsum_of_dims_evaluates_and_keeps_its_type() -> TractResult<()> {
        let mut model = TypedModel::default();
        let x = model.add_source("x", TDim::datum_type().fact([4]))?;
        let op = CumSum {
            axis: 0,
            exclusive: false,
            reverse: false,
        };
        let y = model.wire_node("sum", op, &[x])?;
        model.select_output_outlets(&y)?;
        let input = tensor1(&[1i64, 2, 3, 4]).cast_to::<TDim>()?.into_owned();
        let plain = model.clone().into_runnable()?;
        assert!(plain.run(tvec!(input.clone().into_tvalue())).is_err());
        assert_eq!(cumsums_of_dims_in_i64(&mut model)?, 1);
        let out = model.into_runnable()?.run(tvec!(input.into_tvalue()))?;
        let expected = tensor1(&[1i64, 3, 6, 10]).cast_to::<TDim>()?.into_owned();
        assert_eq!(out[0].clone().into_tensor(), expected);
        Ok(())
    }
}
