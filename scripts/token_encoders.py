#!/usr/bin/env python3
"""Write small token encoders as ONNX models, the shape of BERT-like sentence encoders,
with token sequences to run them on, for tract-ragged's tests.

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
`token_type_ids` as BERT takes them; OUT_DIR/hf_bert and OUT_DIR/hf_bert_sdpa: a
two-layer BERT written as `torch.onnx.export` writes Hugging Face's `BertModel`, eager and
SDPA attention, and OUT_DIR/hf_roberta, positions numbered by a CumSum over the ids;
OUT_DIR/lstm_state: an LSTM whose initial state is given per sample, as a voice-activity
detector carries its own; OUT_DIR/stateful: a clip, its state
and a shared gain) come without samples: the tests make theirs.
Needs numpy and onnx.
"""
import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def finished(graph):
    """`graph` as an opset 17 model (IR version 8, what ONNX Runtime and tract read),
    checked."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


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
    return finished(graph)


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
    return finished(graph)


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
    return finished(graph)


def hf_bert(rng, vocab=60, d=16, heads=4, ff=32, layers=2, max_len=64, sdpa=False, roberta=False):
    """A BERT as `torch.onnx.export` writes Hugging Face's `BertModel`: `input_ids`,
    `attention_mask`, `token_type_ids` [batch, sequence] int64; the extended mask
    `(1 - mask[:, None, None, :]) * finfo(f32).min` added to every head's scores; heads split
    and merged by Reshapes whose shapes are gathered from `Shape` and concatenated; one
    layer norm decomposed (ReduceMean, Sub, Pow, Sqrt, Div), the other LayerNormalization;
    GELU through Erf. Outputs `last_hidden_state` [batch, sequence, D], `pooler_output`
    tanh(W h[:, 0]) [batch, D] and `sentence_embedding` [batch, D], sentence-transformers'
    mean pooling (the mask expanded to the states' shape, sum over the tokens it keeps over
    their count clipped at 1e-9).

    With `sdpa`, as transformers 4.36 and later write it with `attn_implementation="sdpa"`:
    the mask expanded to [batch, 1, sequence, sequence] (Expand to a shape gathered from
    `Shape`), inverted and filled with f32's lowest through `Where`, and the scale
    multiplied into the queries and the keys (its square root on each).

    With `roberta`, as RoBERTa and XLM-R are exported: no `token_type_ids` input, and the
    positions numbered from the ids, `cumsum(ids != pad, 1) * (ids != pad) + pad` (pad 1), the mask and its sum in int32
    as transformers writes them."""
    dh = d // heads
    inits = []
    nodes = []

    def const(name, shape, scale=0.3):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def lit(name, value, dtype):
        inits.append(numpy_helper.from_array(np.array(value, dtype), name))
        return name

    def node(op, inputs, output, **attrs):
        nodes.append(helper.make_node(op, inputs, [output], **attrs))
        return output

    for name, value, dtype in [
        ("i0", 0, np.int64), ("i1", 1, np.int64), ("a0", [0], np.int64), ("a1", [1], np.int64),
        ("a12", [1, 2], np.int64), ("am1", [-1], np.int64), ("tiny", 1e-9, np.float32),
        ("heads", [heads], np.int64), ("dh", [dh], np.int64), ("dd", [d], np.int64),
        ("one_f", 1.0, np.float32), ("fmin", np.finfo(np.float32).min, np.float32),
        ("sqrt_dh", np.sqrt(dh), np.float32), ("two_f", 2.0, np.float32), ("eps", 1e-12, np.float32),
        ("half", 0.5, np.float32), ("sqrt2", np.sqrt(2.0), np.float32),
        ("quarter_root", dh ** -0.25, np.float32),
    ]:
        lit(name, value, dtype)
    inits.append(numpy_helper.from_array(np.arange(max_len, dtype=np.int64)[None, :], "position_ids"))

    tok = node("Gather", [const("word_embeddings", [vocab, d], 1.0), "input_ids"], "tok", axis=0)
    shape = node("Shape", ["input_ids"], "ids_shape")
    seq_len = node("Gather", [shape, "i1"], "seq_len", axis=0)
    seq_len1 = node("Unsqueeze", [seq_len, "a0"], "seq_len1")
    if roberta:
        # As transformers' create_position_ids_from_input_ids exports: int32 mask and sum,
        # then int64.
        kept = node("Cast", [node("Not", [node("Equal", ["input_ids", "i1"], "is_pad")], "not_pad")],
                    "kept_ids", to=TensorProto.INT32)
        counted = node("CumSum", [kept, "i1"], "counted")
        numbered = node("Cast", [node("Mul", [counted, kept], "numbered32")], "numbered",
                        to=TensorProto.INT64)
        pos_ids = node("Add", [numbered, "i1"], "pos_ids")
        pos = node("Gather", [const("position_embeddings", [max_len + 2, d], 1.0), pos_ids], "pos", axis=0)
        h = node("Add", [tok, pos], "e2")
    else:
        pos_ids = node("Slice", ["position_ids", "a0", seq_len1, "a1"], "pos_ids")
        pos = node("Gather", [const("position_embeddings", [max_len, d], 1.0), pos_ids], "pos", axis=0)
        typ = node("Gather", [const("token_type_embeddings", [2, d], 1.0), "token_type_ids"], "typ", axis=0)
        h = node("Add", [node("Add", [tok, typ], "e1"), pos], "e2")
    h = node("LayerNormalization", [h, const("emb_ln_w", [d]), const("emb_ln_b", [d])], "emb", axis=-1,
             epsilon=1e-12)
    # The extended attention mask, [batch, 1, 1, sequence].
    m = node("Unsqueeze", ["attention_mask", "a12"], "mask4")
    if sdpa:
        sh = node("Shape", ["input_ids"], "mask_shape")
        b = node("Unsqueeze", [node("Gather", [sh, "i0"], "mask_b", axis=0), "a0"], "mask_b1")
        l = node("Unsqueeze", [node("Gather", [sh, "i1"], "mask_l", axis=0), "a0"], "mask_l1")
        m = node("Expand", [m, node("Concat", [b, "a1", l, l], "mask_dims", axis=0)], "mask_full")
        m = node("Sub", ["one_f", node("Cast", [m], "maskf", to=TensorProto.FLOAT)], "inv_mask")
        m = node("Where", [node("Cast", [m], "inv_bool", to=TensorProto.BOOL), "fmin", m], "ext_mask")
    else:
        m = node("Cast", [m], "maskf", to=TensorProto.FLOAT)
        m = node("Mul", [node("Sub", ["one_f", m], "inv_mask"), "fmin"], "ext_mask")

    def dims(x, tail, tag):
        """Concat(batch, sequence, *tail) of x's shape, as torch.onnx writes a view."""
        sh = node("Shape", [x], f"{tag}_shape")
        b = node("Unsqueeze", [node("Gather", [sh, "i0"], f"{tag}_b", axis=0), "a0"], f"{tag}_b1")
        l = node("Unsqueeze", [node("Gather", [sh, "i1"], f"{tag}_l", axis=0), "a0"], f"{tag}_l1")
        return node("Concat", [b, l, *tail], f"{tag}_dims", axis=0)

    def layer_norm(x, tag, decomposed):
        w, b = const(f"{tag}_w", [d]), const(f"{tag}_b", [d])
        if not decomposed:
            return node("LayerNormalization", [x, w, b], f"{tag}_out", axis=-1, epsilon=1e-12)
        mean = node("ReduceMean", [x], f"{tag}_mean", axes=[-1])
        c = node("Sub", [x, mean], f"{tag}_c")
        var = node("ReduceMean", [node("Pow", [c, "two_f"], f"{tag}_sq")], f"{tag}_var", axes=[-1])
        std = node("Sqrt", [node("Add", [var, "eps"], f"{tag}_ve")], f"{tag}_std")
        return node("Add", [node("Mul", [node("Div", [c, std], f"{tag}_n"), w], f"{tag}_nw"), b], f"{tag}_out")

    for li in range(layers):
        t = f"l{li}"
        def proj(x, name, n_out=d):
            y = node("MatMul", [x, const(f"{t}_{name}_w", [x_dim(name), n_out])], f"{t}_{name}_mm")
            return node("Add", [y, const(f"{t}_{name}_b", [n_out])], f"{t}_{name}")
        x_dim = lambda name: ff if name == "out" else d
        def split(x, name, perm):
            r = node("Reshape", [x, dims(x, ["heads", "dh"], f"{t}_{name}_view")], f"{t}_{name}_4")
            return node("Transpose", [r], f"{t}_{name}_h", perm=perm)
        q = split(proj(h, "q"), "q", [0, 2, 1, 3])
        k = split(proj(h, "k"), "k", [0, 2, 3, 1])
        v = split(proj(h, "v"), "v", [0, 2, 1, 3])
        if sdpa:
            q = node("Mul", [q, "quarter_root"], f"{t}_q_scaled")
            k = node("Mul", [k, "quarter_root"], f"{t}_k_scaled")
            s = node("MatMul", [q, k], f"{t}_scores")
        else:
            s = node("Div", [node("MatMul", [q, k], f"{t}_qk"), "sqrt_dh"], f"{t}_scores")
        p = node("Softmax", [node("Add", [s, "ext_mask"], f"{t}_masked")], f"{t}_probs", axis=-1)
        ctx = node("Transpose", [node("MatMul", [p, v], f"{t}_ctx4")], f"{t}_ctx_t", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, dims(h, ["dd"], f"{t}_merge")], f"{t}_ctx")
        attn = node("MatMul", [ctx, const(f"{t}_o_w", [d, d])], f"{t}_o_mm")
        attn = node("Add", [attn, const(f"{t}_o_b", [d])], f"{t}_o")
        h = layer_norm(node("Add", [attn, h], f"{t}_res1"), f"{t}_ln1", decomposed=li == 0)
        inter = node("Add", [node("MatMul", [h, const(f"{t}_i_w", [d, ff])], f"{t}_i_mm"),
                             const(f"{t}_i_b", [ff])], f"{t}_i")
        erf = node("Erf", [node("Div", [inter, "sqrt2"], f"{t}_g_div")], f"{t}_g_erf")
        gelu = node("Mul", [node("Mul", [inter, "half"], f"{t}_g_half"),
                            node("Add", [erf, "one_f"], f"{t}_g_one")], f"{t}_gelu")
        out = node("Add", [node("MatMul", [gelu, const(f"{t}_out_w", [ff, d])], f"{t}_out_mm"),
                           const(f"{t}_out_b", [d])], f"{t}_ff")
        h = layer_norm(node("Add", [out, h], f"{t}_res2"), f"{t}_ln2", decomposed=False)
    nodes.append(helper.make_node("Identity", [h], ["last_hidden_state"]))
    cls = node("Gather", [h, "i0"], "cls", axis=1)
    pooled = node("Add", [node("MatMul", [cls, const("pool_w", [d, d])], "pool_mm"), const("pool_b", [d])],
                  "pool_lin")
    nodes.append(helper.make_node("Tanh", [pooled], ["pooler_output"]))
    # sentence-transformers' mean pooling: the mask expanded to the states' shape.
    me = node("Unsqueeze", ["attention_mask", "am1"], "pool_mask")
    me = node("Cast", [node("Expand", [me, node("Shape", [h], "h_shape")], "pool_mask_full")],
              "pool_maskf", to=TensorProto.FLOAT)
    total = node("ReduceSum", [node("Mul", [h, me], "pool_kept"), "a1"], "pool_total", keepdims=0)
    count = node("Clip", [node("ReduceSum", [me, "a1"], "pool_count", keepdims=0), "tiny"], "pool_count_c")
    nodes.append(helper.make_node("Div", [total, count], ["sentence_embedding"]))
    seq = lambda name: helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
    graph = helper.make_graph(
        nodes,
        "hf_roberta" if roberta else "hf_bert_sdpa" if sdpa else "hf_bert",
        [seq("input_ids"), seq("attention_mask")] + ([] if roberta else [seq("token_type_ids")]),
        [
            helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", d]),
            helper.make_tensor_value_info("pooler_output", TensorProto.FLOAT, ["batch", d]),
            helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", d]),
        ],
        inits,
    )
    return finished(graph)


def lstm_state(rng, f=4, h=8):
    """`x` [batch, time, F] f32 and an LSTM's initial state `h0`, `c0` [1, batch, H] as
    model inputs, as streaming audio models (voice-activity detectors) carry theirs from
    one chunk to the next: the LSTM over the time (its input transposed to sequence
    first), outputs the states at every step [batch, time, H] and the last ones
    `Y_h`, `Y_c` [1, batch, H] to feed the next chunk."""
    inits = [
        numpy_helper.from_array((rng.standard_normal([1, 4 * h, f]) * 0.4).astype(np.float32), "W"),
        numpy_helper.from_array((rng.standard_normal([1, 4 * h, h]) * 0.4).astype(np.float32), "R"),
        numpy_helper.from_array((rng.standard_normal([1, 8 * h]) * 0.1).astype(np.float32), "B"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
    ]
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
        helper.make_node("LSTM", ["xt", "W", "R", "B", "", "h0", "c0"], ["Y", "Y_h", "Y_c"], hidden_size=h),
        helper.make_node("Squeeze", ["Y", "one"], ["Ys"]),
        helper.make_node("Transpose", ["Ys"], ["out"], perm=[1, 0, 2]),
    ]
    state = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, "batch", h])
    graph = helper.make_graph(
        nodes,
        "lstm_state",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "time", f]), state("h0"), state("c0")],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "time", h]), state("Y_h"), state("Y_c")],
        inits,
    )
    return finished(graph)


def several_inputs(out, rng):
    """The models of several inputs, in OUT/masked_encoder and OUT/stateful."""
    for name, model in [("masked_encoder", masked_encoder(rng)), ("stateful", stateful(rng))]:
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        onnx.save(model, os.path.join(d, "model.onnx"))
    # Its own generator: the models above keep their weights.
    d = os.path.join(out, "lstm_state")
    os.makedirs(d, exist_ok=True)
    onnx.save(lstm_state(np.random.default_rng(11)), os.path.join(d, "model.onnx"))
    for name, sdpa, roberta in [("hf_bert", False, False), ("hf_bert_sdpa", True, False),
                                ("hf_roberta", True, True)]:
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        model = hf_bert(np.random.default_rng(7), sdpa=sdpa, roberta=roberta)
        onnx.save(model, os.path.join(d, "model.onnx"))


if __name__ == "__main__":
    main()
