//! Chains of element-wise binary ops, run as one pass: a [`Program`].
//!
//! A convolutional network spends most of its element-wise time in short chains: batch
//! norm is a `Mul` then an `Add`, hard-swish an `Add`, `Max`, `Min`, `Mul` and `Mul`.
//! Run one op at a time, each link reads and writes the whole activation; on a GPU those
//! passes are memory-bound and, on PP-OCRv4 rec under tract-cuda, half of the device time.
//! Fused, the chain reads its operands once and writes its result once.
//!
//! The contract: a fused chain gives **the same bits** as its ops run one by one. Each
//! link is one f32 operation rounded to f32, in the same order, as a lone op computes it;
//! no multiply-add is contracted across links (the CUDA kernels are compiled with
//! `--fmad=false`). So fusion cannot move a result: the one-by-one reference and the
//! ragged batch see the same arithmetic whichever of them is fused.
//!
//! What may join a chain ([`find_chains`]): binary ops of a [`BinKind`] on f32, of one
//! output shape. A node joins the chain of its consumers only when every one of its
//! consumers is in that chain (its value is needed nowhere else, so it never has to be
//! written) and it is not a model output. What feeds a chain from outside is an
//! **operand**, read with broadcasting (a per-channel scale, a scalar, the other branch
//! of a residual). The chain's last node, its **tail**, is the fused node's output.
//!
//! [`Program::eval`] is a program's reference semantics, link by link over whole arrays:
//! what the CUDA kernels and the host's fused op (`host`) are tested against.

use std::collections::{HashMap, HashSet};

use tract_core::internal::*;
use tract_core::ndarray::{ArrayD, ArrayViewD, Zip};
use tract_core::ops::binary::{BinMiniOp, TypedBinOp};

mod host;

pub use host::{FusedElementwise, fuse_host};

/// The binary ops a chain is made of: one f32 operation each, exactly rounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinKind {
    Add,
    Sub,
    Mul,
    Div,
    Min,
    Max,
}

impl BinKind {
    /// The kind of tract's binary mini-op, if it is one we fuse.
    pub fn of(mini_op: &dyn BinMiniOp) -> Option<BinKind> {
        use tract_core::ops::math;
        Some(if mini_op.is::<math::Add>() {
            BinKind::Add
        } else if mini_op.is::<math::Sub>() {
            BinKind::Sub
        } else if mini_op.is::<math::Mul>() {
            BinKind::Mul
        } else if mini_op.is::<math::Div>() {
            BinKind::Div
        } else if mini_op.is::<math::Min>() {
            BinKind::Min
        } else if mini_op.is::<math::Max>() {
            BinKind::Max
        } else {
            return None;
        })
    }

    pub fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            BinKind::Add => a + b,
            BinKind::Sub => a - b,
            BinKind::Mul => a * b,
            BinKind::Div => a / b,
            BinKind::Min => a.min(b),
            BinKind::Max => a.max(b),
        }
    }

    /// The expression in C (CUDA): `fminf` and `fmaxf` as tract-cuda's kernels compute
    /// `Min` and `Max`.
    pub fn c_expr(self, a: &str, b: &str) -> String {
        match self {
            BinKind::Add => format!("{a} + {b}"),
            BinKind::Sub => format!("{a} - {b}"),
            BinKind::Mul => format!("{a} * {b}"),
            BinKind::Div => format!("{a} / {b}"),
            BinKind::Min => format!("fminf({a}, {b})"),
            BinKind::Max => format!("fmaxf({a}, {b})"),
        }
    }
}

/// What a link of a program reads: an operand of the fused node, or the value of an
/// earlier link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arg {
    Operand(usize),
    Value(usize),
}

impl std::fmt::Display for Arg {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Arg::Operand(i) => write!(f, "x{i}"),
            Arg::Value(i) => write!(f, "v{i}"),
        }
    }
}

/// One link: `v_k = kind(a, b)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Link {
    pub kind: BinKind,
    pub a: Arg,
    pub b: Arg,
}

/// A fused chain: its links in evaluation order, the last one's value the result.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Program {
    pub operands: usize,
    pub links: Vec<Link>,
}

impl std::fmt::Display for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        for (k, l) in self.links.iter().enumerate() {
            if k > 0 {
                write!(f, "; ")?;
            }
            write!(f, "v{k} = {:?}({}, {})", l.kind, l.a, l.b)?;
        }
        Ok(())
    }
}

impl Program {
    /// Runs the program on host arrays, link by link, broadcasting as tract does.
    pub fn eval(&self, operands: &[ArrayViewD<f32>]) -> TractResult<ArrayD<f32>> {
        ensure!(
            operands.len() == self.operands,
            "fused element-wise: {} operands for a program of {}",
            operands.len(),
            self.operands
        );
        let mut values: Vec<ArrayD<f32>> = Vec::with_capacity(self.links.len());
        for link in &self.links {
            let arg = |a: Arg| -> ArrayViewD<f32> {
                match a {
                    Arg::Operand(i) => operands[i].view(),
                    Arg::Value(i) => values[i].view(),
                }
            };
            let (a, b) = (arg(link.a), arg(link.b));
            let shape = tract_core::broadcast::multi_broadcast(&[a.shape(), b.shape()])
                .context("fused element-wise: operands do not broadcast")?;
            let (a, b) = (
                a.broadcast(&*shape).context("broadcasting")?,
                b.broadcast(&*shape).context("broadcasting")?,
            );
            let v = Zip::from(&a)
                .and(&b)
                .map_collect(|a, b| link.kind.apply(*a, *b));
            values.push(v);
        }
        values.pop().context("fused element-wise: an empty program")
    }
}

/// The most operands a chain may read (the CUDA kernels take their strides by value).
pub const MAX_OPERANDS: usize = 16;

/// How a runtime's nodes look to the chain finder.
pub trait ChainNodes {
    /// The kind of `node` if it is a binary op on f32 that may join a chain.
    fn kind(&self, model: &TypedModel, node: &TypedNode) -> Option<BinKind>;
    /// Whether `node` reads its input `slot` as it is, so that the value may stay in a
    /// register: no reshape or transposition on the way (tract-cuda fuses those into the
    /// op that reads them).
    fn plain_input(&self, node: &TypedNode, slot: usize) -> bool;
    /// What tells apart two reads of one outlet as operands: the view each applies.
    fn operand_view(&self, node: &TypedNode, slot: usize) -> String;
    /// The most links a chain may have: none by default.
    fn max_links(&self) -> usize {
        usize::MAX
    }
    /// Whether `node`, a binary op of a [`BinKind`] that joins no chain, is worth a fused
    /// node of its own: no by default.
    fn worth_alone(&self, model: &TypedModel, node: &TypedNode) -> bool {
        let _ = (model, node);
        false
    }
}

/// Whether `pred` holds for every input and the output of a single-output `node`.
pub fn all_facts(model: &TypedModel, node: &TypedNode, pred: impl Fn(&TypedFact) -> bool) -> bool {
    node.inputs
        .iter()
        .chain(std::iter::once(&OutletId::new(node.id, 0)))
        .all(|o| model.outlet_fact(*o).is_ok_and(&pred))
}

/// tract's own binary ops (the CPU runtime's model).
pub struct HostNodes;

impl ChainNodes for HostNodes {
    fn kind(&self, model: &TypedModel, node: &TypedNode) -> Option<BinKind> {
        let op = node.op_as::<TypedBinOp>()?;
        let f32_only = all_facts(model, node, |f| f.datum_type == f32::datum_type());
        (f32_only && op.1.is_none()).then(|| BinKind::of(&*op.0))?
    }

    fn plain_input(&self, _node: &TypedNode, _slot: usize) -> bool {
        true
    }

    fn operand_view(&self, _node: &TypedNode, _slot: usize) -> String {
        String::new()
    }

    /// The host's fused op keeps a block of values per link (`host`): 64 links hold
    /// 64 KiB, and a chain longer than that has long paid for its passes.
    fn max_links(&self) -> usize {
        64
    }

    /// An operand that varies along an axis after one it is broadcast along (a bias
    /// `[1, 1, C]` added to `[N, T, C]`): tract's CPU runtime has no kernel for that and
    /// takes a generic broadcasting path, a few times slower than a pass of the fused op
    /// (PP-OCRv4 rec's classifier bias: 8 ms of a batch's 300).
    fn worth_alone(&self, model: &TypedModel, node: &TypedNode) -> bool {
        let Ok(output) = model.outlet_fact(OutletId::new(node.id, 0)) else {
            return false;
        };
        node.inputs.iter().any(|input| {
            let Ok(fact) = model.outlet_fact(*input) else {
                return false;
            };
            let offset = output.rank().saturating_sub(fact.rank());
            let varies: Vec<bool> = (0..output.rank())
                .map(|axis| {
                    axis >= offset
                        && fact.shape[axis - offset] == output.shape[axis]
                        && !output.shape[axis].is_one()
                })
                .collect();
            let broadcast = |axis: usize| !varies[axis] && !output.shape[axis].is_one();
            (0..output.rank()).any(|i| broadcast(i) && (i + 1..output.rank()).any(|j| varies[j]))
        })
    }
}

/// Where an operand is read first in a chain: the node and its input slot (its outlet
/// and, on the device, the view the node applies to it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OperandRead {
    pub node: usize,
    pub slot: usize,
}

/// Builds the fused op of a chain: from the model, the chain's program, its operands'
/// first reads, and its tail.
pub type MakeFused<'a> =
    &'a dyn Fn(&TypedModel, &Program, &[OperandRead], usize) -> TractResult<Box<dyn TypedOp>>;

/// A chain found in a model: its nodes in evaluation order, the tail last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    pub nodes: Vec<usize>,
}

impl Chain {
    pub fn tail(&self) -> usize {
        self.nodes[self.nodes.len() - 1]
    }

    /// The chain's program, and where each operand is read first.
    pub fn program(
        &self,
        model: &TypedModel,
        nodes: &dyn ChainNodes,
    ) -> TractResult<(Program, Vec<OperandRead>)> {
        let index: HashMap<usize, usize> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(k, n)| (*n, k))
            .collect();
        let mut operands: Vec<OperandRead> = vec![];
        let mut keys: HashMap<(OutletId, String), usize> = HashMap::default();
        let mut links = vec![];
        for &id in &self.nodes {
            let node = model.node(id);
            let kind = nodes
                .kind(model, node)
                .with_context(|| format!("{node} is not a fusable binary op"))?;
            ensure!(
                node.inputs.len() == 2,
                "{node}: a binary op with {} inputs",
                node.inputs.len()
            );
            let mut args = [Arg::Operand(0); 2];
            for (slot, input) in node.inputs.iter().enumerate() {
                args[slot] = match index.get(&input.node) {
                    Some(k) => Arg::Value(*k),
                    None => {
                        let key = (*input, nodes.operand_view(node, slot));
                        let next = operands.len();
                        let i = *keys.entry(key).or_insert(next);
                        if i == next {
                            operands.push(OperandRead { node: id, slot });
                        }
                        Arg::Operand(i)
                    }
                };
            }
            links.push(Link {
                kind,
                a: args[0],
                b: args[1],
            });
        }
        Ok((
            Program {
                operands: operands.len(),
                links,
            },
            operands,
        ))
    }
}

/// The chains of `model` worth fusing (two links or more), disjoint, each at most
/// [`MAX_OPERANDS`] operands.
pub fn find_chains(model: &TypedModel, nodes: &dyn ChainNodes) -> TractResult<Vec<Chain>> {
    let order = model.eval_order()?;
    let position: HashMap<usize, usize> = order.iter().enumerate().map(|(p, n)| (*n, p)).collect();
    let outputs: HashSet<OutletId> = model.output_outlets()?.iter().copied().collect();
    let mut taken: HashSet<usize> = HashSet::default();
    let mut chains = vec![];
    // From the last node back: a tail gathers its producers before they can start
    // chains of their own.
    for &tail in order.iter().rev() {
        let node = model.node(tail);
        if taken.contains(&tail) || node.outputs.len() != 1 || nodes.kind(model, node).is_none() {
            continue;
        }
        let shape = &model.outlet_fact(OutletId::new(tail, 0))?.shape;
        let mut members: HashSet<usize> = [tail].into_iter().collect();
        // Until nothing joins: a producer whose other consumers join later is taken on a
        // later round (hard-swish reads its input twice).
        loop {
            let mut grew = false;
            let current: Vec<usize> = members.iter().copied().collect();
            for m in current {
                for input in &model.node(m).inputs {
                    let p = input.node;
                    if members.contains(&p) || taken.contains(&p) {
                        continue;
                    }
                    let producer = model.node(p);
                    let joins = producer.outputs.len() == 1
                        && nodes.kind(model, producer).is_some()
                        && !outputs.contains(input)
                        && model.outlet_fact(*input)?.shape == *shape
                        && producer.outputs[0].successors.iter().all(|s| {
                            members.contains(&s.node)
                                && nodes.plain_input(model.node(s.node), s.slot)
                        });
                    if joins && members.len() < nodes.max_links() {
                        members.insert(p);
                        grew = true;
                    }
                }
            }
            if !grew {
                break;
            }
        }
        if members.len() < 2 && !nodes.worth_alone(model, node) {
            continue;
        }
        let mut chain_nodes: Vec<usize> = members.iter().copied().collect();
        chain_nodes.sort_by_key(|n| position[n]);
        let chain = Chain { nodes: chain_nodes };
        if chain.program(model, nodes)?.0.operands > MAX_OPERANDS {
            continue;
        }
        taken.extend(members);
        chains.push(chain);
    }
    chains.reverse();
    Ok(chains)
}

/// Replaces each chain of `model` by one node of the op `make` builds; the chains' other
/// nodes are left dead, for the caller to compact away. Returns how many chains were
/// fused.
pub fn fuse_chains(
    model: &mut TypedModel,
    nodes: &dyn ChainNodes,
    make: MakeFused,
) -> TractResult<usize> {
    let chains = find_chains(model, nodes)?;
    for chain in &chains {
        // Operands are read from the model as it is now: an earlier chain's tail may
        // have become a fused node.
        let (program, operands) = chain.program(model, nodes)?;
        let tail = chain.tail();
        let op = make(model, &program, &operands, tail)
            .with_context(|| format!("Fusing the chain ending at {}", model.node(tail)))?;
        let mut patch = TypedModelPatch::default();
        let inputs = operands
            .iter()
            .map(|o| patch.tap_model(model, model.node(o.node).inputs[o.slot]))
            .collect::<TractResult<TVec<_>>>()?;
        let name = format!("{}.fused", model.node(tail).name);
        let fused = patch.wire_node(name, op, &inputs)?[0];
        patch.shunt_outside(model, OutletId::new(tail, 0), fused)?;
        patch.apply(model)?;
    }
    Ok(chains.len())
}
