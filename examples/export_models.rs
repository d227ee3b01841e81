//! Writes the test suite's random models and samples as files, for checking
//! `tract-ragged run` against another engine (scripts/ort_models.sh runs ONNX Runtime).
//!
//!     cargo run --example export_models -- OUT_DIR [COUNT] [RECURRENT]
//!
//! `OUT_DIR/models/NNN/` gets `model.onnx` (ragged input `x`, axis 3), `samples.npz` (five
//! samples of different widths) and `fact` (the input fact for `--input-fact`); the models
//! cycle through the op families of tests/it/exactness.rs: conv stacks (odd pads, strides,
//! dilations, depthwise, SAME), pools (ceil mode, counted padding, global pools and
//! squeeze-excitation), reductions and softmax over the width, attention over the width.
//! Then `RECURRENT` CRNNs (tests/it/recurrences.rs: LSTM, GRU, RNN layers in every direction
//! and layout, initial states, clipping, other activations), `batch_axes` telling where
//! the batch lies in each output of ONNX Runtime's reference (`reference.onnx`, the same
//! model in layout 0, for a model in layout 1, which ONNX Runtime does not run).
//! `OUT_DIR/lines/samples.npz` holds the PP-OCR fixture lines (fixtures/lines).

#[path = "../tests/common/mod.rs"]
mod common;

use common::crnn::{crnn, rnn};
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
    let recurrent: usize = args.next().map(|c| c.parse()).transpose()?.unwrap_or(0);

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
        write_samples(&dir, &common::samples(&mut rng, &[c, h, 1], 2, &widths))?;
    }

    for i in count..count + recurrent {
        let r = rnn()
            .new_tree(&mut runner)
            .map_err(|e| anyhow::anyhow!(e))?
            .current();
        let dir = out.join("models").join(format!("{i:03}"));
        std::fs::create_dir_all(&dir)?;
        if r.batch_first {
            // ONNX Runtime runs recurrences of layout 0 only: its reference is the same
            // model (same weights) in layout 0, whose outputs are the same once each
            // sample's batch axis is taken out.
            let sequence_first = common::crnn::Rnn {
                batch_first: false,
                ..r.clone()
            };
            let reference = crnn(&mut rng.clone(), 2, 3, 5, &sequence_first);
            std::fs::write(dir.join("reference.onnx"), reference.encode_to_vec())?;
        }
        let model = crnn(&mut rng, 2, 3, 5, &r);
        std::fs::write(dir.join("model.onnx"), model.encode_to_vec())?;
        std::fs::write(dir.join("fact"), "N,2,3,W,f32")?;
        // In ONNX Runtime's outputs: the probabilities are batch first, Y_h of layout 0
        // holds the batch at 1.
        std::fs::write(dir.join("batch_axes"), "0,1")?;
        let widths: Vec<usize> = (0..5).map(|k| 1 + (i * 7 + k * 13) % 40).collect();
        write_samples(&dir, &common::samples(&mut rng, &[2, 3, 1], 2, &widths))?;
    }

    let lines = tract_ragged::ocr::load_lines("fixtures/lines")?;
    std::fs::create_dir_all(out.join("lines"))?;
    tract_ragged::npz::write_arrays(
        out.join("lines").join("samples.npz"),
        lines.iter().map(|(name, t)| (name.clone(), t)),
    )?;
    println!(
        "{} models and {} lines written to {}",
        count + recurrent,
        lines.len(),
        out.display()
    );
    Ok(())
}

/// `samples` as `dir/samples.npz`, named `x0`, `x1`...
fn write_samples(
    dir: &std::path::Path,
    samples: &[tract_core::prelude::Tensor],
) -> anyhow::Result<()> {
    tract_ragged::npz::write_arrays(
        dir.join("samples.npz"),
        samples
            .iter()
            .enumerate()
            .map(|(k, t)| (format!("x{k}"), t)),
    )?;
    Ok(())
}
