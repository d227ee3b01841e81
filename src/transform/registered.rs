//! The ragged transform as one of tract's model transforms, registered as `ragged`: what
//! the `tract` crate applies with `model.transform(r#"{"name":"ragged","input":"x",
//! "axis":3}"#)`, and tract's own CLI with `-t 'ragged(input: "x", axis: 3)'`
//! (`scripts/tract-cli.sh` builds that CLI with tract-ragged linked).
//!
//! By default the transformed model takes the widths as inputs after its own (one `[N]`
//! i64 per ragged axis), as [`super::ragged`] makes it. A tool of tract's feeds a model the
//! inputs its facts ask for, random ones where it has none: widths drawn at random (zeros,
//! as tract's CLI draws integers) are no batch at all. So the transform can answer the
//! widths itself, the model keeping only its own inputs:
//!
//! - `widths: [51, 68, ...]` (one ragged axis): those samples, the batch axis set to their
//!   count; the input's padded extent is what the tool gives (`-i 3,3,48,1408,f32`);
//! - `full: true`: every sample as wide as the input, a padded batch of full samples that
//!   runs the ragged plan, masks and all, on a batch any tool can make.
//!
//! Parameters: `input` (a name or a position; the first input when absent), `axis` or
//! `axes` (the input's ragged axes, the batch being axis 0), `widths` or `full`.

use serde::Deserialize;
use tract_core::internal::*;
use tract_core::ops::array::MultiBroadcastTo;
use tract_core::ops::cast::Cast;
use tract_core::ops::konst::Const;
use tract_core::transform::ModelTransform;

use crate::spec::{InputRef, RaggedSpec};

/// The parameters of the transform registered as `ragged` (module doc). Plain values with
/// defaults, not options: tract's CLI reads them as RON, which would want `Some(3)` for an
/// option.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RaggedConfig {
    /// The ragged input, by name or position (the first by default).
    #[serde(default = "first_input")]
    pub input: InputRef,
    /// Its ragged axis (0, the batch axis, for none).
    #[serde(default)]
    pub axis: usize,
    /// Its ragged axes, where there are several.
    #[serde(default)]
    pub axes: Vec<usize>,
    /// Each sample's width along the ragged axis (one ragged axis only; none when empty).
    #[serde(default)]
    pub widths: Vec<usize>,
    /// Every sample as wide as the input.
    #[serde(default)]
    pub full: bool,
}

fn first_input() -> InputRef {
    InputRef::Index(0)
}

impl Default for RaggedConfig {
    fn default() -> RaggedConfig {
        RaggedConfig {
            input: first_input(),
            axis: 0,
            axes: vec![],
            widths: vec![],
            full: false,
        }
    }
}

/// Where the transformed model's widths come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Widths {
    /// Inputs after the model's own, one `[N]` i64 per ragged axis.
    Inputs,
    /// These samples' widths along the one ragged axis; the batch is their count.
    Given(Vec<usize>),
    /// Every sample as wide as the input.
    Full,
}

/// The ragged transform as a tract [`ModelTransform`] (module doc).
#[derive(Clone, Debug)]
pub struct RaggedTransform {
    /// The ragged input and axes.
    pub spec: RaggedSpec,
    /// How the transformed model is given the samples' widths.
    pub widths: Widths,
}

impl RaggedTransform {
    /// The transform `config` describes, or what is wrong with it.
    pub fn new(config: RaggedConfig) -> TractResult<RaggedTransform> {
        let axes = match (config.axis, config.axes) {
            (0, axes) if axes.is_empty() => bail!(
                "ragged: say which axis is ragged: `axis` (or `axes`), as in \
                 -t 'ragged(input: \"x\", axis: 3)'"
            ),
            (0, axes) => axes,
            (axis, axes) if axes.is_empty() => vec![axis],
            _ => bail!("ragged: give `axis` or `axes`, not both"),
        };
        ensure!(
            !axes.contains(&0),
            "ragged: axis 0 is the batch axis; the ragged axes are the others"
        );
        let widths = match (config.widths.is_empty(), config.full) {
            (false, true) => bail!("ragged: give `widths` or `full`, not both"),
            (false, false) => {
                ensure!(
                    axes.len() == 1,
                    "ragged: `widths` gives one ragged axis' widths; with axes {axes:?}, use \
                     `full: true` (every sample as large as the input)"
                );
                ensure!(
                    config.widths.iter().all(|w| *w > 0),
                    "ragged: every width in `widths` must be at least 1"
                );
                Widths::Given(config.widths)
            }
            (true, true) => Widths::Full,
            (true, false) => Widths::Inputs,
        };
        let input = config.input;
        Ok(RaggedTransform {
            spec: RaggedSpec::with_axes(input, &axes),
            widths,
        })
    }

    /// `model` transformed, its widths inputs replaced by what [`Self::widths`] says.
    fn answer_widths(&self, ragged: super::Ragged) -> TractResult<TypedModel> {
        let mut target = ragged.model;
        let inputs = target.input_outlets()?.to_vec();
        let widths_inputs = inputs[inputs.len() - self.spec.axes.len()..].to_vec();
        let shape = target.outlet_fact(inputs[ragged.input])?.shape.to_tvec();
        let batch = shape[0].clone();
        for (k, source) in widths_inputs.iter().enumerate() {
            let name = target.node(source.node).name.clone();
            let widths = match &self.widths {
                Widths::Given(widths) => {
                    let widths: Vec<i64> = widths.iter().map(|w| *w as i64).collect();
                    let konst = Const::new(tensor1(&widths).into_arc_tensor())?;
                    target.wire_node(format!("{name}.given"), konst, &[])?
                }
                _ => {
                    // The input's extent along the axis, resolved when the batch runs.
                    let extent = tensor0(shape[self.spec.axes[k]].clone());
                    let mut w = target.wire_node(
                        format!("{name}.full"),
                        Const::new(extent.into_arc_tensor())?,
                        &[],
                    )?;
                    let to_i64 = Cast {
                        to: i64::datum_type(),
                    };
                    w = target.wire_node(format!("{name}.full.i64"), to_i64, &w)?;
                    w = target.wire_node(format!("{name}.full.axis"), AxisOp::Add(0), &w)?;
                    let over_batch = MultiBroadcastTo::new(tvec![batch.clone()].into());
                    target.wire_node(format!("{name}.full.batch"), over_batch, &w)?
                }
            }[0];
            for inlet in target.outlet_successors(*source).to_vec() {
                target.add_edge(widths, inlet)?;
            }
        }
        let kept: Vec<OutletId> = inputs
            .iter()
            .filter(|i| !widths_inputs.contains(i))
            .copied()
            .collect();
        target.set_input_outlets(&kept)?;
        if let Widths::Given(widths) = &self.widths {
            match &batch {
                TDim::Sym(n) => {
                    let n = [(n.clone(), TDim::from(widths.len()))]
                        .into_iter()
                        .collect();
                    target = target.set_symbols(&n)?;
                }
                other => ensure!(
                    other.to_usize().ok() == Some(widths.len()),
                    "ragged: {} widths given for a batch of {other}",
                    widths.len()
                ),
            }
        }
        target.into_decluttered()
    }
}

impl ModelTransform for RaggedTransform {
    fn name(&self) -> StaticName {
        "ragged".into()
    }

    fn transform(&self, model: &mut TypedModel) -> TractResult<()> {
        let ragged = super::ragged(model, &self.spec)?;
        *model = match self.widths {
            Widths::Inputs => ragged.model,
            _ => self.answer_widths(ragged)?,
        };
        Ok(())
    }
}

tract_core::register_model_transform!("ragged", RaggedConfig, |config| {
    Ok(Box::new(RaggedTransform::new(config)?))
});

/// Keeps this module's registration in a binary that links tract-ragged without calling
/// it otherwise ([`crate::link`]).
#[inline(never)]
pub(crate) fn linked() -> &'static str {
    std::hint::black_box("ragged")
}
