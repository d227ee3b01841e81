//! The CLI's contract: `tract-ragged run MODEL --ragged INPUT:AXIS [--input-fact FACT]
//! --samples IN.npz --out OUT.npz [--runtime cpu|cuda] [--batch N] [--one-by-one]`, and
//! errors as one line with a failing status.

mod common;

use std::process::Command;

use common::onnx::{Graph, Rng, int, ints};
use common::{rel_diff, samples};
use prost::Message;
use tract_ragged::npz;
use tract_ragged::prelude::*;

fn cli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tract-ragged"))
}

/// A conv, a ceil-mode max pool and a softmax over W; two outputs.
fn write_model(dir: &std::path::Path) -> std::path::PathBuf {
    let mut rng = Rng(11);
    let mut g = Graph::default();
    let w = g.weight(&[3, 2, 3, 3], rng.vec(54, 0.5));
    let x = g.op(
        "Conv",
        &["x", &w],
        vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
    );
    let x = g.op(
        "MaxPool",
        &[&x],
        vec![
            ints("kernel_shape", &[1, 3]),
            ints("strides", &[1, 2]),
            int("ceil_mode", 1),
        ],
    );
    let s = g.op("Softmax", &[&x], vec![int("axis", 3)]);
    let m = g.op(
        "ReduceMean",
        &[&x],
        vec![ints("axes", &[2, 3]), int("keepdims", 0)],
    );
    let path = dir.join("model.onnx");
    std::fs::write(&path, g.model("x", 4, &[&s, &m]).encode_to_vec()).unwrap();
    path
}

#[test]
fn run_writes_each_sample_cropped_and_matches_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path());
    let inputs = samples(&mut Rng(5), &[2, 4, 1], 2, &[9, 30, 17, 5, 22]);
    let named: Vec<(String, &Tensor)> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| (format!("line{i}"), t))
        .collect();
    npz::write_arrays(dir.path().join("in.npz"), named).unwrap();
    for (out, extra) in [
        ("ragged.npz", vec!["--batch", "2"]),
        ("alone.npz", vec!["--one-by-one"]),
    ] {
        let status = cli()
            .args([
                "run",
                model.to_str().unwrap(),
                "--ragged",
                "x:3",
                "--input-fact",
                "N,2,4,W,f32",
            ])
            .args(["--samples", dir.path().join("in.npz").to_str().unwrap()])
            .args(["--out", dir.path().join(out).to_str().unwrap()])
            .args(extra)
            .status()
            .unwrap();
        assert!(status.success());
    }
    let ragged = npz::read_samples(dir.path().join("ragged.npz")).unwrap();
    let alone = npz::read_samples(dir.path().join("alone.npz")).unwrap();
    let names: Vec<&str> = ragged.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "s0_o0", "s0_o1", "s1_o0", "s1_o1", "s2_o0", "s2_o1", "s3_o0", "s3_o1", "s4_o0",
            "s4_o1"
        ]
    );
    // Sample 1 is 30 wide: a stride-2 ceil-mode pool leaves 15 columns of 3 channels, 4 rows.
    assert_eq!(ragged[2].1.shape(), &[3, 4, 15]);
    assert_eq!(ragged[3].1.shape(), &[3]);
    for ((n, r), (m, a)) in ragged.iter().zip(alone.iter()) {
        assert_eq!(n, m);
        assert!(rel_diff(r, a) <= 1e-5, "{n}");
    }
}

#[test]
fn errors_are_one_line_and_fail() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path());
    // A sample of the wrong rank, a missing file, a bad spec.
    npz::write_arrays(
        dir.path().join("bad.npz"),
        [("a".to_string(), &Tensor::zero::<f32>(&[2, 4]).unwrap())],
    )
    .unwrap();
    let cases: Vec<Vec<String>> = vec![
        vec![
            "--ragged".into(),
            "x:3".into(),
            "--samples".into(),
            dir.path().join("bad.npz").display().to_string(),
        ],
        vec![
            "--ragged".into(),
            "x:3".into(),
            "--samples".into(),
            dir.path().join("missing.npz").display().to_string(),
        ],
        vec![
            "--ragged".into(),
            "x:0".into(),
            "--samples".into(),
            dir.path().join("bad.npz").display().to_string(),
        ],
    ];
    for case in cases {
        let out = cli()
            .args([
                "run",
                model.to_str().unwrap(),
                "--input-fact",
                "N,2,4,W,f32",
                "--out",
            ])
            .arg(dir.path().join("out.npz"))
            .args(&case)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{case:?} succeeded");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(stderr.trim_end().lines().count(), 1, "{case:?}: {stderr}");
        assert!(stderr.starts_with("error: "), "{stderr}");
    }
}
