//! A model too large for tract's optimizer in one piece is prepared in segments: each
//! segment within the limit, and the segmented plan computes what one plan computes,
//! ragged batches included, and profiles segment by segment.

use crate::common;
use crate::common::onnx::{Graph, Rng, ints};
use crate::common::{max_abs, samples};
use tract_core::internal::*;
use tract_ragged::prelude::*;
use tract_ragged::segment::{Segments, TRACT_RAGGED_SEGMENT};

/// `blocks` residual blocks (conv, batch norm as Mul and Add, Relu, residual Add), a
/// stride-2 conv every eighth, a squeeze-excitation gate (global average pool, 1x1 convs,
/// sigmoid, Mul) every fifth; then two outputs: a softmax over the width, and the mean
/// over the width.
fn deep(rng: &mut Rng, c: usize, blocks: usize) -> tract_onnx::pb::ModelProto {
    let mut g = Graph::default();
    let mut x = "x".to_string();
    for b in 0..blocks {
        let stride = if b % 8 == 7 { 2 } else { 1 };
        let w = g.weight(&[c, c, 1, 3], rng.vec(c * c * 3, 0.4));
        let conv = g.op(
            "Conv",
            &[&x, &w],
            vec![
                ints("kernel_shape", &[1, 3]),
                ints("pads", &[0, 1, 0, 1]),
                ints("strides", &[1, stride]),
            ],
        );
        let scale = g.weight(&[1, c, 1, 1], rng.vec(c, 1.0));
        let bias = g.weight(&[1, c, 1, 1], rng.vec(c, 0.5));
        let scaled = g.op("Mul", &[&conv, &scale], vec![]);
        let normed = g.op("Add", &[&scaled, &bias], vec![]);
        let mut y = g.op("Relu", &[&normed], vec![]);
        if b % 5 == 4 {
            let pooled = g.op("GlobalAveragePool", &[&y], vec![]);
            let w1 = g.weight(&[c, c, 1, 1], rng.vec(c * c, 0.5));
            let squeezed = g.op("Conv", &[&pooled, &w1], vec![]);
            let gate = g.op("Sigmoid", &[&squeezed], vec![]);
            y = g.op("Mul", &[&y, &gate], vec![]);
        }
        x = if stride == 1 {
            g.op("Add", &[&y, &x], vec![])
        } else {
            y
        };
    }
    let softmax = g.op("Softmax", &[&x], vec![common::onnx::int("axis", 3)]);
    let mean = g.op(
        "ReduceMean",
        &[&x],
        vec![ints("axes", &[3]), common::onnx::int("keepdims", 1)],
    );
    g.model("x", 4, &[&softmax, &mean])
}

const FACT: &str = "N,3,2,W,f32";

/// A runnable of `proto` whose transform and plans see `TRACT_RAGGED_SEGMENT` set to
/// `segment` (`None`: the default).
fn runnable(
    proto: &tract_onnx::pb::ModelProto,
    segment: Option<usize>,
) -> TractResult<RaggedRunnable> {
    let make = || -> TractResult<RaggedRunnable> {
        RaggedModel::new(common::typed(proto, FACT)?, RaggedSpec::new(0, 3))?.into_runnable()
    };
    match segment {
        None => make(),
        Some(n) => {
            let scope = KnobScope::new([("TRACT_RAGGED_SEGMENT", n.to_string().as_str())])?;
            Ok(scope.clone().enter(make)?.with_knobs(scope))
        }
    }
}

#[test]
fn a_plan_in_segments_computes_what_one_plan_computes() -> TractResult<()> {
    let proto = deep(&mut Rng(7), 3, 40);
    let whole = runnable(&proto, None)?;
    let cut = runnable(&proto, Some(12))?;
    let batch = samples(&mut Rng(8), &[3, 2, 1], 2, &[37, 64, 9, 50]);
    let (a, info_a) = whole.run_batch_with_info(&batch)?;
    let (b, info_b) = cut.run_batch_with_info(&batch)?;
    assert_eq!(info_a.segments, 1, "{}", info_a.plan);
    assert!(info_b.segments > 10, "{}", info_b.plan);
    assert!(info_b.plan.contains("segments"), "{}", info_b.plan);
    for (k, (x, y)) in a.iter().zip(&b).enumerate() {
        for (j, (x, y)) in x.iter().zip(y).enumerate() {
            let d = max_abs(y, x);
            assert!(d <= 1e-6, "sample {k} output {j}: {d:e}");
        }
    }
    // And each sample alone (also through segments) as the contract wants.
    common::assert_exact(&cut, &batch, 1e-5)
}

#[test]
fn every_segment_is_within_the_limit_and_joined_back_they_are_the_model() -> TractResult<()> {
    let model = common::typed(&deep(&mut Rng(7), 3, 40), FACT)?;
    let limit = 10;
    let segments = Segments::cut(&model, limit)?.context("a model of 40 blocks is cut")?;
    let mut nodes = 0;
    for m in segments.models() {
        let body = m
            .nodes()
            .iter()
            .filter(|n| !n.op_is::<tract_core::ops::konst::Const>())
            .filter(|n| !n.op_is::<tract_core::ops::source::TypedSource>())
            .count();
        assert!(body <= limit, "a segment of {body} nodes");
        nodes += body;
    }
    let body = |m: &TypedModel| {
        m.nodes()
            .iter()
            .filter(|n| !n.op_is::<tract_core::ops::konst::Const>())
            .filter(|n| !n.op_is::<tract_core::ops::source::TypedSource>())
            .count()
    };
    assert_eq!(nodes, body(&model));
    let joined = segments.join(&model)?;
    assert_eq!(body(&joined), body(&model));
    // The same values, on tract's own runtime, for a concrete shape.
    let mut values: HashMap<Symbol, TDim> = HashMap::default();
    for s in model.symbols.all_symbols() {
        values.insert(
            s.clone(),
            if format!("{s}") == "N" { 2 } else { 40 }.to_dim(),
        );
    }
    let input = samples(&mut Rng(4), &[2, 3, 2, 40], 3, &[40]).remove(0);
    let run = |m: &TypedModel| -> TractResult<TVec<TValue>> {
        m.set_symbols(&values)?
            .into_runnable()?
            .run(tvec!(input.clone().into_tvalue()))
    };
    for (x, y) in run(&model)?.iter().zip(run(&joined)?.iter()) {
        assert_eq!(max_abs(x, y), 0.0);
    }
    Ok(())
}

#[test]
fn a_small_model_stays_in_one_piece() -> TractResult<()> {
    let model = common::typed(&deep(&mut Rng(3), 3, 4), FACT)?;
    assert!(Segments::cut(&model, TRACT_RAGGED_SEGMENT.get())?.is_none());
    assert!(Segments::cut(&model, 0)?.is_none(), "0 never cuts");
    Ok(())
}

#[test]
fn a_plan_in_segments_profiles_segment_by_segment() -> TractResult<()> {
    let proto = deep(&mut Rng(5), 3, 24);
    let cut = runnable(&proto, Some(8))?;
    let batch = samples(&mut Rng(6), &[3, 2, 1], 2, &[20, 33]);
    let (plan, inputs) = cut.prepared(&batch)?;
    let profile = tract_ragged::profile::profile(&**cut.backend(), &plan, inputs, 1)?;
    let segments: std::collections::HashSet<usize> =
        profile.nodes.iter().filter_map(|n| n.segment).collect();
    assert_eq!(segments.len(), tract_ragged::segment::count(&*plan));
    assert!(segments.len() > 5);
    let ops: Vec<&str> = profile.nodes.iter().map(|n| n.op.as_str()).collect();
    assert!(ops.iter().any(|op| op.contains("MatMul")), "{ops:?}");
    Ok(())
}

/// A chain of 20000 nodes: in one plan, tract's optimizer took 30 s for 5000 of them and
/// gave no answer in 300 s for 20000 (benches/NOTES.md); in segments it is loaded,
/// transformed and prepared in seconds. Here: prepared in segments of at most the
/// default, and it computes what the chain computes.
#[test]
fn a_chain_of_twenty_thousand_nodes_is_prepared_in_segments() -> TractResult<()> {
    let mut g = Graph::default();
    let mut x = g.op("Sigmoid", &["x"], vec![]);
    // Abs, not Relu: a chain of binary ops (Relu is a Max) would be fused into a few
    // nodes on the host before it is cut.
    for _ in 0..20000 {
        x = g.op("Abs", &[&x], vec![]);
    }
    let proto = g.model("x", 4, &[&x]);
    let runnable = runnable(&proto, None)?;
    let batch = samples(&mut Rng(2), &[3, 2, 1], 2, &[5, 16]);
    let (out, info) = runnable.run_batch_with_info(&batch)?;
    assert!(
        info.segments >= 20000 / TRACT_RAGGED_SEGMENT.get(),
        "{}",
        info.plan
    );
    for (s, o) in batch.iter().zip(&out) {
        let expected = s
            .to_plain_array_view::<f32>()?
            .mapv(|v| 1.0 / (1.0 + (-v).exp()));
        let d = max_abs(&o[0], &expected.into_tensor());
        assert!(d < 1e-6, "{d:e}");
    }
    Ok(())
}

/// On ragged-cuda each segment is a device plan: the values crossing a cut stay on the
/// device (handed over as tract-gpu's lazy host storage, never read back), and the
/// segmented plan gives what one plan gives, and what each sample gives alone.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA device"]
fn on_cuda_values_crossing_a_cut_stay_on_the_device() -> TractResult<()> {
    use tract_gpu::tensor::LazyHostStorage;
    use tract_ragged::segment::SegmentedPlan;
    let cuda = runtime_for_name("ragged-cuda")?.context("ragged-cuda is not registered")?;
    let proto = deep(&mut Rng(9), 4, 40);
    let typed = common::typed(&proto, "N,4,2,W,f32")?;
    let model = RaggedModel::new(typed, RaggedSpec::new(0, 3))?;
    let whole = model.clone().into_runnable_with(cuda)?;
    let scope = KnobScope::new([("TRACT_RAGGED_SEGMENT", "12")])?;
    let cut = model.into_runnable_with(cuda)?.with_knobs(scope);
    let batch = samples(&mut Rng(10), &[4, 2, 1], 2, &[37, 64, 9, 50]);
    let (a, _) = whole.run_batch_with_info(&batch)?;
    let (b, info) = cut.run_batch_with_info(&batch)?;
    assert!(info.segments > 10, "{}", info.plan);
    for (k, (x, y)) in a.iter().zip(&b).enumerate() {
        for (j, (x, y)) in x.iter().zip(y).enumerate() {
            let d = common::rel_diff(y, x);
            assert!(d <= 1e-5, "sample {k} output {j}: {d:e}");
        }
    }
    common::assert_exact(&cut, &batch, 1e-5)?;
    let (plan, inputs) = cut.prepared(&batch)?;
    let segmented = plan
        .downcast_ref::<SegmentedPlan>()
        .context("not in segments")?;
    let mut crossing = 0;
    segmented.run_with(inputs, |_, plan, inputs| {
        let outputs = plan.run(inputs)?;
        for o in &outputs {
            if o.datum_type() == f32::datum_type() {
                let lazy = o.storage_as::<LazyHostStorage>();
                assert!(
                    lazy.is_some_and(|l| !l.is_materialized()),
                    "an f32 value crossing a cut is on the host"
                );
                crossing += 1;
            }
        }
        Ok(outputs)
    })?;
    assert!(crossing > 10);
    Ok(())
}
