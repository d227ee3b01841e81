//! What the integration tests share: small ONNX models built in code, and the check at
//! the heart of the contract, a ragged batch against each sample run alone.

#![allow(dead_code)]

pub mod crnn;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod models;
pub mod onnx;
pub mod pages;

use onnx::Rng;
use tract_onnx::pb;
use tract_ragged::prelude::*;

/// A model built in code, typed through the same loader as a user's file.
pub fn typed(proto: &pb::ModelProto, fact: &str) -> TractResult<TypedModel> {
    tract_ragged::load::from_proto(proto.clone(), None, Some(fact))?.into_typed()
}

/// Plain tract on one `sample` of `proto`'s only input: tract-onnx's own loader, typed at
/// the sample's shape with a batch axis of one in front, optimised; output 0 as it comes.
pub fn plain_tract(proto: &pb::ModelProto, sample: &Tensor) -> TractResult<Tensor> {
    use tract_onnx::prelude::InferenceModelExt;
    let mut batch = sample.clone();
    batch.insert_axis(0)?;
    let model = tract_onnx::onnx()
        .model_for_proto_model(proto)?
        .with_input_fact(0, f32::fact(batch.shape()).into())?
        .into_optimized()?
        .into_runnable()?;
    Ok(model
        .run(tvec!(batch.into_tvalue()))?
        .remove(0)
        .into_tensor())
}

/// The runnable for `proto` with `fact`, ragged along axis `axis` of its input.
pub fn runnable(proto: &pb::ModelProto, fact: &str, axis: usize) -> TractResult<RaggedRunnable> {
    RaggedModel::new(typed(proto, fact)?, RaggedSpec::new(0, axis))?.into_runnable()
}

/// Random samples `[dims..]` with `widths` along `axis` (of the sample).
pub fn samples(rng: &mut Rng, dims: &[usize], axis: usize, widths: &[usize]) -> Vec<Tensor> {
    widths
        .iter()
        .map(|&w| {
            let mut shape = dims.to_vec();
            shape[axis] = w;
            let len = shape.iter().product();
            Tensor::from_shape(&shape, &rng.vec(len, 1.0)).unwrap()
        })
        .collect()
}

/// Both tensors' values as f32, in order; their shapes must be equal.
fn values(found: &Tensor, expected: &Tensor) -> (Vec<f32>, Vec<f32>) {
    assert_eq!(found.shape(), expected.shape(), "shapes differ");
    let f32s = |t: &Tensor| {
        t.cast_to::<f32>()
            .unwrap()
            .to_plain_array_view::<f32>()
            .unwrap()
            .iter()
            .copied()
            .collect::<Vec<f32>>()
    };
    (f32s(found), f32s(expected))
}

fn largest_difference(f: &[f32], e: &[f32]) -> f32 {
    f.iter()
        .zip(e)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max)
}

/// The largest absolute difference.
pub fn max_abs(found: &Tensor, expected: &Tensor) -> f32 {
    let (f, e) = values(found, expected);
    largest_difference(&f, &e)
}

/// The largest absolute difference, relative to the reference's magnitude.
pub fn rel_diff(found: &Tensor, expected: &Tensor) -> f32 {
    let (f, e) = values(found, expected);
    let scale = e.iter().fold(1f32, |m, x| m.max(x.abs()));
    largest_difference(&f, &e) / scale
}

/// The norm-wise relative error ‖found − expected‖ / ‖expected‖.
pub fn norm_rel(found: &Tensor, expected: &Tensor) -> f32 {
    let (f, e) = values(found, expected);
    let diff: f64 = f
        .iter()
        .zip(&e)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum::<f64>()
        .sqrt();
    let norm: f64 = e.iter().map(|b| (*b as f64).powi(2)).sum::<f64>().sqrt();
    (diff / norm.max(1e-30)) as f32
}

/// How many values differ in their bits (two NaNs count as equal).
pub fn differing_bits(found: &Tensor, expected: &Tensor) -> usize {
    let (f, e) = values(found, expected);
    f.iter()
        .zip(&e)
        .filter(|(a, b)| a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan()))
        .count()
}

/// The contract, checked: the ragged batch gives each sample what it gets alone, within
/// `tol` relative to the output's magnitude.
///
/// A sample too narrow for the model (its width falls below one at some conv) is refused:
/// a batch holding it must fail naming it, and it is left out of the comparison. (Alone,
/// tract saturates such a width to zero and runs on empty tensors; ONNX Runtime refuses.)
pub fn assert_exact(runnable: &RaggedRunnable, samples: &[Tensor], tol: f32) -> TractResult<()> {
    let (valid, narrow): (Vec<&Tensor>, Vec<(usize, &Tensor)>) = {
        let mut valid = vec![];
        let mut narrow = vec![];
        for (ix, s) in samples.iter().enumerate() {
            match fits(runnable, s) {
                Ok(_) => valid.push(s),
                Err(_) => narrow.push((ix, s)),
            }
        }
        (valid, narrow)
    };
    if let Some((ix, _)) = narrow.first() {
        let err = runnable.run_batch(samples).err().map(|e| format!("{e:#}"));
        let err = err.unwrap_or_else(|| panic!("sample {ix} is too narrow but the batch ran"));
        assert!(
            err.contains("too narrow") && err.contains("sample"),
            "unclear error: {err}"
        );
    }
    if valid.is_empty() {
        return Ok(());
    }
    let alone: Vec<TVec<Tensor>> = valid
        .iter()
        .map(|s| runnable.run_one_by_one(&[*s]).map(|mut v| v.remove(0)))
        .collect::<TractResult<_>>()?;
    let batched = runnable.run_batch(&valid)?;
    for (k, (b, a)) in batched.iter().zip(alone.iter()).enumerate() {
        assert_eq!(b.len(), a.len());
        for (j, (x, y)) in b.iter().zip(a.iter()).enumerate() {
            assert_eq!(x.shape(), y.shape(), "sample {k} output {j}: shape");
            let d = rel_diff(x, y);
            assert!(
                d <= tol,
                "sample {k} (shape {:?}) output {j}: relative difference {d:e} > {tol:e}",
                valid[k].shape()
            );
        }
    }
    Ok(())
}

/// Whether `sample` is wide enough for the model, along each of its ragged axes (the
/// widths table of it alone).
pub fn fits(runnable: &RaggedRunnable, sample: &Tensor) -> TractResult<()> {
    let widths: Vec<Vec<i64>> = runnable
        .sample_fact()
        .widths_of(sample)
        .iter()
        .map(|w| vec![*w as i64])
        .collect();
    let slices: Vec<&[i64]> = widths.iter().map(|w| w.as_slice()).collect();
    runnable.width_table_axes(&slices).map(|_| ())
}

/// The project root, where `assets/` and `fixtures/` are: the working directory when it
/// holds them (cargo runs tests from the root; so does the GPU machine's launcher, where
/// the compile-time path does not exist), else the compile-time root.
pub fn root() -> std::path::PathBuf {
    match std::env::current_dir() {
        Ok(cwd) if cwd.join("fixtures").exists() => cwd,
        _ => std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")),
    }
}

/// An asset fetched by scripts/fetch-assets.sh: a missing one fails the test, it does not
/// skip it.
pub fn asset(path: &str) -> std::path::PathBuf {
    let p = root().join("assets").join(path);
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-assets.sh",
        p.display()
    );
    p
}

/// The project's text lines (PP-OCR rec samples) with their texts.
pub fn text_lines() -> Vec<(Tensor, String)> {
    tract_ragged::ocr::load_labelled_lines(root().join("fixtures/lines")).unwrap()
}

/// An `.npz` archive of one entry, `s0.npy`: the `.npy` header dict given, then 1000
/// bytes of data, whatever the header says.
pub fn npz_with_header(dict: &str) -> Vec<u8> {
    use std::io::Write;
    let mut npy = b"\x93NUMPY\x01\x00".to_vec();
    npy.extend((dict.len() as u16).to_le_bytes());
    npy.extend(dict.as_bytes());
    npy.extend([0u8; 1000]);
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(vec![]));
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    zip.start_file("s0.npy", options).unwrap();
    zip.write_all(&npy).unwrap();
    zip.finish().unwrap().into_inner()
}

/// Token sequences of the given lengths for a text encoder taking `input_ids` and an
/// `attention_mask`: ids drawn in 5..255, every position attended.
pub fn token_samples(rng: &mut Rng, lengths: &[usize]) -> Vec<TVec<Tensor>> {
    lengths
        .iter()
        .map(|&n| {
            let ids: Vec<i64> = (0..n).map(|_| 5 + rng.below(250) as i64).collect();
            tvec![tensor1(&ids), tensor1(&vec![1i64; n])]
        })
        .collect()
}

/// The largest absolute difference between two runs' outputs, sample by sample; their
/// counts and shapes must be equal.
pub fn max_difference(a: &[TVec<Tensor>], b: &[TVec<Tensor>]) -> f32 {
    assert_eq!(a.len(), b.len(), "not as many samples");
    let mut worst = 0f32;
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.len(), y.len(), "not as many outputs");
        for (x, y) in x.iter().zip(y) {
            assert_eq!(
                x.shape(),
                y.shape(),
                "a sample's output is not cropped as alone"
            );
            worst = worst.max(max_abs(x, y));
        }
    }
    worst
}
