//! ONNX backend node conformance, plain and ragged, on the CPU and on ragged-cuda.
//!
//! The cases are the node tests of the onnx 1.17.0 wheel (`scripts/fetch-assets.sh` puts
//! them in `assets/onnx-node`); `manifest.txt` lists those run, by family, with what each
//! mode is expected to do. Prints one line per runtime and mode:
//! `onnx conformance (cpu, plain): N passed, M failed, K skipped`, and each failing case
//! with its worst difference. Fails when an expected case fails.
//!
//! The CUDA runtime runs only with `--include-ignored` (or `--ignored`), as the GPU
//! machine's launcher passes to every test binary; otherwise its lines say it was ignored.
//! `ONNX_CONFORMANCE_DISCOVER=prefix,...` proposes manifest lines for the cases whose name
//! starts with one of the prefixes, instead of running the manifest.

mod case;
mod manifest;

use std::path::PathBuf;
use std::process::ExitCode;

use case::{Case, Outcome};
use manifest::{Entry, Expect};
use tract_core::internal::*;
use tract_ragged::prelude::*;

const MANIFEST: &str = include_str!("manifest.txt");

/// The project root: the working directory when it holds the fixtures (cargo runs tests
/// from the root; so does the GPU machine's launcher, where the compile-time path does
/// not exist), else the compile-time root.
fn root() -> PathBuf {
    match std::env::current_dir() {
        Ok(cwd) if cwd.join("fixtures").exists() => cwd,
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR")),
    }
}

fn cases_dir() -> PathBuf {
    root().join("assets/onnx-node")
}

#[derive(Default)]
struct Tally {
    passed: usize,
    failed: usize,
    skipped: usize,
    refused: usize,
}

fn run_mode(entries: &[Entry], runtime: &'static dyn Runtime, label: &str, ragged: bool) -> Tally {
    let mut tally = Tally::default();
    for entry in entries {
        let expect = if ragged { &entry.ragged } else { &entry.plain };
        if matches!(expect, Expect::Skip(_) | Expect::NotApplicable(_))
            || (!ragged && matches!(expect, Expect::Refused(_)))
        {
            tally.skipped += 1;
            continue;
        }
        let case = match Case::load(&cases_dir().join(&entry.case)) {
            Ok(case) => case,
            Err(e) => {
                println!("FAILED {label} {}: cannot load the case: {e:#}", entry.case);
                tally.failed += 1;
                continue;
            }
        };
        let outcome = if ragged {
            case.ragged(runtime)
        } else {
            case.plain(runtime)
        };
        match (expect, outcome) {
            (Expect::Pass, Outcome::Passed) => tally.passed += 1,
            (Expect::Refused(_), Outcome::Refused(e)) => {
                // A refusal names the node and says why.
                if e.contains("node #")
                    && (e.contains("mixing op")
                        || e.contains("not known")
                        || e.contains("not supported"))
                {
                    tally.passed += 1;
                    tally.refused += 1;
                } else {
                    println!(
                        "FAILED {label} {}: refused without naming the node and why: {e}",
                        entry.case
                    );
                    tally.failed += 1;
                }
            }
            (expect, outcome) => {
                println!(
                    "FAILED {label} [{}] {}: expected {expect:?}, got {outcome:?}",
                    entry.family, entry.case
                );
                tally.failed += 1;
            }
        }
    }
    tally
}

/// The real models of the same wheel: PP-OCRv4 rec as a ragged batch against one by one,
/// det and cls plain against tract's CPU runtime.
fn real_models(runtime: &'static dyn Runtime, label: &str) -> bool {
    let dir = root().join("assets/ppocr");
    let run = || -> TractResult<Vec<String>> {
        let mut report = vec![];
        let rec = load_onnx(dir.join("ch_PP-OCRv4_rec_infer.onnx"), Some("N,3,48,W,f32"))?;
        let classes = tract_ragged::ocr::classes(&rec.properties)?;
        let rec = RaggedModel::new(rec, RaggedSpec::new("x", 3))?.into_runnable_with(runtime)?;
        let lines_dir = root().join("fixtures/lines");
        let lines: Vec<Tensor> = [
            "line02.png",
            "line07.png",
            "line08.png",
            "line15.png",
            "line22.png",
            "line26.png",
        ]
        .iter()
        .map(|f| tract_ragged::ocr::load_line(lines_dir.join(f)))
        .collect::<TractResult<_>>()?;
        let (batched, alone) = (rec.run_batch(&lines)?, rec.run_one_by_one(&lines)?);
        for (k, (b, a)) in batched.iter().zip(&alone).enumerate() {
            b[0].close_enough(&a[0], Approximation::Approximate)
                .with_context(|| format!("rec line {k}"))?;
            ensure!(
                tract_ragged::ocr::ctc_greedy(&b[0], &classes)?
                    == tract_ragged::ocr::ctc_greedy(&a[0], &classes)?,
                "rec line {k}: text differs"
            );
        }
        report.push(format!("PP-OCRv4 rec ragged ({} lines) ok", lines.len()));
        for (file, fact) in [
            ("ch_PP-OCRv4_det_infer.onnx", "1,3,160,224,f32"),
            ("ch_ppocr_mobile_v2.0_cls_infer.onnx", "2,3,48,192,f32"),
        ] {
            let model = load_onnx(dir.join(file), Some(fact))?;
            let shape: Vec<usize> = model
                .input_fact(0)?
                .shape
                .as_concrete()
                .context("concrete")?
                .to_vec();
            let values: Vec<f32> = (0..shape.iter().product::<usize>())
                .map(|i| ((i * 7919) % 255) as f32 / 127.5 - 1.0)
                .collect();
            let x = Tensor::from_shape(&shape, &values)?;
            let expected = DefaultRuntime
                .prepare(model.clone())?
                .run(tvec!(x.clone().into_tvalue()))?;
            let found = runtime.prepare(model)?.run(tvec!(x.into_tvalue()))?;
            for (f, e) in found.iter().zip(expected.iter()) {
                f.close_enough(e, Approximation::Approximate)
                    .with_context(|| file.to_string())?;
            }
            report.push(format!("{file} plain ok"));
        }
        Ok(report)
    };
    match run() {
        Ok(report) => {
            println!("real models ({label}): {}", report.join(", "));
            true
        }
        Err(e) => {
            println!("FAILED real models ({label}): {e:#}");
            false
        }
    }
}

fn discover(prefixes: &str) -> TractResult<()> {
    let mut names: Vec<String> = std::fs::read_dir(cases_dir())?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| prefixes.split(',').any(|p| n.starts_with(p)) && !n.ends_with("_expanded"))
        .collect();
    names.sort();
    for name in names {
        let case = match Case::load(&cases_dir().join(&name)) {
            Ok(c) => c,
            Err(e) => {
                println!("{name} | skip: cannot load: {e:#} | skip: cannot load");
                continue;
            }
        };
        let plain = match (
            case.plain(&DefaultRuntime),
            case.untransformed(&DefaultRuntime),
        ) {
            (Outcome::Passed, _) => "pass".to_string(),
            (o, Outcome::Passed) => format!("OURS: {o:?}").replace('|', "/").replace('\n', " "),
            (_, o) => format!("skip: tract: {o:?}")
                .replace('|', "/")
                .replace('\n', " "),
        };
        let ragged = if !case.raggable() {
            "n/a: no spatial axis on a float input".to_string()
        } else {
            match case.ragged(&DefaultRuntime) {
                Outcome::Passed => "pass".to_string(),
                Outcome::Refused(e) => format!("refused: {}", e.replace('|', "/")),
                o => format!("skip: {o:?}").replace('|', "/").replace('\n', " "),
            }
        };
        println!("{name} | {plain} | {ragged}");
    }
    Ok(())
}

fn main() -> ExitCode {
    // tract panics on some cases it does not expect: each is caught as that case's error,
    // reported in one line.
    std::panic::set_hook(Box::new(|info| {
        let at = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("(caught) panic at {at}");
    }));
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        return ExitCode::SUCCESS;
    }
    if !cases_dir().exists() {
        println!(
            "FAILED: {} is missing: run scripts/fetch-assets.sh",
            cases_dir().display()
        );
        return ExitCode::FAILURE;
    }
    if let Ok(prefixes) = std::env::var("ONNX_CONFORMANCE_DISCOVER") {
        return match discover(&prefixes) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                println!("{e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let entries = match manifest::parse(MANIFEST) {
        Ok(e) => e,
        Err(e) => {
            println!("FAILED: manifest.txt: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    // libtest's conventions: a free argument filters, `--skip NAME` leaves out.
    let (mut filter, mut skips): (Option<&String>, Vec<&String>) = (None, vec![]);
    let mut rest = args.iter().skip(1);
    while let Some(arg) = rest.next() {
        if arg == "--skip" {
            skips.extend(rest.next());
        } else if !arg.starts_with('-') && filter.is_none() {
            filter = Some(arg);
        }
    }
    let entries: Vec<Entry> = entries
        .into_iter()
        .filter(|e| filter.is_none_or(|f| e.case.contains(f.as_str())))
        .filter(|e| !skips.iter().any(|s| e.case.contains(s.as_str())))
        .collect();
    let with_ignored = args
        .iter()
        .any(|a| a == "--include-ignored" || a == "--ignored");
    let mut runtimes: Vec<(&str, &'static dyn Runtime)> = vec![("cpu", &DefaultRuntime)];
    if with_ignored {
        match runtime_for_name("ragged-cuda") {
            Ok(Some(rt)) => runtimes.push(("cuda", rt)),
            other => {
                println!("FAILED: ragged-cuda unavailable: {other:?}");
                return ExitCode::FAILURE;
            }
        }
    }
    let mut ok = true;
    for (label, runtime) in runtimes {
        for (mode, ragged) in [("plain", false), ("ragged", true)] {
            let tally = run_mode(&entries, runtime, &format!("({label}, {mode})"), ragged);
            println!(
                "onnx conformance ({label}, {mode}): {} passed, {} failed, {} skipped",
                tally.passed, tally.failed, tally.skipped
            );
            if ragged {
                println!(
                    "  of which {} refused, as the manifest expects",
                    tally.refused
                );
            }
            ok &= tally.failed == 0;
        }
        if filter.is_none() {
            ok &= real_models(runtime, label);
        }
    }
    if !with_ignored {
        println!("onnx conformance (cuda, plain): ignored, needs a CUDA device");
        println!("onnx conformance (cuda, ragged): ignored, needs a CUDA device");
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
