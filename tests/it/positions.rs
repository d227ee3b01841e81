//! Values computed from the padded extents alone: positions expanded over the batch into
//! a position table, causal masks, sums over positions. In a batch they are computed at
//! the padded length; each sample alone computes them at its own. Exact where a sample's
//! width gives their prefix (checked against plain tract on each sample alone), refused,
//! naming the node, where it does not.

use crate::common::onnx::{Graph, Rng, int, ints};
use crate::common::{max_abs, plain_tract, samples, typed};
use tract_onnx::pb;
use tract_ragged::prelude::*;

/// `x` of `[N, L, 2]`, with `tail` given the graph, `x`, the padded length `L` (an int64
/// scalar from `Shape`) and the batch `N`.
fn model(tail: impl Fn(&mut Graph, &str, &str) -> String) -> pb::ModelProto {
    let mut g = Graph::default();
    let shape = g.op("Shape", &["x"], vec![]);
    let (zero, one) = (g.int64_scalar(0), g.int64_scalar(1));
    let n = g.op("Gather", &[&shape, &zero], vec![int("axis", 0)]);
    let l = g.op("Gather", &[&shape, &one], vec![int("axis", 0)]);
    let y = tail(&mut g, &l, &n);
    g.model("x", 3, &[&y])
}

/// `Range(0, L)`.
fn positions(g: &mut Graph, l: &str) -> String {
    let (zero, one) = (g.int64_scalar(0), g.int64_scalar(1));
    g.op("Range", &[&zero, l, &one], vec![])
}

fn unsqueeze(g: &mut Graph, x: &str, axis: i64) -> String {
    let axes = g.ints_const(&[axis]);
    g.op("Unsqueeze", &[x, &axes], vec![])
}

/// Batched in one ragged batch and in pairs, each sample against plain tract alone.
fn assert_exact(proto: &pb::ModelProto) {
    let model = typed(proto, "N,L,2,f32").unwrap();
    let runnable = RaggedModel::new(model, RaggedSpec::new("x", 1))
        .unwrap()
        .into_runnable()
        .unwrap();
    let samples = samples(&mut Rng(7), &[1, 2], 0, &[5, 1, 9, 3, 12, 2]);
    let expected: Vec<Tensor> = samples
        .iter()
        .map(|s| {
            let mut t = plain_tract(proto, s).unwrap();
            t.remove_axis(0).unwrap();
            t
        })
        .collect();
    for batch in [&samples[..], &samples[..2], &samples[2..4]] {
        let at = samples.iter().position(|s| s == &batch[0]).unwrap();
        let out = runnable.run_batch(batch).unwrap();
        for (k, o) in out.iter().enumerate() {
            let worst = max_abs(&o[0], &expected[at + k]);
            assert!(worst <= 1e-5, "sample {} differs by {worst}", at + k);
        }
    }
}

/// The refusal of `proto`'s ragged transform as the user reads it; of the refused kind.
fn refusal(proto: &pb::ModelProto) -> String {
    let model = typed(proto, "N,L,2,f32").unwrap();
    match RaggedModel::new(model, RaggedSpec::new("x", 1)) {
        Ok(_) => panic!("accepted"),
        Err(e) => {
            assert_eq!(error_kind(&e), ErrorKind::Refused, "{e:#}");
            format!("{e:#}")
        }
    }
}

/// BART's learned positions: `Range(0, L)` expanded to `[N, L]`, offset by 2, gathered
/// from a table, added to the tokens. (A table of 40 positions: the check computes them
/// at a padded length it holds.)
#[test]
fn positions_expanded_over_the_batch_index_a_table_as_alone() {
    let mut rng = Rng(3);
    let table = rng.vec(40 * 2, 1.0);
    assert_exact(&model(|g, l, n| {
        let r = positions(g, l);
        let (n1, l1) = (unsqueeze(g, n, 0), unsqueeze(g, l, 0));
        let nl = g.op("Concat", &[&n1, &l1], vec![int("axis", 0)]);
        let expanded = g.op("Expand", &[&r, &nl], vec![]);
        let two = g.ints_const(&[2]);
        let offset = g.op("Add", &[&expanded, &two], vec![]);
        let table = g.weight(&[40, 2], table.clone());
        let embedded = g.op("Gather", &[&table, &offset], vec![int("axis", 0)]);
        g.op("Add", &["x", &embedded], vec![])
    }));
}

/// GPT-2's causal mask: `Where(j <= i, 0, -1e9)` over `[L, L]`, added to the attention
/// scores before the softmax over keys.
#[test]
fn a_causal_mask_from_the_padded_length_masks_each_sample_as_alone() {
    assert_exact(&model(|g, l, _| {
        let r = positions(g, l);
        let (i, j) = (unsqueeze(g, &r, 1), unsqueeze(g, &r, 0));
        let causal = g.op("LessOrEqual", &[&j, &i], vec![]);
        let zero = g.weight(&[1], vec![0.0]);
        let minus = g.weight(&[1], vec![-1e9]);
        let mask = g.op("Where", &[&causal, &zero, &minus], vec![]);
        let keys = g.op("Transpose", &["x"], vec![ints("perm", &[0, 2, 1])]);
        let scores = g.op("MatMul", &["x", &keys], vec![]);
        let masked = g.op("Add", &[&scores, &mask], vec![]);
        let p = g.op("Softmax", &[&masked], vec![int("axis", -1)]);
        g.op("MatMul", &[&p, "x"], vec![])
    }));
}

/// The sum of the positions `0..L` is not what a sample of width `w` sums alone: refused,
/// naming the node that computes it.
#[test]
fn a_sum_over_the_padded_positions_is_refused_by_name() {
    let e = refusal(&model(|g, l, _| {
        let r = positions(g, l);
        let r = g.op("Cast", &[&r], vec![int("to", 1)]);
        let sum = g.op("ReduceSum", &[&r], vec![int("keepdims", 0)]);
        g.op("Add", &["x", &sum], vec![])
    }));
    // (tract folds the sum into a constant of L, named after the addition it feeds.)
    assert!(
        e.contains("computed from the padded extents by node"),
        "{e}"
    );
}

/// `x` scaled by a mask of its own (its first channel above zero) read back through
/// `read`: given the graph, the mask `[N, L]`, `L` and `N`.
fn masked_by(read: impl Fn(&mut Graph, &str, &str, &str) -> String) -> pb::ModelProto {
    model(|g, l, n| {
        let zero = g.int64_scalar(0);
        let first = g.op("Gather", &["x", &zero], vec![int("axis", 2)]);
        let nothing = g.weight(&[1], vec![0.0]);
        let mask = g.op("Greater", &[&first, &nothing], vec![]);
        let read = read(g, &mask, l, n);
        let read = g.op("Cast", &[&read], vec![int("to", 1)]);
        let read = unsqueeze(g, &read, 2);
        g.op("Mul", &["x", &read], vec![])
    })
}

/// transformers' padding mask at `(batch_idx, kv_idx)`, as TorchScript writes it: a
/// gather from the mask flattened to `[N*L]` at `batch_idx * L + kv_idx`. Read at
/// `L - 1 - kv_idx` instead, the same gather mixes positions: refused.
#[test]
fn a_mask_gathered_at_its_own_flattened_coordinates_is_read_as_alone() {
    let flat_index = |g: &mut Graph, l: &str, n: &str, reversed: bool| {
        let b = positions(g, n);
        let b = unsqueeze(g, &b, 1);
        let j = positions(g, l);
        let j = if reversed {
            let one = g.int64_scalar(1);
            let last = g.op("Sub", &[l, &one], vec![]);
            g.op("Sub", &[&last, &j], vec![])
        } else {
            j
        };
        let j = unsqueeze(g, &j, 0);
        let row = g.op("Mul", &[&b, l], vec![]);
        g.op("Add", &[&row, &j], vec![])
    };
    let gathered = |reversed: bool| {
        masked_by(move |g, mask, l, n| {
            let flat = g.op("Flatten", &[mask], vec![int("axis", 0)]);
            let zero = g.ints_const(&[0]);
            let flat = g.op("Squeeze", &[&flat, &zero], vec![]);
            let at = flat_index(g, l, n, reversed);
            g.op("Gather", &[&flat, &at], vec![int("axis", 0)])
        })
    };
    assert_exact(&gathered(false));
    refusal(&gathered(true));
}

/// The same mask as torch's dynamo exporter writes it: a `GatherND` of the pairs
/// `(batch_idx, kv_idx)` stacked along a last axis.
#[test]
fn a_mask_gathered_at_its_own_coordinates_by_pairs_is_read_as_alone() {
    assert_exact(&masked_by(|g, mask, l, n| {
        let (n1, l1) = (unsqueeze(g, n, 0), unsqueeze(g, l, 0));
        let shape = g.op("Concat", &[&n1, &l1], vec![int("axis", 0)]);
        let b = positions(g, n);
        let b = unsqueeze(g, &b, 1);
        let b = g.op("Expand", &[&b, &shape], vec![]);
        let j = positions(g, l);
        let j = unsqueeze(g, &j, 0);
        let j = g.op("Expand", &[&j, &shape], vec![]);
        let (b, j) = (unsqueeze(g, &b, 2), unsqueeze(g, &j, 2));
        let pairs = g.op("Concat", &[&b, &j], vec![int("axis", 2)]);
        g.op("GatherND", &[mask, &pairs], vec![])
    }));
}

/// RoBERTa's token types: a buffer expanded over the batch, read by `GatherElements` at
/// each token's position id (a cumulative sum along the sequence). Gathering the samples'
/// own tensor along their sequence that way reads positions past some widths: refused.
#[test]
fn a_buffer_gathered_at_each_tokens_position_is_read_as_alone() {
    let position_ids = |g: &mut Graph| {
        let zero = g.int64_scalar(0);
        let first = g.op("Gather", &["x", &zero], vec![int("axis", 2)]);
        // Ones that tract cannot fold: each token counts where its value is a number.
        let nan = g.op("IsNaN", &[&first], vec![]);
        let ones = g.op("Not", &[&nan], vec![]);
        // (Summed in f32: plain tract's CumSum of int64 casts types them as TDim and
        // cannot evaluate them.)
        let ones = g.op("Cast", &[&ones], vec![int("to", 1)]);
        let axis = g.int64_scalar(1);
        let ids = g.op("CumSum", &[&ones, &axis], vec![]);
        g.op("Cast", &[&ids], vec![int("to", 7)])
    };
    let mut rng = Rng(11);
    let buffer: Vec<f32> = rng.vec(30, 1.0);
    assert_exact(&model(|g, _, n| {
        let ids = position_ids(g);
        let table = g.weight(&[1, 30], buffer.clone());
        let thirty = g.ints_const(&[30]);
        let n1 = unsqueeze(g, n, 0);
        let shape = g.op("Concat", &[&n1, &thirty], vec![int("axis", 0)]);
        let expanded = g.op("Expand", &[&table, &shape], vec![]);
        let types = g.op("GatherElements", &[&expanded, &ids], vec![int("axis", 1)]);
        let types = unsqueeze(g, &types, 2);
        g.op("Add", &["x", &types], vec![])
    }));
    let e = refusal(&model(|g, _, _| {
        let ids = position_ids(g);
        let zero = g.int64_scalar(0);
        let first = g.op("Gather", &["x", &zero], vec![int("axis", 2)]);
        let read = g.op("GatherElements", &[&first, &ids], vec![int("axis", 1)]);
        let read = unsqueeze(g, &read, 2);
        g.op("Add", &["x", &read], vec![])
    }));
    assert!(e.contains("a sample axis of its data"), "{e}");
}

/// A branch graph of `nodes` whose output is `output` (of no declared type).
fn branch(nodes: Vec<pb::NodeProto>, output: &str) -> pb::GraphProto {
    pb::GraphProto {
        name: format!("{output}_branch"),
        node: nodes,
        output: vec![pb::ValueInfoProto {
            name: output.into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn graph_attribute(name: &str, graph: pb::GraphProto) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        r#type: pb::attribute_proto::AttributeType::Graph as i32,
        g: Some(graph),
        ..Default::default()
    }
}

/// DeBERTa's scripted attention: `if q.size(-2) != k.size(-2)` recomputes its relative
/// positions. Both are `L`: the condition is false for every `L`, so the branch is decided
/// before typing, though its two sides differ by a unit axis and tract cannot type it
/// undecided; exact as alone.
#[test]
fn an_if_on_two_sizes_of_one_length_takes_its_branch_for_every_length() {
    let proto = model(|g, l, _| {
        let keys = g.op("Relu", &["x"], vec![]);
        let shape = g.op("Shape", &[&keys], vec![]);
        let one = g.int64_scalar(1);
        let k = g.op("Gather", &[&shape, &one], vec![int("axis", 0)]);
        let same = g.op("Equal", &[l, &k], vec![]);
        let differ = g.op("Not", &[&same], vec![]);
        let then = branch(
            vec![pb::NodeProto {
                op_type: "Unsqueeze".into(),
                input: vec!["x".into(), "axes_zero".into()],
                output: vec!["then_out".into()],
                ..Default::default()
            }],
            "then_out",
        );
        let mut then = then;
        then.initializer.push(pb::TensorProto {
            name: "axes_zero".into(),
            dims: vec![1],
            data_type: 7,
            int64_data: vec![0],
            ..Default::default()
        });
        let otherwise = branch(
            vec![pb::NodeProto {
                op_type: "Relu".into(),
                input: vec![keys.clone()],
                output: vec!["else_out".into()],
                ..Default::default()
            }],
            "else_out",
        );
        let taken = g.op(
            "If",
            &[&differ],
            vec![
                graph_attribute("then_branch", then),
                graph_attribute("else_branch", otherwise),
            ],
        );
        g.op("Add", &[&taken, "x"], vec![])
    });
    let model = typed(&proto, "N,L,2,f32").expect("typed symbolically");
    assert!(
        model.nodes().iter().all(|n| !n.op.name().contains("If")),
        "{model}"
    );
    // Plain tract cannot run it (it types both branches); the branch taken is `relu(x) + x`.
    let runnable = RaggedModel::new(model, RaggedSpec::new("x", 1))
        .unwrap()
        .into_runnable()
        .unwrap();
    let samples = samples(&mut Rng(3), &[1, 2], 0, &[4, 1, 7]);
    let out = runnable.run_batch(&samples).unwrap();
    for (sample, out) in samples.iter().zip(&out) {
        let expected = sample
            .to_plain_array_view::<f32>()
            .unwrap()
            .mapv(|v| v.max(0.0) + v)
            .into_tensor();
        assert_eq!(max_abs(&out[0], &expected), 0.0);
    }
}

/// ConvBERT's span convolution: the values unfolded over a window of 5 positions, as
/// torch exports it: padded by 2 zeros each side, gathered at `Range(L) + [0..5]`. Each
/// sample's windows read zeros past its own end, as alone.
#[test]
fn windows_gathered_from_a_zero_padded_sequence_read_zeros_past_each_end() {
    let proto = model(|g, l, _| {
        let channels_first = g.op("Transpose", &["x"], vec![ints("perm", &[0, 2, 1])]);
        let pads = g.ints_const(&[0, 0, 2, 0, 0, 2]);
        let padded = g.op("Pad", &[&channels_first, &pads], vec![]);
        let at = positions(g, l);
        let at = unsqueeze(g, &at, 0);
        let offsets = {
            let name = g.ints_const(&[0, 1, 2, 3, 4]);
            unsqueeze(g, &name, 1)
        };
        let windows = g.op("Add", &[&at, &offsets], vec![]);
        let gathered = g.op("Gather", &[&padded, &windows], vec![int("axis", 2)]);
        let positions_first = g.op("Transpose", &[&gathered], vec![ints("perm", &[0, 3, 1, 2])]);
        let shape = g.ints_const(&[0, 0, 10]);
        g.op("Reshape", &[&positions_first, &shape], vec![])
    });
    assert_exact(&proto);
}

/// DeBERTa's relative attention: a table of `2M` relative positions cut to the `2s` rows
/// around its middle (`s = min(L, M)`, a window that moves with the padded length),
/// projected, multiplied with the queries and gathered at `clamp(i - j + s, 0, 2s - 1)`.
/// Lengths past `M` (clamped) and below it are in one batch.
#[test]
fn a_table_window_moving_with_the_padded_length_gathered_at_relative_positions_is_as_alone() {
    let mut rng = Rng(5);
    let (table, projection) = (rng.vec(16 * 2, 1.0), rng.vec(2 * 2, 1.0));
    assert_exact(&model(|g, l, n| {
        let m = g.int64_scalar(8);
        let span = g.op("Min", &[l, &m], vec![]);
        let start = g.op("Sub", &[&m, &span], vec![]);
        let end = g.op("Add", &[&m, &span], vec![]);
        let (start, end) = (unsqueeze(g, &start, 0), unsqueeze(g, &end, 0));
        let axes = g.ints_const(&[0]);
        let table = g.weight(&[16, 2], table.clone());
        let window = g.op("Slice", &[&table, &start, &end, &axes], vec![]);
        let projection = g.weight(&[2, 2], projection.clone());
        let keys = g.op("MatMul", &[&window, &projection], vec![]);
        let keys = g.op("Transpose", &[&keys], vec![ints("perm", &[1, 0])]);
        let scores = g.op("MatMul", &["x", &keys], vec![]);
        let r = positions(g, l);
        let (i, j) = (unsqueeze(g, &r, 1), unsqueeze(g, &r, 0));
        let relative = g.op("Sub", &[&i, &j], vec![]);
        // `[1, L, L]`, as DeBERTa builds them.
        let relative = unsqueeze(g, &relative, 0);
        let shifted = g.op("Add", &[&relative, &span], vec![]);
        let zero = g.int64_scalar(0);
        let (one, two) = (g.int64_scalar(1), g.int64_scalar(2));
        let rows = g.op("Mul", &[&span, &two], vec![]);
        let last = g.op("Sub", &[&rows, &one], vec![]);
        let at = g.op("Max", &[&shifted, &zero], vec![]);
        let at = g.op("Min", &[&at, &last], vec![]);
        let (n1, l1) = (unsqueeze(g, n, 0), unsqueeze(g, l, 0));
        let nll = g.op("Concat", &[&n1, &l1, &l1], vec![int("axis", 0)]);
        let at = g.op("Expand", &[&at, &nll], vec![]);
        let biased = g.op("GatherElements", &[&scores, &at], vec![int("axis", 2)]);
        let p = g.op("Softmax", &[&biased], vec![int("axis", -1)]);
        g.op("MatMul", &[&p, "x"], vec![])
    }));
}

/// Whisper's encoder adds its table of positions whole: it takes its fixed frame count
/// only. Given that count in the fact, samples of it batch exactly (a narrower one is
/// refused, as the fact says); with the extent left to the samples, the model is refused.
#[test]
fn a_table_added_whole_along_a_fixed_extent_takes_samples_of_that_extent_only() {
    let mut rng = Rng(9);
    let mut g = Graph::default();
    let table = g.weight(&[6, 2], rng.vec(6 * 2, 1.0));
    let positioned = g.op("Add", &["x", &table], vec![]);
    let keys = g.op("Transpose", &[&positioned], vec![ints("perm", &[0, 2, 1])]);
    let scores = g.op("MatMul", &[&positioned, &keys], vec![]);
    let p = g.op("Softmax", &[&scores], vec![int("axis", -1)]);
    let y = g.op("MatMul", &[&p, &positioned], vec![]);
    let proto = g.model("x", 3, &[&y]);
    let runnable = RaggedModel::new(typed(&proto, "N,6,2,f32").unwrap(), RaggedSpec::new("x", 1))
        .unwrap()
        .into_runnable()
        .unwrap();
    let full = samples(&mut rng, &[1, 2], 0, &[6, 6, 6]);
    let out = runnable.run_batch(&full).unwrap();
    for (k, o) in out.iter().enumerate() {
        let mut alone = plain_tract(&proto, &full[k]).unwrap();
        alone.remove_axis(0).unwrap();
        let worst = max_abs(&o[0], &alone);
        assert!(worst <= 1e-5, "sample {k} differs by {worst}");
    }
    let narrow = samples(&mut rng, &[1, 2], 0, &[6, 4]);
    let e = format!("{:#}", runnable.run_batch(&narrow).unwrap_err());
    assert!(
        e.contains("sample 1 has extent 4") && e.contains("expects 6"),
        "{e}"
    );
    let model = typed(&proto, "N,L,2,f32");
    let e = match model.and_then(|m| RaggedModel::new(m, RaggedSpec::new("x", 1))) {
        Ok(_) => panic!("accepted with the extent left to the samples"),
        Err(e) => format!("{e:#}"),
    };
    assert!(e.contains("mixing op") || e.contains("Add"), "{e}");
}

/// Zeros made from the input's shape by a `ConstantOfShape` without a value (dynamo's
/// `new_zeros`, Swin's shifted-window mask) are float32, as ONNX says: added to the
/// input, they type (tract-onnx's own loader makes them f64, and the product below then
/// fails to type), and a batch gives each sample `x @ w`, computed here.
#[test]
fn zeros_of_the_inputs_shape_without_a_value_are_float32() {
    let w = [0.5f32, -1.0, 2.0, 0.25];
    let proto = model(|g, _, _| {
        let shape = g.op("Shape", &["x"], vec![]);
        let zeros = g.op("ConstantOfShape", &[&shape], vec![]);
        let sum = g.op("Add", &["x", &zeros], vec![]);
        let w = g.weight(&[2, 2], w.to_vec());
        g.op("MatMul", &[&sum, &w], vec![])
    });
    let runnable = RaggedModel::new(typed(&proto, "N,L,2,f32").unwrap(), RaggedSpec::new("x", 1))
        .unwrap()
        .into_runnable()
        .unwrap();
    let samples = samples(&mut Rng(13), &[1, 2], 0, &[5, 1, 9]);
    let out = runnable.run_batch(&samples).unwrap();
    for (k, (o, x)) in out.iter().zip(&samples).enumerate() {
        let x = x.to_plain_array_view::<f32>().unwrap();
        let mut expected = vec![];
        for row in x.outer_iter() {
            for j in 0..2 {
                expected.push(row[0] * w[j] + row[1] * w[2 + j]);
            }
        }
        let expected = Tensor::from_shape(&[x.shape()[0], 2], &expected).unwrap();
        let worst = max_abs(&o[0], &expected);
        assert!(worst <= 1e-6, "sample {k} differs by {worst}");
    }
}

/// Position ids summed from a mask along the sequence and cast to int64 (a `TDim` for
/// tract), read from a table, negated, their absolute values and signs, and channels
/// permuted by a `GatherElements` (`common::models::position_arithmetic`, which
/// `tests/cuda.rs` runs on the device): each sample in a ragged batch as plain tract
/// alone.
#[test]
fn position_ids_summed_from_a_mask_and_gathered_elements_are_as_alone() {
    let proto = crate::common::models::position_arithmetic(&mut Rng(21));
    let model = typed(&proto, "N,L,4,f32").unwrap();
    let runnable = RaggedModel::new(model, RaggedSpec::new("x", 1))
        .unwrap()
        .into_runnable()
        .unwrap();
    let samples = samples(&mut Rng(8), &[1, 4], 0, &[7, 3, 12, 1, 5, 30]);
    let out = runnable.run_batch(&samples).unwrap();
    for (k, (o, s)) in out.iter().zip(&samples).enumerate() {
        let mut alone = plain_tract(&proto, s).unwrap();
        alone.remove_axis(0).unwrap();
        let worst = max_abs(&o[0], &alone);
        assert!(worst <= 1e-6, "sample {k} differs by {worst}");
    }
}
