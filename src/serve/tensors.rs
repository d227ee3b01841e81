//! Tensors as the Open Inference Protocol carries them: a name, a datatype (`FP32`,
//! `INT64`...), a shape, and the elements either in the JSON body (`data`, a flat or
//! nested array in row-major order) or as raw little-endian bytes after it (Triton's
//! binary tensor data extension, `parameters.binary_data_size`, which `tritonclient` uses
//! by default).
//!
//! Nothing a client sends is trusted: a shape's element count is computed with checked
//! arithmetic and must equal the count of values given (JSON) or the bytes declared, and
//! declared bytes must lie within the body actually received, before anything is
//! allocated. Every failure is a [`Malformed`] naming the tensor at fault: the server
//! answers it with 400 and goes on serving.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tract_core::internal::*;

/// A request the server cannot read: its message names the tensor or field at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Malformed(pub String);

/// Fails with a [`Malformed`] saying `what` unless `cond` holds.
macro_rules! malformed {
    ($cond:expr, $($what:tt)+) => {
        if !$cond {
            return Err(Malformed(format!($($what)+)));
        }
    };
}

/// A request's or response's parameters: any JSON values by name.
pub type Parameters = serde_json::Map<String, Value>;

/// One input of an inference request, as the JSON header gives it.
#[derive(Clone, Debug, Deserialize)]
pub struct RequestInput {
    /// The model input it is for.
    pub name: String,
    /// Its extents, batch axis first.
    pub shape: Vec<i64>,
    /// Its element type, in the protocol's names.
    pub datatype: String,
    /// `binary_data_size` when its elements follow the JSON header.
    #[serde(default)]
    pub parameters: Parameters,
    /// Its elements in the JSON body.
    #[serde(default)]
    pub data: Option<Value>,
}

/// An output a request asks for.
#[derive(Clone, Debug, Deserialize)]
pub struct RequestOutput {
    /// The model output's name.
    pub name: String,
    /// `binary_data: true` to have it as raw bytes after the JSON header.
    #[serde(default)]
    pub parameters: Parameters,
}

/// An inference request's JSON header.
#[derive(Clone, Debug, Deserialize)]
pub struct InferRequest {
    /// Echoed in the response.
    #[serde(default)]
    pub id: Option<String>,
    /// `timeout` (microseconds), `binary_data_output`.
    #[serde(default)]
    pub parameters: Parameters,
    /// The inputs.
    pub inputs: Vec<RequestInput>,
    /// The outputs wanted (all of them when absent).
    #[serde(default)]
    pub outputs: Option<Vec<RequestOutput>>,
}

/// One output of a response's JSON header.
#[derive(Clone, Debug, Serialize)]
pub struct ResponseOutput {
    /// The model output's name.
    pub name: String,
    /// Its element type, in the protocol's names.
    pub datatype: String,
    /// Its extents, batch axis first.
    pub shape: Vec<usize>,
    /// `binary_data_size` when its bytes follow the header.
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub parameters: Parameters,
    /// Its elements, flat, when given in the JSON body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

/// A response's JSON header.
#[derive(Clone, Debug, Serialize)]
pub struct InferResponse {
    /// The model's name.
    pub model_name: String,
    /// The request's id, if it had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The outputs.
    pub outputs: Vec<ResponseOutput>,
}

/// The protocol's name of an element type, if the protocol has one that tract holds.
pub fn datatype_name(dt: DatumType) -> Option<&'static str> {
    Some(match dt {
        DatumType::Bool => "BOOL",
        DatumType::U8 => "UINT8",
        DatumType::U16 => "UINT16",
        DatumType::U32 => "UINT32",
        DatumType::U64 => "UINT64",
        DatumType::I8 => "INT8",
        DatumType::I16 => "INT16",
        DatumType::I32 => "INT32",
        DatumType::I64 => "INT64",
        DatumType::F16 => "FP16",
        DatumType::F32 => "FP32",
        DatumType::F64 => "FP64",
        _ => return None,
    })
}

/// The element type a protocol name stands for.
pub fn datatype(name: &str) -> Option<DatumType> {
    Some(match name {
        "BOOL" => DatumType::Bool,
        "UINT8" => DatumType::U8,
        "UINT16" => DatumType::U16,
        "UINT32" => DatumType::U32,
        "UINT64" => DatumType::U64,
        "INT8" => DatumType::I8,
        "INT16" => DatumType::I16,
        "INT32" => DatumType::I32,
        "INT64" => DatumType::I64,
        "FP16" => DatumType::F16,
        "FP32" => DatumType::F32,
        "FP64" => DatumType::F64,
        _ => return None,
    })
}

/// The extents of `input`, checked: none negative, and an element count that fits
/// memory's arithmetic. Returns them and the count.
fn extents(input: &RequestInput) -> Result<(Vec<usize>, usize), Malformed> {
    let name = &input.name;
    let mut count = 1usize;
    let mut shape = Vec::with_capacity(input.shape.len());
    for &d in &input.shape {
        malformed!(
            d >= 0,
            "input {name:?}: negative extent {d} in shape {:?}",
            input.shape
        );
        let d = usize::try_from(d).map_err(|_| Malformed(format!("input {name:?}: extent {d}")))?;
        count = count.checked_mul(d).ok_or_else(|| {
            Malformed(format!(
                "input {name:?}: shape {:?} has too many elements",
                input.shape
            ))
        })?;
        shape.push(d);
    }
    Ok((shape, count))
}

/// The tensor an input gives: from its JSON `data`, or from `binary` (the bytes its
/// `binary_data_size` declared, already cut from the body).
pub fn input_tensor(input: &RequestInput, binary: Option<&[u8]>) -> Result<Tensor, Malformed> {
    let name = &input.name;
    let dt = datatype(&input.datatype).ok_or_else(|| {
        Malformed(format!(
            "input {name:?}: datatype {:?} is not supported",
            input.datatype
        ))
    })?;
    let (shape, count) = extents(input)?;
    match (binary, &input.data) {
        (Some(bytes), None) => {
            let want = count.checked_mul(dt.size_of()).ok_or_else(|| {
                Malformed(format!(
                    "input {name:?}: shape {shape:?} has too many bytes"
                ))
            })?;
            malformed!(
                bytes.len() == want,
                "input {name:?}: {} bytes of binary data for shape {shape:?} of {} ({want} bytes)",
                bytes.len(),
                input.datatype
            );
            from_le_bytes(dt, &shape, bytes).map_err(|e| Malformed(format!("input {name:?}: {e}")))
        }
        (None, Some(data)) => {
            let mut flat = Vec::new();
            flatten(data, &mut flat, count, name)?;
            malformed!(
                flat.len() == count,
                "input {name:?}: {} values for shape {shape:?} ({count} elements)",
                flat.len()
            );
            from_json(dt, &shape, &flat).map_err(|e| Malformed(format!("input {name:?}: {e}")))
        }
        (Some(_), Some(_)) => Err(Malformed(format!(
            "input {name:?}: both binary_data_size and data"
        ))),
        (None, None) => Err(Malformed(format!("input {name:?}: no data"))),
    }
}

/// `value`'s scalars in row-major order into `flat`, never more than `most` of them.
fn flatten<'v>(
    value: &'v Value,
    flat: &mut Vec<&'v Value>,
    most: usize,
    name: &str,
) -> Result<(), Malformed> {
    match value {
        Value::Array(items) => {
            for item in items {
                flatten(item, flat, most, name)?;
            }
        }
        scalar => {
            malformed!(
                flat.len() < most,
                "input {name:?}: more values than its shape holds"
            );
            flat.push(scalar);
        }
    }
    Ok(())
}

/// A tensor of `dt` and `shape` from JSON scalars, each checked to be of that type and
/// within its range.
fn from_json(dt: DatumType, shape: &[usize], flat: &[&Value]) -> Result<Tensor, String> {
    fn ints<T: TryFrom<i64> + TryFrom<u64> + Datum>(
        shape: &[usize],
        flat: &[&Value],
    ) -> Result<Tensor, String> {
        let values = flat
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let got = match (v.as_i64(), v.as_u64()) {
                    (Some(x), _) => T::try_from(x).ok(),
                    (None, Some(x)) => T::try_from(x).ok(),
                    _ => None,
                };
                got.ok_or_else(|| {
                    format!("value {i} ({v}) is not a {}", std::any::type_name::<T>())
                })
            })
            .collect::<Result<Vec<T>, String>>()?;
        tensor_of(shape, values)
    }
    fn floats<T: Datum>(
        shape: &[usize],
        flat: &[&Value],
        cast: impl Fn(f64) -> T,
    ) -> Result<Tensor, String> {
        let values = flat
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_f64()
                    .map(&cast)
                    .ok_or_else(|| format!("value {i} ({v}) is not a number"))
            })
            .collect::<Result<Vec<T>, String>>()?;
        tensor_of(shape, values)
    }
    match dt {
        DatumType::Bool => {
            let values = flat
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_bool()
                        .ok_or_else(|| format!("value {i} ({v}) is not a bool"))
                })
                .collect::<Result<Vec<bool>, String>>()?;
            tensor_of(shape, values)
        }
        DatumType::U8 => ints::<u8>(shape, flat),
        DatumType::U16 => ints::<u16>(shape, flat),
        DatumType::U32 => ints::<u32>(shape, flat),
        DatumType::U64 => ints::<u64>(shape, flat),
        DatumType::I8 => ints::<i8>(shape, flat),
        DatumType::I16 => ints::<i16>(shape, flat),
        DatumType::I32 => ints::<i32>(shape, flat),
        DatumType::I64 => ints::<i64>(shape, flat),
        DatumType::F16 => floats(shape, flat, f16::from_f64),
        DatumType::F32 => floats(shape, flat, |x| x as f32),
        DatumType::F64 => floats(shape, flat, |x| x),
        _ => Err(format!("{dt:?} is not supported")),
    }
}

fn tensor_of<T: Datum>(shape: &[usize], values: Vec<T>) -> Result<Tensor, String> {
    tract_ndarray::ArrayD::from_shape_vec(shape, values)
        .map(Tensor::from)
        .map_err(|e| e.to_string())
}

/// A tensor of `dt` and `shape` from its little-endian bytes (their count checked by the
/// caller). Booleans must be 0 or 1.
fn from_le_bytes(dt: DatumType, shape: &[usize], bytes: &[u8]) -> Result<Tensor, String> {
    if dt == DatumType::Bool
        && let Some(at) = bytes.iter().position(|b| *b > 1)
    {
        return Err(format!("BOOL byte {at} is {}, not 0 or 1", bytes[at]));
    }
    // Every supported type is plain old data in tract's layout, little-endian here.
    if cfg!(target_endian = "big") {
        return Err("binary tensors need a little-endian host".into());
    }
    // SAFETY: `bytes` holds exactly `shape`'s element count of `dt` (checked by the
    // caller), `dt` is one of the plain types above (bools checked to be 0 or 1), and
    // from_raw_dt copies them into an aligned buffer.
    unsafe { Tensor::from_raw_dt(dt, shape, bytes) }.map_err(|e| format!("{e}"))
}

/// `tensor`'s elements as little-endian bytes, appended to `out`.
pub fn append_le_bytes(tensor: &Tensor, out: &mut Vec<u8>) -> TractResult<()> {
    ensure!(
        cfg!(target_endian = "little"),
        "binary tensors need a little-endian host"
    );
    datatype_name(tensor.datum_type())
        .with_context(|| format!("an output of {:?}", tensor.datum_type()))?;
    // A plain type (checked above): its bytes are its elements, little-endian.
    out.extend_from_slice(tensor.try_as_plain_ram()?.as_bytes());
    Ok(())
}

/// `tensor`'s elements as a flat JSON array.
pub fn json_data(tensor: &Tensor) -> TractResult<Value> {
    fn all<T: Datum + Serialize>(t: &Tensor) -> TractResult<Value> {
        Ok(serde_json::to_value(
            t.try_as_plain_ram()?.as_slice::<T>()?,
        )?)
    }
    match tensor.datum_type() {
        DatumType::Bool => all::<bool>(tensor),
        DatumType::U8 => all::<u8>(tensor),
        DatumType::U16 => all::<u16>(tensor),
        DatumType::U32 => all::<u32>(tensor),
        DatumType::U64 => all::<u64>(tensor),
        DatumType::I8 => all::<i8>(tensor),
        DatumType::I16 => all::<i16>(tensor),
        DatumType::I32 => all::<i32>(tensor),
        DatumType::I64 => all::<i64>(tensor),
        DatumType::F16 => Ok(Value::from(
            tensor
                .try_as_plain_ram()?
                .as_slice::<f16>()?
                .iter()
                .map(|x| x.to_f32())
                .collect::<Vec<f32>>(),
        )),
        DatumType::F32 => all::<f32>(tensor),
        DatumType::F64 => all::<f64>(tensor),
        dt => bail!("an output of {dt:?} has no protocol datatype"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(json: &str) -> RequestInput {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn json_data_nested_or_flat_with_counts_and_ranges_checked() {
        let flat = input(r#"{"name":"x","shape":[2,2],"datatype":"FP32","data":[1,2,3,4.5]}"#);
        let nested =
            input(r#"{"name":"x","shape":[2,2],"datatype":"FP32","data":[[1,2],[3,4.5]]}"#);
        let want = tensor2(&[[1f32, 2.0], [3.0, 4.5]]);
        assert_eq!(input_tensor(&flat, None).unwrap(), want);
        assert_eq!(input_tensor(&nested, None).unwrap(), want);
        for bad in [
            r#"{"name":"x","shape":[2,2],"datatype":"FP32","data":[1,2,3]}"#,
            r#"{"name":"x","shape":[2,2],"datatype":"FP32","data":[1,2,3,4,5]}"#,
            r#"{"name":"x","shape":[-1,2],"datatype":"FP32","data":[1,2]}"#,
            r#"{"name":"x","shape":[2],"datatype":"UINT8","data":[1,300]}"#,
            r#"{"name":"x","shape":[2],"datatype":"INT64","data":[1,"a"]}"#,
            r#"{"name":"x","shape":[2],"datatype":"BYTES","data":["a","b"]}"#,
            r#"{"name":"x","shape":[4611686018427387904,4],"datatype":"FP32","data":[1]}"#,
            r#"{"name":"x","shape":[1],"datatype":"FP32"}"#,
        ] {
            let e = input_tensor(&input(bad), None).unwrap_err();
            assert!(e.0.starts_with("input \"x\""), "{bad}: {e}");
        }
    }

    #[test]
    fn binary_data_must_be_exactly_the_shape() {
        let x = input(
            r#"{"name":"x","shape":[1,3],"datatype":"INT32","parameters":{"binary_data_size":12}}"#,
        );
        let bytes: Vec<u8> = [7i32, -1, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            input_tensor(&x, Some(&bytes)).unwrap(),
            tensor2(&[[7i32, -1, 3]])
        );
        assert!(input_tensor(&x, Some(&bytes[..8])).is_err());
        let b = input(
            r#"{"name":"b","shape":[2],"datatype":"BOOL","parameters":{"binary_data_size":2}}"#,
        );
        assert!(input_tensor(&b, Some(&[1, 2])).is_err());
        let mut out = vec![];
        append_le_bytes(&tensor2(&[[7i32, -1, 3]]), &mut out).unwrap();
        assert_eq!(out, bytes);
    }
}
