//! Building small ONNX models in code, for tests: the graphs go through tract-onnx exactly
//! as a user's exported model does.

#![allow(dead_code)]

use tract_onnx::pb;
use tract_onnx::pb::tensor_shape_proto::dimension;

pub fn ints(name: &str, values: &[i64]) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        ints: values.to_vec(),
        r#type: 7,
        ..Default::default()
    }
}

pub fn int(name: &str, value: i64) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        i: value,
        r#type: 2,
        ..Default::default()
    }
}

pub fn float(name: &str, value: f32) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        f: value,
        r#type: 1,
        ..Default::default()
    }
}

pub fn floats(name: &str, values: &[f32]) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        floats: values.to_vec(),
        r#type: 6,
        ..Default::default()
    }
}

pub fn strings(name: &str, values: &[&str]) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        strings: values.iter().map(|v| v.as_bytes().to_vec()).collect(),
        r#type: 8,
        ..Default::default()
    }
}

pub fn string(name: &str, value: &str) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        s: value.as_bytes().to_vec(),
        r#type: 3,
        ..Default::default()
    }
}

/// A tiny deterministic generator for weights.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// A number in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 11) % n.max(1) as u64) as usize
    }

    pub fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    pub fn vec(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| self.next_f32() * scale).collect()
    }
}

#[derive(Default)]
pub struct Graph {
    nodes: Vec<pb::NodeProto>,
    inits: Vec<pb::TensorProto>,
    count: usize,
}

impl Graph {
    fn fresh(&mut self, prefix: &str) -> String {
        self.count += 1;
        format!("{prefix}_{}", self.count)
    }

    /// Adds a node with one output, named after the op, and returns that output's name.
    pub fn op(&mut self, op: &str, inputs: &[&str], attrs: Vec<pb::AttributeProto>) -> String {
        self.op_n(op, inputs, 1, attrs).remove(0)
    }

    pub fn op_n(
        &mut self,
        op: &str,
        inputs: &[&str],
        outputs: usize,
        attrs: Vec<pb::AttributeProto>,
    ) -> Vec<String> {
        let name = self.fresh(op);
        let outs: Vec<String> = (0..outputs).map(|i| format!("{name}_out{i}")).collect();
        self.nodes.push(pb::NodeProto {
            op_type: op.into(),
            name,
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outs.clone(),
            attribute: attrs,
            ..Default::default()
        });
        outs
    }

    pub fn weight(&mut self, shape: &[usize], data: Vec<f32>) -> String {
        let name = self.fresh("w");
        self.inits.push(pb::TensorProto {
            name: name.clone(),
            dims: shape.iter().map(|d| *d as i64).collect(),
            data_type: 1,
            float_data: data,
            ..Default::default()
        });
        name
    }

    /// An int8 initializer (ONNX stores its values in `int32_data`).
    pub fn int8_weight(&mut self, shape: &[usize], data: &[i8]) -> String {
        let name = self.fresh("q");
        self.inits.push(pb::TensorProto {
            name: name.clone(),
            dims: shape.iter().map(|d| *d as i64).collect(),
            data_type: 3,
            int32_data: data.iter().map(|v| *v as i32).collect(),
            ..Default::default()
        });
        name
    }

    pub fn ints_const(&mut self, data: &[i64]) -> String {
        let name = self.fresh("i");
        self.inits.push(pb::TensorProto {
            name: name.clone(),
            dims: vec![data.len() as i64],
            data_type: 7,
            int64_data: data.to_vec(),
            ..Default::default()
        });
        name
    }

    /// A scalar int64 constant (an axis given as an input, as CumSum takes it).
    pub fn int64_scalar(&mut self, value: i64) -> String {
        let name = self.fresh("s");
        self.inits.push(pb::TensorProto {
            name: name.clone(),
            data_type: 7,
            int64_data: vec![value],
            ..Default::default()
        });
        name
    }

    /// The model: `input` of the given rank (dims as symbols d0, d1...), `outputs`.
    pub fn model(self, input: &str, rank: usize, outputs: &[&str]) -> pb::ModelProto {
        let value = |name: &str, rank: Option<usize>| pb::ValueInfoProto {
            name: name.into(),
            r#type: Some(pb::TypeProto {
                value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
                    elem_type: 1,
                    shape: rank.map(|rank| pb::TensorShapeProto {
                        dim: (0..rank)
                            .map(|i| pb::tensor_shape_proto::Dimension {
                                value: Some(dimension::Value::DimParam(format!("d{i}"))),
                                ..Default::default()
                            })
                            .collect(),
                    }),
                })),
                ..Default::default()
            }),
            ..Default::default()
        };
        pb::ModelProto {
            ir_version: 8,
            opset_import: vec![pb::OperatorSetIdProto {
                domain: String::new(),
                version: 17,
            }],
            graph: Some(pb::GraphProto {
                name: "test".into(),
                node: self.nodes,
                initializer: self.inits,
                input: vec![value(input, Some(rank))],
                output: outputs.iter().map(|o| value(o, None)).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}
