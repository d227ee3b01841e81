//! What the caller says about a model: which input is ragged, and along which axes.
//!
//! A [`RaggedSpec`] names one input of the model (by name or by position) and the
//! axes of that input whose extents vary per sample: one (W of NCHW for a text line, T
//! of NCT for audio) or two (H and W of a page). Axis 0 is the batch axis: a sample is
//! one slice of it, so a ragged axis is never 0. Each sample has a **width** along each
//! ragged axis (its extent there; a page's height is its width along H).

use std::fmt;
use std::str::FromStr;

use tract_core::internal::*;

/// One input of the model, by node name or by position among the model's inputs.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(untagged)]
pub enum InputRef {
    /// The input at this position among the model's inputs (`#0`).
    Index(usize),
    /// The input of this node name.
    Name(String),
}

impl InputRef {
    /// The position of this input among `model`'s inputs (typed or not yet).
    pub fn resolve<F, O>(&self, model: &Graph<F, O>) -> TractResult<usize>
    where
        F: Fact + Clone + 'static,
        O: fmt::Debug + fmt::Display + AsRef<dyn Op> + AsMut<dyn Op> + Clone + 'static,
    {
        let inputs = model.input_outlets()?;
        match self {
            InputRef::Index(ix) => {
                ensure!(
                    *ix < inputs.len(),
                    "ragged input #{ix} does not exist: the model has {} input(s)",
                    inputs.len()
                );
                Ok(*ix)
            }
            InputRef::Name(name) => inputs
                .iter()
                .position(|o| model.node(o.node).name == *name)
                .with_context(|| {
                    let names: Vec<&str> = inputs
                        .iter()
                        .map(|o| model.node(o.node).name.as_str())
                        .collect();
                    format!("{name:?} is not an input of the model (inputs: {names:?})")
                }),
        }
    }
}

impl fmt::Display for InputRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputRef::Index(ix) => write!(f, "#{ix}"),
            InputRef::Name(name) => write!(f, "{name}"),
        }
    }
}

/// The ragged input and its ragged axes (ascending, one or two).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RaggedSpec {
    /// The ragged input.
    pub input: InputRef,
    /// Its ragged axes, counted with the batch axis (axis 3 of NCHW is W).
    pub axes: TVec<usize>,
}

impl RaggedSpec {
    /// One ragged axis.
    pub fn new(input: impl Into<InputRef>, axis: usize) -> RaggedSpec {
        RaggedSpec {
            input: input.into(),
            axes: tvec!(axis),
        }
    }

    /// Several ragged axes (H and W of a page: `[2, 3]`), in any order.
    pub fn with_axes(input: impl Into<InputRef>, axes: &[usize]) -> RaggedSpec {
        let mut axes: TVec<usize> = axes.into();
        axes.sort_unstable();
        RaggedSpec {
            input: input.into(),
            axes,
        }
    }

    /// The last ragged axis (the only one of a text line or a clip).
    pub fn axis(&self) -> usize {
        *self.axes.last().unwrap_or(&0)
    }

    /// Checks the spec against the model: the input exists, the axes are distinct, in
    /// its rank and not the batch axis. Returns the input's position.
    pub fn check(&self, model: &TypedModel) -> TractResult<usize> {
        let ix = self
            .input
            .resolve(model)
            .with_context(|| format!("ragged input {}", self.input))?;
        let fact = model.input_fact(ix)?;
        ensure!(
            (1..=2).contains(&self.axes.len()),
            "{} ragged axes given for input {}: one or two are supported",
            self.axes.len(),
            self.input
        );
        ensure!(
            self.axes.windows(2).all(|w| w[0] < w[1]),
            "the ragged axes {:?} of input {} must be distinct",
            self.axes,
            self.input
        );
        for &axis in &self.axes {
            ensure!(
                axis < fact.rank(),
                "ragged axis {axis} is out of the rank of input {} ({:?})",
                self.input,
                fact.shape
            );
            ensure!(
                axis != 0,
                "ragged axis 0 of input {} is the batch axis: samples are stacked along axis \
                 0, a ragged axis must be another one. A model whose input has no batch axis \
                 (an export taking [T] or [T, C] for one clip) is not supported: export it \
                 with a batch axis of extent 1 first ([1, T], [1, T, C]), its ragged axis \
                 then 1",
                self.input
            );
        }
        Ok(ix)
    }
}

/// How the input fact sizes a ragged axis: a number (a fixed extent, or a model typed per
/// shape), or a multiple of a symbol, `W` or `32*w`. Declaring a detector's H and W as
/// `32*h` and `32*w` (the multiple its feature maps of different strides meet at) lets
/// tract type it symbolically: `(32*h + 31)/32` simplifies to `h`, where `(H + 31)/32`
/// and `(H + 15)/16` never unify. The samples' widths there must be multiples of it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Extent {
    /// A number: every sample has this width there.
    Fixed(usize),
    /// `multiple * symbol`: a free width, in multiples of `multiple`.
    Symbolic {
        /// The symbol the fact names it with.
        symbol: Symbol,
        /// The multiple the fact gives it (1 for `W`, 32 for `32*w`).
        multiple: u64,
    },
}

impl Extent {
    /// The extent `dim` of ragged axis `axis` of input `input`: a number, a symbol or a
    /// positive multiple of one, or an error naming what the fact says there.
    pub fn of(dim: &TDim, axis: usize, input: &str) -> TractResult<Extent> {
        match dim {
            TDim::Val(v) if *v >= 0 => Ok(Extent::Fixed(*v as usize)),
            TDim::Sym(s) => Ok(Extent::Symbolic {
                symbol: s.clone(),
                multiple: 1,
            }),
            TDim::MulInt(k, inner) if *k >= 1 && matches!(**inner, TDim::Sym(_)) => {
                let TDim::Sym(s) = &**inner else {
                    unreachable!("matched just above")
                };
                Ok(Extent::Symbolic {
                    symbol: s.clone(),
                    multiple: *k as u64,
                })
            }
            other => bail!(
                "ragged axis {axis} of input {input} has extent {other}: expected a symbol \
                 (W), a multiple of one (32*w) or a number"
            ),
        }
    }

    /// The symbol sizing the axis, if any.
    pub fn symbol(&self) -> Option<&Symbol> {
        match self {
            Extent::Fixed(_) => None,
            Extent::Symbolic { symbol, .. } => Some(symbol),
        }
    }

    /// The multiple widths must be along the axis (1: any).
    pub fn multiple(&self) -> u64 {
        match self {
            Extent::Fixed(_) => 1,
            Extent::Symbolic { multiple, .. } => *multiple,
        }
    }

    /// The symbol's value for an extent of `width` along the axis: `width / multiple`.
    pub fn symbol_value(&self, width: i64) -> TractResult<i64> {
        let m = self.multiple() as i64;
        ensure!(
            width % m == 0,
            "an extent of {width} where the input fact takes multiples of {m}"
        );
        Ok(width / m)
    }
}

impl From<usize> for InputRef {
    fn from(ix: usize) -> InputRef {
        InputRef::Index(ix)
    }
}

impl From<&str> for InputRef {
    fn from(name: &str) -> InputRef {
        InputRef::Name(name.to_string())
    }
}

impl From<String> for InputRef {
    fn from(name: String) -> InputRef {
        InputRef::Name(name)
    }
}

impl fmt::Display for RaggedSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let axes: Vec<String> = self.axes.iter().map(|a| a.to_string()).collect();
        write!(f, "{}:{}", self.input, axes.join(","))
    }
}

/// `INPUT:AXES`, as the CLI's `--ragged` takes it: `x:3`, `x:2,3` for H and W, or `#0:3`
/// for the first input.
impl FromStr for RaggedSpec {
    type Err = TractError;
    fn from_str(s: &str) -> TractResult<RaggedSpec> {
        let (input, axes) = s
            .rsplit_once(':')
            .with_context(|| format!("expected INPUT:AXIS (e.g. x:3 or x:2,3), got {s:?}"))?;
        let axes: Vec<usize> = axes
            .split(',')
            .map(|a| a.trim().parse())
            .collect::<Result<_, _>>()
            .with_context(|| format!("the axes in {s:?} are not integers"))?;
        let input = match input.strip_prefix('#') {
            Some(ix) => InputRef::Index(
                ix.parse()
                    .with_context(|| format!("the input index in {s:?} is not an integer"))?,
            ),
            None if input.is_empty() => bail!("expected INPUT:AXIS (e.g. x:3), got {s:?}"),
            None => InputRef::Name(input.to_string()),
        };
        Ok(RaggedSpec::with_axes(input, &axes))
    }
}

/// Extents as users read them: `320`, `640x480`.
pub fn extents_string(extents: &[usize]) -> String {
    extents
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("x")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cli_syntax() {
        assert_eq!(
            "x:3".parse::<RaggedSpec>().unwrap(),
            RaggedSpec::new("x", 3)
        );
        assert_eq!("#1:2".parse::<RaggedSpec>().unwrap(), RaggedSpec::new(1, 2));
        assert_eq!(
            "a:b:2".parse::<RaggedSpec>().unwrap(),
            RaggedSpec::new("a:b", 2)
        );
        assert_eq!(
            "x:3,2".parse::<RaggedSpec>().unwrap(),
            RaggedSpec::with_axes("x", &[2, 3])
        );
        assert_eq!(RaggedSpec::with_axes("x", &[2, 3]).to_string(), "x:2,3");
        assert!("x".parse::<RaggedSpec>().is_err());
        assert!("x:2,".parse::<RaggedSpec>().is_err());
        assert!(":3".parse::<RaggedSpec>().is_err());
        assert!("x:w".parse::<RaggedSpec>().is_err());
    }

    #[test]
    fn extents_are_numbers_symbols_or_multiples_of_one() {
        let scope = SymbolScope::default();
        let h = scope.sym("h");
        let extent = |s: &str| Extent::of(&scope.parse_tdim(s).unwrap(), 2, "x");
        assert_eq!(extent("48").unwrap(), Extent::Fixed(48));
        assert_eq!(extent("h").unwrap().multiple(), 1);
        let aligned = extent("32*h").unwrap();
        assert_eq!(aligned.symbol(), Some(&h));
        assert_eq!(aligned.symbol_value(320).unwrap(), 10);
        assert!(aligned.symbol_value(321).is_err());
        let err = extent("h+1").unwrap_err().to_string();
        assert!(
            err.contains("axis 2 of input x") && err.contains("h+1"),
            "{err}"
        );
    }
}
