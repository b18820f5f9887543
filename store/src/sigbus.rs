//! Surviving a mapped file that shrinks under its reader.
//!
//! Touching a page of a `MAP_SHARED` mapping that lies wholly past the end of its file raises
//! `SIGBUS`, whose default action kills the process. Store files are never shortened by this
//! crate, but operators, bad copies and full disks do it. This module owns a process-wide
//! `SIGBUS` handler and a registry of the address ranges of every live `MappedFile`
//! (the crate's private mapping of one file):
//!
//! - a fault inside a registered range is absorbed: the handler maps a private zero page over
//!   the faulting page (`mmap(MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS)`), marks the range
//!   faulted and returns, so the access completes (reads see zeros; writes land in the
//!   private page and reach no file);
//! - a fault anywhere else goes to the handler that was installed before ours (the standard
//!   library's stack-overflow handler, say), or to the default action.
//!
//! Readers and the appender check [`Guard::faulted`] after touching mapped bytes and before
//! trusting them, and turn a fault into `StoreError::Shrunk`: a typed error naming the file,
//! never a signal. The guarantee is stated in `store/FORMAT.md`.
//!
//! It never allocates, locks or logs inside the handler: only atomics and one `mmap` call.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The most mappings one process can register at once (segments and index files of every
/// store it has open). [`Guard::register`] fails beyond it.
pub const MAX_MAPPINGS: usize = 4096;

/// One registered range. `start == 0` means the slot holds no range (a mapping never starts at
/// address 0).
#[derive(Debug)]
struct Slot {
    claimed: AtomicBool,
    start: AtomicUsize,
    len: AtomicUsize,
    writable: AtomicBool,
    faulted: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    claimed: AtomicBool::new(false),
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    writable: AtomicBool::new(false),
    faulted: AtomicBool::new(false),
};

static REGISTRY: [Slot; MAX_MAPPINGS] = [EMPTY; MAX_MAPPINGS];

/// Faults absorbed since the process started, over all mappings.
static ABSORBED: AtomicU64 = AtomicU64::new(0);

/// The page size, and the handler that was installed before ours.
struct Installed {
    page_size: usize,
    previous: libc::sigaction,
}

static INSTALLED: OnceLock<Result<Installed, i32>> = OnceLock::new();

/// Faults absorbed since the process started (all mappings together).
pub fn absorbed_faults() -> u64 {
    ABSORBED.load(Ordering::Relaxed)
}

/// A registered range: while it lives, a `SIGBUS` inside it is absorbed. Dropping it
/// unregisters the range; drop it before the range is unmapped.
#[derive(Debug)]
pub struct Guard {
    /// The slot of [`REGISTRY`] this guard claimed: a reference, not an index, so that
    /// [`faulted`](Self::faulted) is one load with no bounds check.
    slot: &'static Slot,
}

/// Why a range could not be registered.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// `sigaction` failed (the errno).
    #[error("installing the SIGBUS handler failed (errno {0})")]
    Install(i32),
    /// [`MAX_MAPPINGS`] ranges are registered already.
    #[error("more than {MAX_MAPPINGS} mapped store files open in one process")]
    Full,
}

impl Guard {
    /// Registers `[start, start + len)`; installs the handler on first use. `writable` says
    /// how the zero page that replaces a vanished page is mapped.
    pub fn register(start: *const u8, len: usize, writable: bool) -> Result<Guard, GuardError> {
        install()?;
        for slot in &REGISTRY {
            if slot
                .claimed
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                slot.faulted.store(false, Ordering::Relaxed);
                slot.writable.store(writable, Ordering::Relaxed);
                slot.len.store(len, Ordering::Relaxed);
                // Release: the handler that sees `start` sees the fields above.
                slot.start.store(start as usize, Ordering::Release);
                return Ok(Guard { slot });
            }
        }
        Err(GuardError::Full)
    }

    /// `true` once a fault in the range was absorbed: some page of the file vanished (the
    /// file shrank), and bytes read from the range since may be zeros that the file never
    /// held. Stays `true` for the life of the guard.
    #[inline]
    pub fn faulted(&self) -> bool {
        self.slot.faulted.load(Ordering::Acquire)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let slot = self.slot;
        slot.start.store(0, Ordering::Release);
        slot.len.store(0, Ordering::Relaxed);
        slot.claimed.store(false, Ordering::Release);
    }
}

fn install() -> Result<(), GuardError> {
    let installed = INSTALLED.get_or_init(|| {
        // SAFETY: sysconf and sigaction are plain calls; the struct is zeroed, then filled.
        unsafe {
            let page_size = libc::sysconf(libc::_SC_PAGESIZE).max(4096) as usize;
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
            libc::sigemptyset(&mut action.sa_mask);
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, &action, &mut previous) != 0 {
                return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
            Ok(Installed {
                page_size,
                previous,
            })
        }
    });
    match installed {
        Ok(_) => Ok(()),
        Err(errno) => Err(GuardError::Install(*errno)),
    }
}

/// The `SIGBUS` handler. Async-signal-safe: atomics, `mmap` and `sigaction` only.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let Some(Ok(installed)) = INSTALLED.get() else {
        return;
    };
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for slot in REGISTRY.iter() {
        let start = slot.start.load(Ordering::Acquire);
        if start == 0 || addr < start || addr - start >= slot.len.load(Ordering::Relaxed) {
            continue;
        }
        let page = addr & !(installed.page_size - 1);
        let prot = if slot.writable.load(Ordering::Relaxed) {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: the page lies inside a live mapping that this process owns (the range is
        // registered only while its `MappedFile` lives, and the faulting thread is using it);
        // replacing it with a private zero page changes no other memory.
        let mapped = unsafe {
            libc::mmap(
                page as *mut libc::c_void,
                installed.page_size,
                prot,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if mapped != libc::MAP_FAILED {
            slot.faulted.store(true, Ordering::Release);
            ABSORBED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        break;
    }
    forward(sig, info, ctx, &installed.previous);
}

/// Hands a fault that is not ours to the previous handler, or restores the default action so
/// that the faulting instruction, executed again on return, kills the process as it would
/// have without us.
fn forward(
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
    previous: &libc::sigaction,
) {
    let handler = previous.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // SAFETY: a zeroed sigaction with SIG_DFL is a valid argument.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
        }
        return;
    }
    if previous.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed with SA_SIGINFO, so it has this type.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: a handler installed without SA_SIGINFO takes the signal number only.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
}
