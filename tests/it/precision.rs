//! Half precision (`Precision::F16`): the model in f16 still gives each sample what it
//! gets alone, at that precision, and stays near what f32 gives it. The samples go in and
//! the outputs come out in f32; the masks, pools and softmaxes the ragged transform inserts
//! run in f16 like the rest.

use crate::common;
use crate::common::models::{Pool, attention_model, pool_model, reduce_model};
use crate::common::onnx::Rng;
use tract_onnx::pb::ModelProto;
use tract_ragged::precision::Precision;
use tract_ragged::prelude::*;

/// The model of `proto` ragged along axis 3, at f32 and at f16.
fn both(proto: &ModelProto, fact: &str) -> TractResult<(RaggedModel, RaggedModel)> {
    let full = RaggedModel::new(common::typed(proto, fact)?, RaggedSpec::new(0, 3))?;
    let half = full.clone().at_precision(Precision::F16)?;
    Ok((full, half))
}

/// How many nodes of `model` give an f16 tensor.
fn f16_nodes(model: &TypedModel) -> usize {
    model
        .nodes()
        .iter()
        .filter(|n| {
            n.outputs
                .iter()
                .any(|o| o.fact.datum_type == DatumType::F16)
        })
        .count()
}

/// The models of each family the transform rewrites, with their sample shapes.
fn families() -> Vec<(&'static str, ModelProto, Vec<usize>)> {
    let mut rng = Rng(5);
    let avg = Pool {
        max: false,
        k: 3,
        stride: 2,
        pads: (1, 1),
        ceil: true,
        count_include_pad: false,
        dilation: 1,
        global: 1,
    };
    let max = Pool {
        max: true,
        global: 2,
        ..avg.clone()
    };
    vec![
        ("average pool", pool_model(&mut rng, 3, &avg), vec![3, 2, 0]),
        ("max pool", pool_model(&mut rng, 3, &max), vec![3, 2, 0]),
        ("mean", reduce_model(&mut rng, 3, 0), vec![3, 1, 0]),
        ("softmax", reduce_model(&mut rng, 3, 4), vec![3, 1, 0]),
        ("attention", attention_model(&mut rng, 4, 2), vec![4, 1, 0]),
    ]
}

#[test]
fn an_f16_model_gives_each_sample_what_it_gets_alone_and_stays_near_f32() -> TractResult<()> {
    for (what, proto, dims) in families() {
        let fact = format!("N,{},{},W,f32", dims[0], dims[1]);
        let (full, half) = both(&proto, &fact)?;
        let stored_in_f16 = f16_nodes(half.model());
        assert!(stored_in_f16 > 3, "{what}: {stored_in_f16} f16 tensors");
        assert_eq!(half.input_fact.datum_type, DatumType::F32, "{what}");
        let (full, half) = (full.into_runnable()?, half.into_runnable()?);
        let samples = common::samples(&mut Rng(7), &dims, 2, &[9, 4, 17, 12]);
        // f16 alone against f16 in the batch: a few units of f16's last place (1e-3).
        common::assert_exact(&half, &samples, 4e-3).map_err(|e| e.context(what))?;
        assert_near_f32(
            what,
            &half.run_batch(&samples)?,
            &full.run_one_by_one(&samples)?,
        );
    }
    Ok(())
}

/// A sample beyond f16's range (1e5) is refused by an f16 model, naming the sample and the
/// value (it would become an infinity inside and move its outputs silently); the f32 model
/// runs it, and the f16 model still runs the others.
#[test]
fn an_f16_model_refuses_samples_beyond_f16s_range() -> TractResult<()> {
    let (what, proto, dims) = families().remove(0);
    let fact = format!("N,{},{},W,f32", dims[0], dims[1]);
    let (full, half) = both(&proto, &fact)?;
    let (full, half) = (full.into_runnable()?, half.into_runnable()?);
    let mut samples = common::samples(&mut Rng(8), &dims, 2, &[9, 4, 17]);
    samples[1].try_as_plain_ram_mut()?.as_slice_mut::<f32>()?[5] = 1e5;
    let e = half.run(&samples).unwrap_err();
    assert_eq!(error_kind(&e), ErrorKind::BadSample, "{what}: {e:#}");
    assert!(
        format!("{e:#}").contains("sample 1 holds 100000 at element 5"),
        "{e:#}"
    );
    full.run(&samples)?;
    let each = half.run_each(&samples)?;
    assert!(each[0].is_ok() && each[1].is_err() && each[2].is_ok());
    Ok(())
}

/// Each f16 output of `batched` is of f32's type and within 2e-2 of f32's (relative to the
/// output's magnitude), and the f16 outputs are not f32's bits.
fn assert_near_f32(what: &str, batched: &[TVec<Tensor>], f32_alone: &[TVec<Tensor>]) {
    assert!(
        common::max_difference(batched, f32_alone) > 0.0,
        "{what}: f16 gave f32's bits"
    );
    for (k, (h, f)) in batched.iter().zip(f32_alone).enumerate() {
        for (j, (h, f)) in h.iter().zip(f).enumerate() {
            assert_eq!(h.datum_type(), f.datum_type(), "{what}: output {j}");
            let d = common::rel_diff(h, f);
            assert!(
                d < 2e-2,
                "{what}: sample {k} output {j}: f16 vs f32 relative difference {d:e}"
            );
        }
    }
}

/// A CRNN: a conv, a bidirectional LSTM over W, classes.
fn crnn() -> ModelProto {
    let lstm = common::crnn::Rnn {
        cell: 0,
        direction: 2,
        hidden: 4,
        layers: 1,
        batch_first: false,
        bias: true,
        initial: false,
        clip: false,
        activations: false,
        linear_before_reset: false,
    };
    common::crnn::crnn(&mut Rng(3), 2, 3, 5, &lstm)
}

#[test]
fn recurrences_stay_f32_in_an_f16_model() -> TractResult<()> {
    let (_, half) = both(&crnn(), "N,2,3,W,f32")?;
    let recurrences: Vec<&TypedNode> = half
        .model()
        .nodes()
        .iter()
        .filter(|n| n.op_is::<tract_ragged::ops::Recurrence>())
        .collect();
    assert!(!recurrences.is_empty());
    for node in recurrences {
        assert_eq!(node.outputs[0].fact.datum_type, DatumType::F32, "{node}");
    }
    let half = half.into_runnable()?;
    let samples = common::samples(&mut Rng(8), &[2, 3, 0], 2, &[12, 5, 20]);
    common::assert_exact(&half, &samples, 4e-3)
}

#[test]
fn bf16_and_f16_after_top_k_are_refused_by_name() {
    let err = format!("{:#}", "bf16".parse::<Precision>().unwrap_err());
    assert!(err.contains("bf16") && err.contains("f16"), "{err}");
    let full = RaggedModel::new(
        common::typed(&crnn(), "N,2,3,W,f32").unwrap(),
        RaggedSpec::new(0, 3),
    )
    .unwrap()
    .with_top_k(1)
    .unwrap();
    let err = format!("{:#}", full.at_precision(Precision::F16).unwrap_err());
    assert!(err.contains("before reducing"), "{err}");
}

/// On ragged-cuda: each family's f16 model wholly on the device (our pools, softmaxes,
/// masks and fused chains in f16), each sample in the batch as alone there, near f32 alone
/// on the CPU; and the plan really computes in f16.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA device"]
fn f16_models_run_on_ragged_cuda_as_alone() -> TractResult<()> {
    for (what, proto, dims) in families() {
        let fact = format!("N,{},{},W,f32", dims[0], dims[1]);
        let (full, half) = both(&proto, &fact)?;
        let gpu = half.into_runnable_with(common::cuda::cuda())?;
        let cpu = full.into_runnable()?;
        let samples = common::samples(&mut Rng(7), &dims, 2, &[9, 4, 17, 12]);
        let host = common::cuda::host_nodes_of_plan(&gpu, &samples);
        assert!(host.is_empty(), "{what}: on the host: {host:?}");
        common::assert_exact(&gpu, &samples, 4e-3).map_err(|e| e.context(what))?;
        assert_near_f32(
            what,
            &gpu.run_batch(&samples)?,
            &cpu.run_one_by_one(&samples)?,
        );
    }
    Ok(())
}

/// PP-OCRv4 rec in f16 on ragged-cuda: nothing on the host, the text f32 reads, and the
/// batch no further from each line alone in f16 than f16 alone is from f32 alone.
///
/// Not within f16's last place, as the small models are: tract-cuda's f16 GEMMs (attention,
/// head) pick their kernels by shape, and a batch is another shape than a line alone; one
/// rounding that falls the other way in f16 (a relative 1e-3) then carries through the
/// layers, as any other f16 rounding does (measured on the H200: 2.7e-2 norm-wise, the
/// same order as f16 against f32).
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA device"]
fn ppocr_rec_in_f16_on_ragged_cuda() -> TractResult<()> {
    let model = load_onnx(
        common::asset("ppocr/ch_PP-OCRv4_rec_infer.onnx"),
        Some("N,3,48,W,f32"),
    )?;
    let classes = tract_ragged::ocr::classes(&model.properties)?;
    let full = RaggedModel::new(model, RaggedSpec::new("x", 3))?;
    let half = full.clone().at_precision(Precision::F16)?;
    let gpu = half.into_runnable_with(common::cuda::cuda())?;
    let exact = full.into_runnable_with(common::cuda::cuda())?;
    let lines: Vec<Tensor> = common::text_lines().into_iter().map(|(t, _)| t).collect();
    let host = common::cuda::host_nodes_of_plan(&gpu, &lines);
    assert!(host.is_empty(), "on the host: {host:?}");
    let (plan, _) = gpu.prepared(&lines)?;
    let plan = plan
        .downcast_ref::<tract_ragged::cuda::graph::CudaPlan>()
        .expect("a CudaPlan");
    let in_f16 = f16_nodes(plan.model());
    // Every convolution on ours (cuDNN in pseudo-half, our depthwise kernel, cuBLAS f16
    // GEMMs), none on tract-cuda's direct f16 kernel (`CudaConv`).
    let ops: Vec<String> = plan
        .model()
        .nodes()
        .iter()
        .map(|n| n.op.name().to_string())
        .collect();
    for ours in ["CudaCudnnConv", "CudaDepthwise", "CudaPointwise"] {
        assert!(ops.iter().any(|o| o == ours), "no {ours} in the f16 plan");
    }
    assert!(
        !ops.iter().any(|o| o == "CudaConv"),
        "tract-cuda's f16 conv in the plan"
    );
    let batched = gpu.run_batch(&lines)?;
    let alone = gpu.run_one_by_one(&lines)?;
    let reference = exact.run_one_by_one(&lines)?;
    let (mut worst_alone, mut worst_half, mut worst_f32, mut texts) = (0f32, 0f32, 0f32, 0);
    for ((b, a), r) in batched.iter().zip(&alone).zip(&reference) {
        worst_alone = worst_alone.max(common::norm_rel(&b[0], &a[0]));
        worst_half = worst_half.max(common::norm_rel(&a[0], &r[0]));
        worst_f32 = worst_f32.max(common::max_abs(&b[0], &r[0]));
        texts += (tract_ragged::ocr::ctc_greedy(&b[0], &classes)?
            != tract_ragged::ocr::ctc_greedy(&r[0], &classes)?) as usize;
    }
    eprintln!(
        "PP-OCRv4 rec f16 on ragged-cuda: {in_f16} f16 nodes; norm-wise, batched vs alone \
         (f16) {worst_alone:e}, f16 alone vs f32 alone {worst_half:e}; batched vs f32 alone: \
         largest |difference| {worst_f32:e}, text differs on {texts}/{} lines",
        lines.len()
    );
    assert!(in_f16 > 100, "{in_f16} nodes in f16");
    assert!(
        worst_alone <= worst_half.max(1e-2),
        "batched vs alone in f16 {worst_alone:e}, beyond f16's own {worst_half:e}"
    );
    assert!(texts <= 1, "f16 changes the text of {texts} lines");
    Ok(())
}
