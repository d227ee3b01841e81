//! `tract-ragged run`: samples from an .npz archive through the model, outputs to another.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use tract_core::internal::*;
use tract_ragged::backend::{Backend, HostBackend};
use tract_ragged::npz;
use tract_ragged::schedule::Schedule;

use crate::ModelArgs;

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
    /// Memory a batch may take: bytes, or with a K, M or G suffix (default: 80% of the
    /// device's free memory on cuda, of the available RAM on cpu).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub memory: Option<u64>,
    /// Run each sample alone through the original model (the reference), no batching.
    #[arg(long)]
    pub one_by_one: bool,
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

pub fn run(args: RunArgs) -> TractResult<()> {
    ensure!(
        !same_file(&args.samples, &args.out),
        "--out {} is the samples' file: the outputs would replace the inputs",
        args.out.display()
    );
    let limit = args.memory.unwrap_or_else(|| HostBackend.memory_budget());
    let samples: Vec<Tensor> = npz::read_samples(&args.samples, limit)?
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    ensure!(
        !samples.is_empty(),
        "{} holds no sample",
        args.samples.display()
    );
    let runnable = crate::prepare(&args.model)?;
    let started = Instant::now();
    let outputs = if args.one_by_one {
        runnable.run_one_by_one(&samples)?
    } else {
        let mut schedule = Schedule::for_runnable(&runnable);
        schedule.max_batch = args.batch;
        if let Some(memory) = args.memory {
            schedule.budget = memory;
        }
        if args.model.verbose {
            let axis = runnable.sample_fact().axis;
            let widths: Vec<usize> = samples.iter().map(|s| s.shape()[axis]).collect();
            let plan = schedule.plan(&runnable, &widths)?;
            eprintln!(
                "schedule: {} samples in {} batches, memory budget {} MiB",
                samples.len(),
                plan.len(),
                schedule.budget >> 20
            );
            for (ix, b) in plan.iter().enumerate() {
                eprintln!(
                    "  batch {ix}: {} samples, padded width {}, padding {:.0}%, peak memory {} MiB",
                    b.samples.len(),
                    b.padded,
                    100.0 * b.waste(&widths),
                    b.peak_memory >> 20
                );
            }
        }
        let bar = (std::io::stderr().is_terminal() && samples.len() >= 64).then(|| {
            let bar = indicatif::ProgressBar::new(samples.len() as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:40} {pos}/{len} samples {per_sec} {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        });
        let outputs = runnable.run_many_with(&samples, &schedule, |done| {
            if let Some(bar) = &bar {
                bar.set_position(done as u64);
            }
        })?;
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        outputs
    };
    if args.model.verbose {
        eprintln!("ran {} samples in {:.1?}", samples.len(), started.elapsed());
    }
    let named = outputs.iter().enumerate().flat_map(|(i, outs)| {
        outs.iter()
            .enumerate()
            .map(move |(j, t)| (format!("s{i}_o{j}"), t))
    });
    npz::write_arrays(&args.out, named)
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
