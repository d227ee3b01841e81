//! PP-OCRv4 rec on the project's 28 rendered text lines (fixtures/lines), 51 to 1324 px
//! wide, in one batch: the ragged batch reads each line as it is read alone; the naive
//! padded batch does not (which is what proves this test can fail).

mod common;

use common::{asset, max_abs, text_lines};
use tract_ragged::ocr;
use tract_ragged::prelude::*;

/// PP-OCRv4 rec with a symbolic batch and width, ragged along W, and its CTC classes.
fn rec() -> TractResult<(RaggedRunnable, Vec<String>)> {
    let model = load_onnx(
        asset("ppocr/ch_PP-OCRv4_rec_infer.onnx"),
        Some("N,3,48,W,f32"),
    )?;
    let classes = ocr::classes(&model.properties)?;
    let runnable = RaggedModel::new(model, RaggedSpec::new("x", 3))?.into_runnable()?;
    Ok((runnable, classes))
}

#[test]
fn ppocr_rec_ragged_batch_reads_every_line_as_alone() -> TractResult<()> {
    let (runnable, classes) = rec()?;
    let lines: Vec<Tensor> = text_lines().into_iter().map(|(t, _)| t).collect();
    assert!(lines.len() >= 24);

    let ragged = runnable.run_batch(&lines)?;
    let alone = runnable.run_one_by_one(&lines)?;
    let padded = runnable.run_naive_padded(&lines)?;
    let mut padded_wrong = 0;
    for (ix, line) in lines.iter().enumerate() {
        let (r, a, p) = (&ragged[ix][0], &alone[ix][0], &padded[ix][0]);
        assert_eq!(r.shape(), a.shape(), "line {ix}");
        let text = ocr::ctc_greedy(a, &classes)?;
        assert_eq!(
            ocr::ctc_greedy(r, &classes)?,
            text,
            "line {ix} (width {})",
            line.shape()[2]
        );
        let d = max_abs(r, a);
        assert!(d <= 1e-4, "line {ix}: probabilities differ by {d:e}");
        padded_wrong += (ocr::ctc_greedy(p, &classes)? != text) as usize;
    }
    // The measured problem: padding changes the text of several lines.
    assert!(
        padded_wrong >= 3,
        "naive padding changed only {padded_wrong} lines: the fixtures no longer show the problem"
    );
    Ok(())
}

#[test]
fn ppocr_rec_one_by_one_reads_the_rendered_text() -> TractResult<()> {
    // The fixtures are legible: the reference itself reads most lines right.
    let (runnable, classes) = rec()?;
    let lines = text_lines();
    let tensors: Vec<&Tensor> = lines.iter().map(|(t, _)| t).collect();
    let alone = runnable.run_one_by_one(&tensors)?;
    let right = lines
        .iter()
        .zip(alone.iter())
        .filter(|((_, text), out)| ocr::ctc_greedy(&out[0], &classes).unwrap().trim() == text)
        .count();
    assert!(
        right * 4 >= lines.len() * 3,
        "only {right}/{} lines read right",
        lines.len()
    );
    Ok(())
}
