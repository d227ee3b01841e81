//! `tract-ragged profile`: per-node timings of one ragged batch.

use tract_core::internal::*;

use tract_ragged::backend::{Backend, HostBackend};

use crate::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The widths of the samples of the batch, comma-separated: 120,320,77; WxK for K
    /// samples of width W: 320x32. With two ragged axes, HxW and HxWxK: 640x480x4.
    #[arg(long, value_delimiter = ',', required = true)]
    pub widths: Vec<String>,
    /// Timed runs, after one warm-up run.
    #[arg(long, default_value_t = 5, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub runs: usize,
}

/// Random samples of `widths`, shaped as the model's input says, if they fit in `budget`
/// bytes.
pub fn random_samples(
    runnable: &tract_ragged::RaggedRunnable,
    widths: &[TVec<usize>],
    budget: u64,
) -> TractResult<Vec<Tensor>> {
    let fact = runnable.sample_fact();
    let shapes = widths
        .iter()
        .map(|w| {
            fact.dims
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
                .collect::<TractResult<TVec<usize>>>()
        })
        .collect::<TractResult<Vec<_>>>()?;
    let bytes = shapes
        .iter()
        .try_fold(0u64, |sum, shape| {
            shape
                .iter()
                .try_fold(fact.datum_type.size_of() as u64, |b, d| {
                    b.checked_mul(*d as u64)
                })
                .and_then(|b| sum.checked_add(b))
        })
        .unwrap_or(u64::MAX);
    ensure!(
        bytes <= budget,
        "{} samples of these widths take {bytes} bytes, above the {budget} bytes of memory \
         available for them",
        widths.len()
    );
    let mut seed = 0x9e3779b97f4a7c15u64;
    shapes
        .into_iter()
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
/// count (`640x480`, `640x480x4`).
pub fn parse_widths(items: &[String], axes: usize) -> TractResult<Vec<TVec<usize>>> {
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
        widths.extend(std::iter::repeat_n(TVec::from(&numbers[..axes]), k));
    }
    ensure!(!widths.is_empty(), "no width given");
    Ok(widths)
}

pub fn profile(args: ProfileArgs) -> TractResult<()> {
    let runnable = crate::prepare(&args.model)?;
    let widths = parse_widths(&args.widths, runnable.sample_fact().axes.len())?;
    let samples = random_samples(&runnable, &widths, HostBackend.memory_budget())?;
    let (plan, inputs) = runnable.prepared(&samples)?;
    let profile = tract_ragged::profile::profile(&**runnable.backend(), &plan, inputs, args.runs)?;
    println!(
        "{} on {}: a ragged batch of {} samples, widths {}, padded to {}\n",
        args.model.model.display(),
        runnable.runtime().name(),
        samples.len(),
        args.widths.join(","),
        {
            let maxima: Vec<usize> = (0..runnable.sample_fact().axes.len())
                .map(|a| widths.iter().map(|w| w[a]).max().unwrap_or(1))
                .collect();
            let padded: Vec<String> = runnable
                .padded_extents(&maxima)
                .iter()
                .map(|e| e.to_string())
                .collect();
            padded.join("x")
        }
    );
    println!("{profile}");
    Ok(())
}
