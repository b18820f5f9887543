//! Aeron's ping-pong, as its `EmbeddedPingPong` and `cping`/`cpong` samples do it: an
//! embedded C media driver; a ping thread with a publication on the ping channel and a
//! subscription on the pong channel; a pong thread subscribed to the ping channel that echoes
//! each message into its publication on the pong channel. Both channels are
//! `aeron:udp?endpoint=127.0.0.1:<free port>` (streams 1002 and 1003, the samples' ids), the
//! publications exclusive, the term buffers not sparse and pre-touched (as in Aeron's
//! `embedded-ping-pong` script). The ping thread stamps each message as it offers it, one in
//! flight, and records `now - stamp` when its echo arrives.

use std::ffi::CString;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::ScopedJoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use hdrhistogram::Histogram;
use rusteron_client::{Aeron, AeronContext, AeronExclusivePublication, AeronImage, Handlers};
use rusteron_media_driver::bindings::aeron_threading_mode_enum;
use rusteron_media_driver::testing::EmbeddedDriver;
use rusteron_media_driver::AeronIdleStrategyKind;

use crate::{histogram, Run, Wait, MESSAGE_LENGTH};

const PING_STREAM_ID: i32 = 1002;
const PONG_STREAM_ID: i32 = 1003;
/// Fragments a poll may hand over at most, the samples' limit.
const FRAGMENT_LIMIT: usize = 10;
/// How long a publication, a subscription or the first connection may take.
const STARTUP: Duration = Duration::from_secs(10);

/// The media driver's threading mode (`aeron.threading.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Threading {
    /// One thread: conductor, sender and receiver as one agent.
    Shared,
    /// The conductor on one thread, sender and receiver together on another.
    SharedNetwork,
    /// A thread each for the conductor, the sender and the receiver.
    Dedicated,
}

/// The idle strategy of every driver thread (Aeron's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DriverIdle {
    /// Busy-spin with a pause hint.
    Spin,
    /// Never back off.
    Noop,
    /// `sched_yield`.
    Yield,
    /// Spin, then yield, then park with exponential backoff (Aeron's default).
    Backoff,
}

impl DriverIdle {
    fn kind(self) -> AeronIdleStrategyKind {
        match self {
            DriverIdle::Spin => AeronIdleStrategyKind::BusySpin,
            DriverIdle::Noop => AeronIdleStrategyKind::NoOp,
            DriverIdle::Yield => AeronIdleStrategyKind::Yielding,
            DriverIdle::Backoff => AeronIdleStrategyKind::Backoff,
        }
    }
}

/// Round-trip times (ns) of `run.samples` pings after `run.warmup` unrecorded ones, through
/// a media driver started here and stopped before this returns.
pub(crate) fn pingpong(
    run: &Run,
    threading: Threading,
    driver_idle: DriverIdle,
) -> Result<Histogram<u64>> {
    let driver = EmbeddedDriver::launch_with(|ctx| {
        ctx.set_threading_mode(match threading {
            Threading::Shared => aeron_threading_mode_enum::AERON_THREADING_MODE_SHARED,
            Threading::SharedNetwork => {
                aeron_threading_mode_enum::AERON_THREADING_MODE_SHARED_NETWORK
            }
            Threading::Dedicated => aeron_threading_mode_enum::AERON_THREADING_MODE_DEDICATED,
        })?;
        let kind = driver_idle.kind();
        ctx.set_shared_idle_strategy_kind(kind)?;
        ctx.set_sharednetwork_idle_strategy_kind(kind)?;
        ctx.set_conductor_idle_strategy_kind(kind)?;
        ctx.set_sender_idle_strategy_kind(kind)?;
        ctx.set_receiver_idle_strategy_kind(kind)?;
        ctx.set_term_buffer_sparse_file(false)?;
        Ok(())
    })
    .context("starting the embedded media driver")?;
    let ping_channel = channel()?;
    let pong_channel = channel()?;
    eprintln!(
        "aeron-pingpong: media driver in {}, ping {ping_channel:?} stream {PING_STREAM_ID}, \
         pong {pong_channel:?} stream {PONG_STREAM_ID}",
        driver.dir()
    );
    let stop = AtomicBool::new(false);
    // The clients close (end of scope) before the driver stops (end of function).
    std::thread::scope(|s| {
        let ponger = std::thread::Builder::new()
            .name("pong".into())
            .spawn_scoped(s, || {
                pong(driver.dir(), &ping_channel, &pong_channel, &stop, run.wait)
            })?;
        let h = ping(driver.dir(), &ping_channel, &pong_channel, run, &ponger);
        stop.store(true, Ordering::Relaxed);
        let echoed = ponger
            .join()
            .map_err(|_| anyhow!("the pong thread panicked"))?;
        // The pong thread's error, if any, is why the ping failed: report it first.
        echoed.and(h)
    })
}

/// `aeron:udp?endpoint=127.0.0.1:<port>` on a port free a moment ago.
fn channel() -> Result<CString> {
    let port = UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port();
    Ok(CString::new(format!(
        "aeron:udp?endpoint=127.0.0.1:{port}"
    ))?)
}

/// A started client of the driver in `dir`, its errors printed.
fn client(dir: &str) -> Result<Aeron> {
    let context = AeronContext::new()?;
    context.set_dir(&CString::new(dir)?)?;
    context.set_pre_touch_mapped_memory(true)?;
    context.set_error_handler(Some(|code: i32, msg: &str| {
        eprintln!("aeron-pingpong: aeron error {code}: {msg}")
    }))?;
    let aeron = Aeron::new(&context)?;
    aeron.start()?;
    Ok(aeron)
}

/// The ping thread: offers each ping stamped, one in flight, and records its round trip.
fn ping(
    dir: &str,
    ping_channel: &CString,
    pong_channel: &CString,
    run: &Run,
    ponger: &ScopedJoinHandle<'_, Result<()>>,
) -> Result<Histogram<u64>> {
    let aeron = client(dir)?;
    let publication = aeron
        .async_add_exclusive_publication(ping_channel, PING_STREAM_ID)?
        .poll_blocking(STARTUP)?;
    let subscription = aeron
        .async_add_subscription(pong_channel, PONG_STREAM_ID, Handlers::NONE, Handlers::NONE)?
        .poll_blocking(STARTUP)?;
    // Both directions up: our pings reach the pong thread, and its echoes have an image here.
    let deadline = Instant::now() + STARTUP;
    let image = loop {
        if publication.is_connected() {
            if let Some(image) = subscription.image_at_index(0) {
                break image;
            }
        }
        ensure!(
            Instant::now() < deadline,
            "the ping and pong streams did not connect in {STARTUP:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    let mut h = histogram();
    let mut message = [0u8; MESSAGE_LENGTH];
    for i in 0..run.warmup + run.samples {
        let rtt = round_trip(&publication, &image, &mut message, run, ponger)?;
        if i >= run.warmup {
            h.record(rtt.max(1))?;
        }
    }
    Ok(h)
}

/// One ping and its echo: the round trip in ns.
fn round_trip(
    publication: &AeronExclusivePublication,
    image: &AeronImage,
    message: &mut [u8; MESSAGE_LENGTH],
    run: &Run,
    ponger: &ScopedJoinHandle<'_, Result<()>>,
) -> Result<u64> {
    let position = loop {
        // Stamped at each attempt: time back-pressured is not a round trip.
        message[..8].copy_from_slice(&run.now().to_le_bytes());
        match publication.offer(message) {
            Ok(position) => break position,
            Err(e) if e.is_retryable() => run.wait.idle(),
            Err(e) => bail!("ping offer: {e}"),
        }
    };
    let mut rtt = None;
    // The echo has the ping's length, so it has been read once the image reaches `position`.
    while image.position() < position {
        let fragments = image.poll_fn(
            |echo, _header| {
                let stamp = u64::from_le_bytes(echo[..8].try_into().expect("8 bytes"));
                rtt = Some(run.now().saturating_sub(stamp));
            },
            FRAGMENT_LIMIT,
        )?;
        if fragments == 0 {
            ensure!(!image.is_closed(), "the pong stream's image closed");
            ensure!(!ponger.is_finished(), "the pong thread stopped");
            run.wait.idle();
        }
    }
    rtt.context("the image passed the ping's position without its echo")
}

/// The pong thread: echoes every ping until `stop`.
fn pong(
    dir: &str,
    ping_channel: &CString,
    pong_channel: &CString,
    stop: &AtomicBool,
    wait: Wait,
) -> Result<()> {
    let aeron = client(dir)?;
    let subscription = aeron
        .async_add_subscription(ping_channel, PING_STREAM_ID, Handlers::NONE, Handlers::NONE)?
        .poll_blocking(STARTUP)?;
    let publication = aeron
        .async_add_exclusive_publication(pong_channel, PONG_STREAM_ID)?
        .poll_blocking(STARTUP)?;
    // The poll callback cannot return an error: it parks the first one here.
    let mut failure = None;
    while !stop.load(Ordering::Relaxed) {
        let fragments = subscription.poll_fn(
            |ping, _header| {
                if failure.is_none() {
                    failure = echo(&publication, ping, wait).err();
                }
            },
            FRAGMENT_LIMIT,
        )?;
        if let Some(e) = failure.take() {
            return Err(e);
        }
        if fragments == 0 {
            wait.idle();
        }
    }
    Ok(())
}

/// Writes `ping` back into `publication` through a claim, as `EmbeddedPingPong` does.
fn echo(publication: &AeronExclusivePublication, ping: &[u8], wait: Wait) -> Result<()> {
    loop {
        match publication.try_claim_owned(ping.len()) {
            Ok(mut claim) => {
                claim.data().copy_from_slice(ping);
                claim.commit()?;
                return Ok(());
            }
            Err(e) if e.is_retryable() => wait.idle(),
            Err(e) => bail!("pong claim: {e}"),
        }
    }
}
