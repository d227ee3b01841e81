//! ONNX's `ConstantOfShape` without a `value`: float32 zeros, as the standard says.
//!
//! tract-onnx takes a missing `value` as an f64 zero. torch's dynamo exporter writes
//! `new_zeros` of a float tensor so (Swin's shifted-window mask) and declares the output
//! float32; typing then fails (`Impossible to unify F32 with F64`) where ONNX Runtime runs
//! the model. This loader is tract's own op, with the standard's default.

use tract_onnx::model::{OnnxOpRegister, ParsingContext};
use tract_onnx::pb::NodeProto;
use tract_onnx::tract_hir::internal::*;
use tract_onnx::tract_hir::ops::array::ConstantOfShape;
use tract_onnx::tract_hir::ops::expandable::expand;

/// Registers the loader for ConstantOfShape nodes.
pub fn register(register: &mut OnnxOpRegister) {
    register.insert("ConstantOfShape", load);
}

fn load(
    ctx: &ParsingContext,
    node: &NodeProto,
) -> TractResult<(Box<dyn InferenceOp>, Vec<String>)> {
    let mut value = match node.get_attr_opt("value")? {
        Some(val) => ctx.load_tensor(val)?.into_arc_tensor(),
        None => rctensor0(0.0f32),
    };
    if value.rank() > 0 {
        ensure!(
            value.len() == 1,
            "ConstantOfShape {:?}: its value has {} elements, where one is expected",
            node.name,
            value.len()
        );
        value = value.nth(0)?.into_arc_tensor();
    }
    Ok((expand(ConstantOfShape::new(value)), vec![]))
}
