//! How preparation time grows with the graph: a measurement, not a check (ignored; run it
//! with `cargo test --release --test it preparation:: -- --ignored --nocapture`, `NODES=...`).
//!
//! A conv (or a sigmoid) then a chain of Relu nodes, through every phase: parsing,
//! typing, tract's declutter, the ragged transform, and the first batch (which prepares
//! the plan: tract's `into_optimized`), next to plain tract optimising the same model.
//! Measured on a 2-core machine (benches/NOTES.md): in one plan tract's optimizer is
//! n^2.6; in segments (`tract_ragged::segment`) every phase is about linear.

use std::time::Instant;

use crate::common::onnx::{Graph, Rng, ints};
use crate::common::samples;
use tract_core::internal::*;
use tract_onnx::prelude::InferenceModelExt;
use tract_ragged::prelude::*;

/// A conv (or a sigmoid), then `n` Relu nodes in a chain.
fn chain(n: usize, conv: bool) -> tract_onnx::pb::ModelProto {
    let mut rng = Rng(1);
    let mut g = Graph::default();
    let w = g.weight(&[2, 2, 1, 3], rng.vec(12, 0.5));
    let mut x = if conv {
        g.op(
            "Conv",
            &["x", &w],
            vec![ints("kernel_shape", &[1, 3]), ints("pads", &[0, 1, 0, 1])],
        )
    } else {
        g.op("Sigmoid", &["x"], vec![])
    };
    for _ in 0..n {
        x = g.op("Relu", &[&x], vec![]);
    }
    g.model("x", 4, &[&x])
}

#[test]
#[ignore = "a measurement"]
fn preparation_phases() -> TractResult<()> {
    let sizes: Vec<usize> = match std::env::var("NODES") {
        Ok(v) => v.split(',').filter_map(|n| n.parse().ok()).collect(),
        Err(_) => vec![1250, 2500, 5000],
    };
    for conv in [false, true] {
        for &n in &sizes {
            let t = Instant::now();
            let onnx = tract_ragged::load::from_proto(chain(n, conv), None, Some("N,2,3,W,f32"))?;
            let parse = t.elapsed();
            let t = Instant::now();
            let typed = onnx.model.into_typed()?;
            let typing = t.elapsed();
            let t = Instant::now();
            let mut decluttered = typed;
            tract_ragged::segment::Segments::declutter(&mut decluttered)?;
            let declutter = t.elapsed();
            let mut values: HashMap<Symbol, TDim> = HashMap::default();
            for s in decluttered.symbols.all_symbols() {
                values.insert(s.clone(), 16.to_dim());
            }
            // Plain tract is n^2.6: left out where it would take minutes.
            let plain = if n <= 5000 {
                let t = Instant::now();
                decluttered.set_symbols(&values)?.into_optimized()?;
                format!("{:.2?}", t.elapsed())
            } else {
                "-".to_string()
            };
            let t = Instant::now();
            let runnable = RaggedModel::new(decluttered, RaggedSpec::new(0, 3))?.into_runnable()?;
            let transform = t.elapsed();
            let t = Instant::now();
            let (_, info) =
                runnable.run_batch_with_info(&samples(&mut Rng(2), &[2, 3, 1], 2, &[5, 16]))?;
            let first = t.elapsed();
            let segments = info.segments;
            eprintln!(
                "{n} Relu after a {}: parse {parse:.2?}, typing {typing:.2?}, declutter \
                 {declutter:.2?}, ragged transform {transform:.2?}, first batch (its plan) \
                 {first:.2?} in {segments} segment(s); plain tract optimising the model {plain}",
                if conv { "conv" } else { "sigmoid" }
            );
        }
    }
    Ok(())
}
