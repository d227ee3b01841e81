//! What the CUDA tests share: the runtime, a model on it and on the CPU, the contract
//! checked on the device, and graph replays checked against plain runs.

#![allow(dead_code)]

use tract_ragged::prelude::*;

use super::{assert_exact, differing_bits, rel_diff, typed};

pub fn cuda() -> &'static dyn Runtime {
    runtime_for_name("ragged-cuda")
        .unwrap()
        .expect("ragged-cuda is not registered")
}

/// The same model on ragged-cuda and on the CPU.
pub fn pair(proto: &tract_onnx::pb::ModelProto, fact: &str) -> (RaggedRunnable, RaggedRunnable) {
    let model = RaggedModel::new(typed(proto, fact).unwrap(), RaggedSpec::new(0, 3)).unwrap();
    (
        model.clone().into_runnable_with(cuda()).unwrap(),
        model.into_runnable().unwrap(),
    )
}

/// The contract on ragged-cuda: against itself one by one (fp32, relative 1e-5) and
/// against the CPU one by one (relative 1e-4). A sample whose CPU outputs hold an
/// infinity overflowed on the way, and then the platforms' special values decide (tract's
/// CPU sigmoid of -inf is 4.5e-7, tract-cuda's 0): it is compared on the device only.
pub fn assert_exact_on_cuda(cuda: &RaggedRunnable, cpu: &RaggedRunnable, samples: &[Tensor]) {
    assert_exact(cuda, samples, 1e-5).unwrap();
    // Each sample alone on the CPU, once: the reference, and whether it overflowed.
    let finite = |outputs: &TVec<Tensor>| {
        outputs.iter().all(|o| {
            o.cast_to::<f32>().is_ok_and(|o| {
                o.to_plain_array_view::<f32>()
                    .is_ok_and(|v| v.iter().all(|x| !x.is_infinite()))
            })
        })
    };
    let (valid, on_cpu): (Vec<&Tensor>, Vec<TVec<Tensor>>) = samples
        .iter()
        .filter(|s| super::fits(cpu, s).is_ok())
        .map(|s| (s, cpu.run_one_by_one(&[s]).unwrap().remove(0)))
        .filter(|(_, alone)| finite(alone))
        .unzip();
    if valid.is_empty() {
        return;
    }
    let on_gpu = cuda.run_batch(&valid).unwrap();
    for (k, (g, c)) in on_gpu.iter().zip(on_cpu.iter()).enumerate() {
        for (j, (x, y)) in g.iter().zip(c.iter()).enumerate() {
            let d = rel_diff(x, y);
            assert!(
                d <= 1e-4,
                "sample {k} output {j}: GPU vs CPU relative difference {d:e}"
            );
        }
    }
}

/// Every output of `found` has the bits of `expected`'s.
pub fn assert_same_bits(found: &[Tensor], expected: &[Tensor], what: &str) {
    assert_eq!(found.len(), expected.len(), "{what}");
    for (k, (f, e)) in found.iter().zip(expected).enumerate() {
        let differ = differing_bits(f, e);
        assert_eq!(differ, 0, "{what}: output {k}: {differ} values differ");
    }
}

/// The same model on ragged-cuda with CUDA graphs off: every run a plain run.
pub fn without_graphs(model: RaggedModel) -> RaggedRunnable {
    let off = KnobScope::new([("TRACT_RAGGED_GRAPHS", "off")]).unwrap();
    model.into_runnable_with(cuda()).unwrap().with_knobs(off)
}

/// Runs `batches` (one batch shape, one plan: the same padded extents, other widths
/// within them and other values) round after round on `gpu` until each batch has been a
/// replay: the first run of the shape is plain, the second captured and launched, the
/// later ones replays of that one graph, their width tables staged again
/// (`cuda::restage`). Every run gives the bits of its batch's plain run on `plain` (the
/// same model with graphs off).
///
/// A capture can be invalidated by another thread's CUDA work (another test's, outside
/// ragged-cuda's lock): ragged-cuda then runs that batch plain and captures again on the
/// shape's next run (`cuda::graph`'s module doc). So the counts are checked as that
/// contract states them, whatever the other tests do meanwhile: one graph captured, every
/// failed capture a plain run of its own, none refused.
pub fn assert_graph_replays(
    what: &str,
    gpu: &RaggedRunnable,
    plain: &RaggedRunnable,
    batches: &[&[Tensor]],
) {
    use tract_ragged::cuda::graph::{CudaPlan, MAX_FAILURES};
    let expected: Vec<_> = batches
        .iter()
        .map(|b| plain.run_batch(*b).unwrap())
        .collect();
    let plan_of = |batch: &[Tensor]| gpu.prepared(batch).unwrap().0;
    let first = plan_of(batches[0]);
    for (ix, batch) in batches.iter().enumerate() {
        assert!(
            Arc::ptr_eq(&plan_of(batch), &first),
            "{what}: batch {ix} runs on another plan"
        );
    }
    let stats = || {
        let plan = first
            .downcast_ref::<CudaPlan>()
            .expect("ragged-cuda's plan is a CudaPlan");
        (plan.stats(), plan.graph_refusal())
    };
    let restaging = || {
        let plan = first.downcast_ref::<CudaPlan>().expect("a CudaPlan");
        plan.restage_refusal()
    };
    let mut runs = 0;
    for round in 0..=MAX_FAILURES + 1 {
        for (ix, (batch, expected)) in batches.iter().zip(&expected).enumerate() {
            let found = gpu.run_batch(*batch).unwrap();
            runs += 1;
            for (k, (f, e)) in found.iter().zip(expected.iter()).enumerate() {
                assert_same_bits(
                    f,
                    e,
                    &format!("{what}: round {round}, batch {ix}, sample {k}"),
                );
            }
        }
        if stats().0.replays >= batches.len() {
            break;
        }
    }
    let (stats, refusal) = stats();
    assert_eq!(refusal, None, "{what}: {stats:?}");
    assert_eq!(
        stats.captured,
        1,
        "{what}: one graph for every width: {stats:?}, restaging refused: {:?}",
        restaging()
    );
    assert!(stats.replays >= batches.len(), "{what}: {stats:?}");
    // The first run, then one plain run per failed capture.
    assert_eq!(stats.runs, 1 + stats.failed, "{what}: {stats:?}");
    assert_eq!(
        stats.runs + stats.captured + stats.replays,
        runs,
        "{what}: {stats:?}"
    );
}

/// The nodes the plan for `samples` runs on the host between its input and output syncs
/// (`cuda::host_nodes`): none, when a model runs wholly on the device.
pub fn host_nodes_of_plan(gpu: &RaggedRunnable, samples: &[Tensor]) -> Vec<String> {
    let (plan, _) = gpu.prepared(samples).unwrap();
    let plan = plan
        .downcast_ref::<tract_ragged::cuda::graph::CudaPlan>()
        .expect("ragged-cuda's plan is a CudaPlan");
    tract_ragged::cuda::host_nodes(plan.model()).unwrap()
}
