//! A sample's valid outputs do not depend on its neighbours: not on their content, not on
//! their widths, not on how many they are, not on the padded width, not on what the
//! padding holds. And the padded region of every output is zero.

use crate::common::onnx::{Graph, Rng, int, ints};
use crate::common::{rel_diff, runnable, samples};
use proptest::prelude::*;
use tract_ragged::prelude::*;
use tract_ragged::runnable::Bucketing;

/// A model with every kind of op the contract is about: a strided conv, a ceil-mode
/// average pool, a squeeze-excitation gate from a global average pool, attention over
/// the width, a max reduction over it.
fn model(rng: &mut Rng, c: usize) -> tract_onnx::pb::ModelProto {
    let mut g = Graph::default();
    let w = g.weight(&[c, c, 3, 3], rng.vec(c * c * 9, 0.4));
    let x = g.op(
        "Conv",
        &["x", &w],
        vec![
            ints("kernel_shape", &[3, 3]),
            ints("pads", &[1, 1, 1, 1]),
            ints("strides", &[1, 2]),
        ],
    );
    let x = g.op("Relu", &[&x], vec![]);
    let x = g.op(
        "AveragePool",
        &[&x],
        vec![
            ints("kernel_shape", &[2, 3]),
            ints("strides", &[2, 2]),
            ints("pads", &[0, 1, 0, 1]),
            int("ceil_mode", 1),
        ],
    );
    let gap = g.op("GlobalAveragePool", &[&x], vec![]);
    let gate = g.op("Sigmoid", &[&gap], vec![]);
    let x = g.op("Mul", &[&x, &gate], vec![]);
    let axes = g.ints_const(&[2]);
    let h1 = g.op(
        "ReduceMean",
        &[&x],
        vec![ints("axes", &[2]), int("keepdims", 1)],
    );
    let t = g.op("Squeeze", &[&h1, &axes], vec![]);
    let t = g.op("Transpose", &[&t], vec![ints("perm", &[0, 2, 1])]);
    let kt = g.op("Transpose", &[&t], vec![ints("perm", &[0, 2, 1])]);
    let s = g.op("MatMul", &[&t, &kt], vec![]);
    let p = g.op("Softmax", &[&s], vec![int("axis", -1)]);
    let o = g.op("MatMul", &[&p, &t], vec![]);
    let m = g.op(
        "ReduceMax",
        &[&o],
        vec![ints("axes", &[1]), int("keepdims", 1)],
    );
    g.model("x", 4, &[&o, &m, &x])
}

fn assert_same(a: &TVec<Tensor>, b: &TVec<Tensor>, what: &str) {
    for (j, (x, y)) in a.iter().zip(b.iter()).enumerate() {
        let d = rel_diff(x, y);
        assert!(d <= 1e-5, "{what}: output {j} differs by {d:e}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    #[test]
    fn a_sample_does_not_see_its_neighbours(
        seed in 1u64.., c in 1usize..=3, width in 6usize..=30,
        left in proptest::collection::vec(6usize..=60, 0..=3),
        right in proptest::collection::vec(6usize..=60, 0..=3),
    ) {
        let mut rng = Rng(seed);
        let model = model(&mut rng, c);
        let mut runnable = runnable(&model, &format!("N,{c},4,W,f32"), 3).unwrap();
        let sample = samples(&mut rng, &[c, 4, 1], 2, &[width]).remove(0);
        let alone = runnable.run_batch(&[&sample]).unwrap().remove(0);
        assert_same(&alone, &runnable.run_one_by_one(&[&sample]).unwrap()[0], "batch of one vs one by one");

        let mut batch: Vec<Tensor> = samples(&mut rng, &[c, 4, 1], 2, &left);
        let at = batch.len();
        batch.push(sample.clone());
        batch.extend(samples(&mut rng, &[c, 4, 1], 2, &right));
        let among = runnable.run_batch(&batch).unwrap().remove(at);
        assert_same(&alone, &among, "among other samples");

        // Other content for the neighbours, same widths.
        for (ix, s) in batch.iter_mut().enumerate() {
            if ix != at {
                *s = samples(&mut rng, &[c, 4, 1], 2, &[s.shape()[2]]).remove(0);
            }
        }
        assert_same(&alone, &runnable.run_batch(&batch).unwrap()[at], "other neighbours");

        // Exact padded widths rather than buckets.
        runnable.bucketing = Bucketing::Exact;
        assert_same(&alone, &runnable.run_batch(&batch).unwrap()[at], "another padded width");
    }

    #[test]
    fn the_padding_holds_nothing_that_matters(seed in 1u64.., c in 1usize..=3,
        widths in proptest::collection::vec(6usize..=30, 1..=4), extra in 0usize..=20) {
        let mut rng = Rng(seed);
        let model = model(&mut rng, c);
        let runnable = runnable(&model, &format!("N,{c},4,W,f32"), 3).unwrap();
        let batch = samples(&mut rng, &[c, 4, 1], 2, &widths);
        let expected = runnable.run_batch(&batch).unwrap();
        // Pack by hand, the padding filled with large values rather than zeros.
        let padded = widths.iter().max().unwrap() + extra;
        let noise = rng.vec(widths.len() * c * 4 * padded, 1e4);
        let mut packed = Tensor::from_shape(&[widths.len(), c, 4, padded], &noise).unwrap();
        {
            let mut view = packed.to_plain_array_view_mut::<f32>().unwrap();
            for (ix, s) in batch.iter().enumerate() {
                let w = s.shape()[2];
                view.index_axis_mut(tract_core::ndarray::Axis(0), ix)
                    .slice_axis_mut(tract_core::ndarray::Axis(2), (0..w).into())
                    .assign(&s.to_plain_array_view::<f32>().unwrap());
            }
        }
        let ws: Vec<i64> = widths.iter().map(|w| *w as i64).collect();
        let outputs = runnable.run_packed(packed, &[&ws]).unwrap();
        let layouts = &runnable.model().ragged.outputs;
        for (j, layout) in layouts.iter().enumerate() {
            for (k, expected) in expected.iter().enumerate() {
                let found = tract_ragged::batch::crop(&outputs, layout, j, k).unwrap();
                prop_assert!(rel_diff(&found, &expected[j]) <= 1e-5, "output {j} sample {k}");
            }
            // Past each sample's width, every output is zero.
            let batch_axis = layout.batch.unwrap();
            for r in &layout.ragged {
                let widths = outputs[r.widths_output].cast_to::<i64>().unwrap().into_owned();
                let widths = widths.try_as_plain_ram().unwrap().as_slice::<i64>().unwrap().to_vec();
                let view = outputs[j].to_plain_array_view::<f32>().unwrap();
                for (k, w) in widths.iter().enumerate() {
                    let sample = view.index_axis(tract_core::ndarray::Axis(batch_axis), k);
                    let axis = r.axis - (r.axis > batch_axis) as usize;
                    let pad = sample.slice_axis(tract_core::ndarray::Axis(axis), (*w as usize..).into());
                    prop_assert!(pad.iter().all(|x| *x == 0.0), "output {j} sample {k}: padding not zero");
                }
            }
        }
    }
}
