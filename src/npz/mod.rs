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
//!
//! Both go one array at a time ([`NpzReader`], [`NpzSink`]), so that a run over a large
//! archive holds only the samples and outputs it is working on.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use ndarray_npy::NpzWriter;
use tract_core::internal::*;
use tract_core::ndarray::ArrayD;

pub mod npy;

/// One array of an archive, as its header describes it.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The array's name, without the `.npy` suffix.
    pub name: String,
    /// The entry's index in the zip archive (directories included).
    index: usize,
    /// Its (uncompressed) size, as the archive declares it.
    declared: u64,
    /// Its header, or why it could not be read.
    header: Result<npy::Header, String>,
}

impl Entry {
    /// What the array's header says, or why it could not be read.
    pub fn header(&self) -> TractResult<&npy::Header> {
        self.header
            .as_ref()
            .map_err(|e| anyhow!("array {:?}: {e}", self.name))
    }
}

/// An `.npz` archive read one array at a time: [`NpzReader::open`] reads every array's
/// header (names, shapes, element types), [`NpzReader::read`] one array's data when it is
/// needed, so that a run over a large archive holds only the samples it is working on.
pub struct NpzReader {
    path: PathBuf,
    archive: zip::ZipArchive<BufReader<File>>,
    entries: Vec<Entry>,
}

impl NpzReader {
    /// Opens an archive and reads its arrays' headers. A header that cannot be read is
    /// that array's error ([`Entry::header`], [`NpzReader::read`]), not the archive's.
    pub fn open(path: impl AsRef<Path>) -> TractResult<NpzReader> {
        let path = path.as_ref();
        ensure!(
            !path.is_dir(),
            "{} is a directory, not an .npz archive",
            path.display()
        );
        let file = File::open(path).with_context(|| format!("Opening {}", path.display()))?;
        let mut archive = zip::ZipArchive::new(BufReader::new(file))
            .map_err(|e| anyhow!("{e}"))
            .with_context(|| format!("Reading {} as an .npz archive", path.display()))?;
        let mut directory = BufReader::new(
            File::open(path).with_context(|| format!("Opening {}", path.display()))?,
        );
        let mut listed = std::collections::HashSet::new();
        for raw in central_names(&mut directory, archive.central_directory_start())
            .with_context(|| format!("Reading the directory of {}", path.display()))?
        {
            let name = String::from_utf8_lossy(&raw);
            let name = array_name(&name);
            ensure!(
                listed.insert(name.to_string()),
                "{} holds two arrays named {name:?}",
                path.display()
            );
        }
        let mut entries: Vec<Entry> = Vec::with_capacity(archive.len().min(1 << 16));
        let mut names = std::collections::HashSet::new();
        for index in 0..archive.len() {
            let mut entry = archive
                .by_index(index)
                .map_err(|e| anyhow!("{e}"))
                .with_context(|| format!("Reading entry {index} of {}", path.display()))?;
            if entry.is_dir() {
                continue;
            }
            let name = array_name(entry.name()).to_string();
            ensure!(
                names.insert(name.clone()),
                "{} holds two arrays named {name:?}",
                path.display()
            );
            let declared = entry.size();
            let header =
                npy::read_header_within(&mut entry, declared).map_err(|e| format!("{e:#}"));
            entries.push(Entry {
                name,
                index,
                declared,
                header,
            });
        }
        Ok(NpzReader {
            path: path.to_path_buf(),
            archive,
            entries,
        })
    }

    /// The archive's arrays, in archive order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Keeps the arrays for which `keep` holds, in archive order.
    pub fn retain(&mut self, keep: impl FnMut(&Entry) -> bool) {
        self.entries.retain(keep);
    }

    /// The data of array `ix` (in [`NpzReader::entries`]' order), if it takes at most
    /// `limit` bytes.
    pub fn read(&mut self, ix: usize, limit: u64) -> TractResult<Tensor> {
        let entry = self
            .entries
            .get(ix)
            .with_context(|| format!("{} has no array {ix}", self.path.display()))?;
        let what = || format!("Reading array {:?} of {}", entry.name, self.path.display());
        entry.header().with_context(what)?;
        let mut file = self
            .archive
            .by_index(entry.index)
            .map_err(|e| anyhow!("{e}"))
            .with_context(what)?;
        npy::read_array(&mut file, limit, entry.declared).with_context(what)
    }
}

/// The name NumPy's `np.load` gives the array of entry `entry`: without one `.npy` suffix.
fn array_name(entry: &str) -> &str {
    entry.strip_suffix(".npy").unwrap_or(entry)
}

/// The name of every entry of a zip archive's central directory (which starts at `start`),
/// in order: the zip crate keys entries by name, so that two of one name would come out of
/// it as one, the later.
fn central_names(file: &mut (impl Read + Seek), start: u64) -> std::io::Result<Vec<Vec<u8>>> {
    const SIGNATURE: [u8; 4] = 0x0201_4b50u32.to_le_bytes();
    file.seek(SeekFrom::Start(start))?;
    let mut names = vec![];
    // Each header takes at least its 46 fixed bytes: the walk ends with the file.
    let mut fixed = [0u8; 46];
    while file.read_exact(&mut fixed).is_ok() && fixed[..4] == SIGNATURE {
        let field = |at: usize| u16::from_le_bytes([fixed[at], fixed[at + 1]]);
        let (name, extra, comment) = (field(28), field(30), field(32));
        let mut raw = vec![0u8; name as usize];
        file.read_exact(&mut raw)?;
        file.seek(SeekFrom::Current(i64::from(extra) + i64::from(comment)))?;
        names.push(raw);
    }
    Ok(names)
}

/// Reads every array of an `.npz` archive, in archive order, with its name (without the
/// `.npy` suffix), their data taking at most `limit` bytes in all.
pub fn read_samples(path: impl AsRef<Path>, limit: u64) -> TractResult<Vec<(String, Tensor)>> {
    let mut reader = NpzReader::open(path)?;
    let mut left = limit;
    (0..reader.entries().len())
        .map(|ix| {
            let tensor = reader.read(ix, left)?;
            left -= (tensor.len() * tensor.datum_type().size_of()) as u64;
            Ok((reader.entries()[ix].name.clone(), tensor))
        })
        .collect()
}

/// A file that remembers its first write error instead of returning it: the zip writer
/// over it then never fails half-way, so it never reports a failure from its `Drop` (zip
/// prints those to stderr). The error is shared with the [`NpzSink`], which stops at the
/// next array, and comes back from [`Sticky::finish`].
struct Sticky {
    file: File,
    /// Where the zip writer believes it is, kept after an error.
    position: u64,
    end: u64,
    error: Arc<std::sync::Mutex<Option<std::io::Error>>>,
}

impl Sticky {
    fn new(file: File) -> Sticky {
        Sticky {
            file,
            position: 0,
            end: 0,
            error: Arc::default(),
        }
    }

    fn failed(&self) -> bool {
        self.error.lock().map(|e| e.is_some()).unwrap_or(true)
    }

    fn fail(&mut self, e: std::io::Error) {
        if let Ok(mut error) = self.error.lock() {
            error.get_or_insert(e);
        }
    }

    fn finish(self) -> std::io::Result<File> {
        match self.error.lock().ok().and_then(|mut e| e.take()) {
            Some(e) => Err(e),
            None => Ok(self.file),
        }
    }
}

impl Write for Sticky {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !self.failed()
            && let Err(e) = self.file.write_all(buf)
        {
            self.fail(e);
        }
        self.position += buf.len() as u64;
        self.end = self.end.max(self.position);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.failed()
            && let Err(e) = self.file.flush()
        {
            self.fail(e);
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
        if !self.failed()
            && let Err(e) = self.file.seek(SeekFrom::Start(target))
        {
            self.fail(e);
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

/// Removes the temporary files that writers of `path` killed before they finished left
/// beside it (`.NAME.PID.partial`, [`temporary`]), those of processes no longer alive. On
/// Linux, where `/proc` says which are; elsewhere nothing is removed.
fn remove_stale_partials(path: &Path) {
    if !cfg!(target_os = "linux") || !Path::new("/proc/self").exists() {
        return;
    }
    let Some(name) = path.file_name().map(|n| n.to_string_lossy().to_string()) else {
        return;
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let prefix = format!(".{name}.");
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().to_string();
        let pid = file
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix(".partial"))
            .and_then(|pid| pid.parse::<u32>().ok());
        if let Some(pid) = pid
            && pid != std::process::id()
            && !Path::new("/proc").join(pid.to_string()).exists()
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Writes `bytes` to `path` atomically, as [`NpzSink`] writes an archive: a temporary file
/// next to it, synced, renamed over it (a failure or a kill leaves `path` as it was).
pub fn write_atomically(path: impl AsRef<Path>, bytes: &[u8]) -> TractResult<()> {
    let path = path.as_ref();
    ensure!(!path.is_dir(), "{} is a directory", path.display());
    let partial = temporary(path);
    let written = (|| -> std::io::Result<()> {
        let mut file = File::options()
            .write(true)
            .create_new(true)
            .open(&partial)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&partial, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written.with_context(|| format!("Writing {}", path.display()))
}

/// An `.npz` archive written array by array, atomically: the arrays go to a temporary
/// file next to the destination, which [`NpzSink::commit`] syncs and renames over it. A
/// sink dropped without committing (an error, a panic) removes its temporary file, and a
/// process killed while writing leaves the destination as it was.
pub struct NpzSink {
    path: PathBuf,
    partial: PathBuf,
    npz: Option<NpzWriter<BufWriter<Sticky>>>,
    /// The first write error of the file under `npz`.
    error: Arc<std::sync::Mutex<Option<std::io::Error>>>,
}

impl NpzSink {
    /// Starts writing an archive to `path`.
    pub fn create(path: impl AsRef<Path>) -> TractResult<NpzSink> {
        let path = path.as_ref();
        ensure!(!path.is_dir(), "{} is a directory", path.display());
        // The archive replaces `path` by a rename: only ever a regular file. A device or a
        // pipe (`--out /dev/null`) would be replaced by a file, as root the system's own.
        if let Ok(meta) = std::fs::metadata(path) {
            ensure!(
                meta.is_file(),
                "{} is not a regular file ({}): refusing to replace it by an archive",
                path.display(),
                kind_of(&meta)
            );
        }
        remove_stale_partials(path);
        let partial = temporary(path);
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(&partial)
            .with_context(|| format!("Creating {}", partial.display()))
            .with_context(|| format!("Writing {}", path.display()))?;
        let sticky = Sticky::new(file);
        let error = sticky.error.clone();
        Ok(NpzSink {
            path: path.to_path_buf(),
            partial,
            npz: Some(NpzWriter::new(BufWriter::new(sticky))),
            error,
        })
    }

    /// The temporary file the archive is written to until [`NpzSink::commit`].
    pub fn partial(&self) -> &Path {
        &self.partial
    }

    /// The temporary file [`NpzSink::create`] makes for `path`, in this process: for a
    /// process that wants it removed where it is killed by a signal (the CLI does), which
    /// must arrange it before `create`, or a signal in between leaves the file.
    pub fn partial_for(path: impl AsRef<Path>) -> PathBuf {
        temporary(path.as_ref())
    }

    /// Adds an array named `name`.
    pub fn add(&mut self, name: &str, tensor: &Tensor) -> TractResult<()> {
        // A full disk stops the run at the next array, not after all of them.
        if let Some(e) = self.error.lock().ok().as_ref().and_then(|e| e.as_ref()) {
            bail!("Writing {}: {e}", self.path.display());
        }
        let npz = self
            .npz
            .as_mut()
            .context("the archive is already finished")?;
        match tensor.datum_type() {
            DatumType::F16 => add::<f32>(npz, name, &*tensor.cast_to::<f32>()?),
            DatumType::F32 => add::<f32>(npz, name, tensor),
            DatumType::F64 => add::<f64>(npz, name, tensor),
            DatumType::U8 => add::<u8>(npz, name, tensor),
            DatumType::I8 => add::<i8>(npz, name, tensor),
            DatumType::I32 => add::<i32>(npz, name, tensor),
            DatumType::I64 => add::<i64>(npz, name, tensor),
            DatumType::Bool => add::<bool>(npz, name, tensor),
            dt => bail!("cannot write a {dt:?} array ({name}) to .npz"),
        }
        .with_context(|| format!("Writing {}", self.path.display()))
    }

    /// Finishes the archive and puts it at its destination.
    pub fn commit(mut self) -> TractResult<()> {
        let npz = self.npz.take().context("the archive is already finished")?;
        let written = finish(npz).and_then(|_| {
            std::fs::rename(&self.partial, &self.path).with_context(|| {
                format!(
                    "Moving {} to {}",
                    self.partial.display(),
                    self.path.display()
                )
            })
        });
        if written.is_err() {
            let _ = std::fs::remove_file(&self.partial);
        }
        written.with_context(|| format!("Writing {}", self.path.display()))?;
        // The rename itself, durable (where the directory can be opened).
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty())
            && let Ok(dir) = File::open(dir)
        {
            let _ = dir.sync_all();
        }
        Ok(())
    }
}

/// What a file that is not a regular one is, for an error.
fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let kind = meta.file_type();
        if kind.is_char_device() {
            return "a character device";
        }
        if kind.is_block_device() {
            return "a block device";
        }
        if kind.is_fifo() {
            return "a named pipe";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    let _ = meta;
    "not a regular file"
}

impl Drop for NpzSink {
    fn drop(&mut self) {
        if let Some(npz) = self.npz.take() {
            // Finished all the same: a zip writer dropped unfinished prints to stderr.
            let _ = npz.finish();
            let _ = std::fs::remove_file(&self.partial);
        }
    }
}

/// Ends an archive: its central directory, flushed and synced to the disk.
fn finish(npz: NpzWriter<BufWriter<Sticky>>) -> TractResult<()> {
    let mut writer = npz.finish().map_err(|e| anyhow!("{e}"))?;
    writer.flush()?;
    let file = writer
        .into_inner()
        .map_err(|e| anyhow!("{}", e.error()))?
        .finish()?;
    file.sync_all()?;
    Ok(())
}

/// Writes named tensors to an `.npz` archive, atomically: at `path`, either the whole
/// new archive or what was there before.
pub fn write_arrays<'a>(
    path: impl AsRef<Path>,
    arrays: impl IntoIterator<Item = (String, &'a Tensor)>,
) -> TractResult<()> {
    let mut sink = NpzSink::create(path)?;
    for (name, tensor) in arrays {
        sink.add(&name, tensor)?;
    }
    sink.commit()
}
