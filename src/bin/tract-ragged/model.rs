//! The model a command names: the arguments every subcommand running one takes
//! ([`ModelArgs`]), and how it is loaded, transformed and prepared from them (the
//! library's `options::read`, `load::ragged_model`, `RaggedModel::prepare`), or read as
//! the reference. Subcommands go from here to the library, never back to `main`.

use std::path::PathBuf;

use tract_core::internal::*;
use tract_ragged::{Device, RaggedSpec};

/// What every subcommand running a model takes.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// The ONNX model.
    pub model: PathBuf,
    /// The ragged input and its ragged axis, INPUT:AXIS (an input name, or #index).
    #[arg(long, value_name = "INPUT:AXIS")]
    pub ragged: RaggedSpec,
    /// The ragged input's fact in tract's syntax, symbols for the batch and the width:
    /// N,3,48,W,f32 (for the model's first input). NAME=FACT sets another input's, by
    /// name (a state's N,64,f32); repeatable.
    #[arg(long, value_name = "[NAME=]FACT")]
    pub input_fact: Vec<String>,
    /// cpu (tract's default runtime) or cuda (the ragged-cuda runtime).
    #[arg(long, default_value = "cpu")]
    pub runtime: Device,
    /// Say how the model was prepared and how each batch ran, on stderr.
    #[arg(long, short)]
    pub verbose: bool,
    /// Reduce every output to its K largest values and their positions along its last
    /// axis (its classes; K=1: the argmax), where it is computed (on the device with
    /// cuda): output j becomes outputs 2j (values) and 2j+1 (positions, i64).
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    pub top_k: Option<u32>,
    /// f32 (exact, the default), tf32 (cuda only: convolutions and 1x1 GEMMs on tensor
    /// cores) or f16 (the model in half precision, samples and outputs in f32): faster, no
    /// longer exact; `bench` reports the accuracy against f32.
    #[arg(long, default_value = "f32")]
    pub precision: tract_ragged::precision::Precision,
}

impl ModelArgs {
    /// The library's options for what these arguments say, with the inputs named in
    /// `folded` folded to those values before the model is typed (`run`'s
    /// `shared.{input}` arrays).
    pub fn options(&self, folded: &[(String, Tensor)]) -> tract_ragged::Options {
        let mut options = tract_ragged::Options::default()
            .device(self.runtime)
            .precision(self.precision);
        options.input_facts = self.input_fact.clone();
        options.folded = folded.to_vec();
        options.top_k = self.top_k.map(|k| k as usize);
        options
    }
}

/// Loads and prepares a model as the arguments say.
pub fn prepare(args: &ModelArgs) -> TractResult<tract_ragged::RaggedRunnable> {
    prepare_with(args, &[])
}

/// [`prepare`], with the inputs named in `values` folded to those values before the model
/// is typed ([`ModelArgs::options`]).
pub fn prepare_with(
    args: &ModelArgs,
    values: &[(String, Tensor)],
) -> TractResult<tract_ragged::RaggedRunnable> {
    prepare_options(args, &args.options(values))
}

/// Loads the model the arguments name and prepares it with `options`.
pub fn prepare_options(
    args: &ModelArgs,
    options: &tract_ragged::Options,
) -> TractResult<tract_ragged::RaggedRunnable> {
    let started = std::time::Instant::now();
    let onnx = tract_ragged::options::read(&args.model, options)?;
    tract_ragged::options::check_given_facts(&onnx.model, &args.ragged, &options.input_facts)?;
    if args.verbose && !onnx.widened_casts.is_empty() {
        eprintln!(
            "loader: int32 shape casts widened to int64: {}",
            onnx.widened_casts.join(", ")
        );
    }
    let model = tract_ragged::load::ragged_model(onnx, args.ragged.clone())
        .with_context(|| format!("Preparing {}", args.model.display()))?;
    if args.verbose {
        describe(&model, started.elapsed());
    }
    model.prepare(options)
}

/// The reference of the model the arguments name (`tract_ragged::Reference`: each sample
/// alone, plain tract at its shape), with the inputs named in `values` folded as
/// [`prepare_with`] folds them.
pub fn reference_with(
    args: &ModelArgs,
    values: &[(String, Tensor)],
) -> TractResult<tract_ragged::Reference> {
    let options = args.options(values);
    let onnx = tract_ragged::options::read(&args.model, &options)?;
    let ragged = args.ragged.input.resolve(&onnx.model)?;
    tract_ragged::Reference::new(onnx.model, ragged, args.runtime.runtime()?)
}

/// How the model was typed and transformed, on stderr (`--verbose`).
fn describe(model: &tract_ragged::RaggedModel, took: std::time::Duration) {
    let fact = &model.input_fact;
    eprintln!(
        "model: input {fact:?}, {}; {} width functions; transformed in {took:.0?}",
        if model.is_symbolic() {
            "typed once with a symbolic batch and width, plans set them per (batch size, padded-width bucket)"
        } else {
            "tract could not type it with a symbolic batch and width: typed and transformed per (batch size, padded-width bucket)"
        },
        model
            .ragged
            .model
            .nodes()
            .iter()
            .find_map(|n| n.op_as::<tract_ragged::ops::WidthTable>())
            .map(|t| t.fns.len())
            .unwrap_or(0),
    );
}
