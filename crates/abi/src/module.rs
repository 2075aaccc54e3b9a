//! What every proxy-wasm module exports besides its callbacks: the ABI version, the allocator the
//! host hands buffers through, and the reactor's start; and how a buffer the host handed over is
//! taken back.
//!
//! Invariant: every buffer the host returns was allocated by `proxy_on_memory_allocate` (the global
//! allocator, alignment 1) and is taken back exactly once, as a `Vec<u8>` of exactly that
//! capacity. An allocation the VM cannot make answers null (the host fails the call), never aborts.

use crate::Status;

// Not exported in this crate's own tests: they link the SDK, which exports the same names.

/// The ABI version this module speaks (Higress registers its Redis functions for it).
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn proxy_abi_version_0_2_1() {}

/// The host allocates every buffer it hands the module through this: `size` bytes from the
/// global allocator, taken back later as a `Vec<u8>` of that capacity (`take`). A size the VM
/// cannot allocate answers null, which the host turns into a failed call (the SDK's allocator
/// aborted the VM there).
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    if size == 0 {
        return std::ptr::NonNull::<u8>::dangling().as_ptr();
    }
    match std::alloc::Layout::array::<u8>(size) {
        // SAFETY: a non-zero size, as `alloc` requires.
        Ok(layout) => unsafe { std::alloc::alloc(layout) },
        Err(_) => std::ptr::null_mut(),
    }
}

#[cfg(target_os = "wasi")]
extern "C" {
    fn __wasm_call_ctors();
}

/// Reactor start: runs the module's static constructors (wasi-libc's among them).
#[no_mangle]
pub extern "C" fn _initialize() {
    #[cfg(target_os = "wasi")]
    // SAFETY: called once by the host before any other export, as the reactor model requires.
    unsafe {
        __wasm_call_ctors();
    }
}

/// Takes back a buffer the host allocated with `proxy_on_memory_allocate`: the call's status if
/// it failed, an empty buffer for success without data.
///
/// # Safety
/// `data`/`size` must be what the host wrote for a call that answered `status`.
pub(crate) unsafe fn take(status: u32, data: *mut u8, size: usize) -> Result<Vec<u8>, Status> {
    Status::check(status)?;
    if data.is_null() {
        return Ok(Vec::new());
    }
    // SAFETY: see above: `size` bytes of the global allocator's with alignment 1
    // (`proxy_on_memory_allocate`), filled by the host: a `Vec<u8>` of capacity `size`.
    Ok(unsafe { Vec::from_raw_parts(data, size, size) })
}
