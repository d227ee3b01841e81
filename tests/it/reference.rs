//! The reference (`tract_ragged::Reference`) runs models the ragged transform refuses,
//! each sample alone, as tract's own loader and optimiser run it at the sample's shape.

use crate::common::models::conv_then;
use crate::common::onnx::{Graph, Rng, int, ints};
use crate::common::{max_abs, plain_tract, samples};
use tract_core::runtime::DefaultRuntime;
use tract_onnx::pb;
use tract_ragged::prelude::*;
use tract_ragged::{Reference, load};

fn model(tail: impl Fn(&mut Graph, &str) -> String) -> pb::ModelProto {
    conv_then(&mut Rng(5), tail)
}

fn reference(proto: &pb::ModelProto) -> TractResult<Reference> {
    let onnx = load::from_proto(proto.clone(), None, Some("N,2,3,W,f32"))?;
    Reference::new(onnx.model, 0, &DefaultRuntime)
}

#[test]
fn a_model_the_transform_refuses_runs_alone_as_plain_tract() -> TractResult<()> {
    let proto = model(|g, x| g.op("Flatten", &[x], vec![int("axis", 1)]));
    let refused = load::ragged_model(
        load::from_proto(proto.clone(), None, Some("N,2,3,W,f32"))?,
        RaggedSpec::new("x", 3),
    );
    assert!(refused.is_err(), "the transform took a flatten of C with W");
    let reference = reference(&proto)?;
    for sample in samples(&mut Rng(9), &[2, 3, 1], 2, &[5, 11, 5, 1]) {
        let alone = reference.run(std::slice::from_ref(&sample))?;
        let mut expected = plain_tract(&proto, &sample)?;
        expected.remove_axis(0)?;
        assert_eq!(alone[0].shape(), expected.shape());
        assert_eq!(alone[0].shape(), &[2 * 3 * sample.shape()[2]]);
        assert!(max_abs(&alone[0], &expected) <= 1e-6);
    }
    Ok(())
}

/// An output whose batch axis is not its first loses that axis, wherever it is.
#[test]
fn outputs_lose_their_batch_axis_where_it_lies() -> TractResult<()> {
    let proto = model(|g, x| {
        let f = g.op("Flatten", &[x], vec![int("axis", 1)]);
        g.op("Transpose", &[&f], vec![ints("perm", &[1, 0])])
    });
    let reference = reference(&proto)?;
    for sample in samples(&mut Rng(3), &[2, 3, 1], 2, &[4, 7]) {
        let alone = reference.run(std::slice::from_ref(&sample))?;
        let mut expected = plain_tract(&proto, &sample)?;
        assert_eq!(expected.shape()[1], 1);
        expected.remove_axis(1)?;
        assert_eq!(alone[0].shape(), expected.shape());
        assert!(max_abs(&alone[0], &expected) <= 1e-6);
    }
    Ok(())
}

/// What tract cannot run alone is tract's error, at the sample at fault.
#[test]
fn a_sample_tract_cannot_run_is_an_error() -> TractResult<()> {
    let reference = reference(&model(|g, x| g.op("Flatten", &[x], vec![int("axis", 1)])))?;
    let wrong = Tensor::zero::<f32>(&[3, 3, 4])?;
    let e = reference.run(&[wrong]).unwrap_err();
    assert!(
        format!("{e:#}").contains("Typing the model at 1,3,3,4"),
        "{e:#}"
    );
    // The reference stays usable.
    let good = Tensor::zero::<f32>(&[2, 3, 4])?;
    assert_eq!(reference.run(&[good])?[0].shape(), &[24]);
    Ok(())
}
