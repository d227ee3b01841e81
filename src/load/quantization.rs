//! Dynamic quantization, written so that each sample of a batch gets its own scale.
//!
//! Models quantized dynamically (ONNX Runtime's `quantize_dynamic`, optimum's int8
//! exports of sentence encoders) quantize each activation before a `MatMulInteger` with
//! `DynamicQuantizeLinear`: a scale and a zero point from the minimum and maximum of the
//! *whole* tensor. Alone, a sample's scale is its own; in a batch, the whole tensor holds
//! every sample (and the padding), and one scale for all would change every sample's
//! result. tract loads the op as one of its own with rank-0 scale and zero point, which
//! the ragged transform cannot give a value per sample.
//!
//! So, before tract reads the graph, each `DynamicQuantizeLinear` whose zero point only
//! feeds `MatMulInteger`s and `ConvInteger`s and whose scale only feeds element-wise
//! products is written as
//! the ops it stands for, with its minimum and maximum kept at the input's rank
//! (`keepdims`): a whole-tensor reduction, which the transform computes per sample over
//! its valid region, as alone ([`crate::transform`]'s reductions). ONNX broadcasts those
//! `[1, .., 1]` values where the rank-0 ones were read. A `MatMulInteger` cannot take such
//! a zero point, so it reads none, and its product is corrected by the zero point times
//! the column sums of its weights, in int32:
//! `sum_k (a - z) (b - zb) = sum_k a (b - zb) - z sum_k (b - zb)`, the same integers; a
//! `ConvInteger` likewise, by the zero point times the convolution of ones (the taps
//! within the input at each position).
//!
//! The arithmetic is ONNX's definition of the op, as tract and ONNX Runtime compute it
//! (`x / scale` rounded half to even, not `x * (1 / scale)`): the rewritten models give
//! ONNX Runtime the same bits as the originals.

use std::collections::{HashMap, HashSet};

use tract_onnx::pb;

/// ONNX's codes for the tensor types used here.
const FLOAT: i32 = 1;
const UINT8: i64 = 2;
const INT32: i64 = 6;
const INT64: i32 = 7;

/// Rewrites the model's `DynamicQuantizeLinear` nodes (module doc); the names of those
/// rewritten.
pub fn dynamic_quantization_per_sample(proto: &mut pb::ModelProto) -> Vec<String> {
    let opset = proto
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map_or(0, |o| o.version);
    let Some(graph) = proto.graph.as_mut() else {
        return vec![];
    };
    let mut readers: HashMap<String, Vec<(String, usize)>> = HashMap::new();
    for node in &graph.node {
        for (slot, input) in node.input.iter().enumerate() {
            readers
                .entry(input.clone())
                .or_default()
                .push((node.op_type.clone(), slot));
        }
    }
    let outputs: HashSet<&str> = graph.output.iter().map(|o| o.name.as_str()).collect();
    let rewritable = |node: &pb::NodeProto| {
        let [_, scale, zero] = node.output.as_slice() else {
            return false;
        };
        let read = |name: &str| readers.get(name).map(Vec::as_slice).unwrap_or(&[]);
        node.input.len() == 1
            && !outputs.contains(scale.as_str())
            && !outputs.contains(zero.as_str())
            && read(zero)
                .iter()
                .all(|(op, slot)| (op == "MatMulInteger" || op == "ConvInteger") && *slot == 2)
            && read(scale).iter().all(|(op, _)| op == "Mul" || op == "Div")
    };
    let mut rewriter = Rewriter {
        opset,
        nodes: vec![],
        initializers: vec![],
        count: 0,
    };
    // A rewritten node's zero point, at the input's rank, by its original name.
    let mut zero_points: HashMap<String, String> = HashMap::new();
    let mut rewritten = vec![];
    for node in std::mem::take(&mut graph.node) {
        if node.op_type == "DynamicQuantizeLinear" && node.domain.is_empty() && rewritable(&node) {
            let zero = rewriter.quantize(&node);
            zero_points.insert(node.output[2].clone(), zero);
            rewritten.push(node.name.clone());
        } else if node.op_type == "MatMulInteger"
            && let Some(zero) = node.input.get(2).and_then(|z| zero_points.get(z))
        {
            let zero = zero.clone();
            rewriter.matmul(&node, &zero);
        } else if node.op_type == "ConvInteger"
            && let Some(zero) = node.input.get(2).and_then(|z| zero_points.get(z))
        {
            let zero = zero.clone();
            rewriter.conv(&node, &zero);
        } else {
            rewriter.nodes.push(node);
        }
    }
    graph.node = rewriter.nodes;
    graph.initializer.extend(rewriter.initializers);
    rewritten
}

struct Rewriter {
    opset: i64,
    nodes: Vec<pb::NodeProto>,
    initializers: Vec<pb::TensorProto>,
    count: usize,
}

impl Rewriter {
    fn fresh(&mut self, base: &str, what: &str) -> String {
        self.count += 1;
        format!("{base}.per_sample.{what}.{}", self.count)
    }

    /// A node of `op` reading `inputs`, writing `output`, named after it.
    fn node(&mut self, op: &str, inputs: &[&str], output: &str, attrs: Vec<pb::AttributeProto>) {
        self.nodes.push(pb::NodeProto {
            op_type: op.into(),
            name: output.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.into()],
            attribute: attrs,
            ..Default::default()
        });
    }

    /// A fresh value of `op` over `inputs`.
    fn value(
        &mut self,
        base: &str,
        op: &str,
        inputs: &[&str],
        attrs: Vec<pb::AttributeProto>,
    ) -> String {
        let out = self.fresh(base, &op.to_lowercase());
        self.node(op, inputs, &out, attrs);
        out
    }

    fn scalar_f32(&mut self, base: &str, v: f32) -> String {
        let name = self.fresh(base, "const");
        self.initializers.push(pb::TensorProto {
            name: name.clone(),
            data_type: FLOAT,
            float_data: vec![v],
            ..Default::default()
        });
        name
    }

    fn ints(&mut self, base: &str, v: &[i64]) -> String {
        let name = self.fresh(base, "axes");
        self.initializers.push(pb::TensorProto {
            name: name.clone(),
            dims: vec![v.len() as i64],
            data_type: INT64,
            int64_data: v.to_vec(),
            ..Default::default()
        });
        name
    }

    /// `DynamicQuantizeLinear(x) -> (y, scale, zero)` as its ops, the scale and zero point
    /// at x's rank; the name of that zero point (u8).
    fn quantize(&mut self, node: &pb::NodeProto) -> String {
        let base = if node.name.is_empty() {
            node.output[0].clone()
        } else {
            node.name.clone()
        };
        let x = node.input[0].as_str();
        let (y, scale) = (node.output[0].as_str(), node.output[1].as_str());
        let keep = vec![int_attr("keepdims", 1)];
        let low = self.value(&base, "ReduceMin", &[x], keep.clone());
        let high = self.value(&base, "ReduceMax", &[x], keep);
        let zero = self.scalar_f32(&base, 0.0);
        let top = self.scalar_f32(&base, 255.0);
        // The range always holds 0, as ONNX says.
        let low = self.value(&base, "Min", &[&low, &zero], vec![]);
        let high = self.value(&base, "Max", &[&high, &zero], vec![]);
        let range = self.value(&base, "Sub", &[&high, &low], vec![]);
        self.node("Div", &[&range, &top], scale, vec![]);
        let neg = self.value(&base, "Neg", &[&low], vec![]);
        let zero_point = self.value(&base, "Div", &[&neg, scale], vec![]);
        let zero_point = self.value(&base, "Round", &[&zero_point], vec![]);
        let zero_point = self.value(&base, "Clip", &[&zero_point, &zero, &top], vec![]);
        let zero_u8 = self.value(&base, "Cast", &[&zero_point], vec![int_attr("to", UINT8)]);
        let q = self.value(&base, "Div", &[x, scale], vec![]);
        let q = self.value(&base, "Round", &[&q], vec![]);
        let q = self.value(&base, "Add", &[&q, &zero_point], vec![]);
        let q = self.value(&base, "Clip", &[&q, &zero, &top], vec![]);
        self.node("Cast", &[&q], y, vec![int_attr("to", UINT8)]);
        zero_u8
    }

    /// `MatMulInteger(a, b, zero, zb)` with `zero` at a's rank: the product without it,
    /// less `zero` times the column sums of `b - zb` (module doc).
    fn matmul(&mut self, node: &pb::NodeProto, zero: &str) {
        let base = if node.name.is_empty() {
            node.output[0].clone()
        } else {
            node.name.clone()
        };
        let (a, b) = (node.input[0].as_str(), node.input[1].as_str());
        let zb = node.input.get(3).map(String::as_str).unwrap_or("");
        let inputs: Vec<&str> = if zb.is_empty() {
            vec![a, b]
        } else {
            vec![a, b, "", zb]
        };
        let product = self.value(&base, "MatMulInteger", &inputs, vec![]);
        let mut b32 = self.value(&base, "Cast", &[b], vec![int_attr("to", INT32)]);
        if !zb.is_empty() {
            let zb32 = self.value(&base, "Cast", &[zb], vec![int_attr("to", INT32)]);
            b32 = self.value(&base, "Sub", &[&b32, &zb32], vec![]);
        }
        // Over K, the second axis from the end: `[.., 1, n]` broadcasts against the
        // product's `[.., m, n]`.
        let keep = int_attr("keepdims", 1);
        let sums = if self.opset >= 13 {
            let axes = self.ints(&base, &[-2]);
            self.value(&base, "ReduceSum", &[&b32, &axes], vec![keep])
        } else {
            let axes = pb::AttributeProto {
                name: "axes".into(),
                r#type: pb::attribute_proto::AttributeType::Ints as i32,
                ints: vec![-2],
                ..Default::default()
            };
            self.value(&base, "ReduceSum", &[&b32], vec![keep, axes])
        };
        let zero32 = self.value(&base, "Cast", &[zero], vec![int_attr("to", INT32)]);
        let correction = self.value(&base, "Mul", &[&zero32, &sums], vec![]);
        self.node("Sub", &[&product, &correction], &node.output[0], vec![]);
    }
}

impl Rewriter {
    /// `ConvInteger(x, w, zero, zw)` with `zero` at x's rank: the convolution without it,
    /// less `zero` times the convolution of ones by `w - zw` (module doc). The ones are
    /// padded with zeros as the input is: at a border, only the taps within the input
    /// count, as `x - zero` is 0 in the padding when the convolution pads with the zero
    /// point.
    fn conv(&mut self, node: &pb::NodeProto, zero: &str) {
        let base = if node.name.is_empty() {
            node.output[0].clone()
        } else {
            node.name.clone()
        };
        let (x, w) = (node.input[0].as_str(), node.input[1].as_str());
        let zw = node.input.get(3).map(String::as_str).unwrap_or("");
        let with = |data: &str| -> Vec<String> {
            if zw.is_empty() {
                vec![data.into(), w.into()]
            } else {
                vec![data.into(), w.into(), String::new(), zw.into()]
            }
        };
        let product = self.fresh(&base, "convinteger");
        self.nodes.push(pb::NodeProto {
            input: with(x),
            output: vec![product.clone()],
            name: product.clone(),
            ..node.clone()
        });
        let same = self.value(&base, "Equal", &[x, x], vec![]);
        let ones = self.value(&base, "Cast", &[&same], vec![int_attr("to", UINT8)]);
        let taps = self.fresh(&base, "convinteger");
        self.nodes.push(pb::NodeProto {
            input: with(&ones),
            output: vec![taps.clone()],
            name: taps.clone(),
            ..node.clone()
        });
        let zero32 = self.value(&base, "Cast", &[zero], vec![int_attr("to", INT32)]);
        let correction = self.value(&base, "Mul", &[&zero32, &taps], vec![]);
        self.node("Sub", &[&product, &correction], &node.output[0], vec![]);
    }
}

fn int_attr(name: &str, i: i64) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        r#type: pb::attribute_proto::AttributeType::Int as i32,
        i,
        ..Default::default()
    }
}
