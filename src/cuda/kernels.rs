//! Our kernels: CUDA sources in `kernels/`, compiled by NVRTC at first use, their cubins
//! cached on disk so that the next process starts without compiling.
//!
//! The cache key names everything that shapes a cubin: the source (hashed, with the
//! shared header), the NVRTC version and the device architecture. The cache lives beside
//! tract-cuda's: `$XDG_CACHE_HOME/tract-ragged/<version>/sm_XY/nvrtc-A.B/`.
//! The sources use no CUDA header, so a machine with the driver and NVRTC but no toolkit
//! compiles them.
//!
//! Besides the files, kernels generated at plan time (fused element-wise chains,
//! [`super::fuse`]) go through the same compiler and cache, keyed by their source: they
//! are compiled with `--fmad=false`, as each link must round as the lone op it replaces.

use std::collections::HashMap;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{Ptx, result as nvrtc, sys as nvrtc_sys};
use tract_core::internal::*;

const COMMON: &str = include_str!("../../kernels/common.cuh");

/// One `.cu` file of `kernels/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Library {
    Mask,
    Softmax,
    Pool,
    Deconv,
    Depthwise,
}

impl Library {
    fn file(&self) -> (&'static str, &'static str) {
        match self {
            Library::Mask => ("mask", include_str!("../../kernels/mask.cu")),
            Library::Softmax => ("softmax", include_str!("../../kernels/softmax.cu")),
            Library::Pool => ("pool", include_str!("../../kernels/pool.cu")),
            Library::Deconv => ("deconv", include_str!("../../kernels/deconv.cu")),
            Library::Depthwise => ("depthwise", include_str!("../../kernels/depthwise.cu")),
        }
    }

    /// The source NVRTC compiles: the shared header inlined in place of its include.
    fn source(&self) -> String {
        self.file().1.replace("#include \"common.cuh\"", COMMON)
    }
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100000001b3)
    })
}

fn cache_dir(arch: &str, nvrtc_version: (i32, i32)) -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    base.join("tract-ragged")
        .join(env!("CARGO_PKG_VERSION"))
        .join(arch)
        .join(format!("nvrtc-{}.{}", nvrtc_version.0, nvrtc_version.1))
}

fn nvrtc_version() -> TractResult<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }.result()?;
    Ok((major, minor))
}

/// A module of ours: a file of `kernels/`, or a source generated at plan time.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Module {
    File(Library),
    Generated(Arc<str>),
}

impl Module {
    fn name(&self) -> String {
        match self {
            Module::File(lib) => format!("kernels/{}.cu", lib.file().0),
            Module::Generated(source) => format!("generated_{:016x}", fnv1a64(source.as_bytes())),
        }
    }

    fn source(&self) -> String {
        match self {
            Module::File(lib) => lib.source(),
            Module::Generated(source) => source.to_string(),
        }
    }

    fn options(&self) -> &'static [&'static str] {
        match self {
            Module::File(_) => &[],
            Module::Generated(_) => &["--fmad=false"],
        }
    }
}

/// Compiles `source` to a cubin for `arch` (`sm_90`).
fn compile(name: &str, source: &str, arch: &str, extra: &[&str]) -> TractResult<Vec<u8>> {
    let src = CString::new(source).context("kernel source holds a NUL byte")?;
    let prog = nvrtc::create_program(&src, None)?;
    let mut opts = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
    ];
    opts.extend(extra.iter().map(|o| o.to_string()));
    let compiled = unsafe { nvrtc::compile_program(prog, &opts) };
    let result = match compiled {
        Ok(()) => unsafe {
            let mut size = 0usize;
            nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size).result()?;
            let mut cubin = vec![0u8; size];
            nvrtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut _).result()?;
            Ok(cubin)
        },
        Err(e) => {
            let log = unsafe { nvrtc::get_program_log(prog) }
                .map(|l| l.iter().map(|c| *c as u8 as char).collect::<String>())
                .unwrap_or_default();
            Err(anyhow!("NVRTC failed to compile {name} ({e:?}): {log}"))
        }
    };
    unsafe { nvrtc::destroy_program(prog) }?;
    result
}

fn write_atomically(path: &Path, bytes: &[u8]) -> TractResult<()> {
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes)
        .and_then(|_| std::fs::rename(&tmp, path))
        .with_context(|| format!("Writing {}", path.display()))
}

/// The cubin of `module` for the device of `ctx`, from the disk cache or compiled now.
fn cubin(ctx: &CudaContext, module: &Module) -> TractResult<Vec<u8>> {
    let (major, minor) = ctx.compute_capability()?;
    let arch = format!("sm_{major}{minor}");
    let dir = cache_dir(&arch, nvrtc_version()?);
    let source = module.source();
    let options = module.options();
    // Options are part of the key where there are any (the files' keys predate them).
    let key = match options {
        [] => fnv1a64(source.as_bytes()),
        _ => fnv1a64(format!("{source}{options:?}").as_bytes()),
    };
    let stem = match module {
        Module::File(lib) => lib.file().0,
        Module::Generated(_) => "generated",
    };
    let path = dir.join(format!("{stem}_{key:016x}.cubin"));
    if let Ok(bytes) = std::fs::read(&path) {
        return Ok(bytes);
    }
    let bytes = compile(&module.name(), &source, &arch, options)?;
    std::fs::create_dir_all(&dir).with_context(|| format!("Creating {}", dir.display()))?;
    write_atomically(&path, &bytes)?;
    Ok(bytes)
}

/// A kernel of ours, loaded on first use and kept for the process.
pub fn function(ctx: &Arc<CudaContext>, lib: Library, name: &str) -> TractResult<CudaFunction> {
    load(ctx, Module::File(lib), name)
}

/// A kernel of a source generated at plan time, compiled (or read from the disk cache) on
/// first use and kept for the process.
pub fn generated_function(
    ctx: &Arc<CudaContext>,
    source: &Arc<str>,
    name: &str,
) -> TractResult<CudaFunction> {
    load(ctx, Module::Generated(source.clone()), name)
}

fn load(ctx: &Arc<CudaContext>, module: Module, name: &str) -> TractResult<CudaFunction> {
    type Modules = HashMap<Module, Arc<CudaModule>>;
    type Functions = HashMap<(Module, String), CudaFunction>;
    static MODULES: OnceLock<Mutex<(Modules, Functions)>> = OnceLock::new();
    let mut cache = MODULES
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| anyhow!("kernel cache poisoned"))?;
    let key = (module, name.to_string());
    if let Some(f) = cache.1.get(&key) {
        return Ok(f.clone());
    }
    let module = key.0.clone();
    let loaded = match cache.0.get(&module) {
        Some(m) => m.clone(),
        None => {
            let loaded = ctx
                .load_module(Ptx::from_binary(cubin(ctx, &module)?))
                .with_context(|| format!("Loading {}", module.name()))?;
            cache.0.insert(module.clone(), loaded.clone());
            loaded
        }
    };
    let f = loaded
        .load_function(name)
        .with_context(|| format!("Loading kernel {name} of {}", module.name()))?;
    cache.1.insert(key, f.clone());
    Ok(f)
}
