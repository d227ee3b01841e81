//! CPU benchmarks (criterion): the ragged transform of PP-OCRv4 rec, and a batch of its
//! text lines run ragged, one by one and naively padded; and what the scheduler costs
//! around a lone sample's batch (a server's lone request), on a model that only sums its
//! input, so that the model's own time does not hide it. `cargo bench --bench cpu`;
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

/// A model that sums x[N,3,48,W] over its channels and rows: a run that costs little
/// beside what surrounds it.
fn summing_model() -> TractResult<TypedModel> {
    use tract_core::internal::*;
    use tract_core::ops::nn::{Reduce, Reducer};
    let mut model = TypedModel::default();
    let (n, w) = (model.symbols.sym("N"), model.symbols.sym("W"));
    let x = model.add_source("x", f32::fact(dims![n, 3, 48, w]))?;
    let sum = model.wire_node("sum", Reduce::new(tvec![1, 2], Reducer::Sum), &[x])?;
    model.select_output_outlets(&sum)?;
    Ok(model)
}

fn lone_sample(c: &mut Criterion) {
    let model = summing_model().expect("the summing model");
    let runnable = RaggedModel::new(model, RaggedSpec::new("x", 3))
        .unwrap()
        .into_runnable()
        .unwrap();
    let line = &lines()[0];
    let mut group = c.benchmark_group("a lone line around its batch, summing model, cpu");
    group.bench_function("run_batch", |b| {
        b.iter(|| runnable.run_batch(std::slice::from_ref(line)).unwrap())
    });
    group.bench_function("run_each (scheduled)", |b| {
        b.iter(|| runnable.run_each(std::slice::from_ref(line)).unwrap())
    });
    group.finish();
}

criterion_group!(benches, bench, lone_sample);
criterion_main!(benches);
