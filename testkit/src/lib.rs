//! What seqstream's tests share across crates (a dev-dependency only; nothing here runs in a
//! daemon): [`CountingAllocator`], for tests that prove a duty cycle allocates nothing per
//! message; [`KillOnDrop`], a child process that never outlives its test; [`output_within`],
//! a program run with a time bound; free ports;
//! waiting on a counter; a process's thread names; key files ([`write_key`]); a real etcd
//! server ([`etcd::Etcd`]), a TCP proxy whose link a test can cut ([`proxy::TcpProxy`]),
//! and datagrams of checkable messages ([`pattern_datagram`]).
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: seqstream_testkit::CountingAllocator = seqstream_testkit::CountingAllocator;
//!
//! let mut allocs = 0;
//! seqstream_testkit::counted(&mut allocs, || agent.do_work());
//! ```

pub mod etcd;
pub mod proxy;
pub mod relay;

use seqstream_schemas::wire;

/// A datagram of `source` on `stream` (session epoch 1, protocol version
/// [`DATAGRAM_PROTOCOL_VERSION`](seqstream_schemas::DATAGRAM_PROTOCOL_VERSION)) carrying the
/// pattern payloads of the source seqs `seqs`: payload `s` is
/// [`seqstream_store::pattern::fill`]`(s)`, 1 to 200 bytes, checked by
/// [`seqstream_store::pattern::check`]. At most 65,000 bytes.
pub fn pattern_datagram(stream: u32, source: u32, seqs: std::ops::Range<u64>) -> Vec<u8> {
    use seqstream_store::pattern;
    let mut buf = vec![0u8; 65_000];
    let mut e = wire::DatagramHeaderEncoder::new(&mut buf).expect("65,000 bytes hold a header");
    e.set_protocol_version(seqstream_schemas::DATAGRAM_PROTOCOL_VERSION)
        .set_stream_id(stream)
        .set_source_id(source)
        .set_session_epoch(1)
        .set_first_source_seq(seqs.start);
    {
        let mut g = e.messages().expect("a messages group");
        for s in seqs {
            let mut p = vec![0u8; pattern::payload_len(s, 1, 200)];
            pattern::fill(s, &mut p);
            let mut m = g.next_entry().expect("the messages fit in 65,000 bytes");
            m.set_payload(&p).expect("a payload of at most 200 bytes");
        }
    }
    let n = e.encoded_length();
    buf.truncate(n);
    buf
}

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

/// A child process that is killed and reaped when dropped, so a failing test leaks none.
#[derive(Debug)]
pub struct KillOnDrop(pub std::process::Child);

impl KillOnDrop {
    /// Spawns `cmd`.
    pub fn spawn(cmd: &mut std::process::Command) -> std::io::Result<KillOnDrop> {
        cmd.spawn().map(KillOnDrop)
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Sends SIGTERM and waits (at most `timeout`) for the child to exit; its status, or
    /// `None` if it was still running then (it is killed when dropped).
    pub fn terminate(&mut self, timeout: std::time::Duration) -> Option<std::process::ExitStatus> {
        // SAFETY: kill(2) on our own child's pid; it is not reaped yet (we hold it), so the
        // pid names it and no other process.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.0.try_wait() {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `cmd` to its end with stdout and stderr captured, as [`Command::output`] does, but
/// in a process group of its own that is stopped, whole, once `timeout` has passed: a test
/// that runs a long program (a benchmark, a daemon's run) bounds its time and leaves none of
/// the program's children behind. Stopped means asked first (SIGTERM to the group), so that
/// a program that handles it can remove what it made, and killed (SIGKILL) 10 s later. The
/// program is also killed if the test process dies first (`PR_SET_PDEATHSIG`: a signal to
/// the test's own process group no longer reaches it).
///
/// # Errors
/// Spawning or waiting failed; [`std::io::ErrorKind::TimedOut`], with what the program had
/// written to stderr, when it ran past `timeout`.
///
/// [`Command::output`]: std::process::Command::output
pub fn output_within(
    cmd: &mut std::process::Command,
    timeout: std::time::Duration,
) -> std::io::Result<std::process::Output> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;

    cmd.process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the forked child before exec and calls only prctl(2),
    // which is async-signal-safe. The death signal follows the thread that forked, which
    // stays in this function until the child is reaped.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let mut child = KillOnDrop(cmd.spawn()?);
    // From here on, every way out (an error included) kills the group first, then the child
    // itself should it have left its group, and reaps it: `group` drops before `child`.
    let group = KillGroup(child.pid());
    // Each pipe is read to its end on a thread of its own, which sends what it read.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut bytes);
            }
            let _ = tx.send(bytes);
        });
        rx
    };
    let stdout = drain(child.0.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.0.stderr.take().map(|p| Box::new(p) as _));
    let deadline = std::time::Instant::now() + timeout;
    let wait_until = |end: std::time::Instant| -> std::io::Result<bool> {
        while !ended(child.pid())? {
            if std::time::Instant::now() >= end {
                return Ok(false);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(true)
    };
    let timed_out = !wait_until(deadline)?;
    if timed_out {
        // SAFETY: kill(2) takes no memory of ours; the group's id names this group (see
        // `KillGroup`).
        unsafe { libc::kill(-(child.pid() as libc::pid_t), libc::SIGTERM) };
        wait_until(std::time::Instant::now() + std::time::Duration::from_secs(10))?;
    }
    // Whether it ended or not, nothing of its group outlives this call: a process it left
    // behind would hold the pipes open.
    drop(group);
    let _ = child.0.kill();
    let status = child.0.wait()?;
    // A process that left the group (setsid) could hold a pipe open still: its bytes are
    // not waited for beyond a few seconds.
    let collect = |rx: std::sync::mpsc::Receiver<Vec<u8>>| {
        rx.recv_timeout(std::time::Duration::from_secs(5))
            .unwrap_or_else(|_| b"(a pipe still open: a process left the group)".to_vec())
    };
    let (stdout, stderr) = (collect(stdout), collect(stderr));
    if timed_out {
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "{cmd:?} ran past {timeout:?} and was stopped; its stderr:\n{}",
                String::from_utf8_lossy(&stderr)
            ),
        ));
    }
    Ok(std::process::Output {
        status,
        stdout,
        stderr,
    })
}

/// Kills, when dropped, the process group whose id it holds: the group of a child of this
/// process that leads it and is not reaped yet, so that the id names this group and no
/// other (an unreaped child's pid is not reused).
struct KillGroup(u32);

impl Drop for KillGroup {
    fn drop(&mut self) {
        // SAFETY: kill(2) takes no memory of ours.
        unsafe { libc::kill(-(self.0 as libc::pid_t), libc::SIGKILL) };
    }
}

/// Whether `pid`, a child of this process, has ended, without reaping it: until it is
/// reaped, its pid (and the id of a group it leads) is not reused.
fn ended(pid: u32) -> std::io::Result<bool> {
    // SAFETY: an all-zero siginfo_t is a valid value (a plain C struct).
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid writes only `info`, a siginfo_t we own, for the duration of the call.
    let r = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: waitid filled `info` (or left it zeroed: WNOHANG and no child has ended), and
    // si_pid is the field it sets for every child state change.
    Ok(unsafe { info.si_pid() } != 0)
}

/// A UDP port that was free a moment ago on every local IPv4 address (see
/// [`free_tcp_port`]), below the kernel's ephemeral range.
pub fn free_udp_port() -> u16 {
    free_port(udp_port_free)
}

/// A TCP port that no listener held a moment ago on any local IPv4 address, below the
/// kernel's ephemeral range (`ip_local_port_range`), so that no socket the kernel gives a port
/// to later (a client connecting while the server is down, a socket bound to port 0) takes
/// it: a client connecting to a port in that range with no listener can even connect to
/// itself. Tests give their hosts loopback addresses of their own (127.0.0.2, 127.0.0.3, …),
/// so a port is judged by binding it on 0.0.0.0, which fails while a listener on any address
/// holds it (as another test's host on 127.0.0.3 may), and released at once. IPv6-only
/// sockets are not looked at.
pub fn free_tcp_port() -> u16 {
    free_port(tcp_port_free)
}

/// Whether UDP port `p` is bound on no local IPv4 address (a bind on 0.0.0.0 succeeds).
fn udp_port_free(p: u16) -> bool {
    std::net::UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, p)).is_ok()
}

/// Whether TCP port `p` is bound on no local IPv4 address (a bind on 0.0.0.0 succeeds).
fn tcp_port_free(p: u16) -> bool {
    std::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, p)).is_ok()
}

/// A port in `[10000, start of the ephemeral range)` that `free` says is free, tried from a
/// point that differs per call and per process.
fn free_port(free: impl Fn(u16) -> bool) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CALLS: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768)
        .clamp(10001, 65535);
    let span = low - 10000;
    let seed = std::process::id()
        .wrapping_mul(2_654_435_761)
        .wrapping_add(CALLS.fetch_add(1, Ordering::Relaxed).wrapping_mul(40_503))
        .wrapping_add(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos()),
        );
    (0..span)
        .map(|k| (10000 + (seed.wrapping_add(k.wrapping_mul(7919)) % span)) as u16)
        .find(|&p| free(p))
        .expect("a free port below the ephemeral range")
}

/// Bytes queued to be read on the IPv4 UDP socket bound to `addr` in this network namespace
/// (the `rx_queue` column of `/proc/net/udp`: each datagram's buffer, its overhead included);
/// `None` when no such socket is listed. A test that sends to a socket it does not own waits
/// on this, instead of a sleep, until its datagrams are there to be read.
pub fn udp_rx_queue(addr: std::net::SocketAddrV4) -> Option<u64> {
    proc_net_rx_queue("/proc/net/udp", addr, None)
}

/// Waits (at most `timeout`) until [`udp_rx_queue`] of `addr` satisfies `ok`; returns it, or
/// panics with its last value.
pub fn wait_udp_rx_queue(
    addr: std::net::SocketAddrV4,
    timeout: std::time::Duration,
    ok: impl Fn(u64) -> bool,
) -> u64 {
    wait_rx_queue("udp socket", udp_rx_queue, addr, timeout, ok)
}

/// Bytes received and not yet read on the first established IPv4 TCP connection whose local
/// end is `local` in this network namespace (the `rx_queue` column of `/proc/net/tcp`), such
/// as the one connection a test's server accepted on `local`; `None` when none is listed.
/// A test that wants to know whether a process it drives read its socket reads this.
pub fn tcp_rx_queue(local: std::net::SocketAddrV4) -> Option<u64> {
    // State 01: TCP_ESTABLISHED (include/net/tcp_states.h); the listener is 0A.
    proc_net_rx_queue("/proc/net/tcp", local, Some("01"))
}

/// Waits (at most `timeout`) until [`tcp_rx_queue`] of `local` satisfies `ok`; returns it,
/// or panics with its last value.
pub fn wait_tcp_rx_queue(
    local: std::net::SocketAddrV4,
    timeout: std::time::Duration,
    ok: impl Fn(u64) -> bool,
) -> u64 {
    wait_rx_queue("tcp connection at", tcp_rx_queue, local, timeout, ok)
}

/// Waits (at most `timeout`) until `queue` of `local` (the `what` named in the panic)
/// satisfies `ok`.
fn wait_rx_queue(
    what: &str,
    queue: fn(std::net::SocketAddrV4) -> Option<u64>,
    local: std::net::SocketAddrV4,
    timeout: std::time::Duration,
    ok: impl Fn(u64) -> bool,
) -> u64 {
    poll_until(
        timeout,
        std::time::Duration::from_millis(1),
        || queue(local),
        ok,
        |q| format!("{what} {local}: rx_queue {q:?} after {timeout:?}"),
    )
}

/// The `rx_queue` of the first socket of `table` (`/proc/net/udp` or `/proc/net/tcp`, whose
/// lines read `sl local_address rem_address st tx_queue:rx_queue ...`, addresses and queues
/// in hex) bound locally to `local`, in state `state` when given.
fn proc_net_rx_queue(
    table: &str,
    local: std::net::SocketAddrV4,
    state: Option<&str>,
) -> Option<u64> {
    let local = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(local.ip().octets()),
        local.port()
    );
    let table = std::fs::read_to_string(table).ok()?;
    table.lines().skip(1).find_map(|line| {
        let mut fields = line.split_whitespace();
        (fields.nth(1)? == local).then_some(())?;
        let st = fields.nth(1)?;
        state.is_none_or(|want| want == st).then_some(())?;
        let queues = fields.next()?;
        u64::from_str_radix(queues.split_once(':')?.1, 16).ok()
    })
}

/// Waits (at most `within`, looking every millisecond) until `ok` holds; panics naming `what`
/// otherwise.
pub fn eventually(what: &str, within: std::time::Duration, mut ok: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !ok() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Reads `read` every `every` until it gives a value that satisfies `ok`, and returns that;
/// past `timeout`, panics with `failed` of the last reading.
fn poll_until(
    timeout: std::time::Duration,
    every: std::time::Duration,
    read: impl Fn() -> Option<u64>,
    ok: impl Fn(u64) -> bool,
    failed: impl Fn(Option<u64>) -> String,
) -> u64 {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let v = read();
        if let Some(v) = v.filter(|v| ok(*v)) {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "{}", failed(v));
        std::thread::sleep(every);
    }
}

/// The value of counter `label` in the counters file at `path`, once it is there.
pub fn counter(path: &std::path::Path, label: &str) -> Option<u64> {
    seqstream_agent::counters::read(path)
        .ok()
        .and_then(|s| s.get(label))
}

/// Waits (at most `timeout`) until counter `label` of the file at `path` satisfies `ok`;
/// panics with its last value otherwise.
pub fn wait_counter(
    path: &std::path::Path,
    label: &str,
    timeout: std::time::Duration,
    ok: impl Fn(u64) -> bool,
) -> u64 {
    poll_until(
        timeout,
        std::time::Duration::from_millis(5),
        || counter(path, label),
        ok,
        |v| {
            format!(
                "counter {label:?} of {} is {v:?} after {timeout:?}",
                path.display()
            )
        },
    )
}

/// The names of the threads of process `pid` (from `/proc/<pid>/task/*/comm`), sorted.
pub fn thread_names(pid: u32) -> Vec<String> {
    // A thread that has just been spawned carries its parent's name until its first
    // instructions set its own (a store's segment-preparing thread, spawned by a runner,
    // reads for a moment as that runner): two equal readings 20 ms apart are past that.
    let mut last = names_now(pid);
    for _ in 0..50 {
        std::thread::sleep(std::time::Duration::from_millis(20));
        let now = names_now(pid);
        if now == last {
            break;
        }
        last = now;
    }
    last
}

fn names_now(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|rd| {
            rd.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|n| n.trim().to_string())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A store's live files (active and sealed segments, their indexes) and their bytes, by name
/// (`seqstream_store::layout::live_files`): equal for a replica and its primary.
pub fn store_files(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    seqstream_store::layout::live_files(dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p.file_name().unwrap().to_string_lossy().into_owned(), bytes)
        })
        .collect()
}

/// Writes a key file at `path` as a daemon accepts it: `material` (at least 16 bytes) and a
/// newline, readable by its owner only (mode 0600), replacing any file there by a rename so a
/// reader never sees it half written.
pub fn write_key(path: &std::path::Path, material: &str) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("key-tmp");
    std::fs::write(&tmp, format!("{material}\n")).expect("writing a key file");
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .expect("chmod 600 a key file");
    std::fs::rename(&tmp, path).expect("renaming a key file into place");
}

/// Copies the frames of the store at `primary` that `replica` (a replica store in
/// `replica_dir`, created on the first frame when `None`) does not hold yet, up to seq
/// `until` (all when `None`), as a replication client writes them: each segment's header with
/// its first frame, checked before it is begun, then the frames verbatim. Panics on any
/// refusal: for tests that build stores with a known history.
pub fn replicate_into(
    primary: &std::path::Path,
    replica_dir: &std::path::Path,
    replica: &mut Option<seqstream_store::Appender>,
    cfg: &seqstream_store::StoreConfig,
    until: Option<u64>,
) {
    use seqstream_store::{Appender, Tailer};
    let mut t = Tailer::open(primary).expect("opening the primary");
    if let Some(r) = replica.as_ref() {
        t.seek_seq(r.next_seq()).expect("seeking the primary");
    }
    while let Some(f) = t.poll().expect("reading the primary") {
        if until.is_some_and(|u| f.seq() > u) {
            break;
        }
        let mut bytes = f.as_bytes().to_vec();
        bytes.resize(seqstream_store::format::align_frame(bytes.len()), 0);
        let header = t.segment_header();
        let r = match replica.as_mut() {
            None => replica.insert(
                Appender::open_replica(replica_dir, cfg.clone(), &header)
                    .expect("creating the replica"),
            ),
            Some(r) if r.segment_header() != header => {
                r.check_next_replicated_segment(&header, &bytes)
                    .expect("the next segment continues the replica");
                r.begin_replicated_segment(&header)
                    .expect("beginning the next segment");
                r
            }
            Some(r) => r,
        };
        let (frames, _) = r.append_replicated(&bytes).expect("a replicated frame");
        assert_eq!(frames, 1);
    }
}

/// Minor page faults taken so far by the calling thread (`getrusage(RUSAGE_THREAD)`): what a
/// test counts around a hot loop to show it faults in no page.
pub fn thread_minor_faults() -> i64 {
    // SAFETY: rusage is plain integers, for which all zeros is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage; RUSAGE_THREAD is Linux's.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    assert_eq!(rc, 0);
    usage.ru_minflt
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::time::{Duration, Instant};

    /// How long a test waits for what the kernel or another test holds.
    const PATIENCE: Duration = Duration::from_secs(10);

    use super::{
        eventually, output_within, tcp_port_free, tcp_rx_queue, udp_port_free, udp_rx_queue,
        wait_tcp_rx_queue, wait_udp_rx_queue,
    };

    #[test]
    fn output_within_returns_what_the_program_printed_and_its_status() {
        let out = output_within(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(60),
        )
        .unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
    }

    /// Whether `pid` is gone or a zombie (killed, not yet reaped by its new parent).
    fn dead(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
            s.rsplit(')').next().unwrap().trim_start().starts_with('Z')
        })
    }

    /// Waits (at most 30 s) until `pid` is dead; kills it and fails if it is not by then.
    fn expect_dead(pid: u32, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !dead(pid) {
            if Instant::now() >= deadline {
                // SAFETY: kill(2) takes no memory of ours.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                panic!("{what} {pid} is still running");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Reads the pid that a program wrote to `file`, waiting (at most 30 s) for it.
    fn read_pid(file: &std::path::Path) -> u32 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(pid) = std::fs::read_to_string(file)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                return pid;
            }
            assert!(Instant::now() < deadline, "no pid in {}", file.display());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    const CHILD_ENV: &str = "SEQSTREAM_TESTKIT_OUTPUT_WITHIN_PID_FILE";

    #[test]
    fn output_within_kills_the_program_when_the_test_process_dies() {
        if let Some(pid_file) = std::env::var_os(CHILD_ENV) {
            // The test process that the outer run of this test kills.
            let script = format!(
                "echo $$ > {}; exec sleep 600",
                std::path::Path::new(&pid_file).display()
            );
            let _ = output_within(
                Command::new("sh").args(["-c", &script]),
                Duration::from_secs(600),
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let mut test = crate::KillOnDrop::spawn(
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "tests::output_within_kills_the_program_when_the_test_process_dies",
                ])
                .env(CHILD_ENV, &pid_file)
                .stdout(std::process::Stdio::null()),
        )
        .unwrap();
        let program = read_pid(&pid_file);
        test.0.kill().unwrap();
        test.0.wait().unwrap();
        expect_dead(program, "the program of a killed test");
    }

    #[test]
    fn the_rx_queue_of_a_udp_socket_counts_what_waits_to_be_read() {
        use std::net::{SocketAddr, UdpSocket};
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let SocketAddr::V4(addr) = socket.local_addr().unwrap() else {
            unreachable!("bound to an IPv4 address")
        };
        assert_eq!(udp_rx_queue(addr), Some(0));
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        sender.send_to(&[7; 100], addr).unwrap();
        let one = wait_udp_rx_queue(addr, Duration::from_secs(10), |q| q > 0);
        sender.send_to(&[7; 100], addr).unwrap();
        wait_udp_rx_queue(addr, Duration::from_secs(10), |q| q >= 2 * one);
        let mut buf = [0u8; 200];
        assert_eq!(socket.recv(&mut buf).unwrap(), 100);
        assert_eq!(socket.recv(&mut buf).unwrap(), 100);
        assert_eq!(udp_rx_queue(addr), Some(0));
        drop(socket);
        eventually("the dropped socket unlisted", PATIENCE, || {
            udp_rx_queue(addr).is_none()
        });
    }

    #[test]
    fn a_port_held_on_another_loopback_address_is_not_free() {
        use std::net::{TcpListener, UdpSocket};
        // A child that another test of this binary forks holds a copy of each socket this
        // process has until it execs (they are close-on-exec): a port probed free may be held
        // a moment longer (the bind is tried again), and a dropped socket's port is released
        // a moment later.
        // Ports below the ephemeral range, which no bind to port 0 elsewhere can take.
        let port = super::free_tcp_port();
        let mut tcp = None;
        eventually("tcp bound on 127.0.0.3", PATIENCE, || {
            tcp = TcpListener::bind(("127.0.0.3", port)).ok();
            tcp.is_some()
        });
        assert!(!tcp_port_free(port), "tcp {port} is held on 127.0.0.3");
        drop(tcp);
        eventually("tcp released", PATIENCE, || tcp_port_free(port));
        let port = super::free_udp_port();
        let mut udp = None;
        eventually("udp bound on 127.0.0.3", PATIENCE, || {
            udp = UdpSocket::bind(("127.0.0.3", port)).ok();
            udp.is_some()
        });
        assert!(!udp_port_free(port), "udp {port} is held on 127.0.0.3");
        drop(udp);
        eventually("udp released", PATIENCE, || udp_port_free(port));
    }

    #[test]
    fn the_rx_queue_of_a_tcp_connection_counts_the_bytes_unread() {
        use std::io::{Read, Write};
        use std::net::{SocketAddr, TcpListener, TcpStream};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let SocketAddr::V4(local) = listener.local_addr().unwrap() else {
            unreachable!("bound to an IPv4 address")
        };
        assert_eq!(tcp_rx_queue(local), None, "a listener is no connection");
        let mut client = TcpStream::connect(local).unwrap();
        let (mut accepted, _) = listener.accept().unwrap();
        assert_eq!(tcp_rx_queue(local), Some(0));
        client.write_all(&[7; 100]).unwrap();
        assert_eq!(
            wait_tcp_rx_queue(local, Duration::from_secs(10), |q| q > 0),
            100
        );
        let mut buf = [0u8; 100];
        accepted.read_exact(&mut buf).unwrap();
        assert_eq!(tcp_rx_queue(local), Some(0));
    }

    #[test]
    fn output_within_kills_a_program_past_its_bound_with_the_children_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let script = format!(
            "sleep 600 & echo $! > {}; echo started >&2; wait",
            pid_file.display()
        );
        let err = output_within(
            Command::new("sh").args(["-c", &script]),
            // Long enough for a loaded machine to start `sh` and its child.
            Duration::from_secs(3),
        )
        .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
        assert!(err.to_string().contains("started"), "{err}");
        expect_dead(read_pid(&pid_file), "the child of a program past its bound");
    }
}
