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
    let ragged = npz::read_samples(dir.path().join("ragged.npz"), u64::MAX).unwrap();
    let alone = npz::read_samples(dir.path().join("alone.npz"), u64::MAX).unwrap();
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

/// Runs the CLI with `args`; its exit status and stderr, which must be one line starting
/// with `error: ` when it fails.
fn failing(args: &[&str]) -> (i32, String) {
    let out = cli().args(args).output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    let code = out.status.code().unwrap_or(-1);
    assert_ne!(code, 0, "{args:?} succeeded");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
    assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
    (code, stderr)
}

fn path(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

/// A kilobyte of archive whose header claims 576 TB, or 57.6 GB: a one-line error, no
/// allocation, no abort.
#[test]
fn a_kilobyte_claiming_terabytes_is_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path());
    for shape in ["(2, 4, 1000000000000)", "(2, 4, 7200000000)"] {
        let samples = dir.path().join("claim.npz");
        std::fs::write(
            &samples,
            common::npz_with_header(&format!(
                "{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}"
            )),
        )
        .unwrap();
        let out = dir.path().join("out.npz");
        let (code, stderr) = failing(&[
            "run",
            path(&model),
            "--ragged",
            "x:3",
            "--input-fact",
            "N,2,4,W,f32",
            "--samples",
            path(&samples),
            "--out",
            path(&out),
        ]);
        assert_eq!(code, 1, "{stderr}");
        assert!(stderr.contains("s0"), "{stderr}");
        assert!(!out.exists());
    }
}

/// The samples' file as the output, a directory as the model or the samples, an
/// impossible budget, a zero count: refused, one line, nothing written.
#[test]
fn misuse_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path());
    let input = dir.path().join("in.npz");
    let one = samples(&mut Rng(6), &[2, 4, 1], 2, &[9]);
    npz::write_arrays(&input, [("s0".to_string(), &one[0])]).unwrap();
    let before = std::fs::read(&input).unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            path(&model),
            "--ragged",
            "x:3",
            "--input-fact",
            "N,2,4,W,f32",
        ];
        args.extend_from_slice(extra);
        failing(&args)
    };
    let (_, e) = run(&["--samples", path(&input), "--out", path(&input)]);
    assert!(e.contains("samples' file"), "{e}");
    assert_eq!(std::fs::read(&input).unwrap(), before);
    let out = dir.path().join("out.npz");
    let (_, e) = run(&["--samples", path(dir.path()), "--out", path(&out)]);
    assert!(e.contains("is a directory"), "{e}");
    let (_, e) = failing(&[
        "run",
        path(dir.path()),
        "--ragged",
        "x:3",
        "--samples",
        path(&input),
        "--out",
        path(&out),
    ]);
    assert!(e.contains("is a directory"), "{e}");
    for bad in [
        &["--memory=-1G"][..],
        &["--memory", "0"],
        &["--batch", "0"],
        &[],
    ] {
        let mut args = vec!["--samples", path(&input)];
        if !bad.is_empty() {
            args.extend_from_slice(&["--out", path(&out)]);
        }
        args.extend_from_slice(bad);
        let (code, e) = run(&args);
        assert_eq!(code, 2, "{bad:?}: {e}");
    }
    let (_, e) = failing(&[
        "profile",
        path(&model),
        "--ragged",
        "x:3",
        "--input-fact",
        "N,2,4,W,f32",
        "--widths",
        "320x100000000",
    ]);
    assert!(e.contains("above the"), "{e}");
    assert!(!out.exists());
}

/// A write that fails half-way (here, over the file size limit) leaves the previous
/// output as it was and no partial file, and says why in one line.
#[cfg(unix)]
#[test]
fn a_failed_write_keeps_the_previous_output() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path());
    let input = dir.path().join("in.npz");
    let many = samples(&mut Rng(7), &[2, 4, 1], 2, &[40; 64]);
    let named: Vec<(String, &Tensor)> = many
        .iter()
        .enumerate()
        .map(|(i, t)| (format!("s{i}"), t))
        .collect();
    npz::write_arrays(&input, named).unwrap();
    let out = dir.path().join("out.npz");
    std::fs::write(&out, b"the previous output").unwrap();
    // Writes past 64 KiB fail with EFBIG (SIGXFSZ ignored, as the shell passes it on).
    let status = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "trap '' XFSZ; ulimit -f 64; exec {} run {} --ragged x:3 --input-fact N,2,4,W,f32 \
             --samples {} --out {}",
            env!("CARGO_BIN_EXE_tract-ragged"),
            path(&model),
            path(&input),
            path(&out)
        ))
        .output()
        .unwrap();
    let stderr = String::from_utf8(status.stderr).unwrap();
    assert!(!status.status.success(), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("too large"), "{stderr}");
    assert_eq!(std::fs::read(&out).unwrap(), b"the previous output");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 3, "{left:?}");
}
