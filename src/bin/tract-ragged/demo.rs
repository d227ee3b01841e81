//! `tract-ragged demo`: PP-OCRv4 rec on the project's text lines, three ways.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tract_core::internal::*;
use tract_ragged::{RaggedSpec, ocr};

use crate::model::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// PP-OCRv4 rec (scripts/fetch-assets.sh puts it there).
    #[arg(long, default_value = "assets/ppocr/ch_PP-OCRv4_rec_infer.onnx")]
    pub model: PathBuf,
    /// A folder of text-line PNGs, height 48, with their texts in texts.tsv.
    #[arg(long, default_value = "fixtures/lines")]
    pub lines: PathBuf,
    /// cpu or cuda.
    #[arg(long, default_value = "cpu")]
    pub runtime: tract_ragged::Device,
}

/// The median of a few timed runs, after one untimed run that prepares the plans.
fn timed<T>(mut f: impl FnMut() -> TractResult<T>) -> TractResult<(T, Duration)> {
    f()?;
    let mut times = vec![];
    let mut last = None;
    for _ in 0..3 {
        let started = Instant::now();
        last = Some(f()?);
        times.push(started.elapsed());
    }
    times.sort();
    Ok((last.context("no run")?, times[1]))
}

fn max_diff(a: &Tensor, b: &Tensor) -> TractResult<f32> {
    if a.shape() != b.shape() {
        return Ok(f32::INFINITY);
    }
    let (a, b) = (
        a.to_plain_array_view::<f32>()?,
        b.to_plain_array_view::<f32>()?,
    );
    Ok(a.iter()
        .zip(b.iter())
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max))
}

pub fn demo(args: DemoArgs) -> TractResult<()> {
    ensure!(
        args.model.exists(),
        "{} not found: run scripts/fetch-assets.sh first",
        args.model.display()
    );
    let (lines, rendered): (Vec<Tensor>, Vec<String>) =
        ocr::load_labelled_lines(&args.lines)?.into_iter().unzip();
    let runnable = crate::model::prepare(&ModelArgs {
        model: args.model.clone(),
        ragged: RaggedSpec::new("x", 3),
        input_fact: vec!["N,3,48,W,f32".into()],
        runtime: args.runtime,
        verbose: false,
        top_k: None,
        precision: Default::default(),
    })?;
    let classes = ocr::classes(runnable.model().properties())?;
    let (ragged, t_ragged) = timed(|| runnable.run_batch(&lines))?;
    let (scheduled, t_scheduled) = timed(|| runnable.run(&lines))?;
    let lanes = runnable.backend().lanes();
    let (alone, t_alone) = timed(|| runnable.run_one_by_one(&lines))?;
    let (padded, t_padded) = timed(|| runnable.run_naive_padded(&lines))?;
    println!(
        "PP-OCRv4 rec, {} lines of widths {}..{} px, one batch, runtime {}\n",
        lines.len(),
        lines.iter().map(|l| l.shape()[2]).min().unwrap_or(0),
        lines.iter().map(|l| l.shape()[2]).max().unwrap_or(0),
        args.runtime
    );
    println!(
        "{:>4} {:>5}  {:<40} {:<40} {:<40} {:>9} {:>9}",
        "line", "width", "ragged batch", "one by one", "naive padding", "|rag-1b1|", "|pad-1b1|"
    );
    let mut wrong_padded = 0;
    let mut wrong_ragged = 0;
    let mut worst = 0f32;
    // Lines read as rendered: ragged batch, one by one, naive padding.
    let mut read_right = [0usize; 3];
    for i in 0..lines.len() {
        let t_r = ocr::ctc_greedy(&ragged[i][0], &classes)?;
        let t_1 = ocr::ctc_greedy(&alone[i][0], &classes)?;
        let t_p = ocr::ctc_greedy(&padded[i][0], &classes)?;
        let d_r = max_diff(&ragged[i][0], &alone[i][0])?;
        worst = worst.max(max_diff(&scheduled[i][0], &alone[i][0])?);
        let d_p = max_diff(&padded[i][0], &alone[i][0])?;
        worst = worst.max(d_r);
        wrong_ragged += (t_r != t_1) as usize;
        wrong_padded += (t_p != t_1) as usize;
        for (count, t) in read_right.iter_mut().zip([&t_r, &t_1, &t_p]) {
            *count += (t.trim() == rendered[i]) as usize;
        }
        let short = |s: &str| s.chars().take(40).collect::<String>();
        println!(
            "{i:>4} {:>5}  {:<40} {:<40} {:<40} {d_r:>9.1e} {d_p:>9.1e}",
            lines[i].shape()[2],
            short(&t_r),
            if t_1 == t_r {
                "=".to_string()
            } else {
                short(&t_1)
            },
            if t_p == t_1 {
                "=".to_string()
            } else {
                short(&t_p)
            },
        );
    }
    let per_s = |d: Duration| lines.len() as f64 / d.as_secs_f64();
    println!();
    println!(
        "text differing from one by one: ragged batch {wrong_ragged}/{n}, naive padding {wrong_padded}/{n}",
        n = lines.len()
    );
    println!("max |probability difference| to one by one: ragged batch and scheduled {worst:.1e}");
    println!(
        "rendered text read right: ragged batch {}/{n}, one by one {}/{n}, naive padding {}/{n}",
        read_right[0],
        read_right[1],
        read_right[2],
        n = lines.len()
    );
    println!(
        "ragged batch  {:>8.1?} {:>7.1} lines/s (exact; all lines in one batch, run_batch)",
        t_ragged,
        per_s(t_ragged)
    );
    println!(
        "scheduled     {:>8.1?} {:>7.1} lines/s (exact; what `tract-ragged run` does: batches \
         by measured cost, {lanes} lanes, run)",
        t_scheduled,
        per_s(t_scheduled)
    );
    println!(
        "one by one    {:>8.1?} {:>7.1} lines/s (exact; one thread)",
        t_alone,
        per_s(t_alone)
    );
    println!(
        "naive padding {:>8.1?} {:>7.1} lines/s (inexact)",
        t_padded,
        per_s(t_padded)
    );
    Ok(())
}
