//! Samples read where they lie: a tensor over host memory that another owner keeps (a
//! numpy array, a memory-mapped file), packed into its batch without a copy of its own.
//!
//! A batch copies its samples once anyway, into the packed batch (on the host, then to the
//! device). A binding that first copied each sample into a tensor of its own paid a second
//! copy: tens of megabytes for a batch of text lines, a few percent of a run on a GPU.
//! [`HostView::tensor`] makes a tensor whose storage is the caller's bytes; the packer
//! reads them in place ([`bytes`]). Whatever else reads the tensor through tract (the
//! reference run one by one, a clone) gets a copy made on its first read: correct
//! everywhere, free where it counts.
//!
//! The caller keeps the memory alive and unchanged while the tensor lives, which the
//! compiler cannot check: [`HostView::tensor`] is `unsafe`.

use std::fmt;
use std::sync::OnceLock;

use tract_core::internal::*;

/// The storage of a tensor over another owner's host memory (module doc).
pub struct HostView {
    data: *const u8,
    len: usize,
    alignment: usize,
    /// The bytes copied into memory of the tensor's own, on the first read through tract
    /// (or the first write): from then on, the tensor's bytes.
    copied: OnceLock<PlainStorage>,
}

// SAFETY: the bytes are only read, and `HostView::tensor`'s caller keeps them alive and
// unchanged while the tensor lives, whichever thread reads them.
unsafe impl Send for HostView {}
// SAFETY: as for Send; `copied` is a OnceLock.
unsafe impl Sync for HostView {}

impl HostView {
    /// A tensor of `dt` and `shape` whose elements are the `len` bytes at `data`, in C
    /// order, read where they lie (module doc).
    ///
    /// # Safety
    ///
    /// `data` must point at `len` readable bytes that stay alive and unchanged as long as
    /// the tensor lives (a clone owns a copy of its own). A run's outputs may be its input
    /// tensors themselves (a model that passes an input through): give them to [`owned`]
    /// before the memory goes.
    pub unsafe fn tensor(
        dt: DatumType,
        shape: &[usize],
        data: *const u8,
        len: usize,
    ) -> TractResult<Tensor> {
        ensure!(
            dt.is_copy(),
            "a view of host memory holds plain numbers, not {dt:?}"
        );
        let expected = shape
            .iter()
            .try_fold(dt.size_of(), |bytes, d| bytes.checked_mul(*d))
            .with_context(|| format!("a tensor of shape {shape:?} is too large"))?;
        ensure!(
            len == expected,
            "{len} bytes for {shape:?} of {dt:?}, which takes {expected}"
        );
        ensure!(
            len == 0 || !data.is_null(),
            "a view of host memory at a null pointer"
        );
        let view = HostView {
            data,
            len,
            // As tract aligns the tensors it allocates.
            alignment: vector_size(),
            copied: OnceLock::new(),
        };
        Ok(Tensor::from_storage(dt, shape, view))
    }

    /// The caller's bytes, where they lie.
    fn view(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `tensor`'s contract: `len` readable bytes at `data`, alive and unchanged
        // while this storage lives.
        unsafe { std::slice::from_raw_parts(self.data, self.len) }
    }

    /// The bytes the tensor reads: the copy once made, else the caller's.
    fn bytes(&self) -> &[u8] {
        match self.copied.get() {
            Some(copy) => copy.as_bytes(),
            None => self.view(),
        }
    }

    fn copy(&self) -> TractResult<PlainStorage> {
        Ok(PlainStorage::from(Blob::from_bytes_alignment(
            self.view(),
            self.alignment,
        )?))
    }

    fn copied(&self) -> TractResult<&PlainStorage> {
        if self.copied.get().is_none() {
            // Two threads may copy at once: one copy is kept, both are the same bytes.
            let _ = self.copied.set(self.copy()?);
        }
        self.copied
            .get()
            .context("a view of host memory lost its copy")
    }
}

/// A tensor's bytes on the host, in place where it is a [`HostView`].
pub fn bytes(t: &Tensor) -> TractResult<&[u8]> {
    match t.storage_as::<HostView>() {
        Some(view) => Ok(view.bytes()),
        None => Ok(t.try_as_plain_ram()?.as_bytes()),
    }
}

/// `t`, with bytes of its own where it is a [`HostView`] (an output that is an input
/// passed through): what may outlive the caller's memory.
pub fn owned(t: Tensor) -> Tensor {
    match t.storage_as::<HostView>() {
        Some(_) => t.deep_clone(),
        None => t,
    }
}

impl TensorStorage for HostView {
    fn byte_len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn deep_clone(&self) -> Box<dyn TensorStorage> {
        // A clone owns its bytes: it may outlive the caller's memory. The copy fails only on
        // a layout `tensor` refused already (an allocation failure aborts): never a clone
        // without its bytes.
        match self.copied() {
            Ok(copy) => Box::new(copy.clone()),
            Err(e) => panic!("copying a view of host memory: {e:#}"),
        }
    }

    fn as_plain_ram(&self) -> Option<&PlainStorage> {
        self.copied.get()
    }

    fn as_plain_ram_mut(&mut self) -> Option<&mut PlainStorage> {
        // A write goes to a copy of the tensor's own, never to the caller's memory.
        if self.copied.get().is_none() {
            let copy = self.copy().ok()?;
            let _ = self.copied.set(copy);
        }
        self.copied.get_mut()
    }

    fn into_plain_ram(self: Box<Self>) -> Option<PlainStorage> {
        match self.copied.get() {
            Some(_) => self.copied.into_inner(),
            None => self.copy().ok(),
        }
    }

    fn dyn_hash(&self, state: &mut dyn std::hash::Hasher) {
        state.write(self.bytes());
    }

    fn exotic_fact(&self, _shape: &[usize]) -> TractResult<Option<Box<dyn ExoticFact>>> {
        Ok(None)
    }

    fn is_exotic(&self) -> bool {
        false
    }

    fn in_ram(&self) -> bool {
        true
    }

    fn materialize_plain_ram(&self) -> TractResult<&PlainStorage> {
        self.copied()
    }
}

impl PartialEq for HostView {
    fn eq(&self, other: &HostView) -> bool {
        self.bytes() == other.bytes()
    }
}

impl Eq for HostView {}

impl fmt::Debug for HostView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "HostView({} bytes at {:p}{})",
            self.len,
            self.data,
            if self.copied.get().is_some() {
                ", copied"
            } else {
                ""
            }
        )
    }
}

impl fmt::Display for HostView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view_of(values: &[f32], shape: &[usize]) -> Tensor {
        // SAFETY: `values` outlives every tensor of these tests.
        unsafe {
            HostView::tensor(
                f32::datum_type(),
                shape,
                values.as_ptr() as *const u8,
                std::mem::size_of_val(values),
            )
        }
        .unwrap()
    }

    #[test]
    fn a_view_reads_in_place_and_copies_only_for_tract() {
        let values: Vec<f32> = (0..24).map(|x| x as f32).collect();
        let t = view_of(&values, &[2, 3, 4]);
        let owned = Tensor::from_shape(&[2, 3, 4], &values).unwrap();
        // The packer's read: the caller's memory itself.
        assert_eq!(bytes(&t).unwrap().as_ptr(), values.as_ptr() as *const u8);
        assert!(t.storage_as::<HostView>().unwrap().copied.get().is_none());
        // Tract's own reads see the same elements, through a copy.
        assert_eq!(
            t.to_plain_array_view::<f32>().unwrap(),
            owned.to_plain_array_view::<f32>().unwrap()
        );
        assert_eq!(t.clone(), owned);
        assert_eq!(t.slice(1, 1, 3).unwrap(), owned.slice(1, 1, 3).unwrap());
        // Once copied, the copy is what the packer reads too.
        assert_ne!(bytes(&t).unwrap().as_ptr(), values.as_ptr() as *const u8);
        assert_eq!(bytes(&t).unwrap(), owned.as_bytes());
    }

    #[test]
    fn an_owned_tensor_outlives_the_callers_memory() {
        let values = vec![1f32, 2., 3.];
        let t = owned(view_of(&values, &[3]));
        drop(values);
        assert!(t.storage_as::<HostView>().is_none());
        assert_eq!(t, tensor1(&[1f32, 2., 3.]));
    }

    #[test]
    fn a_write_goes_to_a_copy_never_to_the_callers_memory() {
        let values = vec![1f32, 2., 3.];
        let mut t = view_of(&values, &[3]);
        t.try_as_plain_ram_mut()
            .unwrap()
            .as_slice_mut::<f32>()
            .unwrap()[0] = 9.;
        assert_eq!(values, [1., 2., 3.]);
        assert_eq!(
            t.try_as_plain_ram().unwrap().as_slice::<f32>().unwrap(),
            [9., 2., 3.]
        );
    }

    #[test]
    fn sizes_that_do_not_match_are_refused() {
        let values = [0f32; 6];
        let ptr = values.as_ptr() as *const u8;
        // SAFETY: refused before anything is read.
        unsafe {
            assert!(HostView::tensor(f32::datum_type(), &[2, 4], ptr, 24).is_err());
            assert!(HostView::tensor(f32::datum_type(), &[usize::MAX, 4], ptr, 24).is_err());
            assert!(HostView::tensor(String::datum_type(), &[1], ptr, 24).is_err());
        }
    }
}
