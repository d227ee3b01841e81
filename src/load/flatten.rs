//! ONNX's `Flatten` typed over any number of symbols.
//!
//! tract-hir's `Flatten` refuses an input with more than one symbolic dim ("Can not
//! compute a shape with square of symbols"), even where the product is plain: every
//! transformers encoder that torch's TorchScript exporter writes flattens a `[N, L]` or
//! `[N, L, H]` tensor, and failed to type over `N` and `L` for it. This loader is tract's
//! own op without that check: its two dims are the products of the dims before and from
//! the axis, which tract's dims represent whatever symbols they hold.

use tract_onnx::model::{OnnxOpRegister, ParsingContext};
use tract_onnx::pb::NodeProto;
use tract_onnx::tract_hir::internal::*;
use tract_onnx::tract_hir::ops::expandable::expand;

/// Registers the loader for Flatten nodes.
pub fn register(register: &mut OnnxOpRegister) {
    register.insert("Flatten", load);
}

fn load(
    _ctx: &ParsingContext,
    node: &NodeProto,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    let axis: i64 = node.get_attr_opt("axis")?.unwrap_or(1);
    Ok((expand(Flatten { axis }), vec![]))
}

#[derive(Debug, Clone, Hash, PartialEq, Eq)]
struct Flatten {
    axis: i64,
}

impl Flatten {
    fn compute_shape<D: DimLike>(&self, shape: &[D]) -> TractResult<[D; 2]> {
        let rank = shape.len() as i64;
        let axis = if self.axis >= 0 {
            self.axis
        } else {
            self.axis + rank
        };
        ensure!(
            (0..=rank).contains(&axis),
            "Flatten axis {} out of range for rank {rank}",
            self.axis
        );
        let axis = axis as usize;
        Ok([
            shape[..axis].iter().cloned().product::<D>(),
            shape[axis..].iter().cloned().product(),
        ])
    }
}

impl Expansion for Flatten {
    fn name(&self) -> StaticName {
        "Flatten".into()
    }

    fn rules<'r, 'p: 'r, 's: 'r>(
        &'s self,
        s: &mut Solver<'r>,
        inputs: &'p [TensorProxy],
        outputs: &'p [TensorProxy],
    ) -> InferenceResult {
        check_input_arity(inputs, 1)?;
        check_output_arity(outputs, 1)?;
        s.equals(&outputs[0].datum_type, &inputs[0].datum_type)?;
        s.given(&inputs[0].shape, move |s, shape| {
            let [before, after] = self.compute_shape(&shape)?;
            s.equals(&outputs[0].shape, ShapeFactoid::from(vec![before, after]))
        })
    }

    fn wire(
        &self,
        prefix: &str,
        model: &mut TypedModel,
        inputs: &[OutletId],
    ) -> TractResult<TVec<OutletId>> {
        let input_shape = model.outlet_fact(inputs[0])?.shape.to_tvec();
        let output_shape = self.compute_shape(&input_shape)?;
        let mut wire = tvec!(inputs[0]);
        for (ix, op) in
            tract_core::ops::change_axes::to_axis_ops_with_tf_rules(&input_shape, &output_shape)?
                .into_iter()
                .enumerate()
        {
            wire = model.wire_node(format!("{prefix}.{ix}"), op, &wire)?;
        }
        Ok(wire)
    }
}
