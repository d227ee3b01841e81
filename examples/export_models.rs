//! Writes the test suite's random models and samples as files, for checking
//! `tract-ragged run` against another engine (scripts/ort_models.sh runs ONNX Runtime).
//!
//!     cargo run --example export_models -- OUT_DIR [COUNT]
//!
//! `OUT_DIR/models/NNN/` gets `model.onnx` (ragged input `x`, axis 3), `samples.npz` (five
//! samples of different widths) and `fact` (the input fact for `--input-fact`); the models
//! cycle through the op families of tests/exactness.rs: conv stacks (odd pads, strides,
//! dilations, depthwise, SAME), pools (ceil mode, counted padding, global pools and
//! squeeze-excitation), reductions and softmax over the width, attention over the width.
//! `OUT_DIR/lines/samples.npz` holds the PP-OCR fixture lines (fixtures/lines).

#[path = "../tests/common/mod.rs"]
mod common;

use common::models::{attention_model, conv_layer, conv_stack, pool, pool_model, reduce_model};
use common::onnx::Rng;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use prost::Message;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let out = std::path::PathBuf::from(
        args.next()
            .ok_or_else(|| anyhow::anyhow!("usage: export_models OUT_DIR [COUNT]"))?,
    );
    let count: usize = args.next().map(|c| c.parse()).transpose()?.unwrap_or(80);

    // Fixed seeds: the same models on every machine, so a failure can be replayed.
    let mut runner = TestRunner::deterministic();
    let mut rng = Rng(12345);
    for i in 0..count {
        let c = 1 + i % 3;
        let family = i % 4;
        let variant = i / 4;
        let (model, h) = match family {
            0 => {
                let layers = proptest::collection::vec(conv_layer(), 1..=3)
                    .new_tree(&mut runner)
                    .map_err(|e| anyhow::anyhow!(e))?
                    .current();
                (conv_stack(&mut rng, c, &layers).0, 1 + variant % 3)
            }
            1 => {
                let p = pool()
                    .new_tree(&mut runner)
                    .map_err(|e| anyhow::anyhow!(e))?
                    .current();
                (pool_model(&mut rng, c, &p), 2)
            }
            2 => (reduce_model(&mut rng, c, (variant % 6) as u8), 2),
            _ => (attention_model(&mut rng, c, 1 + variant % 2), 1),
        };
        let dir = out.join("models").join(format!("{i:03}"));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("model.onnx"), model.encode_to_vec())?;
        std::fs::write(dir.join("fact"), format!("N,{c},{h},W,f32"))?;
        // Widths 20..60, different within the batch.
        let widths: Vec<usize> = (0..5).map(|k| 20 + (i * 7 + k * 13) % 41).collect();
        let samples = common::samples(&mut rng, &[c, h, 1], 2, &widths);
        tract_ragged::npz::write_arrays(
            dir.join("samples.npz"),
            samples
                .iter()
                .enumerate()
                .map(|(k, t)| (format!("x{k}"), t)),
        )?;
    }

    let lines = tract_ragged::ocr::load_lines("fixtures/lines")?;
    std::fs::create_dir_all(out.join("lines"))?;
    tract_ragged::npz::write_arrays(
        out.join("lines").join("samples.npz"),
        lines.iter().map(|(name, t)| (name.clone(), t)),
    )?;
    println!(
        "{count} models and {} lines written to {}",
        lines.len(),
        out.display()
    );
    Ok(())
}
