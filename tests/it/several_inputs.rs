//! Models of several inputs: inputs ragged along the ragged input's widths
//! (a BERT-like encoder's `attention_mask` and `token_type_ids` beside its `input_ids`),
//! one value per sample (a streaming model's state) and shared by the batch (a gain).
//! Each sample in a ragged batch gets what it gets alone through the original model; the
//! roles are found from the input facts; what does not fit is refused naming the sample
//! and the input. Models: `scripts/token_encoders.py` (`fixtures/encoders`).

use crate::common::max_difference;
use crate::common::onnx::Rng;
use tract_ragged::prelude::*;
use tract_ragged::transform::InputRole;

fn runnable(name: &str, fact: &str, input: &str, axis: usize) -> RaggedRunnable {
    let path = crate::common::root()
        .join("fixtures/encoders")
        .join(name)
        .join("model.onnx");
    let model = load_onnx(path, Some(fact)).unwrap();
    RaggedModel::new(model, RaggedSpec::new(input, axis))
        .unwrap()
        .into_runnable()
        .unwrap()
}

/// The roles the runnable found for its inputs.
fn roles(runnable: &RaggedRunnable) -> Vec<InputRole> {
    runnable
        .input_slots()
        .unwrap()
        .into_iter()
        .map(|s| s.role)
        .collect()
}

/// Token sequences of `lengths` for the masked encoder: ids, the mask `mask(i, n)` gives,
/// token types `types(i, n)`.
fn sequences(
    rng: &mut Rng,
    lengths: &[usize],
    mask: impl Fn(usize, usize) -> bool,
    types: impl Fn(usize, usize) -> bool,
) -> Vec<TVec<Tensor>> {
    lengths
        .iter()
        .map(|&n| {
            let ids: Vec<i64> = (0..n).map(|_| rng.below(50) as i64).collect();
            let mask: Vec<i64> = (0..n).map(|i| mask(i, n) as i64).collect();
            let types: Vec<i64> = (0..n).map(|i| types(i, n) as i64).collect();
            tvec![tensor1(&ids), tensor1(&mask), tensor1(&types)]
        })
        .collect()
}

/// Sequences for `scripts/token_encoders.py`'s BERTs: a mask ending in zeros on the
/// longer ones; token types, or for `hf_roberta` none and pad ids (1) where the mask is 0.
fn bert_sequences(name: &str, rng: &mut Rng, lengths: &[usize]) -> Vec<TVec<Tensor>> {
    let keep = |i: usize, n: usize| i < (n - n / 3).max(1);
    let samples = sequences(rng, lengths, keep, |i, n| i >= n / 2);
    if name != "hf_roberta" {
        return samples;
    }
    samples
        .into_iter()
        .zip(lengths)
        .map(|(s, &n)| {
            let ids: Vec<i64> = s[0]
                .to_plain_array_view::<i64>()
                .unwrap()
                .iter()
                .enumerate()
                .map(|(i, id)| if keep(i, n) { *id } else { 1 })
                .collect();
            tvec![tensor1(&ids), s[1].clone()]
        })
        .collect()
}

/// Clips of `lengths` x `channels` and a state of `state` values each.
fn clips(rng: &mut Rng, lengths: &[usize], channels: usize, state: &[usize]) -> Vec<TVec<Tensor>> {
    lengths
        .iter()
        .map(|&t| {
            let x = Tensor::from_shape(&[t, channels], &rng.vec(t * channels, 1.0)).unwrap();
            let len = state.iter().product();
            tvec![x, Tensor::from_shape(state, &rng.vec(len, 1.0)).unwrap()]
        })
        .collect()
}

#[test]
fn an_encoder_with_its_mask_and_token_types_gives_each_sequence_what_it_gets_alone() {
    let runnable = runnable("masked_encoder", "N,L,i64", "input_ids", 1);
    let roles = roles(&runnable);
    assert!(
        roles.iter().all(|r| matches!(r, InputRole::Ragged(_))),
        "{roles:?}"
    );
    // Some sequences end with tokens the mask leaves out, as tokenizers pad them.
    let samples = sequences(
        &mut Rng(9),
        &[1, 4, 9, 16, 23, 31, 40],
        |i, n| i < (n - n / 4).max(1),
        |i, n| i >= n / 2,
    );
    let alone: Vec<TVec<Tensor>> = runnable.run_one_by_one(Samples::ordered(&samples)).unwrap();
    let batched = runnable.run_batch(Samples::ordered(&samples)).unwrap();
    let worst = max_difference(&batched, &alone);
    assert!(worst <= 1e-5, "the batch differs by {worst}");
    let many = runnable.run(Samples::ordered(&samples)).unwrap();
    let worst = max_difference(&many, &alone);
    assert!(worst <= 1e-5, "run differs by {worst}");
    // A mask of another length than its sequence: refused, naming the sample and input.
    let mut bad = samples.clone();
    bad[2][1] = tensor1(&[1i64, 1]);
    let err = format!(
        "{:#}",
        runnable.run_batch(Samples::ordered(&bad)).unwrap_err()
    );
    assert!(
        err.contains("sample 2") && err.contains("attention_mask"),
        "{err}"
    );
    // One tensor for a sample of three inputs: refused, saying which it takes.
    let err = format!("{:#}", runnable.run_batch(&[tensor1(&[1i64])]).unwrap_err());
    assert!(
        err.contains("gives 1 inputs") && err.contains("attention_mask"),
        "{err}"
    );
}

/// Two-layer BERTs written as `torch.onnx.export` writes Hugging Face's `BertModel`
/// (`scripts/token_encoders.py`'s `hf_bert`: heads split by Reshapes of gathered shapes,
/// the extended mask at f32's lowest, Erf GELU, both outputs; `hf_bert_sdpa`: the mask
/// expanded to [N, 1, L, L] and filled through `Where`, the scale on the queries and
/// keys; `hf_roberta`: no token types, positions numbered by a CumSum over the ids that are
/// not the pad id 1): every token's state and the pooled vectors as alone.
#[test]
fn berts_as_torch_exports_them_give_each_sequence_what_it_gets_alone() {
    for name in ["hf_bert", "hf_bert_sdpa", "hf_roberta"] {
        let runnable = runnable(name, "N,L,i64", "input_ids", 1);
        let samples = bert_sequences(name, &mut Rng(21), &[1, 2, 7, 16, 29, 40]);
        let alone: Vec<TVec<Tensor>> = runnable.run_one_by_one(Samples::ordered(&samples)).unwrap();
        assert_eq!(alone[3][0].shape(), &[16, 16]);
        assert_eq!(alone[3][1].shape(), &[16]);
        let batched = runnable.run_batch(Samples::ordered(&samples)).unwrap();
        let worst = max_difference(&batched, &alone);
        assert!(worst <= 1e-5, "{name}: the batch differs by {worst}");
        let many = runnable.run(Samples::ordered(&samples)).unwrap();
        let worst = max_difference(&many, &alone);
        assert!(worst <= 1e-5, "{name}: run differs by {worst}");
    }
}

/// An ONNX LSTM whose initial state `h0`, `c0` [1, N, H] is a model input (a streaming
/// audio model's): the states are per sample along axis 1, the recurrence tract-ragged's
/// (each clip to its own length), every step's state and the last ones as alone.
#[test]
fn an_lstm_given_its_initial_state_gives_each_clip_what_it_gets_alone() {
    let runnable = runnable("lstm_state", "N,T,4,f32", "x", 1);
    let roles = roles(&runnable);
    assert_eq!(
        roles[1..],
        [
            InputRole::PerSample { batch: 1 },
            InputRole::PerSample { batch: 1 }
        ]
    );
    let mut rng = Rng(31);
    let samples: Vec<TVec<Tensor>> = [1usize, 6, 23, 12]
        .iter()
        .map(|&t| {
            let state = |rng: &mut Rng| Tensor::from_shape(&[1, 8], &rng.vec(8, 1.0)).unwrap();
            let x = Tensor::from_shape(&[t, 4], &rng.vec(t * 4, 1.0)).unwrap();
            tvec![x, state(&mut rng), state(&mut rng)]
        })
        .collect();
    let alone: Vec<TVec<Tensor>> = runnable.run_one_by_one(Samples::ordered(&samples)).unwrap();
    assert_eq!(alone[2][0].shape(), &[23, 8]);
    assert_eq!(alone[2][1].shape(), &[1, 8]);
    let batched = runnable.run_batch(Samples::ordered(&samples)).unwrap();
    let worst = max_difference(&batched, &alone);
    assert!(worst <= 1e-5, "the batch differs by {worst}");
}

#[test]
fn a_model_with_a_state_and_a_shared_gain_gives_each_clip_what_it_gets_alone() {
    let runnable = runnable("stateful", "N,T,4,f32", "x", 1);
    let roles = roles(&runnable);
    assert!(matches!(roles[0], InputRole::Ragged(_)), "{roles:?}");
    assert_eq!(
        roles[1..],
        [InputRole::PerSample { batch: 0 }, InputRole::Shared]
    );
    let samples = clips(&mut Rng(4), &[1, 3, 8, 20, 13], 4, &[8]);
    let gain = tensor0(1.5f32);
    let given = Samples::ordered(&samples).shared("gain", &gain);
    let alone = runnable.run_one_by_one(given.clone()).unwrap();
    let batched = runnable.run_batch(given.clone()).unwrap();
    let worst = max_difference(&batched, &alone);
    assert!(worst <= 1e-5, "the batch differs by {worst}");
    let many = runnable.run(given).unwrap();
    let worst = max_difference(&many, &alone);
    assert!(worst <= 1e-5, "run differs by {worst}");
    let err = format!(
        "{:#}",
        runnable.run_batch(Samples::ordered(&samples)).unwrap_err()
    );
    assert!(
        err.contains("shared input") && err.contains("gain"),
        "{err}"
    );
}

/// The verbs take samples of several inputs by name or in the model's order, the shared
/// ones by name: each sample what it gets alone. Under `run_each` a sample without an
/// input, or with one the model does not take per sample, fails alone, naming itself.
#[test]
fn samples_by_name_or_order_run_through_every_verb() {
    let runnable = runnable("stateful", "N,T,4,f32", "x", 1);
    let clips = clips(&mut Rng(8), &[1, 3, 8, 20, 13, 2], 4, &[8]);
    let gain = tensor0(1.5f32);
    let alone = runnable
        .run_one_by_one(Samples::ordered(&clips).shared("gain", &gain))
        .unwrap();
    fn named(c: &TVec<Tensor>) -> Sample<'_> {
        Sample::named([("x", &c[0]), ("state", &c[1])])
    }
    let by_name = Samples::new(clips.iter().map(named)).shared("gain", &gain);
    let in_order =
        Samples::new(clips.iter().map(|c| Sample::ordered(c.iter()))).shared("gain", &gain);
    for (how, samples) in [("by name", &by_name), ("in order", &in_order)] {
        let each: Vec<TVec<Tensor>> = runnable
            .run_each(samples.clone())
            .unwrap()
            .into_iter()
            .collect::<TractResult<_>>()
            .unwrap();
        for (verb, outputs) in [
            ("run", runnable.run(samples.clone()).unwrap()),
            ("run_batch", runnable.run_batch(samples.clone()).unwrap()),
            (
                "run_one_by_one",
                runnable.run_one_by_one(samples.clone()).unwrap(),
            ),
            ("run_each", each),
        ] {
            let worst = max_difference(&outputs, &alone);
            assert!(
                worst <= 1e-5,
                "{verb}, {how}: differs from alone by {worst}"
            );
        }
    }
    let mut bad: Vec<Sample> = clips.iter().map(named).collect();
    bad[1] = Sample::named([("x", &clips[1][0])]);
    bad[3] = Sample::named([
        ("x", &clips[3][0]),
        ("state", &clips[3][1]),
        ("gain", &gain),
    ]);
    let bad = Samples::from(bad).shared("gain", &gain);
    let each = runnable.run_each(bad.clone()).unwrap();
    for k in [0, 2, 4, 5] {
        let worst = max_difference(
            std::slice::from_ref(each[k].as_ref().unwrap()),
            std::slice::from_ref(&alone[k]),
        );
        assert!(worst <= 1e-5, "sample {k} differs from alone by {worst}");
    }
    let said = |k: usize| format!("{:#}", each[k].as_ref().unwrap_err());
    assert!(
        said(1).contains("sample 1 lacks input \"state\""),
        "{}",
        said(1)
    );
    assert!(
        said(3).contains("sample 3 gives input \"gain\""),
        "{}",
        said(3)
    );
    for (k, input) in [(1, "state"), (3, "gain")] {
        let e = each[k].as_ref().unwrap_err();
        assert_eq!(tract_ragged::error::kind(e), ErrorKind::BadSample, "{e:#}");
        let bad = e.downcast_ref::<tract_ragged::error::BadSample>();
        assert_eq!(bad.and_then(|b| b.input.as_deref()), Some(input), "{e:#}");
    }
    let e = runnable.run(bad).unwrap_err();
    assert_eq!(tract_ragged::error::kind(&e), ErrorKind::BadSample, "{e:#}");
    // The shared input left out, or given under a name the model does not share.
    let e = runnable
        .run(Samples::new(clips.iter().map(named)))
        .unwrap_err();
    assert!(
        format!("{e:#}").contains("give it as a shared input"),
        "{e:#}"
    );
    let e = runnable
        .run(in_order.clone().shared("gains", &gain))
        .unwrap_err();
    assert!(format!("{e:#}").contains("\"gains\""), "{e:#}");
}

/// On ragged-cuda: the encoders with their masks and token types, the stateful model and
/// the LSTM given its initial state, each sample what it gets alone on the CPU.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA device"]
fn several_inputs_on_cuda_give_each_sample_what_it_gets_alone() {
    let cuda = runtime_for_name("ragged-cuda")
        .unwrap()
        .expect("ragged-cuda is not registered");
    for (name, fact, input) in [
        ("masked_encoder", "N,L,i64", "input_ids"),
        ("hf_bert", "N,L,i64", "input_ids"),
        ("hf_bert_sdpa", "N,L,i64", "input_ids"),
        ("hf_roberta", "N,L,i64", "input_ids"),
        ("stateful", "N,T,4,f32", "x"),
        ("lstm_state", "N,T,4,f32", "x"),
    ] {
        let cpu = runnable(name, fact, input, 1);
        let gpu = cpu.model().clone().into_runnable_with(cuda).unwrap();
        let mut rng = Rng(5);
        let (samples, shared) = if name == "stateful" {
            let samples = clips(&mut rng, &[2, 9, 30], 4, &[8]);
            (samples, vec![("gain", tensor0(0.75f32))])
        } else if name == "lstm_state" {
            let samples = clips(&mut rng, &[2, 9, 30], 4, &[1, 8])
                .into_iter()
                .map(|mut s| {
                    let c0 = Tensor::from_shape(&[1, 8], &rng.vec(8, 1.0)).unwrap();
                    s.push(c0);
                    s
                })
                .collect();
            (samples, vec![])
        } else if name.starts_with("hf_") {
            (bert_sequences(name, &mut rng, &[3, 17, 40]), vec![])
        } else {
            let samples = sequences(
                &mut rng,
                &[3, 17, 40],
                |i, n| i + 2 < n.max(3),
                |i, _| i % 2 == 1,
            );
            (samples, vec![])
        };
        let given = shared
            .iter()
            .fold(Samples::ordered(&samples), |g, (n, t)| g.shared(*n, t));
        let alone = cpu.run_one_by_one(given.clone()).unwrap();
        let on_gpu = gpu.run_batch(given).unwrap();
        let worst = max_difference(&on_gpu, &alone);
        assert!(
            worst <= 1e-4,
            "{name}: ragged-cuda differs from the CPU alone by {worst}"
        );
    }
}

/// A model whose per-sample input has its batch on axis 1 (an ONNX recurrence's initial
/// state, [directions, N, H]), and gives it back as an output: each sample's slice along
/// that axis in, its own out, as alone. Two axes sized as the batch: refused.
fn state_on_axis_1(batch_twice: bool) -> TypedModel {
    let mut model = TypedModel::default();
    let n = model.symbols.sym("N");
    let w = model.symbols.sym("W");
    let first = if batch_twice { n.to_dim() } else { 1.to_dim() };
    let state = [first, n.to_dim(), 2.to_dim()];
    let x = model
        .add_source("x", f32::fact([n.to_dim(), w.to_dim(), 2.to_dim()]))
        .unwrap();
    let h = model.add_source("h", f32::fact(state)).unwrap();
    let moved = model
        .wire_node(
            "h.moved",
            tract_core::ops::change_axes::AxisOp::Move(1, 0),
            &[h],
        )
        .unwrap();
    let y = model
        .wire_node("y", tract_core::ops::math::add(), &[x, moved[0]])
        .unwrap();
    let twice = model
        .wire_node("twice", tract_core::ops::math::add(), &[h, h])
        .unwrap();
    model.select_output_outlets(&[y[0], twice[0]]).unwrap();
    model
}

#[test]
fn a_per_sample_input_with_its_batch_on_axis_1_is_stacked_there() {
    let model = state_on_axis_1(false);
    let runnable = RaggedModel::new(model, RaggedSpec::new("x", 1))
        .unwrap()
        .into_runnable()
        .unwrap();
    assert_eq!(roles(&runnable)[1], InputRole::PerSample { batch: 1 });
    let samples = clips(&mut Rng(8), &[2, 7, 4], 2, &[1, 2]);
    let alone: Vec<TVec<Tensor>> = runnable.run_one_by_one(Samples::ordered(&samples)).unwrap();
    let batched = runnable.run_batch(Samples::ordered(&samples)).unwrap();
    assert_eq!(
        batched[1][1].shape(),
        &[1, 2],
        "the state's batch axis removed"
    );
    let worst = max_difference(&batched, &alone);
    assert!(worst <= 1e-6, "the batch differs by {worst}");
}

#[test]
fn an_input_with_two_axes_sized_as_the_batch_is_refused() {
    let model = state_on_axis_1(true);
    let err = match RaggedModel::new(model, RaggedSpec::new("x", 1)) {
        Ok(_) => panic!("accepted"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("\"h\"") && err.contains("ambiguous"), "{err}");
}
