//! What the server did, for Prometheus (`GET /metrics`, the text exposition format).
//!
//! - `tract_ragged_requests_total{outcome}`: requests answered, by outcome (`ok`,
//!   `bad_request`, `not_found`, `busy`, `timeout`, `unavailable`, `internal`);
//! - `tract_ragged_request_seconds{outcome}`: from the request read to its answer;
//! - `tract_ragged_queue_depth`: requests waiting for a run;
//! - `tract_ragged_requests_in_flight`: requests read and not yet answered (waiting or
//!   running);
//! - `tract_ragged_run_samples`, `tract_ragged_run_seconds`: the samples of each gathered
//!   run and how long it took;
//! - `tract_ragged_batch_samples`: the samples of each batch the scheduler planned;
//! - `tract_ragged_batch_cells_total`, `tract_ragged_padding_cells_total`: the cells those
//!   batches ran and how many were padding (their ratio is the padding share);
//! - `tract_ragged_memory_budget_bytes`: what the backend gives the batches now (on a
//!   device, from its free memory);
//! - `tract_ragged_prepared_plans`: the plans the runnable prepared so far;
//! - `tract_ragged_batch_overhead_cells`: a batch's fixed part in padded cells as the
//!   cut prices it, fitted to the batches run (`crate::schedule::fit`; 0 until fitted,
//!   and where the backend prices batches otherwise, as the CPU does): the padding a
//!   batch must save to be cut in two, so what sets the batches' sizes;
//! - `tract_ragged_phase_seconds_total{phase}`, `tract_ragged_phases_total{phase}`: the
//!   time and count of each phase of the runs' batches (`check`, `schedule`, `upload`,
//!   `pack`, `turn`, `run`, `download`, `crop`, `prepare`, `hold`...; `crate::timeline`), since
//!   the server started: where a run's time goes under load. The process's: two servers
//!   in one process count each other's batches too;
//! - `tract_ragged_runtime_events_total{event}`: what the runtime did out of sight
//!   (`crate::counters`: graph captures, failed captures, replays, evictions, plain runs,
//!   plan states and convolution descriptors made),
//!   the process's too.

use std::sync::Mutex;
use std::time::Duration;

use prometheus::{
    CounterVec, Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder, exponential_buckets,
};

use crate::counters::{self, Event};
use crate::timeline::{self, Phase};

/// The server's metrics (module doc).
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    request_seconds: HistogramVec,
    request_wait_seconds: prometheus::Histogram,
    /// Requests waiting for a run.
    pub queue_depth: IntGauge,
    /// Requests read and not yet answered.
    pub in_flight: IntGauge,
    run_samples: prometheus::Histogram,
    run_seconds: prometheus::Histogram,
    batch_samples: prometheus::Histogram,
    batch_cells: IntCounter,
    padding_cells: IntCounter,
    memory_budget: IntGauge,
    prepared_plans: IntGauge,
    batch_overhead: IntGauge,
    phase_seconds: CounterVec,
    phases: IntCounterVec,
    /// The phases' totals as last counted (`timeline::totals`).
    phases_counted: Mutex<Vec<(Phase, Duration, u64)>>,
    events: IntCounterVec,
    /// The runtime's events as last counted (`counters::totals`).
    events_counted: Mutex<Vec<(Event, u64)>>,
}

/// The outcomes requests are counted by.
pub const OUTCOMES: [&str; 7] = [
    "ok",
    "bad_request",
    "not_found",
    "busy",
    "timeout",
    "unavailable",
    "internal",
];

impl Metrics {
    /// Every metric, registered, at zero.
    pub fn new() -> prometheus::Result<Metrics> {
        let registry = Registry::new();
        let seconds = exponential_buckets(0.0005, 2.0, 16)?;
        let counts = exponential_buckets(1.0, 2.0, 12)?;
        let requests = IntCounterVec::new(
            Opts::new(
                "tract_ragged_requests_total",
                "Requests answered, by outcome",
            ),
            &["outcome"],
        )?;
        let request_seconds = HistogramVec::new(
            HistogramOpts::new(
                "tract_ragged_request_seconds",
                "Seconds from a request read to its answer, by outcome",
            )
            .buckets(seconds.clone()),
            &["outcome"],
        )?;
        let queue_depth = IntGauge::new("tract_ragged_queue_depth", "Requests waiting for a run")?;
        let in_flight = IntGauge::new(
            "tract_ragged_requests_in_flight",
            "Requests read and not yet answered, waiting or running",
        )?;
        let histogram = |name: &str, help: &str, buckets: &Vec<f64>| {
            prometheus::Histogram::with_opts(
                HistogramOpts::new(name, help).buckets(buckets.clone()),
            )
        };
        let request_wait_seconds = histogram(
            "tract_ragged_request_wait_seconds",
            "Seconds from a request queued to the start of the gathered run that runs it",
            &seconds,
        )?;
        let run_samples = histogram(
            "tract_ragged_run_samples",
            "Samples of each gathered run",
            &counts,
        )?;
        let run_seconds = histogram(
            "tract_ragged_run_seconds",
            "Seconds each gathered run took",
            &seconds,
        )?;
        let batch_samples = histogram(
            "tract_ragged_batch_samples",
            "Samples of each batch the scheduler planned",
            &counts,
        )?;
        let batch_cells = IntCounter::new(
            "tract_ragged_batch_cells_total",
            "Cells (samples times padded extents) of the batches planned",
        )?;
        let padding_cells = IntCounter::new(
            "tract_ragged_padding_cells_total",
            "Cells of the batches planned that were padding",
        )?;
        let memory_budget = IntGauge::new(
            "tract_ragged_memory_budget_bytes",
            "Bytes the backend gives the batches now",
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(request_seconds.clone()))?;
        registry.register(Box::new(request_wait_seconds.clone()))?;
        registry.register(Box::new(queue_depth.clone()))?;
        registry.register(Box::new(in_flight.clone()))?;
        registry.register(Box::new(run_samples.clone()))?;
        registry.register(Box::new(run_seconds.clone()))?;
        registry.register(Box::new(batch_samples.clone()))?;
        registry.register(Box::new(batch_cells.clone()))?;
        registry.register(Box::new(padding_cells.clone()))?;
        let prepared_plans = IntGauge::new(
            "tract_ragged_prepared_plans",
            "Plans the runnable prepared so far, one per new batch shape (samples, padded extents)",
        )?;
        let batch_overhead = IntGauge::new(
            "tract_ragged_batch_overhead_cells",
            "A batch's fixed part in padded cells, fitted to the batches run, as the cut prices it (0 until fitted)",
        )?;
        registry.register(Box::new(memory_budget.clone()))?;
        registry.register(Box::new(prepared_plans.clone()))?;
        registry.register(Box::new(batch_overhead.clone()))?;
        let phase_seconds = CounterVec::new(
            Opts::new(
                "tract_ragged_phase_seconds_total",
                "Seconds spent in each phase of the runs' batches (the process's)",
            ),
            &["phase"],
        )?;
        let phases = IntCounterVec::new(
            Opts::new(
                "tract_ragged_phases_total",
                "Phases of the runs' batches gone through (the process's)",
            ),
            &["phase"],
        )?;
        registry.register(Box::new(phase_seconds.clone()))?;
        registry.register(Box::new(phases.clone()))?;
        let phases_counted = Mutex::new(timeline::totals());
        let events = IntCounterVec::new(
            Opts::new(
                "tract_ragged_runtime_events_total",
                "What the runtime did out of sight: graph captures, replays, evictions, plain runs, plan states and convolution descriptors made (the process's)",
            ),
            &["event"],
        )?;
        registry.register(Box::new(events.clone()))?;
        for event in Event::ALL {
            events.with_label_values(&[event.label()]);
        }
        let events_counted = Mutex::new(counters::totals());
        for (phase, _, _) in timeline::totals() {
            phase_seconds.with_label_values(&[phase.label()]);
            phases.with_label_values(&[phase.label()]);
        }
        for outcome in OUTCOMES {
            requests.with_label_values(&[outcome]);
        }
        Ok(Metrics {
            registry,
            requests,
            request_seconds,
            request_wait_seconds,
            queue_depth,
            in_flight,
            run_samples,
            run_seconds,
            batch_samples,
            batch_cells,
            padding_cells,
            memory_budget,
            prepared_plans,
            batch_overhead,
            phase_seconds,
            phases,
            phases_counted,
            events,
            events_counted,
        })
    }

    /// A request answered with `outcome` (one of [`OUTCOMES`]) after `seconds`.
    pub fn answered(&self, outcome: &str, seconds: f64) {
        self.requests.with_label_values(&[outcome]).inc();
        self.request_seconds
            .with_label_values(&[outcome])
            .observe(seconds);
    }

    /// A request whose gathered run started `seconds` after it was queued.
    pub fn waited(&self, seconds: f64) {
        self.request_wait_seconds.observe(seconds);
    }

    /// A gathered run of `samples`, which took `seconds`.
    pub fn ran(&self, samples: usize, seconds: f64) {
        self.run_samples.observe(samples as f64);
        self.run_seconds.observe(seconds);
    }

    /// A batch planned: its samples, its cells and how many of them are padding.
    pub fn planned(&self, samples: usize, cells: u64, padding: u64) {
        self.batch_samples.observe(samples as f64);
        self.batch_cells.inc_by(cells);
        self.padding_cells.inc_by(padding);
    }

    /// Adds what the phases took, and the runtime's events, since they were last counted.
    fn count_totals(&self) {
        let Ok(mut counted) = self.phases_counted.lock() else {
            return;
        };
        let now = timeline::totals();
        for (phase, took, n) in timeline::difference(&now, &counted) {
            let label = [phase.label()];
            self.phase_seconds
                .with_label_values(&label)
                .inc_by(took.as_secs_f64());
            self.phases.with_label_values(&label).inc_by(n);
        }
        *counted = now;
        drop(counted);
        let Ok(mut counted) = self.events_counted.lock() else {
            return;
        };
        let now = counters::totals();
        for (event, n) in counters::difference(&now, &counted) {
            self.events.with_label_values(&[event.label()]).inc_by(n);
        }
        *counted = now;
    }

    /// Every metric in the text exposition format, the memory budget, the plans
    /// prepared and the fitted batch overhead read now.
    pub fn render(&self, memory_budget: u64, prepared_plans: u64, batch_overhead: u64) -> String {
        self.memory_budget
            .set(i64::try_from(memory_budget).unwrap_or(i64::MAX));
        self.prepared_plans
            .set(i64::try_from(prepared_plans).unwrap_or(i64::MAX));
        self.batch_overhead
            .set(i64::try_from(batch_overhead).unwrap_or(i64::MAX));
        self.count_totals();
        let mut out = vec![];
        // Encoding into a Vec fails only on a metric family without metrics, which none is.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }
}
