//! What seqstream's tests share across crates (a dev-dependency only; nothing here runs in a
//! daemon). Today: [`CountingAllocator`], for tests that prove a duty cycle allocates nothing
//! per message.
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: seqstream_testkit::CountingAllocator = seqstream_testkit::CountingAllocator;
//!
//! let mut allocs = 0;
//! seqstream_testkit::counted(&mut allocs, || agent.do_work());
//! ```

#![warn(missing_docs, unreachable_pub, unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Counts heap allocations (alloc, alloc_zeroed, realloc) made on the calling thread, then
/// forwards every call to the system allocator. Per thread: the store's segment-preparing
/// thread and the test harness's own threads are not the duty cycle under test, and a
/// per-thread count keeps them and concurrently running tests out of it. Install it as the
/// test binary's `#[global_allocator]`.
pub struct CountingAllocator;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // A const-initialized `Cell` has no destructor: reachable until the thread is gone.
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting allocates
// nothing.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract for `GlobalAlloc::alloc`, passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract for `GlobalAlloc::alloc_zeroed`, passed on unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: `ptr` came from this allocator, i.e. from `System` (every call forwards).
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, i.e. from `System` (every call forwards).
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Runs `f`, adding the allocations it made on this thread to `*allocs`. Counts only when
/// [`CountingAllocator`] is the binary's global allocator.
pub fn counted<R>(allocs: &mut u64, f: impl FnOnce() -> R) -> R {
    let before = ALLOCS.with(Cell::get);
    let r = f();
    *allocs += ALLOCS.with(Cell::get) - before;
    r
}
