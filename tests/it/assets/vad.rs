//! silero's voice-activity detectors, as the silero-vad wheel ships them (MIT;
//! `scripts/fetch-assets.sh` puts them in `assets/silero`): scripted PyTorch exported with
//! its control flow, `If`s on shapes (its LSTM cell's batch-1 branch, a squeeze of a time
//! axis of extent 1) and on the sample rate, an input given once; a reflect pad after the
//! chunk. Inputs `input [N, L]` (a chunk, 64 samples of context then 512 at 16 kHz),
//! `state [2, N, 128]`, `sr`; outputs the speech probability `[N, 1]` and the next state.
//! Streams in one ragged batch, each with its own state and chunk length, get what each
//! gets alone (and, in `scripts/ort_models.sh`, what ONNX Runtime gives each alone).

#[cfg(feature = "cuda")]
use crate::common;
use std::path::PathBuf;

use crate::common::max_difference;
use crate::common::onnx::Rng;
use tract_onnx::tract_hir::internal::TractErrorContext;
use tract_ragged::prelude::*;
use tract_ragged::transform::InputRole;

fn model_path(name: &str) -> PathBuf {
    crate::common::root()
        .join("assets/silero")
        .join(format!("{name}.onnx"))
}

/// Silero model `name` through the transform, its sample rate folded in when it takes one.
fn ragged_model(name: &str, sr: Option<i64>) -> TractResult<RaggedModel> {
    let mut onnx = tract_ragged::load::read_onnx(model_path(name), Some("N,L,f32"))?;
    tract_ragged::load::set_input_facts(&mut onnx.model, &[("state", "2,N,128,f32")])?;
    if let Some(sr) = sr {
        tract_ragged::load::fold_input(&mut onnx.model, "sr", tensor0(sr))?;
    }
    tract_ragged::load::ragged_model(onnx, RaggedSpec::new("input", 1))
}

/// [`ragged_model`] on the CPU.
fn runnable(name: &str, sr: Option<i64>) -> TractResult<RaggedRunnable> {
    ragged_model(name, sr)?.into_runnable()
}

/// A chunk of audio of each length and a state, per stream.
fn streams(rng: &mut Rng, lengths: &[usize]) -> Vec<TVec<Tensor>> {
    lengths
        .iter()
        .map(|&l| {
            let audio = Tensor::from_shape(&[l], &rng.vec(l, 0.5)).unwrap();
            let state = Tensor::from_shape(&[2, 128], &rng.vec(256, 0.5)).unwrap();
            tvec![audio, state]
        })
        .collect()
}

/// Each sample's outputs.
type Outputs = Vec<TVec<Tensor>>;

/// `samples` run as one ragged batch, and each alone through the original model.
fn batched_and_alone(
    runnable: &RaggedRunnable,
    samples: &[TVec<Tensor>],
) -> TractResult<(Outputs, Outputs)> {
    let batched = runnable.run_batch(Samples::ordered(samples))?;
    let alone = runnable.run_one_by_one(Samples::ordered(samples))?;
    Ok((batched, alone))
}

/// Every export of the wheel that takes a chunk of any length and a state, with the
/// sample rate each needs folded in.
const MODELS: [(&str, Option<i64>); 4] = [
    ("silero_vad", Some(16000)),
    ("silero_vad_16k_op15", Some(16000)),
    ("silero_vad_op18_ifless", Some(16000)),
    ("silero_vad_half", None),
];

#[test]
fn streams_of_chunks_of_any_length_get_what_each_gets_alone() -> TractResult<()> {
    for (name, sr) in MODELS {
        let runnable = runnable(name, sr).with_context(|| format!("model {name}"))?;
        let roles: Vec<InputRole> = runnable
            .input_slots()?
            .into_iter()
            .map(|s| s.role)
            .collect();
        assert!(
            matches!(roles[0], InputRole::Ragged(_)),
            "{name}: {roles:?}"
        );
        assert_eq!(roles[1], InputRole::PerSample { batch: 1 }, "{name}");
        // 16 kHz chunks with their context (576), without (512), and others the model
        // takes (its time axis stays one frame from 192 to 703 samples).
        let samples = streams(&mut Rng(5), &[576, 512, 576, 640, 300]);
        let (batched, alone) = batched_and_alone(&runnable, &samples)?;
        for (s, out) in batched.iter().enumerate() {
            assert_eq!(out[0].shape(), &[1], "{name} sample {s}: the probability");
            assert_eq!(out[1].shape(), &[2, 128], "{name} sample {s}: the state");
        }
        let d = max_difference(&batched, &alone);
        assert!(d <= 1e-5, "{name}: batched vs alone {d:e}");
        // The state matters: another state, another probability.
        let mut other = samples.clone();
        other[0][1] = Tensor::zero::<f32>(&[2, 128])?;
        let moved = runnable.run_batch(Samples::ordered(&other))?;
        let changed = max_difference(&moved[..1], &batched[..1]);
        assert!(
            changed > 1e-4,
            "{name}: the state changes nothing ({changed:e})"
        );
    }
    Ok(())
}

#[test]
fn the_sample_rate_picks_the_branch_before_typing() -> TractResult<()> {
    // 8 kHz: chunks of 256 samples and 32 of context, the other network of the export.
    let eight = runnable("silero_vad", Some(8000))?;
    let samples = streams(&mut Rng(6), &[288, 256, 288]);
    let (batched, alone) = batched_and_alone(&eight, &samples)?;
    let d = max_difference(&batched, &alone);
    assert!(d <= 1e-5, "8 kHz: batched vs alone {d:e}");
    // And it is not the 16 kHz network.
    let sixteen = runnable("silero_vad", Some(16000))?.run_batch(Samples::ordered(&samples))?;
    assert!(max_difference(&sixteen, &batched) > 1e-4);
    Ok(())
}

#[test]
fn a_sample_rate_left_an_input_is_refused_by_name() {
    let err = runnable("silero_vad", None).err().map(|e| format!("{e:#}"));
    let err = err.expect("the If on an unknown sample rate is not typed");
    assert!(err.contains("branches on input \"sr\""), "{err}");
}

/// On ragged-cuda: each stream of a ragged batch as the CPU gives it alone, every node on
/// the device.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA device"]
fn silero_runs_on_ragged_cuda_as_each_stream_alone() -> TractResult<()> {
    for (name, sr) in MODELS {
        let model = ragged_model(name, sr)?;
        let gpu = model.clone().into_runnable_with(common::cuda::cuda())?;
        let cpu = model.into_runnable()?;
        let samples = streams(&mut Rng(5), &[576, 512, 576, 640, 300]);
        let on_gpu = gpu.run_batch(Samples::ordered(&samples))?;
        let alone = cpu.run_one_by_one(Samples::ordered(&samples))?;
        let d = max_difference(&on_gpu, &alone);
        assert!(d <= 1e-4, "{name}: ragged-cuda batched vs CPU alone {d:e}");
    }
    Ok(())
}
