//! The runnable's verbs on a model of one input: `run` and `run_each` (scheduled),
//! `run_batch` (one batch as given), `run_one_by_one` (the reference) and `run_packed`
//! (a batch the caller packed), each sample what it gets alone; under `run_each` a bad
//! sample fails alone, by kind, naming itself.

use crate::common::models::attention_model;
use crate::common::onnx::Rng;
use crate::common::{max_difference, runnable, samples};
use tract_ragged::error::{ErrorKind, kind};
use tract_ragged::prelude::*;

#[test]
fn every_verb_gives_each_sample_what_it_gets_alone() {
    let runnable = runnable(&attention_model(&mut Rng(2), 8, 2), "N,8,1,W,f32", 3).unwrap();
    let lines = samples(&mut Rng(3), &[8, 1, 1], 2, &[5, 17, 1, 40, 9, 23, 3]);
    let alone = runnable.run_one_by_one(&lines).unwrap();
    let borrowed: Vec<&Tensor> = lines.iter().collect();
    let answers = [
        ("run", runnable.run(&lines).unwrap()),
        ("run of borrowed", runnable.run(&borrowed).unwrap()),
        ("run of owned", runnable.run(lines.clone()).unwrap()),
        ("run_batch", runnable.run_batch(&lines).unwrap()),
        (
            "run_each",
            runnable
                .run_each(&lines)
                .unwrap()
                .into_iter()
                .collect::<TractResult<Vec<_>>>()
                .unwrap(),
        ),
    ];
    for (verb, outputs) in answers {
        let worst = max_difference(&outputs, &alone);
        assert!(worst <= 1e-5, "{verb} differs from alone by {worst}");
    }
    assert!(runnable.run(Vec::<Tensor>::new()).unwrap().is_empty());

    // A packed batch: the model's outputs padded, each sample's prefix its own.
    let mut batch = Tensor::zero::<f32>(&[3, 8, 1, 17]).unwrap();
    let mut widths = vec![];
    {
        let mut view = batch.to_plain_array_view_mut::<f32>().unwrap();
        for (k, t) in lines[..3].iter().enumerate() {
            let w = t.shape()[2];
            widths.push(w as i64);
            view.slice_mut(tract_ndarray::s![k, .., .., ..w])
                .assign(&t.to_plain_array_view::<f32>().unwrap());
        }
    }
    let raw = runnable.run_packed(batch, &[&widths]).unwrap();
    for (k, expected) in alone[..3].iter().enumerate() {
        let mut found = raw[0].slice(0, k, k + 1).unwrap();
        found.remove_axis(0).unwrap();
        for (axis, extent) in expected[0].shape().iter().enumerate() {
            found = found.slice(axis, 0, *extent).unwrap();
        }
        let worst = max_difference(&[tvec!(found)], &[tvec!(expected[0].clone())]);
        assert!(
            worst <= 1e-5,
            "packed sample {k} differs from alone by {worst}"
        );
    }
}

#[test]
fn run_each_answers_a_bad_sample_alone_by_its_kind() {
    let runnable = runnable(&attention_model(&mut Rng(2), 8, 2), "N,8,1,W,f32", 3).unwrap();
    let mut lines = samples(&mut Rng(4), &[8, 1, 1], 2, &[5, 17, 1, 40, 9]);
    lines[2] = Tensor::zero::<f32>(&[8, 9]).unwrap();
    let each = runnable.run_each(&lines).unwrap();
    let good: Vec<Tensor> = [0, 1, 3, 4].iter().map(|i| lines[*i].clone()).collect();
    let alone = runnable.run_one_by_one(&good).unwrap();
    for (k, expected) in [0, 1, 3, 4].iter().zip(&alone) {
        let found = each[*k].as_ref().unwrap();
        let worst = max_difference(std::slice::from_ref(found), std::slice::from_ref(expected));
        assert!(worst <= 1e-5, "sample {k} differs from alone by {worst}");
    }
    let e = each[2].as_ref().unwrap_err();
    assert_eq!(kind(e), ErrorKind::BadSample, "{e:#}");
    assert!(format!("{e:#}").contains("sample 2"), "{e:#}");
    let e = runnable.run(&lines).unwrap_err();
    assert_eq!(kind(&e), ErrorKind::BadSample, "{e:#}");
    // Two tensors for a model of one input: that sample's fault, told by count.
    let two = Sample::ordered([lines[0].clone(), lines[1].clone()]);
    let each = runnable
        .run_each(Samples::new([Sample::new(&lines[0]), two]))
        .unwrap();
    assert!(each[0].is_ok());
    let e = each[1].as_ref().unwrap_err();
    assert_eq!(kind(e), ErrorKind::BadSample, "{e:#}");
    assert!(
        format!("{e:#}").contains("sample 1 gives 2 inputs"),
        "{e:#}"
    );
}
