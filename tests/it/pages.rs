//! Two ragged axes of one input (H and W of a page): a ragged batch of pages of different
//! heights and widths gives each page what it gets alone, through convolutions and pools
//! along both axes, softmaxes along either and global pools over H x W.

use crate::common;
use crate::common::onnx::Rng;
use crate::common::pages::{layer, page_stack};
use crate::common::samples;
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

/// A model read as the CLI reads it: a feature pyramid whose maps of different strides
/// meet does not type with `H` and `W` (tract 0.23.9 cannot tell `2 * ceil(H / 4)` and
/// `ceil(H / 2)` apart), so the loader types it per shape, finds the alignment (4), and
/// types it again symbolically over `4*H_4` and `4*W_4`.
fn ragged_model(proto: &tract_onnx::pb::ModelProto, fact: &str) -> RaggedModel {
    let onnx = tract_ragged::load::from_proto(proto.clone(), None, Some(fact)).unwrap();
    tract_ragged::load::ragged_model(onnx, RaggedSpec::with_axes(0, &[2, 3])).unwrap()
}

/// The same typed per shape, as models the loader cannot type symbolically at any
/// multiple run: each plan typed at its padded extents, means divided per sample.
fn per_shape_model(proto: &tract_onnx::pb::ModelProto, fact: &str) -> RaggedModel {
    let onnx = tract_ragged::load::from_proto(proto.clone(), None, Some(fact)).unwrap();
    RaggedModel::per_shape(onnx.model, RaggedSpec::with_axes(0, &[2, 3])).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    /// Feature pyramids with nearest, linear and cubic resizes (the edge replicated
    /// before the interpolations) or transposed convolutions, a squeeze-excitation gate,
    /// a concatenation along the channels: each page what it gets alone. Maps of strides
    /// 2 and 4 meet, so pages are multiples of 4, but where the resize is to the other
    /// map's extents (`ToShape`) in a model typed symbolically: each page is then resized
    /// to its own, and any size runs. (Typed per shape, the extents are numbers.)
    #[test]
    fn a_feature_pyramid_gives_each_page_what_it_gets_alone(
        how in common::pages::upsample(),
        sizes in proptest::collection::vec((1usize..7, 1usize..7), 1..4),
        seed in 1u64..1000,
    ) {
        let proto = common::pages::fpn(&mut Rng(seed), 2, &how);
        let to_shape = matches!(how, common::pages::Upsample::ToShape(..));
        for (model, symbolic) in [
            (ragged_model(&proto, "N,2,H,W,f32"), true),
            (per_shape_model(&proto, "N,2,H,W,f32"), false),
        ] {
            prop_assert_eq!(model.is_symbolic(), symbolic);
            let (alignment, rest) = if to_shape && symbolic { (1, (1, 3)) } else { (4, (0, 0)) };
            let sizes: Vec<(usize, usize)> =
                sizes.iter().map(|(h, w)| (4 * h + rest.0, 4 * w + rest.1)).collect();
            let batch = pages(&mut Rng(seed + 3), 2, &sizes);
            prop_assert_eq!(
                model.ragged.alignment.iter().map(|a| a.0).collect::<Vec<_>>(),
                vec![alignment, alignment],
                "symbolic: {}", symbolic
            );
            let runnable = model.into_runnable().unwrap();
            common::assert_exact(&runnable, &batch, 1e-5).unwrap();
        }
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
        err.contains("sample 1") && err.contains("multiples of 4") && err.contains("meet at node"),
        "{err}"
    );
    runnable.run_batch(&batch[..1])?;
    Ok(())
}

#[cfg(feature = "cuda")]
proptest! {
    #![proptest_config(ProptestConfig { cases: 16, .. ProptestConfig::default() })]

    /// On ragged-cuda: stacks along H and W, each page what it gets alone there and on
    /// the CPU.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn pages_on_cuda_give_each_page_what_it_gets_alone(
        layers in proptest::collection::vec(layer(), 1..=4),
        sizes in proptest::collection::vec((1usize..24, 1usize..24), 1..5),
        seed in 1u64..1000,
    ) {
        let proto = page_stack(&mut Rng(seed), 2, &layers);
        let model = RaggedModel::new(
            common::typed(&proto, "N,2,H,W,f32").unwrap(),
            RaggedSpec::with_axes(0, &[2, 3]),
        )
        .unwrap();
        let gpu = model.clone().into_runnable_with(common::cuda::cuda()).unwrap();
        let cpu = model.into_runnable().unwrap();
        let batch = pages(&mut Rng(seed + 3), 2, &sizes);
        common::cuda::assert_exact_on_cuda(&gpu, &cpu, &batch);
    }
}

/// Every upsampling of the pyramids on ragged-cuda: wholly on the device (the edge fill
/// and the resize on our kernels), each page what it gets alone there and on the CPU, and
/// a repeated batch replayed as a graph with a plain run's bits; pages of any size where
/// the resize is to another map's extents.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA device"]
fn feature_pyramids_on_cuda_run_on_the_device_and_give_each_page_what_it_gets_alone()
-> TractResult<()> {
    use common::pages::Upsample;
    for how in [
        Upsample::Resize("nearest", "asymmetric"),
        Upsample::Resize("nearest", "half_pixel"),
        Upsample::Resize("linear", "half_pixel"),
        Upsample::Resize("linear", "pytorch_half_pixel"),
        Upsample::Resize("linear", "asymmetric"),
        Upsample::Resize("cubic", "half_pixel"),
        Upsample::ToShape("nearest", "asymmetric"),
        Upsample::ToShape("linear", "pytorch_half_pixel"),
        Upsample::Resize("linear", "align_corners"),
        Upsample::ToShape("linear", "align_corners"),
        Upsample::Deconv,
    ] {
        let model = ragged_model(&common::pages::fpn(&mut Rng(5), 2, &how), "N,2,H,W,f32");
        let gpu = model.clone().into_runnable_with(common::cuda::cuda())?;
        let cpu = model.clone().into_runnable()?;
        // A resize to another map's extents takes any size: each page resized to its own.
        let sizes: &[(usize, usize)] = if matches!(how, Upsample::ToShape(..)) {
            &[(9, 21), (24, 6), (13, 12)]
        } else {
            &[(8, 20), (24, 4), (12, 12)]
        };
        let batch = pages(&mut Rng(6), 2, sizes);
        let host = common::cuda::host_nodes_of_plan(&gpu, &batch);
        assert!(host.is_empty(), "{how:?}: on the host: {host:?}");
        let other = pages(&mut Rng(7), 2, sizes);
        let plain = common::cuda::without_graphs(model.clone());
        common::cuda::assert_graph_replays(&format!("{how:?}"), &gpu, &plain, &[&batch, &other]);
        common::cuda::assert_exact_on_cuda(&gpu, &cpu, &batch);
    }
    Ok(())
}
