//! `tract-ragged bench`: lines per second, exact ragged batches against what users do
//! today (padded batches, inexact; one by one, exact but slow), on the same samples.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tract_core::internal::*;
use tract_ragged::backend::{Backend, HostBackend};
use tract_ragged::{Device, RaggedRunnable, npz, ocr};

use crate::model::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Samples: one array per sample, without the batch axis.
    #[arg(long, value_name = "IN.npz", conflicts_with = "lines")]
    pub samples: Option<PathBuf>,
    /// Or a folder of PP-OCR text-line PNGs (height 48).
    #[arg(long, value_name = "DIR", conflicts_with = "pages")]
    pub lines: Option<PathBuf>,
    /// Or a folder of page PNGs, sized in multiples of 32, for a text detector (PP-OCR
    /// det's preprocessing).
    #[arg(long, value_name = "DIR", conflicts_with = "samples")]
    pub pages: Option<PathBuf>,
    /// Use the samples this many times over (each copy cropped a little differently).
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub repeat: usize,
    /// Samples per batch.
    #[arg(long, default_value_t = 32, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub batch: usize,
    /// Timed runs of each row (the median is reported), after a warm-up.
    #[arg(long, default_value_t = 5, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub runs: usize,
    /// Also time ragged batches on the CPU (when --runtime cuda).
    #[arg(long)]
    pub cpu: bool,
    /// Leave out the one-by-one row (slow on many samples).
    #[arg(long)]
    pub no_one_by_one: bool,
    /// Leave out the row of width-sorted batches of --batch (slow on the CPU runtime, to
    /// set the scheduled row against one by one in more runs).
    #[arg(long)]
    pub no_sorted: bool,
    /// Leave out the padded rows of the plain runtime (to compare ragged settings in
    /// more runs).
    #[arg(long)]
    pub no_padded: bool,
    /// Time the scheduled row only (`run`): with --cpu, the CPU's scheduled row
    /// too (to compare settings of the scheduler or the host in a few seconds).
    #[arg(long)]
    pub only_scheduled: bool,
    /// Write the samples used, to time other engines on the same ones.
    #[arg(long, value_name = "OUT.npz")]
    pub save_samples: Option<PathBuf>,
    /// After the rows, one more scheduled run with its timeline: each batch's upload, run
    /// and download on the host's clock, the plans prepared, and what of the wall clock
    /// they cover; then the same of one by one on the runtime, unless its row is left out.
    #[arg(long)]
    pub timeline: bool,
    /// The scheduled row as a server runs it: the samples shuffled and run in calls of
    /// this many, one call after the other (each call cut and scheduled on its own).
    #[arg(long, value_name = "G", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub calls: Option<usize>,
    /// With --calls: shuffle the samples again before every run, so that no batch
    /// composition comes back (a server's gatherings), instead of once for all runs.
    #[arg(long, requires = "calls")]
    pub reshuffle: bool,
}

/// The indices `0..n` in an order drawn from `seed` (Fisher-Yates over a 64-bit
/// xorshift: reproducible, no dependency for a bench's shuffle).
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        order.swap(i, (state % (i as u64 + 1)) as usize);
    }
    order
}

/// The samples, repeated; `step` the multiple the model takes along the last axis.
fn load(args: &BenchArgs, step: usize) -> TractResult<Vec<Tensor>> {
    let base: Vec<Tensor> = match (&args.samples, &args.lines, &args.pages) {
        (Some(path), _, _) => npz::read_samples(path, HostBackend.memory_budget())?
            .into_iter()
            .map(|(_, t)| t)
            .collect(),
        (None, Some(dir), _) => ocr::load_lines(dir)?.into_iter().map(|(_, t)| t).collect(),
        (None, None, Some(dir)) => ocr::load_pages(dir)?.into_iter().map(|(_, t)| t).collect(),
        (None, None, None) => bail!("give --samples IN.npz, --lines DIR or --pages DIR"),
    };
    ensure!(!base.is_empty(), "no sample");
    let mut all = vec![];
    for copy in 0..args.repeat.max(1) {
        for t in &base {
            // Later copies lose a few columns on the right (a multiple of what the model
            // takes): more distinct widths.
            let axis = t.rank() - 1;
            let w = t.shape()[axis];
            let cut = if step > 1 {
                step * (copy % 3)
            } else {
                (copy * 7) % 13
            };
            all.push(if copy > 0 && w > cut + 8 {
                t.slice(axis, 0, w - cut)?
            } else {
                t.clone()
            });
        }
    }
    Ok(all)
}

/// Median wall time of `f` over `runs`, after one warm-up call.
fn time(runs: usize, f: impl FnMut() -> TractResult<()>) -> TractResult<Duration> {
    Ok(time_warm(runs, 1, f)?.0)
}

/// Median wall time of `f` over `runs` after `warmups` calls, and the first call's time.
fn time_warm(
    runs: usize,
    warmups: usize,
    mut f: impl FnMut() -> TractResult<()>,
) -> TractResult<(Duration, Duration, Split)> {
    let start = Instant::now();
    f()?;
    let first = start.elapsed();
    for _ in 1..warmups {
        f()?;
    }
    let before = Split::now();
    let mut times: Vec<Duration> = (0..runs.max(1))
        .map(|_| {
            let start = Instant::now();
            f().map(|_| start.elapsed())
        })
        .collect::<TractResult<_>>()?;
    times.sort();
    Ok((times[times.len() / 2], first, Split::now().since(&before)))
}

/// The process's phase totals and runtime events (`timeline::totals`, `counters::totals`):
/// taken around timed runs, what a batch spent in each phase and what the runtime did,
/// in the words the server's metrics use (benches/load.sh prints the same from them).
struct Split {
    phases: Vec<(tract_ragged::timeline::Phase, Duration, u64)>,
    events: Vec<(tract_ragged::counters::Event, u64)>,
}

impl Split {
    fn now() -> Split {
        Split {
            phases: tract_ragged::timeline::totals(),
            events: tract_ragged::counters::totals(),
        }
    }

    fn since(self, before: &Split) -> Split {
        Split {
            phases: tract_ragged::timeline::difference(&self.phases, &before.phases),
            events: tract_ragged::counters::difference(&self.events, &before.events),
        }
    }
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use tract_ragged::timeline::Phase;
        write!(f, "a batch:")?;
        for (phase, took, n) in &self.phases {
            if *n > 0
                && matches!(
                    phase,
                    Phase::Upload | Phase::Turn | Phase::Run | Phase::Download
                )
            {
                write!(
                    f,
                    " {} {:.2} ms",
                    phase.label(),
                    took.as_secs_f64() * 1e3 / *n as f64
                )?;
            }
        }
        // Waits behind another thread's hold of the device, within the phases above.
        let runs = self
            .phases
            .iter()
            .find(|(p, _, _)| *p == Phase::Run)
            .map_or(0, |(_, _, n)| *n);
        if let Some((_, held, _)) = self.phases.iter().find(|(p, _, _)| *p == Phase::Hold)
            && runs > 0
            && !held.is_zero()
        {
            write!(
                f,
                " (hold {:.2} ms)",
                held.as_secs_f64() * 1e3 / runs as f64
            )?;
        }
        for (event, n) in &self.events {
            if *n > 0 {
                write!(f, "; {n} {}", event.label())?;
            }
        }
        Ok(())
    }
}

/// Batches of `size` samples, widest last (width-sorted), as indices.
fn sorted_batches(samples: &[Tensor], size: usize) -> Vec<Vec<usize>> {
    let axis = samples[0].rank() - 1;
    let mut order: Vec<usize> = (0..samples.len()).collect();
    order.sort_by_key(|i| samples[*i].shape()[axis]);
    order.chunks(size.max(1)).map(|c| c.to_vec()).collect()
}

fn run_batches(
    samples: &[Tensor],
    batches: &[Vec<usize>],
    f: impl Fn(&[&Tensor]) -> TractResult<Vec<TVec<Tensor>>>,
) -> TractResult<()> {
    for b in batches {
        let batch: Vec<&Tensor> = b.iter().map(|i| &samples[*i]).collect();
        for out in f(&batch)? {
            // Make sure the work is done, not only queued: read one value of each output.
            for t in out {
                let _ = t.as_bytes().first();
            }
        }
    }
    Ok(())
}

/// Plans kept by the runnables on the host: every width's, so that the rows time runs, not
/// preparations (one by one prepares a plan per width; a host plan is a copy of the
/// weights). Device plans keep the default cache.
const HOST_PLANS: usize = 512;

pub fn bench(args: BenchArgs) -> TractResult<()> {
    let runnable = crate::model::prepare(&args.model)?;
    let on_host = args.model.runtime == Device::Cpu;
    let runnable = if on_host {
        runnable.with_plan_capacity(HOST_PLANS)
    } else {
        runnable
    };
    let step = runnable
        .sample_fact()
        .alignment
        .last()
        .map(|a| a.0 as usize)
        .unwrap_or(1);
    let samples = load(&args, step)?;
    if let Some(path) = &args.save_samples {
        let named = samples
            .iter()
            .enumerate()
            .map(|(i, t)| (format!("line{i:04}"), t));
        npz::write_arrays(path, named)?;
    }
    // What users do today runs on the plain runtime: tract-cuda for cuda.
    let reference_runtime = match args.model.runtime {
        Device::Cuda => runtime_for_name("cuda")?.context("tract-cuda not found")?,
        Device::Cpu => Device::Cpu.runtime()?,
    };
    let reference = runnable
        .model()
        .clone()
        .into_runnable_with(reference_runtime)?;
    let reference = if on_host {
        reference.with_plan_capacity(HOST_PLANS)
    } else {
        reference
    };
    let batches = sorted_batches(&samples, args.batch);
    let axis = samples[0].rank() - 1;
    let widths: Vec<usize> = samples.iter().map(|s| s.shape()[axis]).collect();
    println!(
        "{}: {} samples, widths {}..{} (sum {}), width-sorted batches of {}, median of {} runs",
        args.model.model.display(),
        samples.len(),
        widths.iter().min().unwrap_or(&0),
        widths.iter().max().unwrap_or(&0),
        widths.iter().sum::<usize>(),
        args.batch,
        args.runs
    );
    let mut rows: Vec<(String, Duration)> = vec![];
    // Reduced precision is not exact: the rows say what they ran at.
    let exact = match args.model.precision {
        tract_ragged::precision::Precision::F32 => "exact".to_string(),
        p => format!("{p}"),
    };
    let on = |r: &RaggedRunnable| r.runtime().name().to_string();
    if !args.only_scheduled && !args.no_sorted {
        rows.push((
            format!("ragged, width-sorted batches, {exact} ({})", on(&runnable)),
            time(args.runs, || {
                run_batches(&samples, &batches, |b| runnable.run_batch(b))
            })?,
        ));
    }
    // On a device each lane keeps its own plan states and captures its own graph of a
    // batch shape the second time it runs it, and which lane runs which batch varies
    // from run to run: warm up twice per lane so that the row times runs, not
    // preparations, and say what the first run took.
    let lanes = runnable.backend().lanes();
    let warmups = if on_host { 1 } else { 2 * lanes };
    let mut round = 0u64;
    let (scheduled, first, split) = time_warm(args.runs, warmups, || {
        // One call of every sample, or calls of `--calls` in a shuffled order.
        let order = match args.calls {
            None => (0..samples.len()).collect(),
            Some(_) => {
                round += args.reshuffle as u64;
                shuffled(samples.len(), round)
            }
        };
        for call in order.chunks(args.calls.unwrap_or(samples.len()).max(1)) {
            let part: Vec<&Tensor> = call.iter().map(|i| &samples[*i]).collect();
            for out in runnable.run(&part)? {
                for t in out {
                    let _ = t.as_bytes().first();
                }
            }
        }
        Ok(())
    })?;
    println!(
        "scheduled: the first of {warmups} warm-up runs took {:.1} ms; over the timed runs, {split}",
        first.as_secs_f64() * 1e3
    );
    rows.push((
        format!(
            "ragged, scheduled (run, {lanes} lanes{}), {exact} ({})",
            match (args.calls, args.reshuffle) {
                (None, _) => String::new(),
                (Some(g), false) => format!(", calls of {g}"),
                (Some(g), true) => format!(", calls of {g} shuffled anew each run"),
            },
            on(&runnable)
        ),
        scheduled,
    ));
    if !args.no_padded && !args.only_scheduled {
        rows.push((
            format!("padded, width-sorted batches, inexact ({})", on(&reference)),
            time(args.runs, || {
                run_batches(&samples, &batches, |b| reference.run_naive_padded(b))
            })?,
        ));
        let in_order: Vec<Vec<usize>> = (0..samples.len())
            .collect::<Vec<_>>()
            .chunks(args.batch.max(1))
            .map(|c| c.to_vec())
            .collect();
        rows.push((
            format!(
                "padded, input order, batches of {} ({})",
                args.batch,
                on(&reference)
            ),
            time(args.runs, || {
                run_batches(&samples, &in_order, |b| reference.run_naive_padded(b))
            })?,
        ));
    }
    if !args.no_one_by_one && !args.only_scheduled {
        rows.push((
            format!("one by one, exact ({})", on(&reference)),
            time(args.runs.min(3), || {
                run_batches(&samples, &batches, |b| reference.run_one_by_one(b))
            })?,
        ));
        // Our runtime alone per sample: what runs what the plain runtime cannot (a
        // recurrence on cuDNN), the fairest one by one.
        if on(&runnable) != on(&reference) {
            rows.push((
                format!("one by one, exact ({})", on(&runnable)),
                time(args.runs.min(3), || {
                    run_batches(&samples, &batches, |b| runnable.run_one_by_one(b))
                })?,
            ));
        }
    }
    if args.cpu && args.model.runtime != Device::Cpu {
        let cpu = runnable
            .model()
            .clone()
            .into_runnable()?
            .with_plan_capacity(HOST_PLANS);
        rows.push((
            format!(
                "ragged, scheduled (run, {} lanes), exact (cpu)",
                cpu.backend().lanes()
            ),
            time(1, || cpu.run(&samples).map(|_| ()))?,
        ));
        if let Some(costs) = cpu.measured_costs() {
            println!("cpu costs measured: {}", crate::run::describe_costs(&costs));
        }
        if !args.no_one_by_one && !args.only_scheduled {
            rows.push((
                "one by one, exact (cpu, one thread)".to_string(),
                time(1, || cpu.run_one_by_one(&samples).map(|_| ()))?,
            ));
        }
    }
    if let Some(costs) = runnable.measured_costs() {
        println!("costs measured: {}", crate::run::describe_costs(&costs));
    }
    if let Some((cells, batches)) = runnable.fitted_overhead() {
        println!("a batch's fixed part, fitted to its latest {batches} batches: {cells} cells");
    }
    // Plans prepared again in the timed runs are time the rows include (tens of
    // milliseconds each on a device).
    println!(
        "ragged plans: {} prepared over every row, {} held",
        runnable.prepared_plans(),
        runnable.cached_plans()
    );
    if args.timeline {
        let (outputs, timeline) = tract_ragged::timeline::record(|| runnable.run(&samples));
        let outputs = outputs?;
        print!("{}", timeline.summary());
        // The rows' times include freeing each run's outputs; the timeline's wall clock
        // ends when they are returned.
        let freeing = Instant::now();
        drop(outputs);
        println!(
            "  then the outputs freed in {:.1} ms",
            freeing.elapsed().as_secs_f64() * 1e3
        );
        if !args.no_one_by_one && !args.only_scheduled {
            // Where one by one's wall clock goes: the caller's runs, the plans prepared
            // (ahead, on helpers), and the caller waiting for them (no batch under way).
            println!("one by one ({}):", on(&runnable));
            let (outputs, timeline) =
                tract_ragged::timeline::record(|| runnable.run_one_by_one(&samples));
            outputs?;
            print!("{}", timeline.summary());
        }
    }
    if !args.model.precision.is_exact() {
        accuracy(&runnable, &args, &samples)?;
    }
    let base = rows[0].1.as_secs_f64();
    let per_second = if args.pages.is_some() {
        "pages/s"
    } else {
        "lines/s"
    };
    println!(
        "{:<52} {:>10} {:>10} {:>9}",
        "", "ms", per_second, "vs first"
    );
    for (name, d) in &rows {
        let s = d.as_secs_f64();
        println!(
            "{name:<52} {:>10.1} {:>10.0} {:>9.2}",
            s * 1e3,
            samples.len() as f64 / s,
            s / base
        );
    }
    Ok(())
}

/// Reduced precision against fp32 one by one on the same runtime: the largest difference
/// of any f32 output and, for a CTC recogniser (its classes in the model's metadata), the
/// lines whose greedy text differs.
fn accuracy(runnable: &RaggedRunnable, args: &BenchArgs, samples: &[Tensor]) -> TractResult<()> {
    // The model as loaded, at f32: an f16 runnable's own model is the f16 one.
    let exact = crate::model::prepare(&ModelArgs {
        precision: tract_ragged::precision::Precision::F32,
        ..args.model.clone()
    })?;
    let reference = exact.run_one_by_one(samples)?;
    let reduced = runnable.run(samples)?;
    let classes = tract_ragged::ocr::classes(runnable.model().properties()).ok();
    let (mut worst, mut texts) = (0f32, 0usize);
    for (r, e) in reduced.iter().zip(&reference) {
        for (a, b) in r.iter().zip(e) {
            if a.datum_type() != f32::datum_type() || a.shape() != b.shape() {
                continue;
            }
            let (a, b) = (
                a.to_plain_array_view::<f32>()?,
                b.to_plain_array_view::<f32>()?,
            );
            worst = a
                .iter()
                .zip(b.iter())
                .fold(worst, |w, (x, y)| w.max((x - y).abs()));
        }
        if let (Some(classes), Some(a), Some(b)) = (&classes, r.first(), e.first())
            && a.datum_type() == f32::datum_type()
            && a.rank() == 2
        {
            let differs = tract_ragged::ocr::ctc_greedy(a, classes)?
                != tract_ragged::ocr::ctc_greedy(b, classes)?;
            texts += differs as usize;
        }
    }
    print!(
        "accuracy of {} against f32 one by one: largest |difference| {worst:.2e}",
        args.model.precision
    );
    if classes.is_some() {
        print!("; text differs on {texts}/{} lines", samples.len());
    }
    println!();
    Ok(())
}
