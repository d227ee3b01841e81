//! Outputs reduced to their top k along the class axis (`RaggedModel::with_top_k`): each
//! sample's values and positions are the top k of what it gets alone, whole; batched
//! equal alone; on ragged-cuda, computed on the device.

#[cfg(feature = "cuda")]
use crate::common;
use crate::common::onnx::{Graph, Rng, int, ints};
use crate::common::{samples, typed};
use tract_core::internal::*;
use tract_ragged::prelude::*;

/// A conv over `[N, 2, 3, W]`, transposed to `[N, W, 3, C]`, a softmax over the C
/// classes (the last axis).
fn classifier(rng: &mut Rng, classes: usize) -> tract_onnx::pb::ModelProto {
    let mut g = Graph::default();
    let w = g.weight(&[classes, 2, 3, 3], rng.vec(classes * 18, 0.8));
    let x = g.op(
        "Conv",
        &["x", &w],
        vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
    );
    let t = g.op("Transpose", &[&x], vec![ints("perm", &[0, 3, 2, 1])]);
    let y = g.op("Softmax", &[&t], vec![int("axis", 3)]);
    g.model("x", 4, &[&y])
}

fn classifier_model(rng: &mut Rng, classes: usize) -> TractResult<RaggedModel> {
    RaggedModel::new(
        typed(&classifier(rng, classes), "N,2,3,W,f32")?,
        RaggedSpec::new(0, 3),
    )
}

/// The top `k` of each row of `probs` along its last axis, by sorting: values
/// descending, ties to the first.
fn reference(probs: &Tensor, k: usize) -> TractResult<(Vec<f32>, Vec<i64>)> {
    let view = probs.to_plain_array_view::<f32>()?;
    let classes = *probs.shape().last().context("scalar")?;
    let flat: Vec<f32> = view.iter().copied().collect();
    let (mut values, mut positions) = (vec![], vec![]);
    for row in flat.chunks(classes) {
        let mut order: Vec<usize> = (0..classes).collect();
        order.sort_by(|a, b| row[*b].total_cmp(&row[*a]).then(a.cmp(b)));
        for &i in &order[..k] {
            values.push(row[i]);
            positions.push(i as i64);
        }
    }
    Ok((values, positions))
}

fn check_against(top: &[TVec<Tensor>], whole: &[TVec<Tensor>], k: usize) -> TractResult<()> {
    for (ix, (t, w)) in top.iter().zip(whole).enumerate() {
        assert_eq!(t.len(), 2, "sample {ix}: values and positions");
        let mut shape = w[0].shape().to_vec();
        *shape.last_mut().context("scalar")? = k;
        assert_eq!(t[0].shape(), &*shape, "sample {ix}");
        assert_eq!(t[1].shape(), &*shape, "sample {ix}");
        let (values, positions) = reference(&w[0], k)?;
        let got: Vec<i64> = t[1].to_plain_array_view::<i64>()?.iter().copied().collect();
        assert_eq!(got, positions, "sample {ix}: positions");
        let got = t[0].to_plain_array_view::<f32>()?;
        for (a, b) in got.iter().zip(&values) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1e-3),
                "sample {ix}: {a} vs {b}"
            );
        }
    }
    Ok(())
}

#[test]
fn top_k_of_each_sample_is_the_top_k_of_its_outputs_alone() -> TractResult<()> {
    let mut rng = Rng(31);
    let model = classifier_model(&mut rng, 6)?;
    let whole = model.clone().into_runnable()?;
    let top = model.with_top_k(3)?.into_runnable()?;
    let widths: Vec<usize> = (0..24).map(|i| 1 + (i * 13) % 40).collect();
    let inputs = samples(&mut rng, &[2, 3, 1], 2, &widths);
    let alone = whole.run_one_by_one(&inputs)?;
    check_against(&top.run_batch(&inputs)?, &alone, 3)?;
    check_against(&top.run(&inputs)?, &alone, 3)?;
    check_against(&top.run_one_by_one(&inputs)?, &alone, 3)?;
    Ok(())
}

#[test]
fn top_k_along_a_ragged_axis_is_refused() -> TractResult<()> {
    let mut rng = Rng(32);
    let mut g = Graph::default();
    let w = g.weight(&[4, 2, 3, 3], rng.vec(72, 0.5));
    let x = g.op(
        "Conv",
        &["x", &w],
        vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
    );
    let model = RaggedModel::new(
        typed(&g.model("x", 4, &[&x]), "N,2,3,W,f32")?,
        RaggedSpec::new(0, 3),
    )?;
    let err = format!("{:#}", model.with_top_k(1).unwrap_err());
    assert!(err.contains("ragged axis"), "{err}");
    Ok(())
}

/// On ragged-cuda: the top k on the device (nothing of the plan on the host), the same
/// positions as the top k of the device's whole outputs.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA device"]
fn top_k_on_cuda_is_computed_on_the_device() -> TractResult<()> {
    let mut rng = Rng(33);
    let model = classifier_model(&mut rng, 6)?;
    let whole = model.clone().into_runnable_with(common::cuda::cuda())?;
    let top = model
        .with_top_k(2)?
        .into_runnable_with(common::cuda::cuda())?;
    let widths: Vec<usize> = (0..40).map(|i| 1 + (i * 17) % 60).collect();
    let inputs = samples(&mut rng, &[2, 3, 1], 2, &widths);
    let host = common::cuda::host_nodes_of_plan(&top, &inputs);
    assert!(host.is_empty(), "on the host: {host:?}");
    let alone = whole.run_one_by_one(&inputs)?;
    check_against(&top.run_batch(&inputs)?, &alone, 2)?;
    check_against(&top.run(&inputs)?, &alone, 2)?;
    // Rows of 300 classes, wider than a warp: picks across lanes, six passes.
    let wide = classifier_model(&mut rng, 300)?;
    let alone = wide
        .clone()
        .into_runnable_with(common::cuda::cuda())?
        .run_one_by_one(&inputs)?;
    let top6 = wide
        .with_top_k(6)?
        .into_runnable_with(common::cuda::cuda())?;
    check_against(&top6.run_batch(&inputs)?, &alone, 6)?;
    Ok(())
}
