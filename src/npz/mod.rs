//! Samples in and outputs out, as NumPy `.npz` archives: the CLI's files.
//!
//! The CLI's contract: an input archive holds one array per sample, in archive order,
//! without the batch axis; the output archive holds `s{i}_o{j}`, output j of sample i,
//! batch axis removed and cropped to its valid extent.
//!
//! Reading trusts nothing the file says ([`npy`]): names must be distinct, every size is
//! checked before anything is allocated for it (against what the archive declares, and
//! against a limit the caller gives), and data is read in chunks. Writing is atomic: the
//! archive is written next to its destination under a temporary name, synced, then renamed
//! over it, so that a run that fails or is killed leaves the previous file as it was.

use std::fs::File;
use std::io::{BufReader, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use ndarray_npy::NpzWriter;
use tract_core::internal::*;
use tract_core::ndarray::ArrayD;

pub mod npy;

/// Reads every array of an `.npz` archive, in archive order, with its name (without the
/// `.npy` suffix), their data taking at most `limit` bytes in all.
pub fn read_samples(path: impl AsRef<Path>, limit: u64) -> TractResult<Vec<(String, Tensor)>> {
    let path = path.as_ref();
    let what = || format!("Reading {}", path.display());
    ensure!(
        !path.is_dir(),
        "{} is a directory, not an .npz archive",
        path.display()
    );
    let file = File::open(path).with_context(|| format!("Opening {}", path.display()))?;
    let mut archive = zip::ZipArchive::new(BufReader::new(file))
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("Reading {} as an .npz archive", path.display()))?;
    let mut arrays: Vec<(String, Tensor)> = Vec::with_capacity(archive.len().min(1 << 16));
    let mut names = std::collections::HashSet::new();
    let mut left = limit;
    for ix in 0..archive.len() {
        let mut entry = archive
            .by_index(ix)
            .map_err(|e| anyhow!("{e}"))
            .with_context(|| format!("entry {ix}"))
            .with_context(what)?;
        if entry.is_dir() {
            continue;
        }
        let name = entry.name().trim_end_matches(".npy").to_string();
        ensure!(
            names.insert(name.clone()),
            "{} holds two arrays named {name:?}",
            path.display()
        );
        let declared = entry.size();
        let tensor = npy::read_array(&mut entry, left.min(declared))
            .with_context(|| format!("Reading array {name:?} of {}", path.display()))?;
        left -= (tensor.len() * tensor.datum_type().size_of()) as u64;
        arrays.push((name, tensor));
    }
    Ok(arrays)
}

/// A file that remembers its first write error instead of returning it: the zip writer
/// over it then never fails half-way, so it never reports a failure from its `Drop` (zip
/// prints those to stderr), and the error comes back once, from [`Sticky::finish`].
struct Sticky {
    file: File,
    /// Where the zip writer believes it is, kept after an error.
    position: u64,
    end: u64,
    error: Option<std::io::Error>,
}

impl Sticky {
    fn new(file: File) -> Sticky {
        Sticky {
            file,
            position: 0,
            end: 0,
            error: None,
        }
    }

    fn finish(self) -> std::io::Result<File> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.file),
        }
    }
}

impl Write for Sticky {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.error.is_none()
            && let Err(e) = self.file.write_all(buf)
        {
            self.error = Some(e);
        }
        self.position += buf.len() as u64;
        self.end = self.end.max(self.position);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.error.is_none()
            && let Err(e) = self.file.flush()
        {
            self.error = Some(e);
        }
        Ok(())
    }
}

impl Seek for Sticky {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let target = match to {
            SeekFrom::Start(p) => p as i64,
            SeekFrom::Current(d) => self.position as i64 + d,
            SeekFrom::End(d) => self.end as i64 + d,
        };
        let target = u64::try_from(target)
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek before 0"))?;
        if self.error.is_none()
            && let Err(e) = self.file.seek(SeekFrom::Start(target))
        {
            self.error = Some(e);
        }
        self.position = target;
        Ok(target)
    }
}

fn add<T: Datum + ndarray_npy::WritableElement>(
    npz: &mut NpzWriter<BufWriter<Sticky>>,
    name: &str,
    tensor: &Tensor,
) -> TractResult<()> {
    let array: ArrayD<T> = tensor.to_plain_array_view::<T>()?.to_owned();
    npz.add_array(name, &array)
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("Writing array {name}"))?;
    Ok(())
}

/// A temporary path next to `path`, for writing it atomically.
fn temporary(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.partial", std::process::id()))
}

/// Writes named tensors to an `.npz` archive, atomically: at `path`, either the whole
/// new archive or what was there before.
pub fn write_arrays<'a>(
    path: impl AsRef<Path>,
    arrays: impl IntoIterator<Item = (String, &'a Tensor)>,
) -> TractResult<()> {
    let path = path.as_ref();
    ensure!(!path.is_dir(), "{} is a directory", path.display());
    let partial = temporary(path);
    let written = write_partial(&partial, arrays).and_then(|_| {
        std::fs::rename(&partial, path)
            .with_context(|| format!("Moving {} to {}", partial.display(), path.display()))
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written.with_context(|| format!("Writing {}", path.display()))?;
    // The rename itself, durable (where the directory can be opened).
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && let Ok(dir) = File::open(dir)
    {
        let _ = dir.sync_all();
    }
    Ok(())
}

fn write_partial<'a>(
    partial: &Path,
    arrays: impl IntoIterator<Item = (String, &'a Tensor)>,
) -> TractResult<()> {
    let file = File::options()
        .write(true)
        .create_new(true)
        .open(partial)
        .with_context(|| format!("Creating {}", partial.display()))?;
    let mut npz = NpzWriter::new(BufWriter::new(Sticky::new(file)));
    let added = arrays
        .into_iter()
        .try_for_each(|(name, tensor)| match tensor.datum_type() {
            DatumType::F16 => add::<f32>(&mut npz, &name, &*tensor.cast_to::<f32>()?),
            DatumType::F32 => add::<f32>(&mut npz, &name, tensor),
            DatumType::F64 => add::<f64>(&mut npz, &name, tensor),
            DatumType::U8 => add::<u8>(&mut npz, &name, tensor),
            DatumType::I8 => add::<i8>(&mut npz, &name, tensor),
            DatumType::I32 => add::<i32>(&mut npz, &name, tensor),
            DatumType::I64 => add::<i64>(&mut npz, &name, tensor),
            DatumType::Bool => add::<bool>(&mut npz, &name, tensor),
            dt => bail!("cannot write a {dt:?} array ({name}) to .npz"),
        });
    // Finished whatever happened: a zip writer dropped unfinished prints to stderr.
    let finished = npz.finish();
    added?;
    let mut writer = finished.map_err(|e| anyhow!("{e}"))?;
    writer.flush()?;
    let file = writer
        .into_inner()
        .map_err(|e| anyhow!("{}", e.error()))?
        .finish()?;
    file.sync_all()?;
    Ok(())
}
