//! The server's gRPC protocol (feature `serve`): Rust types, the service trait and a client
//! for KServe's `inference.GRPCInferenceService`, from proto/grpc_predict_v2.proto. protox
//! parses the file in Rust: no protoc needed.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "serve")]
    grpc();
}

#[cfg(feature = "serve")]
fn grpc() {
    println!("cargo:rerun-if-changed=proto/grpc_predict_v2.proto");
    let descriptors = protox::compile(["grpc_predict_v2.proto"], ["proto"])
        .unwrap_or_else(|e| panic!("proto/grpc_predict_v2.proto: {e}"));
    tonic_prost_build::configure()
        .build_server(true)
        // The client (`tract-ragged load`) over any transport: the CLI brings tonic's
        // channel, the library alone does not.
        .build_client(true)
        .build_transport(false)
        // A request's tensors as `Bytes`: decoded as slices of tonic's buffer, not copied
        // out of it (a text line is about 300 KB).
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .compile_fds(descriptors)
        .unwrap_or_else(|e| panic!("generating the gRPC code: {e}"));
}
