//! Two ragged axes of one input (H and W of a page): a ragged batch of pages of different
//! heights and widths gives each page what it gets alone, through convolutions and pools
//! along both axes and global pools over H x W.

mod common;

use common::onnx::Rng;
use common::pages::{layer, page_stack};
use common::samples;
use proptest::prelude::*;
use tract_ragged::prelude::*;

/// Pages `[c, h, w]` of the given heights and widths, random values.
fn pages(rng: &mut Rng, c: usize, sizes: &[(usize, usize)]) -> Vec<Tensor> {
    sizes
        .iter()
        .map(|&(h, w)| samples(rng, &[c, h, w], 2, &[w]).remove(0))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn a_batch_of_pages_gives_each_page_what_it_gets_alone(
        layers in proptest::collection::vec(layer(), 1..=4),
        sizes in proptest::collection::vec((1usize..24, 1usize..24), 1..5),
        seed in 1u64..1000,
    ) {
        let proto = page_stack(&mut Rng(seed), 2, &layers);
        let typed = common::typed(&proto, "N,2,H,W,f32").unwrap();
        let runnable = RaggedModel::new(typed, RaggedSpec::with_axes(0, &[2, 3]))
            .unwrap()
            .into_runnable()
            .unwrap();
        let batch = pages(&mut Rng(seed + 3), 2, &sizes);
        common::assert_exact(&runnable, &batch, 1e-5).unwrap();
    }
}
