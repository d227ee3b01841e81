//! The ragged batch against each sample alone, on random models of every op family the
//! transform handles: conv stacks, pools, global pools, reductions and softmax over the
//! ragged axis, attention over it, layer norm over channels, squeeze-excitation blocks.
//!
//! Models are ONNX graphs built in code and loaded through tract-onnx, as a user's are;
//! batch size, channels, widths and the ops' geometry are drawn at random.

use crate::common::models::{
    attention_model, conv_layer, conv_stack, pool, pool_model, reduce_model,
};
use crate::common::onnx::Rng;
use crate::common::{assert_exact, runnable, samples};
use proptest::prelude::*;

/// The relative tolerance: float rounding only, of kernels tiling differently for a
/// batch and for one sample.
const TOL: f32 = 1e-5;

fn widths(max: usize) -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(1usize..=max, 1..=4)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn conv_stacks(seed in 1u64.., c in 1usize..=3, h in 1usize..=3,
                   layers in proptest::collection::vec(conv_layer(), 1..=3), widths in widths(24)) {
        let mut rng = Rng(seed);
        let (model, _) = conv_stack(&mut rng, c, &layers);
        let runnable = runnable(&model, &format!("N,{c},{h},W,f32"), 3).unwrap();
        assert_exact(&runnable, &samples(&mut rng, &[c, h, 1], 2, &widths), TOL).unwrap();
    }

    #[test]
    fn pools(seed in 1u64.., c in 1usize..=3, p in pool(), widths in widths(20)) {
        let mut rng = Rng(seed);
        let model = pool_model(&mut rng, c, &p);
        let runnable = runnable(&model, &format!("N,{c},2,W,f32"), 3).unwrap();
        assert_exact(&runnable, &samples(&mut rng, &[c, 2, 1], 2, &widths), TOL).unwrap();
    }

    #[test]
    fn reductions_and_softmax(seed in 1u64.., c in 1usize..=3, which in 0u8..6, widths in widths(20)) {
        let mut rng = Rng(seed);
        let model = reduce_model(&mut rng, c, which);
        let runnable = runnable(&model, &format!("N,{c},2,W,f32"), 3).unwrap();
        assert_exact(&runnable, &samples(&mut rng, &[c, 2, 1], 2, &widths), TOL).unwrap();
    }

    #[test]
    fn attention(seed in 1u64.., c in 1usize..=4, heads in 1usize..=2, widths in widths(20)) {
        let mut rng = Rng(seed);
        let model = attention_model(&mut rng, c, heads);
        let runnable = runnable(&model, &format!("N,{c},1,W,f32"), 3).unwrap();
        assert_exact(&runnable, &samples(&mut rng, &[c, 1, 1], 2, &widths), TOL).unwrap();
    }
}
