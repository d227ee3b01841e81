//! The CLI's contract: `tract-ragged run MODEL --ragged INPUT:AXIS [--input-fact FACT]
//! --samples IN.npz --out OUT.npz [--runtime cpu|cuda] [--batch N] [--one-by-one]`, and
//! errors as one line with a failing status.

use crate::common;
use std::process::Command;

use crate::common::onnx::{Graph, Rng, int, ints};
use crate::common::{rel_diff, samples};
use prost::Message;
use tract_ragged::npz;
use tract_ragged::prelude::*;

/// The CLI cargo built beside this test, or `TRACT_RAGGED_BIN` (a binary carried apart
/// from its build, as the GPU bundle carries it).
fn cli() -> Command {
    match std::env::var_os("TRACT_RAGGED_BIN") {
        Some(bin) => Command::new(bin),
        None => Command::new(env!("CARGO_BIN_EXE_tract-ragged")),
    }
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
        [("line_a".to_string(), &Tensor::zero::<f32>(&[2, 4]).unwrap())],
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
        // The sample of the wrong rank, named as the archive names it.
        if case[1] == "x:3" && case[3].ends_with("bad.npz") {
            assert!(stderr.contains("(sample \"line_a\")"), "{stderr}");
        }
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

/// A temporary directory holding the test model and `in.npz`, one sample 9 wide.
fn one_sample() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path());
    let input = dir.path().join("in.npz");
    let one = samples(&mut Rng(6), &[2, 4, 1], 2, &[9]);
    npz::write_arrays(&input, [("s0".to_string(), &one[0])]).unwrap();
    (dir, model, input)
}

/// A model the ragged transform refuses (a concatenation along the width): exit status 4,
/// the node named in one line, nothing written; `--one-by-one` still runs it.
#[test]
fn a_refused_model_exits_with_its_own_status() {
    let dir = tempfile::tempdir().unwrap();
    let mut g = Graph::default();
    let c = g.op("Concat", &["x", "x"], vec![int("axis", 3)]);
    let model = dir.path().join("concat.onnx");
    std::fs::write(&model, g.model("x", 4, &[&c]).encode_to_vec()).unwrap();
    let input = dir.path().join("in.npz");
    let some = samples(&mut Rng(6), &[2, 4, 1], 2, &[9, 5]);
    npz::write_arrays(
        &input,
        [("s0".to_string(), &some[0]), ("s1".to_string(), &some[1])],
    )
    .unwrap();
    let out = dir.path().join("out.npz");
    let args = [
        "run",
        path(&model),
        "--ragged",
        "x:3",
        "--input-fact",
        "N,2,4,W,f32",
        "--samples",
        path(&input),
        "--out",
        path(&out),
    ];
    let (code, e) = failing(&args);
    assert_eq!(code, 4, "{e}");
    assert!(
        e.contains("Concat") && e.contains("along the ragged axis"),
        "{e}"
    );
    assert!(!out.exists());
    let alone = cli().args(args).arg("--one-by-one").output().unwrap();
    assert!(alone.status.success(), "{alone:?}");
    assert!(out.exists());
}

/// The samples' file as the output, a directory as the model or the samples, an
/// impossible budget, a zero count: refused, one line, nothing written.
#[test]
fn misuse_is_refused_in_one_line() {
    let (dir, model, input) = one_sample();
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

/// A wrong `--input-fact` is named as such (not at the first op that trips on it), and a
/// model whose declared dims are free where its ops need numbers says to give one.
#[test]
fn input_fact_mistakes_are_named() {
    let (dir, model, input) = one_sample();
    let out = dir.path().join("out.npz");
    let run_along = |ragged: &str, fact: Option<&str>| {
        let mut args = vec!["run", path(&model), "--ragged", ragged];
        args.extend(["--samples", path(&input), "--out", path(&out)]);
        if let Some(fact) = fact {
            args.extend(["--input-fact", fact]);
        }
        failing(&args).1
    };
    let run = |fact: Option<&str>| run_along("x:3", fact);
    let e = run(Some("N,2,4,f32"));
    assert!(e.contains("the input fact \"N,2,4,f32\" has rank 3"), "{e}");
    let e = run(Some("N,2,4,W,i64"));
    assert!(e.contains("the input fact \"N,2,4,W,i64\" is I64"), "{e}");
    let e = run(None);
    assert!(e.contains("axis 1 (d1), axis 2 (d2) left free"), "{e}");
    assert!(e.contains("--input-fact"), "{e}");
    let e = run(Some(""));
    assert!(e.contains("an empty input fact"), "{e}");
    let e = run(Some("1,2,4,W,f32"));
    assert!(
        e.contains("fixes the batch axis (axis 0) of input \"x\" at 1") && e.contains("N,2,4,W"),
        "{e}"
    );
    let e = run_along("x:2", Some("N,2,4,W,f32"));
    assert!(
        e.contains("ragged axis 2 of input \"x\" is fixed at 4") && e.contains("--ragged x:3?"),
        "{e}"
    );
    assert!(!out.exists());
}

/// `profile --widths` of a batch whose tensors cannot fit the memory budget: refused from
/// the widths (exit status 6), before any sample is made or the batch allocated.
#[test]
fn profile_refuses_a_batch_beyond_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path());
    for widths in ["9x100000000", "100000000000"] {
        let (code, e) = failing(&[
            "profile",
            path(&model),
            "--ragged",
            "x:3",
            "--input-fact",
            "N,2,4,W,f32",
            "--widths",
            widths,
        ]);
        assert_eq!(code, 6, "{e}");
        assert!(e.contains("out of memory: a batch of"), "{e}");
    }
}

/// A model with no outputs: refused in one line saying so.
#[test]
fn a_model_without_outputs_is_refused_as_such() {
    let (dir, _, input) = one_sample();
    let mut g = Graph::default();
    let _ = g.op("Relu", &["x"], vec![]);
    let model = dir.path().join("none.onnx");
    std::fs::write(&model, g.model("x", 4, &[]).encode_to_vec()).unwrap();
    let out = dir.path().join("out.npz");
    let (_, e) = failing(&[
        "run",
        path(&model),
        "--ragged",
        "x:3",
        "--input-fact",
        "N,2,4,W,f32",
        "--samples",
        path(&input),
        "--out",
        path(&out),
    ]);
    assert!(e.contains("the model has no outputs"), "{e}");
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
            cli().get_program().to_string_lossy(),
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

/// A 1x1 convolution from 2 to 256 channels: each sample's output is 128 times its input
/// (1 MiB for a sample 256 wide).
fn write_wide_output_model(dir: &std::path::Path) -> std::path::PathBuf {
    let mut rng = Rng(3);
    let mut g = Graph::default();
    let w = g.weight(&[256, 2, 1, 1], rng.vec(512, 0.5));
    let y = g.op("Conv", &["x", &w], vec![ints("kernel_shape", &[1, 1])]);
    let path = dir.join("wide.onnx");
    std::fs::write(&path, g.model("x", 4, &[&y]).encode_to_vec()).unwrap();
    path
}

/// The peak resident memory `run --verbose` reports, in MiB.
fn run_peak_mib(args: &[&str]) -> u64 {
    let out = cli().args(args).arg("--verbose").output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{args:?}: {stderr}");
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("peak memory (resident): "))
        .and_then(|l| l.trim_end_matches(" MiB").parse().ok())
        .unwrap_or_else(|| panic!("no peak memory in {stderr}"))
}

/// `run` holds a window of samples and outputs within `--memory`, writing each window's
/// outputs before reading the next: 200 samples with 1 MiB of outputs each peak no
/// higher than 20 do, batched or one by one (which also keeps a bounded number of plans).
#[test]
fn run_streams_within_its_memory() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_wide_output_model(dir.path());
    let mut rng = Rng(9);
    for n in [20, 200] {
        let widths: Vec<usize> = (0..n).map(|i| 200 + (i * 7) % 57).collect();
        let inputs = samples(&mut rng, &[2, 4, 1], 2, &widths);
        let named = inputs.iter().enumerate().map(|(i, t)| (format!("s{i}"), t));
        npz::write_arrays(dir.path().join(format!("in{n}.npz")), named).unwrap();
    }
    let peak = |n: usize, extra: &[&str]| {
        let samples = dir.path().join(format!("in{n}.npz"));
        let out = dir.path().join("out.npz");
        let mut args = vec![
            "run",
            path(&model),
            "--ragged",
            "x:3",
            "--input-fact",
            "N,2,4,W,f32",
            "--memory",
            "16M",
            "--samples",
            path(&samples),
            "--out",
            path(&out),
        ];
        args.extend(extra);
        run_peak_mib(&args)
    };
    for extra in [&[][..], &["--one-by-one"]] {
        let (small, large) = (peak(20, extra), peak(200, extra));
        // Holding every output would add 180 MiB.
        assert!(
            large <= small + 40,
            "{extra:?}: 20 samples peak at {small} MiB, 200 at {large} MiB"
        );
    }
    // What was written is every sample's output, as one by one gives it.
    let inputs = npz::read_samples(dir.path().join("in200.npz"), u64::MAX).unwrap();
    let outputs = npz::read_samples(dir.path().join("out.npz"), u64::MAX).unwrap();
    assert_eq!(outputs.len(), 200);
    for (ix, ((name, out), (_, input))) in outputs.iter().zip(&inputs).enumerate() {
        assert_eq!(name, &format!("s{ix}_o0"));
        assert_eq!(out.shape(), &[256, 4, input.shape()[2]]);
    }
}

/// `--keep-going`: the good samples' outputs are written and equal a run of the good
/// samples alone; each bad sample is reported (index, name, reason), the status is 3.
/// Without it, the first bad sample fails the run and nothing is written.
#[test]
fn keep_going_writes_the_good_samples_and_reports_the_bad() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path());
    let good = samples(&mut Rng(21), &[2, 4, 1], 2, &[9, 30, 17, 5, 22]);
    let mut nan = good[1].clone();
    nan.to_plain_array_view_mut::<f32>().unwrap()[[1, 2, 3]] = f32::NAN;
    let wrong_rank = Tensor::zero::<f32>(&[2, 4]).unwrap();
    let wrong_channels = Tensor::zero::<f32>(&[3, 4, 10]).unwrap();
    // Samples 1, 3 and 5 are bad.
    let all: Vec<(String, &Tensor)> = vec![
        ("a".into(), &good[0]),
        ("nan".into(), &nan),
        ("b".into(), &good[1]),
        ("rank".into(), &wrong_rank),
        ("c".into(), &good[2]),
        ("channels".into(), &wrong_channels),
        ("d".into(), &good[3]),
        ("e".into(), &good[4]),
    ];
    npz::write_arrays(dir.path().join("mixed.npz"), all).unwrap();
    let named = good.iter().enumerate().map(|(i, t)| (format!("g{i}"), t));
    npz::write_arrays(dir.path().join("good.npz"), named).unwrap();
    let run = |samples: &str, out: &str, extra: &[&str]| {
        cli()
            .args(["run", path(&model), "--ragged", "x:3", "--input-fact"])
            .args(["N,2,4,W,f32", "--batch", "3", "--samples"])
            .arg(dir.path().join(samples))
            .arg("--out")
            .arg(dir.path().join(out))
            .args(extra)
            .output()
            .unwrap()
    };
    assert!(run("good.npz", "good_out.npz", &[]).status.success());

    let out = run("mixed.npz", "mixed_out.npz", &[]);
    assert_eq!(out.status.code(), Some(5), "a bad sample's exit status");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("sample 1 holds NaN"), "{stderr}");
    assert!(!dir.path().join("mixed_out.npz").exists());

    let out = run("mixed.npz", "mixed_out.npz", &["--keep-going"]);
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8(out.stderr).unwrap();
    let lines: Vec<&str> = stderr.trim_end().lines().collect();
    assert_eq!(lines.len(), 4, "{stderr}");
    assert!(
        lines[0].starts_with("error: sample 1 (\"nan\"): "),
        "{stderr}"
    );
    assert!(
        lines[1].starts_with("error: sample 3 (\"rank\"): "),
        "{stderr}"
    );
    assert!(lines[1].contains("rank 2"), "{stderr}");
    assert!(
        lines[2].starts_with("error: sample 5 (\"channels\"): "),
        "{stderr}"
    );
    assert!(lines[3].contains("3 of 8 samples failed"), "{stderr}");
    let mixed = npz::read_samples(dir.path().join("mixed_out.npz"), u64::MAX).unwrap();
    let alone = npz::read_samples(dir.path().join("good_out.npz"), u64::MAX).unwrap();
    // Every sample bad: status 3, and an earlier run's outputs stay as they were.
    let bad = [
        ("nan", &nan),
        ("rank", &wrong_rank),
        ("channels", &wrong_channels),
    ];
    npz::write_arrays(
        dir.path().join("bad.npz"),
        bad.map(|(n, t)| (n.to_string(), t)),
    )
    .unwrap();
    let before = std::fs::read(dir.path().join("good_out.npz")).unwrap();
    let out = run("bad.npz", "good_out.npz", &["--keep-going"]);
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("all 3 samples failed") && stderr.contains("was not written"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(dir.path().join("good_out.npz")).unwrap(),
        before
    );
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("partial"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let names: Vec<&str> = mixed.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "s0_o0", "s0_o1", "s2_o0", "s2_o1", "s4_o0", "s4_o1", "s6_o0", "s6_o1", "s7_o0",
            "s7_o1"
        ]
    );
    // The same samples, cut into other batches (the costs are measured on each run, so
    // the cut depends on the machine's load): the same values within float rounding.
    for ((n, m), (k, a)) in mixed.iter().zip(&alone) {
        assert_eq!(m.shape(), a.shape(), "{n} against {k}");
        assert!(
            rel_diff(m, a) <= 1e-5,
            "{n} against {k}: {}",
            rel_diff(m, a)
        );
    }
}

/// A model of several inputs (fixtures/encoders/stateful: a clip, its state, a shared
/// gain): `s{i}.{input}` per sample and `shared.{input}` in, the outputs of the batched
/// run those of one by one; an archive without a sample's input is refused naming it.
#[test]
fn run_takes_each_samples_inputs_and_the_shared_ones() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::root().join("fixtures/encoders/stateful/model.onnx");
    let mut rng = Rng(6);
    let mut arrays: Vec<(String, Tensor)> = vec![("shared.gain".into(), tensor0(0.8f32))];
    for (i, t) in [3usize, 11, 1, 7].iter().enumerate() {
        arrays.push((
            format!("s{i}.x"),
            Tensor::from_shape(&[*t, 4], &rng.vec(t * 4, 1.0)).unwrap(),
        ));
        arrays.push((format!("s{i}.state"), tensor1(&rng.vec(8, 1.0))));
    }
    let write = |name: &str, arrays: &[(String, Tensor)]| {
        let path = dir.path().join(name);
        npz::write_arrays(&path, arrays.iter().map(|(n, t)| (n.clone(), t))).unwrap();
        path
    };
    let input = write("in.npz", &arrays);
    let run = |input: &std::path::Path, out: &str, extra: &[&str]| {
        cli()
            .arg("run")
            .arg(&model)
            .args(["--ragged", "x:1", "--input-fact", "N,T,4,f32", "--samples"])
            .arg(input)
            .arg("--out")
            .arg(dir.path().join(out))
            .args(extra)
            .output()
            .unwrap()
    };
    for (out, extra) in [("batched.npz", &[][..]), ("alone.npz", &["--one-by-one"])] {
        let done = run(&input, out, extra);
        assert!(
            done.status.success(),
            "{}",
            String::from_utf8_lossy(&done.stderr)
        );
    }
    let read = |name: &str| npz::read_samples(dir.path().join(name), 1 << 30).unwrap();
    let (batched, alone) = (read("batched.npz"), read("alone.npz"));
    assert_eq!(batched.len(), 8, "two outputs for each of the 4 samples");
    for ((nb, b), (na, a)) in batched.iter().zip(&alone) {
        assert_eq!(nb, na);
        assert!(rel_diff(b, a) <= 1e-5, "{nb}: {}", rel_diff(b, a));
    }
    let missing: Vec<(String, Tensor)> = arrays
        .into_iter()
        .filter(|(n, _)| n != "s2.state")
        .collect();
    let input = write("in.npz", &missing);
    let failed = run(&input, "never.npz", &[]);
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success());
    assert!(
        stderr.contains("sample 2 has no array s2.state"),
        "{stderr}"
    );
    // --keep-going: sample 2 without its state and sample 3 with a state of the wrong
    // size fail alone, named; the others' outputs written, as batched before.
    let mut bad = missing.clone();
    for (name, t) in bad.iter_mut() {
        if name == "s3.state" {
            *t = tensor1(&[1f32, 2.0]);
        }
    }
    let input = write("bad.npz", &bad);
    let kept = run(&input, "kept.npz", &["--keep-going"]);
    let stderr = String::from_utf8_lossy(&kept.stderr);
    assert_eq!(kept.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("s2") && stderr.contains("s3"), "{stderr}");
    let kept = read("kept.npz");
    let names: Vec<&str> = kept.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["s0_o0", "s0_o1", "s1_o0", "s1_o1"], "{stderr}");
    for (name, t) in &kept {
        let (_, b) = batched.iter().find(|(n, _)| n == name).unwrap();
        assert!(rel_diff(t, b) <= 1e-5, "{name}: {}", rel_diff(t, b));
    }
}

/// `--input-fact NAME=FACT` sets another input's fact (repeatable); a name the model does
/// not have is refused, listing its inputs.
#[test]
fn input_facts_name_their_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::root().join("fixtures/encoders/stateful/model.onnx");
    let mut rng = Rng(2);
    let arrays: Vec<(String, Tensor)> = vec![
        ("shared.gain".into(), tensor0(1.0f32)),
        (
            "s0.x".into(),
            Tensor::from_shape(&[5, 4], &rng.vec(20, 1.0)).unwrap(),
        ),
        ("s0.state".into(), tensor1(&rng.vec(8, 1.0))),
    ];
    let input = dir.path().join("in.npz");
    npz::write_arrays(&input, arrays.iter().map(|(n, t)| (n.clone(), t))).unwrap();
    let run = |facts: &[&str]| {
        let mut cmd = cli();
        cmd.arg("run").arg(&model).args(["--ragged", "x:1"]);
        for f in facts {
            cmd.args(["--input-fact", f]);
        }
        cmd.arg("--samples")
            .arg(&input)
            .arg("--out")
            .arg(dir.path().join("out.npz"))
            .output()
            .unwrap()
    };
    let done = run(&["N,T,4,f32", "state=N,8,f32", "gain=f32"]);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let failed = run(&["N,T,4,f32", "nope=N,f32"]);
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success());
    assert!(
        stderr.contains("\"nope\" is not an input") && stderr.contains("\"state\""),
        "{stderr}"
    );
}

/// `widen` writes PP-OCRv4 rec with its int32 shape casts widened, which tract's own loader
/// then types with a symbolic batch and width (as tract's CLI reads it); it refuses to
/// write over its input.
#[test]
fn widen_writes_a_model_tracts_loader_types_symbolically() {
    use tract_onnx::prelude::*;
    let dir = tempfile::tempdir().unwrap();
    let rec = common::asset("ppocr/ch_PP-OCRv4_rec_infer.onnx");
    let out = dir.path().join("rec-wide.onnx");
    let done = cli()
        .args(["widen", path(&rec), path(&out)])
        .output()
        .unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let said = String::from_utf8_lossy(&done.stdout);
    assert!(said.contains("int32 cast(s) of shapes widened"), "{said}");
    let typed = |p: &std::path::Path| -> TractResult<TypedModel> {
        let mut model = tract_onnx::onnx().model_for_path(p)?;
        let scope = model.symbols.clone();
        let (n, w) = (scope.sym("N"), scope.sym("W"));
        model.set_input_fact(
            0,
            f32::fact([n.into(), 3.into(), 48.into(), TDim::from(w)]).into(),
        )?;
        model.into_typed()
    };
    let wide = typed(&out).unwrap();
    let shape = &wide.output_fact(0).unwrap().shape;
    assert!(
        shape[0].as_i64().is_none() && shape[1].as_i64().is_none(),
        "output {shape:?}: the batch and the width should stay symbols"
    );
    // As exported, the int32 casts lose the symbols: tract cannot type it so.
    let original = typed(&rec).map(|m| m.output_fact(0).map(|f| f.shape.clone()));
    assert!(
        !matches!(&original, Ok(Ok(s)) if s[0].as_i64().is_none() && s[1].as_i64().is_none()),
        "the model as exported typed symbolically: {original:?}"
    );
    let (code, err) = failing(&["widen", path(&out), path(&out)]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("is the input"), "{err}");
}

/// `profile` as tract's CLI prints a profiled dump (`--format tract`, tract-libcli's
/// tables), as tract-libcli's JSON export with each node's cost (`--format json --cost`),
/// and on an archive's samples (`--samples`): the same nodes timed, the run count kept.
#[test]
fn profile_speaks_tracts_formats() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path());
    let base = [
        "profile",
        path(&model),
        "--ragged",
        "x:3",
        "--input-fact",
        "N,2,4,W,f32",
    ];
    let run = |extra: &[&str]| {
        let out = cli().args(base).args(extra).output().unwrap();
        assert!(
            out.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let table = run(&["--widths", "9,30", "--runs", "2", "--format", "tract"]);
    assert!(table.contains("Entire network performance"), "{table}");
    assert!(table.contains("RaggedMask"), "{table}");
    assert!(table.contains("peak memory"), "{table}");
    let json = run(&[
        "--widths", "9,30", "--runs", "3", "--format", "json", "--cost",
    ]);
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["profiling_info"]["iterations"], 3, "{json}");
    let nodes = json["nodes"].as_array().unwrap();
    assert!(
        nodes.iter().all(|n| n["secs_per_iter"].is_number()),
        "{json}"
    );
    let costed = |op: &str| {
        nodes
            .iter()
            .any(|n| n["op_name"].as_str().is_some_and(|o| o.contains(op)) && n["cost"].is_object())
    };
    assert!(costed("RaggedMask"), "{json}");
    // The batch from an archive: its widths in the header.
    let lines = samples(&mut Rng(8), &[2, 4, 1], 2, &[11, 6]);
    let named: Vec<(String, &Tensor)> = lines
        .iter()
        .enumerate()
        .map(|(i, t)| (format!("s{i}"), t))
        .collect();
    npz::write_arrays(dir.path().join("batch.npz"), named).unwrap();
    let batch = dir.path().join("batch.npz");
    let roofline = run(&["--samples", path(&batch)]);
    assert!(roofline.contains("widths 11,6, padded to"), "{roofline}");
}

/// `--one-by-one` runs a model the transform refuses (a flatten of C with W), each sample
/// as tract alone gives it; without it, the refusal names the node.
#[test]
fn one_by_one_runs_a_model_that_cannot_be_batched() {
    let dir = tempfile::tempdir().unwrap();
    let proto = common::models::conv_then(&mut Rng(13), |g, x| {
        g.op("Flatten", &[x], vec![int("axis", 1)])
    });
    let model = dir.path().join("flatten.onnx");
    std::fs::write(&model, proto.encode_to_vec()).unwrap();
    let inputs = samples(&mut Rng(2), &[2, 3, 1], 2, &[6, 13, 1]);
    let named: Vec<(String, &Tensor)> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| (format!("s{i}"), t))
        .collect();
    let input = dir.path().join("in.npz");
    npz::write_arrays(&input, named).unwrap();
    let out = dir.path().join("out.npz");
    let args = [
        "run",
        path(&model),
        "--ragged",
        "x:3",
        "--input-fact",
        "N,2,3,W,f32",
        "--samples",
        path(&input),
        "--out",
        path(&out),
    ];
    let (_, e) = failing(&args);
    assert!(e.contains("Flatten"), "{e}");
    let status = cli().args(args).arg("--one-by-one").status().unwrap();
    assert!(status.success());
    let alone = npz::read_samples(&out, u64::MAX).unwrap();
    assert_eq!(alone.len(), inputs.len());
    for (ix, (sample, (name, got))) in inputs.iter().zip(&alone).enumerate() {
        assert_eq!(name, &format!("s{ix}_o0"));
        let mut expected = common::plain_tract(&proto, sample).unwrap();
        expected.remove_axis(0).unwrap();
        assert_eq!(got.shape(), expected.shape(), "{name}");
        assert!(rel_diff(got, &expected) <= 1e-6, "{name}");
    }
}

/// `--out` naming something that is not a regular file (a named pipe here; `/dev/null` or
/// a copy of `/dev/full` alike) is refused, and left as it was: the archive's rename would
/// replace it by a file.
#[cfg(unix)]
#[test]
fn out_naming_a_device_or_pipe_is_refused_and_left_alone() {
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path());
    let good = samples(&mut Rng(22), &[2, 4, 1], 2, &[9, 30]);
    let named = good.iter().enumerate().map(|(i, t)| (format!("g{i}"), t));
    npz::write_arrays(dir.path().join("in.npz"), named).unwrap();
    let pipe = dir.path().join("pipe.npz");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&pipe)
            .status()
            .unwrap()
            .success()
    );
    let out = cli()
        .args([
            "run",
            path(&model),
            "--ragged",
            "x:3",
            "--input-fact",
            "N,2,4,W,f32",
        ])
        .arg("--samples")
        .arg(dir.path().join("in.npz"))
        .arg("--out")
        .arg(&pipe)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("is not a regular file (a named pipe)"),
        "{stderr}"
    );
    assert!(std::fs::metadata(&pipe).unwrap().file_type().is_fifo());
}

/// A sample too large to run alone within the budget is refused from its header, before
/// its data is inflated, batched or one by one: an archive of kilobytes whose entry
/// inflates to 256 MB, its compressed stream damaged past the header (inflating it would
/// fail on the damage, not on the size).
#[test]
fn a_sample_too_large_alone_is_refused_before_it_is_inflated() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path());
    let width = 8_000_000usize;
    let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4, {width}), }}");
    let mut npy = b"\x93NUMPY\x01\x00".to_vec();
    npy.extend((dict.len() as u16).to_le_bytes());
    npy.extend(dict.as_bytes());
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(vec![]));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(true);
    zip.start_file("s0.npy", options).unwrap();
    zip.write_all(&npy).unwrap();
    let zeros = vec![0u8; 1 << 20];
    let mut left = 2 * 4 * width * 4;
    while left > 0 {
        let n = left.min(zeros.len());
        zip.write_all(&zeros[..n]).unwrap();
        left -= n;
    }
    let mut bytes = zip.finish().unwrap().into_inner();
    assert!(bytes.len() < 1 << 20, "{} bytes", bytes.len());
    let mid = bytes.len() / 2;
    bytes[mid..mid + 64].iter_mut().for_each(|b| *b ^= 0xff);
    let samples = dir.path().join("bomb.npz");
    std::fs::write(&samples, &bytes).unwrap();
    let out = dir.path().join("out.npz");
    for extra in [&[][..], &["--one-by-one"]] {
        let mut args = vec![
            "run",
            path(&model),
            "--ragged",
            "x:3",
            "--input-fact",
            "N,2,4,W,f32",
            "--memory",
            "1G",
            "--samples",
            path(&samples),
            "--out",
            path(&out),
        ];
        args.extend(extra);
        let (_, stderr) = failing(&args);
        assert!(
            stderr.contains("sample 0 (width 8000000) alone needs"),
            "{extra:?}: {stderr}"
        );
        assert!(!out.exists());
    }
}

/// SIGINT or SIGTERM during a run: the process dies of the signal, the previous output
/// stays as it was, and no temporary file is left beside it; one that a run killed
/// outright (SIGKILL) left is removed by the next run writing the same output.
#[cfg(unix)]
#[test]
fn a_run_ended_by_a_signal_leaves_no_partial_file() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path());
    let widths: Vec<usize> = (0..3000).map(|i| 400 + i % 97).collect();
    let inputs = samples(&mut Rng(23), &[2, 4, 1], 2, &widths);
    let input = dir.path().join("in.npz");
    let named = inputs.iter().enumerate().map(|(i, t)| (format!("s{i}"), t));
    npz::write_arrays(&input, named).unwrap();
    let out = dir.path().join("out.npz");
    std::fs::write(&out, b"previous").unwrap();
    std::fs::write(dir.path().join(".out.npz.999999999.partial"), b"left").unwrap();
    let partials = || -> Vec<String> {
        std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".partial"))
            .collect()
    };
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let mut child = cli()
            .args(["run", path(&model), "--ragged", "x:3", "--input-fact"])
            .args(["N,2,4,W,f32", "--one-by-one", "--samples", path(&input)])
            .args(["--out", path(&out)])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // The run's own temporary file: there once its model is prepared (and the stale
        // one removed), for seconds (3000 samples one by one).
        let own = format!(".out.npz.{}.partial", child.id());
        while !partials().contains(&own) {
            assert!(child.try_wait().unwrap().is_none(), "ended unsignalled");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // SAFETY: signals a child of this test, still running (not yet waited for).
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(signal), "{status:?}");
        assert_eq!(partials(), Vec::<String>::new());
        assert_eq!(std::fs::read(&out).unwrap(), b"previous");
    }
}
