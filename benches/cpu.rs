//! CPU benchmarks (criterion): the ragged transform of PP-OCRv4 rec, and a batch of its
//! text lines run ragged, one by one and naively padded. `cargo bench --bench cpu`;
//! under `cargo test` each runs once. GPU numbers come from `tract-ragged bench` on the GPU
//! machine (benches/gpu.sh), with PyTorch measured in the same run.

use criterion::{Criterion, criterion_group, criterion_main};
use tract_ragged::prelude::*;

const MODEL: &str = "assets/ppocr/ch_PP-OCRv4_rec_infer.onnx";

fn lines() -> Vec<Tensor> {
    ["line02.png", "line07.png", "line08.png", "line22.png"]
        .iter()
        .map(|f| tract_ragged::ocr::load_line(format!("fixtures/lines/{f}")).expect("fixture line"))
        .collect()
}

fn bench(c: &mut Criterion) {
    let model = load_onnx(MODEL, Some("N,3,48,W,f32")).expect("run scripts/fetch-assets.sh first");
    c.bench_function("transform PP-OCRv4 rec", |b| {
        b.iter(|| RaggedModel::new(model.clone(), RaggedSpec::new("x", 3)).unwrap())
    });
    let runnable = RaggedModel::new(model, RaggedSpec::new("x", 3))
        .unwrap()
        .into_runnable()
        .unwrap();
    let lines = lines();
    let mut group = c.benchmark_group("PP-OCRv4 rec, 4 lines, cpu");
    group.sample_size(10);
    group.bench_function("ragged batch", |b| {
        b.iter(|| runnable.run_batch(&lines).unwrap())
    });
    group.bench_function("scheduled", |b| b.iter(|| runnable.run(&lines).unwrap()));
    group.bench_function("one by one", |b| {
        b.iter(|| runnable.run_one_by_one(&lines).unwrap())
    });
    group.bench_function("naive padded batch", |b| {
        b.iter(|| runnable.run_naive_padded(&lines).unwrap())
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
