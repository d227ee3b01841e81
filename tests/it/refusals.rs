//! Models that mix positions along the ragged axis are refused when they are prepared,
//! with an error naming the node, its op and why: never a silently wrong answer.

use crate::common::onnx::{Graph, Rng, int, ints, string};
use crate::common::typed;
use tract_onnx::prelude::InferenceModelExt;
use tract_ragged::prelude::*;

/// The model's refusal as the user reads it; it must be of the refused kind, naming the
/// node and its op ([`tract_ragged::error::Refused`]).
fn refusal(model: tract_onnx::pb::ModelProto, fact: &str) -> String {
    let typed = typed(&model, fact).unwrap();
    match RaggedModel::new(typed, RaggedSpec::new("x", 3)) {
        Ok(_) => panic!("the model was accepted"),
        Err(e) => {
            let message = format!("{e:#}");
            assert_eq!(error_kind(&e), ErrorKind::Refused, "{message}");
            let refused = tract_ragged::error::refusal(&e).expect("a refusal names its node");
            assert!(
                message.contains(&refused.node) && message.contains(&refused.reason),
                "{refused:?} vs {message}"
            );
            message
        }
    }
}

fn conv(g: &mut Graph, rng: &mut Rng, x: &str, c: usize) -> String {
    let w = g.weight(&[c, c, 3, 3], rng.vec(c * c * 9, 0.5));
    g.op(
        "Conv",
        &[x, &w],
        vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
    )
}

#[test]
fn flatten_merging_the_width_with_channels_is_refused() {
    let mut rng = Rng(7);
    let mut g = Graph::default();
    let x = conv(&mut g, &mut rng, "x", 2);
    let f = g.op("Flatten", &[&x], vec![int("axis", 1)]);
    // tract types a flatten of two symbols only with a concrete batch.
    let typed = typed(&g.model("x", 4, &[&f]), "2,2,3,W,f32").unwrap();
    let Err(e) = RaggedModel::new(typed, RaggedSpec::new("x", 3)) else {
        panic!("the model was accepted")
    };
    let refused = tract_ragged::error::refusal(&e).expect("a refusal names its node");
    assert!(refused.node.contains("Flatten"), "{refused:?}");
    assert!(
        refused.reason.contains("merges or splits the ragged axis"),
        "{refused:?}"
    );
}

/// tract-onnx's own loader lowers an LSTM to a Scan, which the transform cannot follow:
/// refused, saying how to load it so that it runs (as tract-ragged's recurrence).
#[test]
fn a_scan_over_the_width_is_refused_saying_how_to_load_recurrences() {
    let mut rng = Rng(7);
    let mut g = Graph::default();
    let x = conv(&mut g, &mut rng, "x", 2);
    let axes = g.ints_const(&[2]);
    let x = g.op("Squeeze", &[&x, &axes], vec![]);
    let x = g.op("Transpose", &[&x], vec![ints("perm", &[2, 0, 1])]);
    let h = 3;
    let w = g.weight(&[1, 4 * h, 2], rng.vec(4 * h * 2, 0.5));
    let r = g.weight(&[1, 4 * h, h], rng.vec(4 * h * h, 0.5));
    let y = g.op_n(
        "LSTM",
        &[&x, &w, &r],
        1,
        vec![int("hidden_size", h as i64), string("direction", "forward")],
    );
    let proto = g.model("x", 4, &[&y[0]]);
    // tract-onnx types an LSTM only with a concrete batch.
    let mut model = tract_onnx::onnx().model_for_proto_model(&proto).unwrap();
    let fact =
        tract_onnx::tract_hir::infer::InferenceFact::from_spec(&model.symbols, "1,2,1,W,f32")
            .unwrap();
    model.set_input_fact(0, fact).unwrap();
    let typed = model.into_typed().unwrap().into_decluttered().unwrap();
    let err = match RaggedModel::new(typed, RaggedSpec::new("x", 3)) {
        Ok(_) => panic!("the scan was accepted"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("Scan") && err.contains("tract_ragged::load"),
        "{err}"
    );
}

/// A recurrence reading as its features an axis whose extent the fact fixes (a GRU takes
/// a concrete input size, so the features cannot be ragged): every sample has that
/// extent, nothing is padded there, and a batch is what each sample gets alone.
#[test]
fn a_recurrence_reading_a_fixed_extent_as_its_features_runs_as_alone() {
    let mut rng = Rng(7);
    let mut g = Graph::default();
    let axes = g.ints_const(&[2]);
    // [N, 2, 1, W] -> [N, 2, W]: batch first, the channels as the sequence, W as features.
    let x = g.op("Squeeze", &["x", &axes], vec![]);
    let (h, width) = (3, 8);
    let w = g.weight(&[1, 3 * h, width], rng.vec(3 * h * width, 0.5));
    let r = g.weight(&[1, 3 * h, h], rng.vec(3 * h * h, 0.5));
    let y = g.op_n(
        "GRU",
        &[&x, &w, &r],
        1,
        vec![int("hidden_size", h as i64), int("layout", 1)],
    );
    let typed = typed(&g.model("x", 4, &[&y[0]]), "N,2,1,8,f32").unwrap();
    let runnable = RaggedModel::new(typed, RaggedSpec::new("x", 3))
        .unwrap()
        .into_runnable()
        .unwrap();
    let samples = crate::common::samples(&mut rng, &[2, 1, width], 2, &[width; 3]);
    let alone = runnable.run_one_by_one(&samples).unwrap();
    let batched = runnable.run_batch(&samples).unwrap();
    let worst = crate::common::max_difference(&batched, &alone);
    assert!(worst <= 1e-6, "the batch differs by {worst}");
}

#[test]
fn concatenation_along_the_width_is_refused() {
    let mut rng = Rng(7);
    let mut g = Graph::default();
    let x = conv(&mut g, &mut rng, "x", 2);
    let c = g.op("Concat", &[&x, "x"], vec![int("axis", 3)]);
    let err = refusal(g.model("x", 4, &[&c]), "N,2,3,W,f32");
    assert!(
        err.contains("Concat") && err.contains("along the ragged axis"),
        "{err}"
    );
}

#[test]
fn same_padding_with_a_stride_is_refused() {
    let mut rng = Rng(7);
    let mut g = Graph::default();
    let w = g.weight(&[2, 2, 3, 3], rng.vec(36, 0.5));
    let y = g.op(
        "Conv",
        &["x", &w],
        vec![
            ints("kernel_shape", &[3, 3]),
            ints("strides", &[2, 2]),
            string("auto_pad", "SAME_UPPER"),
        ],
    );
    let err = refusal(g.model("x", 4, &[&y]), "N,2,8,W,f32");
    assert!(
        err.contains("Conv") && err.contains("depends on the width"),
        "{err}"
    );
}

/// Over the batch axis alone, a reduction folds samples into one another. (Over the
/// batch axis and others, each sample gets its own: tests/it/front_ends.rs.)
#[test]
fn reduction_over_the_batch_is_refused() {
    let mut g = Graph::default();
    let y = g.op(
        "ReduceMean",
        &["x"],
        vec![int("keepdims", 1), ints("axes", &[0])],
    );
    let err = refusal(g.model("x", 4, &[&y]), "N,2,3,W,f32");
    assert!(
        err.contains("ReduceMean") && err.contains("batch axis"),
        "{err}"
    );
}

/// A resize whose coordinates scale with the extents (`align_corners`): a sample alone
/// would read other positions than in the batch.
#[test]
fn resize_to_a_fixed_size_along_the_width_is_refused() {
    // 64 columns from every width: a sample alone is scaled by 64 / w, not 64 / W.
    let mut g = Graph::default();
    // tract-onnx reads sizes for every axis: the batch is concrete here.
    let sizes = g.ints_const(&[2, 2, 6, 64]);
    let y = g.op(
        "Resize",
        &["x", "", "", &sizes],
        vec![string("mode", "nearest")],
    );
    let err = refusal(g.model("x", 4, &[&y]), "2,2,3,W,f32");
    assert!(
        err.contains("Resize") && err.contains("not a fixed scale"),
        "{err}"
    );
}
