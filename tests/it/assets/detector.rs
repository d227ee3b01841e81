//! PP-OCRv4 det (DBNet) on rendered pages of different heights and widths: a ragged batch
//! with H and W ragged gives each page the probability map it gets alone, the same text
//! regions at DBNet's 0.3 threshold, where a naively padded batch changes them.

use crate::common;
use crate::common::asset;
use tract_core::internal::*;
use tract_ragged::prelude::*;

/// PP-OCRv4 det read as the CLI reads it, H and W ragged: tract cannot type its FPN over
/// `H` and `W`, so the loader types it per shape, finds its alignment (32), and types it
/// over `32*H_32` and `32*W_32`.
pub fn det() -> TractResult<RaggedModel> {
    let onnx = tract_ragged::load::read_onnx(
        asset("ppocr/ch_PP-OCRv4_det_infer.onnx"),
        Some("N,3,H,W,f32"),
    )?;
    tract_ragged::load::ragged_model(onnx, RaggedSpec::with_axes("x", &[2, 3]))
}

/// The fixture pages, the smallest `n` (CPU time).
pub fn pages(n: usize) -> TractResult<Vec<Tensor>> {
    let mut pages: Vec<Tensor> =
        tract_ragged::ocr::load_pages(common::root().join("fixtures/pages"))?
            .into_iter()
            .map(|(_, t)| t)
            .collect();
    pages.sort_by_key(|p| p.shape()[1] * p.shape()[2]);
    pages.truncate(n);
    Ok(pages)
}

/// The largest difference between two maps, and how many pixels fall on different sides
/// of DBNet's 0.3 threshold.
pub fn compare(a: &Tensor, b: &Tensor) -> TractResult<(f32, usize)> {
    let (a, b) = (
        a.to_plain_array_view::<f32>()?,
        b.to_plain_array_view::<f32>()?,
    );
    ensure!(
        a.shape() == b.shape(),
        "{:?} and {:?}",
        a.shape(),
        b.shape()
    );
    let mut worst = 0f32;
    let mut flips = 0;
    for (x, y) in a.iter().zip(b.iter()) {
        worst = worst.max((x - y).abs());
        flips += ((*x > 0.3) != (*y > 0.3)) as usize;
    }
    Ok((worst, flips))
}

#[test]
fn pages_batched_give_the_maps_they_get_alone_where_padding_changes_them() -> TractResult<()> {
    let model = det()?;
    assert!(model.is_symbolic(), "typed per shape");
    assert_eq!(
        model
            .ragged
            .alignment
            .iter()
            .map(|a| a.0)
            .collect::<Vec<_>>(),
        [32, 32]
    );
    let runnable = model.into_runnable()?;
    let pages = pages(4)?;
    let alone = runnable.run_one_by_one(&pages)?;
    let batched = runnable.run_batch(&pages)?;
    let naive = runnable.run_naive_padded(&pages)?;
    let mut naive_flips = 0;
    for (k, ((b, n), a)) in batched.iter().zip(&naive).zip(&alone).enumerate() {
        let (worst, flips) = compare(&b[0], &a[0])?;
        eprintln!(
            "page {k} {:?}: ragged {worst:e} ({flips} flips)",
            pages[k].shape()
        );
        assert!(
            worst <= 1e-4 && flips == 0,
            "page {k}: {worst:e}, {flips} pixels flip"
        );
        let (worst, flips) = compare(&n[0], &a[0])?;
        eprintln!("page {k}: naive padding {worst:e} ({flips} flips)");
        naive_flips += flips;
    }
    assert!(
        naive_flips > 0,
        "naive padding changed no text region: the test cannot fail"
    );
    Ok(())
}

/// On ragged-cuda: PP-OCRv4 det wholly on the device; the eight pages batched give the
/// maps they get alone there (the same text regions), and those of the CPU for the pages
/// the CPU test runs.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA device"]
fn pages_batched_on_cuda_give_the_maps_they_get_alone() -> TractResult<()> {
    let model = det()?;
    let gpu = model.clone().into_runnable_with(common::cuda::cuda())?;
    let cpu = model.into_runnable()?;
    let pages = pages(8)?;
    let host = common::cuda::host_nodes_of_plan(&gpu, &pages);
    assert!(host.is_empty(), "on the host: {host:?}");
    let alone = gpu.run_one_by_one(&pages)?;
    let batched = gpu.run_batch(&pages)?;
    for (k, (b, a)) in batched.iter().zip(&alone).enumerate() {
        let (worst, flips) = compare(&b[0], &a[0])?;
        eprintln!(
            "page {k} {:?}: ragged-cuda {worst:e} ({flips} flips)",
            pages[k].shape()
        );
        // cuDNN picks its algorithms per shape, so a page batched and alone sum in
        // other orders: the maps agree to float noise, the regions exactly.
        assert!(
            worst <= 1e-4 && flips == 0,
            "page {k}: {worst:e}, {flips} pixels flip"
        );
    }
    let on_cpu = cpu.run_one_by_one(&pages[..4])?;
    for (k, (b, c)) in batched.iter().zip(&on_cpu).enumerate() {
        let (worst, flips) = compare(&b[0], &c[0])?;
        eprintln!("page {k}: ragged-cuda vs CPU {worst:e} ({flips} flips)");
        assert!(worst <= 1e-4, "page {k}: GPU vs CPU {worst:e}");
    }
    Ok(())
}

/// A detector's extents declared as multiples of its stride (`32*h`, `32*w`) type
/// symbolically at once; a page of another size is refused, saying why.
#[test]
fn extents_declared_as_multiples_type_the_detector_symbolically() -> TractResult<()> {
    let onnx = tract_ragged::load::read_onnx(
        asset("ppocr/ch_PP-OCRv4_det_infer.onnx"),
        Some("N,3,32*h,32*w,f32"),
    )?;
    let model = tract_ragged::load::ragged_model(onnx, RaggedSpec::with_axes("x", &[2, 3]))?;
    assert!(model.is_symbolic(), "typed per shape");
    let runnable = model.into_runnable()?;
    let page = Tensor::zero::<f32>(&[3, 64, 80])?;
    let err = format!("{:#}", runnable.run_batch(&[page]).err().context("ran")?);
    assert!(
        err.contains("multiples of 32") && err.contains("32*w"),
        "{err}"
    );
    Ok(())
}
