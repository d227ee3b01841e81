//! `tract-ragged serve`: one model behind the Open Inference Protocol over HTTP and gRPC
//! (`tract_ragged::serve`), until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use tract_core::internal::*;
use tract_ragged::serve::{ServeOptions, Server, grpc, http};

use crate::model::ModelArgs;
use crate::run::parse_size;

/// The largest HTTP/2 frame the gRPC server takes (SETTINGS_MAX_FRAME_SIZE; 16 KB unless
/// said): a request carries its samples whole (a text line, about 300 KB of f32), and in
/// 16 KB frames each one costs both ends a frame and its writes per 16 KB. With 1 MB, a
/// served model that costs little answered 25-30% more requests a second under 128
/// clients on 2 cores, with a fifth less of the server's CPU (benches/NOTES.md).
const MAX_FRAME: u32 = 1 << 20;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Where to listen for HTTP (KServe v2 REST, Triton's binary tensor data).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8000")]
    pub http: SocketAddr,
    /// Where to listen for gRPC (KServe v2's inference.GRPCInferenceService), if anywhere.
    #[arg(long, value_name = "ADDR")]
    pub grpc: Option<SocketAddr>,
    /// The model's name in the protocol's paths (default: the file's stem).
    #[arg(long)]
    pub name: Option<String>,
    /// How long a request that comes while another run is in flight waits for others to
    /// join its run, in milliseconds (with nothing running it runs at once; while the
    /// device is busy its gathering keeps growing until it is not).
    #[arg(long, value_name = "MS", default_value_t = 5)]
    pub max_delay_ms: u64,
    /// At most N samples per batch (by default, as many as memory and the cost model say).
    #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_batch: Option<usize>,
    /// At most N samples gathered into one run (its batches cut by the scheduler).
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub max_gather: usize,
    /// At most Q requests waiting; more are refused with 429.
    #[arg(long, value_name = "Q", default_value_t = 256)]
    pub max_queue: usize,
    /// The largest request body: bytes, or with a K, M or G suffix.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "256M")]
    pub max_body: u64,
    /// Memory the batches may take: bytes, or with a K, M or G suffix (default: 80% of
    /// the available RAM; on cuda, of the device's free memory).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub memory: Option<u64>,
    /// The deadline of a request that sets none (`parameters.timeout`), in milliseconds.
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// At most N prepared plans kept (one per batch shape: samples and padded extents),
    /// the least recently used dropped; concurrent requests of many widths make many
    /// shapes. `tract_ragged_prepared_plans` in /metrics counts those prepared.
    #[arg(long, value_name = "N", default_value = "32")]
    pub plans: usize,
    /// Threads that gather requests and run them, a gathering each at a time: while one
    /// runs, the next gathers behind it [default: the runtime's: 2 on the CPU, 8 on
    /// ragged-cuda].
    #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub gatherers: Option<usize>,
    /// Threads of the request path (HTTP and gRPC: reading, decoding and answering
    /// requests) [default: one per core]. They share the host's cores with the lanes
    /// that run the batches.
    #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub io_threads: Option<usize>,
}

pub fn serve(args: ServeArgs) -> TractResult<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let mut options = args.model.options(&[]);
    if let Some(memory) = args.memory {
        options = options.memory(memory);
    }
    if let Some(n) = args.max_batch {
        options = options.max_batch(n);
    }
    let runnable =
        crate::model::prepare_options(&args.model, &options)?.with_plan_capacity(args.plans);
    let name = match &args.name {
        Some(name) => name.clone(),
        None => args
            .model
            .model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .context("The model's path has no file name: give --name")?,
    };
    let server = Arc::new(Server::new(
        runnable,
        ServeOptions {
            name: name.clone(),
            max_delay: Duration::from_millis(args.max_delay_ms),
            max_gather: args.max_gather,
            max_queue: args.max_queue,
            max_body: usize::try_from(args.max_body).unwrap_or(usize::MAX),
            timeout: args.timeout_ms.map(Duration::from_millis),
            gatherers: args.gatherers,
        },
    )?);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(n) = args.io_threads {
        builder.worker_threads(n);
    }
    let runtime = builder.build().context("Starting the server's runtime")?;
    let server_for_signal = server.clone();
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.http)
            .await
            .with_context(|| format!("Listening on {}", args.http))?;
        let addr = listener.local_addr()?;
        // As for gRPC below: no answer held back by Nagle's algorithm.
        let listener = listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!("TCP_NODELAY on a connection: {e}");
            }
        });
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let wait = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        let grpc = match args.grpc {
            Some(at) => {
                let incoming = tokio::net::TcpListener::bind(at)
                    .await
                    .with_context(|| format!("Listening on {at}"))?;
                tracing::info!(grpc = %incoming.local_addr()?, "serving gRPC");
                let service = grpc::service(server.clone());
                let shutdown = wait(stopped.clone());
                Some(tokio::spawn(async move {
                    // TCP_NODELAY: an answer goes out as several HTTP/2 frames written
                    // apart, and Nagle's algorithm would hold the last ones until the
                    // client's delayed acknowledgement (40 ms a request on Linux).
                    let incoming = tonic::transport::server::TcpIncoming::from(incoming)
                        .with_nodelay(Some(true));
                    tonic::transport::Server::builder()
                        .max_frame_size(MAX_FRAME)
                        .add_service(service)
                        .serve_with_incoming_shutdown(incoming, shutdown)
                        .await
                }))
            }
            None => None,
        };
        tracing::info!(model = %name, http = %addr, "serving");
        tokio::spawn(async move {
            stop_signal(server_for_signal).await;
            let _ = stop.send(true);
        });
        axum::serve(listener, http::router(server.clone()))
            .with_graceful_shutdown(wait(stopped))
            .await
            .context("Serving HTTP")?;
        if let Some(grpc) = grpc {
            grpc.await
                .context("The gRPC server's task")?
                .context("Serving gRPC")?;
        }
        TractResult::Ok(())
    })?;
    server.shutdown();
    tracing::info!("stopped");
    Ok(())
}

/// Resolves at SIGINT or SIGTERM, after marking the server not ready (requests in flight
/// finish; new ones are refused).
async fn stop_signal(server: Arc<Server>) {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {}
        _ = terminate => {}
    }
    tracing::info!("shutting down: finishing the requests in flight");
    server.stop_taking();
}
