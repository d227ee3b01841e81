//! Samples in and outputs out, as NumPy `.npz` archives.
//!
//! The CLI's contract: an input archive holds one array per sample, in archive order,
//! without the batch axis; the output archive holds `s{i}_o{j}`, output j of sample i,
//! batch axis removed and cropped to its valid extent.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::Path;

use ndarray_npy::{NpzReader, NpzWriter, ReadNpzError};
use tract_core::internal::*;
use tract_core::ndarray::{ArrayD, OwnedRepr};

/// Reads every array of an `.npz` archive, in archive order, with its name.
pub fn read_samples(path: impl AsRef<Path>) -> TractResult<Vec<(String, Tensor)>> {
    let path = path.as_ref();
    let file = File::open(path).with_context(|| format!("Opening {}", path.display()))?;
    let mut npz = NpzReader::new(BufReader::new(file))
        .with_context(|| format!("Reading {} as an .npz archive", path.display()))?;
    let names = npz.names()?;
    names
        .into_iter()
        .map(|name| {
            let tensor = read_any(&mut npz, &name)
                .with_context(|| format!("Reading array {name:?} of {}", path.display()))?;
            Ok((name, tensor))
        })
        .collect()
}

/// One array of whatever element type it holds.
fn read_any<R: std::io::Read + std::io::Seek>(
    npz: &mut NpzReader<R>,
    name: &str,
) -> TractResult<Tensor> {
    macro_rules! attempt {
        ($($t:ty),*) => {
            $(
                match npz.by_name::<OwnedRepr<$t>, tract_core::ndarray::IxDyn>(name) {
                    Ok(array) => return Ok(Tensor::from(array)),
                    Err(ReadNpzError::Npy(ndarray_npy::ReadNpyError::WrongDescriptor(_))) => (),
                    Err(e) => return Err(e.into()),
                }
            )*
        };
    }
    attempt!(f32, f64, u8, i8, u16, i16, u32, i32, u64, i64, bool);
    bail!("unsupported element type (expected a float, integer or bool array)")
}

fn add<T: Datum + ndarray_npy::WritableElement>(
    npz: &mut NpzWriter<BufWriter<File>>,
    name: &str,
    tensor: &Tensor,
) -> TractResult<()> {
    let array: ArrayD<T> = tensor.to_plain_array_view::<T>()?.to_owned();
    npz.add_array(name, &array)?;
    Ok(())
}

/// Writes named tensors to an `.npz` archive.
pub fn write_arrays<'a>(
    path: impl AsRef<Path>,
    arrays: impl IntoIterator<Item = (String, &'a Tensor)>,
) -> TractResult<()> {
    let path = path.as_ref();
    let file = File::create(path).with_context(|| format!("Creating {}", path.display()))?;
    let mut npz = NpzWriter::new(BufWriter::new(file));
    for (name, tensor) in arrays {
        match tensor.datum_type() {
            DatumType::F16 => add::<f32>(&mut npz, &name, &*tensor.cast_to::<f32>()?)?,
            DatumType::F32 => add::<f32>(&mut npz, &name, tensor)?,
            DatumType::F64 => add::<f64>(&mut npz, &name, tensor)?,
            DatumType::U8 => add::<u8>(&mut npz, &name, tensor)?,
            DatumType::I8 => add::<i8>(&mut npz, &name, tensor)?,
            DatumType::I32 => add::<i32>(&mut npz, &name, tensor)?,
            DatumType::I64 => add::<i64>(&mut npz, &name, tensor)?,
            DatumType::Bool => add::<bool>(&mut npz, &name, tensor)?,
            dt => bail!("cannot write a {dt:?} array ({name}) to .npz"),
        }
    }
    npz.finish()
        .with_context(|| format!("Writing {}", path.display()))?;
    Ok(())
}
