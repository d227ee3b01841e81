//! An inference server whose batches never change an answer: the Open Inference Protocol
//! (KServe v2, as Triton speaks it) over HTTP, with exact dynamic batching.
//!
//! Servers batch concurrent requests to use the hardware, and requests of different sizes
//! are then padded together: a client's answer depends on who else was in the batch. Here
//! concurrent requests, each of its own width and count of samples, are gathered for at
//! most `max_delay` and run through the runnable's scheduler as ragged batches
//! (`batcher`): every response is what its request gets alone. Existing clients
//! (`tritonclient`, KServe's) work unchanged: health, server and model metadata, model
//! readiness and `infer`, with tensors in JSON or as binary data after the JSON header
//! (`tensors`, [`http`]).
//!
//! A request's tensors carry its samples on their first axis: `[n, ...]` for an input
//! each sample gives (the ragged input, per-sample inputs), whole for a shared input; its
//! outputs come back the same way, `[n, ...]`. Everything a client sends is checked
//! before it is queued (names, types, ranks, the model's fixed extents, sizes against the
//! body): a request that does not fit is answered 400 naming the input at fault, and the
//! server goes on. The queue is bounded (429 when full), requests may carry a deadline
//! (`parameters.timeout` in microseconds, as `tritonclient` sends it), and shutdown
//! finishes the requests in flight.

pub(crate) mod batcher;
pub mod grpc;
pub mod http;
pub(crate) mod metrics;
pub(crate) mod tensors;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tract_core::internal::*;

use crate::RaggedRunnable;
use crate::inputs::InputSlot;
use crate::schedule::Schedule;
use crate::transform::InputRole;
use batcher::{Batcher, Failure, Gathering, Job, Reply, Submit};
use metrics::Metrics;
use tensors::{InferRequest, Malformed, datatype_name};

/// The platform the model metadata names.
const PLATFORM: &str = "onnx_tract_ragged";

/// A model's metadata, as both protocols give it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelMetadata {
    /// The model's name in the protocol's paths.
    pub name: String,
    /// Its versions (one).
    pub versions: Vec<String>,
    /// What runs it.
    pub platform: &'static str,
    /// Its inputs.
    pub inputs: Vec<TensorMetadata>,
    /// Its outputs.
    pub outputs: Vec<TensorMetadata>,
}

/// An input or output in the metadata: `-1` for an extent each request chooses.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TensorMetadata {
    /// Its name.
    pub name: String,
    /// Its element type, in the protocol's names.
    pub datatype: &'static str,
    /// Its extents, samples first where it has samples.
    pub shape: Vec<i64>,
}

/// How a server gathers and bounds its work.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The model's name in the protocol's paths.
    pub name: String,
    /// How long a request waits for others to join its run behind a run in flight; longer
    /// only while the lanes are busy (`batcher`'s module doc).
    pub max_delay: Duration,
    /// The most samples one run takes.
    pub max_gather: usize,
    /// The most requests waiting; more are refused (HTTP 429).
    pub max_queue: usize,
    /// The largest request body, in bytes.
    pub max_body: usize,
    /// The deadline of a request that sets none.
    pub timeout: Option<Duration>,
    /// The threads that gather requests and run them, each a gathering at a time: while
    /// one runs, the next gathers behind it. None: the backend's
    /// ([`crate::backend::Backend::gatherers`]: 2 on the CPU, 8 on ragged-cuda).
    pub gatherers: Option<usize>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            name: "model".into(),
            max_delay: Duration::from_millis(5),
            max_gather: 1024,
            max_queue: 256,
            max_body: 256 << 20,
            timeout: None,
            gatherers: None,
        }
    }
}

/// One model served (module doc): its runnable behind a batcher.
pub struct Server {
    options: ServeOptions,
    inputs: Vec<InputSlot>,
    outputs: Vec<(String, DatumType)>,
    output_shapes: Vec<Vec<i64>>,
    runnable: Arc<RaggedRunnable>,
    batcher: Batcher,
    metrics: Arc<Metrics>,
    closing: AtomicBool,
}

/// Why a request was not answered with outputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// It does not fit the protocol or the model (400).
    Malformed(String),
    /// No model of that name here (404).
    NoSuchModel(String),
    /// The queue is full (429).
    Busy,
    /// It failed as [`Failure`] says.
    Failed(Failure),
}

impl Refusal {
    /// The outcome it is counted as ([`metrics::OUTCOMES`]).
    pub(crate) fn outcome(&self) -> &'static str {
        match self {
            Refusal::Malformed(_) | Refusal::Failed(Failure::BadRequest(_)) => "bad_request",
            Refusal::NoSuchModel(_) => "not_found",
            Refusal::Busy => "busy",
            Refusal::Failed(Failure::Timeout) => "timeout",
            Refusal::Failed(Failure::Unavailable) => "unavailable",
            Refusal::Failed(Failure::Internal(_)) => "internal",
        }
    }

    /// One line for the client.
    pub(crate) fn message(&self) -> String {
        match self {
            Refusal::Malformed(m) => m.clone(),
            Refusal::NoSuchModel(name) => format!("no model named {name:?} here"),
            Refusal::Busy => "the server's queue is full: retry later".into(),
            Refusal::Failed(f) => f.message(),
        }
    }
}

impl From<Malformed> for Refusal {
    fn from(m: Malformed) -> Self {
        Refusal::Malformed(m.0)
    }
}

/// A request counted in `tract_ragged_requests_in_flight` until dropped: however `infer`
/// returns, a client gone away included (its future is then dropped).
struct InFlight<'a>(&'a prometheus::IntGauge);

impl<'a> InFlight<'a> {
    fn count(gauge: &'a prometheus::IntGauge) -> InFlight<'a> {
        gauge.inc();
        InFlight(gauge)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Server {
    /// Serves `runnable` as `options` say; starts its batcher.
    pub fn new(runnable: RaggedRunnable, options: ServeOptions) -> TractResult<Server> {
        let inputs = runnable.input_slots()?;
        let outputs = runnable.output_slots()?;
        for (name, dt) in &outputs {
            ensure!(
                datatype_name(*dt).is_some(),
                "Output {name:?} is of {dt:?}, which the inference protocol cannot carry"
            );
        }
        for slot in &inputs {
            ensure!(
                datatype_name(slot.fact.datum_type).is_some(),
                "Input {:?} is of {:?}, which the inference protocol cannot carry",
                slot.name,
                slot.fact.datum_type
            );
        }
        let output_shapes = output_shapes(&runnable)?;
        let metrics = Arc::new(Metrics::new().context("Registering the server's metrics")?);
        let gatherers = options
            .gatherers
            .unwrap_or_else(|| runnable.backend().gatherers())
            .max(1);
        // The lanes have work enough (the batcher's module doc): on a device whose runs
        // take turns, one gathering running and one ready; on the host, one per lane.
        let lanes = Schedule::for_runnable(&runnable).lanes.max(1);
        let busy = match crate::backend::turns::taken(runnable.backend().as_ref()) {
            true => lanes.min(2),
            false => lanes,
        };
        let runnable = Arc::new(runnable);
        let batcher = Batcher::start(
            runnable.clone(),
            Gathering {
                max_delay: options.max_delay,
                max_gather: options.max_gather.max(1),
                max_queue: options.max_queue.max(1),
                gatherers,
                busy,
            },
            metrics.clone(),
        )?;
        Ok(Server {
            options,
            inputs,
            outputs,
            output_shapes,
            runnable,
            batcher,
            metrics,
            closing: AtomicBool::new(false),
        })
    }

    /// The options it serves with.
    pub fn options(&self) -> &ServeOptions {
        &self.options
    }

    /// Whether it takes requests (not shutting down).
    pub fn ready(&self) -> bool {
        !self.closing.load(Ordering::SeqCst)
    }

    /// The server's metrics.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The metrics in Prometheus' text format, the memory budget read now.
    pub fn render_metrics(&self) -> String {
        self.metrics.render(
            self.runnable.backend().memory_budget(),
            self.runnable.prepared_plans(),
            // What the cut prices a batch with: the fit, where the backend's costs use it.
            match self.runnable.backend().cost_model().fitted {
                true => self
                    .runnable
                    .fitted_overhead()
                    .map_or(0, |(cells, _)| cells),
                false => 0,
            },
        )
    }

    /// Stops taking requests: readiness says so, and new requests are refused (503).
    pub fn stop_taking(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    /// Stops taking requests and finishes those queued.
    pub fn shutdown(&self) {
        self.closing.store(true, Ordering::SeqCst);
        self.batcher.close();
    }

    /// The model's metadata: its inputs and outputs as the protocol describes them, `-1`
    /// for the extents a request chooses (the first, samples, and the ragged ones).
    pub fn metadata(&self) -> ModelMetadata {
        let inputs = self
            .inputs
            .iter()
            .map(|slot| {
                let mut shape: Vec<i64> = slot
                    .fact
                    .dims
                    .iter()
                    .map(|d| d.map(|d| d as i64).unwrap_or(-1))
                    .collect();
                if !matches!(slot.role, InputRole::Shared) {
                    shape.insert(0, -1);
                }
                TensorMetadata {
                    name: slot.name.clone(),
                    datatype: datatype_name(slot.fact.datum_type).unwrap_or("?"),
                    shape,
                }
            })
            .collect();
        let outputs = self
            .outputs
            .iter()
            .zip(&self.output_shapes)
            .map(|((name, dt), shape)| TensorMetadata {
                name: name.clone(),
                datatype: datatype_name(*dt).unwrap_or("?"),
                shape: shape.clone(),
            })
            .collect();
        ModelMetadata {
            name: self.options.name.clone(),
            versions: vec!["1".into()],
            platform: PLATFORM,
            inputs,
            outputs,
        }
    }

    /// Runs `request` (its JSON header, and the binary data of each input that declares
    /// some, in order) through the batcher: its outputs by name, or why not.
    pub(crate) async fn infer(
        &self,
        request: &InferRequest,
        binary: &[Option<&[u8]>],
    ) -> Result<Vec<(String, Tensor)>, Refusal> {
        if !self.ready() {
            return Err(Refusal::Failed(Failure::Unavailable));
        }
        let _in_flight = InFlight::count(&self.metrics.in_flight);
        let (job, reply) = self.job(request, binary)?;
        match self.batcher.submit(job) {
            Submit::Queued => {}
            Submit::Busy => return Err(Refusal::Busy),
            Submit::Closed => return Err(Refusal::Failed(Failure::Unavailable)),
        }
        let outputs = reply
            .await
            .map_err(|_| {
                Refusal::Failed(Failure::Internal("the batcher dropped the request".into()))
            })?
            .map_err(Refusal::Failed)?;
        self.select_outputs(request, outputs)
    }

    /// A job for `request`, checked against the model (module doc), and where its reply
    /// will come.
    fn job(
        &self,
        request: &InferRequest,
        binary: &[Option<&[u8]>],
    ) -> Result<(Job, tokio::sync::oneshot::Receiver<Reply>), Refusal> {
        for (i, input) in request.inputs.iter().enumerate() {
            if request.inputs[..i]
                .iter()
                .any(|other| other.name == input.name)
            {
                return Err(Refusal::Malformed(format!(
                    "input {:?} given twice",
                    input.name
                )));
            }
            if !self.inputs.iter().any(|slot| slot.name == input.name) {
                return Err(Refusal::Malformed(format!(
                    "input {:?} is not an input of the model (it takes {:?})",
                    input.name,
                    self.inputs.iter().map(|s| &s.name).collect::<Vec<_>>()
                )));
            }
        }
        let mut per_sample = Vec::new();
        let mut shared = Vec::new();
        let mut n: Option<usize> = None;
        for slot in &self.inputs {
            let name = &slot.name;
            let at = request
                .inputs
                .iter()
                .position(|i| &i.name == name)
                .ok_or_else(|| Refusal::Malformed(format!("input {name:?} is missing")))?;
            let tensor =
                tensors::input_tensor(&request.inputs[at], binary.get(at).copied().flatten())?;
            if tensor.datum_type() != slot.fact.datum_type {
                return Err(Refusal::Malformed(format!(
                    "input {name:?} is {}, the model takes {}",
                    request.inputs[at].datatype,
                    datatype_name(slot.fact.datum_type).unwrap_or("?")
                )));
            }
            if matches!(slot.role, InputRole::Shared) {
                shared.push((name.clone(), tensor));
                continue;
            }
            let Some(&count) = tensor.shape().first() else {
                return Err(Refusal::Malformed(format!(
                    "input {name:?} is a scalar: its first axis is the request's samples"
                )));
            };
            match n {
                Some(n) if n != count => {
                    return Err(Refusal::Malformed(format!(
                        "input {name:?} holds {count} samples, another input {n}"
                    )));
                }
                _ => n = Some(count),
            }
            let malformed = |e: TractError| Refusal::Malformed(format!("input {name:?}: {e:#}"));
            let mut tensor = tensor;
            if count == 1 {
                // One sample (a request a line): checked in place, no copy.
                tensor.remove_axis(0).map_err(malformed)?;
                slot.fact
                    .check_sample(0, &tensor, None)
                    .map_err(malformed)?;
                tensor.insert_axis(0).map_err(malformed)?;
            } else if count > 1 {
                let mut first = tensor.slice(0, 0, 1).map_err(malformed)?;
                first.remove_axis(0).map_err(malformed)?;
                // The request's samples share a shape: its first stands for all of them.
                slot.fact.check_sample(0, &first, None).map_err(malformed)?;
            }
            per_sample.push((name.clone(), tensor));
        }
        let n = n.unwrap_or(0);
        if n == 0 {
            return Err(Refusal::Malformed("the request holds no samples".into()));
        }
        if let Some(outputs) = &request.outputs {
            for o in outputs {
                if !self.outputs.iter().any(|(name, _)| name == &o.name) {
                    return Err(Refusal::Malformed(format!(
                        "output {:?} is not an output of the model (it has {:?})",
                        o.name,
                        self.outputs.iter().map(|(n, _)| n).collect::<Vec<_>>()
                    )));
                }
            }
        }
        let deadline = match request.parameters.get("timeout") {
            None => self.options.timeout,
            Some(v) => Some(Duration::from_micros(v.as_u64().ok_or_else(|| {
                Refusal::Malformed(format!(
                    "parameter timeout {v} is not a count of microseconds"
                ))
            })?)),
        }
        .map(|d| Instant::now() + d);
        let (reply, receiver) = tokio::sync::oneshot::channel();
        Ok((
            Job {
                inputs: per_sample,
                shared,
                n,
                deadline,
                queued: Instant::now(),
                reply,
            },
            receiver,
        ))
    }

    /// The outputs `request` asks for, in its order (all, in the model's, if it names none).
    fn select_outputs(
        &self,
        request: &InferRequest,
        outputs: TVec<Tensor>,
    ) -> Result<Vec<(String, Tensor)>, Refusal> {
        let mut all: Vec<(String, Option<Tensor>)> = self
            .outputs
            .iter()
            .map(|(name, _)| name.clone())
            .zip(outputs.into_iter().map(Some))
            .collect();
        let wanted: Vec<String> = match &request.outputs {
            Some(o) => o.iter().map(|o| o.name.clone()).collect(),
            None => all.iter().map(|(n, _)| n.clone()).collect(),
        };
        wanted
            .into_iter()
            .map(|name| {
                let slot = all.iter_mut().find(|(n, _)| n == &name);
                let tensor = slot.and_then(|(_, t)| t.take()).ok_or_else(|| {
                    Refusal::Malformed(format!("output {name:?} asked for twice or missing"))
                })?;
                Ok((name, tensor))
            })
            .collect()
    }
}

/// Each output's shape for the metadata: a sample's (its batch axis removed), after
/// `-1` for the request's samples; `-1` for every extent the model leaves symbolic.
fn output_shapes(runnable: &RaggedRunnable) -> TractResult<Vec<Vec<i64>>> {
    let ragged = &runnable.model().ragged;
    ragged.model.outputs[..ragged.outputs.len()]
        .iter()
        .zip(&ragged.outputs)
        .map(|(o, layout)| {
            let fact = ragged.model.outlet_fact(*o)?;
            let sample = fact
                .shape
                .iter()
                .enumerate()
                .filter(|(axis, _)| Some(*axis) != layout.batch)
                .map(|(_, d)| d.to_i64().unwrap_or(-1));
            Ok(std::iter::once(-1).chain(sample).collect())
        })
        .collect()
}
