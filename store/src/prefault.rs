//! Pre-faulting a reader's mapping of a segment off the reader's thread, as the appender's
//! `pretouch` does for its own writable mapping.
//!
//! A tailer maps each segment it reads. The pages are in the page cache (the appender wrote
//! or pretouched them), but not in the reader's page tables: its first read of each group of
//! pages is a minor fault, about one per 140 KiB of stream on the development machine, a few
//! µs each on the reader's thread. `MADV_POPULATE_READ` (Linux 5.14+) maps them all ahead,
//! here on a short-lived `seg-prefault` thread, so that the reader's loads never fault. With
//! it, `bench store`'s `append_to_tailer_64B` p99.9 went from 2.0–2.4 µs to 0.59–0.72 µs.
//!
//! This module owns that thread and nothing else. It never outlives the mapping it
//! populates: a [`Prefault`] is held by the [`Segment`](crate::segment::Segment) whose
//! mapping it populates, in a field dropped before the mapping, and dropping it stops the
//! thread and waits for it (at most one [`CHUNK`]). It never changes a byte: populating for
//! read maps pages, and a page past the file's end (a file shrunk under it) ends the job with
//! `EFAULT`, not a signal.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Bytes populated by one `madvise(2)` call, between two looks at the stop flag: 2 MiB (512
/// pages), a few tens of µs, so that a drop waits no longer than that.
pub(crate) const CHUNK: usize = 2 << 20;

/// A background job populating part of a mapping for read. Dropping it stops the job and
/// waits for its thread.
#[derive(Debug)]
pub(crate) struct Prefault {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Prefault {
    /// Starts populating the `len` bytes at `addr` (page-aligned) for read, front to back.
    ///
    /// # Safety
    /// The range must stay mapped until the returned `Prefault` is dropped.
    pub(crate) unsafe fn start(addr: *const u8, len: usize) -> Prefault {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        // An address, not a pointer, crosses to the thread: the caller keeps it mapped.
        let base = addr as usize;
        let thread = std::thread::Builder::new()
            .name("seg-prefault".into())
            .spawn(move || {
                // Not on the core of the (possibly pinned, busy-spinning) reader.
                seqstream_agent::affinity::unpin_current_thread();
                let mut off = 0;
                while off < len && !stopped.load(Ordering::Relaxed) {
                    let n = CHUNK.min(len - off);
                    // SAFETY: `[base + off, base + off + n)` lies in the range the caller
                    // keeps mapped until this thread is joined (the drop below, before the
                    // unmap). Populating for read changes no byte; it fails (EINVAL before
                    // Linux 5.14, EFAULT past a shrunk file's end) rather than fault.
                    let rc = unsafe {
                        libc::madvise(
                            (base + off) as *mut libc::c_void,
                            n,
                            libc::MADV_POPULATE_READ,
                        )
                    };
                    if rc != 0 {
                        return;
                    }
                    off += n;
                }
            });
        Prefault {
            stop,
            // No thread (the system refused one) only costs the reader its faults.
            thread: thread.ok(),
        }
    }

    /// `true` once the job has ended: populated all, stopped, or failed.
    pub(crate) fn is_done(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }
}

impl Drop for Prefault {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
