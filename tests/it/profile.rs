//! Profiles: each node's time with what it achieved, the bytes it moves and the
//! operations its op counts, checked against the shapes of a convolution.

use crate::common;
use crate::common::onnx::{Graph, Rng, ints};
use crate::common::runnable;
use tract_core::internal::*;

#[test]
fn a_convolution_counts_its_operations_and_bytes() -> TractResult<()> {
    let mut rng = Rng(41);
    let mut g = Graph::default();
    let w = g.weight(&[8, 4, 3, 3], rng.vec(288, 0.5));
    let y = g.op(
        "Conv",
        &["x", &w],
        vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
    );
    let runnable = runnable(&g.model("x", 4, &[&y]), "N,4,6,W,f32", 3)?;
    let batch: Vec<Tensor> = common::samples(&mut rng, &[4, 6, 1], 2, &[20, 32]);
    let (plan, inputs) = runnable.prepared(&batch)?;
    let profile = tract_ragged::profile::profile(&**runnable.backend(), &plan, inputs, 2)?;
    // N=2, O=8, I=4, 3x3 kernel, 6 x 32 outputs: two operations per FMA.
    let expected = 2.0 * (2 * 8 * 4 * 9 * 6 * 32) as f64;
    let counted: f64 = profile.nodes.iter().filter_map(|n| n.flops).sum();
    assert!(
        (counted - expected).abs() <= 0.01 * expected,
        "{counted} operations counted, {expected} expected"
    );
    // The batch in, the output out: at least both, in bytes.
    let moved: u64 = profile.nodes.iter().map(|n| n.bytes).max().unwrap_or(0);
    assert!(moved >= (2 * 4 * 6 * 32 * 4) as u64, "{moved} bytes");
    let text = profile.to_string();
    assert!(text.contains("GB/s") && text.contains("GFLOP/s"), "{text}");
    Ok(())
}
