#!/usr/bin/env python3
"""Write small token encoders as ONNX models, the shape of BERT-like sentence encoders,
with token sequences to run them on, for tract-ragged's tests (issue 14).

    python3 scripts/token_encoders.py OUT_DIR [--seed 0]

Each model takes `input_ids` [batch, sequence] int64 (the symbols a Hugging Face export
declares) and computes token embeddings (a Gather from a constant table) plus, in two of
them, position embeddings of positions numbered from the input's own shape (`Range(0, L)`
as some exports write it, or a constant buffer of position ids cut to `L`,
`position_ids[:, :L]`, as Hugging Face's BERT does), a layer norm,
single-head self-attention over the sequence (softmax over the keys), a residual and a
feed-forward block, then a pooled sentence vector. The variants differ in the pooling:

- `mean` (positions from a Range): ReduceMean over the sequence, [batch, D];
- `first` (positions cut from a buffer): the first token's vector (Gather of index 0
  along the sequence, BERT's CLS pooling), [batch, D];
- `tokens` (no positions): no pooling, [batch, sequence, D].

For each model, OUT_DIR/NAME/model.onnx and OUT_DIR/NAME/samples.npz (token sequences of
lengths 1..40, one array per sample, without the batch axis, ids within the vocabulary).
Models of several inputs (OUT_DIR/masked_encoder: `input_ids`, `attention_mask`,
`token_type_ids` as BERT takes them; OUT_DIR/stateful: a clip, its state and a shared
gain) come without samples: the tests make theirs.
Needs numpy and onnx.
"""
import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def encoder(pooling, positions, rng, vocab=50, d=16, ff=32, max_len=64):
    def const(name, shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        const("embeddings", [vocab, d], 1.0),
        const("ln_scale", [d]),
        const("ln_bias", [d]),
        const("wq", [d, d]),
        const("wk", [d, d]),
        const("wv", [d, d]),
        const("w1", [d, ff]),
        const("b1", [ff]),
        const("w2", [ff, d]),
        numpy_helper.from_array(np.array(1.0 / np.sqrt(d), np.float32), "scale"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array([0], np.int64), "zero1"),
        numpy_helper.from_array(np.array([1], np.int64), "one1"),
        const("positions", [max_len, d], 1.0),
        numpy_helper.from_array(np.arange(max_len, dtype=np.int64)[None, :], "position_ids"),
    ]
    nodes = [helper.make_node("Gather", ["embeddings", "input_ids"], ["tok"], axis=0)]
    if positions is None:
        nodes.append(helper.make_node("Identity", ["tok"], ["emb"]))
    else:
        nodes += [
            helper.make_node("Shape", ["input_ids"], ["shape"]),
            helper.make_node("Gather", ["shape", "one"], ["len"], axis=0),
        ]
        if positions == "range":
            nodes += [
                helper.make_node("Range", ["zero", "len", "one"], ["ids"]),
                helper.make_node("Unsqueeze", ["ids", "zero1"], ["pos_ids"]),
            ]
        else:
            nodes += [
                helper.make_node("Unsqueeze", ["len", "zero1"], ["len1"]),
                helper.make_node("Slice", ["position_ids", "zero1", "len1", "one1"], ["pos_ids"]),
            ]
        nodes += [
            helper.make_node("Gather", ["positions", "pos_ids"], ["pos"], axis=0),
            helper.make_node("Add", ["tok", "pos"], ["emb"]),
        ]
    nodes += [
        helper.make_node("LayerNormalization", ["emb", "ln_scale", "ln_bias"], ["h"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["h", "wq"], ["q"]),
        helper.make_node("MatMul", ["h", "wk"], ["k"]),
        helper.make_node("MatMul", ["h", "wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores_raw"]),
        helper.make_node("Mul", ["scores_raw", "scale"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["attn"], axis=-1),
        helper.make_node("MatMul", ["attn", "v"], ["ctx"]),
        helper.make_node("Add", ["h", "ctx"], ["r1"]),
        helper.make_node("MatMul", ["r1", "w1"], ["f1"]),
        helper.make_node("Add", ["f1", "b1"], ["f2"]),
        helper.make_node("Relu", ["f2"], ["f3"]),
        helper.make_node("MatMul", ["f3", "w2"], ["f4"]),
        helper.make_node("Add", ["r1", "f4"], ["tokens"]),
    ]
    if pooling == "mean":
        nodes.append(helper.make_node("ReduceMean", ["tokens"], ["out"], axes=[1], keepdims=0))
        out_shape = ["batch", d]
    elif pooling == "first":
        nodes.append(helper.make_node("Gather", ["tokens", "zero"], ["out"], axis=1))
        out_shape = ["batch", d]
    else:
        nodes.append(helper.make_node("Identity", ["tokens"], ["out"]))
        out_shape = ["batch", "sequence", d]
    graph = helper.make_graph(
        nodes,
        f"token_encoder_{pooling}",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, out_shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    for pooling, positions in [("mean", "range"), ("first", "slice"), ("tokens", None)]:
        d = os.path.join(args.out, f"encoder_{pooling}")
        os.makedirs(d, exist_ok=True)
        onnx.save(encoder(pooling, positions, rng), os.path.join(d, "model.onnx"))
        lengths = [1, 2, 3, 5, 8, 13, 17, 21, 26, 31, 36, 40]
        samples = {f"s{i:02}": rng.integers(0, 50, size=[n]).astype(np.int64) for i, n in enumerate(lengths)}
        np.savez(os.path.join(d, "samples.npz"), **samples)
    several_inputs(args.out, rng)




def masked_encoder(rng, vocab=50, d=16, max_len=64):
    """`input_ids`, `attention_mask` and `token_type_ids`, [batch, sequence] int64 each, as
    a Hugging Face BERT export takes them: token, type and position embeddings, attention
    with the mask added to the scores as -10000 where it is 0, mean pooling over the tokens
    the mask keeps. Output [batch, D]."""

    def const(name, shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        const("embeddings", [vocab, d], 1.0),
        const("types", [2, d], 1.0),
        const("positions", [max_len, d], 1.0),
        numpy_helper.from_array(np.arange(max_len, dtype=np.int64)[None, :], "position_ids"),
        const("wq", [d, d]),
        const("wk", [d, d]),
        const("wv", [d, d]),
        numpy_helper.from_array(np.array(1.0 / np.sqrt(d), np.float32), "scale"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one_f"),
        numpy_helper.from_array(np.array(-10000.0, np.float32), "big"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array([0], np.int64), "zero1"),
        numpy_helper.from_array(np.array([1], np.int64), "one1"),
        numpy_helper.from_array(np.array([2], np.int64), "two1"),
    ]
    nodes = [
        helper.make_node("Gather", ["embeddings", "input_ids"], ["tok"], axis=0),
        helper.make_node("Gather", ["types", "token_type_ids"], ["typ"], axis=0),
        helper.make_node("Shape", ["input_ids"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["len"], axis=0),
        helper.make_node("Unsqueeze", ["len", "zero1"], ["len1"]),
        helper.make_node("Slice", ["position_ids", "zero1", "len1", "one1"], ["pos_ids"]),
        helper.make_node("Gather", ["positions", "pos_ids"], ["pos"], axis=0),
        helper.make_node("Add", ["tok", "typ"], ["e1"]),
        helper.make_node("Add", ["e1", "pos"], ["h"]),
        helper.make_node("MatMul", ["h", "wq"], ["q"]),
        helper.make_node("MatMul", ["h", "wk"], ["k"]),
        helper.make_node("MatMul", ["h", "wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s1"]),
        helper.make_node("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one_f", "mf"], ["inv"]),
        helper.make_node("Mul", ["inv", "big"], ["bias2"]),
        helper.make_node("Unsqueeze", ["bias2", "one1"], ["bias"]),
        helper.make_node("Add", ["s1", "bias"], ["s2"]),
        helper.make_node("Softmax", ["s2"], ["attn"], axis=-1),
        helper.make_node("MatMul", ["attn", "v"], ["ctx"]),
        helper.make_node("Add", ["h", "ctx"], ["tokens"]),
        helper.make_node("Unsqueeze", ["mf", "two1"], ["m3"]),
        helper.make_node("Mul", ["tokens", "m3"], ["kept"]),
        helper.make_node("ReduceSum", ["kept", "one1"], ["total"], keepdims=0),
        helper.make_node("ReduceSum", ["mf", "one1"], ["count"], keepdims=1),
        helper.make_node("Div", ["total", "count"], ["out"]),
    ]
    seq = lambda name: helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
    graph = helper.make_graph(
        nodes,
        "masked_encoder",
        [seq("input_ids"), seq("attention_mask"), seq("token_type_ids")],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", d])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def stateful(rng, c=4, h=8):
    """`x` [batch, time, C] f32 with a state `state` [batch, H] f32 and a shared `gain` []
    f32, as a streaming audio model: tanh(x W + state) x gain, its maximum over time, and
    the next state (half the state plus the mean over time)."""
    inits = [
        numpy_helper.from_array((rng.standard_normal([c, h]) * 0.5).astype(np.float32), "w"),
        numpy_helper.from_array(np.array([1], np.int64), "one1"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Unsqueeze", ["state", "one1"], ["s3"]),
        helper.make_node("Add", ["xw", "s3"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["act"]),
        helper.make_node("Mul", ["act", "gain"], ["y"]),
        helper.make_node("ReduceMax", ["y"], ["peak"], axes=[1], keepdims=0),
        helper.make_node("ReduceMean", ["y"], ["avg"], axes=[1], keepdims=0),
        helper.make_node("Mul", ["state", "half"], ["hs"]),
        helper.make_node("Add", ["hs", "avg"], ["next_state"]),
    ]
    graph = helper.make_graph(
        nodes,
        "stateful",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "time", c]),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, ["batch", h]),
            helper.make_tensor_value_info("gain", TensorProto.FLOAT, []),
        ],
        [
            helper.make_tensor_value_info("peak", TensorProto.FLOAT, ["batch", h]),
            helper.make_tensor_value_info("next_state", TensorProto.FLOAT, ["batch", h]),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def several_inputs(out, rng):
    """The models of several inputs, in OUT/masked_encoder and OUT/stateful."""
    for name, model in [("masked_encoder", masked_encoder(rng)), ("stateful", stateful(rng))]:
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        onnx.save(model, os.path.join(d, "model.onnx"))


if __name__ == "__main__":
    main()
