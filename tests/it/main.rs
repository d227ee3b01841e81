//! The integration tests, as modules of one test binary: one link of tract instead of one
//! per file, and one process whose tests share what they prepare.
//!
//! Run a part by its module path, `cargo test --test it NAME::`:
//! - `assets::` needs the real models `scripts/fetch-assets.sh` fetches (PP-OCRv4 rec and
//!   det, silero VAD) and holds the slowest tests; `cli::widen_writes_...` and
//!   `precision::ppocr_...` read PP-OCRv4 rec too. Everything else runs on models built in
//!   code or kept in `fixtures/` (`cargo test --test it -- --skip assets::`).
//! - Tests that need a CUDA device are `#[ignore = "needs a CUDA device"]` wherever they
//!   are; most are in their own binary, `tests/cuda.rs`, which the GPU bundle carries
//!   (`../shared/gpu/bundle.sh --features cuda --test cuda`).
//! - `onnx_conformance` (onnx-tests/) is its own binary: its own harness over the ONNX
//!   backend node tests.

// Shared with tests/cuda.rs and examples/export_models.rs.
#[path = "../common/mod.rs"]
mod common;

mod architecture;
mod assets {
    mod detector;
    mod ppocr;
    mod vad;
}
mod bad_input;
mod cli;
mod elementwise;
mod encoders;
mod exactness;
mod front_ends;
mod host_ops;
mod independence;
mod options;
mod pads;
mod pages;
mod per_shape;
mod positions;
mod precision;
mod preparation;
mod profile;
mod readers;
mod recurrences;
mod reference;
mod refusals;
mod schedule;
mod segments;
mod several_inputs;
mod top_k;
mod tract_transform;
mod verbs;
