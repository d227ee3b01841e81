//! Many samples at once: batches sized by memory and cost, answers in the caller's order,
//! each exactly what the sample gets alone.

use crate::common;
use crate::common::onnx::{Graph, Rng, int, ints};
use crate::common::{rel_diff, runnable, samples};
use tract_core::internal::*;
use tract_ragged::backend::{HostBackend, OutOfMemory};
use tract_ragged::prelude::*;
use tract_ragged::schedule::{Costs, Schedule};

fn model(rng: &mut Rng) -> tract_onnx::pb::ModelProto {
    let mut g = Graph::default();
    let w = g.weight(&[4, 2, 3, 3], rng.vec(72, 0.5));
    let x = g.op(
        "Conv",
        &["x", &w],
        vec![
            ints("kernel_shape", &[3, 3]),
            ints("pads", &[1, 1, 1, 1]),
            ints("strides", &[1, 2]),
        ],
    );
    let x = g.op("Relu", &[&x], vec![]);
    let p = g.op("GlobalAveragePool", &[&x], vec![]);
    let y = g.op("Softmax", &[&x], vec![int("axis", 3)]);
    g.model("x", 4, &[&y, &p])
}

#[test]
fn a_thousand_samples_come_back_in_order_and_exact() -> TractResult<()> {
    let mut rng = Rng(21);
    let runnable = runnable(&model(&mut rng), "N,2,3,W,f32", 3)?;
    let widths: Vec<usize> = (0..1000).map(|i| 1 + (i * 7919) % 97).collect();
    let inputs = samples(&mut rng, &[2, 3, 1], 2, &widths);
    let outputs = runnable.run(&inputs)?;
    assert_eq!(outputs.len(), 1000);
    let alone = runnable.run_one_by_one(&inputs)?;
    for (ix, (o, a)) in outputs.iter().zip(&alone).enumerate() {
        // Stride 2 along W: a sample of width w comes back (w + 1) / 2 wide, in its place.
        assert_eq!(
            o[0].shape()[2],
            widths[ix].div_ceil(2),
            "sample {ix} out of place"
        );
        for (x, y) in o.iter().zip(a) {
            assert!(rel_diff(x, y) <= 1e-5, "sample {ix}");
        }
    }
    Ok(())
}

#[test]
fn batches_fit_the_budget_and_follow_the_cost_model() -> TractResult<()> {
    let mut rng = Rng(22);
    let runnable = runnable(&model(&mut rng), "N,2,3,W,f32", 3)?;
    let widths: Vec<usize> = (0..200).map(|i| 8 + (i * 31) % 400).collect();
    let generous = Schedule {
        budget: 1 << 40,
        max_batch: None,
        batch_overhead: 16384,
        first_index: 0,
        lanes: 1,
        costs: Costs::Fixed,
        new_plan: 0.0,
        on_cut: None,
    };
    let plan = generous.plan(&runnable, &widths)?;
    // Every sample once, batches contiguous in width order.
    let mut all: Vec<usize> = plan.iter().flat_map(|b| b.samples.clone()).collect();
    let sorted: Vec<usize> = all.iter().map(|i| widths[*i]).collect();
    assert!(sorted.windows(2).all(|w| w[0] <= w[1]));
    all.sort();
    assert_eq!(all, (0..200).collect::<Vec<_>>());

    // A tight budget: more batches, each within it.
    let one = runnable.peak_memory(1, &[runnable.padded_width(407)])?;
    let tight = Schedule {
        budget: one * 8,
        ..generous.clone()
    };
    let tight_plan = tight.plan(&runnable, &widths)?;
    assert!(tight_plan.len() > plan.len());
    assert!(tight_plan.iter().all(|b| b.peak_memory <= tight.budget));

    // No overhead: batches of one width bucket each; a huge one: a single batch.
    let free = Schedule {
        batch_overhead: 0,
        ..generous.clone()
    };
    let per_bucket = free.plan(&runnable, &widths)?;
    let per_sample: Vec<TVec<usize>> = widths.iter().map(|w| tvec!(*w)).collect();
    assert!(per_bucket.iter().all(|b| b.waste(&per_sample) < 0.2));
    let costly = Schedule {
        batch_overhead: 1 << 40,
        ..generous.clone()
    };
    assert_eq!(costly.plan(&runnable, &widths)?.len(), 1);

    // A cap on the batch size.
    let capped = Schedule {
        max_batch: Some(16),
        ..generous
    };
    assert!(
        capped
            .plan(&runnable, &widths)?
            .iter()
            .all(|b| b.samples.len() <= 16)
    );
    Ok(())
}

/// The scheduler's cut is the least cost of every cut of the width-sorted samples into
/// contiguous batches within the cap and the budget (all 2^(n-1) of them tried), with
/// the fewest batches of those: along one ragged axis and along two (sorted by the first,
/// a batch padded to its maxima along both).
#[test]
fn the_cut_is_the_least_cost_of_every_cut() -> TractResult<()> {
    let mut rng = Rng(24);
    let proto = model(&mut rng);
    let one = runnable(&proto, "N,2,3,W,f32", 3)?;
    let two = RaggedModel::new(
        common::typed(&proto, "N,2,H,W,f32")?,
        RaggedSpec::with_axes("x", &[2, 3]),
    )?
    .into_runnable()?;
    let n = 9;
    for (runnable, axes) in [(&one, 1), (&two, 2)] {
        for trial in 0..8 {
            let mut widths: Vec<TVec<usize>> = (0..n)
                .map(|_| (0..axes).map(|_| 1 + rng.below(48)).collect())
                .collect();
            // The planner's order: sorted by widths, the first axis first.
            widths.sort();
            let widest: TVec<usize> = (0..axes)
                .map(|a| widths.iter().map(|w| w[a]).max().unwrap_or(1))
                .collect();
            let pair = runnable.peak_memory(2, &runnable.padded_extents(&widest))?;
            let schedule = Schedule {
                // Loose, then tight enough that three samples at the widest do not fit.
                budget: if trial % 2 == 0 { 1 << 40 } else { pair },
                max_batch: [None, Some(4)][trial / 2 % 2],
                batch_overhead: [0, 300, 5000, 1 << 20][trial % 4],
                first_index: 0,
                lanes: 1,
                costs: Costs::Fixed,
                new_plan: 0.0,
                on_cut: None,
            };
            let group = |range: std::ops::Range<usize>| -> TractResult<Option<f64>> {
                let maxima: TVec<usize> = (0..axes)
                    .map(|a| {
                        widths[range.clone()]
                            .iter()
                            .map(|w| w[a])
                            .max()
                            .unwrap_or(1)
                    })
                    .collect();
                let padded = runnable.padded_extents(&maxima);
                let size = range.len();
                if schedule.max_batch.is_some_and(|m| size > m)
                    || runnable.peak_memory(size, &padded)? > schedule.budget
                {
                    return Ok(None);
                }
                let cells = size * padded.iter().product::<usize>();
                Ok(Some((schedule.batch_overhead + cells as u64) as f64))
            };
            // Every cut: bit i set cuts between sample i and i + 1.
            let mut least: Option<(f64, usize)> = None;
            for cuts in 0u32..1 << (n - 1) {
                let mut cost = Some(0.0);
                let mut start = 0;
                for end in 1..=n {
                    if end == n || cuts & (1 << (end - 1)) != 0 {
                        cost = match (cost, group(start..end)?) {
                            (Some(c), Some(g)) => Some(c + g),
                            _ => None,
                        };
                        start = end;
                    }
                }
                let batches = cuts.count_ones() as usize + 1;
                if let Some(c) = cost
                    && least.is_none_or(|(l, b)| c < l || (c == l && batches < b))
                {
                    least = Some((c, batches));
                }
            }
            let planned = schedule.plan_axes(runnable, &widths)?;
            let cost: f64 = planned.iter().map(|b| b.cost).sum();
            assert_eq!(
                Some((cost, planned.len())),
                least,
                "{axes} axes, trial {trial}: widths {widths:?}"
            );
            for b in &planned {
                assert!(
                    b.peak_memory <= schedule.budget,
                    "{axes} axes, trial {trial}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn a_sample_beyond_the_budget_is_named() {
    let mut rng = Rng(23);
    let runnable = runnable(&model(&mut rng), "N,2,3,W,f32", 3).unwrap();
    let inputs = samples(&mut rng, &[2, 3, 1], 2, &[10, 20, 30]);
    let schedule = Schedule {
        budget: 16,
        max_batch: None,
        batch_overhead: 0,
        first_index: 0,
        lanes: 1,
        costs: Costs::Fixed,
        new_plan: 0.0,
        on_cut: None,
    };
    let err = format!(
        "{:#}",
        runnable.run_scheduled(&inputs, &schedule).unwrap_err()
    );
    assert!(err.contains("sample 0") && err.contains("budget"), "{err}");
}

/// A runtime whose plans fail on batches of more than 3 samples: out of memory as a
/// backend reports it (typed), or with an error that merely says so.
#[derive(Debug)]
struct SmallDevice {
    typed: bool,
}

#[derive(Debug)]
struct SmallPlan {
    plan: Box<dyn Runnable>,
    typed: bool,
}

impl Runnable for SmallPlan {
    fn run(&self, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        let n = inputs[0].shape()[0];
        if n > 3 {
            if self.typed {
                return Err(OutOfMemory {
                    what: format!("a batch of {n}"),
                }
                .into());
            }
            bail!("out of memory, says this message, but nothing tells it is");
        }
        self.plan.run(inputs)
    }
    fn spawn(&self) -> TractResult<Box<dyn State>> {
        self.plan.spawn()
    }
    fn typed_plan(&self) -> Option<&Arc<TypedSimplePlan>> {
        self.plan.typed_plan()
    }
    fn typed_model(&self) -> Option<&Arc<TypedModel>> {
        self.plan.typed_model()
    }
}

impl Runtime for SmallDevice {
    fn name(&self) -> StaticName {
        "small-device".into()
    }
    fn prepare_with_options(
        &self,
        model: TypedModel,
        options: &RunOptions,
    ) -> TractResult<Box<dyn Runnable>> {
        Ok(Box::new(SmallPlan {
            plan: DefaultRuntime.prepare_with_options(model, options)?,
            typed: self.typed,
        }))
    }
    fn check(&self) -> TractResult<()> {
        Ok(())
    }
}

static SMALL_DEVICE: SmallDevice = SmallDevice { typed: true };
static SAYS_OUT_OF_MEMORY: SmallDevice = SmallDevice { typed: false };

#[test]
fn a_batch_out_of_memory_is_split_until_it_fits() -> TractResult<()> {
    let mut rng = Rng(24);
    let model = common::typed(&model(&mut rng), "N,2,3,W,f32")?;
    let runnable =
        RaggedModel::new(model, RaggedSpec::new(0, 3))?.into_runnable_with(&SMALL_DEVICE)?;
    // Its plans are no backend's: batches move as host tensors.
    assert_eq!(runnable.backend().name(), "host");
    let inputs = samples(
        &mut rng,
        &[2, 3, 1],
        2,
        &[5, 9, 14, 3, 22, 7, 11, 30, 2, 17],
    );
    // One batch of ten planned; it fails, its halves of five fail, their halves run.
    let schedule = Schedule {
        budget: 1 << 40,
        max_batch: None,
        batch_overhead: 1 << 40,
        first_index: 0,
        lanes: 1,
        costs: Costs::Fixed,
        new_plan: 0.0,
        on_cut: None,
    };
    assert_eq!(
        schedule
            .plan(&runnable, &[5, 9, 14, 3, 22, 7, 11, 30, 2, 17])?
            .len(),
        1
    );
    let outputs = runnable.run_scheduled(&inputs, &schedule)?;
    each_as_alone(&runnable, &inputs, &outputs)
}

/// Out of memory is what the backend says it is, never what an error's text says: an
/// error that only reads like it fails the run, naming the samples.
#[test]
fn an_error_that_only_says_out_of_memory_is_not_split() -> TractResult<()> {
    let mut rng = Rng(25);
    let model = common::typed(&model(&mut rng), "N,2,3,W,f32")?;
    let runnable =
        RaggedModel::new(model, RaggedSpec::new(0, 3))?.into_runnable_with(&SAYS_OUT_OF_MEMORY)?;
    let inputs = samples(&mut rng, &[2, 3, 1], 2, &[5, 9, 14, 3, 22, 7]);
    let schedule = Schedule {
        budget: 1 << 40,
        max_batch: None,
        batch_overhead: 1 << 40,
        first_index: 0,
        lanes: 1,
        costs: Costs::Fixed,
        new_plan: 0.0,
        on_cut: None,
    };
    let err = format!(
        "{:#}",
        runnable.run_scheduled(&inputs, &schedule).unwrap_err()
    );
    assert!(err.contains("Running samples"), "{err}");
    Ok(())
}

/// A runtime whose plans fail (not for memory) on any batch holding a sample of width
/// 13: a bad sample that passes every check.
#[derive(Debug)]
struct Fussy;

#[derive(Debug)]
struct FussyPlan(Box<dyn Runnable>);

impl Runnable for FussyPlan {
    fn run(&self, inputs: TVec<TValue>) -> TractResult<TVec<TValue>> {
        if inputs.len() > 1
            && inputs[1]
                .to_plain_array_view::<i64>()?
                .iter()
                .any(|w| *w == 13)
        {
            bail!("width 13 is cursed");
        }
        self.0.run(inputs)
    }
    fn spawn(&self) -> TractResult<Box<dyn State>> {
        self.0.spawn()
    }
    fn typed_plan(&self) -> Option<&Arc<TypedSimplePlan>> {
        self.0.typed_plan()
    }
    fn typed_model(&self) -> Option<&Arc<TypedModel>> {
        self.0.typed_model()
    }
}

impl Runtime for Fussy {
    fn name(&self) -> StaticName {
        "fussy".into()
    }
    fn prepare_with_options(
        &self,
        model: TypedModel,
        options: &RunOptions,
    ) -> TractResult<Box<dyn Runnable>> {
        Ok(Box::new(FussyPlan(
            DefaultRuntime.prepare_with_options(model, options)?,
        )))
    }
    fn check(&self) -> TractResult<()> {
        Ok(())
    }
}

static FUSSY: Fussy = Fussy;

/// `run_each_scheduled` answers each sample on its own: refused samples and samples that
/// fail in their batch get their errors, every other sample its outputs as alone; a
/// failing batch is split down to the sample at fault. `run_scheduled` fails whole.
#[test]
fn each_sample_is_answered_on_its_own() -> TractResult<()> {
    let mut rng = Rng(26);
    let model = common::typed(&model(&mut rng), "N,2,3,W,f32")?;
    let runnable = RaggedModel::new(model, RaggedSpec::new(0, 3))?.into_runnable_with(&FUSSY)?;
    let widths = [5, 9, 13, 3, 22, 7, 11, 30, 2, 17, 12, 8];
    let mut inputs = samples(&mut rng, &[2, 3, 1], 2, &widths);
    inputs[5] = Tensor::zero::<f32>(&[2, 3])?;
    inputs[9].to_plain_array_view_mut::<f32>()?[[0, 1, 2]] = f32::INFINITY;
    let schedule = Schedule {
        budget: 1 << 40,
        max_batch: Some(4),
        batch_overhead: 0,
        first_index: 100,
        lanes: 1,
        costs: Costs::Fixed,
        new_plan: 0.0,
        on_cut: None,
    };
    let results = runnable.run_each_scheduled(&inputs, &schedule)?;
    let reference = runnable_on_cpu(&mut Rng(26))?;
    for (ix, result) in results.iter().enumerate() {
        match ix {
            2 | 5 | 9 => {
                let e = format!("{:#}", result.as_ref().unwrap_err());
                let expected = match ix {
                    2 => "cursed".to_string(),
                    5 => "sample 105 has rank 2".to_string(),
                    _ => "sample 109 holds inf".to_string(),
                };
                assert!(e.contains(&expected), "sample {ix}: {e}");
            }
            _ => {
                let outputs = result.as_ref().unwrap();
                let alone = reference.run_one_by_one(&inputs[ix..ix + 1])?;
                for (o, a) in outputs.iter().zip(&alone[0]) {
                    assert!(rel_diff(o, a) <= 1e-5, "sample {ix}");
                }
            }
        }
    }
    let err = runnable.run_scheduled(&inputs, &schedule).unwrap_err();
    assert!(format!("{err:#}").contains("sample 105"), "{err:#}");
    Ok(())
}

/// The same model on tract's default runtime.
fn runnable_on_cpu(rng: &mut Rng) -> TractResult<RaggedRunnable> {
    runnable(&model(rng), "N,2,3,W,f32", 3)
}

/// Plans are kept up to the cache's capacity, the least recently used dropped: samples
/// one by one, each of its own width, do not pile up a plan each.
#[test]
fn plans_are_kept_up_to_the_capacity() -> TractResult<()> {
    let mut rng = Rng(27);
    let runnable = runnable(&model(&mut rng), "N,2,3,W,f32", 3)?.with_plan_capacity(3);
    let widths: Vec<usize> = (1..=12).collect();
    let inputs = samples(&mut rng, &[2, 3, 1], 2, &widths);
    let alone = runnable.run_one_by_one(&inputs)?;
    assert_eq!(runnable.cached_plans(), 3);
    let batched = runnable.run(&inputs)?;
    assert!(runnable.cached_plans() <= 3);
    for (ix, (b, a)) in batched.iter().zip(&alone).enumerate() {
        for (x, y) in b.iter().zip(a) {
            assert!(rel_diff(x, y) <= 1e-5, "sample {ix}");
        }
    }
    Ok(())
}

/// A run whose batches take more shapes than the cache holds keeps the plans of the first
/// shapes it met for its next run and prepares only the others again, rather than
/// dropping each plan just before its next use (least recently used, over shapes met in
/// the same order every run, would prepare all of them every time).
#[test]
fn a_run_of_more_shapes_than_the_cache_holds_keeps_the_first_ones() -> TractResult<()> {
    let mut rng = Rng(29);
    let runnable = runnable(&model(&mut rng), "N,2,3,W,f32", 3)?.with_plan_capacity(3);
    let inputs = samples(&mut rng, &[2, 3, 1], 2, &[10, 20, 30, 40, 50]);
    // One sample a batch: five shapes a run.
    let schedule = Schedule::fixed(1 << 40, Some(1), 0);
    let first = runnable.run_scheduled(&inputs, &schedule)?;
    assert_eq!(runnable.prepared_plans(), 5);
    assert_eq!(runnable.cached_plans(), 3);
    for _ in 0..2 {
        let before = runnable.prepared_plans();
        let again = runnable.run_scheduled(&inputs, &schedule)?;
        assert_eq!(runnable.prepared_plans() - before, 2, "3 of 5 plans kept");
        assert_eq!(again, first);
    }
    Ok(())
}

/// Lanes change when batches run, never what they give: four lanes answer every sample
/// with the bits one lane gives, and tract's executor on two threads with the bits of one.
#[test]
fn lanes_and_threads_give_the_bits_of_one_lane() -> TractResult<()> {
    let mut rng = Rng(28);
    let runnable = runnable(&model(&mut rng), "N,2,3,W,f32", 3)?;
    let widths: Vec<usize> = (0..120).map(|i| 1 + (i * 37) % 90).collect();
    let inputs = samples(&mut rng, &[2, 3, 1], 2, &widths);
    let one = Schedule {
        lanes: 1,
        ..Schedule::fixed(1 << 40, Some(8), 64)
    };
    let four = Schedule {
        lanes: 4,
        ..one.clone()
    };
    let a = runnable.run_scheduled(&inputs, &one)?;
    let b = runnable.run_scheduled(&inputs, &four)?;
    assert_eq!(a, b);
    let host = tract_ragged::backend::HostBackend;
    let mut threaded = None;
    tract_ragged::backend::Backend::with_threads(&host, 2, &mut || {
        threaded = Some(runnable.run_batch(&inputs[..16]));
    });
    assert_eq!(
        threaded.context("not run")??,
        runnable.run_batch(&inputs[..16])?
    );
    Ok(())
}

/// On the host the scheduler measures what a cell costs at each batch size, on the
/// samples it runs (their answers kept): a ladder of 1, 2, 4... kept by the runnable for
/// the next runs, and every sample what it gets alone.
#[test]
fn costs_are_measured_on_the_samples_they_answer() -> TractResult<()> {
    let mut rng = Rng(29);
    let runnable = runnable(&model(&mut rng), "N,2,3,W,f32", 3)?;
    assert!(runnable.measured_costs().is_none());
    let widths: Vec<usize> = (0..300).map(|i| 1 + (i * 53) % 120).collect();
    let inputs = samples(&mut rng, &[2, 3, 1], 2, &widths);
    let batched = runnable.run(&inputs)?;
    assert_eq!(batched.len(), 300);
    let costs = runnable.measured_costs().context("no costs measured")?;
    let sizes: Vec<usize> = costs.points.iter().map(|p| p.0).collect();
    assert_eq!(sizes[0], 1, "{costs:?}");
    assert!(sizes.windows(2).all(|w| w[1] == 2 * w[0]), "{costs:?}");
    assert!(costs.points.iter().all(|p| p.1 > 0.0), "{costs:?}");
    // A larger size is kept only where it measured at least 5% cheaper per cell.
    assert!(
        costs.points.windows(2).all(|w| w[1].1 <= 0.95 * w[0].1),
        "{costs:?}"
    );
    assert_eq!(
        Schedule::for_runnable(&runnable).costs,
        tract_ragged::schedule::Costs::Measured(costs)
    );
    let alone = runnable.run_one_by_one(&inputs)?;
    for (ix, (b, a)) in batched.iter().zip(&alone).enumerate() {
        assert_eq!(b[0].shape(), a[0].shape(), "sample {ix}");
        for (x, y) in b.iter().zip(a) {
            assert!(rel_diff(x, y) <= 1e-5, "sample {ix}");
        }
    }
    Ok(())
}

/// Runs of one runnable from many threads at once: each answered as alone. A pool of
/// lanes runs one call at a time; without that, a lane waiting inside tract's kernels ran
/// another call's lane nested and aborted the process (tract's per-thread scratch space
/// borrowed twice).
#[test]
fn many_threads_run_one_runnable_at_once() -> TractResult<()> {
    let path = crate::common::root().join("fixtures/zoo/tv_mobilenet_v3.onnx");
    let options = tract_ragged::Options::default()
        .input_fact("N,3,64,W,f32")
        .lanes(2);
    let runnable = tract_ragged::open(&path, "x:3".parse()?, &options)?;
    let lines = samples(
        &mut Rng(5),
        &[3, 64, 1],
        2,
        &[33, 40, 57, 64, 71, 96, 45, 88],
    );
    let alone = runnable.run_one_by_one(&lines)?;
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..8)
            .map(|k| {
                let (runnable, lines) = (&runnable, &lines);
                s.spawn(move || {
                    let mine: Vec<&Tensor> = (0..6).map(|i| &lines[(k + i) % 8]).collect();
                    (k, runnable.run(&mine))
                })
            })
            .collect();
        for run in runs {
            let (k, outputs) = run.join().expect("a thread panicked");
            let outputs = outputs?;
            let mine: Vec<TVec<Tensor>> = (0..6).map(|i| alone[(k + i) % 8].clone()).collect();
            let worst = crate::common::max_difference(&outputs, &mine);
            assert!(worst <= 1e-5, "thread {k}: {worst}");
        }
        Ok(())
    })
}

/// Where a new plan is priced (the server's gatherings), the cut runs batches on the
/// plans the runnable holds: three samples of one width run as the 2 + 1 it holds plans
/// for, not as one batch of 3 needing a plan of its own (unpriced, one batch); each
/// sample still gets what it gets alone, and no plan is prepared.
#[test]
fn a_priced_new_plan_makes_the_cut_use_the_plans_held() -> TractResult<()> {
    let mut rng = Rng(31);
    let runnable = runnable(&model(&mut rng), "N,2,3,W,f32", 3)?;
    let inputs = samples(&mut rng, &[2, 3, 1], 2, &[40, 40, 40]);
    runnable.run_batch(&inputs[..2])?;
    runnable.run_batch(&inputs[..1])?;
    assert_eq!(runnable.cached_plans(), 2);
    let sizes = |schedule: &Schedule| -> TractResult<Vec<usize>> {
        let mut sizes: Vec<usize> = schedule
            .plan(&runnable, &[40, 40, 40])?
            .iter()
            .map(|b| b.samples.len())
            .collect();
        sizes.sort();
        Ok(sizes)
    };
    let plain = Schedule::fixed(1 << 40, None, 1 << 20);
    assert_eq!(sizes(&plain)?, [3]);
    let priced = Schedule {
        new_plan: 1e12,
        ..plain
    };
    assert_eq!(sizes(&priced)?, [1, 2]);
    let batched = runnable.run_scheduled(&inputs, &priced)?;
    assert_eq!(runnable.cached_plans(), 2);
    let alone = runnable.run_one_by_one(&inputs)?;
    for (ix, (b, a)) in batched.iter().zip(&alone).enumerate() {
        for (x, y) in b.iter().zip(a) {
            assert!(rel_diff(x, y) <= 1e-5, "sample {ix}");
        }
    }
    Ok(())
}

/// Where a new plan is priced, a batch whose plan is not held runs on a larger plan held,
/// filled up with copies of a sample, while what its shape paid that way in extra cells
/// stays below a new plan's price; then it prepares its own. Each sample gets what it gets
/// alone either way.
#[test]
fn a_batch_rents_a_larger_plan_held_until_its_own_would_have_cost_less() -> TractResult<()> {
    let mut rng = Rng(33);
    let runnable = runnable(&model(&mut rng), "N,2,3,W,f32", 3)?;
    let held = samples(&mut rng, &[2, 3, 1], 2, &[40, 40, 40]);
    runnable.run_batch(&held)?;
    assert_eq!(runnable.prepared_plans(), 1);
    let padded = runnable.padded_extents(&[40]);
    let two = samples(&mut rng, &[2, 3, 1], 2, &[31, 37]);
    assert_eq!(runnable.padded_extents(&[37]), padded, "one width bucket");
    // The held plan of 3 has one sample's cells more than a batch of the two.
    let extra = padded.iter().product::<usize>() as f64;
    let priced = Schedule {
        new_plan: 1.5 * extra,
        ..Schedule::fixed(1 << 40, None, 0)
    };
    let alone = runnable.run_one_by_one(&two)?;
    let check = |batched: &[TVec<Tensor>]| {
        assert_eq!(batched.len(), 2);
        for (ix, (b, a)) in batched.iter().zip(&alone).enumerate() {
            assert_eq!(b.len(), a.len());
            for (x, y) in b.iter().zip(a) {
                assert_eq!(x.shape(), y.shape(), "sample {ix}");
                assert!(rel_diff(x, y) <= 1e-5, "sample {ix}");
            }
        }
    };
    // (The samples alone ran on plans of their own.)
    let before = runnable.prepared_plans();
    // Rented: no plan prepared.
    check(&runnable.run_scheduled(&two, &priced)?);
    assert_eq!(runnable.prepared_plans(), before);
    // A second time would pay twice a sample's cells, above the price: its own plan.
    check(&runnable.run_scheduled(&two, &priced)?);
    assert_eq!(runnable.prepared_plans(), before + 1);
    // Unpriced, nothing is rented: a batch of one prepares its own.
    let unpriced = Schedule::fixed(1 << 40, None, 0);
    runnable.run_scheduled(&two[..1], &unpriced)?;
    assert_eq!(runnable.prepared_plans(), before + 2);
    Ok(())
}

/// No new plan is priced before the runnable ran a batch; after, on the host's measured
/// costs too, in seconds. (What a price is from the measurements: the unit test of
/// `Schedule::new_plan_cost`; here it would rest on timings.)
#[test]
fn new_plans_are_priced_once_the_runnable_prepared_one() -> TractResult<()> {
    let mut rng = Rng(32);
    let runnable = runnable(&model(&mut rng), "N,2,3,W,f32", 3)?;
    let fixed = Schedule::fixed(1 << 40, None, 64);
    assert_eq!(fixed.counting_new_plans(&runnable).new_plan, 0.0);
    let widths: Vec<usize> = (0..60).map(|i| 1 + (i * 53) % 120).collect();
    runnable.run(samples(&mut rng, &[2, 3, 1], 2, &widths))?;
    let host = Schedule::for_runnable(&runnable);
    assert!(matches!(host.costs, Costs::Measured(_)), "{host:?}");
    let price = host.counting_new_plans(&runnable).new_plan;
    assert!(price > 0.0 && price < 60.0, "{price} s");
    Ok(())
}

/// A schedule's `on_cut` is told the cut its run makes, once, before the batches run: the
/// same batches as the schedule's plan of those widths, every sample in one of them, and
/// the widths their indices point into.
#[test]
fn on_cut_is_told_the_cut_that_runs() -> TractResult<()> {
    let mut rng = Rng(41);
    let runnable = runnable(&model(&mut rng), "N,2,3,W,f32", 3)?;
    let widths = [5usize, 40, 9, 33, 14, 3, 22, 7, 11, 30, 2, 17];
    let inputs = samples(&mut rng, &[2, 3, 1], 2, &widths);
    // Each batch told: its samples' widths, sorted, and its padded width.
    type Told = Vec<(Vec<usize>, usize)>;
    let told: Arc<std::sync::Mutex<Told>> = Arc::default();
    let mut schedule = Schedule::fixed(1 << 40, Some(4), 64);
    let planned = schedule.plan(&runnable, &widths)?;
    let keep = told.clone();
    schedule.on_cut = Some(tract_ragged::schedule::OnCut(Arc::new(
        move |batches, w| {
            let mut keep = keep.lock().unwrap();
            for b in batches {
                // The widths of the batch's samples, sorted as the plan lists them.
                let mut ws: Vec<usize> = b.samples.iter().map(|i| w[*i][0]).collect();
                ws.sort();
                keep.push((ws, b.padded));
            }
        },
    )));
    let outputs = runnable.run_scheduled(&inputs, &schedule)?;
    let mut told = told.lock().unwrap().clone();
    let mut expected: Told = planned
        .iter()
        .map(|b| {
            let mut ws: Vec<usize> = b.samples.iter().map(|i| widths[*i]).collect();
            ws.sort();
            (ws, b.padded)
        })
        .collect();
    told.sort();
    expected.sort();
    assert_eq!(told, expected);
    assert!(told.len() >= 3, "{told:?}");
    each_as_alone(&runnable, &inputs, &outputs)
}

/// On the host, a sample run on its own (a server's gathering of one request) runs on the
/// ragged plan of its width's bucket: samples of 40 widths prepare a plan per bucket, not
/// one per width, and each gets what it gets alone.
#[test]
fn single_samples_share_their_width_buckets_plans() -> TractResult<()> {
    let mut rng = Rng(43);
    let runnable = runnable(&model(&mut rng), "N,2,3,W,f32", 3)?;
    let widths: Vec<usize> = (0..40).map(|i| 41 + 2 * i).collect();
    let inputs = samples(&mut rng, &[2, 3, 1], 2, &widths);
    let mut outputs = vec![];
    for sample in &inputs {
        outputs.extend(runnable.run(vec![sample.clone()])?);
    }
    let buckets: std::collections::HashSet<usize> = widths
        .iter()
        .map(|w| runnable.bucketing.round(*w))
        .collect();
    assert!(buckets.len() < 20, "{buckets:?}");
    assert_eq!(runnable.prepared_plans(), buckets.len() as u64);
    each_as_alone(&runnable, &inputs, &outputs)
}

/// Each sample's first output within 1e-5 (relative) of the sample run alone.
fn each_as_alone(
    runnable: &RaggedRunnable,
    inputs: &[Tensor],
    outputs: &[TVec<Tensor>],
) -> TractResult<()> {
    let alone = runnable.run_one_by_one(inputs)?;
    assert_eq!(outputs.len(), alone.len());
    for (ix, (o, a)) in outputs.iter().zip(&alone).enumerate() {
        assert!(rel_diff(&o[0], &a[0]) <= 1e-5, "sample {ix}");
    }
    Ok(())
}

/// A timeline shows where one by one's wall clock goes: a prepare span for each plan the
/// run prepared (on whichever thread prepared it) and a run span for each sample.
#[test]
fn a_timeline_shows_one_by_ones_plans_prepared_and_runs() -> TractResult<()> {
    let mut rng = Rng(31);
    let runnable = runnable_on_cpu(&mut rng)?;
    // Widths no other test of this binary uses: spans of other tests' runs may land in
    // the recording too.
    let widths = [101, 103, 107, 109, 113];
    let inputs = samples(&mut rng, &[2, 3, 1], 2, &widths);
    let (alone, timeline) = tract_ragged::timeline::record(|| runnable.run_one_by_one(&inputs));
    alone?;
    let mine = |phase: tract_ragged::timeline::Phase| {
        let mut spans: Vec<usize> = timeline
            .spans
            .iter()
            .filter(|s| s.phase == phase && s.samples == 1 && widths.contains(&s.extents[0]))
            .map(|s| s.extents[0])
            .collect();
        spans.sort();
        spans
    };
    assert_eq!(mine(tract_ragged::timeline::Phase::Prepare), widths);
    assert_eq!(mine(tract_ragged::timeline::Phase::Run), widths);
    assert!(timeline.summary().contains("prepare"));
    Ok(())
}

/// The host backend, but running every batch shape on one plan of the symbolic model, as
/// ragged-cuda does with `TRACT_RAGGED_SYMBOLIC_PLANS`.
#[derive(Debug)]
struct SymbolicPlans;

impl tract_ragged::backend::Backend for SymbolicPlans {
    fn name(&self) -> &'static str {
        "host, symbolic plans"
    }

    fn upload(&self, samples: &[&Tensor], axes: &[usize], padded: &[usize]) -> TractResult<TValue> {
        HostBackend.upload(samples, axes, padded)
    }

    fn download(
        &self,
        outputs: &[TValue],
        layouts: &[tract_ragged::transform::OutputLayout],
        n: usize,
    ) -> TractResult<Vec<TVec<Tensor>>> {
        HostBackend.download(outputs, layouts, n)
    }

    fn memory_budget(&self) -> u64 {
        HostBackend.memory_budget()
    }

    fn cost_model(&self) -> tract_ragged::backend::CostModel {
        HostBackend.cost_model()
    }

    fn time_nodes(
        &self,
        state: &mut TypedSimpleState,
        inputs: TVec<TValue>,
    ) -> TractResult<tract_ragged::backend::NodeTimes> {
        HostBackend.time_nodes(state, inputs)
    }

    fn symbolic_plans(&self) -> bool {
        true
    }
}

/// A backend running symbolic plans gets one plan for every batch shape, ragged and one
/// by one, each sample what per-shape plans give it, and no new plan priced in the cut.
#[test]
fn one_symbolic_plan_runs_every_batch_shape() -> TractResult<()> {
    let mut rng = Rng(31);
    let proto = model(&mut rng);
    let per_shape = runnable(&proto, "N,2,3,W,f32", 3)?;
    let symbolic = RaggedModel::new(common::typed(&proto, "N,2,3,W,f32")?, RaggedSpec::new(0, 3))?
        .into_runnable_on(&DefaultRuntime, Arc::new(SymbolicPlans))?;
    let widths: Vec<usize> = (0..60).map(|i| 1 + (i * 37) % 90).collect();
    let inputs = samples(&mut rng, &[2, 3, 1], 2, &widths);
    let expected = per_shape.run(&inputs)?;
    let found = symbolic.run(&inputs)?;
    let found_batch = symbolic.run_batch(&inputs[..7])?;
    let alone = symbolic.run_one_by_one(&inputs[..9])?;
    let expected_alone = per_shape.run_one_by_one(&inputs[..9])?;
    for (ix, (f, e)) in found.iter().zip(&expected).enumerate() {
        for (x, y) in f.iter().zip(e) {
            assert!(rel_diff(x, y) <= 1e-5, "sample {ix}");
        }
    }
    for (ix, (f, e)) in found_batch.iter().zip(&expected).enumerate() {
        assert!(rel_diff(&f[0], &e[0]) <= 1e-5, "sample {ix} in a batch");
    }
    for (ix, (f, e)) in alone.iter().zip(&expected_alone).enumerate() {
        assert!(rel_diff(&f[0], &e[0]) <= 1e-5, "sample {ix} alone");
    }
    // One plan for the ragged batches, one for the samples alone.
    assert_eq!(symbolic.prepared_plans(), 2);
    assert!(per_shape.prepared_plans() > 2);
    let schedule = Schedule::for_runnable(&symbolic).counting_new_plans(&symbolic);
    assert_eq!(schedule.new_plan, 0.0);
    Ok(())
}

/// The exporters' token encoders (the zoo's, DeBERTa's relative attention included) run
/// on one symbolic plan per variant: each sequence in a ragged batch and alone what
/// per-shape plans give it alone.
#[test]
fn symbolic_plans_run_the_zoos_token_encoders() -> TractResult<()> {
    for name in ["hf_deberta", "hf_deberta_v2", "hf_bert", "hf_t5_encoder"] {
        let path = common::root().join(format!("fixtures/zoo/{name}.onnx"));
        let model = load_onnx(&path, Some("N,L,i64"))?;
        let per_shape =
            RaggedModel::new(model.clone(), RaggedSpec::new("input_ids", 1))?.into_runnable()?;
        let symbolic = RaggedModel::new(model, RaggedSpec::new("input_ids", 1))?
            .into_runnable_on(&DefaultRuntime, Arc::new(SymbolicPlans))?;
        let samples = common::token_samples(&mut Rng(17), &[16, 5, 40, 23, 1]);
        let expected = per_shape
            .run_one_by_one(Samples::ordered(&samples))
            .context("per shape")?;
        let batched = symbolic
            .run_batch(Samples::ordered(&samples))
            .context("symbolic, batched")?;
        let alone = symbolic
            .run_one_by_one(Samples::ordered(&samples))
            .context("symbolic, alone")?;
        for (ix, (e, (b, a))) in expected.iter().zip(batched.iter().zip(&alone)).enumerate() {
            for ((e, b), a) in e.iter().zip(b).zip(a) {
                assert!(rel_diff(b, e) <= 1e-5, "{name}: sample {ix} in a batch");
                assert!(rel_diff(a, e) <= 1e-5, "{name}: sample {ix} alone");
            }
        }
        assert_eq!(symbolic.prepared_plans(), 2, "{name}");
    }
    Ok(())
}
