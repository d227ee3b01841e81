//! Resizes of a single pixel, as broadcasts.
//!
//! DeepLabV3's image-pooling branch averages the feature map to one pixel, convolves it,
//! and resizes it back to the map's size (`[N, C, 1, 1]` to `[N, C, H, W]`, bilinear)
//! before the branches are concatenated. The resize reads its sizes from the padded map,
//! which the ragged transform cannot follow; and resampling one pixel gives it at every
//! position, as a broadcast does, with no dependence on the size resized to. Such a
//! resize (linear or nearest, every resized axis of extent one) is rewritten as a
//! `MultiBroadcastTo` of the output's shape, which the transform carries per sample.
//!
//! A bilinear resize of one pixel computes `x * (1 - t) + x * t` at weights `t` that
//! depend on the size resized to, which may round `x` by an ulp; the broadcast gives `x`,
//! the same for a sample batched and alone.

use tract_core::internal::*;
use tract_core::ops::array::MultiBroadcastTo;
use tract_core::ops::nn::resize::{Interpolator, Resize};

/// Rewrites every resize of a single pixel as a broadcast; how many were.
pub fn single_pixel_resizes(model: &mut TypedModel) -> TractResult<usize> {
    let mut done = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        let interpolator = if let Some(op) = node.op_as::<Resize>() {
            Some(&op.interpolator)
        } else if let Some(op) = node.op_as::<tract_onnx_opl::resize::Resize>() {
            (!op.antialias).then_some(&op.interpolator)
        } else {
            None
        };
        if !matches!(
            interpolator,
            Some(Interpolator::Linear | Interpolator::Nearest)
        ) {
            continue;
        }
        let input = model.outlet_fact(node.inputs[0])?;
        let output = model.outlet_fact(OutletId::new(id, 0))?;
        let one_pixel = input.rank() == output.rank()
            && input
                .shape
                .iter()
                .zip(output.shape.iter())
                .all(|(i, o)| i == o || i.is_one());
        if !one_pixel || input.datum_type != output.datum_type {
            continue;
        }
        let shape = output.shape.clone();
        let mut patch = TypedModelPatch::default();
        let wire = patch.tap_model(model, node.inputs[0])?;
        let wire = patch.wire_node(
            format!("{}.broadcast", node.name),
            MultiBroadcastTo::new(shape),
            &[wire],
        )?[0];
        patch.shunt_outside(model, OutletId::new(id, 0), wire)?;
        patch.apply(model)?;
        done += 1;
    }
    Ok(done)
}
