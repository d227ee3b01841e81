//! `tract_ragged._native`: tract-ragged for Python.
//!
//! A [`Model`] is a runnable opened as `tract_ragged::open` opens it ([`tract_ragged::Options`]
//! from keyword arguments). Its methods take samples as Python gives them: a list of numpy
//! arrays (a model of one input) or of dicts from input name to array (several inputs),
//! and the inputs shared by the batch as a dict. They return each sample's outputs as a
//! list of numpy arrays, in the samples' order.
//!
//! The GIL is released while a model prepares and runs, so that Python threads run
//! other work, or other runs of the same model, meanwhile: a runnable is shared by
//! threads (its plans and measurements are behind locks). Each input array is copied once
//! into a tract tensor (tract owns the memory a batch is packed from); each output once
//! into a numpy array.
//!
//! Errors are exceptions of the kind the Rust error carries (`tract_ragged.error`):
//! `RefusedError` (with the node, its op and why), `BadSampleError` (with the sample's
//! index), `OutOfMemoryError`, `OSError` for files, `RaggedError` for the rest, each with
//! the error's chain on one line.

use std::path::PathBuf;

use numpy::{
    Element, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tract_core::internal::*;
use tract_ragged::error::{self, ErrorKind};
use tract_ragged::host_view::{self, HostView};
use tract_ragged::precision::Precision;
use tract_ragged::{Device, Options, RaggedRunnable, RaggedSpec, Sample, Samples};

create_exception!(
    _native,
    RaggedError,
    PyException,
    "An error of tract-ragged: the model's, tract's, or one of the kinds below."
);
create_exception!(
    _native,
    RefusedError,
    RaggedError,
    "The ragged transform refuses a node: batched, samples would not get what they get alone. \
     `node`, `op` and `reason` say which and why; the model still runs one by one."
);
create_exception!(
    _native,
    BadSampleError,
    RaggedError,
    "A sample does not fit the model (rank, element type, extents, width, values); `index` is \
     its position among the samples given, `input` the model input at fault (or None), `name` \
     the sample's name where the caller gave one (None from Python, which gives none)."
);
create_exception!(
    _native,
    OutOfMemoryError,
    RaggedError,
    "A run ran out of memory: the device's, or the memory budget's."
);

/// The Python exception for `e`, of its kind, its chain on one line.
fn exception(py: Python<'_>, e: &TractError) -> PyErr {
    let text = format!("{e:#}");
    let err = match error::kind(e) {
        ErrorKind::Refused => RefusedError::new_err(text),
        ErrorKind::BadSample => BadSampleError::new_err(text),
        ErrorKind::OutOfMemory => OutOfMemoryError::new_err(text),
        ErrorKind::Io => PyOSError::new_err(text),
        ErrorKind::Model => RaggedError::new_err(text),
    };
    let value = err.value(py);
    // The typed values, as attributes, where the chain has them; a copied error (a whole
    // run's failure given to each of its samples) keeps its kind only.
    if let Some(refused) = error::refusal(e) {
        let _ = value.setattr("node", &refused.node);
        let _ = value.setattr("op", &refused.op);
        let _ = value.setattr("reason", &refused.reason);
    }
    if let Some(bad) = e.downcast_ref::<error::BadSample>() {
        let _ = value.setattr("index", bad.index);
        let _ = value.setattr("input", bad.input.as_deref());
        let _ = value.setattr("name", bad.name.as_deref());
    }
    err
}

/// An input array, read: a C-ordered array (the usual case) where it lies, to be read in
/// place by the run ([`Input::view`]) or copied ([`Input::tensor`]); any other layout
/// copied now, in logical order.
enum Input {
    Copied(Tensor),
    InPlace(InPlace),
}

/// A C-ordered numpy array's elements, where they lie.
struct InPlace {
    datum_type: DatumType,
    shape: Vec<usize>,
    data: *const u8,
    bytes: usize,
}

// SAFETY: `data` points into a numpy array that the caller of `samples` keeps a reference
// to (its `keep` list) while the input or a view of it lives; nothing is written through it.
unsafe impl Send for InPlace {}

impl Input {
    /// A tensor of its own: for what outlives the call (a folded input).
    fn tensor(self) -> TractResult<Tensor> {
        match self {
            Input::Copied(t) => Ok(t),
            Input::InPlace(a) => {
                // SAFETY: every byte of the tensor is written just below, from an array of
                // the same element type (bools: numpy's 0 and 1) and shape.
                let mut t = unsafe { Tensor::uninitialized_dt(a.datum_type, &a.shape)? };
                // SAFETY: `data` holds `bytes` bytes that stay alive (`InPlace`'s Send).
                let source = unsafe { std::slice::from_raw_parts(a.data, a.bytes) };
                t.as_bytes_mut().copy_from_slice(source);
                Ok(t)
            }
        }
    }

    /// A tensor over the array's memory, which the run packs into its batches without a
    /// copy of its own (`tract_ragged::host_view`).
    ///
    /// # Safety
    ///
    /// The array (in the `keep` list of [`samples`]) outlives the tensor, unchanged.
    unsafe fn view(self) -> TractResult<Tensor> {
        match self {
            Input::Copied(t) => Ok(t),
            // SAFETY: the caller's contract: the array's `bytes` bytes at `data` stay alive
            // and unchanged while the tensor lives.
            Input::InPlace(a) => unsafe {
                HostView::tensor(a.datum_type, &a.shape, a.data, a.bytes)
            },
        }
    }
}

/// A numpy array of one of the types tract-ragged's models take, read as an [`Input`];
/// the array (a new one for a numpy scalar) is pushed to `keep`, which must outlive the
/// input.
fn input<'py>(
    array: &Bound<'py, PyAny>,
    keep: &mut Vec<Bound<'py, PyAny>>,
    what: &dyn Fn() -> String,
) -> PyResult<Input> {
    // A numpy scalar (`np.float32(1.5)`, what arithmetic on 0-d arrays gives) is a 0-d array.
    let numpy = array.py().import("numpy")?;
    let array = match array.is_instance(&numpy.getattr("generic")?)? {
        true => numpy.call_method1("asarray", (array,))?,
        false => array.clone(),
    };
    let untyped = array.cast::<PyUntypedArray>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{}: expected a numpy array, got {}",
            what(),
            array
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    let dtype = untyped.dtype();
    macro_rules! read {
        ($($t:ty),*) => {
            $(if dtype.is_equiv_to(&numpy::dtype::<$t>(array.py())) {
                let input = read_as::<$t>(untyped, what)?;
                keep.push(array);
                return Ok(input);
            })*
        };
    }
    read!(f32, f64, i64, i32, i16, i8, u8, u16, u32, u64, bool);
    Err(PyTypeError::new_err(format!(
        "{}: arrays of {dtype} are not taken (f32, f64, integers, bool)",
        what()
    )))
}

fn read_as<T: Element + Datum + Copy>(
    array: &Bound<'_, PyUntypedArray>,
    what: &dyn Fn() -> String,
) -> PyResult<Input> {
    let typed = array
        .cast::<PyArrayDyn<T>>()
        .map_err(|e| PyTypeError::new_err(format!("{}: {e}", what())))?;
    let readonly = typed.try_readonly().map_err(|e| {
        PyValueError::new_err(format!("{}: the array is being written: {e}", what()))
    })?;
    let shape = array.shape().to_vec();
    // A C-ordered array is copied as it lies; any other layout (a strided view, Fortran
    // order, whose memory `as_slice` would give in its own order) in logical order.
    if array.is_c_contiguous() {
        let values = readonly
            .as_slice()
            .map_err(|e| PyValueError::new_err(format!("{}: {e}", what())))?;
        return Ok(Input::InPlace(InPlace {
            datum_type: T::datum_type(),
            shape,
            data: values.as_ptr() as *const u8,
            bytes: std::mem::size_of_val(values),
        }));
    }
    let values: Vec<T> = readonly.as_array().iter().copied().collect();
    Tensor::from_shape(&shape, &values)
        .map(Input::Copied)
        .map_err(|e| PyValueError::new_err(format!("{}: {e:#}", what())))
}

/// An output tensor that a numpy array reads and writes in place: the array's base
/// object, which keeps the tensor's memory alive as long as the array (or a view of it)
/// lives.
#[pyclass(frozen)]
struct OutputBuffer(std::cell::UnsafeCell<Tensor>);

// SAFETY: after the array is made, Rust never touches the tensor but to drop it, with the
// base object: its memory is numpy's, behind the array's own rules.
unsafe impl Sync for OutputBuffer {}

/// A numpy array of `t`'s elements, in place (the outputs of a batch are hundreds of
/// megabytes: copying them into fresh numpy memory took longer than the batch's run on a
/// GPU).
fn array(py: Python<'_>, t: Tensor) -> PyResult<Bound<'_, PyAny>> {
    fn of<T: Element + Datum + Copy>(py: Python<'_>, t: Tensor) -> PyResult<Bound<'_, PyAny>> {
        let shape = t.shape().to_vec();
        let owner = Bound::new(py, OutputBuffer(std::cell::UnsafeCell::new(t)))?;
        // SAFETY: the tensor moved into `owner` without its heap data moving; nothing else
        // holds it (see `OutputBuffer`).
        let t = unsafe { &*owner.get().0.get() };
        let data = t
            .try_as_plain_ram()
            .and_then(|r| r.as_slice::<T>())
            .map_err(|e| RaggedError::new_err(format!("an output: {e:#}")))?;
        // SAFETY: `data` is the tensor's elements, `shape` laid out in C order (a plain
        // tensor's); `owner`, the array's base, keeps them alive as long as the array.
        let view = unsafe {
            numpy::ndarray::ArrayViewD::from_shape_ptr(numpy::ndarray::IxDyn(&shape), data.as_ptr())
        };
        // SAFETY: as above: the array borrows memory its base owns.
        let array = unsafe { PyArrayDyn::<T>::borrow_from_array(&view, owner.into_any()) };
        Ok(array.into_any())
    }
    match t.datum_type() {
        DatumType::F32 => of::<f32>(py, t),
        DatumType::F64 => of::<f64>(py, t),
        DatumType::I64 => of::<i64>(py, t),
        DatumType::I32 => of::<i32>(py, t),
        DatumType::I16 => of::<i16>(py, t),
        DatumType::I8 => of::<i8>(py, t),
        DatumType::U8 => of::<u8>(py, t),
        DatumType::U16 => of::<u16>(py, t),
        DatumType::U32 => of::<u32>(py, t),
        DatumType::U64 => of::<u64>(py, t),
        DatumType::Bool => of::<bool>(py, t),
        other => Err(RaggedError::new_err(format!(
            "an output of {other:?}: not representable in numpy here"
        ))),
    }
}

/// A sample's inputs, read.
enum PendingSample {
    One(Input),
    Named(Vec<(String, Input)>),
}

/// The samples a method was given, read ([`samples`]), not yet tensors.
struct Pending {
    samples: Vec<PendingSample>,
    shared: Vec<(String, Input)>,
}

impl Pending {
    /// The samples as tensors over the arrays' memory ([`Input::view`]).
    ///
    /// # Safety
    ///
    /// The `keep` list [`samples`] filled outlives the samples, and the arrays stay
    /// unchanged meanwhile.
    unsafe fn into_samples(self) -> TractResult<Samples<'static>> {
        // SAFETY: this function's contract.
        let view = |input: Input| unsafe { input.view() };
        let all = self
            .samples
            .into_iter()
            .map(|sample| match sample {
                PendingSample::One(input) => Ok(Sample::new(view(input)?)),
                PendingSample::Named(inputs) => Ok(Sample::named(
                    inputs
                        .into_iter()
                        .map(|(name, input)| Ok((name, view(input)?)))
                        .collect::<TractResult<Vec<_>>>()?,
                )),
            })
            .collect::<TractResult<Vec<Sample>>>()?;
        let mut samples = Samples::from(all);
        for (name, input) in self.shared {
            samples = samples.shared(name, view(input)?);
        }
        Ok(samples)
    }
}

/// The samples a method was given (a list of arrays, or of dicts from input name to
/// array) and the shared inputs by name, read; every array they read is pushed to `keep`,
/// which must outlive the samples' [`Pending::into_samples`].
fn samples<'py>(
    samples: &Bound<'py, PyAny>,
    shared: Option<&Bound<'py, PyDict>>,
    keep: &mut Vec<Bound<'py, PyAny>>,
) -> PyResult<Pending> {
    let mut all = vec![];
    for (ix, sample) in samples.try_iter()?.enumerate() {
        let sample = sample?;
        if let Ok(dict) = sample.cast::<PyDict>() {
            let mut named = vec![];
            for (name, value) in dict.iter() {
                let name: String = name.extract().map_err(|_| {
                    PyTypeError::new_err(format!("sample {ix}: input names are strings"))
                })?;
                let t = input(&value, keep, &|| format!("sample {ix}, input {name:?}"))?;
                named.push((name, t));
            }
            all.push(PendingSample::Named(named));
        } else {
            all.push(PendingSample::One(input(&sample, keep, &|| {
                format!("sample {ix}")
            })?));
        }
    }
    let mut shared_inputs = vec![];
    if let Some(shared) = shared {
        for (name, value) in shared.iter() {
            let name: String = name
                .extract()
                .map_err(|_| PyTypeError::new_err("shared input names are strings"))?;
            let t = input(&value, keep, &|| format!("shared input {name:?}"))?;
            shared_inputs.push((name, t));
        }
    }
    Ok(Pending {
        samples: all,
        shared: shared_inputs,
    })
}

/// A sample's outputs with bytes of their own: none of them a view of an input array
/// passed through (`host_view::owned`).
fn owned_outputs(outs: TVec<Tensor>) -> TVec<Tensor> {
    outs.into_iter().map(host_view::owned).collect()
}

/// [`owned_outputs`] of every sample.
fn owned(answers: Vec<TVec<Tensor>>) -> Vec<TVec<Tensor>> {
    answers.into_iter().map(owned_outputs).collect()
}

/// Each sample's outputs as a list of numpy arrays.
fn outputs(py: Python<'_>, outputs: Vec<TVec<Tensor>>) -> PyResult<Bound<'_, PyList>> {
    let list = PyList::empty(py);
    for sample in outputs {
        let arrays = sample
            .into_iter()
            .map(|t| array(py, t))
            .collect::<PyResult<Vec<_>>>()?;
        list.append(PyList::new(py, arrays)?)?;
    }
    Ok(list)
}

impl Model {
    /// `verb`'s answers to `samples` (with `shared`), the GIL released while it runs.
    fn answer<'py>(
        &self,
        py: Python<'py>,
        samples: &Bound<'py, PyAny>,
        shared: Option<&Bound<'py, PyDict>>,
        verb: fn(&RaggedRunnable, Samples<'static>) -> TractResult<Vec<TVec<Tensor>>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let mut keep = vec![];
        let pending = self::samples(samples, shared, &mut keep)?;
        // SAFETY: `keep` outlives the samples, and the outputs are made owned before it goes.
        let answers = py
            .detach(|| {
                Ok::<_, TractError>(owned(verb(&self.runnable, unsafe {
                    pending.into_samples()?
                })?))
            })
            .map_err(|e| exception(py, &e))?;
        drop(keep);
        outputs(py, answers)
    }
}

/// A model prepared for ragged batches (module doc of `tract_ragged`).
#[pyclass(frozen, module = "tract_ragged._native")]
struct Model {
    runnable: RaggedRunnable,
}

#[pymethods]
impl Model {
    /// Opens the ONNX model at `path`, ragged along `ragged` (`"x:3"`: input `x`, axis 3;
    /// `"x:2,3"` for H and W), as the keyword arguments say.
    #[new]
    #[pyo3(signature = (
        path, ragged, *, input_fact=None, runtime="cpu", precision="f32", top_k=None,
        memory=None, lanes=None, max_batch=None, folded=None, knobs=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        ragged: &str,
        input_fact: Option<&Bound<'_, PyAny>>,
        runtime: &str,
        precision: &str,
        top_k: Option<usize>,
        memory: Option<u64>,
        lanes: Option<usize>,
        max_batch: Option<usize>,
        folded: Option<&Bound<'_, PyDict>>,
        knobs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Model> {
        let spec: RaggedSpec = ragged
            .parse()
            .map_err(|e: TractError| PyValueError::new_err(format!("ragged={ragged:?}: {e:#}")))?;
        let device: Device = runtime
            .parse()
            .map_err(|e: TractError| PyValueError::new_err(format!("{e:#}")))?;
        let precision: Precision = precision
            .parse()
            .map_err(|e: TractError| PyValueError::new_err(format!("{e:#}")))?;
        let mut options = Options::default().device(device).precision(precision);
        options.top_k = top_k;
        options.memory = memory;
        options.lanes = lanes;
        options.max_batch = max_batch;
        if let Some(facts) = input_fact {
            match facts.extract::<String>() {
                Ok(fact) => options.input_facts.push(fact),
                Err(_) => options.input_facts = facts.extract::<Vec<String>>()?,
            }
        }
        if let Some(folded) = folded {
            for (name, value) in folded.iter() {
                let name: String = name.extract()?;
                let mut keep = vec![];
                let t = input(&value, &mut keep, &|| format!("folded input {name:?}"))?
                    .tensor()
                    .map_err(|e| exception(py, &e))?;
                options.folded.push((name, t));
            }
        }
        if let Some(knobs) = knobs {
            for (name, value) in knobs.iter() {
                options
                    .knobs
                    .push((name.extract()?, value.str()?.to_string()));
            }
        }
        let runnable = py
            .detach(|| tract_ragged::open(&path, spec, &options))
            .map_err(|e| exception(py, &e))?;
        Ok(Model { runnable })
    }

    /// Runs `samples` (a list of arrays, or of dicts from input name to array) in the
    /// batches the scheduler cuts; `shared`: the inputs given once, by name. Returns each
    /// sample's outputs (a list of arrays), in order. The first sample that fails raises;
    /// with `keep_going=True`, its entry is the exception instead and the others run.
    #[pyo3(signature = (samples, shared=None, *, keep_going=false))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        samples: &Bound<'py, PyAny>,
        shared: Option<&Bound<'py, PyDict>>,
        keep_going: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let mut keep = vec![];
        let pending = self::samples(samples, shared, &mut keep)?;
        // SAFETY (both runs): `keep` outlives the samples, and the outputs are made owned
        // before it goes.
        if !keep_going {
            let answers = py
                .detach(|| {
                    Ok::<_, TractError>(owned(
                        self.runnable.run(unsafe { pending.into_samples()? })?,
                    ))
                })
                .map_err(|e| exception(py, &e))?;
            drop(keep);
            return outputs(py, answers);
        }
        let answers = py
            .detach(|| {
                let answers = self.runnable.run_each(unsafe { pending.into_samples()? })?;
                Ok::<_, TractError>(
                    answers
                        .into_iter()
                        .map(|a| a.map(owned_outputs))
                        .collect::<Vec<_>>(),
                )
            })
            .map_err(|e| exception(py, &e))?;
        drop(keep);
        let list = PyList::empty(py);
        for answer in answers {
            match answer {
                Ok(outs) => list.append(outputs(py, vec![outs])?.get_item(0)?)?,
                Err(e) => list.append(exception(py, &e).into_value(py))?,
            }
        }
        Ok(list)
    }

    /// The reference: each sample alone through the original model, as `run` takes and
    /// returns them.
    #[pyo3(signature = (samples, shared=None))]
    fn run_one_by_one<'py>(
        &self,
        py: Python<'py>,
        samples: &Bound<'py, PyAny>,
        shared: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyList>> {
        self.answer(py, samples, shared, RaggedRunnable::run_one_by_one)
    }

    /// Runs `samples` as one batch, as given (a caller batching on its own).
    #[pyo3(signature = (samples, shared=None))]
    fn run_batch<'py>(
        &self,
        py: Python<'py>,
        samples: &Bound<'py, PyAny>,
        shared: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyList>> {
        self.answer(py, samples, shared, RaggedRunnable::run_batch)
    }

    /// Per-node timings of one ragged batch of `samples` (a model of one input): `runs`
    /// timed runs after one warm-up, each node timed as the backend times it (device time
    /// on cuda), as a dict in the shape of tract's `dump --json` (tract-libcli's
    /// `GraphPerfInfo`), with each node's cost where `cost` asks.
    #[pyo3(signature = (samples, *, runs=5, cost=false))]
    fn profile<'py>(
        &self,
        py: Python<'py>,
        samples: &Bound<'py, PyAny>,
        runs: usize,
        cost: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut tensors = vec![];
        let mut keep = vec![];
        for (ix, sample) in samples.try_iter()?.enumerate() {
            let input = input(&sample?, &mut keep, &|| format!("sample {ix}"))?;
            tensors.push(input.tensor().map_err(|e| exception(py, &e))?);
        }
        let runnable = &self.runnable;
        let json = py
            .detach(|| {
                let (plan, inputs) = runnable.prepared(&tensors)?;
                let profile =
                    tract_ragged::profile::profile(&**runnable.backend(), &plan, inputs, runs)?;
                tract_ragged::profile::json(&plan, &profile, cost)
            })
            .map_err(|e| exception(py, &e))?;
        py.import("json")?.call_method1("loads", (json,))
    }

    /// The model's inputs, in order: `(name, role)`, role `"ragged"`, `"per_sample"` or
    /// `"shared"` (a sample gives the first two, `shared=` the last).
    #[getter]
    fn inputs(&self, py: Python<'_>) -> PyResult<Vec<(String, &'static str)>> {
        let slots = self.runnable.input_slots().map_err(|e| exception(py, &e))?;
        Ok(slots
            .into_iter()
            .map(|s| {
                let role = match s.role {
                    tract_ragged::transform::InputRole::Ragged(_) => "ragged",
                    tract_ragged::transform::InputRole::PerSample { .. } => "per_sample",
                    tract_ragged::transform::InputRole::Shared => "shared",
                };
                (s.name, role)
            })
            .collect())
    }

    /// The names of the model's outputs, in the order each sample's outputs come.
    #[getter]
    fn outputs(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let slots = self
            .runnable
            .output_slots()
            .map_err(|e| exception(py, &e))?;
        Ok(slots.into_iter().map(|(name, _)| name).collect())
    }

    /// The model's string metadata (ONNX `metadata_props`: a PP-OCR recogniser's
    /// `character` dictionary), by key.
    #[getter]
    fn metadata(&self) -> std::collections::BTreeMap<String, String> {
        self.runnable
            .model()
            .properties()
            .iter()
            .filter_map(|(k, v)| {
                let key = k.strip_prefix("onnx.metadata_props.")?;
                let value = v.try_as_plain_ram().ok()?.to_scalar::<String>().ok()?;
                Some((key.to_string(), value.clone()))
            })
            .collect()
    }

    /// The runtime it runs on (`"cpu"` or `"ragged-cuda"`).
    #[getter]
    fn runtime(&self) -> String {
        self.runnable.runtime().name().to_string()
    }
}

/// tract-ragged for Python (module doc).
/// The edit of tract-linalg's `TRACT_CPU_ISA` this CPU's matrix products want, if any
/// (`tract_ragged::backend::preferred_isa_edit`): the package sets it at import unless the
/// user did.
#[pyfunction]
fn _preferred_isa_edit() -> Option<&'static str> {
    tract_ragged::backend::preferred_isa_edit()
}

/// Keeps freed memory in the process for the next batch, as the CLI does: glibc serves
/// blocks up to 64 MiB from its heap and keeps up to 1 GiB freed at its top, where by
/// default it maps each large block afresh and hands it back once freed, so that every run
/// page-faults its tensors in again (on the CPU, 13% of PP-OCRv4 rec's 112 lines on 2
/// cores: benches/NOTES.md). The process keeps the memory its runs peak at. The package
/// calls it at import unless the user set glibc's own variables (`MALLOC_MMAP_THRESHOLD_`,
/// `MALLOC_TRIM_THRESHOLD_`). Whether glibc took both settings.
#[pyfunction]
fn _keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters, under the allocator's lock (MT-Safe
    // in glibc's manual), for the blocks allocated and freed from then on.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30) == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(_preferred_isa_edit, m)?)?;
    m.add_function(wrap_pyfunction!(_keep_freed_memory, m)?)?;
    m.add_class::<Model>()?;
    m.add("RaggedError", py.get_type::<RaggedError>())?;
    m.add("RefusedError", py.get_type::<RefusedError>())?;
    m.add("BadSampleError", py.get_type::<BadSampleError>())?;
    m.add("OutOfMemoryError", py.get_type::<OutOfMemoryError>())?;
    Ok(())
}
