//! The device's memory pool: memory a run frees is kept for the next run.
//!
//! tract-cuda allocates every device tensor (a plan's arena, a batch's input and outputs)
//! through cudarc's stream-ordered allocator, `cuMemAllocAsync`, from the device's default
//! memory pool. That pool's release threshold defaults to 0: at every synchronisation it
//! hands all the memory it holds unused back to the driver, so each run maps its arena
//! (hundreds of MiB for a batch of 32 wide lines) afresh, on the thread that launches.
//! [`keep_freed_memory`] raises the threshold to the maximum once per process, when the
//! first plan is prepared (`TRACT_RAGGED_KEEP_FREED`, on by default), as PyTorch's
//! caching allocator keeps what it frees.
//!
//! The pool may also hand a stream memory that another stream freed but has not yet
//! reached, making the one stream wait for the other (CUDA's
//! `REUSE_ALLOW_INTERNAL_DEPENDENCIES`, on by default): a lane's upload would then wait
//! behind another lane's whole run. `TRACT_RAGGED_POOL_WAITS` off turns that off, in the
//! same once-per-process setting: the pool then hands out memory already free, or takes
//! more from the driver.
//!
//! Memory the pool keeps is not free to the driver: [`spare`] says how much the pool
//! holds unused, which the memory budget counts as free (the pool hands it out first),
//! and [`release_spare`] gives it back, where an allocation outside the pool (cuBLAS's or
//! cuDNN's) ran out.

use std::sync::OnceLock;

use cudarc::driver::result::{device, mem_pool};
use cudarc::driver::sys::{CUmemPool_attribute, CUmemoryPool};
use tract_core::internal::*;

use super::knobs::{TRACT_RAGGED_KEEP_FREED, TRACT_RAGGED_POOL_WAITS};

/// The default memory pool of the device of the calling thread's tract-cuda stream, where
/// the context allocates from pools.
fn default_pool() -> TractResult<Option<CUmemoryPool>> {
    tract_cuda::with_cuda_stream(|stream| {
        let context = stream.context();
        if !context.has_async_alloc() {
            return Ok(None);
        }
        context.bind_to_thread()?;
        // SAFETY: the device is the context's.
        let pool = unsafe { device::get_default_mem_pool(context.cu_device()) }
            .context("Reading the device's default memory pool")?;
        Ok(Some(pool))
    })
}

/// Raises the default pool's release threshold to the maximum unless
/// `TRACT_RAGGED_KEEP_FREED` is off, and stops its reuse across streams by waiting where
/// `TRACT_RAGGED_POOL_WAITS` is off; once per process. Whether it was set is remembered,
/// failure included: a pool that cannot be tuned runs as CUDA's default has it.
pub fn keep_freed_memory() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let keep = TRACT_RAGGED_KEEP_FREED.get();
        let waits = TRACT_RAGGED_POOL_WAITS.get();
        if !keep && waits {
            return;
        }
        // A device-wide setting: not while another thread captures a graph.
        let _ = super::graph::quiet(|| -> TractResult<()> {
            let Some(pool) = default_pool()? else {
                return Ok(());
            };
            if keep {
                let mut threshold: u64 = u64::MAX;
                // SAFETY: the pool is the device's; the attribute takes a u64.
                unsafe {
                    mem_pool::set_attribute(
                        pool,
                        CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                        (&mut threshold as *mut u64).cast(),
                    )
                }
                .context("Setting the memory pool's release threshold")?;
            }
            if !waits {
                let mut allow: i32 = 0;
                // SAFETY: the pool is the device's; the attribute takes an int.
                unsafe {
                    mem_pool::set_attribute(
                        pool,
                        CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
                        (&mut allow as *mut i32).cast(),
                    )
                }
                .context("Setting the memory pool's reuse across streams")?;
            }
            Ok(())
        });
    });
}

/// Attribute `attr` of `pool`, one that is a u64.
fn attribute(pool: CUmemoryPool, attr: CUmemPool_attribute) -> TractResult<u64> {
    let mut value: u64 = 0;
    // SAFETY: the pool is the device's; the attributes read here are u64s.
    unsafe { mem_pool::get_attribute(pool, attr, (&mut value as *mut u64).cast()) }
        .context("Reading the memory pool's attributes")?;
    Ok(value)
}

/// The default pool's release threshold: the bytes it keeps unused at a synchronisation
/// (`u64::MAX` once [`keep_freed_memory`] set it); none where there is no pool.
pub fn release_threshold() -> TractResult<Option<u64>> {
    default_pool()?
        .map(|pool| attribute(pool, CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD))
        .transpose()
}

/// The bytes the default pool holds unused (reserved minus used); 0 where there is none.
pub fn spare() -> u64 {
    let read = || -> TractResult<u64> {
        let Some(pool) = default_pool()? else {
            return Ok(0);
        };
        let reserved = attribute(
            pool,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
        )?;
        let used = attribute(pool, CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?;
        Ok(reserved.saturating_sub(used))
    };
    read().unwrap_or(0)
}

/// Hands what the default pool holds unused back to the driver (the calling thread's
/// stream synchronised first, so that memory freed by its queued work counts). A
/// device-wide call: not while another thread captures a graph, and not to be called
/// inside [`super::graph::quiet`].
pub fn release_spare() -> TractResult<()> {
    super::graph::quiet(|| {
        let Some(pool) = default_pool()? else {
            return Ok(());
        };
        tract_cuda::with_cuda_stream(|stream| Ok(stream.synchronize()?))?;
        // SAFETY: the pool is the device's; trimming releases only unused memory.
        unsafe { mem_pool::trim_to(pool, 0) }.context("Trimming the device's memory pool")?;
        Ok(())
    })
}
