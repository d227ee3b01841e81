//! The ragged transform as tract finds it (`tract_core::transform`, as tract's CLI does
//! for `-t 'ragged(...)'`), its parameters in tract's RON syntax: the transformed model
//! keeps the original's inputs, answers the widths itself, and computes for each sample
//! what the sample alone computes.

use crate::common::models::{ConvLayer, conv_stack};
use crate::common::onnx::Rng;
use crate::common::{max_abs, samples, typed};
use tract_core::internal::*;
use tract_core::transform::{ModelTransform, get_transform_with_params};

/// The `ragged` transform tract's registry builds from `params` (RON, as after the name).
fn transform(params: &str) -> TractResult<Box<dyn ModelTransform>> {
    let mut de = ron::Deserializer::from_str(params)?;
    get_transform_with_params(
        "ragged",
        &mut <dyn erased_serde::Deserializer>::erase(&mut de),
    )?
    .context("no transform named ragged")
}

fn model() -> (tract_onnx::pb::ModelProto, usize) {
    let layer = |kw, stride| ConvLayer {
        kw,
        kh: 3,
        stride,
        pads: (1, 1),
        dilation: 1,
        depthwise: false,
        same: false,
        out: 4,
    };
    conv_stack(&mut Rng(3), 2, &[layer(3, 1), layer(3, 2)])
}

#[test]
fn given_widths_give_each_sample_what_it_gets_alone() -> TractResult<()> {
    let (proto, _) = model();
    let original = typed(&proto, "N,2,5,W,f32")?;
    let mut ragged = original.clone();
    transform(r#"(input: "x", axis: 3, widths: [7, 20, 13])"#)?.transform(&mut ragged)?;
    // The original's one input, the batch set to the widths' count.
    assert_eq!(ragged.inputs.len(), 1);
    assert_eq!(ragged.input_fact(0)?.shape[0], 3.to_dim());
    let lines = samples(&mut Rng(4), &[2, 5, 1], 2, &[7, 20, 13]);
    // The batch padded to 20 columns, zeros beyond each width.
    let rows: Vec<Tensor> = lines
        .iter()
        .map(|line| {
            let w = line.shape()[2];
            let mut row = Tensor::zero::<f32>(&[1, 2, 5, 20])?;
            row.assign_slice(0..w, &line.clone().into_shape(&[1, 2, 5, w])?, 0..w, 3)?;
            Ok(row)
        })
        .collect::<TractResult<_>>()?;
    let padded = Tensor::stack_tensors(0, &rows)?;
    let batched = ragged.into_runnable()?.run(tvec!(padded.into_tvalue()))?;
    let alone = original.into_runnable()?;
    for (k, line) in lines.iter().enumerate() {
        let w = line.shape()[2];
        let expected = alone.run(tvec!(line.clone().into_shape(&[1, 2, 5, w])?.into_tvalue()))?;
        let ow = expected[0].shape()[3];
        let found = batched[0].slice(0, k, k + 1)?.slice(3, 0, ow)?;
        let d = max_abs(&found, &expected[0].clone().into_tensor());
        assert!(d <= 1e-5, "sample {k}: {d:e}");
    }
    Ok(())
}

#[test]
fn without_widths_every_sample_is_as_wide_as_the_input() -> TractResult<()> {
    let (proto, _) = model();
    let original = typed(&proto, "N,2,5,W,f32")?;
    let mut ragged = original.clone();
    transform(r#"(axis: 3, full: true)"#)?.transform(&mut ragged)?;
    assert_eq!(ragged.inputs.len(), 1);
    let x = samples(&mut Rng(5), &[2, 2, 5, 1], 3, &[17]).remove(0);
    let found = ragged
        .into_runnable()?
        .run(tvec!(x.clone().into_tvalue()))?;
    let expected = original.into_runnable()?.run(tvec!(x.into_tvalue()))?;
    let d = max_abs(
        &found[0].clone().into_tensor(),
        &expected[0].clone().into_tensor(),
    );
    assert!(d <= 1e-5, "{d:e}");
    Ok(())
}

#[test]
fn bad_parameters_say_what_to_give() {
    for (params, says) in [
        ("(input: \"x\")", "which axis"),
        ("(axis: 0)", "which axis"),
        ("(axes: [0, 3])", "batch axis"),
        ("(axis: 3, axes: [2])", "not both"),
        ("(axis: 3, widths: [0, 4])", "at least 1"),
        ("(axes: [2, 0])", "batch axis"),
        ("(axes: [2, 3], widths: [4])", "one ragged axis"),
        ("(axis: 3, width: [4])", "width"),
        ("(axis: 3, widths: [4], full: true)", "not both"),
    ] {
        let err = match transform(params) {
            Ok(_) => panic!("{params}: accepted"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.contains(says), "{params}: {err}");
    }
}
