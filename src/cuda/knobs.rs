//! ragged-cuda's knobs, declared with tract's own mechanism (`declare_knob!`).
//!
//! Each is read while a model is translated and its plan prepared, never while it runs,
//! so each is *scopable*: a `KnobScope` entered around preparation sets it for one model
//! ([`crate::RaggedRunnable::with_knobs`] does that for every plan of a runnable). Then
//! tract's order applies: a programmatic override (`Knob::set`), the thread's scope, the
//! environment variable of the same name, a deployment config, the default. Booleans
//! accept 1/0, true/false, on/off, yes/no; anything else is ignored (the next source
//! decides). `tract_core::knobs::list()` lists them with tract's own.
//!
//! `TRACT_RAGGED_KEEP_FREED` and `TRACT_RAGGED_POOL_WAITS` are the exceptions: settings of
//! the device's memory pool, made once per process when the first plan is prepared
//! ([`super::memory_pool`]), they take a process-wide value only.

use tract_core::declare_knob;

declare_knob!(
    scopable TRACT_RAGGED_FUSE,
    bool,
    true,
    "ragged-cuda: run chains of element-wise ops as one generated kernel each, masks that read them inside."
);

declare_knob!(
    scopable TRACT_RAGGED_CUBLAS,
    bool,
    true,
    "ragged-cuda: run 1x1 convolutions as cuBLAS GEMMs on NCHW and depthwise ones on our kernel (off: tract-cuda's GEMMs, and cuDNN)."
);

declare_knob!(
    scopable TRACT_RAGGED_GRAPHS,
    bool,
    true,
    "ragged-cuda: replay a plan's repeated batch shapes as CUDA graphs."
);

declare_knob!(
    scopable TRACT_RAGGED_CAPTURE_WHEN_IDLE,
    bool,
    false,
    "ragged-cuda: capture a batch shape's CUDA graph only while no other run of ours is under way, putting it off to a later run otherwise (a capture holds the other lanes' runs off while it records; off: it waits for them)."
);

declare_knob!(
    scopable TRACT_RAGGED_SYMBOLIC_PLANS,
    bool,
    true,
    "ragged-cuda: prepare one plan over the model's symbolic batch size and widths and run every batch shape on it, where the model is typed over symbols and prepared in one piece (off: a plan per batch shape, each translated for the device anew, about 40 ms of host work for PP-OCRv4 rec)."
);

declare_knob!(
    scopable TRACT_RAGGED_TF32,
    bool,
    false,
    "ragged-cuda: let f32 convolutions and 1x1 GEMMs run on TF32 tensor cores (faster, a relative error near 1e-3: no longer exact)."
);

declare_knob!(
    scopable TRACT_RAGGED_DEVICE_ONLY,
    bool,
    false,
    "ragged-cuda: refuse a plan that leaves nodes on the host between its input and output syncs, naming them (off: they run on the host, a sync each)."
);

declare_knob!(
    TRACT_RAGGED_KEEP_FREED,
    bool,
    true,
    "ragged-cuda: keep device memory a run frees in the device's memory pool for the next run (off: the pool hands it back to the driver at each synchronisation, CUDA's default). Process-wide."
);

declare_knob!(
    TRACT_RAGGED_POOL_WAITS,
    bool,
    true,
    "ragged-cuda: let the device's memory pool hand a stream memory another stream freed but has not yet reached, making the one wait for the other (CUDA's default; off: it hands out memory already free, or takes more from the driver, and a lane's upload never waits for another lane's run). Process-wide."
);

#[cfg(test)]
mod tests {
    use super::*;
    use tract_core::knobs::{KnobScope, all};

    /// Each knob is listed with tract's, takes a per-model scope, and reads the words
    /// users write for off and on.
    #[test]
    fn knobs_are_tracts_scopable_and_read_every_spelling() {
        let listed: Vec<&str> = all()
            .iter()
            .filter(|k| k.name.starts_with("TRACT_RAGGED_") && k.doc.starts_with("ragged-cuda:"))
            .map(|k| k.name)
            .collect();
        assert_eq!(
            listed,
            [
                "TRACT_RAGGED_CAPTURE_WHEN_IDLE",
                "TRACT_RAGGED_CUBLAS",
                "TRACT_RAGGED_DEVICE_ONLY",
                "TRACT_RAGGED_FUSE",
                "TRACT_RAGGED_GRAPHS",
                "TRACT_RAGGED_KEEP_FREED",
                "TRACT_RAGGED_POOL_WAITS",
                "TRACT_RAGGED_SYMBOLIC_PLANS",
                "TRACT_RAGGED_TF32"
            ]
        );
        for off in ["0", "false", "off", "no", "OFF"] {
            let scope = KnobScope::new([("TRACT_RAGGED_GRAPHS", off)]).unwrap();
            assert!(!scope.enter(|| TRACT_RAGGED_GRAPHS.get()), "{off}");
        }
        for on in ["1", "true", "on", "yes"] {
            let scope = KnobScope::new([("TRACT_RAGGED_TF32", on)]).unwrap();
            assert!(scope.enter(|| TRACT_RAGGED_TF32.get()), "{on}");
        }
        assert!(KnobScope::new([("TRACT_RAGGED_FUSE", "maybe")]).is_err());
        // Outside a scope, the defaults (the test environment sets none of them).
        assert!(TRACT_RAGGED_GRAPHS.get() && !TRACT_RAGGED_TF32.get());
    }
}
