//! tract-ragged's knobs for every runtime, declared with tract's own mechanism
//! (`declare_knob!`); ragged-cuda's are in `cuda::knobs`, the segmenter's in
//! [`crate::segment`].
//!
//! They resolve as tract's knobs do: a programmatic override (`Knob::set`), the thread's
//! `KnobScope`, the environment variable of the same name, a deployment config, the
//! default. Each is scopable: [`crate::RaggedRunnable::with_knobs`] sets them for one
//! runnable, its plans and its runs (the scheduler reads these two inside that scope).
//! [`table`] writes every knob of tract-ragged as docs/api.md lists them.

use tract_core::declare_knob;

declare_knob!(
    scopable TRACT_RAGGED_LANES,
    Option<usize>,
    None,
    "every runtime: the batches a run of many samples runs at once, each in its lane (unset: one per core on the host, 4 on ragged-cuda)."
);

declare_knob!(
    scopable TRACT_RAGGED_MAX_BATCH,
    Option<usize>,
    None,
    "every runtime: the most samples the scheduler puts in one batch (unset: 64 on the host, 32 on ragged-cuda; `tract-ragged run --batch` sets it for a run)."
);

declare_knob!(
    scopable TRACT_RAGGED_PLAN_HELPERS,
    Option<usize>,
    None,
    "every runtime: the threads one by one prepares the next samples' plans on while a sample runs, at most 12 (unset: the backend's: the other cores, at most 3, on the host; the other cores on ragged-cuda; 0: none)."
);

declare_knob!(
    scopable TRACT_RAGGED_MEMORY,
    Option<usize>,
    None,
    "every runtime: the bytes the scheduler fits a run's batches into (unset: 4/5 of the free memory of the device, or of the host on the CPU)."
);

declare_knob!(
    scopable TRACT_RAGGED_TURNS,
    bool,
    true,
    "every runtime: where the backend's runs take turns (ragged-cuda), a run's lanes run their plans one at a time, each queueing its work after the last's (off: the lanes launch at once, their batches side by side on the device; for batches whose launches cost more than their device time)."
);

/// The lanes [`TRACT_RAGGED_LANES`] asks for, where it is a count of at least 1.
pub fn lanes() -> Option<usize> {
    TRACT_RAGGED_LANES.get().filter(|n| *n >= 1)
}

/// The largest batch [`TRACT_RAGGED_MAX_BATCH`] asks for, where it is a count of at
/// least 1.
pub fn max_batch() -> Option<usize> {
    TRACT_RAGGED_MAX_BATCH.get().filter(|n| *n >= 1)
}

/// The plan helpers [`TRACT_RAGGED_PLAN_HELPERS`] asks for, 0 included.
pub fn plan_helpers() -> Option<usize> {
    TRACT_RAGGED_PLAN_HELPERS.get()
}

/// The memory budget [`TRACT_RAGGED_MEMORY`] asks for, in bytes, where it is at least 1.
pub fn memory() -> Option<u64> {
    TRACT_RAGGED_MEMORY
        .get()
        .filter(|n| *n >= 1)
        .map(|n| n as u64)
}

/// Every knob of tract-ragged declared in this build (ragged-cuda's with the `cuda`
/// feature), as a Markdown table: name, default, whether a `KnobScope` reaches it, and
/// what it does (its declaration's doc). docs/api.md's table is this one.
pub fn table() -> String {
    let mut knobs: Vec<_> = tract_core::knobs::all()
        .into_iter()
        .filter(|k| k.name.starts_with("TRACT_RAGGED_"))
        .collect();
    knobs.sort_by_key(|k| k.name);
    let mut table = String::from("| knob | default | scopable | what it does |\n");
    table.push_str("| --- | --- | --- | --- |\n");
    for k in knobs {
        table.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            k.name,
            (k.default)(),
            if k.scopable { "yes" } else { "no" },
            k.doc
        ));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use tract_core::knobs::KnobScope;

    /// A scope sets the lanes and the batch size; zero and words are not counts.
    #[test]
    fn lanes_and_batches_take_a_scope_and_counts_only() {
        let scope =
            KnobScope::new([("TRACT_RAGGED_LANES", "3"), ("TRACT_RAGGED_MAX_BATCH", "0")]).unwrap();
        assert_eq!(scope.enter(lanes), Some(3));
        assert_eq!(scope.enter(max_batch), None);
        assert!(KnobScope::new([("TRACT_RAGGED_LANES", "many")]).is_err());
        let table = table();
        assert!(
            table.contains("| `TRACT_RAGGED_LANES` | (unset) | yes |"),
            "{table}"
        );
    }
}
