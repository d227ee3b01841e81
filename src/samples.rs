//! What a run takes: samples, and the inputs their batch shares.
//!
//! A [`Sample`] is what one item gives the model, without the batch axis: one tensor for a
//! model whose only input is the ragged one (a text line), or one per input that is not
//! shared (a sentence's `input_ids`, `attention_mask` and `token_type_ids`; a clip and its
//! state), in the model's input order or by name. [`Samples`] are a run's samples and the
//! inputs given once for all of them (a sample rate), by name. The runnable's verbs
//! ([`crate::RaggedRunnable::run`] and the others) take them, so that one call runs models
//! of one input and of several alike; a slice or vector of tensors converts to samples of
//! one input each.
//!
//! Tensors are borrowed where the caller keeps them (`Cow`): converting a slice of
//! tensors copies nothing.

use std::borrow::{Borrow, Cow};

use tract_core::internal::*;

use crate::error::BadSample;
use crate::inputs::{Given, InputSlot};
use crate::transform::InputRole;

/// A tensor a sample holds: owned, or borrowed from the caller.
pub trait TensorArg<'s> {
    /// The tensor, borrowed where it was.
    fn into_cow(self) -> Cow<'s, Tensor>;
}

impl<'s> TensorArg<'s> for Tensor {
    fn into_cow(self) -> Cow<'s, Tensor> {
        Cow::Owned(self)
    }
}

impl<'s> TensorArg<'s> for &'s Tensor {
    fn into_cow(self) -> Cow<'s, Tensor> {
        Cow::Borrowed(self)
    }
}

impl<'s> TensorArg<'s> for Cow<'s, Tensor> {
    fn into_cow(self) -> Cow<'s, Tensor> {
        self
    }
}

/// One sample's tensors, without the batch axis (module doc).
#[derive(Clone, Debug)]
pub struct Sample<'s>(Inputs<'s>);

#[derive(Clone, Debug)]
enum Inputs<'s> {
    /// In the model's order of the inputs that are not shared.
    Ordered(Vec<Cow<'s, Tensor>>),
    /// By input name.
    Named(Vec<(String, Cow<'s, Tensor>)>),
}

impl<'s> Sample<'s> {
    /// The sample of a model whose only input a sample gives is `tensor`'s.
    pub fn new(tensor: impl TensorArg<'s>) -> Sample<'s> {
        Sample(Inputs::Ordered(vec![tensor.into_cow()]))
    }

    /// One tensor per input that is not shared, in the model's input order.
    pub fn ordered<T: TensorArg<'s>>(tensors: impl IntoIterator<Item = T>) -> Sample<'s> {
        Sample(Inputs::Ordered(
            tensors.into_iter().map(TensorArg::into_cow).collect(),
        ))
    }

    /// One tensor per input that is not shared, by the input's name.
    pub fn named<N: Into<String>, T: TensorArg<'s>>(
        inputs: impl IntoIterator<Item = (N, T)>,
    ) -> Sample<'s> {
        Sample(Inputs::Named(
            inputs
                .into_iter()
                .map(|(n, t)| (n.into(), t.into_cow()))
                .collect(),
        ))
    }

    /// Its tensors in the order of `given` (the slots a sample fills), checked by name and
    /// count; errors name the sample by `index`.
    fn resolve(&self, index: usize, given: &[&InputSlot]) -> TractResult<Given<'_>> {
        let names = || given.iter().map(|s| s.name.as_str()).collect::<Vec<_>>();
        match &self.0 {
            Inputs::Ordered(tensors) => {
                ensure!(
                    tensors.len() == given.len(),
                    BadSample {
                        index,
                        name: None,
                        input: None,
                        reason: format!(
                            "sample {index} gives {} inputs, the model takes {} per sample ({:?})",
                            tensors.len(),
                            given.len(),
                            names()
                        ),
                    }
                );
                Ok(tensors.iter().map(|t| &**t).collect())
            }
            Inputs::Named(named) => {
                if let Some((name, _)) = named
                    .iter()
                    .find(|(n, _)| !given.iter().any(|s| &s.name == n))
                {
                    bail!(BadSample {
                        index,
                        name: None,
                        input: Some(name.to_string()),
                        reason: format!(
                            "sample {index} gives input {name:?}, which the model does not take \
                             per sample (it takes {:?})",
                            names()
                        ),
                    });
                }
                given
                    .iter()
                    .map(|slot| {
                        let mut found = named.iter().filter(|(n, _)| *n == slot.name);
                        match (found.next(), found.next()) {
                            (Some((_, t)), None) => Ok(&**t),
                            (None, _) => bail!(BadSample {
                                index,
                                name: None,
                                input: Some(slot.name.clone()),
                                reason: format!("sample {index} lacks input {:?}", slot.name),
                            }),
                            (Some(_), Some(_)) => bail!(BadSample {
                                index,
                                name: None,
                                input: Some(slot.name.clone()),
                                reason: format!("sample {index} gives input {:?} twice", slot.name),
                            }),
                        }
                    })
                    .collect()
            }
        }
    }
}

impl From<Tensor> for Sample<'static> {
    fn from(tensor: Tensor) -> Sample<'static> {
        Sample::new(tensor)
    }
}

impl<'s> From<&'s Tensor> for Sample<'s> {
    fn from(tensor: &'s Tensor) -> Sample<'s> {
        Sample::new(tensor)
    }
}

/// A run's samples, and the inputs their batch shares (module doc).
#[derive(Clone, Debug, Default)]
pub struct Samples<'s> {
    samples: Vec<Sample<'s>>,
    shared: Vec<(String, Cow<'s, Tensor>)>,
}

impl<'s> Samples<'s> {
    /// These samples, sharing nothing yet.
    pub fn new<S: Into<Sample<'s>>>(samples: impl IntoIterator<Item = S>) -> Samples<'s> {
        Samples {
            samples: samples.into_iter().map(Into::into).collect(),
            shared: vec![],
        }
    }

    /// Samples of several inputs, each its tensors in the model's order of the inputs a
    /// sample gives ([`Sample::ordered`]).
    pub fn ordered<S: AsRef<[Tensor]>>(samples: &'s [S]) -> Samples<'s> {
        Samples::new(samples.iter().map(|s| Sample::ordered(s.as_ref())))
    }

    /// Gives input `name` once, for every sample, as the model takes it (batch axis
    /// included, if it has one).
    pub fn shared(mut self, name: impl Into<String>, tensor: impl TensorArg<'s>) -> Self {
        self.shared.push((name.into(), tensor.into_cow()));
        self
    }

    /// How many samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Each sample's tensors in the model's order of the inputs a sample gives, or why
    /// that sample cannot give them; the shared tensors in the model's order of the
    /// shared inputs.
    pub(crate) fn resolve(
        &self,
        slots: &[InputSlot],
    ) -> TractResult<(Vec<TractResult<Given<'_>>>, Vec<&Tensor>)> {
        let given: Vec<&InputSlot> = slots
            .iter()
            .filter(|s| s.role != InputRole::Shared)
            .collect();
        let once: Vec<&InputSlot> = slots
            .iter()
            .filter(|s| s.role == InputRole::Shared)
            .collect();
        if let Some((name, _)) = self
            .shared
            .iter()
            .find(|(n, _)| !once.iter().any(|s| &s.name == n))
        {
            bail!(
                "shared input {name:?}: the model shares no input of that name (it shares {:?})",
                once.iter().map(|s| &s.name).collect::<Vec<_>>()
            );
        }
        let shared = once
            .iter()
            .map(|slot| {
                let mut found = self.shared.iter().filter(|(n, _)| *n == slot.name);
                match (found.next(), found.next()) {
                    (Some((_, t)), None) => Ok(&**t),
                    (None, _) => bail!(
                        "the model takes input {:?} once for the batch: give it as a shared input",
                        slot.name
                    ),
                    (Some(_), Some(_)) => bail!("shared input {:?} given twice", slot.name),
                }
            })
            .collect::<TractResult<Vec<&Tensor>>>()?;
        let samples = self
            .samples
            .iter()
            .enumerate()
            .map(|(ix, s)| s.resolve(ix, &given))
            .collect();
        Ok((samples, shared))
    }
}

impl<'s> From<Vec<Sample<'s>>> for Samples<'s> {
    fn from(samples: Vec<Sample<'s>>) -> Samples<'s> {
        Samples {
            samples,
            shared: vec![],
        }
    }
}

impl From<Vec<Tensor>> for Samples<'static> {
    fn from(tensors: Vec<Tensor>) -> Samples<'static> {
        Samples::new(tensors)
    }
}

impl<'s, T: Borrow<Tensor>> From<&'s [T]> for Samples<'s> {
    fn from(tensors: &'s [T]) -> Samples<'s> {
        Samples::new(tensors.iter().map(|t| Sample::new(t.borrow())))
    }
}

impl<'s, T: Borrow<Tensor>> From<&'s Vec<T>> for Samples<'s> {
    fn from(tensors: &'s Vec<T>) -> Samples<'s> {
        tensors.as_slice().into()
    }
}

impl<'s, T: Borrow<Tensor>, const N: usize> From<&'s [T; N]> for Samples<'s> {
    fn from(tensors: &'s [T; N]) -> Samples<'s> {
        tensors.as_slice().into()
    }
}

impl<'s> FromIterator<Sample<'s>> for Samples<'s> {
    fn from_iter<I: IntoIterator<Item = Sample<'s>>>(samples: I) -> Samples<'s> {
        Samples::new(samples)
    }
}
