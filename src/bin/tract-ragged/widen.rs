//! `tract-ragged widen IN.onnx OUT.onnx`: the model with its int32 casts of shape-derived
//! values turned into int64 casts ([`tract_ragged::load::widen_shape_casts`]), for tools
//! that read ONNX with tract's own loader (tract's CLI among them), where those casts stop
//! the batch and the widths from staying symbolic (PP-OCR's exports cast shapes to int32).
//! Nothing else changes; the output is written atomically.

use std::path::PathBuf;

use clap::Args;
use prost::Message;
use tract_core::internal::*;

#[derive(Args, Debug)]
pub struct WidenArgs {
    /// The ONNX model to read.
    pub input: PathBuf,
    /// Where to write the widened model (replaced atomically).
    pub output: PathBuf,
}

pub fn widen(args: WidenArgs) -> TractResult<()> {
    let same =
        args.output.exists() && args.input.canonicalize().ok() == args.output.canonicalize().ok();
    ensure!(
        !same,
        "the output {} is the input: write the widened model elsewhere",
        args.output.display()
    );
    let mut proto = tract_onnx::onnx()
        .proto_model_for_path(&args.input)
        .with_context(|| format!("Reading ONNX model {}", args.input.display()))?;
    let widened = tract_ragged::load::widen_shape_casts(&mut proto);
    tract_ragged::npz::write_atomically(&args.output, &proto.encode_to_vec())?;
    match widened.len() {
        0 => println!(
            "no int32 cast of a shape to widen: {} is the model as it was",
            args.output.display()
        ),
        n => println!(
            "{n} int32 cast(s) of shapes widened to int64 ({}): {}",
            widened.join(", "),
            args.output.display()
        ),
    }
    Ok(())
}
