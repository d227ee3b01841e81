//! `tract-ragged run`: samples from an .npz archive through the model, outputs to another.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use tract_core::internal::*;
use tract_ragged::RaggedRunnable;
use tract_ragged::Samples;
use tract_ragged::backend::{Backend, HostBackend};
use tract_ragged::error::ErrorKind;
use tract_ragged::npz;
use tract_ragged::schedule::{CellCosts, Costs, Schedule};

use crate::model::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The samples: one array per sample, in archive order, without the batch axis.
    #[arg(long, value_name = "IN.npz")]
    pub samples: PathBuf,
    /// Where to write output j of sample i as `s{i}_o{j}`, cropped to its valid extent.
    #[arg(long, value_name = "OUT.npz")]
    pub out: PathBuf,
    /// At most N samples per batch (by default, as many as memory and the cost model say).
    #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub batch: Option<usize>,
    /// Memory the run may take: bytes, or with a K, M or G suffix; 40% holds the samples
    /// read and the outputs not yet written, 40% the batch running, 20% the prepared
    /// plans (default: 80% of the available RAM; on cuda, batches take 80% of the
    /// device's free memory).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub memory: Option<u64>,
    /// Run each sample alone through the original model (the reference), no batching. A
    /// model that cannot be prepared for ragged batches (refused by the transform, or not
    /// typed over symbols) runs alone on plain tract, typed at each sample's shape.
    #[arg(long)]
    pub one_by_one: bool,
    /// Write the outputs of every sample that ran, report the others (sample, reason) on
    /// stderr, and exit with status 3 if any failed (by default, one failure fails the
    /// run and writes nothing).
    #[arg(long)]
    pub keep_going: bool,
}

/// `1073741824`, `512M`, `8G`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, unit) = match s.char_indices().find(|(_, c)| c.is_alphabetic()) {
        Some((ix, _)) => (&s[..ix], s[ix..].to_ascii_uppercase()),
        None => (s, String::new()),
    };
    let value: f64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("not a size: {s:?}"))?;
    if !value.is_finite() || value <= 0.0 {
        return Err(format!("a size must be positive: {s:?}"));
    }
    let scale = match unit.trim_end_matches(['B', 'I']) {
        "" => 1u64,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        other => return Err(format!("unknown size unit {other:?} in {s:?}")),
    };
    Ok((value * scale as f64) as u64)
}

/// Whether `a` and `b` name the same file (where both exist), or the same path.
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Samples that failed in a `--keep-going` run: the others' outputs were written.
#[derive(Debug)]
pub struct SamplesFailed {
    /// Each failed sample: its index, its name in the archive, why.
    pub failed: Vec<(usize, String, String)>,
    pub total: usize,
    pub out: PathBuf,
}

impl std::fmt::Display for SamplesFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        if self.failed.len() == self.total {
            return write!(
                f,
                "all {} samples failed; {} was not written",
                self.total,
                self.out.display()
            );
        }
        write!(
            f,
            "{} of {} samples failed; the outputs of the other {} are in {}",
            self.failed.len(),
            self.total,
            self.total - self.failed.len(),
            self.out.display()
        )
    }
}

impl std::error::Error for SamplesFailed {}

/// Puts the archive in place, unless every sample failed: then there is nothing to write,
/// and an empty archive must not replace the outputs of an earlier run (`OUT` is left as
/// it was; the partial file goes with the sink).
fn commit_unless_all_failed(sink: npz::NpzSink, failed: usize, total: usize) -> TractResult<()> {
    if total > 0 && failed == total {
        drop(sink);
        return Ok(());
    }
    sink.commit()
}

/// The output archive, its temporary file removed if a signal ends the run first: the
/// handler is in place before the file exists (a signal between the two left it).
fn create_sink(out: &Path) -> TractResult<npz::NpzSink> {
    #[cfg(unix)]
    crate::interrupt::remove_on_signal(&npz::NpzSink::partial_for(out));
    let sink = npz::NpzSink::create(out)?;
    debug_assert_eq!(sink.partial(), npz::NpzSink::partial_for(out));
    Ok(sink)
}

/// What a run holds at once, out of the memory given: the samples of one window
/// (consecutive samples of the archive) and their outputs, 40%; the batch running, 40%
/// (on a device, the device's budget unless `--memory` is given); the prepared plans,
/// each with its copy of the weights, 20% (4 plans at least, 32 at most).
struct Budgets {
    window: u64,
    batch: u64,
    plans: usize,
}

impl Budgets {
    fn new(args: &RunArgs, runnable: &RaggedRunnable) -> Budgets {
        let backend = runnable.backend();
        let host = args.memory.unwrap_or_else(|| HostBackend.memory_budget());
        let batch = match args.memory {
            Some(memory) => memory / 5 * 2,
            None if backend.name() == HostBackend.name() => {
                backend.memory_budget().min(host / 5 * 2)
            }
            None => backend.memory_budget(),
        };
        let plans = (host / 5 / runnable.weight_bytes().max(1)).clamp(4, 32) as usize;
        Budgets {
            window: host / 5 * 2,
            batch,
            plans,
        }
    }
}

/// Where the window starting at sample `start` ends: the samples whose inputs and
/// outputs (as their headers and the model's output shapes say) fit `budget`, one at
/// least.
fn window_end(
    reader: &npz::NpzReader,
    runnable: &RaggedRunnable,
    start: usize,
    budget: u64,
) -> usize {
    let axes = &runnable.sample_fact().axes;
    let mut bytes = 0u64;
    for (ix, entry) in reader.entries().iter().enumerate().skip(start) {
        // A header that cannot be read, or of another rank, fails when its sample is read
        // or checked; it weighs nothing here.
        let sample = entry.header().ok().and_then(|h| {
            let input = h.data_bytes().ok()? as u64;
            let widths = axes
                .iter()
                .map(|a| h.shape.get(*a).copied())
                .collect::<Option<Vec<usize>>>()?;
            let output = runnable.sample_output_bytes(&widths).ok()?;
            Some(input.saturating_add(output))
        });
        bytes = bytes.saturating_add(sample.unwrap_or(0));
        if bytes > budget && ix > start {
            return ix;
        }
    }
    reader.entries().len()
}

pub fn run(args: RunArgs) -> TractResult<()> {
    ensure!(
        !same_file(&args.samples, &args.out),
        "--out {} is the samples' file: the outputs would replace the inputs",
        args.out.display()
    );
    let mut reader = npz::NpzReader::open(&args.samples)?;
    let total = reader.entries().len();
    ensure!(total > 0, "{} holds no sample", args.samples.display());
    let shared = read_shared(&mut reader)?;
    let runnable = match crate::model::prepare_with(&args.model, &shared) {
        Ok(runnable) => runnable,
        // The reference needs neither the transform nor symbolic typing: a model that
        // cannot be batched still runs each sample alone.
        Err(refused) if args.one_by_one => {
            let reference = crate::model::reference_with(&args.model, &shared)?;
            if args.model.verbose {
                eprintln!("one by one on plain tract at each sample's shape: {refused:#}");
            }
            return run_reference(&args, &reference, &mut reader);
        }
        Err(e) => return Err(e),
    };
    let budgets = Budgets::new(&args, &runnable);
    let runnable = runnable.with_plan_capacity(budgets.plans);
    if runnable.model().ragged.roles.len() > 1 {
        return run_several(&args, &runnable, &mut reader, &budgets);
    }
    let mut schedule = Schedule::for_runnable(&runnable);
    if let Some(batch) = args.batch {
        schedule.max_batch = Some(batch);
    }
    schedule.budget = budgets.batch;
    if args.model.verbose {
        eprintln!(
            "memory: samples and outputs held {} MiB, a batch {} MiB, {} plans",
            budgets.window >> 20,
            budgets.batch >> 20,
            budgets.plans
        );
    }
    let started = Instant::now();
    let bar = (std::io::stderr().is_terminal() && total >= 64).then(|| {
        let bar = indicatif::ProgressBar::new(total as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} samples {per_sec} {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let mut sink = create_sink(&args.out)?;
    let mut failed: Vec<(usize, String, String)> = vec![];
    let mut start = 0;
    // The first sample that passed its checks: the others' free dims must be its own.
    let mut first: Option<(usize, Tensor)> = None;
    while start < total {
        let end = window_end(&reader, &runnable, start, budgets.window);
        // Each sample of the window, read and checked, or why not.
        let mut window: Vec<TractResult<Tensor>> = Vec::with_capacity(end - start);
        for ix in start..end {
            // A sample too large to run alone is refused from its header, before its data
            // is read (or inflated: an archive of a few megabytes can claim gigabytes).
            // One by one is held to the batches' budget too: the same sample alone.
            let declared = match reader.entries()[ix].header() {
                Ok(h) => runnable.check_shape_alone(ix, &h.shape, budgets.batch),
                Err(_) => Ok(()),
            };
            let read = declared.and_then(|_| {
                reader
                    .read(ix, budgets.window)
                    .with_context(|| format!("sample {ix}"))
            });
            let sample = read.and_then(|t| {
                // Alone, a sample need not share its free dims with any other.
                let like = first
                    .as_ref()
                    .filter(|_| !args.one_by_one)
                    .map(|(f, t)| (*f, t));
                runnable.check_alone(ix, &t, like, budgets.batch)?;
                Ok(t)
            });
            match &sample {
                Ok(t) if first.is_none() => first = Some((ix, t.clone())),
                Err(_) if !args.keep_going => {
                    // A sample the model cannot take is named as the archive names it.
                    let name = &reader.entries()[ix].name;
                    return sample.map(|_| ()).map_err(|e| {
                        match tract_ragged::error::kind(&e) == ErrorKind::BadSample {
                            true => tract_ragged::error::with_name(e, name),
                            false => e,
                        }
                    });
                }
                _ => (),
            }
            window.push(sample);
        }
        let good: Vec<&Tensor> = window.iter().filter_map(|s| s.as_ref().ok()).collect();
        schedule.first_index = start;
        let mut outputs = if args.one_by_one {
            // The window at once, the plans of the samples ahead prepared meanwhile; where
            // a sample fails, each again on its own, for its own answer.
            match runnable.run_one_by_one(&good) {
                Ok(all) => all.into_iter().map(Ok).collect(),
                Err(_) => good
                    .iter()
                    .zip((start..end).filter(|ix| window[ix - start].is_ok()))
                    .map(|(s, ix)| {
                        runnable
                            .run_one_by_one(std::slice::from_ref(*s))
                            .and_then(|mut o| o.pop().context("no outputs"))
                            .with_context(|| format!("Running sample {ix} alone"))
                    })
                    .collect(),
            }
        } else if args.keep_going {
            runnable.run_each_scheduled(&good, &schedule)?
        } else {
            // All good (any failure returned above): numbered from `start` in errors.
            if args.model.verbose {
                print_schedule(&runnable, &schedule, &good)?;
            }
            let outputs = runnable.run_scheduled(&good, &schedule)?;
            outputs.into_iter().map(Ok).collect::<Vec<_>>()
        }
        .into_iter();
        if schedule.costs == Costs::Measure
            && let Some(costs) = runnable.measured_costs()
        {
            if args.model.verbose {
                eprintln!("costs measured: {}", describe_costs(&costs));
            }
            schedule.costs = Costs::Measured(costs);
        }
        // The next window's cut with the fixed part fitted to this one's batches.
        if runnable.backend().cost_model().fitted
            && let Some((cells, batches)) = runnable.fitted_overhead()
        {
            if args.model.verbose && schedule.batch_overhead != cells {
                eprintln!("a batch's fixed part, fitted to {batches} batches: {cells} cells");
            }
            schedule.batch_overhead = cells;
        }
        for (offset, sample) in window.into_iter().enumerate() {
            let ix = start + offset;
            let result = sample.and_then(|_| outputs.next().context("no outputs")?);
            match result {
                Ok(outs) => {
                    for (j, t) in outs.iter().enumerate() {
                        sink.add(&format!("s{ix}_o{j}"), t)?;
                    }
                }
                Err(e) if args.keep_going => {
                    let name = reader.entries()[ix].name.clone();
                    failed.push((ix, name, format!("{e:#}")));
                }
                Err(e) => return Err(e),
            }
        }
        if let Some(bar) = &bar {
            bar.set_position(end as u64);
        }
        start = end;
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    commit_unless_all_failed(sink, failed.len(), total)?;
    if args.model.verbose {
        eprintln!("ran {total} samples in {:.1?}", started.elapsed());
        if let Some(peak) = peak_rss() {
            eprintln!("peak memory (resident): {} MiB", peak >> 20);
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(SamplesFailed {
            failed,
            total,
            out: args.out.clone(),
        }
        .into())
    }
}

/// Prints how a window's samples are cut into batches.
fn print_schedule(
    runnable: &RaggedRunnable,
    schedule: &Schedule,
    samples: &[&Tensor],
) -> TractResult<()> {
    let widths: Vec<TVec<usize>> = samples
        .iter()
        .map(|s| runnable.sample_fact().widths_of(s))
        .collect();
    if schedule.costs == Costs::Measure {
        eprintln!(
            "schedule: samples {}..{} in {} lanes, memory budget {} MiB; what a cell costs at \
             each batch size is measured on them first",
            schedule.first_index,
            schedule.first_index + samples.len(),
            schedule.lanes,
            schedule.budget >> 20
        );
        return Ok(());
    }
    let plan = schedule.plan_axes(runnable, &widths)?;
    eprintln!(
        "schedule: samples {}..{} in {} batches, {} lanes, memory budget {} MiB",
        schedule.first_index,
        schedule.first_index + samples.len(),
        plan.len(),
        schedule.lanes,
        schedule.budget >> 20
    );
    for (ix, b) in plan.iter().enumerate() {
        eprintln!(
            "  batch {ix}: {} samples, padded width {}, padding {:.0}%, peak memory {} MiB",
            b.samples.len(),
            b.extents
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("x"),
            100.0 * b.waste(&widths),
            b.peak_memory >> 20
        );
    }
    Ok(())
}

/// Measured costs for the user: time per padded cell at each batch size measured.
pub fn describe_costs(costs: &CellCosts) -> String {
    let points: Vec<String> = costs
        .points
        .iter()
        .map(|(n, c)| format!("{:.2} us per padded cell at {n}", c * 1e6))
        .collect();
    format!("{}; batches up to {}", points.join(", "), costs.largest())
}

/// The process's peak resident memory, in bytes (Linux: `VmHWM`).
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

/// The archive's `shared.{input}` arrays, taken out of `reader`'s entries: inputs given
/// once for the whole run, folded into the model before it is typed
/// ([`crate::model::prepare_with`]). Each is read within [`SHARED_BYTES`].
fn read_shared(reader: &mut npz::NpzReader) -> TractResult<Vec<(String, Tensor)>> {
    let mut shared = vec![];
    for ix in 0..reader.entries().len() {
        let name = &reader.entries()[ix].name;
        if let Some(input) = name.strip_prefix("shared.") {
            let input = input.to_string();
            shared.push((input, reader.read(ix, SHARED_BYTES)?));
        }
    }
    reader.retain(|e| !e.name.starts_with("shared."));
    Ok(shared)
}

/// `run --one-by-one` on the plain reference (`tract_ragged::Reference`), for a model
/// that cannot be prepared for ragged batches: each sample read, run alone at its own
/// shape and written in turn. The archive as `run` reads it: one array per sample for a
/// model of one input, `s{i}.{input}` per sample for several (inputs given once are
/// folded into the model already).
fn run_reference(
    args: &RunArgs,
    reference: &tract_ragged::Reference,
    reader: &mut npz::NpzReader,
) -> TractResult<()> {
    let names = reference.input_names()?;
    let budget = args.memory.unwrap_or_else(|| HostBackend.memory_budget()) / 5 * 2;
    // Each sample's arrays, by index in the archive.
    let mut samples: std::collections::BTreeMap<usize, Vec<Option<usize>>> = Default::default();
    for (ix, entry) in reader.entries().iter().enumerate() {
        if names.len() == 1 {
            samples.insert(ix, vec![Some(ix)]);
            continue;
        }
        let parsed = per_sample_array(&entry.name);
        let expected = || {
            let names: Vec<String> = names.iter().map(|n| format!("s{{i}}.{n}")).collect();
            names.join(", ")
        };
        let Some((sample, input)) = parsed else {
            bail!(
                "array {:?}: a model of several inputs reads {}",
                entry.name,
                expected()
            );
        };
        let at = names.iter().position(|n| n == input).with_context(|| {
            format!(
                "array {:?}: the model takes no input {input:?} per sample (expected {})",
                entry.name,
                expected()
            )
        })?;
        samples
            .entry(sample)
            .or_insert_with(|| vec![None; names.len()])[at] = Some(ix);
    }
    ensure!(
        !samples.is_empty(),
        "{} holds no sample",
        args.samples.display()
    );
    let total = samples.len();
    let started = Instant::now();
    let mut failed: Vec<(usize, String, String)> = vec![];
    let mut sink = create_sink(&args.out)?;
    for (i, arrays) in samples {
        let name = if names.len() == 1 {
            reader.entries()[i].name.clone()
        } else {
            format!("s{i}")
        };
        let mut run = || -> TractResult<TVec<Tensor>> {
            let inputs = arrays
                .iter()
                .zip(&names)
                .map(|(at, n)| {
                    let at = at.with_context(|| format!("no array s{i}.{n}"))?;
                    reader.read(at, budget)
                })
                .collect::<TractResult<Vec<Tensor>>>()?;
            reference.run(&inputs)
        };
        match run().with_context(|| format!("Running sample {i} alone")) {
            Ok(outs) => {
                for (j, t) in outs.iter().enumerate() {
                    sink.add(&format!("s{i}_o{j}"), t)?;
                }
            }
            Err(e) if args.keep_going => failed.push((i, name, format!("{e:#}"))),
            Err(e) => return Err(e),
        }
    }
    commit_unless_all_failed(sink, failed.len(), total)?;
    if args.model.verbose {
        eprintln!("ran {total} samples alone in {:.1?}", started.elapsed());
    }
    if failed.is_empty() {
        return Ok(());
    }
    Err(SamplesFailed {
        failed,
        total,
        out: args.out.clone(),
    }
    .into())
}

/// The sample and the input an array `s{i}.{input}` of a model of several inputs holds.
fn per_sample_array(name: &str) -> Option<(usize, &str)> {
    let (i, input) = name.strip_prefix('s')?.split_once('.')?;
    Some((i.parse().ok()?, input))
}

/// The most bytes an input given once may take: it becomes a constant of the model.
const SHARED_BYTES: u64 = 256 << 20;

/// `run` for a model of several inputs (`tract_ragged::inputs`): the archive holds
/// `s{i}.{input}` for each sample `i` and each input given per sample, and
/// `shared.{input}` for each input given once. Read whole, within the memory for samples
/// and outputs; run in the scheduler's batches (`run`), or each sample alone
/// with `--one-by-one`; written as `s{i}_o{j}`.
fn run_several(
    args: &RunArgs,
    runnable: &RaggedRunnable,
    reader: &mut npz::NpzReader,
    budgets: &Budgets,
) -> TractResult<()> {
    use tract_ragged::transform::InputRole;
    let slots = runnable.input_slots()?;
    let given: Vec<&str> = slots
        .iter()
        .filter(|s| s.role != InputRole::Shared)
        .map(|s| s.name.as_str())
        .collect();
    let once: Vec<&str> = slots
        .iter()
        .filter(|s| s.role == InputRole::Shared)
        .map(|s| s.name.as_str())
        .collect();
    let expected = || {
        let mut names: Vec<String> = given.iter().map(|n| format!("s{{i}}.{n}")).collect();
        names.extend(once.iter().map(|n| format!("shared.{n}")));
        names.join(", ")
    };
    let mut samples: std::collections::BTreeMap<usize, Vec<Option<Tensor>>> = Default::default();
    let mut shared: Vec<Option<Tensor>> = vec![None; once.len()];
    let mut left = budgets.window;
    for ix in 0..reader.entries().len() {
        let name = reader.entries()[ix].name.clone();
        let tensor = reader.read(ix, left)?;
        left = left.saturating_sub((tensor.len() * tensor.datum_type().size_of()) as u64);
        if let Some(input) = name.strip_prefix("shared.") {
            let at = once.iter().position(|n| *n == input).with_context(|| {
                format!(
                    "array {name:?}: the model has no shared input {input:?} (expected {})",
                    expected()
                )
            })?;
            shared[at] = Some(tensor);
            continue;
        }
        let parsed = per_sample_array(&name);
        let Some((sample, input)) = parsed else {
            bail!(
                "array {name:?}: a model of several inputs reads {}",
                expected()
            );
        };
        let at = given.iter().position(|n| *n == input).with_context(|| {
            format!(
                "array {name:?}: the model takes no input {input:?} per sample (expected {})",
                expected()
            )
        })?;
        samples
            .entry(sample)
            .or_insert_with(|| vec![None; given.len()])[at] = Some(tensor);
    }
    let shared = shared
        .into_iter()
        .zip(&once)
        .map(|(t, n)| t.with_context(|| format!("no array shared.{n} for the shared input {n:?}")))
        .collect::<TractResult<Vec<Tensor>>>()?;
    ensure!(
        !samples.is_empty(),
        "{} holds no sample",
        args.samples.display()
    );
    let total = samples.len();
    // Each sample's failure its own with --keep-going (an input missing, refused, or its
    // run failing); otherwise the run's.
    let mut failed: Vec<(usize, String, String)> = vec![];
    let mut fail = |i: usize, e: TractError| -> TractResult<()> {
        ensure!(args.keep_going, e);
        failed.push((i, format!("s{i}"), format!("{e:#}")));
        Ok(())
    };
    let mut complete: Vec<(usize, TVec<Tensor>)> = vec![];
    for (i, inputs) in samples {
        let tensors = inputs
            .into_iter()
            .zip(&given)
            .map(|(t, n)| t.with_context(|| format!("sample {i} has no array s{i}.{n}")))
            .collect::<TractResult<TVec<Tensor>>>();
        match tensors {
            Ok(t) => complete.push((i, t)),
            Err(e) => fail(i, e)?,
        }
    }
    let (indices, samples): (Vec<usize>, Vec<TVec<Tensor>>) = complete.into_iter().unzip();
    fn with<'s>(samples: Samples<'s>, once: &[&str], shared: &'s [Tensor]) -> Samples<'s> {
        once.iter()
            .zip(shared)
            .fold(samples, |samples, (n, t)| samples.shared(*n, t))
    }
    let with_shared = |samples| with(samples, &once, &shared);
    let started = Instant::now();
    let outputs: Vec<TractResult<TVec<Tensor>>> = if samples.is_empty() {
        vec![]
    } else if args.one_by_one {
        samples
            .iter()
            .zip(&indices)
            .map(|(s, i)| {
                runnable
                    .run_one_by_one(with_shared(Samples::ordered(std::slice::from_ref(s))))
                    .and_then(|mut o| o.pop().context("no outputs"))
                    .with_context(|| format!("Running sample {i} alone"))
            })
            .collect()
    } else if args.keep_going {
        runnable.run_each(with_shared(Samples::ordered(&samples)))?
    } else {
        runnable
            .run(with_shared(Samples::ordered(&samples)))?
            .into_iter()
            .map(Ok)
            .collect()
    };
    let mut sink = create_sink(&args.out)?;
    for (i, outs) in indices.iter().zip(outputs) {
        match outs {
            Ok(outs) => {
                for (j, t) in outs.iter().enumerate() {
                    sink.add(&format!("s{i}_o{j}"), t)?;
                }
            }
            Err(e) => fail(*i, e)?,
        }
    }
    commit_unless_all_failed(sink, failed.len(), total)?;
    if args.model.verbose {
        eprintln!(
            "ran {} samples of {} inputs in {:.1?}",
            samples.len(),
            slots.len(),
            started.elapsed()
        );
    }
    if failed.is_empty() {
        return Ok(());
    }
    failed.sort();
    Err(SamplesFailed {
        failed,
        total,
        out: args.out.clone(),
    }
    .into())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert!(parse_size("12Q").is_err());
        for bad in ["-1G", "0", "nan", "inf", "-0.5M"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
