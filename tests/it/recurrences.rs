//! Recurrences (ONNX LSTM, GRU, RNN) over the ragged axis: a ragged batch gives each
//! sample what it gets alone, in every direction and layout, stacked, with initial
//! states computed per sample, clipping and other activations; alone, tract-ragged's
//! recurrence gives what tract's own lowering gives where that lowering is right.

use crate::common;
use crate::common::crnn::{Rnn, crnn, rnn};
use crate::common::onnx::Rng;
use crate::common::{assert_exact, max_abs, samples};
use proptest::prelude::*;
use tract_core::internal::*;
use tract_onnx::prelude::InferenceModelExt;
use tract_ragged::ops::SequenceLengths;
use tract_ragged::ops::recurrence::{Activation, Cell, Direction, Inputs, Recurrence};
use tract_ragged::prelude::*;

const FACT: &str = "N,2,3,W,f32";

fn runnable(r: &Rnn, seed: u64) -> RaggedRunnable {
    let proto = crnn(&mut Rng(seed), 2, 3, 5, r);
    common::runnable(&proto, FACT, 3).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn a_crnn_batch_gives_each_sample_what_it_gets_alone(
        r in rnn(),
        widths in proptest::collection::vec(1usize..20, 1..5),
        seed in 1u64..1000,
    ) {
        let runnable = runnable(&r, seed);
        let batch = samples(&mut Rng(seed + 7), &[2, 3, 1], 2, &widths);
        assert_exact(&runnable, &batch, 1e-5).unwrap();
    }
}

/// The company holds no sway: a sample gets within a few ULP of what it gets alone in
/// batches of any company and padded width (the model alone is not the transformed model:
/// a mean divides by a constant there, by a per-sample value here; and tract's CPU
/// kernels are picked by the batch's size). The recurrence itself gives the same bits in
/// any batch (`lengths_run_each_sample_as_if_cut_to_its_length`).
#[test]
fn a_sample_gets_what_it_gets_alone_in_any_company() -> TractResult<()> {
    for cell in 0..3 {
        let r = Rnn {
            cell,
            direction: 2,
            hidden: 5,
            layers: 2,
            batch_first: false,
            bias: true,
            initial: true,
            clip: false,
            activations: false,
            linear_before_reset: true,
        };
        let runnable = runnable(&r, 11);
        let mut rng = Rng(3);
        let line = samples(&mut rng, &[2, 3, 1], 2, &[9]).remove(0);
        let alone = runnable.run_one_by_one(&[&line])?.remove(0);
        for company in [vec![], vec![1], vec![30, 2], vec![17, 9, 40]] {
            let mut batch = samples(&mut rng, &[2, 3, 1], 2, &company);
            batch.insert(1.min(batch.len()), line.clone());
            let at = batch.iter().position(|s| s == &line).context("the line")?;
            let out = runnable.run_batch(&batch)?.remove(at);
            for (j, (a, b)) in out.iter().zip(&alone).enumerate() {
                let d = common::rel_diff(a, b);
                assert!(
                    d <= 1e-6,
                    "cell {cell} output {j}, with {company:?}: {d:e} from alone"
                );
            }
        }
    }
    Ok(())
}

/// tract-onnx's own lowering (a Scan per direction) for what it implements right: the
/// default activations, no clip, both layouts, forward and bidirectional. Alone, one
/// sample at a time, the two agree.
#[test]
fn alone_the_recurrence_gives_what_tracts_lowering_gives() -> TractResult<()> {
    for (cell, direction, batch_first, initial) in [
        (0, 0, false, false),
        (0, 2, false, true),
        (1, 2, false, true),
        (1, 0, true, false),
        (2, 2, false, false),
        (2, 0, false, true),
    ] {
        let r = Rnn {
            cell,
            direction,
            hidden: 4,
            layers: 2,
            batch_first,
            bias: true,
            initial,
            clip: false,
            activations: false,
            // tract-onnx lowers GRUs of either kind; PyTorch exports this one.
            linear_before_reset: true,
        };
        let proto = crnn(&mut Rng(5), 2, 3, 5, &r);
        let ours = common::typed(&proto, "1,2,3,W,f32")?;
        let mut theirs = tract_onnx::onnx().model_for_proto_model(&proto)?;
        let fact =
            tract_onnx::tract_hir::infer::InferenceFact::from_spec(&theirs.symbols, "1,2,3,W,f32")?;
        theirs.set_input_fact(0, fact)?;
        let theirs = theirs.into_typed()?.into_decluttered()?;
        for w in [1, 4, 13] {
            let x = samples(&mut Rng(w as u64), &[1, 2, 3, 1], 3, &[w]).remove(0);
            let run = |m: &TypedModel| -> TractResult<TVec<TValue>> {
                let mut values: HashMap<Symbol, TDim> = HashMap::default();
                for s in m.symbols.all_symbols() {
                    values.insert(s, w.to_dim());
                }
                let concrete = m.set_symbols(&values)?;
                concrete
                    .into_runnable()?
                    .run(tvec!(x.clone().into_tvalue()))
            };
            for (j, (a, b)) in run(&ours)?.iter().zip(run(&theirs)?.iter()).enumerate() {
                let d = max_abs(a, b);
                assert!(d <= 1e-5, "{r:?} width {w} output {j}: {d:e}");
            }
        }
    }
    Ok(())
}

/// The op alone: `sequence_lens` (under the transform, the smaller of each sample's
/// width and the model's own, [`SequenceLengths`]) runs each sample to its length, which
/// is what the sample cut to that length gives: `Y` zero past it, `Y_h` its state there,
/// the reverse direction starting at the sample's own end; the same bits as alone.
#[test]
fn lengths_run_each_sample_as_if_cut_to_its_length() -> TractResult<()> {
    let (t, n, c, h) = (7, 3, 2, 3);
    let mut rng = Rng(9);
    let run = |op: &dyn TypedOp, inputs: TVec<Tensor>| -> TractResult<TVec<Tensor>> {
        let inputs = inputs.into_iter().map(|t| t.into_tvalue()).collect();
        let out = op.eval_out_of_plan(inputs)?.context("no eval")?;
        Ok(out.into_iter().map(|v| v.into_tensor()).collect())
    };
    // Given lengths 5, 2, 7 and widths 4, 6, 7 (row 1 of the table): the smaller wins.
    let table = Tensor::from_shape(&[2, n], &[7i64, 7, 7, 4, 6, 7])?;
    let lengths = run(
        &SequenceLengths { row: 1 },
        tvec!(table, tensor1(&[5i64, 2, 7])),
    )?
    .remove(0);
    assert_eq!(lengths, tensor1(&[4i32, 2, 7]));
    for cell in [Cell::Lstm, Cell::Gru, Cell::Rnn] {
        let g = cell.gates();
        let dirs = 2;
        let x = Tensor::from_shape(&[t, n, c], &rng.vec(t * n * c, 1.0))?;
        let w = Tensor::from_shape(&[dirs, g * h, c], &rng.vec(dirs * g * h * c, 0.6))?;
        let rr = Tensor::from_shape(&[dirs, g * h, h], &rng.vec(dirs * g * h * h, 0.6))?;
        let op = |lengths: bool| Recurrence {
            cell,
            direction: Direction::Bidirectional,
            hidden: h,
            batch_first: false,
            activations: cell.default_activations().repeat(dirs),
            clip: None,
            linear_before_reset: false,
            input_forget: false,
            inputs: Inputs {
                lengths,
                ..Inputs::default()
            },
        };
        let both = run(
            &op(true),
            tvec!(x.clone(), w.clone(), rr.clone(), lengths.clone()),
        )?;
        for (k, len) in [4usize, 2, 7].into_iter().enumerate() {
            let alone = x.slice(1, k, k + 1)?.slice(0, 0, len)?;
            let out = run(&op(false), tvec!(alone, w.clone(), rr.clone()))?;
            let y = both[0].slice(2, k, k + 1)?;
            assert_eq!(
                max_abs(&y.slice(0, 0, len)?, &out[0]),
                0.0,
                "{cell:?} sample {k}: Y"
            );
            if len < t {
                let past = y.slice(0, len, t)?;
                assert!(past.to_plain_array_view::<f32>()?.iter().all(|v| *v == 0.0));
            }
            let y_h = both[1].slice(1, k, k + 1)?;
            assert_eq!(max_abs(&y_h, &out[1]), 0.0, "{cell:?} sample {k}: Y_h");
        }
    }
    Ok(())
}

/// Every ONNX activation, by name in any case, with ONNX's defaults.
#[test]
fn activations_parse_with_onnx_defaults() -> TractResult<()> {
    assert_eq!(Activation::parse("Sigmoid", None, None)?.apply(0.0), 0.5);
    assert_eq!(
        Activation::parse("leakyrelu", None, None)?,
        Activation::LeakyRelu { alpha: 0.01 }
    );
    assert_eq!(
        Activation::parse("HardSigmoid", Some(0.3), None)?,
        Activation::HardSigmoid {
            alpha: 0.3,
            beta: 0.5
        }
    );
    assert!(Activation::parse("Gelu", None, None).is_err());
    Ok(())
}

/// Exports that pass `sequence_lens` compute it from the input's shape (every sample as
/// long as the padded sequence): under the transform, each sample's own width.
#[test]
fn sequence_lens_computed_from_the_padded_shape_become_each_samples_width() -> TractResult<()> {
    use common::onnx::{Graph, int, ints, string};
    let mut rng = Rng(21);
    let mut g = Graph::default();
    let axes = g.ints_const(&[2]);
    let x = g.op("Squeeze", &["x", &axes], vec![]);
    // [N, 2, W] -> [W, N, 2]
    let x = g.op("Transpose", &[&x], vec![ints("perm", &[2, 0, 1])]);
    let shape = g.op("Shape", &[&x], vec![]);
    let t = {
        let i = g.ints_const(&[0]);
        g.op("Gather", &[&shape, &i], vec![int("axis", 0)])
    };
    let n = {
        let i = g.ints_const(&[1]);
        g.op("Gather", &[&shape, &i], vec![int("axis", 0)])
    };
    let lens = g.op("Expand", &[&t, &n], vec![]);
    let lens = g.op("Cast", &[&lens], vec![int("to", 6)]);
    let h = 3;
    let w = g.weight(&[2, 4 * h, 2], rng.vec(8 * h * 2, 0.6));
    let r = g.weight(&[2, 4 * h, h], rng.vec(8 * h * h, 0.6));
    let y = g.op_n(
        "LSTM",
        &[&x, &w, &r, "", &lens],
        2,
        vec![
            int("hidden_size", h as i64),
            string("direction", "bidirectional"),
        ],
    );
    let runnable = common::runnable(&g.model("x", 4, &[&y[0], &y[1]]), "N,2,1,W,f32", 3)?;
    let lstm = runnable
        .model()
        .ragged
        .model
        .nodes()
        .iter()
        .find(|n| n.op.name() == "RaggedLSTM")
        .context("the LSTM")?;
    let info = lstm.op.info()?.join(" ");
    assert!(info.contains("sequence_lens"), "{info}");
    let lengths = runnable
        .model()
        .ragged
        .model
        .nodes()
        .iter()
        .find(|n| n.op.name() == "RaggedSequenceLengths")
        .context("the lengths")?;
    assert_eq!(
        lengths.inputs.len(),
        2,
        "the widths table and the model's own lengths"
    );
    let batch = samples(&mut rng, &[2, 1, 1], 2, &[6, 2, 11]);
    assert_exact(&runnable, &batch, 1e-6)
}

/// The recurrences cuDNN runs: the default activations, no clip, GRU with
/// `linear_before_reset` (PyTorch's).
#[cfg(feature = "cuda")]
fn cudnn_rnn() -> impl Strategy<Value = Rnn> {
    rnn().prop_map(|r| Rnn {
        clip: false,
        activations: false,
        linear_before_reset: true,
        ..r
    })
}

#[cfg(feature = "cuda")]
proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// On ragged-cuda (cuDNN), in every direction and layout, stacked, with states: each
    /// sample what it gets alone there, and what it gets alone on the CPU.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn crnns_on_cuda_give_each_sample_what_it_gets_alone(
        r in cudnn_rnn(),
        widths in proptest::collection::vec(1usize..40, 1..6),
        seed in 1u64..1000,
    ) {
        let proto = crnn(&mut Rng(seed), 2, 3, 5, &r);
        let (gpu, cpu) = common::cuda::pair(&proto, FACT);
        let batch = samples(&mut Rng(seed + 7), &[2, 3, 1], 2, &widths);
        common::cuda::assert_exact_on_cuda(&gpu, &cpu, &batch);
    }
}

/// A CRNN on ragged-cuda runs wholly on the device: nothing between the input and output
/// syncs but width arithmetic (the lengths among it), and a repeated batch replays as a
/// CUDA graph with the bits of a plain run.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA device"]
fn a_crnn_runs_wholly_on_the_device_and_replays_as_a_graph() -> TractResult<()> {
    for (cell, direction, batch_first) in [(0, 2, false), (1, 1, true), (2, 0, false)] {
        let r = Rnn {
            cell,
            direction,
            hidden: 8,
            layers: 2,
            batch_first,
            bias: true,
            initial: true,
            clip: false,
            activations: false,
            linear_before_reset: true,
        };
        let proto = crnn(&mut Rng(4), 2, 3, 5, &r);
        let model = RaggedModel::new(common::typed(&proto, FACT)?, RaggedSpec::new(0, 3))?;
        let concrete = {
            let mut values: HashMap<Symbol, TDim> = HashMap::default();
            for s in model.ragged.model.symbols.all_symbols() {
                values.insert(s, 16.to_dim());
            }
            model.ragged.model.set_symbols(&values)?
        };
        let translated = tract_ragged::cuda::RaggedCudaRuntime.translate(concrete)?;
        let host = tract_ragged::cuda::host_nodes(&translated)?;
        assert!(host.is_empty(), "{r:?}: on the host: {host:?}");
        let gpu = model.clone().into_runnable_with(common::cuda::cuda())?;
        let plain = common::cuda::without_graphs(model);
        // The same widths: cuDNN takes the lengths from the host, so a recurrence's graph
        // is keyed by them.
        let a = samples(&mut Rng(1), &[2, 3, 1], 2, &[9, 14, 3]);
        let b = samples(&mut Rng(2), &[2, 3, 1], 2, &[9, 14, 3]);
        common::cuda::assert_graph_replays(&format!("{r:?}"), &gpu, &plain, &[&a, &b]);
    }
    Ok(())
}

/// What cuDNN does not run is refused when the plan is made, naming the node and what
/// it lacks: never a recurrence left on the host.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA device"]
fn recurrences_cudnn_does_not_run_are_refused_naming_the_node() -> TractResult<()> {
    for (r, lacks) in [
        (
            Rnn {
                clip: true,
                ..Rnn::default_lstm()
            },
            "clip",
        ),
        (
            Rnn {
                activations: true,
                ..Rnn::default_lstm()
            },
            "activations",
        ),
        (
            Rnn {
                cell: 1,
                linear_before_reset: false,
                ..Rnn::default_lstm()
            },
            "linear_before_reset",
        ),
    ] {
        let proto = crnn(&mut Rng(4), 2, 3, 5, &r);
        let model = RaggedModel::new(common::typed(&proto, FACT)?, RaggedSpec::new(0, 3))?;
        let gpu = model.into_runnable_with(common::cuda::cuda())?;
        let err = gpu
            .run_batch(samples(&mut Rng(1), &[2, 3, 1], 2, &[5, 8]))
            .err()
            .map(|e| format!("{e:#}"))
            .context("ran")?;
        assert!(err.contains("cuDNN") && err.contains(lacks), "{err}");
        assert!(
            err.contains(&format!("{}_", r.op())),
            "the node is not named: {err}"
        );
    }
    Ok(())
}

/// CRNNs exported by PyTorch (benches/crnn.py, small: a 2-layer BiLSTM sequence first,
/// a 2-layer BiGRU batch first, initial states made from the batch size as PyTorch makes
/// them) on the rendered text lines: the model as exported, batched exactly.
#[test]
fn pytorch_crnn_exports_batch_exactly() -> TractResult<()> {
    let lines: Vec<Tensor> = common::text_lines().into_iter().map(|(t, _)| t).collect();
    for model in ["crnn-lstm-small.onnx", "crnn-gru-bf-small.onnx"] {
        let path = common::root().join("fixtures/rnn").join(model);
        let typed = load_onnx(&path, Some("N,3,48,W,f32"))?;
        let runnable = RaggedModel::new(typed, RaggedSpec::new("x", 3))?.into_runnable()?;
        assert_exact(&runnable, &lines[..12], 1e-5).with_context(|| model.to_string())?;
    }
    Ok(())
}
