//! Quantized models' integer ops, written for the device.
//!
//! Dynamically quantized models (int8 encoders from ONNX Runtime's `quantize_dynamic`)
//! multiply 8-bit integers into 32-bit sums and read int8 tables dequantized. tract-cuda
//! has no integer product, no dequantization and gathers only floats and `i64`, so each
//! of those stayed on the host between two syncs. Before tract-cuda's transform:
//! - each `MatMulInteger` (tract-onnx writes a quantized `EinSum`: its two operands, then
//!   a bias, zero points and scales, the scales 1 and the bias 0) whose zero points are one
//!   value each becomes what it computes: both operands cast to `i32`, their zero points
//!   subtracted, and a plain `i32` product, which tract-cuda writes as a `PrefixMatMul`
//!   and [`super::ops::integer_matmul`] runs;
//! - a constant int8 table gathered, then dequantized (the embeddings: token ids into
//!   `weight_quantized`), is dequantized whole once and gathered as floats;
//! - any other `DequantizeLinearF32` becomes its arithmetic, `(x - zero point) as f32 *
//!   scale`: a cast to `i32`, a subtraction, a cast to `f32`, a product.
//!
//! Integers, and the same float operations in the same order: the same bits as tract's
//! host kernels. A product with zero points per row or column, or scales other than 1 (a
//! `QLinearMatMul`, whose output is requantized), is left as it is, on the host.

use tract_core::internal::*;
use tract_core::ops::array::Gather;
use tract_core::ops::cast::cast;
use tract_core::ops::einsum::EinSum;
use tract_core::ops::quant::DequantizeLinearF32;

/// Every rewrite of the module doc; how many nodes were rewritten.
pub fn quantized_for_the_device(model: &mut TypedModel) -> TractResult<usize> {
    Ok(integer_products_over_i32(model)?
        + dequantized_tables(model)?
        + dequantizations_as_arithmetic(model)?)
}

/// Rewrites each quantized product to `i32` as casts, subtractions and a plain product
/// over `i32` (module doc); how many were.
pub fn integer_products_over_i32(model: &mut TypedModel) -> TractResult<usize> {
    let mut done = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        let Some(op) = node.op_as::<EinSum>() else {
            continue;
        };
        let Some(zero_points) = plain_integer_product(model, node, op)? else {
            continue;
        };
        let (ins, outs) = op.axes.to_strs();
        let axes = AxesMapping::from_strs(&ins[..2], &outs)?;
        let mut patch = TypedModelPatch::default();
        let mut operands = tvec!();
        for (slot, zero_point) in zero_points.into_iter().enumerate() {
            let name = format!("{}.operand_{slot}", node.name);
            let x = patch.tap_model(model, node.inputs[slot])?;
            let mut x = patch.wire_node(format!("{name}.i32"), cast(DatumType::I32), &[x])?[0];
            if zero_point != 0 {
                let rank = patch.outlet_fact(x)?.rank();
                let zp = tensor0(zero_point).broadcast_into_rank(rank)?;
                let zp = patch.add_const(format!("{name}.zero_point"), zp)?;
                x = patch.wire_node(
                    format!("{name}.centred"),
                    tract_core::ops::math::sub(),
                    &[x, zp],
                )?[0];
            }
            operands.push(x);
        }
        let product = EinSum::new(axes, DatumType::I32);
        let y = patch.wire_node(&node.name, product, &operands)?[0];
        patch.shunt_outside(model, OutletId::new(id, 0), y)?;
        patch.apply(model)?;
        done += 1;
    }
    Ok(done)
}

/// The zero points of the two operands of `op`, a quantized product to `i32` of integers
/// whose bias and output zero point are 0, its scales 1 and each zero point one value;
/// `None` for any other product.
fn plain_integer_product(
    model: &TypedModel,
    node: &TypedNode,
    op: &EinSum,
) -> TractResult<Option<[i32; 2]>> {
    if op.q_params != Some(DatumType::I32) || node.inputs.len() != 9 {
        return Ok(None);
    }
    for slot in 0..2 {
        let dt = model.outlet_fact(node.inputs[slot])?.datum_type;
        if !matches!(dt, DatumType::I8 | DatumType::U8 | DatumType::I32) {
            return Ok(None);
        }
    }
    // One value for the whole tensor, whatever its shape, as f64 (exact for these types).
    let uniform = |slot: usize| -> TractResult<Option<f64>> {
        let fact = model.outlet_fact(node.inputs[slot])?;
        let Some(k) = fact.konst.as_ref() else {
            return Ok(None);
        };
        let values = k.cast_to::<f64>()?;
        let values = values.to_plain_array_view::<f64>()?;
        let Some(&first) = values.iter().next() else {
            return Ok(None);
        };
        Ok(values.iter().all(|v| *v == first).then_some(first))
    };
    // bias, a0, a_scale, b0, b_scale, c0, c_scale
    let [bias, a0, a_scale, b0, b_scale, c0, c_scale] = [2, 3, 4, 5, 6, 7, 8].map(uniform);
    let (Some(bias), Some(a0), Some(a_scale), Some(b0), Some(b_scale), Some(c0), Some(c_scale)) =
        (bias?, a0?, a_scale?, b0?, b_scale?, c0?, c_scale?)
    else {
        return Ok(None);
    };
    if bias != 0.0 || c0 != 0.0 || a_scale != 1.0 || b_scale != 1.0 || c_scale != 1.0 {
        return Ok(None);
    }
    let integer = |v: f64| (v.fract() == 0.0 && v.abs() < 1e9).then_some(v as i32);
    Ok(integer(a0).zip(integer(b0)).map(|(a0, b0)| [a0, b0]))
}

/// The dequantization of `node`, if it is one.
fn dequantization(node: &TypedNode) -> Option<&DequantizeLinearF32> {
    node.op_as::<DequantizeLinearF32>()
}

/// `table` dequantized as tract's `DequantizeLinearF32` computes it.
fn dequantized(table: &Tensor, op: &DequantizeLinearF32) -> TractResult<Tensor> {
    let integers = table.cast_to::<i32>()?;
    let values = integers
        .to_plain_array_view::<i32>()?
        .mapv(|x| (x - op.zero_point) as f32 * op.scale);
    Ok(values.into_tensor())
}

/// Rewrites each gather from a constant integer table whose every use is one
/// dequantization as a gather from the table dequantized (module doc); how many were.
pub fn dequantized_tables(model: &mut TypedModel) -> TractResult<usize> {
    let mut done = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        let Some(gather) = node.op_as::<Gather>() else {
            continue;
        };
        let Some(table) = model.outlet_fact(node.inputs[0])?.konst.clone() else {
            continue;
        };
        let uses = model.outlet_successors(OutletId::new(id, 0));
        let [only] = uses else {
            continue;
        };
        let user = model.node(only.node);
        let Some(op) = dequantization(user) else {
            continue;
        };
        if model.output_outlets()?.contains(&OutletId::new(id, 0)) {
            continue;
        }
        if !matches!(
            table.datum_type(),
            DatumType::I8 | DatumType::U8 | DatumType::I32
        ) {
            continue;
        }
        let mut patch = TypedModelPatch::default();
        let table = patch.add_const(
            format!("{}.dequantized", user.name),
            dequantized(&table, op)?,
        )?;
        let indices = patch.tap_model(model, node.inputs[1])?;
        let y = patch.wire_node(&node.name, gather.clone(), &[table, indices])?[0];
        patch.shunt_outside(model, OutletId::new(user.id, 0), y)?;
        patch.apply(model)?;
        done += 1;
    }
    Ok(done)
}

/// Rewrites each `DequantizeLinearF32` as its arithmetic (module doc); how many were.
pub fn dequantizations_as_arithmetic(model: &mut TypedModel) -> TractResult<usize> {
    let mut done = 0;
    for id in model.eval_order()? {
        let node = model.node(id);
        let Some(op) = dequantization(node) else {
            continue;
        };
        let (scale, zero_point) = (op.scale, op.zero_point);
        let mut patch = TypedModelPatch::default();
        let x = patch.tap_model(model, node.inputs[0])?;
        let rank = patch.outlet_fact(x)?.rank();
        let name = |step: &str| format!("{}.{step}", node.name);
        let x = patch.wire_node(name("i32"), cast(DatumType::I32), &[x])?[0];
        let zp = patch.add_const(
            name("zero_point"),
            tensor0(zero_point).broadcast_into_rank(rank)?,
        )?;
        let x = patch.wire_node(name("centred"), tract_core::ops::math::sub(), &[x, zp])?[0];
        let x = patch.wire_node(name("f32"), cast(DatumType::F32), &[x])?[0];
        let scale = patch.add_const(name("scale"), tensor0(scale).broadcast_into_rank(rank)?)?;
        let y = patch.wire_node(name("scaled"), tract_core::ops::math::mul(), &[x, scale])?[0];
        patch.shunt_outside(model, OutletId::new(id, 0), y)?;
        patch.apply(model)?;
        done += 1;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `a (u8) x b (i8)` as tract-onnx writes a `MatMulInteger` with zero points 3 and
    /// -2: rewritten, the same integers, and no quantized product left.
    #[test]
    fn a_quantized_product_becomes_a_product_over_i32() {
        let mut model = TypedModel::default();
        let a = model.add_source("a", u8::fact([5, 4])).unwrap();
        let b_values: Vec<i8> = (0..12).map(|i| (i * 37 % 255 - 127) as i8).collect();
        let b = model
            .add_const("b", tensor1(&b_values).into_shape(&[4, 3]).unwrap())
            .unwrap();
        let scalar = |model: &mut TypedModel, name: &str, t: Tensor| model.add_const(name, t);
        let bias = scalar(&mut model, "bias", tensor0(0i32)).unwrap();
        let a0 = scalar(&mut model, "a0", tensor0(3u8)).unwrap();
        let one = scalar(&mut model, "one", tensor0(1f32)).unwrap();
        let b0 = scalar(&mut model, "b0", tensor0(-2i8)).unwrap();
        let c0 = scalar(&mut model, "c0", tensor0(0i32)).unwrap();
        let axes =
            AxesMapping::from_strs(&["mk", "kn", "", "", "", "", "", "", ""], &["mn"]).unwrap();
        let op = EinSum {
            axes,
            operating_dt: DatumType::I32,
            q_params: Some(DatumType::I32),
        };
        let y = model
            .wire_node("mm", op, &[a, b, bias, a0, one, b0, one, c0, one])
            .unwrap();
        model.select_output_outlets(&y).unwrap();
        let a_values: Vec<u8> = (0..20).map(|i| (i * 53 % 256) as u8).collect();
        let a = tensor1(&a_values).into_shape(&[5, 4]).unwrap();
        let expected: Vec<i32> = (0..5)
            .flat_map(|m| {
                let (a, b) = (&a_values, &b_values);
                (0..3).map(move |n| {
                    (0..4)
                        .map(|k| (a[m * 4 + k] as i32 - 3) * (b[k * 3 + n] as i32 + 2))
                        .sum()
                })
            })
            .collect();
        let mut after = model.clone();
        assert_eq!(integer_products_over_i32(&mut after).unwrap(), 1);
        assert!(
            after
                .nodes()
                .iter()
                .all(|n| n.op_as::<EinSum>().is_none_or(|e| e.q_params.is_none())),
            "{after}"
        );
        let got = after
            .into_runnable()
            .unwrap()
            .run(tvec!(a.into_tvalue()))
            .unwrap();
        let expected = tensor1(&expected).into_shape(&[5, 3]).unwrap();
        assert_eq!(*got[0], expected);
    }

    /// An int8 table gathered then dequantized, and a dequantization of a gathered
    /// table used twice: rewritten, the same bits, and no dequantization left.
    #[test]
    fn dequantizations_become_float_tables_and_arithmetic() {
        let mut model = TypedModel::default();
        let ids = model.add_source("ids", i64::fact([5])).unwrap();
        let values: Vec<i8> = (0..24).map(|i| (i * 41 % 255 - 127) as i8).collect();
        let table = model
            .add_const("table", tensor1(&values).into_shape(&[8, 3]).unwrap())
            .unwrap();
        let dq = || DequantizeLinearF32 {
            scale: 0.0173,
            zero_point: -5,
        };
        let gathered = model
            .wire_node("gather", Gather::new(0), &[table, ids])
            .unwrap()[0];
        let a = model.wire_node("dq", dq(), &[gathered]).unwrap()[0];
        let again = model
            .wire_node("gather_again", Gather::new(0), &[table, ids])
            .unwrap()[0];
        let b = model.wire_node("dq_again", dq(), &[again]).unwrap()[0];
        let c = model.wire_node("dq_twice", dq(), &[again]).unwrap()[0];
        model.select_output_outlets(&[a, b, c]).unwrap();
        let ids = tensor1(&[3i64, 0, 7, 7, 2]);
        let before = model
            .clone()
            .into_runnable()
            .unwrap()
            .run(tvec!(ids.clone().into_tvalue()))
            .unwrap();
        let mut after = model.clone();
        assert_eq!(quantized_for_the_device(&mut after).unwrap(), 3);
        assert!(
            after.nodes().iter().all(|n| dequantization(n).is_none()),
            "{after}"
        );
        let got = after
            .into_runnable()
            .unwrap()
            .run(tvec!(ids.into_tvalue()))
            .unwrap();
        assert_eq!(before, got);
    }
}
