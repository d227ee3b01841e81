//! PP-OCR around the models: line images in, text out (rec); pages in (det).
//!
//! PP-OCRv4 rec takes RGB lines resized to a height of 48 px, aspect ratio kept, scaled
//! to `(x / 255 - 0.5) / 0.5`, as `[3, 48, W]` samples; it gives per output column the
//! probabilities of 6625 classes, decoded greedily (CTC): argmax per column, repeats
//! merged, blanks (class 0) dropped. The class list is in the model's metadata.

use std::path::Path;

use tract_core::internal::*;

/// An 8-bit RGB(A) PNG as width, height and its RGB bytes.
fn read_rgb(path: &Path) -> TractResult<(usize, usize, Vec<u8>)> {
    let file = std::fs::File::open(path).with_context(|| format!("Opening {}", path.display()))?;
    let mut reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .with_context(|| format!("Reading {} as PNG", path.display()))?;
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf)?;
    let channels = match info.color_type {
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        other => bail!("{}: expected an RGB PNG, found {other:?}", path.display()),
    };
    ensure!(
        info.bit_depth == png::BitDepth::Eight,
        "{}: expected 8 bits per channel",
        path.display()
    );
    let (w, h) = (info.width as usize, info.height as usize);
    let rgb = buf[..w * h * channels]
        .chunks_exact(channels)
        .flat_map(|p| [p[0], p[1], p[2]])
        .collect();
    Ok((w, h, rgb))
}

/// `[3, H, W]` f32 from RGB bytes: channel `c` of the sample takes the image's channel
/// `order[c]`, as `(v / 255 - mean[c]) / std[c]`.
fn normalised(
    w: usize,
    h: usize,
    rgb: &[u8],
    order: [usize; 3],
    mean: [f32; 3],
    std: [f32; 3],
) -> TractResult<Tensor> {
    let mut chw = vec![0f32; 3 * h * w];
    for (c, &from) in order.iter().enumerate() {
        for y in 0..h {
            for x in 0..w {
                let v = rgb[(y * w + x) * 3 + from] as f32;
                chw[(c * h + y) * w + x] = (v / 255.0 - mean[c]) / std[c];
            }
        }
    }
    Tensor::from_shape(&[3, h, w], &chw)
}

/// A PNG line image as a normalised `[3, H, W]` f32 sample (PP-OCR rec's preprocessing).
pub fn load_line(path: impl AsRef<Path>) -> TractResult<Tensor> {
    let (w, h, rgb) = read_rgb(path.as_ref())?;
    normalised(w, h, &rgb, [0, 1, 2], [0.5; 3], [0.5; 3])
}

/// A PNG page as a normalised `[3, H, W]` f32 sample, as PaddleOCR's DBNet preprocessing
/// gives it to PP-OCR det: BGR, ImageNet's mean and deviation (its size left as it is:
/// pages are to be sized in multiples of 32 already).
pub fn load_page(path: impl AsRef<Path>) -> TractResult<Tensor> {
    let (w, h, rgb) = read_rgb(path.as_ref())?;
    normalised(
        w,
        h,
        &rgb,
        [2, 1, 0],
        [0.485, 0.456, 0.406],
        [0.229, 0.224, 0.225],
    )
}

/// Every PNG of a folder, sorted by file name, named by file stem, read by `load`.
fn load_all(
    dir: &Path,
    load: impl Fn(&Path) -> TractResult<Tensor>,
) -> TractResult<Vec<(String, Tensor)>> {
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("Reading the folder {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "png"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| {
            let name = p.file_stem().unwrap_or_default().to_string_lossy();
            Ok((name.into_owned(), load(p)?))
        })
        .collect()
}

/// Every PNG line image of a folder, sorted by file name, named by file stem.
pub fn load_lines(dir: impl AsRef<Path>) -> TractResult<Vec<(String, Tensor)>> {
    load_all(dir.as_ref(), |p| load_line(p))
}

/// Every PNG page of a folder, sorted by file name, named by file stem.
pub fn load_pages(dir: impl AsRef<Path>) -> TractResult<Vec<(String, Tensor)>> {
    load_all(dir.as_ref(), |p| load_page(p))
}

/// The lines listed in a folder's `texts.tsv` (`FILE<TAB>TEXT` per row), with their texts.
pub fn load_labelled_lines(dir: impl AsRef<Path>) -> TractResult<Vec<(Tensor, String)>> {
    let dir = dir.as_ref();
    let tsv = dir.join("texts.tsv");
    let texts =
        std::fs::read_to_string(&tsv).with_context(|| format!("Reading {}", tsv.display()))?;
    texts
        .lines()
        .filter(|l| !l.is_empty())
        .map(|row| {
            let (file, text) = row.split_once('\t').with_context(|| {
                format!("{}: expected FILE<TAB>TEXT, got {row:?}", tsv.display())
            })?;
            Ok((load_line(dir.join(file))?, text.to_string()))
        })
        .collect()
}

/// The CTC classes of a PP-OCR rec model: blank, the model's `character` list, space.
pub fn classes(properties: &HashMap<String, Arc<Tensor>>) -> TractResult<Vec<String>> {
    let chars = properties
        .get("onnx.metadata_props.character")
        .context("the model has no `character` metadata (is it a PP-OCR rec model?)")?;
    let chars = chars.try_as_plain_ram()?.to_scalar::<String>()?.clone();
    let mut classes = vec![String::new()];
    classes.extend(chars.lines().map(|s| s.to_string()));
    classes.push(" ".to_string());
    Ok(classes)
}

/// Greedy CTC decoding of one line's probabilities, `[T, classes]`.
pub fn ctc_greedy(probs: &Tensor, classes: &[String]) -> TractResult<String> {
    let view = probs.to_plain_array_view::<f32>()?;
    ensure!(
        view.ndim() == 2,
        "expected [T, classes] probabilities, got {:?}",
        view.shape()
    );
    let mut text = String::new();
    let mut previous = usize::MAX;
    for column in view.outer_iter() {
        let best = column
            .iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |b, (i, &p)| if p > b.1 { (i, p) } else { b },
            )
            .0;
        if best != previous && best != 0 {
            text.push_str(classes.get(best).map(|s| s.as_str()).unwrap_or("\u{fffd}"));
        }
        previous = best;
    }
    Ok(text)
}
