//! Reductions over a whole tensor, the batch axis included: an audio front end
//! normalising a clip by its own maximum or mean. Alone, a sample's batch is itself, so it
//! reduces over its own axes; in a ragged batch each sample gets that, not the batch's.
//! A reduction over the batch axis alone still folds samples together: refused.

use crate::common;
use crate::common::onnx::{Graph, ints};
use crate::common::{assert_exact, runnable, samples};
use tract_ragged::prelude::*;

/// x [batch, 2, time] normalised by `reduce` of |x| over `axes` (all when empty; an
/// attribute, as opset 17 has it for ReduceMax and ReduceMean), kept as a scalar when
/// `keep` is false.
fn front_end(reduce: &str, axes: &[i64], keep: bool, combine: &str) -> tract_onnx::pb::ModelProto {
    let mut g = Graph::default();
    let a = g.op("Abs", &["x"], vec![]);
    let mut attrs = vec![common::onnx::int("keepdims", keep as i64)];
    if !axes.is_empty() {
        attrs.push(ints("axes", axes));
    }
    let m = g.op(reduce, &[&a], attrs);
    let y = g.op(combine, &["x", &m], vec![]);
    g.model("x", 3, &[&y])
}

#[test]
fn whole_tensor_reductions_are_each_samples_own() {
    let clips = samples(
        &mut common::onnx::Rng(11),
        &[2, 1],
        1,
        &[1, 3, 9, 17, 40, 25],
    );
    for (reduce, axes, keep, combine) in [
        ("ReduceMax", &[][..], true, "Div"),
        ("ReduceMax", &[], false, "Div"),
        ("ReduceMean", &[], true, "Sub"),
        ("ReduceMean", &[], false, "Sub"),
        ("ReduceMax", &[0, 2], true, "Div"),
        // Over the batch and the channels, not the time: a count of N x 2 alone 2.
        ("ReduceMean", &[0, 1], true, "Sub"),
    ] {
        let model = front_end(reduce, axes, keep, combine);
        let runnable = runnable(&model, "N,2,T,f32", 2)
            .unwrap_or_else(|e| panic!("{reduce} {axes:?} keepdims {keep}: {e:#}"));
        assert_exact(&runnable, &clips, 1e-5)
            .unwrap_or_else(|e| panic!("{reduce} {axes:?} keepdims {keep}: {e:#}"));
    }
}

#[test]
fn a_reduction_over_the_batch_axis_alone_is_refused() {
    let model = front_end("ReduceMean", &[0], true, "Sub");
    let err = match runnable(&model, "N,2,T,f32", 2) {
        Ok(_) => panic!("accepted"),
        Err(e) => e,
    };
    assert_eq!(error_kind(&err), ErrorKind::Refused, "{err:#}");
    assert!(format!("{err:#}").contains("batch axis"), "{err:#}");
}

/// On ragged-cuda: the same front ends, each clip what it gets alone there and on the CPU.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA device"]
fn whole_tensor_reductions_on_cuda_are_each_samples_own() {
    let clips = samples(
        &mut common::onnx::Rng(11),
        &[2, 1],
        1,
        &[1, 3, 9, 17, 40, 25],
    );
    for (reduce, keep, combine) in [("ReduceMax", false, "Div"), ("ReduceMean", true, "Sub")] {
        let proto = front_end(reduce, &[], keep, combine);
        let model = RaggedModel::new(
            common::typed(&proto, "N,2,T,f32").unwrap(),
            RaggedSpec::new(0, 2),
        )
        .unwrap();
        let gpu = model
            .clone()
            .into_runnable_with(common::cuda::cuda())
            .unwrap();
        let cpu = model.into_runnable().unwrap();
        common::cuda::assert_exact_on_cuda(&gpu, &cpu, &clips);
    }
}

/// A clip model without a batch axis ([T, C]): its ragged axis would be 0, where samples
/// are stacked: refused, saying how to export it instead.
#[test]
fn an_input_without_a_batch_axis_is_refused_with_what_to_export() {
    let mut g = Graph::default();
    let y = g.op("Abs", &["x"], vec![]);
    let model = common::typed(&g.model("x", 2, &[&y]), "T,2,f32").unwrap();
    let err = match RaggedModel::new(model, RaggedSpec::new("x", 0)) {
        Ok(_) => panic!("accepted"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("no batch axis") && err.contains("[1, T]"),
        "{err}"
    );
}

/// Cumulative sums along the time (ONNX CumSum, its axis an input) of x + 1 (so that the
/// batch's padding holds ones until masked): forward, exclusive, reverse (over the padding
/// masked to zero), each clip's own; along the batch refused.
#[test]
fn cumulative_sums_along_the_ragged_axis_are_each_samples_own() {
    let clips = samples(&mut common::onnx::Rng(12), &[2, 1], 1, &[1, 4, 9, 31, 17]);
    for (exclusive, reverse) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
        let mut g = Graph::default();
        let axis = g.int64_scalar(2);
        let one = g.weight(&[1], vec![1.0]);
        let x1 = g.op("Add", &["x", &one], vec![]);
        let y = g.op(
            "CumSum",
            &[&x1, &axis],
            vec![
                common::onnx::int("exclusive", exclusive),
                common::onnx::int("reverse", reverse),
            ],
        );
        let model = g.model("x", 3, &[&y]);
        let runnable = runnable(&model, "N,2,T,f32", 2).unwrap();
        assert_exact(&runnable, &clips, 1e-5)
            .unwrap_or_else(|e| panic!("exclusive {exclusive} reverse {reverse}: {e:#}"));
    }
    let mut g = Graph::default();
    let axis = g.int64_scalar(0);
    let y = g.op("CumSum", &["x", &axis], vec![]);
    let err = match runnable(&g.model("x", 3, &[&y]), "N,2,T,f32", 2) {
        Ok(_) => panic!("a cumulative sum over the batch accepted"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("batch axis"), "{err}");
}

/// Each sample's output in the ragged batch `batched` against plain tract on the sample
/// alone: the same shape, within `tolerance`.
fn assert_as_plain_tract_alone(
    proto: &tract_onnx::pb::ModelProto,
    samples: &[Tensor],
    batched: &[TVec<Tensor>],
    tolerance: f32,
) {
    for (k, sample) in samples.iter().enumerate() {
        let mut alone = common::plain_tract(proto, sample).unwrap();
        alone.remove_axis(0).unwrap();
        assert_eq!(batched[k][0].shape(), alone.shape(), "sample {k}");
        let worst = common::max_abs(&batched[k][0], &alone);
        assert!(worst <= tolerance, "sample {k} differs by {worst}");
    }
}

/// `GroupNorm(1, C)` as torch exports it (Conv-TasNet's global layer norm): the features
/// reshaped from `[N, C, T]` to `[N, 1, C*T]`, an instance norm over the merged axis,
/// reshaped back, scaled and shifted per channel. Each clip is normalised by its own
/// statistics over its own `C x T`: against plain tract on each clip alone.
#[test]
fn a_group_norm_over_channels_and_time_normalises_each_clip_by_its_own() {
    let mut rng = common::onnx::Rng(17);
    let mut g = Graph::default();
    let w = g.weight(&[4, 2, 3], rng.vec(24, 0.5));
    let features = g.op(
        "Conv",
        &["x", &w],
        vec![ints("kernel_shape", &[3]), ints("pads", &[1, 1])],
    );
    let merged_shape = g.ints_const(&[0, 1, -1]);
    let merged = g.op("Reshape", &[&features, &merged_shape], vec![]);
    let one = g.weight(&[1], vec![1.0]);
    let zero = g.weight(&[1], vec![0.0]);
    let normed = g.op(
        "InstanceNormalization",
        &[&merged, &one, &zero],
        vec![common::onnx::float("epsilon", 1e-5)],
    );
    let shape = g.op("Shape", &[&features], vec![]);
    let back = g.op("Reshape", &[&normed, &shape], vec![]);
    let gamma = g.weight(&[1, 4, 1], rng.vec(4, 1.0));
    let beta = g.weight(&[1, 4, 1], rng.vec(4, 1.0));
    let scaled = g.op("Mul", &[&back, &gamma], vec![]);
    let y = g.op("Add", &[&scaled, &beta], vec![]);
    let proto = g.model("x", 3, &[&y]);
    let runnable = runnable(&proto, "N,2,T,f32", 2).unwrap();
    let clips = samples(&mut rng, &[2, 1], 1, &[7, 1, 19, 40, 3]);
    let batched = runnable.run_batch(&clips).unwrap();
    assert_as_plain_tract_alone(&proto, &clips, &batched, 1e-4);
}

/// Conv-TasNet's decoder: the masked features of each source (`[N, 2, C, T]`) merged into
/// the batch, `[2N, C, T]`, decoded by one transposed convolution, split back to
/// `[N, 2, T']`. Each clip's sources are decoded from its own features: against plain
/// tract on each clip alone.
#[test]
fn a_transposed_convolution_over_the_sources_merged_into_the_batch_decodes_each_clip_alone() {
    let mut rng = common::onnx::Rng(23);
    let mut g = Graph::default();
    let w = g.weight(&[4, 4, 3], rng.vec(48, 0.5));
    let features = g.op(
        "Conv",
        &["x", &w],
        vec![ints("kernel_shape", &[3]), ints("pads", &[1, 1])],
    );
    let sources_shape = g.ints_const(&[0, 2, 2, -1]);
    let sources = g.op("Reshape", &[&features, &sources_shape], vec![]);
    let masked = g.op("Sigmoid", &[&sources], vec![]);
    // `[-1, 2, T]`, T read from the features' shape.
    let length = |g: &mut Graph, x: &str| {
        let shape = g.op("Shape", &[x], vec![]);
        let (start, end) = (g.ints_const(&[2]), g.ints_const(&[3]));
        g.op("Slice", &[&shape, &start, &end], vec![])
    };
    let t = length(&mut g, &features);
    let head = g.ints_const(&[-1, 2]);
    let merged_shape = g.op("Concat", &[&head, &t], vec![common::onnx::int("axis", 0)]);
    let merged = g.op("Reshape", &[&masked, &merged_shape], vec![]);
    let kernel = g.weight(&[2, 1, 4], rng.vec(8, 0.5));
    let decoded = g.op(
        "ConvTranspose",
        &[&merged, &kernel],
        vec![
            ints("kernel_shape", &[4]),
            ints("strides", &[2]),
            ints("pads", &[1, 1]),
        ],
    );
    let t2 = length(&mut g, &decoded);
    let split_shape = g.op("Concat", &[&head, &t2], vec![common::onnx::int("axis", 0)]);
    let y = g.op("Reshape", &[&decoded, &split_shape], vec![]);
    let proto = g.model("x", 3, &[&y]);
    let runnable = runnable(&proto, "N,4,T,f32", 2).unwrap();
    let clips = samples(&mut rng, &[4, 1], 1, &[7, 1, 19, 40, 3]);
    let batched = runnable.run_batch(&clips).unwrap();
    assert_as_plain_tract_alone(&proto, &clips, &batched, 1e-5);
}

/// A model that runs on multiples of 4 only, as Conv-TasNet on multiples of 8: encoded with
/// a stride of 4, normalised over channels and time (the reshapes tract cannot type at a
/// shape), decoded back to `4*(T/4)` samples and added to its input, which tract types for
/// neither `T` nor any one shape. Typed with `T` a multiple of 4, each clip as alone; a
/// clip of another length is refused, saying so.
#[test]
fn a_model_that_types_for_multiples_only_runs_on_them() {
    let mut rng = common::onnx::Rng(29);
    let mut g = Graph::default();
    let w = g.weight(&[3, 1, 4], rng.vec(12, 0.5));
    let features = g.op(
        "Conv",
        &["x", &w],
        vec![ints("kernel_shape", &[4]), ints("strides", &[4])],
    );
    let merged_shape = g.ints_const(&[0, 1, -1]);
    let merged = g.op("Reshape", &[&features, &merged_shape], vec![]);
    let one = g.weight(&[1], vec![1.0]);
    let zero = g.weight(&[1], vec![0.0]);
    let normed = g.op(
        "InstanceNormalization",
        &[&merged, &one, &zero],
        vec![common::onnx::float("epsilon", 1e-5)],
    );
    let shape = g.op("Shape", &[&features], vec![]);
    let back = g.op("Reshape", &[&normed, &shape], vec![]);
    let kernel = g.weight(&[3, 1, 4], rng.vec(12, 0.5));
    let decoded = g.op(
        "ConvTranspose",
        &[&back, &kernel],
        vec![ints("kernel_shape", &[4]), ints("strides", &[4])],
    );
    let input_shape = g.op("Shape", &["x"], vec![]);
    let decoded = g.op("Reshape", &[&decoded, &input_shape], vec![]);
    let y = g.op("Add", &[&decoded, "x"], vec![]);
    let proto = g.model("x", 3, &[&y]);
    let onnx = tract_ragged::load::from_proto(proto.clone(), None, Some("N,1,T,f32")).unwrap();
    let runnable = tract_ragged::load::ragged_model(onnx, RaggedSpec::new(0, 2))
        .unwrap()
        .into_runnable()
        .unwrap();
    let clips = samples(&mut rng, &[1, 1], 1, &[8, 4, 36, 160, 12]);
    let batched = runnable.run_batch(&clips).unwrap();
    assert_as_plain_tract_alone(&proto, &clips, &batched, 1e-4);
    let odd = samples(&mut rng, &[1, 1], 1, &[8, 10]);
    let refused = runnable.run_batch(&odd).unwrap_err();
    assert!(
        format!("{refused:#}").contains("multiples of 4"),
        "{refused:#}"
    );
}

/// DeepLabV3's image-pooling branch: the feature map averaged to one pixel, resized back
/// to the map's size (bilinear, sizes read from the map) and added to it. Each image gets
/// its own average at every position of its own width: against plain tract alone.
#[test]
fn a_pooled_pixel_resized_back_to_the_map_is_each_images_own() {
    let mut rng = common::onnx::Rng(31);
    let mut g = Graph::default();
    let w = g.weight(&[4, 2, 3, 3], rng.vec(72, 0.5));
    let features = g.op(
        "Conv",
        &["x", &w],
        vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
    );
    let pooled = g.op("GlobalAveragePool", &[&features], vec![]);
    let sizes = g.op("Shape", &[&features], vec![]);
    let back = g.op(
        "Resize",
        &[&pooled, "", "", &sizes],
        vec![
            common::onnx::string("mode", "linear"),
            common::onnx::string("coordinate_transformation_mode", "half_pixel"),
        ],
    );
    let y = g.op("Add", &[&back, &features], vec![]);
    let proto = g.model("x", 4, &[&y]);
    let runnable = runnable(&proto, "N,2,5,W,f32", 3).unwrap();
    let images = samples(&mut rng, &[2, 5, 1], 2, &[7, 1, 19, 3]);
    let batched = runnable.run_batch(&images).unwrap();
    assert_as_plain_tract_alone(&proto, &images, &batched, 1e-5);
}

/// A segmenter's skip connection (LR-ASPP, DeepLabV3's decoder, FCN): a map of stride 4
/// resized (bilinear, sizes read from the map of stride 2) and added to it, then resized
/// back to the image's own size. At widths that are not multiples of 4 the scales are no
/// one number (`ceil(w / 2) / ceil(w / 4)`), so each image is resized to its own extents,
/// as alone: against plain tract alone, widths of every residue.
#[test]
fn maps_resized_to_the_extents_of_other_maps_are_each_images_own() {
    let mut rng = common::onnx::Rng(37);
    let mut g = Graph::default();
    let conv = |g: &mut Graph, rng: &mut common::onnx::Rng, x: &str, c: usize| {
        let w = g.weight(&[2, c, 3, 3], rng.vec(18 * c, 0.5));
        g.op(
            "Conv",
            &[x, &w],
            vec![
                ints("kernel_shape", &[3, 3]),
                ints("pads", &[1, 1, 1, 1]),
                ints("strides", &[2, 2]),
            ],
        )
    };
    let high = conv(&mut g, &mut rng, "x", 2);
    let low = conv(&mut g, &mut rng, &high, 2);
    let resize = |g: &mut Graph, x: &str, like: &str| {
        let sizes = g.op("Shape", &[like], vec![]);
        g.op(
            "Resize",
            &[x, "", "", &sizes],
            vec![
                common::onnx::string("mode", "linear"),
                common::onnx::string("coordinate_transformation_mode", "half_pixel"),
            ],
        )
    };
    let up = resize(&mut g, &low, &high);
    let merged = g.op("Add", &[&up, &high], vec![]);
    let y = resize(&mut g, &merged, "x");
    let proto = g.model("x", 4, &[&y]);
    let runnable = runnable(&proto, "N,2,8,W,f32", 3).unwrap();
    let images = samples(&mut rng, &[2, 8, 1], 2, &[13, 4, 22, 7, 1, 16]);
    let batched = runnable.run_batch(&images).unwrap();
    assert_as_plain_tract_alone(&proto, &images, &batched, 1e-5);
}
