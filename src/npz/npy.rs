//! One `.npy` array: its header read without trusting it, its bytes read without
//! allocating more than they turn out to be.
//!
//! The format (NumPy's `format.py`): the magic `\x93NUMPY`, a version, the header's length
//! (2 bytes in version 1, 4 in 2 and 3), then a Python dict literal,
//! `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 48, 320), }`, then the data.
//! Every number there is the file's claim: the header's length is capped, the shape's
//! element count and byte size are computed with overflow checks and held to the caller's
//! limit before any allocation, and the data is read in chunks, so that a header claiming
//! terabytes over a few bytes of data fails on the data's end, having allocated little.

use std::io::Read;

use tract_core::internal::*;

/// The longest header accepted: NumPy's own are under 200 bytes for any shape a sample
/// has.
const MAX_HEADER: usize = 64 << 10;

/// The most bytes read ahead of the data that has actually arrived.
const CHUNK: usize = 16 << 20;

/// What a header says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub datum_type: DatumType,
    /// Elements stored most significant byte first.
    pub big_endian: bool,
    pub fortran_order: bool,
    pub shape: TVec<usize>,
}

impl Header {
    /// The data's size in bytes, if it fits a `usize`.
    pub fn data_bytes(&self) -> TractResult<usize> {
        self.shape
            .iter()
            .try_fold(self.datum_type.size_of(), |acc, d| acc.checked_mul(*d))
            .with_context(|| format!("shape {:?} is larger than any memory", self.shape))
    }
}

/// The element type of a `descr` (`<f4`, `|u1`, `|b1`), and whether it is big-endian.
fn datum_type(descr: &str) -> TractResult<(DatumType, bool)> {
    // By character: a mutated header's first character may take several bytes.
    let mut chars = descr.chars();
    let big_endian = match chars.next() {
        Some('<' | '|' | '=') => false,
        Some('>') => true,
        _ => bail!("unknown byte order in dtype {descr:?}"),
    };
    let code = chars.as_str();
    let dt = match code {
        "f2" => DatumType::F16,
        "f4" => DatumType::F32,
        "f8" => DatumType::F64,
        "i1" => DatumType::I8,
        "i2" => DatumType::I16,
        "i4" => DatumType::I32,
        "i8" => DatumType::I64,
        "u1" => DatumType::U8,
        "u2" => DatumType::U16,
        "u4" => DatumType::U32,
        "u8" => DatumType::U64,
        "b1" => DatumType::Bool,
        _ => bail!("unsupported dtype {descr:?} (expected a float, integer or bool array)"),
    };
    Ok((dt, big_endian))
}

/// The text after `'key':` in a header dict, trimmed, up to the end of the dict.
fn value_of<'a>(dict: &'a str, key: &str) -> TractResult<&'a str> {
    let at = [format!("'{key}'"), format!("\"{key}\"")]
        .iter()
        .find_map(|k| dict.find(k.as_str()).map(|at| at + k.len()))
        .with_context(|| format!("the header has no {key:?}"))?;
    let rest = dict[at..].trim_start();
    let rest = rest
        .strip_prefix(':')
        .with_context(|| format!("no ':' after {key:?} in the header"))?;
    Ok(rest.trim_start())
}

/// A quoted string at the start of `text`.
fn quoted(text: &str) -> TractResult<&str> {
    let quote = text
        .chars()
        .next()
        .context("an empty value in the header")?;
    ensure!(
        quote == '\'' || quote == '"',
        "expected a string in the header"
    );
    let end = text[1..]
        .find(quote)
        .context("an unterminated string in the header")?;
    Ok(&text[1..1 + end])
}

/// Parses a header dict.
pub fn parse_header(dict: &str) -> TractResult<Header> {
    let descr = value_of(dict, "descr")?;
    ensure!(
        !descr.starts_with('['),
        "a structured array (dtype with fields): a sample is a plain float, integer or bool \
         array"
    );
    let descr = quoted(descr)?;
    let (datum_type, big_endian) = datum_type(descr)?;
    let fortran = value_of(dict, "fortran_order")?;
    let fortran_order = if fortran.starts_with("True") {
        true
    } else if fortran.starts_with("False") {
        false
    } else {
        bail!("fortran_order is neither True nor False")
    };
    let shape = value_of(dict, "shape")?;
    let inner = shape
        .strip_prefix('(')
        .and_then(|s| s.split_once(')'))
        .map(|(inner, _)| inner)
        .context("the shape is not a tuple")?;
    let shape = inner
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| {
            d.trim_end_matches('L')
                .parse::<usize>()
                .with_context(|| format!("{d:?} is not an extent"))
        })
        .collect::<TractResult<TVec<usize>>>()?;
    Ok(Header {
        datum_type,
        big_endian,
        fortran_order,
        shape,
    })
}

/// Reads the header of an array that its container says takes `stored` bytes, header
/// included: a shape needing more data than that is a truncated array.
pub fn read_header_within(reader: &mut impl Read, stored: u64) -> TractResult<Header> {
    let (header, header_bytes) = read_header_sized(reader)?;
    let bytes = header.data_bytes()?;
    let held = stored.saturating_sub(header_bytes as u64);
    ensure!(
        bytes as u64 <= held,
        "a truncated array: its shape {:?} of {:?} needs {bytes} bytes of data, the file holds {held}",
        header.shape,
        header.datum_type
    );
    Ok(header)
}

/// Reads a header (the magic, the version, the dict), with the bytes it took.
fn read_header_sized(reader: &mut impl Read) -> TractResult<(Header, usize)> {
    let mut magic = [0u8; 8];
    reader
        .read_exact(&mut magic)
        .context("too short for an .npy header")?;
    ensure!(
        &magic[..6] == b"\x93NUMPY",
        "not an .npy array (no NUMPY magic)"
    );
    let (len, len_bytes) = match magic[6] {
        1 => {
            let mut len = [0u8; 2];
            reader
                .read_exact(&mut len)
                .context("a truncated .npy header")?;
            (u16::from_le_bytes(len) as usize, 2)
        }
        2 | 3 => {
            let mut len = [0u8; 4];
            reader
                .read_exact(&mut len)
                .context("a truncated .npy header")?;
            (u32::from_le_bytes(len) as usize, 4)
        }
        v => bail!("unsupported .npy version {v}"),
    };
    ensure!(
        len <= MAX_HEADER,
        "an .npy header of {len} bytes (at most {MAX_HEADER} accepted)"
    );
    let mut dict = vec![0u8; len];
    reader
        .read_exact(&mut dict)
        .context("a truncated .npy header")?;
    let dict = String::from_utf8(dict).context("an .npy header that is not text")?;
    Ok((parse_header(&dict)?, magic.len() + len_bytes + len))
}

/// Reads an array whose data may take at most `limit` bytes, as a tensor of its own
/// element type, in C order. `stored` is what its container says the array takes, header
/// included: a shape needing more is a truncated array, refused before reading. The reader
/// must end where the data does; its end is read, so that a checksum a zip entry verifies
/// there is verified.
pub fn read_array(reader: &mut impl Read, limit: u64, stored: u64) -> TractResult<Tensor> {
    let header = read_header_within(reader, stored)?;
    let bytes = header.data_bytes()?;
    ensure!(
        bytes as u64 <= limit,
        "shape {:?} of {:?} needs {bytes} bytes, above the {limit} bytes the memory budget leaves for samples",
        header.shape,
        header.datum_type
    );
    // In chunks: a lying shape fails where the data ends, not in the allocator.
    let mut data: Vec<u8> = vec![];
    while data.len() < bytes {
        let chunk = (bytes - data.len()).min(CHUNK);
        data.try_reserve_exact(chunk)
            .map_err(|_| anyhow!("cannot allocate {chunk} more bytes for the array"))?;
        let read = reader
            .by_ref()
            .take(chunk as u64)
            .read_to_end(&mut data)
            .context("reading the array's data")?;
        ensure!(
            read == chunk,
            "the array's data ends after {} of the {bytes} bytes its shape {:?} needs",
            data.len(),
            header.shape
        );
    }
    // The end: a zip entry's reader checks the entry's CRC-32 there.
    match reader.read(&mut [0u8; 1]) {
        Ok(0) => {}
        Ok(_) => bail!(
            "the array holds more bytes than the {bytes} its shape {:?} needs",
            header.shape
        ),
        Err(e) => return Err(e).context("the array's data is corrupt"),
    }
    let size = header.datum_type.size_of();
    if header.big_endian && size > 1 {
        data.chunks_exact_mut(size).for_each(|e| e.reverse());
    }
    if header.datum_type == DatumType::Bool {
        ensure!(
            data.iter().all(|b| *b <= 1),
            "a bool array holding bytes other than 0 and 1"
        );
    }
    let mut shape = header.shape.clone();
    if header.fortran_order {
        shape.reverse();
    }
    // SAFETY: `data` holds exactly the elements of `shape` in `datum_type` (its length
    // was read to `data_bytes()`), every bit pattern of which is a valid value of that
    // type (bools checked above).
    let mut tensor = unsafe { Tensor::from_raw_dt(header.datum_type, &shape, &data)? };
    if header.fortran_order && shape.len() > 1 {
        let axes: Vec<usize> = (0..shape.len()).rev().collect();
        tensor = tensor.permute_axes(&axes)?;
    }
    Ok(tensor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(dict: &str, data: &[u8]) -> Vec<u8> {
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend((dict.len() as u16).to_le_bytes());
        bytes.extend(dict.as_bytes());
        bytes.extend(data);
        bytes
    }

    #[test]
    fn reads_numpys_headers() {
        let h = parse_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 48, 320), }")
            .unwrap();
        assert_eq!(
            (h.datum_type, h.big_endian, h.fortran_order, &*h.shape),
            (DatumType::F32, false, false, &[3, 48, 320][..])
        );
        let h =
            parse_header("{\"descr\": \">i8\", \"fortran_order\": True, \"shape\": (5,)}").unwrap();
        assert_eq!(
            (h.datum_type, h.big_endian, &*h.shape),
            (DatumType::I64, true, &[5][..])
        );
        let h = parse_header("{'descr': '|b1', 'fortran_order': False, 'shape': (), }").unwrap();
        assert!(h.shape.is_empty());
        for bad in [
            "{'descr': '<c8', 'fortran_order': False, 'shape': (3,), }",
            "{'descr': '<f4', 'shape': (3,), }",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (3, -1), }",
            "{'descr': '<f4', 'fortran_order': False, 'shape': 3, }",
            "{'descr': <f4, 'fortran_order': False, 'shape': (3,), }",
            "{'descr': '\u{653}f4', 'fortran_order': False, 'shape': (3,), }",
            "{'descr': '', 'fortran_order': False, 'shape': (3,), }",
        ] {
            assert!(parse_header(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn arrays_are_read_in_c_order_and_byte_order() {
        let data: Vec<u8> = [1i16, 2, 3, 4, 5, 6]
            .iter()
            .flat_map(|v| v.to_be_bytes())
            .collect();
        let bytes = npy(
            "{'descr': '>i2', 'fortran_order': True, 'shape': (2, 3), }",
            &data,
        );
        let t = read_array(&mut &*bytes, 1 << 20, bytes.len() as u64).unwrap();
        // Fortran order: column by column.
        assert_eq!(
            t,
            Tensor::from_shape(&[2, 3], &[1i16, 3, 5, 2, 4, 6]).unwrap()
        );
    }

    /// A header is a claim: one claiming more than the data holds, or more than the
    /// limit, fails without allocating what it claims.
    #[test]
    fn headers_are_not_trusted() {
        let huge = npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 48, 1000000000000), }",
            &[0; 64],
        );
        // The container's size says it first; where it lies too, the data's end does.
        let e = format!(
            "{:#}",
            read_array(&mut &*huge, u64::MAX, huge.len() as u64).unwrap_err()
        );
        assert!(e.contains("a truncated array"), "{e}");
        let e = format!(
            "{:#}",
            read_array(&mut &*huge, u64::MAX, u64::MAX).unwrap_err()
        );
        assert!(e.contains("ends after"), "{e}");
        let e = format!(
            "{:#}",
            read_array(&mut &*huge, 1 << 30, u64::MAX).unwrap_err()
        );
        assert!(e.contains("memory budget"), "{e}");
        let long_data = npy(
            "{'descr': '|u1', 'fortran_order': False, 'shape': (2,), }",
            &[1, 2, 3],
        );
        let e = format!(
            "{:#}",
            read_array(&mut &*long_data, 1 << 20, u64::MAX).unwrap_err()
        );
        assert!(e.contains("more bytes than"), "{e}");
        let overflow = npy(
            "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
            &[],
        );
        let e = format!(
            "{:#}",
            read_array(&mut &*overflow, u64::MAX, u64::MAX).unwrap_err()
        );
        assert!(e.contains("larger than any memory"), "{e}");
        let bools = npy(
            "{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }",
            &[1, 7],
        );
        assert!(read_array(&mut &*bools, 1 << 20, u64::MAX).is_err());
        let structured = npy(
            "{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, 'shape': (2,), }",
            &[0; 16],
        );
        let e = format!(
            "{:#}",
            read_array(&mut &*structured, 1 << 20, u64::MAX).unwrap_err()
        );
        assert!(e.contains("a structured array"), "{e}");
        let long = b"\x93NUMPY\x02\x00\xff\xff\xff\x7f".to_vec();
        assert!(read_array(&mut &*long, 1 << 20, u64::MAX).is_err());
    }
}
