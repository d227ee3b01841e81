//! The Open Inference Protocol's gRPC API (tonic): KServe's
//! `inference.GRPCInferenceService` (proto/grpc_predict_v2.proto), as Triton's clients
//! call it.
//!
//! A gRPC request becomes the same request the REST routes read (`InferRequest`):
//! `raw_input_contents` as binary data, typed `contents` as JSON values, the parameters
//! as JSON values. So both protocols share one set of checks, one batcher and one way of
//! failing. Outputs always go back as `raw_output_contents`, as Triton sends them. A
//! request's deadline is its `timeout` parameter (microseconds) or the call's own
//! (`grpc-timeout`), whichever comes first. Failures map to status codes: invalid
//! argument (400), not found (404), resource exhausted (429), deadline exceeded (504),
//! unavailable (503), internal (500).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tonic::{Request, Response, Status};

use super::batcher::Failure;
use super::tensors::{self, InferRequest, RequestInput, RequestOutput};
use super::{Refusal, Server};

/// The code tonic generated from proto/grpc_predict_v2.proto.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
#[doc(hidden)]
pub mod proto {
    tonic::include_proto!("inference");
}

use proto::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use proto::infer_parameter::ParameterChoice;
use proto::model_metadata_response::TensorMetadata;
use proto::*;

/// The gRPC service over `server`, accepting messages up to its `max_body`.
pub fn service(server: Arc<Server>) -> GrpcInferenceServiceServer<Grpc> {
    let limit = server.options().max_body;
    GrpcInferenceServiceServer::new(Grpc { server })
        .max_decoding_message_size(limit)
        .max_encoding_message_size(usize::MAX)
}

/// The service (module doc).
pub struct Grpc {
    server: Arc<Server>,
}

fn status(r: &Refusal) -> Status {
    let message = r.message();
    match r {
        Refusal::Malformed(_) | Refusal::Failed(Failure::BadRequest(_)) => {
            Status::invalid_argument(message)
        }
        Refusal::NoSuchModel(_) => Status::not_found(message),
        Refusal::Busy => Status::resource_exhausted(message),
        Refusal::Failed(Failure::Timeout) => Status::deadline_exceeded(message),
        Refusal::Failed(Failure::Unavailable) => Status::unavailable(message),
        Refusal::Failed(Failure::Internal(_)) => Status::internal(message),
    }
}

fn known(server: &Server, name: &str) -> Result<(), Status> {
    if name == server.options().name {
        Ok(())
    } else {
        Err(status(&Refusal::NoSuchModel(name.to_string())))
    }
}

/// A parameter as the JSON value the REST routes would have read.
fn parameter(p: &InferParameter) -> Value {
    match &p.parameter_choice {
        Some(ParameterChoice::BoolParam(b)) => Value::from(*b),
        Some(ParameterChoice::Int64Param(i)) => Value::from(*i),
        Some(ParameterChoice::StringParam(s)) => Value::from(s.clone()),
        Some(ParameterChoice::DoubleParam(d)) => Value::from(*d),
        Some(ParameterChoice::Uint64Param(u)) => Value::from(*u),
        None => Value::Null,
    }
}

fn params_of(map: &std::collections::HashMap<String, InferParameter>) -> tensors::Parameters {
    map.iter().map(|(k, v)| (k.clone(), parameter(v))).collect()
}

/// A tensor's typed contents as the flat JSON array the REST routes read, from the field
/// of its datatype.
fn contents(datatype: &str, c: &InferTensorContents) -> Option<Value> {
    Some(match datatype {
        "BOOL" => Value::from(c.bool_contents.clone()),
        "INT8" | "INT16" | "INT32" => Value::from(c.int_contents.clone()),
        "INT64" => Value::from(c.int64_contents.clone()),
        "UINT8" | "UINT16" | "UINT32" => Value::from(c.uint_contents.clone()),
        "UINT64" => Value::from(c.uint64_contents.clone()),
        "FP32" => Value::from(c.fp32_contents.clone()),
        "FP64" => Value::from(c.fp64_contents.clone()),
        _ => return None,
    })
}

/// The gRPC call's own deadline (`grpc-timeout`: digits and a unit), if it has one.
fn call_deadline<T>(request: &Request<T>) -> Option<Duration> {
    let value = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The REST form of a gRPC inference request, with its inputs' raw bytes.
fn request_of(
    message: &ModelInferRequest,
    call_deadline: Option<Duration>,
) -> Result<InferRequest, Refusal> {
    let malformed = |m: String| Refusal::Malformed(m);
    let raw = &message.raw_input_contents;
    if !raw.is_empty() && raw.len() != message.inputs.len() {
        return Err(malformed(format!(
            "{} raw_input_contents for {} inputs",
            raw.len(),
            message.inputs.len()
        )));
    }
    let inputs = message
        .inputs
        .iter()
        .enumerate()
        .map(|(i, input)| {
            let mut parameters = params_of(&input.parameters);
            let data = if raw.is_empty() {
                let c = input.contents.as_ref().ok_or_else(|| {
                    malformed(format!(
                        "input {:?}: no contents and no raw contents",
                        input.name
                    ))
                })?;
                Some(contents(&input.datatype, c).ok_or_else(|| {
                    malformed(format!(
                        "input {:?}: datatype {:?} has no typed contents (send raw_input_contents)",
                        input.name, input.datatype
                    ))
                })?)
            } else {
                if input.contents.is_some() {
                    return Err(malformed(format!(
                        "input {:?}: both contents and raw_input_contents",
                        input.name
                    )));
                }
                parameters.insert("binary_data_size".into(), Value::from(raw[i].len()));
                None
            };
            Ok(RequestInput {
                name: input.name.clone(),
                shape: input.shape.clone(),
                datatype: input.datatype.clone(),
                parameters,
                data,
            })
        })
        .collect::<Result<Vec<_>, Refusal>>()?;
    let mut parameters = params_of(&message.parameters);
    if let Some(call) = call_deadline {
        let call = u64::try_from(call.as_micros()).unwrap_or(u64::MAX);
        let earliest = match parameters.get("timeout").and_then(Value::as_u64) {
            Some(given) => given.min(call),
            None => call,
        };
        if parameters
            .get("timeout")
            .is_none_or(|v| v.as_u64().is_some())
        {
            parameters.insert("timeout".into(), Value::from(earliest));
        }
    }
    Ok(InferRequest {
        id: (!message.id.is_empty()).then(|| message.id.clone()),
        parameters,
        inputs,
        outputs: (!message.outputs.is_empty()).then(|| {
            message
                .outputs
                .iter()
                .map(|o| RequestOutput {
                    name: o.name.clone(),
                    parameters: params_of(&o.parameters),
                })
                .collect()
        }),
    })
}

#[tonic::async_trait]
impl GrpcInferenceService for Grpc {
    async fn server_live(
        &self,
        _: Request<ServerLiveRequest>,
    ) -> Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _: Request<ServerReadyRequest>,
    ) -> Result<Response<ServerReadyResponse>, Status> {
        Ok(Response::new(ServerReadyResponse {
            ready: self.server.ready(),
        }))
    }

    async fn model_ready(
        &self,
        request: Request<ModelReadyRequest>,
    ) -> Result<Response<ModelReadyResponse>, Status> {
        known(&self.server, &request.get_ref().name)?;
        Ok(Response::new(ModelReadyResponse {
            ready: self.server.ready(),
        }))
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(ServerMetadataResponse {
            name: "tract-ragged".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: vec!["binary_tensor_data".into()],
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        known(&self.server, &request.get_ref().name)?;
        let meta = self.server.metadata();
        let tensors = |all: Vec<super::TensorMetadata>| -> Vec<TensorMetadata> {
            all.into_iter()
                .map(|t| TensorMetadata {
                    name: t.name,
                    datatype: t.datatype.into(),
                    shape: t.shape,
                })
                .collect()
        };
        Ok(Response::new(ModelMetadataResponse {
            name: meta.name,
            versions: meta.versions,
            platform: meta.platform.into(),
            inputs: tensors(meta.inputs),
            outputs: tensors(meta.outputs),
        }))
    }

    async fn model_infer(
        &self,
        request: Request<ModelInferRequest>,
    ) -> Result<Response<ModelInferResponse>, Status> {
        let started = std::time::Instant::now();
        let deadline = call_deadline(&request);
        let message = request.into_inner();
        let server = &self.server;
        let answered = |outcome: &str| {
            server
                .metrics()
                .answered(outcome, started.elapsed().as_secs_f64())
        };
        let refused = |r: Refusal| {
            answered(r.outcome());
            status(&r)
        };
        if message.model_name != server.options().name {
            return Err(refused(Refusal::NoSuchModel(message.model_name.clone())));
        }
        let rest = request_of(&message, deadline).map_err(refused)?;
        let raw: Vec<Option<&[u8]>> = if message.raw_input_contents.is_empty() {
            vec![None; message.inputs.len()]
        } else {
            message
                .raw_input_contents
                .iter()
                .map(|b| Some(&b[..]))
                .collect()
        };
        let outputs = server.infer(&rest, &raw).await.map_err(refused)?;
        let mut response = ModelInferResponse {
            model_name: message.model_name.clone(),
            model_version: message.model_version.clone(),
            id: message.id.clone(),
            ..Default::default()
        };
        for (name, tensor) in outputs {
            let mut bytes = Vec::new();
            tensors::append_le_bytes(&tensor, &mut bytes).map_err(|e| {
                refused(Refusal::Failed(Failure::Internal(format!(
                    "output {name:?}: {e:#}"
                ))))
            })?;
            response
                .outputs
                .push(model_infer_response::InferOutputTensor {
                    name,
                    datatype: tensors::datatype_name(tensor.datum_type())
                        .unwrap_or("?")
                        .into(),
                    shape: tensor.shape().iter().map(|d| *d as i64).collect(),
                    ..Default::default()
                });
            response.raw_output_contents.push(bytes);
        }
        answered("ok");
        Ok(Response::new(response))
    }
}
