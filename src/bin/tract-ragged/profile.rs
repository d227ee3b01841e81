//! `tract-ragged profile`: per-node timings of one ragged batch, of random samples of
//! given widths or of an archive's samples; printed as our roofline table (default), as
//! tract's CLI prints a profiled dump (`--format tract`, tract-libcli's tables), or as
//! tract-libcli's JSON export (`--format json`), `--cost` adding each node's cost.

use std::path::PathBuf;

use tract_core::internal::*;
use tract_libcli::display_params::DisplayParams;

use tract_ragged::backend::{Backend, HostBackend};

use crate::model::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The widths of the samples of the batch, comma-separated: 120,320,77; WxK for K
    /// samples of width W: 320x32. With two ragged axes, HxW and HxWxK: 640x480x4.
    /// Random samples of those widths make the batch.
    #[arg(
        long,
        value_delimiter = ',',
        required_unless_present = "samples",
        conflicts_with = "samples"
    )]
    pub widths: Vec<String>,
    /// The batch: every array of this .npz archive, in order, a sample each (without the
    /// batch axis), for a model of one input.
    #[arg(long)]
    pub samples: Option<PathBuf>,
    /// How to print: our table with each node's rates against the machine's peaks, tract
    /// CLI's profiled dump, or tract-libcli's JSON export.
    #[arg(long, value_enum, default_value_t = Format::Roofline)]
    pub format: Format,
    /// The same as `--format json`, as tract's `dump --json`.
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
    /// Each node's cost as its op counts it (tract's `cost()`), in the tract and JSON
    /// formats (the roofline table always uses it).
    #[arg(long)]
    pub cost: bool,
    /// Timed runs, after one warm-up run.
    #[arg(long, default_value_t = 5, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub runs: usize,
    /// Threads of tract's executor for the batch (the CPU runtime: what a batch gets when
    /// the lanes lend it their cores; tract's products and our host ops split their work
    /// over them). 1: the batch on its lane's thread alone.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub threads: usize,
}

/// How `profile` prints.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Roofline,
    Tract,
    Json,
}

/// Random samples of `widths` (each width with its count), shaped as the model's input
/// says, if they fit in `budget` bytes: checked before anything is allocated, since a count
/// comes from the command line.
pub fn random_samples(
    runnable: &tract_ragged::RaggedRunnable,
    widths: &[(TVec<usize>, usize)],
    budget: u64,
) -> TractResult<Vec<Tensor>> {
    let fact = runnable.sample_fact();
    let shapes = widths
        .iter()
        .map(|(w, count)| {
            let shape = fact
                .dims
                .iter()
                .enumerate()
                .map(
                    |(axis, d)| match fact.axes.iter().position(|a| *a == axis) {
                        Some(k) => Ok(w[k]),
                        None => match d {
                            Some(d) => Ok(*d),
                            None => bail!(
                                "axis {} of the input is not fixed: give it in --input-fact",
                                axis + 1
                            ),
                        },
                    },
                )
                .collect::<TractResult<TVec<usize>>>()?;
            Ok((shape, *count))
        })
        .collect::<TractResult<Vec<_>>>()?;
    let count = widths
        .iter()
        .try_fold(0usize, |sum, (_, k)| sum.checked_add(*k))
        .unwrap_or(usize::MAX);
    let bytes = shapes
        .iter()
        .try_fold(0u64, |sum, (shape, k)| {
            shape
                .iter()
                .try_fold(fact.datum_type.size_of() as u64, |b, d| {
                    b.checked_mul(*d as u64)
                })
                .and_then(|b| b.checked_mul(*k as u64))
                .and_then(|b| sum.checked_add(b))
        })
        .unwrap_or(u64::MAX);
    ensure!(
        bytes <= budget,
        "{count} samples of these widths take {bytes} bytes, above the {budget} bytes of memory \
         available for them"
    );
    let mut seed = 0x9e3779b97f4a7c15u64;
    shapes
        .into_iter()
        .flat_map(|(shape, k)| std::iter::repeat_n(shape, k))
        .map(|shape| {
            let values: Vec<f32> = (0..shape.iter().product())
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
                })
                .collect();
            Ok(Tensor::from_shape(&shape, &values)?
                .cast_to_dt(fact.datum_type)?
                .into_owned())
        })
        .collect()
}

/// `320,77` and `320x32` alike; with `axes` ragged axes, `axes` widths then an optional
/// count (`640x480`, `640x480x4`). Each width comes with its count, not repeated: a count
/// is the user's and can be huge.
pub fn parse_widths(items: &[String], axes: usize) -> TractResult<Vec<(TVec<usize>, usize)>> {
    let mut widths = vec![];
    for item in items {
        let numbers = item
            .split('x')
            .map(|v| v.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("bad width {item:?}"))?;
        ensure!(
            numbers.len() == axes || numbers.len() == axes + 1,
            "bad width {item:?}: {axes} width(s) then an optional count expected"
        );
        let k = numbers.get(axes).copied().unwrap_or(1);
        ensure!(
            numbers.iter().all(|v| *v >= 1),
            "bad width {item:?}: widths and counts start at 1"
        );
        widths.push((TVec::from(&numbers[..axes]), k));
    }
    ensure!(!widths.is_empty(), "no width given");
    Ok(widths)
}

/// Refuses a batch of `n` samples of at most `maxima` wide whose plan's tensors would not
/// fit `budget` bytes: profiling it would fail in the allocator, or abort.
fn check_batch(
    runnable: &tract_ragged::RaggedRunnable,
    n: usize,
    maxima: &[usize],
    budget: u64,
) -> TractResult<()> {
    let padded = runnable.padded_extents(maxima);
    let peak = runnable.peak_memory(n, &padded)?;
    ensure!(
        peak <= budget,
        tract_ragged::error::OutOfMemory {
            what: format!(
                "a batch of {n} samples padded to {} needs {peak} bytes, above the budget of \
                 {budget} bytes",
                tract_ragged::spec::extents_string(&padded)
            )
        }
    );
    Ok(())
}

pub fn profile(args: ProfileArgs) -> TractResult<()> {
    let runnable = crate::model::prepare(&args.model)?;
    let axes = runnable.sample_fact().axes.len();
    let budget = HostBackend.memory_budget();
    let samples = match &args.samples {
        Some(path) => {
            ensure!(
                runnable.model().ragged.roles.len() == 1,
                "--samples profiles models of one input; give --widths for this one"
            );
            let samples: Vec<Tensor> = tract_ragged::npz::read_samples(path, budget)?
                .into_iter()
                .map(|(_, t)| t)
                .collect();
            ensure!(!samples.is_empty(), "{} holds no sample", path.display());
            samples
        }
        None => {
            // The batch's own memory, from the widths alone, before any sample is made.
            let widths = parse_widths(&args.widths, axes)?;
            let count = widths
                .iter()
                .try_fold(0usize, |sum, (_, k)| sum.checked_add(*k))
                .context("too many samples")?;
            let maxima: Vec<usize> = (0..axes)
                .map(|a| widths.iter().map(|(w, _)| w[a]).max().unwrap_or(1))
                .collect();
            check_batch(&runnable, count, &maxima, budget)?;
            random_samples(&runnable, &widths, budget)?
        }
    };
    let widths: Vec<TVec<usize>> = samples
        .iter()
        .map(|s| runnable.sample_fact().widths_of(s))
        .collect();
    let maxima: Vec<usize> = (0..axes)
        .map(|a| widths.iter().map(|w| w[a]).max().unwrap_or(1))
        .collect();
    check_batch(&runnable, samples.len(), &maxima, budget)?;
    let (plan, inputs) = runnable.prepared(&samples)?;
    let backend = runnable.backend();
    let mut profiled = None;
    backend.with_threads(args.threads, &mut || {
        profiled = Some(tract_ragged::profile::profile(
            &**backend,
            &plan,
            inputs.clone(),
            args.runs,
        ))
    });
    let profile = profiled.context("the profile did not run")??;
    let padded = runnable.padded_extents(&maxima);
    let peak = runnable.peak_memory(samples.len(), &padded)?;
    let header = format!(
        "{} on {}: a ragged batch of {} samples, widths {}, padded to {}; peak memory of \
         the plan's tensors {:.1} MiB",
        args.model.model.display(),
        runnable.runtime().name(),
        samples.len(),
        widths
            .iter()
            .map(|w| tract_ragged::spec::extents_string(w))
            .collect::<Vec<_>>()
            .join(","),
        tract_ragged::spec::extents_string(&padded),
        peak as f64 / (1 << 20) as f64,
    ) + &profile
        .arena_bytes
        .map(|b| format!(", its device arena {:.1} MiB", b as f64 / (1 << 20) as f64))
        .unwrap_or_default();
    let format = if args.json { Format::Json } else { args.format };
    match format {
        Format::Roofline => {
            println!("{header}\n");
            println!("{profile}");
        }
        Format::Tract | Format::Json => {
            let model = plan
                .typed_plan()
                .context("--format tract and json need a plan in one piece (not in segments)")?
                .model();
            let annotations = tract_ragged::profile::annotations(model, &profile, args.cost)?;
            if format == Format::Json {
                let json = tract_libcli::export::GraphPerfInfo::from(model, &annotations);
                println!("{}", serde_json::to_string_pretty(&json)?);
            } else {
                println!("{header}\n");
                let display = DisplayParams {
                    profile: true,
                    cost: args.cost,
                    summary: true,
                    left_column_width: 20,
                    ..DisplayParams::default()
                };
                tract_libcli::terminal::render(model, &annotations, &display)?;
                tract_libcli::terminal::render_summaries(model, &annotations, &display)?;
            }
        }
    }
    Ok(())
}
