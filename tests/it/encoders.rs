//! Token encoders: token embeddings gathered by id from a constant table,
//! positions numbered from the input's own shape (a `Range(0, L)`, or a constant buffer of
//! position ids cut to `L`), self-attention over the sequence, then mean pooling, the
//! first token's vector, or every token's. Ragged batches against each sample alone; the
//! models and token sequences are `scripts/token_encoders.py`'s (`fixtures/encoders`), and
//! `scripts/ort_models.sh` checks the same against ONNX Runtime one sample at a time.
//! Gathers and positions that would read past a sample's width are refused.

#[cfg(feature = "cuda")]
use crate::common;

use crate::common::max_difference;
use crate::common::onnx::{Graph, Rng, int};
use crate::common::typed;
use tract_onnx::prelude::InferenceModelExt;
use tract_ragged::prelude::*;

fn encoder(name: &str) -> (RaggedRunnable, Vec<Tensor>) {
    let dir = crate::common::root().join("fixtures/encoders").join(name);
    // The models declare [batch, sequence]: the fact's own symbols take their place.
    let model = load_onnx(dir.join("model.onnx"), Some("N,L,i64")).unwrap();
    let runnable = RaggedModel::new(model, RaggedSpec::new("input_ids", 1))
        .unwrap()
        .into_runnable()
        .unwrap();
    let samples = tract_ragged::npz::read_samples(dir.join("samples.npz"), 1 << 30)
        .unwrap()
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    (runnable, samples)
}

/// Every encoder in one batch of its 12 sequences (lengths 1 to 40), in reverse order,
/// and in pairs, against each sequence alone.
#[test]
fn token_encoders_in_ragged_batches_give_each_sequence_what_it_gets_alone() {
    for name in ["encoder_mean", "encoder_first", "encoder_tokens"] {
        let (runnable, samples) = encoder(name);
        let alone = runnable.run_one_by_one(&samples).unwrap();
        let batched = runnable.run_batch(&samples).unwrap();
        let worst = max_difference(&batched, &alone);
        assert!(worst <= 1e-5, "{name}: one batch differs by {worst}");
        let reversed: Vec<Tensor> = samples.iter().rev().cloned().collect();
        let mut back = runnable.run_batch(&reversed).unwrap();
        back.reverse();
        let worst = max_difference(&back, &alone);
        assert!(worst <= 1e-5, "{name}: reversed batch differs by {worst}");
        for (ix, pair) in samples.chunks(2).enumerate() {
            let out = runnable.run_batch(pair).unwrap();
            let worst = max_difference(&out, &alone[2 * ix..2 * ix + pair.len()]);
            assert!(worst <= 1e-5, "{name}: pair {ix} differs by {worst}");
        }
    }
}

/// A model gathering along the ragged axis of a [batch, width, channels] input with the
/// constant indices `indices`: the error, if refused.
fn gather_along_the_width(indices: &[i64]) -> Option<String> {
    let mut rng = Rng(3);
    let mut g = Graph::default();
    let w = g.weight(&[2, 2], rng.vec(4, 0.5));
    let x = g.op("MatMul", &["x", &w], vec![]);
    let at = g.ints_const(indices);
    let y = g.op("Gather", &[&x, &at], vec![int("axis", 1)]);
    let model = typed(&g.model("x", 3, &[&y]), "N,W,2,f32").unwrap();
    RaggedModel::new(model, RaggedSpec::new("x", 1))
        .err()
        .map(|e| {
            assert_eq!(error_kind(&e), ErrorKind::Refused, "{e:#}");
            format!("{e:#}")
        })
}

#[test]
fn gathers_along_the_ragged_axis_read_only_the_first_position() {
    assert_eq!(gather_along_the_width(&[0]), None);
    // (A single non-negative index becomes a slice in tract's declutter, whose rule cuts
    // each sample's width as its slice alone does.)
    for indices in [&[-1][..], &[0, 2], &[3, 1]] {
        let Some(err) = gather_along_the_width(indices) else {
            panic!("{indices:?} accepted");
        };
        // A gather tract keeps, or the slice it makes of one counted from the end.
        assert!(
            err.contains("only position 0") || err.contains("depends on the padded width"),
            "{indices:?}: {err}"
        );
    }
}

/// On ragged-cuda: the encoders in one batch, each sequence what it gets alone there and
/// on the CPU; the plan's nodes between the syncs on the device.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA device"]
fn token_encoders_on_cuda_give_each_sequence_what_it_gets_alone() {
    for name in ["encoder_mean", "encoder_first", "encoder_tokens"] {
        let (cpu, samples) = encoder(name);
        let gpu = cpu
            .model()
            .clone()
            .into_runnable_with(common::cuda::cuda())
            .unwrap();
        let host = common::cuda::host_nodes_of_plan(&gpu, &samples);
        println!("{name}: nodes on the host: {host:?}");
        common::cuda::assert_exact_on_cuda(&gpu, &cpu, &samples);
    }
}

/// A model declaring `[batch, sequence]` for its `input_ids` and `attention_mask`, given
/// `N,L,i64` for the first: the second takes the same symbols, so both type alike.
#[test]
fn the_fact_given_renames_the_symbols_other_inputs_share() {
    let path = crate::common::root().join("fixtures/encoders/two_inputs.onnx");
    let model = tract_ragged::load::read_onnx(&path, Some("N,L,i64"))
        .unwrap()
        .model;
    let first = format!("{:?}", model.input_fact(0).unwrap());
    let second = format!("{:?}", model.input_fact(1).unwrap());
    assert_eq!(first, second, "the inputs' facts differ");
    assert!(second.contains("N,L"), "{second}");
    let typed = model.into_typed().unwrap();
    assert_eq!(
        typed.input_fact(1).unwrap().shape,
        typed.input_fact(0).unwrap().shape
    );
}

/// A flatten over several symbols (transformers' TorchScript exports flatten `[N, L, H]`
/// tensors) types over them: tract-hir's own Flatten refuses any input of two symbolic
/// dims.
#[test]
fn a_flatten_over_the_batch_and_the_sequence_types_symbolically() -> TractResult<()> {
    let mut g = Graph::default();
    let y = g.op("Flatten", &["x"], vec![int("axis", 2)]);
    let proto = g.model("x", 3, &[&y]);
    let plain = tract_onnx::onnx()
        .model_for_proto_model(&proto)
        .and_then(|m| {
            let fact = tract_onnx::prelude::InferenceFact::from_spec(&m.symbols, "N,L,4,f32")?;
            m.with_input_fact(0, fact)?.into_typed()
        });
    assert!(plain.is_err(), "tract's own Flatten typed it");
    let model = typed(&proto, "N,L,4,f32")?;
    let (n, l) = (model.symbols.sym("N"), model.symbols.sym("L"));
    let shape = model.output_fact(0)?.shape.to_tvec();
    assert_eq!(shape, tvec!(n.to_dim() * l.to_dim(), 4.to_dim()));
    Ok(())
}

/// Transformers' activations as exporters write them: the exact GELU (`x * 0.5 * (1 +
/// erf(x / √2))`, which tract fuses into its `GeluExact`), `gelu_new`'s cube (`Pow(x, 3)`,
/// tract's `PowConst`) and the `IsNan` guard after an attention softmax. tract-cuda has
/// no kernel for the three: ragged-cuda writes them as ops it has, and no node is left on
/// the host between the syncs.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA device"]
fn transformer_activations_run_on_the_device_only() {
    let mut rng = Rng(11);
    let mut g = Graph::default();
    let w = g.weight(&[4, 4], rng.vec(16, 0.5));
    let x = g.op("MatMul", &["x", &w], vec![]);
    let sqrt2 = g.weight(&[1], vec![std::f32::consts::SQRT_2]);
    let (one, half, three) = (
        g.weight(&[1], vec![1.0]),
        g.weight(&[1], vec![0.5]),
        g.weight(&[1], vec![3.0]),
    );
    let scaled = g.op("Div", &[&x, &sqrt2], vec![]);
    let erf = g.op("Erf", &[&scaled], vec![]);
    let erf = g.op("Add", &[&erf, &one], vec![]);
    let gelu = g.op("Mul", &[&x, &erf], vec![]);
    let gelu = g.op("Mul", &[&gelu, &half], vec![]);
    let cube = g.op("Pow", &[&gelu, &three], vec![]);
    let keys = g.op(
        "Transpose",
        &[&cube],
        vec![crate::common::onnx::ints("perm", &[0, 2, 1])],
    );
    let scores = g.op("MatMul", &[&cube, &keys], vec![]);
    let p = g.op("Softmax", &[&scores], vec![int("axis", -1)]);
    let nan = g.op("IsNaN", &[&p], vec![]);
    let zero = g.weight(&[1], vec![0.0]);
    let p = g.op("Where", &[&nan, &zero, &p], vec![]);
    let y = g.op("MatMul", &[&p, &gelu], vec![]);
    let model = typed(&g.model("x", 3, &[&y]), "N,L,4,f32").unwrap();
    let cpu = RaggedModel::new(model, RaggedSpec::new("x", 1))
        .unwrap()
        .into_runnable()
        .unwrap();
    let gpu = cpu
        .model()
        .clone()
        .into_runnable_with(common::cuda::cuda())
        .unwrap();
    let samples = crate::common::samples(&mut rng, &[1, 4], 0, &[7, 3, 12, 1, 5]);
    let host = common::cuda::host_nodes_of_plan(&gpu, &samples);
    assert!(host.is_empty(), "nodes on the host: {host:?}");
    common::cuda::assert_exact_on_cuda(&gpu, &cpu, &samples);
}

/// The position arithmetic of the zoo's text encoders (RoBERTa's and MPNet's position ids,
/// MPNet's relative buckets, DeBERTa's relative positions), which tract computes partly
/// as `TDim` and with integer negations, absolute values and signs: ragged-cuda computes
/// it as `i64` with ops tract-cuda has (`cuda::integers`, `cuda::expand`). Run on the
/// CPU, each plan so rewritten gives the same bits as before, and computes no `TDim` and
/// none of those element-wise ops on integers.
#[cfg(feature = "cuda")]
#[test]
fn position_arithmetic_rewritten_for_the_device_computes_the_same() -> TractResult<()> {
    use tract_core::ops::element_wise::ElementWiseOp;
    use tract_core::ops::konst::Const;
    for name in [
        "hf_roberta",
        "hf_roberta_dyn",
        "hf_xlm_roberta",
        "hf_mpnet",
        "hf_mpnet_dyn",
        "hf_deberta",
        "hf_deberta_v2",
        "hf_deberta_v2_dyn",
    ] {
        let path = crate::common::root().join(format!("fixtures/zoo/{name}.onnx"));
        let model = load_onnx(&path, Some("N,L,i64"))?;
        let runnable = RaggedModel::new(model, RaggedSpec::new("input_ids", 1))?.into_runnable()?;
        let like = Tensor::zero::<i64>(&[16])?;
        let model = runnable.concrete_model(2, &[16], &like, true)?;
        let inputs = concrete_token_inputs(&model, &mut Rng(5))?;
        let before = model.clone().into_runnable()?.run(inputs.clone())?;
        let mut rewritten = model;
        let dims = tract_ragged::cuda::integers::dims_as_i64(&mut rewritten)?;
        assert!(dims > 0, "{name}: no TDim value computed");
        tract_ragged::cuda::expand::element_wise_for_the_device(&mut rewritten)?;
        for node in rewritten.nodes() {
            let integer_ew = node.op_as::<ElementWiseOp>().is_some_and(|e| {
                matches!(&*e.0.name(), "Neg" | "Abs" | "Sign")
                    && node.outputs[0].fact.datum_type.is_integer()
            });
            let dim = !node.op_is::<Const>()
                && node
                    .outputs
                    .iter()
                    .any(|o| o.fact.datum_type == TDim::datum_type());
            assert!(!integer_ew && !dim, "{name}: {node}");
        }
        let after = rewritten.into_runnable()?.run(inputs)?;
        assert_eq!(before.len(), after.len());
        for (b, a) in before.iter().zip(&after) {
            assert_eq!(b, a, "{name}: rewritten ({dims} nodes as i64) differs");
        }
    }
    Ok(())
}

/// Inputs for a concrete plan of a token encoder (`concrete_model(2, &[16], ..)`): widths
/// 16 and 9, random ids, masks of ones.
#[cfg(feature = "cuda")]
fn concrete_token_inputs(model: &TypedModel, rng: &mut Rng) -> TractResult<TVec<TValue>> {
    use tract_core::internal::TractErrorContext;
    model
        .input_outlets()?
        .iter()
        .map(|&o| {
            let fact = model.outlet_fact(o)?;
            let shape = fact
                .shape
                .as_concrete()
                .context("a concrete input")?
                .to_vec();
            let input = &model.node(o.node).name;
            let values: Vec<i64> = if input.ends_with("widths") {
                vec![16, 9]
            } else if input == "input_ids" {
                (0..shape.iter().product())
                    .map(|_| 5 + rng.below(200) as i64)
                    .collect()
            } else {
                vec![1; shape.iter().product()]
            };
            Ok(tract_ndarray::ArrayD::from_shape_vec(shape, values)?.into_tvalue())
        })
        .collect()
}

/// ragged-cuda writes the integer products of int8 encoders (`MatMulInteger`) as products
/// over `i32`, for its own kernel, and their dequantizations as float tables and
/// arithmetic (`cuda::quantized`). Run on the CPU, each plan so rewritten gives the same
/// bits as before and holds no quantized product and no dequantization.
#[cfg(feature = "cuda")]
#[test]
fn quantized_ops_rewritten_for_the_device_compute_the_same() -> TractResult<()> {
    use tract_core::ops::einsum::EinSum;
    use tract_core::ops::quant::DequantizeLinearF32;
    for name in [
        "hf_bert_int8",
        "hf_roberta_int8",
        "hf_gpt2_int8",
        "hf_t5_encoder_int8",
    ] {
        let path = crate::common::root().join(format!("fixtures/zoo/{name}.onnx"));
        let model = load_onnx(&path, Some("N,L,i64"))?;
        let runnable = RaggedModel::new(model, RaggedSpec::new("input_ids", 1))?.into_runnable()?;
        let like = Tensor::zero::<i64>(&[16])?;
        let model = runnable.concrete_model(2, &[16], &like, true)?;
        let inputs = concrete_token_inputs(&model, &mut Rng(7))?;
        let before = model.clone().into_runnable()?.run(inputs.clone())?;
        let mut rewritten = model;
        let done = tract_ragged::cuda::quantized::quantized_for_the_device(&mut rewritten)?;
        assert!(done > 0, "{name}: nothing rewritten");
        for node in rewritten.nodes() {
            let quantized = node.op_as::<EinSum>().is_some_and(|e| e.q_params.is_some())
                || node.op_is::<DequantizeLinearF32>();
            assert!(!quantized, "{name}: {node}");
        }
        let after = rewritten.into_runnable()?.run(inputs)?;
        assert_eq!(before.len(), after.len());
        for (b, a) in before.iter().zip(&after) {
            assert_eq!(b, a, "{name}: rewritten ({done} nodes) differs");
        }
    }
    Ok(())
}

/// int8 encoders as ONNX Runtime's `quantize_dynamic` writes them (`scripts/zoo/quantize.py`):
/// each activation quantized with a scale from the whole tensor's minimum and maximum.
/// Alone that is the sample's own; in a ragged batch each sample still gets its own
/// (`load::dynamic_quantization_per_sample`), so each sample's outputs are what it gets
/// alone, in a batch of sequences whose ranges differ.
#[test]
fn int8_encoders_quantize_each_sample_with_its_own_scale() {
    for name in ["hf_bert_int8", "hf_mpnet_int8"] {
        let path = crate::common::root().join(format!("fixtures/zoo/{name}.onnx"));
        let model = load_onnx(&path, Some("N,L,i64")).unwrap();
        assert!(
            model
                .nodes()
                .iter()
                .all(|n| !n.op.name().contains("DynamicQuantize")),
            "{name}: tract's whole-tensor DynamicQuantizeLinear is left"
        );
        let runnable = RaggedModel::new(model, RaggedSpec::new("input_ids", 1))
            .unwrap()
            .into_runnable()
            .unwrap();
        let samples = crate::common::token_samples(&mut Rng(9), &[16, 5, 40, 23, 1]);
        let alone: Vec<TVec<Tensor>> = runnable.run_one_by_one(Samples::ordered(&samples)).unwrap();
        let batched = runnable.run_batch(Samples::ordered(&samples)).unwrap();
        let worst = max_difference(&batched, &alone);
        assert!(worst <= 1e-6, "{name}: differs by {worst}");
    }
}
