//! What went wrong, as kinds a caller can act on.
//!
//! Errors are tract's (`TractError`, an `anyhow` chain): context for the user, printed on
//! one line with `{:#}`. Where the kind of failure matters to a caller (the CLI's exit
//! status; a server's status code or a Python exception to come), the chain also carries
//! one typed value saying what happened, and [`kind`] reads it:
//! - [`Refused`]: the ragged transform refuses a node of the model: batched, its samples
//!   would not get what they get alone. It names the node, its op and why ([`Mixing`],
//!   what the transform's rule said). The model still runs one by one.
//! - [`BadSample`]: a sample given to a run does not fit the model (its rank, element type,
//!   extents, width or values), by its index among the samples given.
//! - [`OutOfMemory`]: a run ran out of memory (the device's, or the budget's).
//! - an I/O error, reading or writing a file;
//! - anything else: the model's or tract's own ([`ErrorKind::Model`]).
//!
//! The kinds are read from the chain, never from the text: messages may be reworded.

use tract_core::internal::*;

/// What kind of failure an error is (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The ragged transform refuses a node: [`Refused`].
    Refused,
    /// A sample does not fit the model: [`BadSample`].
    BadSample,
    /// Out of memory: [`OutOfMemory`].
    OutOfMemory,
    /// Reading or writing a file.
    Io,
    /// Anything else: the model's or tract's.
    Model,
}

/// The kind of `error`, from the typed values in its chain (module doc).
pub fn kind(error: &TractError) -> ErrorKind {
    if let Some(copied) = error.downcast_ref::<Copied>() {
        copied.kind
    } else if refusal(error).is_some() || error.downcast_ref::<Mixing>().is_some() {
        ErrorKind::Refused
    } else if OutOfMemory::in_chain(error) {
        ErrorKind::OutOfMemory
    } else if error.downcast_ref::<BadSample>().is_some() {
        ErrorKind::BadSample
    } else if error.chain().any(|c| c.is::<std::io::Error>()) {
        ErrorKind::Io
    } else {
        ErrorKind::Model
    }
}

/// The refusal in `error`'s chain, if the ragged transform refused a node.
pub fn refusal(error: &TractError) -> Option<&Refused> {
    error.downcast_ref::<Refused>()
}

/// A run ran out of memory: the error a backend puts in the chain where its runtime runs
/// out, so that the scheduler can tell it from every other failure (a smaller batch may
/// fit).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("out of memory: {what}")]
pub struct OutOfMemory {
    /// What could not be allocated, for the user.
    pub what: String,
}

impl OutOfMemory {
    /// Whether `error`, or anything it was caused by, is an [`OutOfMemory`].
    pub fn in_chain(error: &TractError) -> bool {
        error.chain().any(|cause| cause.is::<OutOfMemory>())
    }
}

/// Why a rule of the ragged transform refuses the op it was given, for the user: the
/// samples would mix, or a sample's result would depend on the padding. The transform
/// puts it in a [`Refused`] naming the node.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("mixing op: {0}")]
pub struct Mixing(pub String);

/// The ragged transform refuses a node of the model (module doc).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Ragged transform: node #{id} {node:?} ({op})")]
pub struct Refused {
    /// The node's id in the typed model.
    pub id: usize,
    /// The node's name, as the model names it.
    pub node: String,
    /// Its op's name.
    pub op: String,
    /// Why ([`Mixing`]'s text).
    pub reason: String,
}

/// A sample does not fit the model (module doc).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct BadSample {
    /// The sample's index among the samples given to the run.
    pub index: usize,
    /// The sample's name, where the caller has one ([`with_name`]: the CLI names a sample
    /// by its archive entry); the library knows samples by index only.
    pub name: Option<String>,
    /// The model input at fault, when the sample gives several (or names one it should not).
    pub input: Option<String>,
    /// What is wrong with it, for the user (naming the sample).
    pub reason: String,
}

/// `error` said of model input `input`: a [`BadSample`] with no input gets this one (and
/// its reason names it); any other error gets it as context.
pub(crate) fn in_input(error: TractError, input: &str) -> TractError {
    match error.downcast_ref::<BadSample>() {
        Some(bad) if bad.input.is_none() => anyhow!(BadSample {
            index: bad.index,
            name: bad.name.clone(),
            input: Some(input.to_string()),
            reason: format!("input {input:?}: {}", bad.reason),
        }),
        _ => error.context(format!("input {input:?}")),
    }
}

/// `error` of the sample named `name`: a [`BadSample`] in its chain gets that name (and its
/// reason says it); any other error gets it as context.
pub fn with_name(error: TractError, name: &str) -> TractError {
    match error.downcast_ref::<BadSample>() {
        Some(bad) => anyhow!(BadSample {
            index: bad.index,
            name: Some(name.to_string()),
            input: bad.input.clone(),
            reason: format!("{} (sample {name:?})", bad.reason),
        }),
        None => error.context(format!("sample {name:?}")),
    }
}

/// A copy of an error, for each of several samples a failure of their whole run fails
/// (`TractError` is not `Clone`): its text, and its kind for [`kind`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text}")]
pub(crate) struct Copied {
    /// The error's text, its chain on one line.
    pub text: String,
    /// The error's kind.
    pub kind: ErrorKind,
}

/// A copy of `error`: the same text and kind ([`Copied`]).
pub(crate) fn copy(error: &TractError) -> TractError {
    anyhow!(Copied {
        text: format!("{error:#}"),
        kind: kind(error),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_read_from_the_chain_under_any_context() {
        let refused: TractError = anyhow!(Mixing("it sums over the batch axis".into()));
        let refused = refused.context(Refused {
            id: 3,
            node: "Sum".into(),
            op: "Reduce".into(),
            reason: "it sums over the batch axis".into(),
        });
        let refused = refused.context("Preparing model.onnx");
        assert_eq!(kind(&refused), ErrorKind::Refused);
        assert_eq!(refusal(&refused).map(|r| r.id), Some(3));
        assert_eq!(
            format!("{refused:#}"),
            "Preparing model.onnx: Ragged transform: node #3 \"Sum\" (Reduce): mixing op: it \
             sums over the batch axis"
        );
        let bad: TractError = anyhow!(BadSample {
            index: 2,
            name: None,
            input: None,
            reason: "sample 2 has rank 1".into()
        });
        let bad = in_input(bad, "mask");
        assert_eq!(
            bad.downcast_ref::<BadSample>()
                .and_then(|b| b.input.as_deref()),
            Some("mask")
        );
        assert_eq!(format!("{bad}"), "input \"mask\": sample 2 has rank 1");
        let named = with_name(bad.context("Running"), "line_7");
        let b = named.downcast_ref::<BadSample>().unwrap();
        assert_eq!(
            (b.index, b.name.as_deref(), b.input.as_deref()),
            (2, Some("line_7"), Some("mask"))
        );
        assert_eq!(
            format!("{named}"),
            "input \"mask\": sample 2 has rank 1 (sample \"line_7\")"
        );
        assert_eq!(kind(&named.context("Running")), ErrorKind::BadSample);
        let oom: TractError = anyhow!(OutOfMemory {
            what: "a batch".into()
        });
        assert_eq!(kind(&oom.context("Running")), ErrorKind::OutOfMemory);
        let io: TractError = std::io::Error::other("disk full").into();
        assert_eq!(kind(&io.context("Writing out.npz")), ErrorKind::Io);
        assert_eq!(kind(&anyhow!("Can't divide")), ErrorKind::Model);
        let oom = anyhow!(OutOfMemory {
            what: "a batch".into()
        })
        .context("Running");
        let copied = copy(&oom);
        assert_eq!(kind(&copied), ErrorKind::OutOfMemory);
        assert_eq!(format!("{copied:#}"), format!("{oom:#}"));
    }
}
