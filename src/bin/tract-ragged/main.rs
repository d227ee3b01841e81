//! `tract-ragged`: run models on ragged batches from the command line.

#![deny(clippy::undocumented_unsafe_blocks)]

use std::process::ExitCode;
use tract_ragged::error::ErrorKind;

use clap::{Parser, Subcommand};
use tract_core::internal::*;
use tract_ragged::Device;

mod bench;
mod demo;
#[cfg(unix)]
mod interrupt;
mod load;
mod model;
mod profile;
mod run;
mod serve;
mod widen;

#[derive(Parser, Debug)]
#[command(
    name = "tract-ragged",
    version,
    about = "Exact variable-width batching for tract: every sample of a batch gets what it would get alone"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run samples through a model as ragged batches.
    #[command(
        after_help = "Example:\n  tract-ragged run rec.onnx --ragged x:3 --input-fact N,3,48,W,f32 \\\n      --samples lines.npz --out probs.npz"
    )]
    Run(run::RunArgs),
    /// Per-node timings of one ragged batch of random samples (device time on cuda).
    #[command(
        after_help = "Example:\n  tract-ragged profile rec.onnx --ragged x:3 --input-fact N,3,48,W,f32 \\\n      --widths 120,320,77 --runtime cuda"
    )]
    Profile(profile::ProfileArgs),
    /// Lines per second: ragged exact batches vs padded batches vs one by one.
    #[command(
        after_help = "Example:\n  tract-ragged bench rec.onnx --ragged x:3 --input-fact N,3,48,W,f32 \\\n      --lines fixtures/lines --repeat 4 --runtime cuda"
    )]
    Bench(bench::BenchArgs),
    /// PP-OCRv4 rec on the project's text lines: ragged batch, one by one and naive padding.
    #[command(
        after_help = "Example:\n  tract-ragged demo --model assets/ppocr/ch_PP-OCRv4_rec_infer.onnx --lines fixtures/lines"
    )]
    Demo(demo::DemoArgs),
    /// Writes the model with its int32 casts of shapes widened to int64, for tract's own
    /// loader and CLI (which then type it with a symbolic batch and width).
    #[command(
        after_help = "Example:\n  tract-ragged widen rec.onnx rec-widened.onnx\n  tract rec-widened.onnx -i N,3,48,W,f32 -t 'ragged(input: \"x\", axis: 3)' dump --profile"
    )]
    Widen(widen::WidenArgs),
    /// Serve a model over the Open Inference Protocol (KServe v2, as Triton clients speak
    /// it), requests batched exactly: each answer is its request's alone.
    #[command(
        after_help = "Example:\n  tract-ragged serve rec.onnx --ragged x:3 --input-fact N,3,48,W,f32 --http 127.0.0.1:8000"
    )]
    Serve(serve::ServeArgs),
    /// Load a server (`serve --grpc`) from many clients at once: samples/s and latency
    /// percentiles, closed loop or at an offered rate, answers checked where asked.
    #[command(
        after_help = "Example:\n  tract-ragged load 127.0.0.1:8001 --model rec --samples lines.npz --rounds 10 \\\n      --concurrency 64 --expect alone.npz"
    )]
    Load(load::LoadArgs),
}

/// Keeps freed memory in the process for the next batch.
///
/// A batch's outputs are hundreds of megabytes of fresh host tensors, which glibc serves
/// with `mmap` and hands back to the OS once freed: every batch would page-fault its
/// outputs in anew (40% of the crop's time on a 2-core machine, benches/NOTES.md).
/// Raising the thresholds keeps those pages for the next batch; the memory a run peaks at
/// stays the process's. A library user decides that for their own process.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; called first thing in main, before
    // any thread is spawned.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

/// What the last panic said and where: printed, in one line, if it ends the command.
static LAST_PANIC: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Runs `command`, every error and any panic escaping it one line on stderr.
/// The exit status of a failed command, by the kind of its error (README "Exit status"):
/// 1 for the model's, tract's and I/O errors, 4 for a refusal of the ragged transform, 5
/// for a sample that does not fit, 6 for out of memory (2: a usage error, 3: some samples
/// failed under `--keep-going`).
fn exit_status(e: &TractError) -> u8 {
    match tract_ragged::error::kind(e) {
        ErrorKind::Refused => 4,
        ErrorKind::BadSample => 5,
        ErrorKind::OutOfMemory => 6,
        ErrorKind::Io | ErrorKind::Model => 1,
    }
}

fn report(command: impl FnOnce() -> TractResult<()>) -> ExitCode {
    // A panic caught on the way (tract's, turned into an error naming what was being done)
    // is the error's to report: the hook only keeps the message.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        if let Ok(mut last) = LAST_PANIC.lock() {
            *last = Some(format!("{msg}{at}"));
        }
    }));
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(command)) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => match e.downcast_ref::<run::SamplesFailed>() {
            Some(partial) => {
                for (ix, name, reason) in &partial.failed {
                    eprintln!("error: sample {ix} ({name:?}): {}", one_line(reason));
                }
                eprintln!("error: {partial}");
                ExitCode::from(3)
            }
            None => {
                eprintln!("error: {}", one_line(&format!("{e:#}")));
                ExitCode::from(exit_status(&e))
            }
        },
        Err(_) => {
            // A panic is a bug, but the user still gets one line and a failing status.
            let last = LAST_PANIC.lock().ok().and_then(|l| l.clone());
            eprintln!(
                "error: internal error (a bug in tract-ragged or tract): {}",
                one_line(&last.unwrap_or_default())
            );
            ExitCode::FAILURE
        }
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl Command {
    /// The runtime the command runs its model on, where it runs one.
    fn runtime(&self) -> Option<Device> {
        match self {
            Command::Run(args) => Some(args.model.runtime),
            Command::Profile(args) => Some(args.model.runtime),
            Command::Bench(args) => Some(args.model.runtime),
            Command::Demo(args) => Some(args.runtime),
            Command::Widen(_) => None,
            Command::Serve(args) => Some(args.model.runtime),
            Command::Load(_) => None,
        }
    }
}

/// The host allocator on a device runtime: one arena for every thread, and the memory
/// runs free kept for the next runs.
///
/// glibc gives threads arenas of their own, and a block goes back to the arena it came
/// from: the lane that crops a batch's outputs is rarely the one that cropped that batch
/// last run, so its arena faults fresh pages in. And glibc hands large blocks and the
/// heap's top back to the OS, so each run faults its outputs' pages in anew. One arena,
/// blocks up to 32 MiB from the heap and no trim below 2 GiB free keep them; the process
/// keeps its peak of host memory until it exits. Not on the CPU runtime, where every lane
/// allocates its nodes' tensors and these settings are slower. Measurements:
/// benches/NOTES.md, "The host allocator on a device runtime".
fn device_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters (for the arenas made and the blocks
    // allocated and freed from now on); called before any lane or copy thread is spawned.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX);
    }
}

/// tract-linalg's instruction sets as this CPU's matrix products want them, unless the user
/// set `TRACT_CPU_ISA` ([`tract_ragged::backend::preferred_isa_edit`]).
fn matmul_kernels() {
    if std::env::var_os("TRACT_CPU_ISA").is_none()
        && let Some(edit) = tract_ragged::backend::preferred_isa_edit()
    {
        // SAFETY: called first thing in main, before any thread is spawned: nothing reads
        // the environment concurrently.
        unsafe { std::env::set_var("TRACT_CPU_ISA", edit) };
    }
}

fn main() -> ExitCode {
    keep_freed_memory();
    matmul_kernels();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            // clap's usage errors are several lines (the error, the usage, a hint): the
            // error and where to look, in one.
            let rendered = e.render().to_string();
            let error: Vec<&str> = rendered
                .lines()
                .skip_while(|l| l.trim().is_empty())
                .take_while(|l| !l.trim().is_empty())
                .collect();
            let error = one_line(&error.join(" "));
            let error = error.strip_prefix("error: ").unwrap_or(&error);
            eprintln!("error: {error} (see tract-ragged --help)");
            return ExitCode::from(2);
        }
    };
    if cli.command.runtime().is_some_and(|r| r != Device::Cpu) {
        device_allocator();
    }
    report(|| match cli.command {
        Command::Run(args) => run::run(args),
        Command::Demo(args) => demo::demo(args),
        Command::Profile(args) => profile::profile(args),
        Command::Bench(args) => bench::bench(args),
        Command::Widen(args) => widen::widen(args),
        Command::Serve(args) => serve::serve(args),
        Command::Load(args) => load::load(args),
    })
}
