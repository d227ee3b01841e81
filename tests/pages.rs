//! Two ragged axes of one input (H and W of a page): a ragged batch of pages of different
//! heights and widths gives each page what it gets alone, through convolutions and pools
//! along both axes and global pools over H x W.

mod common;

use common::onnx::Rng;
use common::pages::{layer, page_stack};
use common::samples;
use proptest::prelude::*;
use tract_core::internal::*;
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

/// A model read as the CLI reads it: typed symbolically if tract can, per shape if not
/// (a feature pyramid whose maps of different strides meet: tract 0.23.9 cannot tell
/// `2 * ceil(H / 4)` and `ceil(H / 2)` apart).
fn ragged_model(proto: &tract_onnx::pb::ModelProto, fact: &str) -> RaggedModel {
    let onnx = tract_ragged::load::from_proto(proto.clone(), None, Some(fact)).unwrap();
    tract_ragged::load::ragged_model(onnx, RaggedSpec::with_axes(0, &[2, 3])).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// Feature pyramids with nearest, linear and cubic resizes (the edge replicated
    /// before the interpolations) or transposed convolutions, a squeeze-excitation gate,
    /// a concatenation along the channels: each page what it gets alone.
    #[test]
    fn a_feature_pyramid_gives_each_page_what_it_gets_alone(
        how in common::pages::upsample(),
        sizes in proptest::collection::vec((1usize..7, 1usize..7), 1..4),
        seed in 1u64..1000,
    ) {
        let model = ragged_model(&common::pages::fpn(&mut Rng(seed), 2, &how), "N,2,H,W,f32");
        prop_assert_eq!(
            model.ragged.alignment.iter().map(|a| a.0).collect::<Vec<_>>(),
            vec![4, 4]
        );
        let runnable = model.into_runnable().unwrap();
        let sizes: Vec<(usize, usize)> = sizes.iter().map(|(h, w)| (4 * h, 4 * w)).collect();
        let batch = pages(&mut Rng(seed + 3), 2, &sizes);
        common::assert_exact(&runnable, &batch, 1e-5).unwrap();
    }
}

/// A page the model's pyramid cannot take (not a multiple of its coarsest stride) is
/// refused, naming it and why; the others run.
#[test]
fn pages_of_sizes_the_pyramid_cannot_take_are_refused() -> TractResult<()> {
    let how = common::pages::Upsample::Resize("nearest", "asymmetric");
    let runnable =
        ragged_model(&common::pages::fpn(&mut Rng(1), 2, &how), "N,2,H,W,f32").into_runnable()?;
    let batch = pages(&mut Rng(2), 2, &[(8, 12), (10, 8)]);
    let err = format!("{:#}", runnable.run_batch(&batch).err().context("ran")?);
    assert!(
        err.contains("sample 1") && err.contains("multiples of 4"),
        "{err}"
    );
    runnable.run_batch(&batch[..1])?;
    Ok(())
}
