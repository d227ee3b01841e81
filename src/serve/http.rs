//! The Open Inference Protocol's REST routes (axum), with Triton's binary tensor data
//! extension.
//!
//! - `GET /v2/health/live`, `GET /v2/health/ready` (503 while shutting down);
//! - `GET /v2`: the server's name, version and extensions;
//! - `GET /v2/models/{name}[/versions/{v}]`: the model's metadata;
//!   `.../ready`: whether it takes requests;
//! - `POST /v2/models/{name}[/versions/{v}]/infer`: a JSON request, or (with the header
//!   `Inference-Header-Content-Length: N`) a JSON header of N bytes followed by each
//!   binary input's bytes, in the order of the inputs declaring `binary_data_size`.
//!   Outputs come as JSON `data`, or as binary after the header where the request asks
//!   (`binary_data` on an output, `binary_data_output` on the request).
//!
//! - `GET /metrics`: Prometheus' text format (`super::metrics`).
//!
//! Errors are `{"error": "..."}` with 400 (malformed, or not fitting the model), 404 (no
//! such model), 429 (queue full), 503 (shutting down), 504 (deadline passed), 500 (the
//! run failed on the server's side).

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::batcher::Failure;
use super::tensors::{self, InferRequest, InferResponse, ResponseOutput, datatype_name};
use super::{Refusal, Server};

/// The header giving the JSON header's length in a binary request or response.
const HEADER_LENGTH: &str = "inference-header-content-length";

/// The server's routes over `server`.
pub fn router(server: Arc<Server>) -> Router {
    let limit = server.options().max_body;
    Router::new()
        .route(
            "/v2/health/live",
            get(|| async { Json::from(json!({"live": true})) }),
        )
        .route("/v2/health/ready", get(server_ready))
        .route("/v2", get(server_metadata))
        .route("/v2/models/{name}", get(model_metadata))
        .route(
            "/v2/models/{name}/versions/{version}",
            get(model_metadata_version),
        )
        .route("/v2/models/{name}/ready", get(model_ready))
        .route(
            "/v2/models/{name}/versions/{version}/ready",
            get(model_ready_version),
        )
        .route("/v2/models/{name}/infer", post(infer))
        .route("/metrics", get(metrics))
        .route(
            "/v2/models/{name}/versions/{version}/infer",
            post(infer_version),
        )
        .layer(DefaultBodyLimit::max(limit))
        .with_state(server)
}

type Json = axum::Json<Value>;

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({"error": message.into()}))).into_response()
}

fn refusal(r: Refusal) -> Response {
    let status = match &r {
        Refusal::Malformed(_) => StatusCode::BAD_REQUEST,
        Refusal::NoSuchModel(_) => StatusCode::NOT_FOUND,
        Refusal::Busy => StatusCode::TOO_MANY_REQUESTS,
        Refusal::Failed(Failure::BadRequest(_)) => StatusCode::BAD_REQUEST,
        Refusal::Failed(Failure::Timeout) => StatusCode::GATEWAY_TIMEOUT,
        Refusal::Failed(Failure::Unavailable) => StatusCode::SERVICE_UNAVAILABLE,
        Refusal::Failed(Failure::Internal(_)) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    if status.is_server_error() {
        tracing::warn!(status = status.as_u16(), "{}", r.message());
    } else {
        tracing::debug!(status = status.as_u16(), "{}", r.message());
    }
    error(status, r.message())
}

/// 404 unless `name` is the model served.
fn known(server: &Server, name: &str) -> Result<(), Box<Response>> {
    if name == server.options().name {
        Ok(())
    } else {
        Err(Box::new(refusal(Refusal::NoSuchModel(name.to_string()))))
    }
}

async fn server_ready(State(server): State<Arc<Server>>) -> Response {
    let ready = server.ready();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json::from(json!({"ready": ready}))).into_response()
}

async fn metrics(State(server): State<Arc<Server>>) -> Response {
    let text = server.render_metrics();
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        text,
    )
        .into_response()
}

async fn server_metadata() -> Json {
    Json::from(json!({
        "name": "tract-ragged",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": ["binary_tensor_data"],
    }))
}

async fn model_metadata(State(server): State<Arc<Server>>, Path(name): Path<String>) -> Response {
    match known(&server, &name) {
        Ok(()) => axum::Json(server.metadata()).into_response(),
        Err(r) => *r,
    }
}

async fn model_metadata_version(
    state: State<Arc<Server>>,
    Path((name, _)): Path<(String, String)>,
) -> Response {
    model_metadata(state, Path(name)).await
}

async fn model_ready(State(server): State<Arc<Server>>, Path(name): Path<String>) -> Response {
    if let Err(r) = known(&server, &name) {
        return *r;
    }
    server_ready(State(server)).await
}

async fn model_ready_version(
    state: State<Arc<Server>>,
    Path((name, _)): Path<(String, String)>,
) -> Response {
    model_ready(state, Path(name)).await
}

async fn infer_version(
    state: State<Arc<Server>>,
    Path((name, _)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    infer(state, Path(name), headers, body).await
}

async fn infer(
    State(server): State<Arc<Server>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = std::time::Instant::now();
    let answered = |outcome: &str, response: Response| {
        server
            .metrics()
            .answered(outcome, started.elapsed().as_secs_f64());
        response
    };
    if name != server.options().name {
        let r = Refusal::NoSuchModel(name);
        return answered(r.outcome(), refusal(r));
    }
    let (request, binary) = match parse(&headers, &body) {
        Ok(parsed) => parsed,
        Err(r) => return answered(r.outcome(), refusal(r)),
    };
    let binary: Vec<Option<&[u8]>> = binary.iter().map(|b| b.map(|(s, e)| &body[s..e])).collect();
    match server.infer(&request, &binary).await {
        Ok(outputs) => {
            let response = respond(&server, &request, outputs);
            let outcome = if response.status().is_success() {
                "ok"
            } else {
                "internal"
            };
            answered(outcome, response)
        }
        Err(r) => answered(r.outcome(), refusal(r)),
    }
}

/// The request's JSON header, and the byte range of each input's binary data in `body`.
#[allow(clippy::type_complexity)]
fn parse(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(InferRequest, Vec<Option<(usize, usize)>>), Refusal> {
    let malformed = |m: String| Refusal::Malformed(m);
    let header_len = match headers.get(HEADER_LENGTH) {
        None => body.len(),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .ok_or_else(|| malformed(format!("header {HEADER_LENGTH} is not a length: {v:?}")))?,
    };
    if header_len > body.len() {
        return Err(malformed(format!(
            "header {HEADER_LENGTH} says {header_len} bytes of JSON, the body has {}",
            body.len()
        )));
    }
    let request: InferRequest = serde_json::from_slice(&body[..header_len])
        .map_err(|e| malformed(format!("the request's JSON: {e}")))?;
    let mut at = header_len;
    let mut binary = Vec::with_capacity(request.inputs.len());
    for input in &request.inputs {
        match input.parameters.get("binary_data_size") {
            None => binary.push(None),
            Some(size) => {
                let size = size
                    .as_u64()
                    .and_then(|s| usize::try_from(s).ok())
                    .ok_or_else(|| {
                        malformed(format!(
                            "input {:?}: binary_data_size {size} is not a size",
                            input.name
                        ))
                    })?;
                let end = at
                    .checked_add(size)
                    .filter(|end| *end <= body.len())
                    .ok_or_else(|| {
                        malformed(format!(
                            "input {:?}: binary_data_size {size}, {} bytes left in the body",
                            input.name,
                            body.len() - at
                        ))
                    })?;
                binary.push(Some((at, end)));
                at = end;
            }
        }
    }
    if at != body.len() {
        return Err(malformed(format!(
            "{} bytes after the last input's data",
            body.len() - at
        )));
    }
    Ok((request, binary))
}

/// Whether output `name` goes back as binary data.
fn binary_output(request: &InferRequest, name: &str) -> bool {
    let flag = |p: &tensors::Parameters, key: &str| p.get(key).and_then(Value::as_bool);
    request
        .outputs
        .as_ref()
        .and_then(|o| o.iter().find(|o| o.name == name))
        .and_then(|o| flag(&o.parameters, "binary_data"))
        .or_else(|| flag(&request.parameters, "binary_data_output"))
        .unwrap_or(false)
}

fn respond(
    server: &Server,
    request: &InferRequest,
    outputs: Vec<(String, tract_core::internal::Tensor)>,
) -> Response {
    let mut blobs = Vec::new();
    let mut header = InferResponse {
        model_name: server.options().name.clone(),
        id: request.id.clone(),
        outputs: Vec::with_capacity(outputs.len()),
    };
    for (name, tensor) in outputs {
        let datatype = datatype_name(tensor.datum_type())
            .unwrap_or("?")
            .to_string();
        let mut parameters = tensors::Parameters::new();
        let mut data = None;
        let written = if binary_output(request, &name) {
            let before = blobs.len();
            tensors::append_le_bytes(&tensor, &mut blobs)
                .map(|()| parameters.insert("binary_data_size".into(), json!(blobs.len() - before)))
                .map(|_| ())
        } else {
            tensors::json_data(&tensor).map(|d| data = Some(d))
        };
        if let Err(e) = written {
            return refusal(Refusal::Failed(Failure::Internal(format!(
                "output {name:?}: {e:#}"
            ))));
        }
        header.outputs.push(ResponseOutput {
            name,
            datatype,
            shape: tensor.shape().to_vec(),
            parameters,
            data,
        });
    }
    let json = match serde_json::to_vec(&header) {
        Ok(json) => json,
        Err(e) => {
            return refusal(Refusal::Failed(Failure::Internal(format!(
                "the response: {e}"
            ))));
        }
    };
    if blobs.is_empty() {
        return (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            json,
        )
            .into_response();
    }
    let length = json.len();
    let mut body = json;
    body.extend_from_slice(&blobs);
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(HEADER_LENGTH, HeaderValue::from(length));
    response
}
