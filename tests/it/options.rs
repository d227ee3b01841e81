//! Opening a model from its file as [`Options`] say: the facts, the device, the top k,
//! the scheduler's limits as the runnable's own knobs, and what cannot be combined.

use crate::common;
use crate::common::models::conv_then;
use crate::common::onnx::{Rng, int, ints};
use crate::common::{rel_diff, samples};
use prost::Message;
use tract_ragged::error::ErrorKind;
use tract_ragged::prelude::*;
use tract_ragged::schedule::Schedule;

/// A conv and a softmax over W, channels last, written to `dir`.
fn write_model(dir: &std::path::Path) -> std::path::PathBuf {
    let model = conv_then(&mut Rng(3), |g, x| {
        let s = g.op("Softmax", &[x], vec![int("axis", 3)]);
        g.op("Transpose", &[&s], vec![ints("perm", &[0, 2, 3, 1])])
    });
    let path = dir.join("model.onnx");
    std::fs::write(&path, model.encode_to_vec()).unwrap();
    path
}

/// The options' limits are the runnable's schedule, whatever the environment says; the
/// top k reduces the outputs; the batched run equals one by one.
#[test]
fn open_prepares_as_the_options_say() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_model(dir.path());
    let options = Options::default()
        .input_fact("N,2,4,W,f32")
        .lanes(2)
        .max_batch(3)
        .memory(300 << 20)
        .top_k(2);
    let runnable = tract_ragged::open(&path, "x:3".parse().unwrap(), &options).unwrap();
    let schedule = Schedule::for_runnable(&runnable);
    assert_eq!(
        (schedule.lanes, schedule.max_batch, schedule.budget),
        (2, Some(3), 300 << 20)
    );
    let lines = samples(&mut Rng(4), &[2, 4, 1], 2, &[9, 30, 17, 5, 22, 1, 13]);
    let batched = runnable.run(&lines).unwrap();
    let alone = runnable.run_one_by_one(&lines).unwrap();
    for (k, (b, a)) in batched.iter().zip(&alone).enumerate() {
        assert_eq!(b.len(), 2, "values and positions");
        assert_eq!(b[0].shape(), &[4, lines[k].shape()[2], 2][..]);
        assert!(rel_diff(&b[0], &a[0]) <= 1e-6, "sample {k}");
        assert_eq!(b[1], a[1], "sample {k}'s positions");
    }
}

/// What cannot be combined or parsed is refused before anything runs, saying what.
#[test]
fn open_refuses_what_the_options_cannot_mean() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_model(dir.path());
    let spec: RaggedSpec = "x:3".parse().unwrap();
    let base = || Options::default().input_fact("N,2,4,W,f32");
    let refused = |options: Options| {
        let e = tract_ragged::open(&path, spec.clone(), &options).unwrap_err();
        format!("{e:#}")
    };
    let tf32 = refused(base().precision(Precision::Tf32));
    assert!(tf32.contains("tf32") && tf32.contains("cuda"), "{tf32}");
    let unknown = refused(base().knob("TRACT_RAGGED_NO_SUCH_KNOB", "1"));
    assert!(unknown.contains("TRACT_RAGGED_NO_SUCH_KNOB"), "{unknown}");
    let zero = refused(base().lanes(0));
    assert!(zero.contains("TRACT_RAGGED_LANES"), "{zero}");
    let two = refused(base().input_fact("N,2,4,W,f32"));
    assert!(two.contains("2 input facts without a NAME="), "{two}");
    let e = tract_ragged::open(dir.path().join("none.onnx"), spec, &base()).unwrap_err();
    assert_eq!(tract_ragged::error::kind(&e), ErrorKind::Io, "{e:#}");
    assert_eq!("cuda".parse::<Device>().unwrap(), Device::Cuda);
    assert!("gpu".parse::<Device>().is_err());
}

/// An input given once is folded into the model before it is typed: the runnable then
/// takes the others only.
#[test]
fn open_folds_the_inputs_given_once() {
    let path = common::root().join("fixtures/encoders/stateful/model.onnx");
    let options = Options::default()
        .input_fact("N,T,4,f32")
        .fold("gain", tensor0(0.8f32));
    let runnable = tract_ragged::open(&path, "x:1".parse().unwrap(), &options).unwrap();
    let names: Vec<String> = runnable
        .input_slots()
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["x", "state"]);
}
