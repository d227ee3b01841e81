//! tract-ragged from the `tract` crate's public API: load PP-OCRv4 rec, apply the
//! registered `ragged` transform, prepare it on `ragged-cuda` (or the CPU when there is no
//! CUDA device), run one batch of three lines of different widths, crop each line's
//! probabilities to its width.
//!
//!     scripts/fetch-assets.sh && cargo run --release --example tract_api

use tract::prelude::*;
// Linking tract-ragged registers the `ragged` transform and the `ragged-cuda` runtime.
use tract_ragged as _;

fn main() -> anyhow::Result<()> {
    let path = "assets/ppocr/ch_PP-OCRv4_rec_infer.onnx";
    // PaddlePaddle's export casts shape values to int32, which stops tract from typing the
    // model with a symbolic width: tract-ragged widens those casts in the bytes tract reads.
    let bytes = tract_ragged::load::widened_onnx_bytes(path)?;
    let mut model = onnx()?.load_buffer(&bytes)?;
    model.set_input_fact(0, "N,3,48,W,f32")?;
    let mut model = model.into_model()?;
    model.transform(r#"{"name":"ragged","input":"x","axis":3}"#)?;

    let runtime = runtime_for_name("ragged-cuda").or_else(|_| runtime_for_name("cpu"))?;
    let runnable = runtime.prepare(model)?;

    // Three lines (here flat grey ones), widths 320, 96 and 200, packed into one batch
    // padded to 320. The widths go in as the last input, one i64 per sample.
    let widths = [320usize, 96, 200];
    let padded = 320;
    let mut data = vec![0f32; widths.len() * 3 * 48 * padded];
    for (sample, w) in widths.iter().enumerate() {
        for c in 0..3 {
            for y in 0..48 {
                let row = ((sample * 3 + c) * 48 + y) * padded;
                data[row..row + w].fill(0.5);
            }
        }
    }
    let batch = Tensor::from_slice(&[widths.len(), 3, 48, padded], &data)?;
    let widths_input = Tensor::from_slice(&[widths.len()], &widths.map(|w| w as i64))?;
    let outputs = runnable.run([batch, widths_input])?;

    // Output 0: probabilities [N, T, 6625], padded region zero; output 1: each line's T.
    let probs = &outputs[0];
    let out_widths: Vec<i64> = outputs[1].as_slice::<i64>()?.to_vec();
    let shape = probs.shape()?.to_vec();
    let values = probs.as_slice::<f32>()?;
    for (sample, t) in out_widths.iter().enumerate() {
        let line = &values[sample * shape[1] * shape[2]..][..*t as usize * shape[2]];
        let best: Vec<usize> = line
            .chunks(shape[2])
            .map(|column| {
                column
                    .iter()
                    .enumerate()
                    .fold(
                        (0, f32::MIN),
                        |b, (i, p)| if *p > b.1 { (i, *p) } else { b },
                    )
                    .0
            })
            .collect();
        println!(
            "line {sample}: width {} -> {t} columns, best classes {:?}...",
            widths[sample],
            &best[..best.len().min(6)]
        );
    }
    println!("ran on {}", runtime.name()?);
    Ok(())
}
