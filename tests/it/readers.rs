//! The readers against hostile files: every file the CLI reads (`.npz` samples, ONNX
//! models) mutated from valid seeds (`fixtures/fuzz/`) must be read or refused with an
//! error. A panic fails the test; an allocation of what a lying header claims would abort
//! it. The case counts are the fixed budget CI spends on them.

use std::path::{Path, PathBuf};

use crate::common::npz_with_header;
use crate::common::onnx::{Graph, Rng, int, ints};
use proptest::prelude::*;
use tract_ragged::npz;
use tract_ragged::prelude::*;

fn root() -> PathBuf {
    crate::common::root()
}

fn seeds(kind: &str) -> Vec<Vec<u8>> {
    let dir = root().join("fixtures/fuzz").join(kind);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no seed in {}", dir.display());
    files.iter().map(|f| std::fs::read(f).unwrap()).collect()
}

/// The ONNX seeds: a conv, pool and softmax model, and one with an int64 initializer and
/// a reshape, as the tests' graph builder writes them.
fn onnx_seeds() -> Vec<(String, tract_onnx::pb::ModelProto)> {
    let mut rng = Rng(5);
    let mut g = Graph::default();
    let w = g.weight(&[2, 2, 1, 3], rng.vec(12, 0.5));
    let y = g.op(
        "Conv",
        &["x", &w],
        vec![ints("kernel_shape", &[1, 3]), ints("pads", &[0, 1, 0, 1])],
    );
    let y = g.op(
        "MaxPool",
        &[&y],
        vec![ints("kernel_shape", &[1, 2]), ints("strides", &[1, 2])],
    );
    let y = g.op("Softmax", &[&y], vec![int("axis", 3)]);
    let conv = g.model("x", 4, &[&y]);
    let mut g = Graph::default();
    let shape = g.ints_const(&[0, -1]);
    let y = g.op("Reshape", &["x", &shape], vec![]);
    let y = g.op("Relu", &[&y], vec![]);
    let reshape = g.model("x", 4, &[&y]);
    vec![("conv".into(), conv), ("reshape".into(), reshape)]
}

/// A change to a file's bytes.
#[derive(Clone, Debug)]
enum Mutation {
    /// The byte at (position modulo the length) replaced.
    Set(usize, u8),
    /// Cut at (position modulo the length).
    Truncate(usize),
    /// Bytes inserted.
    Insert(usize, Vec<u8>),
    /// A decimal number written over the bytes there: a size, an extent, a dim.
    Number(usize, u64),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), any::<u8>()).prop_map(|(p, b)| Mutation::Set(p, b)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        1 => (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(p, b)| Mutation::Insert(p, b)),
        2 => (any::<usize>(), prop_oneof![Just(0u64), Just(1 << 40), Just(u64::MAX), any::<u64>()])
            .prop_map(|(p, n)| Mutation::Number(p, n)),
    ]
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        if bytes.is_empty() {
            break;
        }
        let len = bytes.len();
        match m {
            Mutation::Set(p, b) => bytes[p % len] = *b,
            Mutation::Truncate(p) => bytes.truncate(p % len),
            Mutation::Insert(p, b) => {
                let at = p % len;
                bytes.splice(at..at, b.iter().copied());
            }
            Mutation::Number(p, n) => {
                let at = p % len;
                let digits = n.to_string().into_bytes();
                let end = (at + digits.len()).min(len);
                bytes[at..end].copy_from_slice(&digits[..end - at]);
            }
        }
    }
    bytes
}

/// Where the mutated file is written: a directory of its own per test thread.
fn scratch(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// The npz reader on a mutated archive: read or refused, with at most 64 MiB of data.
fn read_npz(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let path = scratch(dir.path(), "in.npz", bytes);
    match npz::read_samples(&path, 64 << 20) {
        Ok(arrays) => {
            let bytes: usize = arrays
                .iter()
                .map(|(_, t)| t.len() * t.datum_type().size_of())
                .sum();
            assert!(bytes <= 64 << 20);
        }
        Err(e) => assert!(!format!("{e:#}").is_empty()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, .. ProptestConfig::default() })]

    #[test]
    fn npz_reader_reads_or_refuses_any_mutation(
        seed in 0usize..3,
        mutations in proptest::collection::vec(mutation(), 1..6),
    ) {
        let seeds = seeds("npz");
        read_npz(&mutate(seeds[seed % seeds.len()].clone(), &mutations));
    }
}

/// The ONNX loader on a mutated model: typed or refused.
fn read_onnx(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let path = scratch(dir.path(), "model.onnx", bytes);
    if let Ok(onnx) = tract_ragged::load::read_onnx(&path, Some("N,2,1,W,f32")) {
        let _ = tract_ragged::load::ragged_model(onnx, RaggedSpec::new(0, 3));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, .. ProptestConfig::default() })]

    #[test]
    fn onnx_loader_reads_or_refuses_any_mutation(
        seed in 0usize..2,
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        let seeds = seeds("onnx");
        read_onnx(&mutate(seeds[seed % seeds.len()].clone(), &mutations));
    }
}

/// The committed ONNX seeds are what the graph builder writes: the corpus stays in step
/// with the models the tests build.
#[test]
fn onnx_seeds_are_current() {
    use prost::Message;
    let dir = root().join("fixtures/fuzz/onnx");
    for (name, proto) in onnx_seeds() {
        let path = dir.join(format!("{name}.onnx"));
        let bytes = proto.encode_to_vec();
        if std::env::var_os("WRITE_FUZZ_SEEDS").is_some() {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        }
        let committed = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (WRITE_FUZZ_SEEDS=1 writes it)", path.display()));
        assert_eq!(
            committed,
            bytes,
            "{} differs from the builder's",
            path.display()
        );
        read_onnx(&bytes);
    }
}

/// An `.npy` file of `shape` in `descr`, its data `data`.
fn npy(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims: String = shape.iter().map(|d| format!("{d}, ")).collect();
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({dims}), }}");
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend((dict.len() as u16).to_le_bytes());
    bytes.extend(dict.as_bytes());
    bytes.extend(data);
    bytes
}

/// One entry of an archive written by [`zip_of`].
struct ZipEntry {
    name: String,
    /// The entry's content, uncompressed.
    content: Vec<u8>,
    deflated: bool,
    /// The uncompressed size the headers declare, where it is not the content's.
    declared: Option<u32>,
}

impl ZipEntry {
    fn new(name: &str, content: Vec<u8>, deflated: bool) -> ZipEntry {
        ZipEntry {
            name: name.to_string(),
            content,
            deflated,
            declared: None,
        }
    }
}

/// A zip archive as the headers say, written by hand: the zip crate refuses to write two
/// entries of one name, or sizes that lie. Returns the archive and where each entry's
/// (compressed) data lies in it.
fn zip_of(entries: &[ZipEntry]) -> (Vec<u8>, Vec<std::ops::Range<usize>>) {
    use std::io::Write;
    let (mut bytes, mut directory, mut ranges) = (vec![], vec![], vec![]);
    for e in entries {
        let data = if e.deflated {
            let mut z = flate2::write::DeflateEncoder::new(vec![], flate2::Compression::fast());
            z.write_all(&e.content).unwrap();
            z.finish().unwrap()
        } else {
            e.content.clone()
        };
        let crc = crc32fast::hash(&e.content);
        let size = e.declared.unwrap_or(e.content.len() as u32);
        // The fields the local header and the directory share, from "version needed" to
        // the name's length.
        let mut common = vec![];
        common.extend(20u16.to_le_bytes());
        common.extend(0u16.to_le_bytes());
        common.extend((if e.deflated { 8u16 } else { 0 }).to_le_bytes());
        common.extend(0u16.to_le_bytes());
        common.extend(0x21u16.to_le_bytes());
        common.extend(crc.to_le_bytes());
        common.extend((data.len() as u32).to_le_bytes());
        common.extend(size.to_le_bytes());
        common.extend((e.name.len() as u16).to_le_bytes());
        common.extend(0u16.to_le_bytes());
        let offset = bytes.len() as u32;
        bytes.extend(0x0403_4b50u32.to_le_bytes());
        bytes.extend(&common);
        bytes.extend(e.name.as_bytes());
        ranges.push(bytes.len()..bytes.len() + data.len());
        bytes.extend(&data);
        directory.extend(0x0201_4b50u32.to_le_bytes());
        directory.extend(20u16.to_le_bytes());
        directory.extend(&common);
        // The comment's length, the first disk, the internal and external attributes.
        directory.extend([0u8; 10]);
        directory.extend(offset.to_le_bytes());
        directory.extend(e.name.as_bytes());
    }
    let start = bytes.len() as u32;
    bytes.extend(&directory);
    bytes.extend(0x0605_4b50u32.to_le_bytes());
    bytes.extend([0u8; 4]);
    bytes.extend((entries.len() as u16).to_le_bytes());
    bytes.extend((entries.len() as u16).to_le_bytes());
    bytes.extend((directory.len() as u32).to_le_bytes());
    bytes.extend(start.to_le_bytes());
    bytes.extend(0u16.to_le_bytes());
    (bytes, ranges)
}

/// Arrays of random shapes and element types, stored or deflated.
/// Each as its entry's name, its `.npy` bytes and whether it is deflated.
fn arrays() -> impl Strategy<Value = Vec<(String, Vec<u8>, bool)>> {
    let array = (
        prop_oneof![Just("|u1"), Just("<f4"), Just("<i8")],
        proptest::collection::vec(1usize..9, 0..3),
        any::<u64>(),
        any::<bool>(),
    )
        .prop_map(|(descr, shape, seed, deflated)| {
            let size = match descr {
                "|u1" => 1,
                "<f4" => 4,
                _ => 8,
            };
            let n = shape.iter().product::<usize>() * size;
            let data: Vec<u8> = (0..n as u64)
                .map(|i| (seed.wrapping_mul(i + 1) >> 13) as u8 % 7)
                .collect();
            (descr.to_string(), shape, data, deflated)
        });
    proptest::collection::vec(array, 1..4).prop_map(|arrays| {
        arrays
            .into_iter()
            .enumerate()
            .map(|(i, (descr, shape, data, deflated))| {
                (format!("s{i}.npy"), npy(&descr, &shape, &data), deflated)
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, .. ProptestConfig::default() })]

    /// A byte of an array's stored or compressed data changed: refused (its CRC-32 or its
    /// inflating fails), or, deflated, read as it was (bits the inflater never reads).
    #[test]
    fn npz_a_changed_byte_of_an_array_is_refused(
        arrays in arrays(),
        which in any::<usize>(),
        at in any::<usize>(),
        flip in 1u8..,
    ) {
        let entries: Vec<ZipEntry> = arrays
            .iter()
            .map(|(name, npy, deflated)| ZipEntry::new(name, npy.clone(), *deflated))
            .collect();
        let (mut bytes, ranges) = zip_of(&entries);
        let dir = tempfile::tempdir().unwrap();
        let intact = npz::read_samples(scratch(dir.path(), "intact.npz", &bytes), u64::MAX)
            .unwrap();
        prop_assert_eq!(intact.len(), arrays.len());
        let which = which % ranges.len();
        let range = ranges[which].clone();
        bytes[range.start + at % range.len()] ^= flip;
        match npz::read_samples(scratch(dir.path(), "changed.npz", &bytes), u64::MAX) {
            Err(e) => {
                let e = format!("{e:#}");
                prop_assert!(e.contains(&format!("\"s{which}\"")), "{e}");
            }
            Ok(read) => {
                prop_assert!(arrays[which].2, "a stored array changed and read: {read:?}");
                prop_assert_eq!(read, intact);
            }
        }
    }

    /// Entries whose names NumPy would load as one array (`a.npy` and `a`, or `a.npy`
    /// twice): refused, naming it; otherwise every array read, in order.
    #[test]
    fn npz_names_numpy_would_merge_are_refused(
        names in proptest::collection::vec(
            prop_oneof![Just("a"), Just("a.npy"), Just("b.npy"), Just("a.npy.npy"), Just("b")],
            1..5,
        ),
    ) {
        let entries: Vec<ZipEntry> = names
            .iter()
            .map(|n| ZipEntry::new(n, npy("|u1", &[2], &[1, 2]), false))
            .collect();
        let (bytes, _) = zip_of(&entries);
        let dir = tempfile::tempdir().unwrap();
        let read = npz::read_samples(scratch(dir.path(), "names.npz", &bytes), u64::MAX);
        let keys: Vec<&str> = names.iter().map(|n| n.strip_suffix(".npy").unwrap_or(n)).collect();
        let merged = (0..keys.len()).find(|&i| keys[..i].contains(&keys[i]));
        match (merged, read) {
            (Some(i), Err(e)) => {
                let e = format!("{e:#}");
                prop_assert!(e.contains(&format!("two arrays named {:?}", keys[i])), "{e}");
            }
            (None, Ok(read)) => {
                let read: Vec<&str> = read.iter().map(|(n, _)| n.as_str()).collect();
                prop_assert_eq!(read, keys);
            }
            (merged, read) => prop_assert!(false, "{names:?}: merged {merged:?}, read {read:?}"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, .. ProptestConfig::default() })]

    /// An entry that inflates beyond the budget, whether its header says so (its shape) or
    /// hides it (a small shape over much more data; the zip headers' size truthful or
    /// not): refused, naming it. (The reader checks a shape against the budget before
    /// reading its data, and reads one byte past a shape's data to refuse more.)
    #[test]
    fn npz_deflate_bombs_are_refused_before_inflating(
        mib in 2usize..=16,
        shape_lies in any::<bool>(),
        size_lies in any::<bool>(),
    ) {
        let budget = 1u64 << 20;
        let zeros = vec![0u8; mib << 20];
        let content = if shape_lies { npy("|u1", &[1000], &zeros) } else { npy("|u1", &[zeros.len()], &zeros) };
        let mut entry = ZipEntry::new("s0.npy", content, true);
        if size_lies {
            entry.declared = Some(1100);
        }
        let (bytes, _) = zip_of(&[entry]);
        prop_assert!(bytes.len() < (mib << 20) / 100, "{} bytes", bytes.len());
        let dir = tempfile::tempdir().unwrap();
        let e = npz::read_samples(scratch(dir.path(), "bomb.npz", &bytes), budget).unwrap_err();
        let e = format!("{e:#}");
        prop_assert!(e.contains("\"s0\""), "{e}");
    }
}

/// A header claiming what the data does not hold, in a file of a kilobyte: refused, not
/// allocated (a 576 TB claim, a 57.6 GB one).
#[test]
fn npz_headers_claiming_terabytes_are_refused() {
    for shape in ["(3, 48, 1000000000000)", "(3, 48, 100000000)"] {
        let bytes = npz_with_header(&format!(
            "{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}"
        ));
        assert!(bytes.len() < 2048);
        let dir = tempfile::tempdir().unwrap();
        let path = scratch(dir.path(), "claim.npz", &bytes);
        let e = format!("{:#}", npz::read_samples(&path, u64::MAX).unwrap_err());
        assert!(e.contains("s0"), "{e}");
    }
}

/// Two entries that np.load would give one name (`a` and `a.npy`): refused, naming it.
#[test]
fn npz_duplicate_names_are_refused() {
    let a = npy("<f4", &[2], &[0; 8]);
    let (bytes, _) = zip_of(&[
        ZipEntry::new("a", a.clone(), false),
        ZipEntry::new("a.npy", a, false),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let path = scratch(dir.path(), "dup.npz", &bytes);
    let e = format!("{:#}", npz::read_samples(&path, u64::MAX).unwrap_err());
    assert!(e.contains("two arrays named \"a\""), "{e}");
}

/// Two entries both named `a.npy` (zip allows it; the zip crate keeps the later): refused,
/// naming it.
#[test]
fn npz_entries_of_one_name_are_refused() {
    let a = Tensor::zero::<f32>(&[2]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dup.npz");
    npz::write_arrays(&path, [("a".to_string(), &a), ("b".to_string(), &a)]).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let mut renamed = 0;
    for at in 0..bytes.len() - 5 {
        if &bytes[at..at + 5] == b"b.npy" {
            bytes[at] = b'a';
            renamed += 1;
        }
    }
    assert_eq!(renamed, 2, "b.npy in the local header and the directory");
    std::fs::write(&path, &bytes).unwrap();
    let e = format!("{:#}", npz::read_samples(&path, u64::MAX).unwrap_err());
    assert!(e.contains("two arrays named \"a\""), "{e}");
}

/// One flipped byte of an array's data: its CRC-32 no longer matches, refused.
#[test]
fn npz_data_not_matching_its_checksum_is_refused() {
    let a = Tensor::from_shape(&[64], &[0x5au8; 64]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flipped.npz");
    npz::write_arrays(&path, [("a".to_string(), &a)]).unwrap();
    assert_eq!(npz::read_samples(&path, u64::MAX).unwrap()[0].1, a);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.windows(64).position(|w| w == [0x5au8; 64]).unwrap();
    bytes[at + 10] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let e = format!("{:#}", npz::read_samples(&path, u64::MAX).unwrap_err());
    assert!(e.contains("corrupt") && e.contains("\"a\""), "{e}");
}

/// An array whose shape needs more than its entry holds is said to be truncated, not to
/// be above the memory budget.
#[test]
fn npz_truncated_arrays_are_said_truncated() {
    let bytes =
        npz_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 48, 100), }");
    let dir = tempfile::tempdir().unwrap();
    let path = scratch(dir.path(), "cut.npz", &bytes);
    for limit in [u64::MAX, 100] {
        let e = format!("{:#}", npz::read_samples(&path, limit).unwrap_err());
        assert!(
            e.contains("a truncated array") && e.contains("57600"),
            "{e}"
        );
    }
}

/// A write that fails leaves the previous archive as it was, and nothing beside it.
#[test]
fn a_failed_write_keeps_the_previous_archive() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.npz");
    let old = Tensor::from_shape(&[3], &[1f32, 2., 3.]).unwrap();
    npz::write_arrays(&path, [("old".to_string(), &old)]).unwrap();
    let before = std::fs::read(&path).unwrap();
    let good = Tensor::zero::<f32>(&[1000]).unwrap();
    let unwritable = tensor1(&[TDim::from(1)]);
    let failed = npz::write_arrays(
        &path,
        [
            ("good".to_string(), &good),
            ("bad".to_string(), &unwritable),
        ],
    );
    assert!(failed.is_err());
    assert_eq!(std::fs::read(&path).unwrap(), before);
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "{left:?}");
}
