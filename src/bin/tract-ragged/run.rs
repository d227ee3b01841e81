//! `tract-ragged run`: samples from an .npz archive through the model, outputs to another.

use std::path::PathBuf;
use std::time::Instant;

use tract_core::internal::*;
use tract_ragged::npz;

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
    /// How many samples per batch.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub batch: usize,
    /// Run each sample alone through the original model (the reference), no batching.
    #[arg(long)]
    pub one_by_one: bool,
}

pub fn run(args: RunArgs) -> TractResult<()> {
    ensure!(args.batch >= 1, "--batch must be at least 1");
    let samples: Vec<Tensor> = npz::read_samples(&args.samples)?
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
        let mut outputs = Vec::with_capacity(samples.len());
        for (ix, chunk) in samples.chunks(args.batch).enumerate() {
            let (out, info) = runnable.run_batch_with_info(chunk).with_context(|| {
                format!(
                    "Batch {ix} (samples {} to {})",
                    ix * args.batch,
                    ix * args.batch + chunk.len() - 1
                )
            })?;
            if args.model.verbose {
                eprintln!(
                    "batch {ix}: {} samples, padded width {} ({}){}",
                    info.samples,
                    info.padded_width,
                    info.plan,
                    if info.prepared { ", plan prepared" } else { "" }
                );
            }
            outputs.extend(out);
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
