//! Element-wise ops tract-cuda leaves on the host, written as ops it runs on the device.
//!
//! tract's declutter fuses some chains into ops of its own that tract-cuda has no kernel
//! for, and an exported model holds others: each then stays on the host between a plan's
//! syncs, a download and an upload of its whole tensor. Transformers encoders are full of
//! them (measured on the zoo, `benches/gpu.sh`'s `zoohost` step). Before tract-cuda's
//! transform each becomes the ops it stands for, which tract-cuda runs (and the fusion
//! pass then chains, [`super::fusion`]):
//! - `GeluExact` (transformers' `gelu`, BERT's and wav2vec2's activation):
//!   `(x * 0.5) * (erf(x * 1/√2) + 1)`, in the order tract's host kernel computes it;
//! - `PowConst` (`gelu_new`'s `x ** 3`, GPT-2 and ALBERT): `Pow(x, e)`, which tract's own
//!   `PowConst` is the unary form of (both `powf`);
//! - `IsNan` (the guard torch's exporter writes after an attention softmax): `x != x`;
//! - on signed integers (tract-cuda's element-wise kernels are for floats), `Neg` as
//!   `0 - x`, `Abs` as `max(x, 0 - x)` and `Sign` as `(x > 0) - (x < 0)`: transformers'
//!   relative positions (MPNet's buckets, DeBERTa's), exact either way.
//!
//! One-by-one and batched plans are rewritten alike: a sample reads the same kernels
//! either way. Against the host, the device's `erff` and `powf` may differ from tract's in
//! the last bits, as every device kernel may.

use tract_core::internal::*;
use tract_core::ops::binary::TypedBinOp;
use tract_core::ops::cast::cast;
use tract_core::ops::element_wise::ElementWiseOp;
use tract_core::ops::logic::{comp_gt, comp_lt, comp_ne};
use tract_core::ops::math::{IsNan, PowConst};
use tract_core::ops::nn::GeluExact;

/// Rewrites every `GeluExact`, `PowConst` and `IsNan` of f32 or f16, and every `Neg`,
/// `Abs` and `Sign` of signed integers, into ops tract-cuda runs (module doc); how many
/// were.
pub fn element_wise_for_the_device(model: &mut TypedModel) -> TractResult<usize> {
    let mut done = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        let Some(op) = node.op_as::<ElementWiseOp>() else {
            continue;
        };
        let Some(&input) = node.inputs.first() else {
            continue;
        };
        let dt = model.outlet_fact(input)?.datum_type;
        let float = matches!(dt, DatumType::F32 | DatumType::F16);
        let signed = matches!(
            dt,
            DatumType::I8 | DatumType::I16 | DatumType::I32 | DatumType::I64
        );
        if !(float || signed) || op.1.is_some() {
            continue;
        }
        let mini = op.0.as_ref();
        let mut patch = TypedModelPatch::default();
        let x = patch.tap_model(model, input)?;
        let rank = patch.outlet_fact(x)?.rank();
        let scalar = |patch: &mut TypedModelPatch, name: &str, v: f32| -> TractResult<OutletId> {
            let t = tensor0(v).cast_to_dt(dt)?.into_owned();
            patch.add_const(
                format!("{}.{name}", node.name),
                t.broadcast_into_rank(rank)?,
            )
        };
        let integer = |patch: &mut TypedModelPatch, name: &str, v: i64| -> TractResult<OutletId> {
            let t = tensor0(v).cast_to_dt(dt)?.into_owned();
            patch.add_const(
                format!("{}.{name}", node.name),
                t.broadcast_into_rank(rank)?,
            )
        };
        let name = |step: &str| format!("{}.{step}", node.name);
        let y = if signed {
            let zero = integer(&mut patch, "zero", 0)?;
            let name_of = mini.name();
            match &*name_of {
                "Neg" => patch.wire_node(name("neg"), tract_core::ops::math::sub(), &[zero, x])?[0],
                "Abs" => {
                    let neg =
                        patch.wire_node(name("neg"), tract_core::ops::math::sub(), &[zero, x])?[0];
                    patch.wire_node(name("abs"), tract_core::ops::math::max(), &[x, neg])?[0]
                }
                "Sign" => {
                    let above =
                        patch.wire_node(name("above"), TypedBinOp(comp_gt(), None), &[x, zero])?[0];
                    let below =
                        patch.wire_node(name("below"), TypedBinOp(comp_lt(), None), &[x, zero])?[0];
                    let above = patch.wire_node(name("above_int"), cast(dt), &[above])?[0];
                    let below = patch.wire_node(name("below_int"), cast(dt), &[below])?[0];
                    patch.wire_node(name("sign"), tract_core::ops::math::sub(), &[above, below])?[0]
                }
                _ => continue,
            }
        } else if mini.is::<GeluExact>() {
            let c = scalar(&mut patch, "inv_sqrt2", 2f32.sqrt().recip())?;
            let (half, one) = (
                scalar(&mut patch, "half", 0.5)?,
                scalar(&mut patch, "one", 1.0)?,
            );
            let s = patch.wire_node(name("scaled"), tract_core::ops::math::mul(), &[x, c])?[0];
            let e = patch.wire_node(name("erf"), tract_core::ops::math::erf(), &[s])?[0];
            let e = patch.wire_node(name("erf_1"), tract_core::ops::math::add(), &[e, one])?[0];
            let h = patch.wire_node(name("half_x"), tract_core::ops::math::mul(), &[x, half])?[0];
            patch.wire_node(name("gelu"), tract_core::ops::math::mul(), &[h, e])?[0]
        } else if let Some(pow) = mini.downcast_ref::<PowConst>() {
            let e = scalar(&mut patch, "exponent", pow.exponent)?;
            patch.wire_node(name("pow"), tract_core::ops::math::pow(), &[x, e])?[0]
        } else if mini.is::<IsNan>() {
            patch.wire_node(name("ne_self"), TypedBinOp(comp_ne(), None), &[x, x])?[0]
        } else {
            continue;
        };
        patch.shunt_outside(model, OutletId::new(id, 0), y)?;
        patch.apply(model)?;
        done += 1;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tract_core::ops::element_wise::ElementWiseOp;

    /// `x` through `op`, then rewritten: the same values on the host (tract's own ops
    /// either way), and none of the three ops left.
    fn rewritten_computes_the_same(op: ElementWiseOp, x: Tensor) {
        let mut model = TypedModel::default();
        let source = model
            .add_source("x", x.datum_type().fact(x.shape()))
            .unwrap();
        let y = model.wire_node("op", op, &[source]).unwrap();
        model.select_output_outlets(&y).unwrap();
        let before = model
            .clone()
            .into_runnable()
            .unwrap()
            .run(tvec!(x.clone().into_tvalue()))
            .unwrap();
        let mut after = model.clone();
        assert_eq!(element_wise_for_the_device(&mut after).unwrap(), 1);
        assert!(
            after
                .nodes()
                .iter()
                .all(|n| n.op_as::<ElementWiseOp>().is_none_or(|e| {
                    !e.0.is::<GeluExact>()
                        && !e.0.is::<PowConst>()
                        && !e.0.is::<IsNan>()
                        && !matches!(&*e.0.name(), "Neg" | "Abs" | "Sign")
                })),
            "{after}"
        );
        let got = after
            .into_runnable()
            .unwrap()
            .run(tvec!(x.into_tvalue()))
            .unwrap();
        if !before[0].datum_type().is_float() {
            assert_eq!(before[0], got[0]);
        } else {
            let (b, g) = (
                before[0].to_plain_array_view::<f32>().unwrap(),
                got[0].to_plain_array_view::<f32>().unwrap(),
            );
            for (b, g) in b.iter().zip(g.iter()) {
                assert!((b - g).abs() <= 1e-6 * b.abs().max(1.0), "{b} vs {g}");
            }
        }
    }

    fn values() -> Tensor {
        let v: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) / 7.0).collect();
        tensor1(&v).into_shape(&[4, 16]).unwrap()
    }

    #[test]
    fn an_exact_gelu_becomes_its_erf_chain() {
        rewritten_computes_the_same(ElementWiseOp(Box::new(GeluExact {}), None), values());
    }

    #[test]
    fn a_constant_power_becomes_a_pow() {
        let op = ElementWiseOp(Box::new(PowConst { exponent: 3.0 }), None);
        rewritten_computes_the_same(op, values());
    }

    #[test]
    fn is_nan_becomes_a_comparison_with_itself() {
        let mut v: Vec<f32> = (0..64).map(|i| i as f32).collect();
        v[3] = f32::NAN;
        let x = tensor1(&v).into_shape(&[4, 16]).unwrap();
        rewritten_computes_the_same(ElementWiseOp(Box::new(IsNan {}), None), x);
    }

    #[test]
    fn integer_negations_absolute_values_and_signs_become_binary_ops() {
        use tract_core::ops::math::{Abs, Neg, Sign};
        let v: Vec<i64> = (0..64).map(|i| (i - 30) * 1_000_000_007).collect();
        let x = tensor1(&v).into_shape(&[4, 16]).unwrap();
        for op in [
            ElementWiseOp(Box::new(Neg {}), None),
            ElementWiseOp(Box::new(Abs {}), None),
            ElementWiseOp(Box::new(Sign {}), None),
        ] {
            rewritten_computes_the_same(op, x.clone());
        }
        let v: Vec<i32> = (0..64).map(|i| i - 30).collect();
        let x = tensor1(&v).into_shape(&[4, 16]).unwrap();
        rewritten_computes_the_same(ElementWiseOp(Box::new(Sign {}), None), x);
    }
}
