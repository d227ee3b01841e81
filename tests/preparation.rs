//! Preparation time grows with the graph about linearly.

mod common;

use std::time::Instant;

use common::onnx::{Graph, Rng, ints};
use common::samples;
use prost::Message;
use tract_onnx::prelude::InferenceModelExt;
use tract_ragged::prelude::*;

/// A conv, then `n` Relu nodes in a chain.
fn chain(n: usize) -> tract_onnx::pb::ModelProto {
    chain_after(n, true)
}

fn chain_after(n: usize, conv: bool) -> tract_onnx::pb::ModelProto {
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
#[ignore = "timing"]
fn phases() -> TractResult<()> {
    for (n, conv) in [
        (2500, false),
        (5000, false),
        (10000, false),
        (20000, false),
        (2500, true),
        (5000, true),
        (10000, true),
        (20000, true),
    ] {
        let proto = chain_after(n, conv);
        let bytes = proto.encode_to_vec();
        let t = Instant::now();
        let onnx = tract_ragged::load::from_proto(
            tract_onnx::pb::ModelProto::decode(&*bytes)?,
            None,
            Some("N,2,3,W,f32"),
        )?;
        let parse = t.elapsed();
        let t = Instant::now();
        let typed = onnx.model.clone().into_typed()?;
        let typing = t.elapsed();
        let t = Instant::now();
        let decluttered = typed.into_decluttered()?;
        let declutter = t.elapsed();
        let t = Instant::now();
        let model = RaggedModel::new(decluttered, RaggedSpec::new(0, 3))?;
        let transform = t.elapsed();
        let t = Instant::now();
        let runnable = model.into_runnable()?;
        let into_runnable = t.elapsed();
        let inputs = samples(&mut Rng(2), &[2, 3, 1], 2, &[5, 9]);
        let t = Instant::now();
        if !conv || n <= 2500 {
            runnable.run_batch(&inputs)?;
        }
        let first = t.elapsed();
        eprintln!(
            "n={n} conv={conv} parse {parse:.2?} typing {typing:.2?} declutter {declutter:.2?} transform {transform:.2?} runnable {into_runnable:.2?} first batch {first:.2?}"
        );
    }
    Ok(())
}

#[test]
#[ignore = "timing"]
fn plan_phases() -> TractResult<()> {
    use tract_core::internal::*;
    for n in [1250, 2500] {
        let proto = chain(n);
        let onnx = tract_ragged::load::from_proto(proto, None, Some("N,2,3,W,f32"))?;
        let typed = onnx.model.into_typed()?.into_decluttered()?;
        let mut plain_values: HashMap<Symbol, TDim> = HashMap::default();
        for s in typed.symbols.all_symbols() {
            plain_values.insert(s.clone(), 16.to_dim());
        }
        let t = Instant::now();
        let plain = typed.set_symbols(&plain_values)?.into_optimized()?;
        eprintln!(
            "n={n} plain tract: optimize {:.2?} to {} nodes",
            t.elapsed(),
            plain.nodes().len()
        );
        let model = RaggedModel::new(typed, RaggedSpec::new(0, 3))?;
        let ragged = &model.ragged.model;
        let mut values: HashMap<Symbol, TDim> = HashMap::default();
        for s in ragged.symbols.all_symbols() {
            values.insert(s.clone(), 16.to_dim());
        }
        let t = Instant::now();
        let concrete = ragged.set_symbols(&values)?;
        let set = t.elapsed();
        let t = Instant::now();
        let decl = concrete.clone().into_decluttered()?;
        let declutter = t.elapsed();
        let t = Instant::now();
        let opt = decl.clone().into_optimized()?;
        let optimize = t.elapsed();
        let t = Instant::now();
        eprintln!(
            "optimized ragged: {} nodes: {:?}",
            opt.nodes().len(),
            opt.nodes()
                .iter()
                .take(8)
                .map(|n| n.op.name())
                .collect::<Vec<_>>()
        );
        let _plan = SimplePlan::new(opt)?;
        let plan = t.elapsed();
        eprintln!(
            "n={n} nodes {} set_symbols {set:.2?} declutter {declutter:.2?} optimize {optimize:.2?} plan {plan:.2?}",
            ragged.nodes().len()
        );
    }
    Ok(())
}
