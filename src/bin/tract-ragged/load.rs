//! `tract-ragged load`: a server under load from many clients at once, as Triton's
//! `perf_analyzer` puts one: samples per second and latency percentiles over KServe v2's
//! gRPC API, each sample sent alone in its request.
//!
//! Two ways to load: closed loop (`--concurrency C` clients, each sending its next request
//! as soon as its answer comes: the server's saturation) and open loop (`--rate R`
//! requests a second arriving at random, Poisson, whatever the answers do: latency at an
//! offered load). The clients are Rust tasks over a few HTTP/2 connections, so that they
//! are not what limits the measure: Python's `tritonclient` (benches/serve.py) spends
//! more time per request than a GPU server does. With `--expect`, every answer is
//! compared with the sample's outputs run offline.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Mutex;
use tonic::transport::{Channel, Endpoint};
use tract_core::internal::*;
use tract_ragged::backend::{Backend, HostBackend};
use tract_ragged::npz;
use tract_ragged::serve::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use tract_ragged::serve::grpc::proto::model_infer_request::{
    InferInputTensor, InferRequestedOutputTensor,
};
use tract_ragged::serve::grpc::proto::{
    ModelInferRequest, ModelInferResponse, ModelMetadataRequest,
};

#[derive(clap::Args, Debug)]
pub struct LoadArgs {
    /// The server's gRPC address (`tract-ragged serve --grpc ADDR`), as host:port.
    pub addr: String,
    /// The model's name on the server.
    #[arg(long)]
    pub model: String,
    /// The samples, each sent alone in a request (with a batch axis of 1): one array per
    /// sample, without the batch axis, as `tract-ragged run` reads them.
    #[arg(long, value_name = "IN.npz")]
    pub samples: PathBuf,
    /// Each sample's outputs run offline (`tract-ragged run --samples IN.npz --out
    /// OUT.npz`, with or without --one-by-one): every answer is compared with them.
    #[arg(long, value_name = "OUT.npz")]
    pub expect: Option<PathBuf>,
    /// The largest difference to --expect an answer may have (0: the same bits).
    #[arg(long, default_value_t = 1e-4)]
    pub tolerance: f64,
    /// Timed rounds: every sample sent this many times.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub rounds: usize,
    /// Untimed rounds first, as the timed ones are sent (the server prepares its plans).
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Closed loop: this many clients, each sending its next request when its answer
    /// comes.
    #[arg(long, default_value_t = 32, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub concurrency: usize,
    /// Open loop instead: requests arriving at this rate (per second, Poisson), whatever
    /// the answers do.
    #[arg(long, value_name = "PER_SECOND")]
    pub rate: Option<f64>,
    /// HTTP/2 connections the clients share.
    #[arg(long, default_value_t = 4, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub connections: usize,
    /// Threads of the clients' runtime.
    #[arg(long, default_value_t = 4, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub threads: usize,
    /// The input the samples feed (default: the model's only input, from its metadata).
    #[arg(long)]
    pub input: Option<String>,
    /// A deadline per request, in milliseconds (the gRPC call's timeout).
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
}

/// What the clients saw over one set of requests.
#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    /// Failures by gRPC status code, and the first message of each.
    failures: Vec<(tonic::Code, usize, String)>,
    /// Answers that differ from --expect: (sample, what differs).
    wrong: Vec<(usize, String)>,
    checked: usize,
    largest_difference: f64,
}

impl Tally {
    fn failed(&mut self, status: &tonic::Status) {
        match self.failures.iter_mut().find(|f| f.0 == status.code()) {
            Some(f) => f.1 += 1,
            None => self
                .failures
                .push((status.code(), 1, status.message().to_string())),
        }
    }
}

/// What every request shares: the clients, the requests, the expected outputs.
struct Load {
    clients: Vec<GrpcInferenceServiceClient<Channel>>,
    requests: Vec<ModelInferRequest>,
    expected: Option<Vec<Vec<Tensor>>>,
    tolerance: f64,
    timeout: Option<Duration>,
}

impl Load {
    /// Sends sample `ix`'s request on connection `connection`; its latency, and whether
    /// its answer is the expected one, in `tally`.
    async fn send(&self, ix: usize, connection: usize, tally: &Mutex<Tally>) {
        let mut client = self.clients[connection % self.clients.len()].clone();
        let mut request = tonic::Request::new(self.requests[ix].clone());
        if let Some(t) = self.timeout {
            request.set_timeout(t);
        }
        let start = Instant::now();
        let answer = client.model_infer(request).await;
        let latency = start.elapsed();
        let mut tally = tally.lock().await;
        match answer {
            Err(status) => tally.failed(&status),
            Ok(answer) => {
                tally.latencies.push(latency);
                if let Some(expected) = &self.expected {
                    tally.checked += 1;
                    match compare(answer.get_ref(), &expected[ix], self.tolerance) {
                        Ok(d) => tally.largest_difference = tally.largest_difference.max(d),
                        Err(e) => tally.wrong.push((ix, format!("{e:#}"))),
                    }
                }
            }
        }
    }
}

/// The largest difference of an answer to a sample's expected outputs, or what differs
/// beyond `tolerance`.
fn compare(answer: &ModelInferResponse, expected: &[Tensor], tolerance: f64) -> TractResult<f64> {
    ensure!(
        answer.raw_output_contents.len() == expected.len(),
        "{} outputs, expected {}",
        answer.raw_output_contents.len(),
        expected.len()
    );
    let mut largest = 0f64;
    for (j, (raw, want)) in answer.raw_output_contents.iter().zip(expected).enumerate() {
        let shape: Vec<i64> = answer
            .outputs
            .get(j)
            .map(|o| o.shape.clone())
            .unwrap_or_default();
        // The answer carries the request's batch axis of 1; the archive does not.
        let want_shape: Vec<i64> = want.shape().iter().map(|&d| d as i64).collect();
        ensure!(
            shape.first() == Some(&1) && shape[1..] == want_shape[..],
            "output {j}: shape {shape:?}, expected [1, {want_shape:?}]"
        );
        let want_bytes = want.try_as_plain_ram()?.as_bytes();
        ensure!(
            raw.len() == want_bytes.len(),
            "output {j}: {} bytes, expected {}",
            raw.len(),
            want_bytes.len()
        );
        if want.datum_type() == f32::datum_type() {
            let want = want.try_as_plain_ram()?.as_slice::<f32>()?;
            for (i, (got, want)) in raw.chunks_exact(4).zip(want).enumerate() {
                let got = f32::from_le_bytes([got[0], got[1], got[2], got[3]]);
                let d = (got as f64 - *want as f64).abs();
                ensure!(
                    d <= tolerance || (got.is_nan() && want.is_nan()),
                    "output {j}, element {i}: {got}, expected {want}"
                );
                largest = largest.max(d);
            }
        } else {
            ensure!(
                raw[..] == want_bytes[..],
                "output {j}: other bits than expected"
            );
        }
    }
    Ok(largest)
}

/// Exponential waits of mean `1 / rate` seconds (Poisson arrivals), from a fixed seed so
/// that runs offer the same load.
fn arrivals(rate: f64, count: usize) -> Vec<Duration> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut at = 0f64;
    (0..count)
        .map(|_| {
            // xorshift64*: uniform in (0, 1].
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let u = ((state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 + 1.0)
                / (1u64 << 53) as f64;
            at += -u.ln() / rate;
            Duration::from_secs_f64(at)
        })
        .collect()
}

/// Sends `count` requests (sample `i % n` for the i-th), closed loop or at `rate`.
async fn round(load: &Arc<Load>, count: usize, args: &LoadArgs) -> TractResult<(Tally, Duration)> {
    let n = load.requests.len();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    match args.rate {
        None => {
            let next = Arc::new(AtomicUsize::new(0));
            for client in 0..args.concurrency {
                let (load, tally, next) = (load.clone(), tally.clone(), next.clone());
                tasks.spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= count {
                            break;
                        }
                        load.send(i % n, client, &tally).await;
                    }
                });
            }
        }
        Some(rate) => {
            ensure!(
                rate > 0.0 && rate.is_finite(),
                "--rate: a positive number of requests a second"
            );
            for (i, at) in arrivals(rate, count).into_iter().enumerate() {
                tokio::time::sleep_until((start + at).into()).await;
                let (load, tally) = (load.clone(), tally.clone());
                tasks.spawn(async move { load.send(i % n, i, &tally).await });
            }
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.context("A client's task")?;
    }
    let wall = start.elapsed();
    let tally = std::mem::take(&mut *tally.lock().await);
    Ok((tally, wall))
}

/// The latency of quantile `q` of sorted `latencies`, in milliseconds.
fn quantile_ms(latencies: &[Duration], q: f64) -> f64 {
    if latencies.is_empty() {
        return f64::NAN;
    }
    let ix = ((latencies.len() - 1) as f64 * q).round() as usize;
    latencies[ix].as_secs_f64() * 1e3
}

pub fn load(args: LoadArgs) -> TractResult<()> {
    let samples = npz::read_samples(&args.samples, HostBackend.memory_budget())?;
    ensure!(!samples.is_empty(), "{}: no sample", args.samples.display());
    let expected = match &args.expect {
        None => None,
        Some(path) => Some(expected_outputs(path, samples.len())?),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()
        .context("Starting the clients' runtime")?;
    runtime.block_on(async {
        let endpoint = Endpoint::from_shared(format!("http://{}", args.addr))
            .with_context(|| format!("{}: not a host:port", args.addr))?;
        let mut clients = vec![];
        for _ in 0..args.connections {
            let channel = endpoint
                .connect()
                .await
                .with_context(|| format!("Connecting to {}", args.addr))?;
            clients.push(
                GrpcInferenceServiceClient::new(channel).max_decoding_message_size(usize::MAX),
            );
        }
        let metadata = clients[0]
            .clone()
            .model_metadata(ModelMetadataRequest {
                name: args.model.clone(),
                version: String::new(),
            })
            .await
            .map_err(|s| format_err!("Model {:?}'s metadata: {}", args.model, s.message()))?
            .into_inner();
        let input = match &args.input {
            Some(name) => metadata
                .inputs
                .iter()
                .find(|i| &i.name == name)
                .with_context(|| format!("Model {:?} has no input {name:?}", args.model))?,
            None => {
                ensure!(
                    metadata.inputs.len() == 1,
                    "Model {:?} takes {} inputs per sample: name the samples' with --input",
                    args.model,
                    metadata.inputs.len()
                );
                &metadata.inputs[0]
            }
        };
        let requests = samples
            .iter()
            .map(|(name, t)| {
                let bytes = t
                    .try_as_plain_ram()
                    .with_context(|| format!("Sample {name:?}"))?
                    .as_bytes()
                    .to_vec();
                Ok(ModelInferRequest {
                    model_name: args.model.clone(),
                    inputs: vec![InferInputTensor {
                        name: input.name.clone(),
                        datatype: input.datatype.clone(),
                        shape: std::iter::once(1)
                            .chain(t.shape().iter().map(|&d| d as i64))
                            .collect(),
                        ..Default::default()
                    }],
                    outputs: metadata
                        .outputs
                        .iter()
                        .map(|o| InferRequestedOutputTensor {
                            name: o.name.clone(),
                            ..Default::default()
                        })
                        .collect(),
                    raw_input_contents: vec![bytes.into()],
                    ..Default::default()
                })
            })
            .collect::<TractResult<Vec<_>>>()?;
        let n = requests.len();
        let load = Arc::new(Load {
            clients,
            requests,
            expected,
            tolerance: args.tolerance,
            timeout: args.timeout_ms.map(Duration::from_millis),
        });
        let how = match args.rate {
            None => format!("closed loop, {} clients", args.concurrency),
            Some(rate) => format!("open loop, {rate} requests/s offered"),
        };
        println!(
            "{}: model {:?}, {n} samples a round, {} timed rounds after {} warm-up, {how}, {} connections",
            args.addr, args.model, args.rounds, args.warmup, args.connections
        );
        for _ in 0..args.warmup {
            let (tally, _) = round(&load, n, &args).await?;
            report_failures(&tally, "warm-up");
        }
        let (mut tally, wall) = round(&load, n * args.rounds, &args).await?;
        tally.latencies.sort();
        let answered = tally.latencies.len();
        let failed: usize = tally.failures.iter().map(|f| f.1).sum();
        println!(
            "answered {answered} of {} requests in {:.3} s: {:.1} samples/s",
            n * args.rounds,
            wall.as_secs_f64(),
            answered as f64 / wall.as_secs_f64()
        );
        println!(
            "latency ms: p50 {:.2}, p90 {:.2}, p99 {:.2}, max {:.2}",
            quantile_ms(&tally.latencies, 0.5),
            quantile_ms(&tally.latencies, 0.9),
            quantile_ms(&tally.latencies, 0.99),
            quantile_ms(&tally.latencies, 1.0)
        );
        report_failures(&tally, "timed");
        if let Some(path) = &args.expect {
            println!(
                "checked against {}: {} of {} answers within {:e} (largest difference {:.2e})",
                path.display(),
                tally.checked - tally.wrong.len(),
                tally.checked,
                args.tolerance,
                tally.largest_difference
            );
            for (ix, what) in tally.wrong.iter().take(5) {
                eprintln!("sample {ix} ({:?}): {what}", samples[*ix].0);
            }
        }
        ensure!(
            failed == 0 && tally.wrong.is_empty(),
            "{failed} requests failed, {} answers wrong",
            tally.wrong.len()
        );
        Ok(())
    })
}

fn report_failures(tally: &Tally, what: &str) {
    for (code, count, message) in &tally.failures {
        eprintln!("{what}: {count} requests failed with {code:?}, the first: {message}");
    }
}

/// Each of `n` samples' outputs in order, from an archive of `s{i}_o{j}` entries.
fn expected_outputs(path: &std::path::Path, n: usize) -> TractResult<Vec<Vec<Tensor>>> {
    let mut reader = npz::NpzReader::open(path)?;
    let mut found: Vec<Vec<(usize, Tensor)>> = vec![vec![]; n];
    for ix in 0..reader.entries().len() {
        let name = reader.entries()[ix].name.clone();
        let (i, j) = name
            .strip_prefix('s')
            .and_then(|rest| rest.split_once("_o"))
            .and_then(|(i, j)| Some((i.parse::<usize>().ok()?, j.parse::<usize>().ok()?)))
            .with_context(|| format!("{}: entry {name:?} is not s{{i}}_o{{j}}", path.display()))?;
        ensure!(
            i < n,
            "{}: entry {name:?} names sample {i} of {n}",
            path.display()
        );
        let t = reader.read(ix, HostBackend.memory_budget())?;
        found[i].push((j, t));
    }
    found
        .into_iter()
        .enumerate()
        .map(|(i, mut outs)| {
            ensure!(
                !outs.is_empty(),
                "{}: no output for sample {i}",
                path.display()
            );
            outs.sort_by_key(|o| o.0);
            Ok(outs.into_iter().map(|o| o.1).collect())
        })
        .collect()
}
