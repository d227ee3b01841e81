//! Element-wise chains fused into one pass give the same bits as their ops one by one.
//!
//! Random graphs of binary ops (with broadcast constants, values read twice, values also
//! needed outside their chain, model outputs in the middle of a chain, and ops that break
//! chains) are fused on the host with [`tract_ragged::elementwise::fuse_host`] and run
//! against the unfused model. The CUDA kernels generated from the same programs are held
//! to the same bits in tests/cuda.rs.

use crate::common;
use crate::common::models::{binop_graph, binop_step, bn_hard_swish};
use crate::common::onnx::Rng;
use crate::common::{differing_bits, typed};
use proptest::prelude::*;
use tract_ragged::elementwise::{FusedElementwise, fuse_host};
use tract_ragged::prelude::*;

fn run(model: TypedModel, input: &Tensor) -> TractResult<TVec<TValue>> {
    tract_core::runtime::DefaultRuntime
        .prepare(model)?
        .run(tvec!(input.clone().into_tvalue()))
}

fn fused_nodes(model: &TypedModel) -> usize {
    model
        .nodes()
        .iter()
        .filter(|n| n.op_is::<FusedElementwise>())
        .count()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn fused_chains_give_the_same_bits(seed in 1u64.., c in 1usize..=3, h in 1usize..=3,
                                       w in prop_oneof![1usize..=9, 100usize..=700], steps in proptest::collection::vec(binop_step(), 1..=12)) {
        let mut rng = Rng(seed);
        let proto = binop_graph(&mut rng, c, h, &steps);
        let plain = typed(&proto, &format!("N,{c},{h},W,f32")).unwrap();
        let mut fused = plain.clone();
        let chains = fuse_host(&mut fused).unwrap();
        prop_assert_eq!(chains, fused_nodes(&fused));
        let input = common::samples(&mut rng, &[2, c, h, w], 3, &[w]).remove(0);
        let expected = run(plain, &input).unwrap();
        let found = run(fused, &input).unwrap();
        prop_assert_eq!(found.len(), expected.len());
        for (k, (f, e)) in found.iter().zip(&expected).enumerate() {
            let differ = differing_bits(&f.clone().into_tensor(), &e.clone().into_tensor());
            prop_assert_eq!(differ, 0, "output {} differs after fusing {} chain(s)", k, chains);
        }
    }
}

/// PP-OCR's blocks: batch norm (Mul, Add) then hard-swish (Add, Max, Min, Mul, Mul), its
/// input read twice, fuse into one node; a value also read by a conv stays out.
#[test]
fn batch_norm_and_hard_swish_fuse_into_one_node() -> TractResult<()> {
    let mut rng = Rng(7);
    let c = 4;
    let proto = bn_hard_swish(&mut rng, c);
    let plain = typed(&proto, &format!("N,{c},1,W,f32"))?;
    let binops = |m: &TypedModel| {
        m.nodes()
            .iter()
            .filter(|n| n.op_is::<tract_core::ops::binary::TypedBinOp>())
            .count()
    };
    let mut fused = plain.clone();
    let chains = fuse_host(&mut fused)?;
    assert_eq!(chains, 1, "{fused}");
    assert_eq!(
        binops(&fused),
        0,
        "every binary op joined the chain: {fused}"
    );
    let input = common::samples(&mut rng, &[3, c, 1, 17], 3, &[17]).remove(0);
    let expected = run(plain, &input)?;
    let found = run(fused, &input)?;
    let (f, e) = (
        found[0].clone().into_tensor(),
        expected[0].clone().into_tensor(),
    );
    assert_eq!(differing_bits(&f, &e), 0);
    Ok(())
}
