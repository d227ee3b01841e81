//! What the caller says about a model: which input is ragged, and along which axis.
//!
//! A [`RaggedSpec`] names one input of the model (by name or by position) and the
//! axis of that input whose extent varies per sample (W of NCHW for a text line, T of
//! NCT for audio). Axis 0 is the batch axis: a sample is one slice of it, so the
//! ragged axis is never 0.

use std::fmt;
use std::str::FromStr;

use tract_core::internal::*;

/// One input of the model, by node name or by position among the model's inputs.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(untagged)]
pub enum InputRef {
    Index(usize),
    Name(String),
}

impl InputRef {
    /// The position of this input among `model`'s inputs.
    pub fn resolve(&self, model: &TypedModel) -> TractResult<usize> {
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
                    format!(
                        "ragged input {name:?} is not an input of the model (inputs: {names:?})"
                    )
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

/// The ragged input and its ragged axis.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Deserialize)]
pub struct RaggedSpec {
    pub input: InputRef,
    pub axis: usize,
}

impl RaggedSpec {
    pub fn new(input: impl Into<InputRef>, axis: usize) -> RaggedSpec {
        RaggedSpec {
            input: input.into(),
            axis,
        }
    }

    /// Checks the spec against the model: the input exists, the axis is in its rank and
    /// is not the batch axis. Returns the input's position.
    pub fn check(&self, model: &TypedModel) -> TractResult<usize> {
        let ix = self.input.resolve(model)?;
        let fact = model.input_fact(ix)?;
        ensure!(
            self.axis < fact.rank(),
            "ragged axis {} is out of the rank of input {} ({:?})",
            self.axis,
            self.input,
            fact.shape
        );
        ensure!(
            self.axis != 0,
            "ragged axis 0 of input {} is the batch axis: samples are stacked along axis 0, \
             the ragged axis must be another one",
            self.input
        );
        Ok(ix)
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
        write!(f, "{}:{}", self.input, self.axis)
    }
}

/// `INPUT:AXIS`, as the CLI's `--ragged` takes it: `x:3`, or `#0:3` for the first input.
impl FromStr for RaggedSpec {
    type Err = TractError;
    fn from_str(s: &str) -> TractResult<RaggedSpec> {
        let (input, axis) = s
            .rsplit_once(':')
            .with_context(|| format!("expected INPUT:AXIS (e.g. x:3), got {s:?}"))?;
        let axis: usize = axis
            .parse()
            .with_context(|| format!("the axis in {s:?} is not an integer"))?;
        let input = match input.strip_prefix('#') {
            Some(ix) => InputRef::Index(
                ix.parse()
                    .with_context(|| format!("the input index in {s:?} is not an integer"))?,
            ),
            None if input.is_empty() => bail!("expected INPUT:AXIS (e.g. x:3), got {s:?}"),
            None => InputRef::Name(input.to_string()),
        };
        Ok(RaggedSpec { input, axis })
    }
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
        assert!("x".parse::<RaggedSpec>().is_err());
        assert!(":3".parse::<RaggedSpec>().is_err());
        assert!("x:w".parse::<RaggedSpec>().is_err());
    }
}
