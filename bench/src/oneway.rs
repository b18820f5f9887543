//! One-way latency with one message in flight, the method every latency figure uses: the
//! writer stamps a clock reading (ns since a common `Instant`), the reader records
//! `now - stamp` when it sees it and acknowledges through a cache line, and only then does the
//! writer send the next. Floors and figures measured this way are directly comparable.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use crossbeam_utils::CachePadded;
use hdrhistogram::Histogram;
use seqstream_agent::Idle;

/// Says on stderr, before a bench starts, when `idle` is busy-spin and the bench's busiest
/// case has more spinning `threads` than this machine has cores: its figures would then
/// show the scheduler's time slices (milliseconds), not the code. The bench runs anyway.
pub(crate) fn warn_if_spinners_outnumber_cores(bench: &str, idle: &Idle, threads: usize) {
    if *idle != Idle::BusySpin {
        return;
    }
    let mask = seqstream_agent::affinity::process_cores();
    if let Some(o) = seqstream_agent::spinners::oversubscription(&vec![None; threads], &mask) {
        eprintln!("bench {bench}: --idle busy-spin: {o} (here, the default --idle yield)");
    }
}

/// Cores for the writer and reader threads (None: unpinned), and how they wait.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Pinning {
    /// Writer (sender) thread's core.
    pub writer: Option<usize>,
    /// Reader (receiver) thread's core.
    pub reader: Option<usize>,
    /// Wait with `sched_yield` instead of spinning: for benchmarks with more busy threads
    /// than cores, where a spinning waiter would starve the threads it waits for until its
    /// time slice ends (milliseconds).
    pub yield_while_waiting: bool,
}

impl Pinning {
    /// Unpinned threads that spin while waiting under [`Idle::BusySpin`] and yield under any
    /// other strategy: the floor's waiters do what the measured path's threads do.
    pub(crate) fn waiting(idle: &Idle) -> Pinning {
        Pinning {
            writer: None,
            reader: None,
            yield_while_waiting: *idle != Idle::BusySpin,
        }
    }

    #[inline]
    fn wait(&self) {
        if self.yield_while_waiting {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

pub(crate) fn pin(core: Option<usize>) -> Result<()> {
    seqstream_agent::affinity::pin_current_thread(core).map_err(anyhow::Error::from)
}

pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// Set by SIGINT or SIGTERM once [`stop_on_signals`] has run.
static INTERRUPTED: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Installs the bench's SIGINT and SIGTERM handlers. The first signal sets a flag at which
/// every [`ping`] ends with an error ("interrupted"), so that the bench unwinds and removes
/// what it made: scratch directories, network namespaces, etcd. A second signal ends the
/// process at once (exit status 1), for a bench busy where it does not check, or stuck.
///
/// # Errors
/// A handler could not be installed.
pub(crate) fn stop_on_signals() -> Result<()> {
    let flag = INTERRUPTED.get_or_init(Default::default);
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // Registered first, so that it sees the flag as the signal found it.
        signal_hook::flag::register_conditional_shutdown(sig, 1, flag.clone())?;
        signal_hook::flag::register(sig, flag.clone())?;
    }
    Ok(())
}

fn interrupted() -> bool {
    INTERRUPTED.get().is_some_and(|f| f.load(Ordering::Relaxed))
}

/// How long either end of [`ping`] waits for the other before it gives up. Far beyond any
/// hop on a loaded machine, so only a path that has stopped (an agent that failed, a frame
/// that was lost) reaches it: a benchmark then fails with an error instead of spinning forever.
const STALL: Duration = Duration::from_secs(30);

/// Raised when dropped unless disarmed: tells the other end of [`ping`] that this one ended
/// early (returned an error or panicked), so that it stops waiting.
struct Alarm<'a>(Option<&'a AtomicBool>);

impl Alarm<'_> {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for Alarm<'_> {
    fn drop(&mut self) {
        if let Some(raised) = self.0 {
            raised.store(true, Ordering::Relaxed);
        }
    }
}

/// The error of an end of [`ping`] that stopped waiting because the other end failed: the
/// other end's error is the one to report.
#[derive(Debug)]
struct OtherEndFailed(String);

impl std::fmt::Display for OtherEndFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: the other end failed", self.0)
    }
}

impl std::error::Error for OtherEndFailed {}

/// One wait of one end of [`ping`] for the other: waits as `pins` says, and fails once the
/// bench is interrupted, the other end has ended early or [`STALL`] has passed (checked
/// every 1024 waits).
struct Waiting<'a> {
    pins: Pinning,
    other_failed: &'a AtomicBool,
    stall: Duration,
    since: Instant,
    waits: u32,
}

impl<'a> Waiting<'a> {
    fn new(pins: Pinning, other_failed: &'a AtomicBool, stall: Duration) -> Waiting<'a> {
        Waiting {
            pins,
            other_failed,
            stall,
            since: Instant::now(),
            waits: 0,
        }
    }

    #[inline]
    fn wait(&mut self, what: impl FnOnce() -> String) -> Result<()> {
        self.pins.wait();
        self.waits = self.waits.wrapping_add(1);
        if self.waits.is_multiple_of(1024) {
            ensure!(!interrupted(), "{}: interrupted", what());
            // Its own stall first: when both ends stall, each reports its own.
            ensure!(
                self.since.elapsed() < self.stall,
                "{} in {:?}",
                what(),
                self.stall
            );
            if self.other_failed.load(Ordering::Relaxed) {
                return Err(OtherEndFailed(what()).into());
            }
        }
        Ok(())
    }
}

/// One-way latency, one message in flight: the writer stamps a clock reading, the reader
/// records `now - stamp` when it sees it and acknowledges, then the writer sends the next.
/// Returns the reader's histogram in ns.
///
/// # Errors
/// Either end's error; an error when no message arrives within [`STALL`] (the path
/// stopped: the writer waits twice as long for an acknowledgement, so that the reader is the
/// one to report it); and an error when either end panicked.
pub(crate) fn ping(
    samples: u64,
    pins: Pinning,
    send: impl FnMut(u64) + Send,
    recv: impl FnMut() -> Option<u64> + Send,
) -> Result<Histogram<u64>> {
    ping_within(samples, pins, STALL, send, recv)
}

/// [`ping`], giving up after `stall` instead of [`STALL`].
fn ping_within(
    samples: u64,
    pins: Pinning,
    stall: Duration,
    send: impl FnMut(u64) + Send,
    recv: impl FnMut() -> Option<u64> + Send,
) -> Result<Histogram<u64>> {
    let epoch = Instant::now();
    let ack = CachePadded::new(AtomicU64::new(0));
    let (writer_failed, reader_failed) = (AtomicBool::new(false), AtomicBool::new(false));
    let warmup = samples / 10;
    let total = samples + warmup;
    std::thread::scope(|s| {
        let reader = {
            let (ack, writer_failed, reader_failed) = (&ack, &writer_failed, &reader_failed);
            let mut recv = recv;
            s.spawn(move || -> Result<Histogram<u64>> {
                let alarm = Alarm(Some(reader_failed));
                pin(pins.reader)?;
                let mut h = histogram();
                for i in 1..=total {
                    let mut waiting = Waiting::new(pins, writer_failed, stall);
                    let stamp = loop {
                        if let Some(t) = recv() {
                            break t;
                        }
                        waiting.wait(|| format!("message {i} of {total} did not arrive"))?;
                    };
                    let now = epoch.elapsed().as_nanos() as u64;
                    if i > warmup {
                        h.record(now.saturating_sub(stamp).max(1))?;
                    }
                    ack.store(i, Ordering::Release);
                }
                alarm.disarm();
                Ok(h)
            })
        };
        let mut send = send;
        let writer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<()> {
            let alarm = Alarm(Some(&writer_failed));
            pin(pins.writer)?;
            for i in 1..=total {
                // Between acknowledgement and stamp: outside every measured interval.
                ensure!(!interrupted(), "message {i} of {total}: interrupted");
                send(epoch.elapsed().as_nanos() as u64);
                let mut waiting = Waiting::new(pins, &reader_failed, 2 * stall);
                while ack.load(Ordering::Acquire) < i {
                    waiting.wait(|| format!("message {i} of {total} was not acknowledged"))?;
                }
            }
            alarm.disarm();
            Ok(())
        }))
        .unwrap_or_else(|_| Err(anyhow::anyhow!("the writer panicked")));
        let h = reader
            .join()
            .map_err(|_| anyhow::anyhow!("the reader thread panicked"))?;
        match (writer, h) {
            (Ok(()), h) => h,
            // The reader's error, unless it only reports the writer's: both stall together.
            (Err(_), Err(r)) if !r.is::<OtherEndFailed>() => Err(r),
            (Err(w), _) => Err(w),
        }
    })
}

/// [`ping`] with both ends on the calling thread: it stamps a clock reading and `send`s it,
/// then calls `recv` until it returns that stamp, and records the time since. The shape of
/// an application that offers and then polls for the answer itself (Aeron's ping, an
/// embedded host under `threading = "invoker"`): nothing waits for another of its threads.
/// Waits between calls of `recv` as `pins` says (its cores are not used: the thread stays
/// where it is). Returns the histogram in ns.
///
/// # Errors
/// `recv`'s error; `recv` returned another stamp (a message of an earlier sample or none
/// sent); no stamp came back within [`STALL`] (the path stopped); the bench was interrupted.
pub(crate) fn ping_one_thread(
    samples: u64,
    pins: Pinning,
    send: impl FnMut(u64),
    recv: impl FnMut() -> Result<Option<u64>>,
) -> Result<Histogram<u64>> {
    ping_one_thread_within(samples, pins, STALL, send, recv)
}

/// [`ping_one_thread`] when `one_thread`, else [`ping`], whose reader thread panics on an
/// error from `recv` (and `ping` reports the panic): the one-thread and two-thread cases of a
/// bench, with the same ends.
pub(crate) fn ping_either(
    one_thread: bool,
    samples: u64,
    pins: Pinning,
    send: impl FnMut(u64) + Send,
    mut recv: impl FnMut() -> Result<Option<u64>> + Send,
) -> Result<Histogram<u64>> {
    if one_thread {
        ping_one_thread(samples, pins, send, recv)
    } else {
        ping(samples, pins, send, move || {
            recv().unwrap_or_else(|e| panic!("{e:#}"))
        })
    }
}

/// [`ping_one_thread`], giving up after `stall` instead of [`STALL`].
fn ping_one_thread_within(
    samples: u64,
    pins: Pinning,
    stall: Duration,
    mut send: impl FnMut(u64),
    mut recv: impl FnMut() -> Result<Option<u64>>,
) -> Result<Histogram<u64>> {
    let epoch = Instant::now();
    let no_other_end = AtomicBool::new(false);
    let warmup = samples / 10;
    let total = samples + warmup;
    let mut h = histogram();
    for i in 1..=total {
        ensure!(!interrupted(), "message {i} of {total}: interrupted");
        let sent = epoch.elapsed().as_nanos() as u64;
        send(sent);
        let mut waiting = Waiting::new(pins, &no_other_end, stall);
        let stamp = loop {
            if let Some(t) = recv()? {
                break t;
            }
            waiting.wait(|| format!("message {i} of {total} did not come back"))?;
        };
        let now = epoch.elapsed().as_nanos() as u64;
        ensure!(
            stamp == sent,
            "message {i} of {total}: stamp {stamp} came back, {sent} was sent"
        );
        if i > warmup {
            h.record(now.saturating_sub(sent).max(1))?;
        }
    }
    Ok(h)
}

/// The floor of every in-process latency figure: a bare cache-line hand-off of the stamp
/// between the same two threads, measured with [`ping`].
pub(crate) fn cache_line_floor(samples: u64, pins: Pinning) -> Result<Histogram<u64>> {
    let line = Arc::new(CachePadded::new(AtomicU64::new(0)));
    let (wline, rline) = (line.clone(), line);
    let mut last = 0u64;
    ping(
        samples,
        pins,
        move |stamp| wline.store(stamp | 1 << 63, Ordering::Release),
        move || {
            let v = rline.load(Ordering::Acquire);
            (v != last && v != 0).then(|| {
                last = v;
                v & !(1 << 63)
            })
        },
    )
}

/// The floor of a path with a thread in the middle (the compositor between a component and
/// the composite): the stamp handed through a cache line to a relay thread, which hands it on
/// through a second cache line to the reader, measured with [`ping`]. The relay waits as
/// `pins` says, like the writer and reader.
pub(crate) fn cache_line_relay_floor(samples: u64, pins: Pinning) -> Result<Histogram<u64>> {
    let first = Arc::new(CachePadded::new(AtomicU64::new(0)));
    let second = Arc::new(CachePadded::new(AtomicU64::new(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let relay = {
        let (first, second, stop) = (first.clone(), second.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut last = 0;
            while !stop.load(Ordering::Relaxed) {
                let v = first.load(Ordering::Acquire);
                if v != last {
                    last = v;
                    second.store(v, Ordering::Release);
                } else {
                    pins.wait();
                }
            }
        })
    };
    let mut last = 0u64;
    let h = ping(
        samples,
        pins,
        move |stamp| first.store(stamp | 1 << 63, Ordering::Release),
        move || {
            let v = second.load(Ordering::Acquire);
            (v != last && v != 0).then(|| {
                last = v;
                v & !(1 << 63)
            })
        },
    );
    stop.store(true, Ordering::Relaxed);
    relay.join().expect("relay thread");
    h
}

/// The stamp [`ping`]'s writer put in the first 8 bytes (little-endian) of a frame's payload,
/// read from the next frame of `tailer` if one has arrived. Panics on a tailer's error: in
/// [`ping`]'s reader, that is the reader's error.
pub(crate) fn next_stamp(tailer: &mut seqstream_store::Tailer) -> Option<u64> {
    tailer
        .poll()
        .expect("tailer")
        .map(|f| u64::from_le_bytes(f.payload()[..8].try_into().expect("8 bytes")))
}

/// Append → tailer latency, the method of every store-path figure: the writer appends a
/// 64-byte frame carrying the stamp, the reader polls `tailer` (of the same store or of a
/// copy of it) until the frame arrives.
pub(crate) fn append_to_tailer(
    samples: u64,
    pins: Pinning,
    mut appender: seqstream_store::Appender,
    mut tailer: seqstream_store::Tailer,
) -> Result<Histogram<u64>> {
    let mut payload = [0u8; 64];
    ping(
        samples,
        pins,
        move |stamp| {
            payload[..8].copy_from_slice(&stamp.to_le_bytes());
            appender.append(&payload).expect("append");
        },
        move || next_stamp(&mut tailer),
    )
}

/// Raw UDP one-way hop over loopback: the stamp in 8 bytes, a non-blocking reader.
pub(crate) fn udp_one_way(samples: u64, pins: Pinning) -> Result<Histogram<u64>> {
    let rx = UdpSocket::bind("127.0.0.1:0")?;
    rx.set_nonblocking(true)?;
    let tx = UdpSocket::bind("127.0.0.1:0")?;
    tx.connect(rx.local_addr()?)?;
    udp_one_way_over(tx, rx, samples, pins)
}

/// Raw UDP one-way hop from `tx` (connected) to `rx` (non-blocking): the stamp in 8 bytes.
pub(crate) fn udp_one_way_over(
    tx: UdpSocket,
    rx: UdpSocket,
    samples: u64,
    pins: Pinning,
) -> Result<Histogram<u64>> {
    let mut got = [0u8; 64];
    ping(
        samples,
        pins,
        move |stamp| {
            tx.send(&stamp.to_le_bytes()).expect("udp send");
        },
        move || match rx.recv(&mut got) {
            Ok(8) => Some(u64::from_le_bytes(got[..8].try_into().expect("8 bytes"))),
            _ => None,
        },
    )
}

/// Raw TCP one-way hop over loopback: the stamp in 8 bytes, `TCP_NODELAY`, a non-blocking
/// reader.
pub(crate) fn tcp_one_way(samples: u64, pins: Pinning) -> Result<Histogram<u64>> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let tx = TcpStream::connect(l.local_addr()?)?;
    let (rx, _) = l.accept()?;
    tx.set_nodelay(true)?;
    rx.set_nonblocking(true)?;
    tcp_one_way_over(tx, rx, samples, pins)
}

/// Raw TCP one-way hop from `tx` (`TCP_NODELAY`) to `rx` (non-blocking): the stamp in 8
/// bytes.
pub(crate) fn tcp_one_way_over(
    mut tx: TcpStream,
    rx: TcpStream,
    samples: u64,
    pins: Pinning,
) -> Result<Histogram<u64>> {
    let mut reader = StampReader::new(rx);
    ping(
        samples,
        pins,
        move |stamp| tx.write_all(&stamp.to_le_bytes()).expect("tcp write"),
        move || reader.poll(),
    )
}

/// 8-byte stamps from a non-blocking TCP stream, each once all its bytes have arrived.
pub(crate) struct StampReader {
    rx: TcpStream,
    got: [u8; 8],
    have: usize,
}

impl StampReader {
    pub(crate) fn new(rx: TcpStream) -> StampReader {
        StampReader {
            rx,
            got: [0; 8],
            have: 0,
        }
    }

    /// The next stamp, if all of it has arrived; reads at most once.
    pub(crate) fn poll(&mut self) -> Option<u64> {
        match self.rx.read(&mut self.got[self.have..]) {
            Ok(n) => self.have += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("tcp read: {e}"),
        }
        (self.have == 8).then(|| {
            self.have = 0;
            u64::from_le_bytes(self.got)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::time::Duration;

    use super::{ping_one_thread_within, ping_within, Pinning};

    const YIELDING: Pinning = Pinning {
        writer: None,
        reader: None,
        yield_while_waiting: true,
    };

    #[test]
    fn a_ping_whose_messages_stop_arriving_fails_after_the_stall_bound() {
        let mut sent = 0;
        let line = std::sync::Mutex::new(None);
        let err = ping_within(
            100,
            YIELDING,
            Duration::from_millis(200),
            |stamp| {
                sent += 1;
                // The path stops after the fifth message.
                if sent <= 5 {
                    *line.lock().unwrap() = Some(stamp);
                }
            },
            || line.lock().unwrap().take(),
        );
        let err = err.unwrap_err().to_string();
        assert!(err.contains("message 6 of 110 did not arrive"), "{err}");
    }

    #[test]
    fn a_ping_whose_reader_panics_fails_instead_of_waiting_for_its_ack() {
        let err = ping_within(
            10,
            YIELDING,
            Duration::from_secs(3600),
            |_| {},
            || panic!("the reader's path broke"),
        )
        .unwrap_err();
        assert!(err.to_string().contains("reader thread panicked"), "{err}");
    }

    #[test]
    fn a_ping_whose_writer_panics_fails_instead_of_waiting_for_a_message() {
        let err = ping_within(
            10,
            YIELDING,
            Duration::from_secs(3600),
            |_| panic!("the writer's path broke"),
            || None,
        )
        .unwrap_err();
        assert!(err.to_string().contains("writer panicked"), "{err}");
    }

    #[test]
    fn a_ping_whose_writer_fails_stops_its_reader() {
        let err = ping_within(
            10,
            Pinning {
                writer: Some(usize::MAX),
                ..YIELDING
            },
            Duration::from_secs(3600),
            |_| {},
            || None,
        )
        .unwrap_err();
        assert!(!err.to_string().contains("the other end failed"), "{err}");
    }

    #[test]
    fn a_ping_on_one_thread_records_each_sample_after_its_warm_up() {
        let line = Cell::new(None);
        let h = ping_one_thread_within(
            50,
            YIELDING,
            Duration::from_secs(3600),
            |stamp| line.set(Some(stamp)),
            || Ok(line.take()),
        )
        .unwrap();
        assert_eq!(h.len(), 50);
    }

    #[test]
    fn a_ping_on_one_thread_that_gets_another_stamp_back_fails() {
        let err = ping_one_thread_within(
            10,
            YIELDING,
            Duration::from_secs(3600),
            |_| {},
            || Ok(Some(7)),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("message 1 of 11: stamp 7 came back"), "{err}");
    }

    #[test]
    fn a_ping_on_one_thread_whose_messages_stop_coming_back_fails_after_the_stall_bound() {
        let line = Cell::new(None);
        let mut sent = 0;
        let err = ping_one_thread_within(
            100,
            YIELDING,
            Duration::from_millis(200),
            |stamp| {
                sent += 1;
                // The path stops after the fifth message.
                if sent <= 5 {
                    line.set(Some(stamp));
                }
            },
            || Ok(line.take()),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("message 6 of 110 did not come back"), "{err}");
    }
}
