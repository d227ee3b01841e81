//! PP-OCRv4 rec on the project's 28 rendered text lines (fixtures/lines), 51 to 1324 px
//! wide, in one batch: the ragged batch reads each line as it is read alone; the naive
//! padded batch does not (which is what proves this test can fail).

use std::sync::OnceLock;

use crate::common::{asset, max_abs, text_lines};
use tract_ragged::ocr;
use tract_ragged::prelude::*;

/// PP-OCRv4 rec with a symbolic batch and width, ragged along W, and its CTC classes:
/// prepared once for the tests of this file.
fn rec() -> &'static (RaggedRunnable, Vec<String>) {
    static REC: OnceLock<(RaggedRunnable, Vec<String>)> = OnceLock::new();
    REC.get_or_init(|| {
        let model = load_onnx(
            asset("ppocr/ch_PP-OCRv4_rec_infer.onnx"),
            Some("N,3,48,W,f32"),
        )
        .unwrap();
        let classes = ocr::classes(&model.properties).unwrap();
        let runnable = RaggedModel::new(model, RaggedSpec::new("x", 3))
            .and_then(|m| m.into_runnable())
            .unwrap();
        (runnable, classes)
    })
}

/// The fixture lines, their texts, and their outputs run one by one (the reference).
type LinesAlone = (Vec<Tensor>, Vec<String>, Vec<TVec<Tensor>>);

/// [`LinesAlone`], computed once.
fn lines_alone() -> &'static LinesAlone {
    static ALONE: OnceLock<LinesAlone> = OnceLock::new();
    ALONE.get_or_init(|| {
        let (lines, texts): (Vec<Tensor>, Vec<String>) = text_lines().into_iter().unzip();
        let alone = rec().0.run_one_by_one(&lines).unwrap();
        (lines, texts, alone)
    })
}

#[test]
fn ppocr_rec_ragged_batch_reads_every_line_as_alone() -> TractResult<()> {
    let (runnable, classes) = rec();
    let (lines, _, alone) = lines_alone();
    assert!(lines.len() >= 24);

    let ragged = runnable.run_batch(lines)?;
    let padded = runnable.run_naive_padded(lines)?;
    let mut padded_wrong = 0;
    for (ix, line) in lines.iter().enumerate() {
        let (r, a, p) = (&ragged[ix][0], &alone[ix][0], &padded[ix][0]);
        assert_eq!(r.shape(), a.shape(), "line {ix}");
        let text = ocr::ctc_greedy(a, classes)?;
        assert_eq!(
            ocr::ctc_greedy(r, classes)?,
            text,
            "line {ix} (width {})",
            line.shape()[2]
        );
        let d = max_abs(r, a);
        assert!(d <= 1e-4, "line {ix}: probabilities differ by {d:e}");
        padded_wrong += (ocr::ctc_greedy(p, classes)? != text) as usize;
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
    let (_, classes) = rec();
    let (lines, texts, alone) = lines_alone();
    let right = texts
        .iter()
        .zip(alone.iter())
        .filter(|(text, out)| ocr::ctc_greedy(&out[0], classes).unwrap().trim() == *text)
        .count();
    assert!(
        right * 4 >= lines.len() * 3,
        "only {right}/{} lines read right",
        lines.len()
    );
    Ok(())
}
