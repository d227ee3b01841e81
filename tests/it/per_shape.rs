//! Models tract cannot type with a symbolic batch and width run too: typed and transformed
//! again for every batch size and padded width.

use crate::common::onnx::{Graph, Rng, int, ints};
use crate::common::{assert_exact, samples};
use tract_ragged::prelude::*;

fn model(rng: &mut Rng, global_pool: bool) -> tract_onnx::pb::ModelProto {
    let mut g = Graph::default();
    let w = g.weight(&[3, 2, 3, 3], rng.vec(54, 0.5));
    let x = g.op(
        "Conv",
        &["x", &w],
        vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
    );
    let x = g.op(
        "MaxPool",
        &[&x],
        vec![
            ints("kernel_shape", &[2, 2]),
            ints("strides", &[2, 2]),
            int("ceil_mode", 1),
        ],
    );
    let y = g.op("Softmax", &[&x], vec![int("axis", 3)]);
    if global_pool {
        let p = g.op("GlobalAveragePool", &[&y], vec![]);
        return g.model("x", 4, &[&y, &p]);
    }
    g.model("x", 4, &[&y])
}

#[test]
fn per_shape_models_are_exact() -> TractResult<()> {
    let mut rng = Rng(5);
    let proto = model(&mut rng, false);
    let onnx = tract_ragged::load::from_proto(proto, None, Some("N,2,4,W,f32"))?;
    let model = RaggedModel::per_shape(onnx.model, RaggedSpec::new(0, 3))?;
    assert!(!model.is_symbolic());
    let runnable = model.into_runnable()?;
    assert_exact(
        &runnable,
        &samples(&mut rng, &[2, 4, 1], 2, &[5, 17, 9, 30]),
        1e-5,
    )?;
    assert_exact(&runnable, &samples(&mut rng, &[2, 4, 1], 2, &[2, 3]), 1e-5)
}

#[test]
fn per_shape_models_divide_means_by_each_samples_count() -> TractResult<()> {
    // With a concrete width, a global average's divisor is the padded count, a number:
    // the transform replaces it by each sample's own count.
    let mut rng = Rng(5);
    let proto = model(&mut rng, true);
    let onnx = tract_ragged::load::from_proto(proto, None, Some("N,2,4,W,f32"))?;
    let model = RaggedModel::per_shape(onnx.model, RaggedSpec::new(0, 3))?;
    assert!(
        model
            .ragged
            .report
            .iter()
            .any(|r| r.node.starts_with("GlobalAveragePool")),
        "no mean in the model"
    );
    let runnable = model.into_runnable()?;
    assert_exact(
        &runnable,
        &samples(&mut rng, &[2, 4, 1], 2, &[5, 17, 9, 30]),
        1e-5,
    )
}
