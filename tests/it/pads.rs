//! Pads along the ragged axis, in each of ONNX's modes: padding after a sample lands
//! right after its own width, holding the constant, its last value (edge) or its values
//! mirrored from its own end (reflect), as the sample alone gets them; padding before
//! reads the start every sample has. silero's STFT pads its chunk so (reflect, after).

use crate::common;
use crate::common::onnx::{Graph, Rng, string};
use tract_ragged::prelude::*;

/// `x [N, C, W]` padded along W by `before` and `after` in `mode`, then a 3-tap
/// convolution that mixes the padded positions with their neighbours.
fn padded_conv(rng: &mut Rng, mode: &str, before: i64, after: i64) -> tract_onnx::pb::ModelProto {
    let mut g = Graph::default();
    let pads = g.ints_const(&[0, 0, before, 0, 0, after]);
    let padded = g.op("Pad", &["x", &pads], vec![string("mode", mode)]);
    let w = g.weight(&[2, 2, 3], rng.vec(12, 0.5));
    let y = g.op("Conv", &[&padded, &w], vec![]);
    g.model("x", 3, &[&y, &padded])
}

#[test]
fn every_pad_mode_lands_after_each_samples_own_width() -> TractResult<()> {
    for mode in ["constant", "edge", "reflect"] {
        for (before, after) in [(0, 3), (2, 4), (3, 0)] {
            let proto = padded_conv(&mut Rng(3), mode, before, after);
            let runnable = common::runnable(&proto, "N,2,W,f32", 2)?;
            let samples = common::samples(&mut Rng(4), &[2, 0], 1, &[9, 5, 13, 6]);
            common::assert_exact(&runnable, &samples, 1e-6)
                .map_err(|e| e.context(format!("{mode} pad ({before}, {after})")))?;
        }
    }
    Ok(())
}

#[test]
fn a_reflect_pad_mirrors_each_sample_from_its_own_end() -> TractResult<()> {
    let proto = padded_conv(&mut Rng(3), "reflect", 0, 3);
    let runnable = common::runnable(&proto, "N,2,W,f32", 2)?;
    let ramp = |w: usize| {
        let values: Vec<f32> = (0..2 * w).map(|i| (i % w) as f32).collect();
        Tensor::from_shape(&[2, w], &values).unwrap()
    };
    let outputs = runnable.run_batch(&[ramp(5), ramp(8)])?;
    let padded = outputs[0][1].to_plain_array_view::<f32>()?;
    let row: Vec<f32> = padded
        .index_axis(tract_ndarray::Axis(0), 0)
        .iter()
        .copied()
        .collect();
    assert_eq!(row, [0., 1., 2., 3., 4., 3., 2., 1.]);
    Ok(())
}

/// On ragged-cuda: the pads and their refill on the device (`CudaEdgeFill`, mirrored or
/// not), each sample as ragged-cuda and the CPU give it alone.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA device"]
fn every_pad_mode_runs_on_ragged_cuda_as_alone() -> TractResult<()> {
    for mode in ["edge", "reflect"] {
        let proto = padded_conv(&mut Rng(3), mode, 1, 4);
        let model = RaggedModel::new(common::typed(&proto, "N,2,W,f32")?, RaggedSpec::new(0, 2))?;
        let gpu = model.clone().into_runnable_with(common::cuda::cuda())?;
        let cpu = model.into_runnable()?;
        let samples = common::samples(&mut Rng(4), &[2, 0], 1, &[9, 5, 13, 6]);
        common::cuda::assert_exact_on_cuda(&gpu, &cpu, &samples);
        let host = common::cuda::host_nodes_of_plan(&gpu, &samples);
        assert!(host.is_empty(), "{mode}: on the host: {host:?}");
    }
    Ok(())
}
