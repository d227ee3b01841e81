//! Bad input is an error naming the sample at fault, never a panic, and the runnable stays
//! usable after it.

use crate::common;
use crate::common::onnx::{Graph, Rng, ints};
use crate::common::{runnable, samples};
use tract_ragged::prelude::*;

fn setup() -> (RaggedRunnable, Vec<Tensor>) {
    let mut rng = Rng(3);
    let mut g = Graph::default();
    let w = g.weight(&[2, 2, 1, 5], rng.vec(20, 0.5));
    // No padding: a sample narrower than 5 cannot run.
    let y = g.op("Conv", &["x", &w], vec![ints("kernel_shape", &[1, 5])]);
    let y = g.op("Relu", &[&y], vec![]);
    let runnable = runnable(&g.model("x", 4, &[&y]), "N,2,3,W,f32", 3).unwrap();
    let good = samples(&mut rng, &[2, 3, 1], 2, &[7, 12, 9]);
    (runnable, good)
}

fn error(r: TractResult<impl std::fmt::Debug>) -> String {
    format!("{:#}", r.expect_err("bad input was accepted"))
}

#[test]
fn bad_samples_are_named_and_the_runnable_survives() {
    let (runnable, good) = setup();
    let reference = runnable.run_batch(&good).unwrap();

    let mut zero = good.clone();
    zero[1] = Tensor::zero::<f32>(&[2, 3, 0]).unwrap();
    let e = error(runnable.run_batch(&zero));
    assert!(e.contains("sample 1") && e.contains("width 0"), "{e}");

    let mut rank = good.clone();
    rank[2] = Tensor::zero::<f32>(&[2, 3]).unwrap();
    let e = error(runnable.run_batch(&rank));
    assert!(e.contains("sample 2") && e.contains("rank"), "{e}");

    let mut dims = good.clone();
    dims[0] = Tensor::zero::<f32>(&[3, 3, 8]).unwrap();
    let e = error(runnable.run_batch(&dims));
    assert!(e.contains("sample 0") && e.contains("axis 0"), "{e}");

    let mut dtype = good.clone();
    dtype[1] = Tensor::zero::<f64>(&[2, 3, 8]).unwrap();
    let e = error(runnable.run_batch(&dtype));
    assert!(e.contains("sample 1") && e.contains("F64"), "{e}");

    let mut nan = good.clone();
    nan[2].to_plain_array_view_mut::<f32>().unwrap()[[1, 2, 3]] = f32::NAN;
    let e = error(runnable.run_batch(&nan));
    assert!(e.contains("sample 2") && e.contains("NaN"), "{e}");

    // Infinities too: through the model they become NaNs whose fate depends on the
    // kernels (measured on PP-OCRv4 rec: a line with one -inf pixel read differently
    // batched and alone). Refused, named, in f32 and f64 alike.
    for (value, shown) in [(f32::NEG_INFINITY, "-inf"), (f32::INFINITY, "inf")] {
        let mut inf = good.clone();
        inf[1].to_plain_array_view_mut::<f32>().unwrap()[[0, 1, 4]] = value;
        let e = error(runnable.run_batch(&inf));
        assert!(e.contains("sample 1") && e.contains(shown), "{e}");
        let e = error(runnable.run(&inf));
        assert!(e.contains("sample 1") && e.contains(shown), "{e}");
    }
    // Large finite values are samples like any other.
    let mut large = good.clone();
    large[0].to_plain_array_view_mut::<f32>().unwrap()[[0, 0, 0]] = 3e38;
    runnable.run_batch(&large).unwrap();

    let mut narrow = good.clone();
    narrow[1] = Tensor::zero::<f32>(&[2, 3, 3]).unwrap();
    let e = error(runnable.run_batch(&narrow));
    assert!(
        e.contains("sample 1") && e.contains("too narrow") && e.contains("Conv"),
        "{e}"
    );
    let e = runnable.run_batch(&narrow).unwrap_err();
    assert_eq!(error_kind(&e), ErrorKind::BadSample, "{e:#}");

    // Checked alone (as `--keep-going` and one by one do): a sample's own fault, and a
    // sample no budget this small holds.
    let e = runnable
        .check_alone(1, &narrow[1], None, u64::MAX)
        .unwrap_err();
    assert_eq!(error_kind(&e), ErrorKind::BadSample, "{e:#}");
    let e = runnable.check_alone(0, &good[0], None, 1).unwrap_err();
    assert_eq!(error_kind(&e), ErrorKind::OutOfMemory, "{e:#}");
    assert!(format!("{e:#}").contains("above the budget"), "{e:#}");

    let e = error(runnable.run_batch(Vec::<Tensor>::new()));
    assert!(e.contains("no sample"), "{e}");

    // Packed by the caller: a width above the padded width, or zero.
    let packed = Tensor::zero::<f32>(&[2, 2, 3, 10]).unwrap();
    let e = error(runnable.run_packed(packed.clone(), &[&[10, 11]]));
    assert!(e.contains("sample 1") && e.contains("padded width"), "{e}");
    let e = runnable
        .run_packed(packed.clone(), &[&[10, 11]])
        .unwrap_err();
    assert_eq!(error_kind(&e), ErrorKind::BadSample, "{e:#}");
    let e = error(runnable.run_packed(packed.clone(), &[&[0, 5]]));
    assert!(e.contains("sample 0"), "{e}");
    let e = error(runnable.run_packed(packed, &[&[5]]));
    assert!(e.contains("1 widths for a batch of 2"), "{e}");

    // Still usable, and still exact.
    let again = runnable.run_batch(&good).unwrap();
    for (a, b) in again.iter().zip(reference.iter()) {
        assert_eq!(a[0], b[0]);
    }
}

#[test]
fn bad_specs_are_refused() {
    let mut g = Graph::default();
    let y = g.op("Relu", &["x"], vec![]);
    let model = common::typed(&g.model("x", 4, &[&y]), "N,2,3,W,f32").unwrap();
    let e = format!(
        "{:#}",
        RaggedModel::new(model.clone(), RaggedSpec::new("x", 0)).unwrap_err()
    );
    assert!(e.contains("batch axis"), "{e}");
    let e = format!(
        "{:#}",
        RaggedModel::new(model.clone(), RaggedSpec::new("x", 4)).unwrap_err()
    );
    assert!(e.contains("out of the rank"), "{e}");
    let e = format!(
        "{:#}",
        RaggedModel::new(model, RaggedSpec::new("y", 3)).unwrap_err()
    );
    assert!(e.contains("not an input"), "{e}");
}
