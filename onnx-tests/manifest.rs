//! The manifest of the cases run, `manifest.txt`: one line per case,
//! `case | plain | ragged`, each mode's expectation with its reason where it is not
//! expected to pass.

use tract_core::internal::*;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    Pass,
    /// Ragged mode: the transform must refuse the model.
    Refused(String),
    /// Ragged mode does not apply (no spatial axis, not a float input...).
    NotApplicable(String),
    /// Not run, for the reason given (tract itself cannot run it...).
    Skip(String),
}

impl Expect {
    fn parse(s: &str) -> TractResult<Expect> {
        let s = s.trim();
        if s == "pass" {
            return Ok(Expect::Pass);
        }
        let (kind, reason) = s
            .split_once(':')
            .with_context(|| format!("expected KIND: REASON, got {s:?}"))?;
        let reason = reason.trim().to_string();
        ensure!(!reason.is_empty(), "{kind} needs a reason");
        Ok(match kind.trim() {
            "refused" => Expect::Refused(reason),
            "n/a" => Expect::NotApplicable(reason),
            "skip" => Expect::Skip(reason),
            other => bail!("unknown expectation {other:?}"),
        })
    }
}

#[derive(Clone, Debug)]
pub struct Entry {
    pub case: String,
    pub family: String,
    pub plain: Expect,
    pub ragged: Expect,
}

pub fn parse(text: &str) -> TractResult<Vec<Entry>> {
    let mut family = String::new();
    let mut entries = vec![];
    for (ix, line) in text.lines().enumerate() {
        let line = line.trim();
        if let Some(f) = line.strip_prefix("## ") {
            family = f.trim().to_string();
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let parts: Vec<&str> = line.split('|').collect();
        ensure!(
            parts.len() == 3,
            "manifest line {}: expected `case | plain | ragged`",
            ix + 1
        );
        entries.push(Entry {
            case: parts[0].trim().to_string(),
            family: family.clone(),
            plain: Expect::parse(parts[1]).with_context(|| format!("manifest line {}", ix + 1))?,
            ragged: Expect::parse(parts[2]).with_context(|| format!("manifest line {}", ix + 1))?,
        });
    }
    Ok(entries)
}
